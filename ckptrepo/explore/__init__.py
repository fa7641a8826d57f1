"""Exploring a lineage after the fact: evaluation runs over commits (``evaluate``, ``runner``),
bisecting a first-parent line (``bisect``), weight-space merges that make commits (``merge``) and
lineage recovered from the weights (``similar``). Each module works over explicit dependencies
(sessions, a chunk reader, the facade's calls passed in); ``ckptrepo.exploring`` is their facade."""
