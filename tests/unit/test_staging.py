"""StageProgress: when phase 2's waiters learn that phase 1 has copied a tensor."""

from __future__ import annotations

import threading

import pytest

from ckptrepo.errors import StagingAborted
from ckptrepo.ingest.staging import StageProgress


def _waiter(progress: StageProgress, index: int) -> tuple[threading.Thread, list[int]]:
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(progress.wait(index)), daemon=True)
    thread.start()
    return thread, got


def test_waiters_are_woken_per_batch_of_bytes_not_per_tensor() -> None:
    progress = StageProgress()
    progress.batch = 100
    thread, got = _waiter(progress, 0)
    progress.advance(60)  # tensor 0 is in place, but less than a batch has been copied
    thread.join(0.2)
    assert thread.is_alive() and not got
    progress.advance(60)  # a batch since the last wake-up: the waiter sees both tensors
    thread.join(5)
    assert got == [2]


def test_finish_wakes_every_waiter_and_fail_raises_in_them() -> None:
    progress = StageProgress()
    thread, got = _waiter(progress, 0)
    progress.advance(1)
    thread.join(0.2)
    assert thread.is_alive()
    progress.finish()
    thread.join(5)
    assert got and got[0] > 1  # once finished: every tensor

    failed = StageProgress()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            failed.wait(3)
        except StagingAborted as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    failed.fail(RuntimeError("copy failed"))
    thread.join(5)
    assert len(errors) == 1 and "copy failed" in str(errors[0])


def test_a_tensor_already_in_place_is_returned_without_waiting() -> None:
    progress = StageProgress()
    progress.advance(1)
    progress.advance(1)
    assert progress.wait(1) == 2
    with pytest.raises(StagingAborted):
        progress.fail(ValueError("x"))
        progress.wait(5)
