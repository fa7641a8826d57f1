"""Unit tests of ckptrepo.formats.dcp_pickle through read_dcp_folder: a ``.metadata`` from elsewhere
builds DCP's metadata and nothing else, in time and memory bounded by its size.

The crafted pickles are assembled opcode by opcode (``op``); the real folders are written by
``dcp.save`` with DCP's own ``FileSystemWriter`` in this process (no threads, no async).
"""

from __future__ import annotations

import pickle
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckptrepo.errors import InvalidInput
from ckptrepo.formats.dcp_folder import MAX_METADATA_BYTES, read_dcp_folder
from ckptrepo.formats.dcp_pickle import MAX_DEPTH, unpickle_metadata
from ckptrepo.testing import assert_states_equal

FAST_S = 2.0  # what refusing a crafted file may take; the attacks below take far longer unrefused
SMALL_PEAK = 8 << 20  # bytes of Python allocations refusing one may peak at; the attacks allocate >= 40 MiB
PROTO = pickle.PROTO + b"\x04"
STOP = pickle.STOP
MD = "torch.distributed.checkpoint.metadata"


# --- assembling pickles -------------------------------------------------------------------------


def glob(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def text(s: str) -> bytes:
    data = s.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def integer(n: int) -> bytes:
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(data)]) + data


def put(i: int) -> bytes:
    return pickle.LONG_BINPUT + struct.pack("<I", i)


def get(i: int) -> bytes:
    return pickle.LONG_BINGET + struct.pack("<I", i)


def empty(cls: str) -> bytes:
    """An empty DCP metadata object, as pickle makes one before its BUILD."""
    return glob(MD, cls) + pickle.EMPTY_TUPLE + pickle.NEWOBJ


def dict_of(*pairs: bytes) -> bytes:
    return pickle.EMPTY_DICT + pickle.MARK + b"".join(pairs) + pickle.SETITEMS


# --- folders ------------------------------------------------------------------------------------


