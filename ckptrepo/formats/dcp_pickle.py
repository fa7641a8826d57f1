"""The restricted unpickler of DCP ``.metadata`` files: it builds DCP's metadata objects and nothing else.

``pickle.Unpickler`` with a ``find_class`` allow-list is not enough for a file from elsewhere: its
BUILD sets attributes on whatever is on the stack, a class included (a crafted file replaced
``PurePosixPath.__truediv__`` for the rest of the process); REDUCE calls an allowed callable with any
arguments (``bytearray(2**31)`` from 32 bytes); the C unpickler's memo is an array as long as the
largest index a PUT names (1 GiB from 12 bytes); a key of a million nested tuples crashes CPython,
which hashes tuples recursively in C; a tuple of two references to a tuple of two references ... is
tiny and takes 2**depth steps to hash. The C unpickler's opcodes cannot be replaced. The pure-Python
``pickle._Unpickler`` (private) calls methods of whatever object APPENDS, SETITEMS and ADDITEMS find,
so its BUILD, REDUCE, NEWOBJ, GET, memo and container handlers would all need replacing, and sizes
tracked in each. So ``unpickle_metadata`` interprets the opcodes itself, allowing only those
``pickle.dump`` writes for DCP metadata (protocols 2 to 5): ``pickletools.genops`` decodes each
opcode and its argument (never reading past the data), and each is carried out with the checks
below. What is checked is what is built: no second parser whose reading could differ. It reads
about 1.2 MB/s, a third of the pure-Python unpickler's speed; DCP writes ~140 bytes per saved chunk.

What torch 2.13's ``dcp.save`` writes (``pickletools.dis``): NEWOBJ with no arguments then BUILD
from a dict of fields for each metadata dataclass, BUILD from a 5-tuple for ``TensorProperties``
(its ``__setstate__``), REDUCE for ``torch.Size``, ``_get_layout``, ``_MEM_FORMAT_ENCODING`` and
``PosixPath`` (``StorageMeta.checkpoint_id``), and plain containers, strings and integers.

- Globals: only ``allowed_globals`` (DCP's metadata classes, ``torch.Size``, torch dtypes, layouts
  and memory formats, pure paths, a few builtin types).
- NEWOBJ makes an empty instance of a DCP metadata class; BUILD fills one such instance once, from a
  plain dict whose keys are its fields (``TensorProperties``: the tuple its ``__setstate__`` takes,
  checked). Nothing else is built: never a class, never slot state.
- REDUCE calls only the allowed callables, each with the arguments pickle writes for it, checked
  before the call: ``torch.Size`` of integers, paths of strings (no longer in total than the file),
  a layout by name, ``bytearray`` of bytes or of a size no larger than the file, and so on.
- APPENDS, SETITEMS and ADDITEMS fill only lists, dicts and sets. Integers hold at most 64 bits. A
  dict or set with more than ``MAX_SAME_HASH`` keys of one hash (crafted collisions make filling it
  quadratic) is refused; so is a hashable value nested deeper than ``MAX_DEPTH``.
- Bounded expansion: using a memoized value again (GET) costs its size in values (a tuple, frozenset,
  ``torch.Size`` or ``MetadataIndex``: all it holds; anything else: 1), and a call costs what it
  copies; the file may spend ``expansion_budget(len(data))``. Once built, the object graph is walked
  once per distinct object and refused if it holds a cycle, nests deeper than ``MAX_DEPTH`` or
  expands, counting every shared reference again, beyond that budget. So hashing, comparing,
  printing and iterating what is returned take time and memory linear in the file's size.

The caller bounds the file itself (``dcp_folder``: ``MAX_METADATA_BYTES``, checked before reading).
"""

from __future__ import annotations

import dataclasses
import functools
import pickletools
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, NoReturn

import torch
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

MAX_DEPTH = 32  # DCP's metadata nests 6 deep (Metadata, dict, entry, chunk list, chunk, Size)
MAX_SAME_HASH = 8  # keys of one dict or set that may share a hash
MAX_INT_BITS = 64

Refuse = Callable[[str], NoReturn]
_ATOM = (1, 0)  # values and depth of anything but a hashable container

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), PurePosixPath, PureWindowsPath,
          torch.dtype, torch.layout, torch.memory_format)


def expansion_budget(size: int) -> int:
    """How many values a ``.metadata`` of ``size`` bytes may expand to, every shared reference counted
    again, and may spend on copies. DCP's own expand to about one value per 7 bytes (what they share
    is strings, classes and constants) and spend as little."""
    return size + 4096


