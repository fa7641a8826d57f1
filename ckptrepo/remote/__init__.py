"""Remotes: a repository's lineage and data in another store (a folder or an ``s3://`` prefix),
moved by ``push``, ``fetch`` and ``clone`` (docs/design.md, "Remotes").

A remote is a store like the repository's own (packs, manifests, journal) plus ref objects that
move by compare-and-swap (``remote.refs``); it needs no database. ``config`` keeps the list of a
repository's remotes, ``stores`` opens one, ``index`` caches what a remote holds in the catalog,
``transfer`` copies chunk payloads into new packs, ``push`` / ``fetch`` move commits, and
``tiered`` reads bytes a lazy clone lacks from its remote (``localize`` keeps them).
"""
