"""Folders of torch.distributed.checkpoint (DCP) ``FileSystemWriter``: read whole and validated, written by DCP.

A DCP folder holds ``.metadata``, a pickled ``Metadata``, and data files (``__<rank>_<n>.distcp``).
``Metadata.state_dict_metadata`` maps each flattened key (*fqn*, ``model.layer.weight``) either to
a tensor's dtype, global size and saved chunks (boxes given by global offsets and sizes, one per
shard a rank saved) or to a non-tensor value; ``storage_data`` maps each chunk
(``MetadataIndex(fqn, offsets)``) and each value (``MetadataIndex(fqn)``) to a ``_StorageInfo``:
a data file of the folder, an offset and a length in it, and the stream transforms applied to
those bytes (none by default; ``stream.zstd/1`` with DCP's experimental ZStandard extension).
``planner_data``, as ``DefaultSavePlanner`` writes it, maps each fqn to its key path in the
nested state (``("optim", "param_groups", 0, "lr")``). A chunk's bytes are ``torch.save`` of that
chunk's tensor; a value's bytes are ``torch.save`` of the value.

Reading never runs code from the folder: ``.metadata`` (at most ``MAX_METADATA_BYTES``) is
unpickled by ``dcp_pickle.unpickle_metadata``, which builds only DCP's metadata objects and the
torch and builtin values they hold, in time and memory linear in the file's size; chunks and
values load with ``torch.load(weights_only=True)`` (values needing more only with
``allow_pickle=True``). Refused variants: per-rank metadata (``use_collectives=False``),
``serialization_format=SAFETENSORS`` data files, and stream transforms other than zstd.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
import zstandard
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ckptrepo.atomic import atomic_build
from ckptrepo.errors import InvalidInput, OutputExists, UsageError
from ckptrepo.formats._files import summarize
from ckptrepo.formats.dcp_pickle import unpickle_metadata
from ckptrepo.formats.torch_io import _numpy_globals, _weights_only_reason
from ckptrepo.state import bit_view, flatten, unflatten

METADATA_NAME = ".metadata"
ZSTD_TRANSFORM = "stream.zstd/1"  # DCP's ZStandard extension (``_extension.ZStandard.get_descriptor``)
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
_SAVE_OVERHEAD = 1 << 20  # a torch.save archive of one tensor holds its bytes plus a few KiB of records
_MAX_VALUE_BYTES = 256 << 20  # what a compressed non-tensor value may inflate to
_MAX_LIST_INDEX = 1 << 20  # list positions in key paths; DCP fills the positions before one with None
MAX_METADATA_BYTES = 64 << 20  # ~450,000 saved chunks (DCP writes about 140 bytes per chunk), read in ~50 s
_HINT = (
    "A DCP folder is read whole: keep its .metadata and every data file it names together, as dcp.save "
    "(FileSystemWriter) wrote them; any number of ranks is fine."
)

Box = tuple[tuple[int, ...], tuple[int, ...]]  # a chunk's global offsets and sizes


@dataclass(frozen=True)
class _Piece:
    """Where the bytes of one saved chunk or value are: a data file of the folder, an offset and
    a length in it, and whether they are a zstd frame."""

    file: str
    offset: int
    length: int
    zstd: bool


@dataclass
class _TensorPlan:
    """One tensor of the folder: its dtype, global size and chunks (each with its bytes)."""

    dtype: torch.dtype
    size: tuple[int, ...]
    chunks: list[tuple[Box, _Piece]] = field(default_factory=list)


@dataclass
class _Plan:
    """A validated ``.metadata``: every fqn, in the state's order, with its key path and what it is."""

    paths: dict[str, tuple[str | int, ...]]
    tensors: dict[str, _TensorPlan]
    values: dict[str, _Piece]


