"""Filter expressions over commits (``ckpt log --where``), compiled to SQLAlchemy expressions.

Grammar (keywords case-insensitive)::

    expr       := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | "(" expr ")" | comparison
    comparison := operand OP operand             OP: <  <=  >  >=  ==  !=
    operand    := FIELD | METRIC | metric("any name") | NUMBER | 'string' | "string" | DATE

``FIELDS`` are commit columns (``step``, ``epoch``, ``time``, ``branch``, ...); any other
name is a metric and must be recorded by some commit of the repository. ``time`` takes ISO
dates and times, quoted or not (``time >= 2026-03-01``, ``time < '2026-03-01T12:00+02:00'``;
UTC unless an offset is given). Strings take ``\\'`` and ``\\"`` escapes. One side of a
comparison is a field or metric; the other a value of the same type, or another one.

Semantics: a comparison is false on a commit that has no value for it (a metric the commit
did not record, a commit without a step), and ``not`` of it is then true.

Safety contract: text is tokenized and parsed by hand into a small tree (no ``eval``), names
become model columns or *bound* metric-name parameters, values become bound parameters;
nothing the user typed is ever part of SQL text. Every malformed input is a UsageError
naming the position; unknown names a UsageError listing the known fields and metrics.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Float, String, and_, literal, not_, or_, select
from sqlalchemy.orm import Session, aliased

from ckptrepo.db.models import Commit, Metric
from ckptrepo.errors import UsageError

MAX_DEPTH = 50
MAX_LENGTH = 10_000
_INT64 = 2**63 - 1


@dataclass(frozen=True)
class Field:
    """A commit column usable in expressions: its value type and whether it may be missing."""

    column: Any
    kind: str  # "number" | "string" | "time"
    nullable: bool
    help: str


FIELDS: dict[str, Field] = {
    "step": Field(Commit.step, "number", True, "training step"),
    "epoch": Field(Commit.epoch, "number", True, "training epoch"),
    "time": Field(Commit.created_at, "time", False, "commit time (ISO date/time)"),
    "created_at": Field(Commit.created_at, "time", False, "same as time"),
    "branch": Field(Commit.branch, "string", True, "branch the commit was made on"),
    "message": Field(Commit.message, "string", False, "commit message"),
    "author": Field(Commit.author, "string", False, "who committed"),
    "host": Field(Commit.host, "string", False, "machine that committed"),
    "nonfinite": Field(Commit.nonfinite, "number", False, "NaN/Inf values in the commit's tensors"),
}

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}
_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<date>\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?(?:Z|[+-]\d{2}:?\d{2})?)(?![\w.:-])
    |(?P<number>-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])
    |(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    |(?P<op><=|>=|==|!=|<|>)
    |(?P<lparen>\()|(?P<rparen>\))
    |(?P<name>[A-Za-z_][A-Za-z0-9_./]*)""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not"}
_MISTAKES = {
    "=": "use == to compare", "<>": "use != for 'not equal'", "&&": "use and", "||": "use or", "!": "use not",
    ";": "one expression only", "--": "no comments", "-": "no arithmetic (negative numbers are fine: -1)",
}


# -- syntax tree -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str  # date | number | string | op | lparen | rparen | name | and | or | not | end
    text: str
    pos: int


@dataclass(frozen=True)
class Name:
    """A field or metric; ``metric`` is True for ``metric("...")``, which never means a field."""

    name: str
    pos: int
    metric: bool = False


@dataclass(frozen=True)
class Value:
    value: Any  # float | int | str
    kind: str  # number | string | date
    pos: int


@dataclass(frozen=True)
class Compare:
    op: str
    left: Name | Value
    right: Name | Value
    pos: int


@dataclass(frozen=True)
class BoolOp:
    op: str  # and | or
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    item: Node


Node = Compare | BoolOp | Not


def _error(text: str, pos: int, reason: str) -> UsageError:
    return UsageError(
        f"invalid where expression: {reason} at character {pos + 1} of {text!r}",
        hint="Write comparisons joined by and/or/not, e.g. \"val_loss < 2.1 and step >= 1000\"; "
        "quote strings: branch == 'main'.",
    )


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, ending with an ``end`` token; UsageError at the first bad character."""
    if len(text) > MAX_LENGTH:
        raise _error(text[:60] + "...", 0, f"longer than {MAX_LENGTH} characters")
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = None if text.startswith("<>", pos) else _TOKEN.match(text, pos)
        if m is None or m.lastgroup is None:
            ch = text[pos]
            if ch in "'\"":
                raise _error(text, pos, "unterminated string")
            if ch.isdigit() or (ch in "-." and text[pos + 1 : pos + 2].isdigit()):
                raise _error(text, pos, "malformed number")
            two = text[pos : pos + 2]
            mistake = _MISTAKES.get(two) or _MISTAKES.get(ch)
            raise _error(text, pos, f"unexpected {two if two in _MISTAKES else ch!r}"
                         + (f" ({mistake})" if mistake else ""))
        kind, tok = m.lastgroup, m.group()
        if kind == "name" and tok.lower() in _KEYWORDS:
            kind = tok.lower()
        if kind != "ws":
            out.append(Token(kind, tok, pos))
        pos = m.end()
    out.append(Token("end", "", len(text)))
    return out