def save(state: dict[str, Any], folder: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: one process is meant
        dcp.save(state, storage_writer=FileSystemWriter(folder, thread_count=1), no_dist=True)
    return folder


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save({"w": torch.arange(6.0), "step": 3}, tmp_path_factory.mktemp("real") / "ckpt")


@pytest.fixture
def crafted(real: Path, tmp_path: Path) -> Iterator[Any]:
    """``crafted(pickle_bytes)``: a copy of a real folder whose .metadata is those bytes."""

    def make(data: bytes) -> Path:
        folder = Path(shutil.copytree(real, tmp_path / f"crafted-{len(list(tmp_path.iterdir()))}"))
        (folder / ".metadata").write_bytes(data)
        return folder

    yield make


def refused(folder: Path) -> tuple[InvalidInput, float, int]:
    """Read ``folder``, expecting InvalidInput; the error, the seconds and the peak bytes it took."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        read_dcp_folder(folder)
    except InvalidInput as e:
        error = e
    else:
        pytest.fail("the crafted .metadata was read")
    finally:
        elapsed, peak = time.monotonic() - start, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return error, elapsed, peak


# --- BUILD --------------------------------------------------------------------------------------

_TRUEDIV = PurePosixPath.__truediv__

BUILDS = {
    # the class itself, its attribute set through slot state: setattr(PurePosixPath, "__truediv__", frozenset)
    "class-slot-state": glob("pathlib", "PurePosixPath") + pickle.NONE
    + dict_of(text("__truediv__"), glob("builtins", "frozenset")) + pickle.TUPLE2 + pickle.BUILD,
    "dcp-class": glob(MD, "StorageMeta") + dict_of(text("save_id"), text("x")) + pickle.BUILD,
    "instance-slot-state": empty("StorageMeta") + pickle.NONE + dict_of(text("save_id"), text("x"))
    + pickle.TUPLE2 + pickle.BUILD,
    "not-a-field": empty("StorageMeta") + dict_of(text("__class__"), glob("pathlib", "PurePosixPath")) + pickle.BUILD,
    "twice": empty("StorageMeta") + dict_of(text("save_id"), text("x")) + pickle.BUILD
    + dict_of(text("save_id"), text("y")) + pickle.BUILD,
    "path-instance": glob("pathlib", "PurePosixPath") + text("a") + pickle.TUPLE1 + pickle.REDUCE + pickle.NONE
    + dict_of(text("_str"), text("/etc/passwd")) + pickle.TUPLE2 + pickle.BUILD,
    "tensor-properties-dict": empty("TensorProperties") + dict_of(text("dtype"), glob("torch", "float32"))
    + pickle.BUILD,
}


@pytest.mark.parametrize("body", BUILDS.values(), ids=BUILDS.keys())
def test_build_fills_only_dcp_metadata_objects_once_from_their_fields(crafted: Any, body: bytes) -> None:
    folder = crafted(PROTO + body + STOP)
    try:
        error, _, _ = refused(folder)
        assert PurePosixPath.__truediv__ is _TRUEDIV
        assert PurePosixPath("a") / "b" == PurePosixPath("a/b")
    finally:
        PurePosixPath.__truediv__ = _TRUEDIV  # type: ignore[method-assign]  # a failing run patched it
    assert error.message.startswith(f"Cannot read {folder}: its .metadata ")
    assert ("sets the attributes of" in error.message or "not from a dict of its fields" in error.message
            or "not from the tuple DCP writes" in error.message), error.message


# --- bounded time and memory --------------------------------------------------------------------


def _laughs(levels: int) -> bytes:
    """A tuple of two references to a tuple of two references ... ``levels`` deep, put in a frozenset:
    2**levels values to hash."""
    out = pickle.NONE + put(0)
    for i in range(levels):
        out += get(i) + get(i) + pickle.TUPLE2 + put(i + 1)
    return out + pickle.MARK + get(levels) + pickle.FROZENSET


def _copies(item: bytes, maker: str, times: int) -> bytes:
    """A list of ``item`` and ``times`` calls of ``maker`` (a global) on it."""
    call = glob(*maker.rsplit(".", 1)) + get(0) + pickle.TUPLE1 + pickle.REDUCE
    return pickle.EMPTY_LIST + pickle.MARK + item + put(0) + call * times + pickle.APPENDS


BOMBS = {
    # 35 bytes asking for a 2 GiB bytearray
    "bytearray-size": glob("builtins", "bytearray") + integer(1 << 31) + pickle.TUPLE1 + pickle.REDUCE,
    # a 1 GiB memo: the C unpickler sizes its memo array by the largest index put
    "memo-index": pickle.NONE + put(0x07FFFFF0),
    "hash-of-shared-tuples": _laughs(29),
    "sizes-of-one-list": _copies(pickle.EMPTY_LIST + pickle.MARK + (pickle.BININT1 + b"\x07") * 2000
                                 + pickle.APPENDS, "torch.Size", 4000),
    "paths-of-one-string": _copies(text("x/" * 5_000), "pathlib.PurePosixPath", 1000),  # 5,000 parts each
    "sets-of-one-list": _copies(pickle.EMPTY_LIST + pickle.MARK
                                + b"".join(pickle.BININT2 + struct.pack("<H", i) for i in range(2000))
                                + pickle.APPENDS, "builtins.frozenset", 2000),
}


@pytest.mark.parametrize("body", BOMBS.values(), ids=BOMBS.keys())
def test_a_crafted_metadata_is_refused_fast_in_bounded_memory(crafted: Any, body: bytes) -> None:
    folder = crafted(PROTO + body + STOP)
    error, elapsed, peak = refused(folder)
    assert elapsed < FAST_S and peak < SMALL_PEAK, (error.message, elapsed, peak)


def test_the_allocation_pickle_is_35_bytes_and_its_refusal_names_the_size(crafted: Any) -> None:
    data = PROTO + BOMBS["bytearray-size"] + STOP
    assert len(data) <= 35
    error, _, _ = refused(crafted(data))
    assert f"bytearray of {1 << 31} bytes, more than its own {len(data)} bytes" in error.message


def test_a_key_nested_beyond_the_limit_is_refused_not_a_crash(crafted: Any) -> None:
    """CPython hashes a tuple recursively in C with no limit: a million nested tuples used as a
    key crash the interpreter. Run in a child process, so a crash fails this test only."""
    folder = crafted(PROTO + pickle.MARK + pickle.EMPTY_TUPLE + pickle.TUPLE1 * 1_000_000 + pickle.FROZENSET + STOP)
    code = ("import sys; from ckptrepo.errors import InvalidInput\n"
            "from ckptrepo.formats.dcp_folder import read_dcp_folder\n"
            "try:\n    read_dcp_folder(sys.argv[1])\nexcept InvalidInput as e:\n    print(e.message)\n")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert f"nests values more than {MAX_DEPTH} deep" in done.stdout


COLLIDING = [tuple(-1 - ((i >> b) & 1) for b in range(4)) for i in range(16)]  # hash(-1) == hash(-2)

REFUSALS = {
    "colliding-keys": (dict_of(*(pickle.MARK + b"".join(map(integer, key)) + pickle.TUPLE + pickle.NONE
                                 for key in COLLIDING)), "keys of one hash"),
    "ext-opcode": (pickle.EXT1 + b"\x01", "uses the pickle opcode EXT1"),
    "inst-opcode": (pickle.MARK + pickle.INST + b"builtins\nset\n", "uses the pickle opcode INST"),
    "huge-integer": (integer(1 << 80), "an integer of 81 bits"),
    "call-a-class": (glob(MD, "Metadata") + pickle.EMPTY_DICT + pickle.TUPLE1 + pickle.REDUCE,
                     "calls Metadata, which DCP metadata never calls"),
    "newobj-with-arguments": (glob(MD, "StorageMeta") + text("x") + pickle.TUPLE1 + pickle.NEWOBJ,
                              "makes a StorageMeta by NEWOBJ"),
    "layout-by-tuple": (glob("torch.serialization", "_get_layout") + pickle.EMPTY_TUPLE + pickle.TUPLE1
                        + pickle.REDUCE, "makes a torch layout from (tuple)"),
    "self-containing": (pickle.EMPTY_LIST + put(0) + get(0) + pickle.APPEND, "contains itself"),
    "deep-lists": (pickle.EMPTY_LIST + put(0) + b"".join(pickle.EMPTY_LIST + put(i) + get(i - 1) + pickle.APPEND
                                                          for i in range(1, 100)), "more than 32 deep"),
}


@pytest.mark.parametrize(("body", "reason"), REFUSALS.values(), ids=REFUSALS.keys())
def test_what_dcp_never_writes_is_refused_by_name(crafted: Any, body: bytes, reason: str) -> None:
    error, _, _ = refused(crafted(PROTO + body + STOP))
    assert reason in error.message, error.message


def test_a_metadata_file_beyond_the_cap_is_refused_before_reading(crafted: Any) -> None:
    folder = crafted(b"")
    with open(folder / ".metadata", "wb") as f:
        f.truncate(MAX_METADATA_BYTES + 1)  # sparse: nothing is written
    error, elapsed, peak = refused(folder)
    assert f"more than the {MAX_METADATA_BYTES} bytes ckptrepo reads" in error.message
    assert peak < SMALL_PEAK and elapsed < FAST_S


# --- what DCP writes still reads ----------------------------------------------------------------


def _states() -> dict[str, dict[str, Any]]:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {
        "tensors": {"a": torch.randn(3, 4), "b": torch.zeros(0, 2, dtype=torch.int8), "c": torch.tensor(1.5)},
        "values": {"step": 7, "name": "run", "ratio": 0.25, "flags": [True, None], "pair": (1, 2)},
        "training": {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 2},
        "dtypes": {str(d).removeprefix("torch."): torch.ones(2, dtype=d)
                   for d in (torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64, torch.uint8)},
        "one-value": {"only": "a string"},
    }


STATES = _states()


@pytest.mark.parametrize("name", STATES)
def test_folders_dcp_save_writes_read_and_their_metadata_unpickles_as_pickle_does(name: str, tmp_path: Path) -> None:
    folder = save(STATES[name], tmp_path / "ckpt")
    data = (folder / ".metadata").read_bytes()
    trusted = pickle.loads(data)
    assert isinstance(trusted.storage_meta.checkpoint_id, PurePosixPath)  # a StorageMeta holding a path
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.dumps(trusted, protocol=protocol)
        assert unpickle_metadata(again, _no_refusal) == trusted, protocol
    reference = tmp_path / "reference.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(folder, reference)  # DCP's own reading, which unpickles freely
    assert_states_equal(read_dcp_folder(folder), torch.load(reference, weights_only=False))


def _no_refusal(reason: str) -> Any:
    raise AssertionError(reason)
