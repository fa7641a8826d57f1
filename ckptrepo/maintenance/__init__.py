"""Whole-repository upkeep, each over explicit dependencies (sessions, backend, reader):
``gc`` (reclaim what no ref reaches), ``repack`` (encode deferred chunks, compact packs),
``verify`` (check the database and the store against each other)."""

DEFAULT_GRACE_S = 3600.0
"""``gc`` never deletes an object younger than this: longer than any commit's phase 2 should take
(a commit of another process may be writing it)."""
