"""Remotes: a repository's lineage and data in another store (a folder or an ``s3://`` prefix),
moved by ``push``, ``fetch`` and ``clone`` (docs/design.md, "Remotes").

A remote is a store like the repository's own (packs, manifests, journal) plus ref objects that
move by compare-and-swap (``remote.refs``); it needs no database. ``config`` keeps the list of a
repository's remotes, ``stores`` opens one, ``index`` caches what a remote holds in the catalog,
``bundles`` describe a push in one object, ``transfer`` copies chunk payloads (whole packs or
packed anew), ``push`` / ``fetch`` / ``clone`` move commits, ``tiered`` reads bytes a lazy clone
lacks from its remote (``localize`` keeps them), and ``replicate`` pushes in the background.
"""