def unpickle_metadata(data: bytes, refuse: Refuse) -> Any:
    """The object the pickle ``data`` holds, built as the module docstring says; ``refuse(reason)``
    is called (and must raise) for anything else. Malformed pickles raise ValueError, IndexError,
    KeyError or TypeError from the opcode decoder or the stack."""
    return _Machine(len(data), refuse).run(data)


@functools.cache
def allowed_globals() -> dict[tuple[str, str], Any]:
    """What ``.metadata`` may name, ``(module, name) -> object``: DCP's metadata classes (built
    from their fields), ``torch.Size``, torch dtypes, layouts and memory formats (constants),
    paths (as pure paths: nothing touches the filesystem) and a few builtin containers."""
    allowed: dict[tuple[str, str], Any] = {}
    for cls in _dcp_classes():
        allowed[cls.__module__, cls.__name__] = cls
    allowed["torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"] = dcp_metadata._MEM_FORMAT_ENCODING
    allowed["torch", "Size"] = torch.Size
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
            allowed["torch", name] = value
    allowed["torch.serialization", "_get_layout"] = _layouts().__getitem__  # how torch pickles a layout
    for module in ("pathlib", "pathlib._local"):  # StorageMeta.checkpoint_id; Python 3.13 moved the classes
        for name in ("PosixPath", "PurePosixPath"):
            allowed[module, name] = PurePosixPath
        for name in ("WindowsPath", "PureWindowsPath"):
            allowed[module, name] = PureWindowsPath
    allowed["collections", "OrderedDict"] = OrderedDict
    for kind in (set, frozenset, complex, bytearray):
        allowed["builtins", kind.__name__] = kind
    return allowed


@functools.cache
def _dcp_classes() -> tuple[type, ...]:
    names = ("Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
             "TensorProperties", "StorageMeta")
    found = [getattr(dcp_metadata, n) for n in names if hasattr(dcp_metadata, n)]
    return (*found, dcp_filesystem._StorageInfo)


@functools.cache
def _layouts() -> dict[str, torch.layout]:
    return {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}


@functools.cache
def _field_names() -> dict[type, frozenset[str]]:
    return {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in _dcp_classes()}


