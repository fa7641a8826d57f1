"""What the CLI lets reach a terminal (``ckptrepo.cli.terminal``, issue 45).

Stored strings (messages, metric, branch and tensor names) may come from an untrusted file:
printed raw, an escape sequence would clear the screen, hide text or set the window title, and
a ``\\r\\n`` would forge a line. Every character that is not printable is shown as its Python
escape; printable text (any script, emoji with their joiners) is left as it is.
"""

from __future__ import annotations

import io

import pytest
from rich.table import Table
from rich.text import Text

from ckptrepo.cli import terminal

ESC_SEQUENCES = {
    "clear screen": "\x1b[2J\x1b[H",
    "hidden text": "\x1b[8msecret\x1b[0m",
    "window title (OSC)": "\x1b]0;pwned\x07",
    "hyperlink (OSC 8)": "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\",
    "C1 CSI": "\x9b2J",
    "forged line": "ok\r\nerror: forged",
    "carriage return": "abc\rxyz",
    "bidi override": "abc\u202edcb",
    "bidi isolate": "\u2066x\u2069",
    "zero-width space": "a\u200bb",
    "line separator": "a\u2028b",
    "backspace and DEL": "ab\x08\x7f",
    "tag character": "\U000e0041",
}


@pytest.mark.parametrize("name", list(ESC_SEQUENCES))
def test_one_line_leaves_no_control_character(name: str) -> None:
    shown = terminal.one_line("before " + ESC_SEQUENCES[name] + " after")
    assert shown.isprintable(), shown
    assert shown.startswith("before ") and shown.endswith(" after")


def test_one_line_escapes_as_python_does() -> None:
    assert terminal.one_line("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert terminal.one_line("x\r\ny\tz") == "x\\r\\ny\\tz"
    assert terminal.one_line("\u202e") == "\\u202e"
    assert terminal.one_line("\U000e0041") == "\\U000e0041"
    assert terminal.one_line("\x9b") == "\\x9b"


@pytest.mark.parametrize("text", ["plain ascii", "héllo wörld", "日本語のテキスト", "👩‍👩‍👧 family", "a\u00a0b",
                                  "שלום", "[bold]not markup[/bold]", ""])
def test_printable_text_is_unchanged(text: str) -> None:
    assert terminal.one_line(text) == text
    assert terminal.lines(text) == text


def test_lines_keeps_line_feeds_only() -> None:
    assert terminal.lines("first\r\nsecond\nthird\rover\x1b[2J") == "first\nsecond\nthird\\rover\\x1b[2J"


def _printed(*renderables: object, **options: object) -> str:
    out = io.StringIO()
    console = terminal.Console(file=out, **options)  # a StringIO is not a terminal: like a pipe
    for r in renderables:
        console.print(r)
    return out.getvalue()


def test_console_does_not_wrap_into_a_pipe() -> None:
    message = " ".join(f"word{i}" for i in range(60))  # ~400 characters
    assert len(message) > 200
    assert _printed(Text(message)) == message + "\n"
    assert _printed(message) == message + "\n"


def test_console_table_keeps_its_natural_width_into_a_pipe() -> None:
    table = Table()
    table.add_column("name")
    table.add_column("message")
    table.add_row("w", "x" * 300)
    printed = _printed(table)
    assert any("x" * 300 in line for line in printed.splitlines())


def test_console_with_a_width_wraps_at_it() -> None:
    assert max(len(line) for line in _printed("word " * 40, width=40).splitlines()) <= 40


def test_console_prints_no_markup_and_no_control_character() -> None:
    printed = _printed("[bold red]x[/bold red] \x1b]0;title\x07 line\r\nforged", Text("\x1b[2J" + "t"))
    assert "[bold red]x[/bold red]" in printed
    assert "\x1b" not in printed and "\x07" not in printed and "\r" not in printed
    assert "\\x1b]0;title" in printed and "\\x1b[2Jt" in printed  # (rich itself drops a bell and a lone \r)


def test_console_keeps_its_own_styles_on_a_terminal() -> None:
    out = io.StringIO()
    console = terminal.Console(file=out, force_terminal=True, color_system="standard", width=80)
    console.print(Text("ok", style="bold green"), Text("\x1b[2J"))
    printed = out.getvalue()
    assert "\x1b[1;32mok" in printed  # rich's own style sequences pass (control segments and styles)
    assert "\\x1b[2J" in printed and "\x1b[2J" not in printed