def read_dcp_folder(folder: Path, *, allow_pickle: bool = False) -> dict[str, Any]:
    """The nested state the DCP folder ``folder`` holds, every tensor whole (its global shape,
    CPU, contiguous), assembled from all the chunks its ranks saved.

    Nesting is rebuilt from ``planner_data`` as DCP's own loader does (dict keys are strings,
    lists come back as lists; an fqn without a key path stays a top-level key); without
    ``planner_data``, the state is the flat ``fqn -> value`` dict. Everything is validated
    before anything is returned, and InvalidInput names the folder and the fault: the metadata
    (only known classes, well-formed, a storage entry for every chunk and value and none
    besides), every storage entry (a data file of the folder, its bytes inside it and
    overlapping no other entry's, a transform this reader knows), every tensor's chunks (inside
    its box, disjoint, covering it exactly: a partial checkpoint is refused), every chunk's bytes
    (a torch.save tensor of the declared dtype and the chunk's shape) and every value (plain data
    under ``weights_only=True``, or anything with ``allow_pickle``: trusted folders only).
    """
    folder = Path(folder)
    return _Reader(folder, allow_pickle).read()


def write_dcp_folder(state: Any, folder: Path, *, allow_pickle: bool = False) -> None:
    """Write ``state`` as a DCP checkpoint folder that ``dcp.load`` reads at any world size.

    The state is validated as for every format (UnsupportedState naming the key path; modules,
    optimizers and schedulers are written as their state dicts), then written by DCP's own
    ``FileSystemWriter`` in one process (``no_dist=True``) into a temporary sibling folder, then
    fsynced and renamed to ``folder`` (``atomic.atomic_build``): a failed write leaves nothing
    that looks like a checkpoint. ``folder`` must not exist or be an empty folder, and its
    parent must exist (UsageError, before anything is written, and also when ``folder`` got
    content while the state was written). UsageError when ``dcp.save`` refuses the state (DCP
    joins key paths with ``.``, so ``{"a.b": x, "a": {"b": y}}`` collides).
    """
    from ckptrepo.formats import check_folder_target  # the package imports this module on use only

    folder = Path(folder)
    check_folder_target(folder)
    flat = flatten(state, allow_pickle=allow_pickle)
    plain = unflatten(flat.skeleton, flat.tensors, allow_pickle=True)
    if not isinstance(plain, dict):
        raise UsageError(f"cannot write {folder}: a DCP checkpoint holds a dict, not {type(state).__name__}")
    try:
        # Replaces an empty folder; one that got content meanwhile refuses it (OutputExists).
        with atomic_build(folder) as tmp:
            tmp.mkdir()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist is meant
                dcp_save(plain, storage_writer=_Writer(tmp, folder), no_dist=True)
    except OutputExists:
        check_folder_target(folder)  # the refusal a folder with content gets before the write
        raise
    except BaseException as e:
        failure = _save_failure(folder, e)
        if failure is None:
            raise
        raise failure from e


def _save_failure(folder: Path, error: BaseException) -> UsageError | None:
    """The UsageError for a failed ``write_dcp_folder``, or None to let ``error`` through."""
    failures = getattr(error, "failures", None)  # a CheckpointException: {rank: (error, traceback)}
    if not isinstance(failures, dict) or not failures:
        return UsageError(f"cannot write {folder}: {error.strerror or error}") if isinstance(error, OSError) else None
    first = next(iter(failures.values()))
    cause = first[0] if isinstance(first, tuple) and first and isinstance(first[0], BaseException) else error
    if isinstance(cause, OSError):
        return UsageError(f"cannot write {folder}: {cause.strerror or cause}")
    hint = "Nothing was written."
    if "duplicated flatten key" in str(cause):
        hint = "DCP joins key paths with '.', so keys such as 'a.b' and 'a' -> 'b' collide: rename one. " + hint
    return UsageError(f"cannot write {folder}: dcp.save refused the state ({summarize(cause)})", hint=hint)