class _Machine:
    """One run of the opcode stream: a stack with marks, a memo, what was spent of the budget, and the
    sizes and depths of the hashable containers made (tuples, frozensets, torch.Size, MetadataIndex:
    immutable once made, so what is recorded stays true; a mutable container counts 1 until ``check_graph``)."""

    def __init__(self, size: int, refuse: Refuse) -> None:
        self.size = size
        self.refuse = refuse
        self.budget = expansion_budget(size)
        self.spent = 0
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.sizes: dict[int, tuple[int, int]] = {}  # id -> (values, depth), of hashable containers in ``kept``
        self.kept: list[Any] = []  # alive until the run ends, so that ids in ``sizes`` and ``built`` name them
        self.built: set[int] = set()
        self.collisions: dict[int, Counter[bytes]] = {}  # id of a dict or set -> how many of its keys have each hash
        self.reducers: dict[int, Callable[[tuple[Any, ...]], Any]] = {
            id(torch.Size): self.make_size, id(PurePosixPath): self.make_path, id(PureWindowsPath): self.make_path,
            id(allowed_globals()["torch.serialization", "_get_layout"]): self.make_layout,
            id(dcp_metadata._MEM_FORMAT_ENCODING): self.make_memory_format, id(OrderedDict): self.make_ordered,
            id(set): functools.partial(self.make_set, set), id(frozenset): functools.partial(self.make_set, frozenset),
            id(complex): self.make_complex, id(bytearray): self.make_bytearray,
        }

    def run(self, data: bytes) -> Any:
        handlers = self.handlers()
        for op, arg, _ in pickletools.genops(data):
            if op.name == "STOP":
                root = self.stack.pop()
                self.check_graph(root)
                return root
            handler = handlers.get(op.name)
            if handler is None:
                self.refuse(f"its .metadata uses the pickle opcode {op.name}, which DCP metadata never has")
            handler(arg)
        raise ValueError("pickle exhausted before seeing STOP")

    def handlers(self) -> dict[str, Callable[[Any], None]]:
        push = self.push  # not self.stack.append: each MARK starts another list
        return {
            "PROTO": lambda arg: None, "FRAME": lambda arg: None, "MARK": lambda arg: self.mark(),
            "NONE": lambda arg: push(None), "NEWTRUE": lambda arg: push(True), "NEWFALSE": lambda arg: push(False),
            **dict.fromkeys(("BININT", "BININT1", "BININT2", "LONG1", "LONG4"), self.integer),
            **dict.fromkeys(("BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES",
                             "BINBYTES", "BINBYTES8", "BYTEARRAY8"), push),
            "EMPTY_TUPLE": lambda arg: push(()),
            "TUPLE1": lambda arg: push(self.hashable(tuple(self.pop(1)))),
            "TUPLE2": lambda arg: push(self.hashable(tuple(self.pop(2)))),
            "TUPLE3": lambda arg: push(self.hashable(tuple(self.pop(3)))),
            "TUPLE": lambda arg: push(self.hashable(tuple(self.pop_mark()))),
            "EMPTY_LIST": lambda arg: push([]),
            "APPEND": lambda arg: self.append(self.pop(1)), "APPENDS": lambda arg: self.append(self.pop_mark()),
            "EMPTY_DICT": lambda arg: push({}),
            "SETITEM": lambda arg: self.set_items(self.pop(2)), "SETITEMS": lambda arg: self.set_items(self.pop_mark()),
            "EMPTY_SET": lambda arg: push(set()),
            "ADDITEMS": lambda arg: self.add_items(self.pop_mark()),
            "FROZENSET": lambda arg: push(self.make_set(frozenset, (self.pop_mark(),))),
            "MEMOIZE": lambda arg: self.memo.__setitem__(len(self.memo), self.stack[-1]),
            "BINPUT": self.put, "LONG_BINPUT": self.put, "BINGET": self.get, "LONG_BINGET": self.get,
            "GLOBAL": lambda arg: push(self.find(*arg.split(" ", 1))),
            "STACK_GLOBAL": lambda arg: push(self.find(*self.pop(2))),
            "NEWOBJ": lambda arg: push(self.new_object(*self.pop(2))),
            "REDUCE": lambda arg: push(self.reduce(*self.pop(2))),
            "BUILD": lambda arg: self.build(self.stack.pop()),
        }

    # -- the stack and the budget --------------------------------------------------------

    def push(self, value: Any) -> None:
        self.stack.append(value)

    def pop(self, n: int) -> list[Any]:
        if len(self.stack) < n:
            raise IndexError("pickle stack underflow")
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def mark(self) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def put(self, index: int) -> None:
        self.memo[index] = self.stack[-1]

    def get(self, index: int) -> None:
        if index not in self.memo:
            raise ValueError(f"memo entry {index} is used before it is put")
        value = self.memo[index]
        self.spend(self.sizes.get(id(value), _ATOM)[0])
        self.stack.append(value)

    def spend(self, values: int) -> None:
        """Count ``values`` made again (a memoized value used again, or copied by a call)."""
        self.spent += values
        if self.spent > self.budget:
            self.refuse(f"its .metadata uses its values again and again, expanding beyond {self.budget} values "
                        f"(a {self.size}-byte file of DCP metadata holds fewer)")

    def hashable(self, value: Any, held: Iterable[Any] | None = None) -> Any:
        """``value``, a new hashable container, with its size and depth recorded from those of ``held``
        (default: its items): what hashing it walks (a mutable value in it ends that walk: unhashable).
        Refused beyond MAX_DEPTH: CPython hashes a tuple by recursing in C, with no limit."""
        get = self.sizes.get
        inside = [get(id(v), _ATOM) for v in (value if held is None else held)]
        depth = 1 + max((d for _, d in inside), default=0)
        if depth > MAX_DEPTH:
            self.refuse(f"its .metadata nests values more than {MAX_DEPTH} deep")
        self.sizes[id(value)] = 1 + sum(n for n, _ in inside), depth
        self.kept.append(value)
        return value

    def integer(self, value: int) -> None:
        if value.bit_length() > MAX_INT_BITS:
            self.refuse(f"its .metadata holds an integer of {value.bit_length()} bits; DCP metadata holds none "
                        f"beyond {MAX_INT_BITS}")
        self.stack.append(value)

    # -- containers ----------------------------------------------------------------------

    def append(self, items: list[Any]) -> None:
        target = self.stack[-1]
        if type(target) is not list:
            self.refuse(f"its .metadata appends to a {type(target).__name__}, not to a list")
        target.extend(items)

    def set_items(self, flat: list[Any]) -> None:
        target = self.stack[-1]
        if type(target) not in (dict, OrderedDict) or len(flat) % 2:
            self.refuse(f"its .metadata sets items of a {type(target).__name__}, not of a dict")
        for key, value in zip(flat[::2], flat[1::2], strict=True):
            self.count_hash(target, key)
            target[key] = value

    def add_items(self, items: list[Any]) -> None:
        target = self.stack[-1]
        if type(target) is not set:
            self.refuse(f"its .metadata adds items to a {type(target).__name__}, not to a set")
        for item in items:
            self.count_hash(target, item)
            target.add(item)

    def count_hash(self, target: Any, key: Any) -> None:
        """Refuse ``key`` when more than MAX_SAME_HASH keys of ``target`` share its hash. Strings and
        bytes are not counted (their hashes are randomized per process), nor integers (at most a few
        of 64 bits share a hash)."""
        if type(key) in (str, int, bytes, bool) or key is None:
            return
        if id(target) not in self.collisions:
            self.kept.append(target)
        counts = self.collisions.setdefault(id(target), Counter())
        digest = hash(key).to_bytes(8, "little", signed=True)  # as an int, its own hash is the value mod 2**61-1
        counts[digest] += 1
        if counts[digest] > MAX_SAME_HASH:
            self.refuse(f"its .metadata puts more than {MAX_SAME_HASH} keys of one hash into a "
                        f"{type(target).__name__} (crafted collisions; DCP's keys never collide so)")

    # -- globals and objects -------------------------------------------------------------

    def find(self, module: Any, name: Any) -> Any:
        found = allowed_globals().get((module, name)) if type(module) is str and type(name) is str else None
        if found is None:
            self.refuse(f"its .metadata names {module}.{name}, which is neither DCP metadata nor a plain type; "
                        "loading it could run code, so it was not loaded")
        return found

    def new_object(self, cls: Any, args: Any) -> Any:
        if not any(cls is c for c in _dcp_classes()) or type(args) is not tuple or args:
            self.refuse(f"its .metadata makes a {_name(cls)} by NEWOBJ; it may only make empty DCP metadata "
                        "objects so")
        return cls.__new__(cls)

    def build(self, state: Any) -> None:
        target = self.stack[-1]
        cls = type(target)
        if not any(cls is c for c in _dcp_classes()) or id(target) in self.built:
            what = f"the class {target.__name__}" if isinstance(target, type) else f"a {cls.__name__}"
            self.refuse(f"its .metadata sets the attributes of {what}; it may only fill DCP metadata objects, "
                        "each once")
        self.built.add(id(target))
        self.kept.append(target)
        if "__setstate__" in vars(cls):
            if not _tensor_properties_state(cls, state):
                self.refuse(f"its .metadata sets a {cls.__name__} from {_described(state)}, not from the tuple "
                            "DCP writes")
            target.__setstate__(state)
            return
        if type(state) is not dict or not all(type(k) is str and k in _field_names()[cls] for k in state):
            self.refuse(f"its .metadata sets a {cls.__name__} from {_described(state)}, not from a dict of its "
                        f"fields ({', '.join(sorted(_field_names()[cls])) or 'none'})")
        vars(target).update(state)
        if cls.__hash__ is not None:  # MetadataIndex: a dict key, hashed by its fields
            self.hashable(target, state.values())

    def reduce(self, func: Any, args: Any) -> Any:
        make = self.reducers.get(id(func))
        if make is None or type(args) is not tuple:
            self.refuse(f"its .metadata calls {_name(func)}, which DCP metadata never calls")
        return make(args)

    def wrong_arguments(self, what: str, args: tuple[Any, ...]) -> NoReturn:
        self.refuse(f"its .metadata makes a {what} from {_described(args)}, not from what pickle writes for one")

    def make_size(self, args: tuple[Any, ...]) -> Any:
        if len(args) != 1 or type(args[0]) not in (tuple, list) or not all(type(d) is int for d in args[0]):
            self.wrong_arguments("torch.Size", args)
        self.spend(len(args[0]))
        return self.hashable(torch.Size(args[0]))

    def make_path(self, args: tuple[Any, ...]) -> Any:
        if not all(type(a) is str for a in args):
            self.wrong_arguments("path", args)
        length = sum(map(len, args))
        if length > self.size:
            self.refuse(f"its .metadata makes a path of {length} characters, more than its own {self.size} bytes")
        self.spend(length)
        return PurePosixPath(*args)

    def make_layout(self, args: tuple[Any, ...]) -> Any:
        if len(args) != 1 or type(args[0]) is not str or args[0] not in _layouts():
            self.wrong_arguments("torch layout", args)
        return _layouts()[args[0]]

    def make_memory_format(self, args: tuple[Any, ...]) -> Any:
        if len(args) != 1 or type(args[0]) is not int:
            self.wrong_arguments("memory format code", args)
        return dcp_metadata._MEM_FORMAT_ENCODING(args[0])

    def make_ordered(self, args: tuple[Any, ...]) -> Any:
        if args:
            self.wrong_arguments("OrderedDict", args)
        return OrderedDict()

    def make_set(self, kind: type[set[Any]] | type[frozenset[Any]], args: tuple[Any, ...]) -> Any:
        if len(args) > 1 or (args and type(args[0]) not in (list, tuple, set, frozenset)):
            self.wrong_arguments(kind.__name__, args)
        items = list(args[0]) if args else []
        self.spend(len(items))
        made = kind()
        for item in items:
            self.count_hash(made, item)
        made = kind(items)
        return self.hashable(made) if kind is frozenset else made

    def make_complex(self, args: tuple[Any, ...]) -> Any:
        if len(args) > 2 or not all(type(a) in (int, float) for a in args):
            self.wrong_arguments("complex", args)
        return complex(*args)

    def make_bytearray(self, args: tuple[Any, ...]) -> Any:
        if len(args) == 1 and type(args[0]) is int:
            if not 0 <= args[0] <= self.size:
                self.refuse(f"its .metadata asks for a bytearray of {args[0]} bytes, more than its own {self.size} "
                            "bytes")
        elif len(args) > 1 or (args and type(args[0]) not in (bytes, bytearray)):
            self.wrong_arguments("bytearray", args)
        made = bytearray(*args)
        self.spend(len(made))
        return made

    # -- the result ----------------------------------------------------------------------

    def check_graph(self, root: Any) -> None:
        """Refuse a cycle, nesting beyond MAX_DEPTH, or more than the budget of values, counting each
        reference to a shared value again; visits each distinct value once."""
        done: dict[int, tuple[int, int]] = {}  # id -> (values, height)
        open_: set[int] = set()

        def walk(value: Any, depth: int) -> tuple[int, int]:
            children = _children(value)
            if children is None:
                return 1, 0
            key = id(value)
            if key in done:
                total, height = done[key]
            else:
                if key in open_:
                    self.refuse("its .metadata holds a value that contains itself, as DCP metadata never does")
                if depth >= MAX_DEPTH:
                    self.refuse(f"its .metadata nests values more than {MAX_DEPTH} deep")
                open_.add(key)
                total, height = 1, 0
                for child in children:
                    size, below = walk(child, depth + 1)
                    total, height = total + size, max(height, below + 1)
                    if total > self.budget:
                        self.refuse(f"its .metadata expands to more than {self.budget} values through values it "
                                    f"refers to again and again (a {self.size}-byte file of DCP metadata holds "
                                    "fewer)")
                open_.discard(key)
                done[key] = total, height
            if depth + height > MAX_DEPTH:
                self.refuse(f"its .metadata nests values more than {MAX_DEPTH} deep")
            return total, height

        walk(root, 0)


