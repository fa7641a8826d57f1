"""What may reach a terminal, and how wide it is.

Strings a repository stores (messages, metric, branch and tensor names, config values, verify
details) may come from an untrusted file or from a repository someone else made. Printed raw,
their escape sequences would clear the screen, hide text, set the window title or forge
hyperlinks; a carriage return or a line feed would forge lines, and bidi controls reorder
what is shown. ``one_line`` and ``lines`` make such a string visible instead: every character
that is not printable (``str.isprintable``: control characters C0, DEL and C1, format
characters such as bidi controls and zero-width spaces, line and paragraph separators,
surrogates, private-use and unassigned code points) becomes its Python escape (``\\x1b``,
``\\n``, ``\\u202e``, ``\\U000e0041``). Spaces of other widths (Unicode ``Zs``) and the
zero-width (non-)joiners, which shape emoji and scripts, stay as they are.

``Console`` is the one rich console class of the CLI: it never interprets rich markup in what
it prints, escapes what rendering left unsafe (a safety net under ``one_line``, which the
renderers call on every stored string), and does not wrap when it writes to a pipe or a file.
JSON output (``render.emit_json``) is not touched: ``json.dumps`` escapes every control
character, and scripts get the stored strings exactly.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Final

from rich.console import Console as RichConsole
from rich.console import ConsoleDimensions, ConsoleOptions, RenderableType, RenderHook, RenderResult
from rich.segment import Segment

# Not printable, yet harmless and needed: zero-width non-joiner and joiner (scripts, emoji sequences).
_KEPT: Final = frozenset("\u200c\u200d")
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Columns of a console that writes to a pipe or a file: wide enough that nothing is wrapped.
UNWRAPPED_WIDTH: Final = 1 << 20


def _shown(ch: str) -> str:
    if ch.isprintable() or ch in _KEPT or unicodedata.category(ch) == "Zs":
        return ch
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(text: str) -> str:
    """``text`` safe to show on one line: every character that is not printable (line breaks
    included) as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``). Printable text comes
    back unchanged."""
    if text.isprintable():
        return text
    return "".join(map(_shown, text))


def lines(text: str) -> str:
    """``text`` safe to show over several lines: its line feeds (``\\r\\n`` counts as one) kept,
    every other character that is not printable escaped as ``one_line`` does (a lone ``\\r``
    too: it would overwrite the line)."""
    return "\n".join(one_line(line) for line in text.replace("\r\n", "\n").split("\n"))


class _Escaped:
    """A renderable as rendered, with the text of every segment made safe by ``lines`` (control
    segments, which rich makes itself to move the cursor, pass as they are)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: RichConsole, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            if segment.control or segment.text.isprintable():
                yield segment
            else:
                yield Segment(lines(segment.text), segment.style)


class _EscapeHook(RenderHook):
    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Escaped(r) for r in renderables]


class Console(RichConsole):
    """A rich console that prints no markup (``[bold]`` in a string is text), passes no control
    character but line feeds (see ``lines``), and wraps only on a terminal: writing to a pipe or
    a file, it is ``UNWRAPPED_WIDTH`` columns wide, so lines and tables keep their natural width.
    """

    def __init__(self, **options: Any) -> None:
        options.setdefault("markup", False)
        options.setdefault("highlight", False)
        self._fixed_width = options.get("width") is not None
        super().__init__(**options)
        self.push_render_hook(_EscapeHook())

    @property
    def size(self) -> ConsoleDimensions:
        dimensions = RichConsole.size.fget(self)  # type: ignore[attr-defined]
        assert isinstance(dimensions, ConsoleDimensions)
        if self.is_terminal or self._fixed_width:
            return dimensions
        return ConsoleDimensions(UNWRAPPED_WIDTH, dimensions.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        RichConsole.size.fset(self, new_size)  # type: ignore[attr-defined]