class _Parser:
    """Recursive descent over the tokens; depth-limited so no input can exhaust the stack."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self, kind: str, what: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            raise _error(self.text, tok.pos, f"expected {what}, got {_shown(tok)}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.expr()
        tok = self.peek()
        if tok.kind != "end":
            raise _error(self.text, tok.pos, f"expected and, or or the end, got {_shown(tok)}")
        return node

    def expr(self) -> Node:
        items = [self.and_expr()]
        while self.peek().kind == "or":
            self.i += 1
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else BoolOp("or", tuple(items))

    def and_expr(self) -> Node:
        items = [self.not_expr()]
        while self.peek().kind == "and":
            self.i += 1
            items.append(self.not_expr())
        return items[0] if len(items) == 1 else BoolOp("and", tuple(items))

    def not_expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _error(self.text, self.peek().pos, f"nested deeper than {MAX_DEPTH} levels")
        tok = self.peek()
        if tok.kind == "not":
            self.i += 1
            node: Node = Not(self.not_expr())
        elif tok.kind == "lparen":
            self.i += 1
            node = self.expr()
            self.take("rparen", "')'")
        else:
            node = self.comparison()
        self.depth -= 1
        return node

    def comparison(self) -> Compare:
        left = self.operand()
        tok = self.peek()
        if tok.kind != "op":
            raise _error(self.text, tok.pos, f"expected a comparison (< <= > >= == !=) after "
                                              f"{self.text[left.pos:tok.pos].strip()!r}, got {_shown(tok)}")
        self.i += 1
        return Compare(tok.text, left, self.operand(), tok.pos)

    def operand(self) -> Name | Value:
        tok = self.peek()
        self.i += 1
        if tok.kind == "name" and tok.text == "metric" and self.peek().kind == "lparen":
            self.i += 1
            name = _unquote(self.take("string", "a quoted metric name").text)
            self.take("rparen", "')'")
            return Name(name, tok.pos, metric=True)
        if tok.kind == "name":
            return Name(tok.text, tok.pos)
        if tok.kind == "number":
            number = float(tok.text)
            is_int = re.fullmatch(r"-?\d+", tok.text) is not None and abs(int(tok.text)) <= _INT64
            return Value(int(tok.text) if is_int else number, "number", tok.pos)
        if tok.kind == "string":
            return Value(_unquote(tok.text), "string", tok.pos)
        if tok.kind == "date":
            return Value(tok.text, "date", tok.pos)
        self.i -= 1
        raise _error(self.text, tok.pos, f"expected a field, metric or value, got {_shown(tok)}")


def _shown(tok: Token) -> str:
    return "the end" if tok.kind == "end" else repr(tok.text)


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def parse(text: str) -> Node:
    """The syntax tree of ``text``; UsageError (naming the position) when it is not of the grammar."""
    return _Parser(text).parse()


# -- compiling -------------------------------------------------------------------------------


def _names(node: Node) -> Iterator[Name]:
    if isinstance(node, Compare):
        yield from (x for x in (node.left, node.right) if isinstance(x, Name))
    elif isinstance(node, BoolOp):
        for item in node.items:
            yield from _names(item)
    else:
        yield from _names(node.item)


def metric_names(session: Session, limit: int = 50) -> list[str]:
    """Up to ``limit`` metric names recorded in the repository, sorted."""
    return list(session.scalars(select(Metric.name).distinct().order_by(Metric.name).limit(limit)))


def check_metrics(session: Session, names: set[str]) -> None:
    """UsageError unless every name in ``names`` is a metric some commit records."""
    if not names:
        return
    present = set(session.scalars(select(Metric.name).where(Metric.name.in_(sorted(names))).distinct()))
    missing = sorted(names - present)
    if missing:
        raise unknown_name(session, missing[0])


def unknown_name(session: Session, name: str) -> UsageError:
    """The error for a name that is neither a field nor a recorded metric, with what exists."""
    metrics = metric_names(session)
    close = difflib.get_close_matches(name, [*FIELDS, *metrics], n=3)
    shown = ", ".join(metrics) if metrics else "(none recorded)"
    return UsageError(
        f"unknown field or metric {name!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""),
        hint=f"Fields: {', '.join(FIELDS)}. Metrics in this repository: {shown}. "
        "Quote string values (branch == 'main'); metric(\"name\") reaches any metric name.",
    )


@dataclass
class _Operand:
    expr: Any
    kind: str
    guards: list[ColumnElement[bool]]
    metrics: list[tuple[Any, str]]  # (aliased Metric, metric name) rows this operand reads


def compile_node(node: Node, text: str) -> ColumnElement[bool]:
    """SQLAlchemy boolean expression on ``Commit`` for a parsed expression (names already checked)."""
    if isinstance(node, BoolOp):
        parts = [compile_node(item, text) for item in node.items]
        return and_(*parts) if node.op == "and" else or_(*parts)
    if isinstance(node, Not):
        return not_(compile_node(node.item, text))
    return _compare(node, text)


def _compare(node: Compare, text: str) -> ColumnElement[bool]:
    if isinstance(node.left, Value) and isinstance(node.right, Value):
        raise _error(text, node.left.pos, "compare a field or metric with a value, not two values")
    left, right = _operand(node.left, node.right, text), _operand(node.right, node.left, text)
    if left.kind != right.kind:
        raise _error(text, node.pos, f"cannot compare a {left.kind} with a {right.kind}")
    cond = _OPS[node.op](left.expr, right.expr)
    guards = left.guards + right.guards
    metrics = left.metrics + right.metrics
    if metrics:
        # EXISTS is exactly true or false: a commit without the metric fails the comparison,
        # and ``not`` of it holds (no SQL NULL leaks into the logic).
        links = [c for m, name in metrics for c in (m.commit_id == Commit.id, m.name == literal(name, String()))]
        cond = select(literal(1)).select_from(*(m for m, _ in metrics)).where(*links, cond).exists()
    return and_(*guards, cond) if guards else cond


def _operand(x: Name | Value, other: Name | Value, text: str) -> _Operand:
    if isinstance(x, Name):
        field = None if x.metric else FIELDS.get(x.name)
        if field is not None:
            guards = [field.column.is_not(None)] if field.nullable else []
            return _Operand(field.column, field.kind, guards, [])
        m = aliased(Metric)
        return _Operand(m.value, "number", [], [(m, x.name)])
    target = _target_kind(other)
    if target == "time":
        return _Operand(literal(_when(x, text), Commit.created_at.type), "time", [], [])
    if x.kind == "date":
        raise _error(text, x.pos, "dates compare with time only")
    if x.kind == "number":
        typ = BigInteger() if isinstance(x.value, int) else Float()
        return _Operand(literal(x.value, typ), "number", [], [])
    return _Operand(literal(x.value, String()), "string", [], [])


def _target_kind(other: Name | Value) -> str:
    if isinstance(other, Name) and not other.metric and other.name in FIELDS:
        return FIELDS[other.name].kind
    return "number" if isinstance(other, Name) else other.kind


def _when(x: Value, text: str) -> datetime:
    if x.kind == "number" or not isinstance(x.value, str):
        raise _error(text, x.pos, "time compares with an ISO date or time, e.g. 2026-03-01 or '2026-03-01T12:00'")
    try:
        when = datetime.fromisoformat(x.value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise _error(text, x.pos, f"{x.value!r} is not an ISO date or time") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def compile_where(session: Session, text: str) -> ColumnElement[bool]:
    """Parse ``text`` and compile it (``compile_checked``)."""
    return compile_checked(session, parse(text), text)


def compile_checked(session: Session, node: Node, text: str) -> ColumnElement[bool]:
    """Compile the parsed ``node`` (of ``text``) against the repository behind ``session``: every
    metric name it uses must be recorded by some commit. The result filters ``select(Commit)``."""
    check_metrics(session, {n.name for n in _names(node) if n.metric or n.name not in FIELDS})
    return compile_node(node, text)