class _Writer(FileSystemWriter):
    """DCP's ``FileSystemWriter`` writing into ``tmp`` while recording ``final`` as the checkpoint's
    id in its metadata (the folder is renamed there once complete)."""

    def __init__(self, tmp: Path, final: Path) -> None:
        super().__init__(tmp, sync_files=False, overwrite=False)  # atomic_build fsyncs every file
        self._final = final

    def storage_meta(self) -> dcp_metadata.StorageMeta | None:
        return dcp_metadata.StorageMeta(checkpoint_id=str(self._final), save_id=self.save_id)


class _Reader:
    """One ``read_dcp_folder``: validate the metadata into a ``_Plan``, then read and check every
    chunk and value, then nest them."""

    def __init__(self, folder: Path, allow_pickle: bool) -> None:
        self.folder = folder
        self.allow_pickle = allow_pickle

    def fail(self, reason: str, hint: str = _HINT) -> NoReturn:
        raise InvalidInput(path=str(self.folder), reason=reason, hint=hint)

    def read(self) -> dict[str, Any]:
        plan = self.plan(self.metadata())
        self.nest(plan.paths, dict.fromkeys(plan.paths))  # key paths checked before any data is read
        values: dict[str, Any] = {}
        for name, items in self.by_file(plan).items():
            self.read_file(name, items, plan, values)
        for fqn, spec in plan.tensors.items():
            if fqn not in values:  # no chunk has bytes: an empty tensor
                values[fqn] = torch.empty(spec.size, dtype=spec.dtype)
        return self.nest(plan.paths, values)

    # -- the metadata --------------------------------------------------------------------

    def metadata(self) -> Any:
        path = self.folder / METADATA_NAME
        if not self.folder.is_dir():
            self.fail("no such folder")
        if not path.is_file():
            per_rank = sorted(p.name for p in self.folder.glob("__*" + METADATA_NAME))
            if per_rank:
                self.fail(f"it has per-rank metadata ({', '.join(per_rank[:3])}) and no {METADATA_NAME}: it was saved "
                          "with use_collectives=False, which ckptrepo does not read",
                          hint="Load it with torch.distributed.checkpoint and save it again with the default "
                          "use_collectives=True, which writes one .metadata.")
            self.fail(f"it has no {METADATA_NAME} file, so it is not a DCP checkpoint folder")
        try:
            size = path.stat().st_size
            if size > MAX_METADATA_BYTES:
                self.fail(f"its {METADATA_NAME} has {size} bytes, more than the {MAX_METADATA_BYTES} bytes ckptrepo "
                          "reads of DCP metadata", hint="Save the checkpoint again with fewer, larger shards.")
            with open(path, "rb") as f:
                data = f.read(size + 1)  # read(n) allocates n bytes first
            if len(data) != size:
                self.fail(f"its {METADATA_NAME} changed while being read")
            md = unpickle_metadata(data, self.fail)
        except InvalidInput:
            raise
        except OSError as e:
            self.fail(f"its {METADATA_NAME} cannot be read ({e.strerror or e})")
        except Exception as e:
            self.fail(f"its {METADATA_NAME} is not a readable DCP metadata pickle ({summarize(e)})")
        if not isinstance(md, dcp_metadata.Metadata):
            self.fail(f"its {METADATA_NAME} holds a {type(md).__name__}, not DCP Metadata")
        version = getattr(md, "version", None)
        if version is not None and (type(version) is not str or version.split(".")[0] != "1"):
            self.fail(f"its {METADATA_NAME} is of DCP format version {version!r}; this ckptrepo reads version 1",
                      hint="Upgrade ckptrepo, or save the checkpoint again with this torch version.")
        return md

    def plan(self, md: Any) -> _Plan:
        entries = getattr(md, "state_dict_metadata", None)
        if not isinstance(entries, dict) or not all(type(k) is str for k in entries):
            self.fail(f"its {METADATA_NAME} has no state_dict_metadata mapping key names to entries")
        pieces = self.pieces(getattr(md, "storage_data", None))
        used: set[tuple[str, tuple[int, ...] | None]] = set()
        tensors: dict[str, _TensorPlan] = {}
        values: dict[str, _Piece] = {}
        for fqn, entry in entries.items():
            if isinstance(entry, dcp_metadata.BytesStorageMetadata):
                values[fqn] = self.piece_of(pieces, used, fqn, None)
            elif isinstance(entry, dcp_metadata.TensorStorageMetadata):
                tensors[fqn] = self.tensor_plan(fqn, entry, pieces, used)
            else:
                self.fail(f"its entry for {fqn!r} is a {type(entry).__name__}, not tensor or value metadata")
        for fqn, offsets in pieces:
            if (fqn, offsets) not in used:
                what = "a value" if offsets is None else f"a chunk at {list(offsets)}"
                self.fail(f"its storage data places {what} of {fqn!r}, which the metadata does not declare")
        self.check_files([p for spec in tensors.values() for _, p in spec.chunks] + list(values.values()))
        return _Plan(self.key_paths(getattr(md, "planner_data", None), entries), tensors, values)

    def pieces(self, storage: Any) -> dict[tuple[str, tuple[int, ...] | None], _Piece]:
        if not isinstance(storage, dict):
            self.fail(f"its {METADATA_NAME} has no storage data (where each chunk's bytes are)")
        out: dict[tuple[str, tuple[int, ...] | None], _Piece] = {}
        for index, info in storage.items():
            if not isinstance(index, dcp_metadata.MetadataIndex) or type(index.fqn) is not str:
                self.fail(f"its storage data has a key {index!r}, not a MetadataIndex")
            offsets = None if index.offset is None else self.dims(index.offset, f"the offsets of {index.fqn!r}")
            out[index.fqn, offsets] = self.piece(index.fqn, info)
        return out

    def piece(self, fqn: str, info: Any) -> _Piece:
        if not isinstance(info, dcp_filesystem._StorageInfo):
            self.fail(f"the storage of {fqn!r} is a {type(info).__name__}, not FileSystemWriter's _StorageInfo "
                      "(another storage writer?)")
        name, offset, length = (getattr(info, a, None) for a in ("relative_path", "offset", "length"))
        if type(name) is not str or Path(name).name != name or name in ("", ".", "..", METADATA_NAME):
            self.fail(f"the storage of {fqn!r} names {name!r}, not a data file in the folder")
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            self.fail(f"the storage of {fqn!r} has offset {offset!r} and length {length!r}")
        transforms = getattr(info, "transform_descriptors", None) or []
        if not isinstance(transforms, list | tuple) or list(transforms) not in ([], [ZSTD_TRANSFORM]):
            self.fail(f"the bytes of {fqn!r} went through stream transforms {transforms!r}; ckptrepo reads "
                      f"untransformed and {ZSTD_TRANSFORM} streams only",
                      hint="Load it with torch.distributed.checkpoint and save it again without _extensions.")
        return _Piece(name, offset, length, bool(transforms))

    def piece_of(self, pieces: dict[tuple[str, tuple[int, ...] | None], _Piece],
                 used: set[tuple[str, tuple[int, ...] | None]], fqn: str, offsets: tuple[int, ...] | None) -> _Piece:
        key = (fqn, offsets)
        if key not in pieces:
            what = "value" if offsets is None else f"chunk at {list(offsets)}"
            self.fail(f"the {what} of {fqn!r} has no storage entry: its bytes are not in the folder")
        used.add(key)
        return pieces[key]

    def dims(self, value: Any, what: str) -> tuple[int, ...]:
        if not isinstance(value, tuple | list) or not all(type(d) is int and d >= 0 for d in value):
            self.fail(f"{what} are {value!r}, not a sequence of non-negative integers")
        return tuple(value)

    def tensor_plan(self, fqn: str, entry: Any, pieces: dict[tuple[str, tuple[int, ...] | None], _Piece],
                    used: set[tuple[str, tuple[int, ...] | None]]) -> _TensorPlan:
        dtype = getattr(getattr(entry, "properties", None), "dtype", None)
        if not isinstance(dtype, torch.dtype):
            self.fail(f"the tensor {fqn!r} has dtype {dtype!r}, not a torch dtype")
        size = self.dims(getattr(entry, "size", None), f"the size of {fqn!r}")
        chunks = getattr(entry, "chunks", None)
        if not isinstance(chunks, list):
            self.fail(f"the tensor {fqn!r} has no list of chunks")
        spec = _TensorPlan(dtype, size)
        for chunk in chunks:
            if not isinstance(chunk, dcp_metadata.ChunkStorageMetadata):
                self.fail(f"a chunk of {fqn!r} is a {type(chunk).__name__}, not ChunkStorageMetadata")
            offsets = self.dims(chunk.offsets, f"the offsets of a chunk of {fqn!r}")
            sizes = self.dims(chunk.sizes, f"the sizes of a chunk of {fqn!r}")
            if len(offsets) != len(size) or len(sizes) != len(size) or any(
                    o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)):
                self.fail(f"the chunk of {fqn!r} at {list(offsets)} of size {list(sizes)} lies outside "
                          f"its tensor of size {list(size)}")
            piece = self.piece_of(pieces, used, fqn, offsets)
            nbytes = math.prod(sizes) * dtype.itemsize
            if not piece.zstd and piece.length < nbytes:
                self.fail(f"the chunk of {fqn!r} at {list(offsets)} has {piece.length} bytes in {piece.file}, "
                          f"fewer than its {nbytes} bytes of data")
            spec.chunks.append(((offsets, sizes), piece))
        self.check_cover(fqn, size, [box for box, _ in spec.chunks])
        return spec

    def check_cover(self, fqn: str, size: tuple[int, ...], boxes: list[Box]) -> None:
        """The boxes of a tensor's chunks (each inside the tensor) cover every element exactly once."""
        full = [b for b in boxes if math.prod(b[1])]  # chunks of no element (an empty shard) cover nothing
        full.sort(key=lambda b: b[0])
        for i, (a_off, a_size) in enumerate(full):
            for b_off, b_size in full[i + 1:]:
                if size and b_off[0] >= a_off[0] + a_size[0]:
                    break  # sorted by the first offset: no later box reaches back into this one
                if all(ao < bo + bs and bo < ao + as_
                       for ao, as_, bo, bs in zip(a_off, a_size, b_off, b_size, strict=True)):
                    self.fail(f"the chunks of {fqn!r} at {list(a_off)} and {list(b_off)} overlap")
        covered, numel = sum(math.prod(s) for _, s in full), math.prod(size)
        if covered != numel:
            self.fail(f"the chunks of {fqn!r} cover {covered} of its {numel} elements: the checkpoint is partial "
                      "(a rank's data is missing)")

    def check_files(self, pieces: list[_Piece]) -> None:
        """Every piece lies inside its data file, and no two pieces of a file overlap."""
        by_file: dict[str, list[_Piece]] = {}
        for p in pieces:
            by_file.setdefault(p.file, []).append(p)
        for name, found in by_file.items():
            try:
                size = os.stat(self.folder / name).st_size if (self.folder / name).is_file() else None
            except OSError:
                size = None
            if size is None:
                self.fail(f"its data file {name} is missing")
            end = 0
            for p in sorted(found, key=lambda p: p.offset):
                if p.offset + p.length > size:
                    self.fail(f"its data file {name} has {size} bytes, and data is stored at {p.offset}..."
                              f"{p.offset + p.length}: the file is truncated")
                if p.length and p.offset < end:
                    self.fail(f"the data stored in {name} at {p.offset} overlaps the data before it")
                end = max(end, p.offset + p.length)

    def key_paths(self, planner_data: Any, entries: dict[str, Any]) -> dict[str, tuple[str | int, ...]]:
        """Each fqn's key path (``DefaultSavePlanner``'s mappings), in the saved state's order; an fqn
        without one is a top-level key."""
        if planner_data is None:
            return {fqn: (fqn,) for fqn in entries}
        if not isinstance(planner_data, dict):
            self.fail(f"its planner data is a {type(planner_data).__name__}, not DCP's key paths")
        paths: dict[str, tuple[str | int, ...]] = {}
        for fqn in [k for k in planner_data if k in entries] + [k for k in entries if k not in planner_data]:
            path = planner_data.get(fqn, (fqn,))
            if (not isinstance(path, tuple | list) or not path or type(path[0]) is not str
                    or not all(type(p) is str or (type(p) is int and 0 <= p < _MAX_LIST_INDEX) for p in path)):
                self.fail(f"the key path of {fqn!r} is {str(path)[:80]}, not a sequence of keys and list positions")
            paths[fqn] = tuple(path)
        return paths

    # -- the data ------------------------------------------------------------------------

    def by_file(self, plan: _Plan) -> dict[str, list[tuple[_Piece, str, Box | None]]]:
        """What to read from each data file, ``(piece, fqn, chunk box or None for a value)``, by offset."""
        out: dict[str, list[tuple[_Piece, str, Box | None]]] = {}
        for fqn, spec in plan.tensors.items():
            for box, piece in spec.chunks:
                out.setdefault(piece.file, []).append((piece, fqn, box))
        for fqn, piece in plan.values.items():
            out.setdefault(piece.file, []).append((piece, fqn, None))
        for items in out.values():
            items.sort(key=lambda item: item[0].offset)
        return dict(sorted(out.items()))

    def read_file(self, name: str, items: list[tuple[_Piece, str, Box | None]], plan: _Plan,
                  values: dict[str, Any]) -> None:
        try:
            with open(self.folder / name, "rb") as f:
                for piece, fqn, box in items:
                    f.seek(piece.offset)
                    data = f.read(piece.length)
                    if len(data) != piece.length:
                        self.fail(f"its data file {name} changed while being read")
                    if box is None:
                        values[fqn] = self.value(fqn, self.payload(data, piece, fqn, _MAX_VALUE_BYTES))
                    else:
                        spec = plan.tensors[fqn]
                        limit = math.prod(box[1]) * spec.dtype.itemsize + _SAVE_OVERHEAD
                        chunk = self.chunk(fqn, box, spec, self.payload(data, piece, fqn, limit))
                        self.place(values, fqn, spec, box, chunk)
        except OSError as e:
            self.fail(f"its data file {name} cannot be read ({e.strerror or e})")

    def payload(self, data: bytes, piece: _Piece, fqn: str, limit: int) -> bytes:
        """The torch.save archive in ``data`` (decompressed first if it is a zstd frame)."""
        if piece.zstd:
            out = bytearray()
            try:
                with zstandard.ZstdDecompressor().stream_reader(data) as stream:
                    while part := stream.read(1 << 20):
                        out += part
                        if len(out) > limit:
                            self.fail(f"the compressed data of {fqn!r} in {piece.file} inflates beyond "
                                      f"{limit} bytes, more than it can hold")
            except zstandard.ZstdError as e:
                self.fail(f"the compressed data of {fqn!r} in {piece.file} is corrupt ({summarize(e)})")
            data = bytes(out)
        if not data.startswith(_ZIP_MAGIC):
            self.fail(f"the data of {fqn!r} at {piece.offset} in {piece.file} is not a torch.save archive "
                      "(DCP's serialization_format=SAFETENSORS is not read)",
                      hint="Save it again with DCP's default serialization format (torch_save).")
        return data

    def chunk(self, fqn: str, box: Box, spec: _TensorPlan, data: bytes) -> torch.Tensor:
        where = f"the chunk of {fqn!r} at {list(box[0])}"
        try:
            t: Any = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:
            self.fail(f"{where} is not a readable torch.save tensor ({summarize(e)})")
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
            self.fail(f"{where} holds {type(t).__name__}, not a dense tensor")
        if t.dtype != spec.dtype or tuple(t.shape) != box[1]:
            self.fail(f"{where} holds a {t.dtype} tensor of shape {list(t.shape)}; the metadata declares "
                      f"{spec.dtype} of shape {list(box[1])}")
        chunk: torch.Tensor = t.detach()
        return chunk

    def place(self, values: dict[str, Any], fqn: str, spec: _TensorPlan, box: Box, chunk: torch.Tensor) -> None:
        """Put ``chunk`` into the whole tensor ``values[fqn]`` (made on its first chunk) at ``box``.
        Bytes are moved through same-size integer views: every dtype copies, bit for bit."""
        if box[1] == spec.size:  # the only chunk: it is the tensor
            values[fqn] = bit_view(chunk).contiguous().view(spec.dtype) if not chunk.is_contiguous() else chunk
            return
        if fqn not in values:
            values[fqn] = torch.empty(spec.size, dtype=spec.dtype)
        region = tuple(slice(o, o + s) for o, s in zip(*box, strict=True))
        bit_view(values[fqn])[region].copy_(bit_view(chunk))

    def value(self, fqn: str, data: bytes) -> Any:
        safe = getattr(torch.serialization, "safe_globals", None)
        try:
            with safe(_numpy_globals()) if safe and not self.allow_pickle else contextlib.nullcontext():
                return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not self.allow_pickle)
        except pickle.UnpicklingError as e:
            self.fail(f"the value of {fqn!r}: {_weights_only_reason(e)}",
                      hint="Read it with formats.read_state(path, allow_pickle=True) and commit it with "
                      "repo.commit(state, allow_pickle=True), for folders you trust only: unpickling can run code.")
        except Exception as e:
            self.fail(f"the value of {fqn!r} is not a readable torch.save archive ({summarize(e)})")

    # -- nesting -------------------------------------------------------------------------

    def nest(self, paths: dict[str, tuple[str | int, ...]], values: dict[str, Any]) -> dict[str, Any]:
        """The values put at their key paths, as DCP's ``set_element`` does (a string key makes a dict,
        a list position a list, positions never set are None), refusing paths that conflict."""
        root: dict[Any, Any] = {}
        made = {id(root)}  # containers built here; a value that is a dict or a list is a leaf
        for fqn, path in paths.items():
            node = root
            for depth, key in enumerate(path):
                if isinstance(node, _Positions) != (type(key) is int):
                    kind = "list" if isinstance(node, _Positions) else "dict"
                    self.fail(f"the key path of {fqn!r} uses {key!r} where other key paths have a {kind}")
                if depth == len(path) - 1:
                    if key in node:
                        self.fail(f"the key path of {fqn!r} leads where another value is")
                    node[key] = values[fqn]
                elif key not in node:
                    child: dict[Any, Any] = _Positions() if type(path[depth + 1]) is int else {}
                    made.add(id(child))
                    node[key] = node = child
                elif id(node[key]) in made:
                    node = node[key]
                else:
                    self.fail(f"the key path of {fqn!r} passes through the value at {list(path[:depth + 1])}")
        return {k: _listed(v, made) for k, v in root.items()}


class _Positions(dict[int, Any]):
    """A list while ``_Reader.nest`` builds it: position -> value."""


def _listed(value: Any, made: set[int]) -> Any:
    """``value`` with every container ``nest`` made (ids in ``made``) as a plain dict or list, the
    positions of a list that nothing was put at as None."""
    if id(value) not in made:
        return value
    if isinstance(value, _Positions):
        return [_listed(value.get(i), made) for i in range(max(value) + 1)]
    return {k: _listed(v, made) for k, v in value.items()}
