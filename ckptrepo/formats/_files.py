"""One-line summaries of the errors format libraries raise."""

from __future__ import annotations


def summarize(error: BaseException) -> str:
    """A library error as one readable line (first line, ANSI escapes and padding removed)."""
    text = str(error).replace("\x1b[1m", "").replace("\x1b[0m", "").strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(error).__name__)
    line = line.rstrip(".")
    return line if len(line) <= 300 else line[:297] + "..."
