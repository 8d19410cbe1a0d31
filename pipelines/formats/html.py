"""HTML (``.html``, ``.htm``, ``.xhtml``): the page's main text, not its navigation.

Library: selectolax (its Lexbor engine: a maintained, spec-compliant HTML5 parser in C with
wheels and no dependencies). The main text is chosen structurally, from the landmarks that
documentation generators (Sphinx, MkDocs, Javadoc, rustdoc) and most sites emit: the first
``<main>``, ``[role=main]`` or ``<article>``, else ``<body>``, with navigation, headers,
footers, sidebars, forms, scripts and styles removed, and with the navigation and marks that
generators put outside those landmarks: Texinfo's "Next: ... Previous: ... Up: ...
[Contents][Index]" panels (``div.nav-panel``; ``div.header`` and ``div.node`` in older
makeinfo, removed only when they hold next/previous/up links, since other sites use those
class names for content), DocBook's ``div.navheader`` and ``div.navfooter``, and the "¶"
permalinks after headings (Sphinx's and MkDocs' ``a.headerlink``, Texinfo's
``a.copiable-link``). trafilatura was the alternative: its
heuristics also find the main text of pages without landmarks, but they are tuned for
articles (a page under its minimum extracted size gives nothing, and reference pages are
often short), it pulls in lxml and half a dozen packages, and its output shifts with its
heuristics between releases; a structural rule is predictable, and the same on every worker.

The text keeps the page's blocks on their own lines (paragraphs, list items, table rows,
headings) with whitespace collapsed inside them, except in ``<pre>``. The title is
``<title>``, else the first ``<h1>``; ``metadata["headings"]`` holds ``[offset, level,
text]`` of each ``<h1>``-``<h6>`` in the main text.
"""

from __future__ import annotations

import re

from selectolax.lexbor import LexborHTMLParser

from . import Document, UnreadableFile
from .text import decode_text

#: Removed before the main text is taken: navigation and page chrome, and what is not text.
_CHROME = ("nav", "header", "footer", "aside", "form", "script", "style", "noscript", "template",
           "svg", "iframe", "button", "select",
           "[role=navigation]", "[role=banner]", "[role=contentinfo]", "[role=search]", "[aria-hidden=true]",
           "div.nav-panel", "div.navheader", "div.navfooter", "a.headerlink", "a.copiable-link")
#: Removed when they hold next/previous/up links (older Texinfo's navigation blocks): the
#: class names alone are content elsewhere (Drupal's articles are ``div.node``).
_NAV_IF_LINKED = ("div.header", "div.node")
_NAV_LINKS = 'a[rel="next"], a[rel="prev"], a[rel="previous"], a[rel="up"]'
_NAV_TEXT = re.compile(r"\s*(Next|Previous|Prev|Up)\s*:", re.IGNORECASE)
_MAIN = ("main", "[role=main]", "article", "body")
#: Elements that start a new line in the text.
_BLOCKS = frozenset("address dd details dialog div dt fieldset figcaption figure hr li summary tbody thead "
                    "tfoot tr br caption".split())
#: Elements that start a paragraph (a blank line before them: a boundary passages cut at).
_PARAGRAPHS = frozenset("article blockquote dl h1 h2 h3 h4 h5 h6 ol p pre section table ul".split())
_CELLS = frozenset(("td", "th"))
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_\-]+)""", re.IGNORECASE)
_SPACES = re.compile(r"[ \t\r\n\f\v\u00a0]+")


def _decode(data: bytes, name: str) -> str:
    """The page as text: a ``<meta charset>`` in its first 2 KB if Python knows it, else UTF-8
    (Windows-1252 where that fails, as browsers do)."""
    m = _META_CHARSET.search(data[:2048])
    if m is not None:
        charset = m.group(1).decode("ascii").lower()
        if charset not in ("utf-8", "utf8"):
            try:
                text = data.decode(charset)
                if text.strip():
                    return text
            except (LookupError, UnicodeDecodeError):
                pass
    return decode_text(data, name)[0]


def _in_pre(node, stop) -> bool:
    while node is not None and node is not stop:
        if node.tag == "pre":
            return True
        node = node.parent
    return False


class _Text:
    """The text being assembled: pieces, their length, and the line breaks it ends with."""

    def __init__(self):
        self.parts: list[str] = []
        self.size = 0
        self.trail = 2  # as if after a paragraph: no break before the first text

    def add(self, piece: str, pre: bool) -> None:
        if not pre:
            if self.trail or (self.parts and self.parts[-1].endswith(" ")):
                piece = piece.lstrip(" ")
        if not piece:
            return
        self.parts.append(piece)
        self.size += len(piece)
        body = piece.rstrip("\n")
        self.trail = (self.trail if not body else 0) + len(piece) - len(body)

    def space(self) -> None:
        if not self.trail and self.parts and not self.parts[-1].endswith(" "):
            self.add(" ", True)

    def newline(self, n: int) -> None:
        if self.trail >= n:
            return
        if self.parts and self.parts[-1].endswith(" ") and not self.trail:
            kept = self.parts[-1].rstrip(" ")
            self.size -= len(self.parts[-1]) - len(kept)
            self.parts[-1] = kept
        self.add("\n" * (n - self.trail), True)


def read(data: bytes, name: str) -> Document:
    tree = LexborHTMLParser(_decode(data, name))
    title_node = tree.css_first("title")
    title = " ".join(title_node.text().split()) if title_node is not None else ""
    for sel in _CHROME:
        for node in tree.css(sel):
            node.decompose()
    for sel in _NAV_IF_LINKED:
        for node in tree.css(sel):
            if node.css_first(_NAV_LINKS) is not None or _NAV_TEXT.match(node.text()):
                node.decompose()
    root = next((n for n in (tree.css_first(s) for s in _MAIN) if n is not None), tree.root)
    if root is None:
        raise UnreadableFile("no HTML content")
    out = _Text()
    headings = []
    for node in root.traverse(include_text=True):
        tag = node.tag
        if tag == "-text":
            raw = node.text_content or ""
            pre = _in_pre(node.parent, root)
            out.add(raw if pre else _SPACES.sub(" ", raw), pre)
        elif tag in _CELLS:
            out.space()
        elif tag in _PARAGRAPHS:
            out.newline(2)
        elif tag in _BLOCKS:
            out.newline(1)
        if len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            text = " ".join(node.text().split())
            if text:
                headings.append([out.size, int(tag[1]), text])
    text = "".join(out.parts).rstrip()
    if not text.strip():
        raise UnreadableFile("no text in the page's main content (after removing navigation)")
    if not title:
        title = next((t for _, lv, t in headings if lv == 1), "")
    return Document(title, text, {"headings": headings})