def _children(value: Any) -> Iterable[Any] | None:
    """What ``value`` holds, or None for a value that holds nothing."""
    if isinstance(value, (*_ATOMS, type)) or callable(value):
        return None
    if isinstance(value, dict):
        return [x for item in value.items() for x in item]
    if isinstance(value, tuple | list | set | frozenset):
        return value
    if type(value) in _dcp_classes():
        return list(vars(value).values())
    return None


def _tensor_properties_state(cls: type, state: Any) -> bool:
    """Whether ``state`` is what TensorProperties' ``__getstate__`` returns: (dtype, layout,
    requires_grad, memory format code, pin_memory)."""
    return (cls is dcp_metadata.TensorProperties and type(state) is tuple and len(state) == 5
            and isinstance(state[0], torch.dtype) and isinstance(state[1], torch.layout) and type(state[2]) is bool
            and isinstance(state[3], dcp_metadata._MEM_FORMAT_ENCODING) and type(state[4]) is bool)


def _name(value: Any) -> str:
    return str(getattr(value, "__qualname__", None) or type(value).__name__)


def _described(value: Any) -> str:
    return f"a {type(value).__name__}" if not isinstance(value, tuple | list) else \
        f"({', '.join(type(v).__name__ for v in value[:5])}{', ...' if len(value) > 5 else ''})"
