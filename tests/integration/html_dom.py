"""A small DOM for the UI tests: an HTML page parsed into a tree of ``Node`` (standard library
only), so a test asks for elements by tag, class, attribute or id and reads their text."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

import httpx

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.walk()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        """Elements of ``tag`` (any when None) having class ``cls`` among theirs and attributes
        equal to ``attrs`` (``data_x`` names ``data-x``; a trailing ``_`` is dropped: ``class_``)."""
        return [n for n in self.walk() if (tag is None or n.tag == tag)
                and (cls is None or cls in n.attrs.get("class", "").split())
                and all(n.attrs.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]

    def by_id(self, element_id: str) -> Node:
        found = [n for n in self.walk() if n.attrs.get("id") == element_id]
        assert len(found) == 1, f"#{element_id}: {len(found)} elements"
        return found[0]

    def has_id(self, element_id: str) -> bool:
        return any(n.attrs.get("id") == element_id for n in self.walk())


class Page(HTMLParser):
    """An HTML document as a tree of ``Node`` (unclosed elements are closed by their parent's end tag)."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v if v is not None else "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def page(response: httpx.Response) -> Node:
    """The HTML page of ``response`` as a tree."""
    assert response.headers["content-type"].startswith("text/html"), response.headers["content-type"]
    return Page(response.text).root
