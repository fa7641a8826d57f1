"""What the framework callbacks share about a resume: is there anything to resume from."""

from __future__ import annotations

from ckptrepo.training import CommitStream

__all__ = ["first_run"]


def first_run(stream: CommitStream, rev: str) -> bool:
    """True when ``rev`` is ``stream``'s own branch and that branch has no commit yet: a first run,
    with nothing to resume (the callbacks' ``checkout`` then returns None, as ``Checkpointer.resume``
    returns 0). False for any other revision, whether or not it exists (``checkout`` then raises
    UnknownRevision for one that does not). Call it after the stream's commits are flushed."""
    return rev == stream.branch and all(ref.name != rev for ref in stream.repo.branches())
