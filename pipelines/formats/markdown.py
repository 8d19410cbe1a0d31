"""Markdown (``.md``, ``.markdown``): front matter to metadata, the title, heading offsets
for passage boundaries.

The title is the front matter's ``title``, else the first level-1 heading (``# x`` or a
line of ``===`` under text), else empty (the folder reader then uses the file name): a page
that opens with a ``## Section`` has no title of its own, and a section's name would be a
misleading one.

Library: markdown-it-py (the CommonMark parser of the Executable Books project, already a
dependency of rich) with the ``front_matter`` plugin of mdit-py-plugins, and PyYAML for
the front matter's content. A CommonMark parser, unlike a regex, knows that ``# x`` inside
a fenced code block is not a heading and that a line of ``---`` under text is a setext
heading; its tokens carry source line numbers, which give the heading offsets.

The indexed text is the Markdown source after the front matter (markup included), so an
offset into it is an offset into the file and ``metadata["line_offset"]`` (the front
matter's lines) turns a line of the text into a line of the file. Front matter that is not
valid YAML does not reject the file: its error is kept in ``metadata["front_matter_error"]``.
"""

from __future__ import annotations

import json
import re

import yaml
from markdown_it import MarkdownIt
from mdit_py_plugins.front_matter import front_matter_plugin

from . import Document
from .text import decode_text

_PARSER = MarkdownIt("commonmark").use(front_matter_plugin)
_NEWLINE = re.compile("\n")


def _plain(inline) -> str:
    """A heading's text without its inline markup (emphasis, links, code spans)."""
    parts = []
    for child in inline.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())


def _front_matter(source: str) -> tuple[dict, str | None]:
    """(front matter as a JSON-compatible dict, error or None)."""
    try:
        value = yaml.safe_load(source)
    except yaml.YAMLError as e:
        return {}, f"front matter is not valid YAML: {' '.join(str(e).split())[:200]}"
    if value is None:
        return {}, None
    if not isinstance(value, dict):
        return {}, f"front matter is a YAML {type(value).__name__}, expected a mapping"
    # Dates and other YAML scalars become strings, so the metadata is JSON.
    return json.loads(json.dumps(value, default=str)), None


def read(data: bytes, name: str) -> Document:
    source, encoding = decode_text(data, name)
    tokens = _PARSER.parse(source)
    line_starts = [0] + [m.end() for m in _NEWLINE.finditer(source)]
    front: dict = {}
    error = None
    body_line = 0
    if tokens and tokens[0].type == "front_matter":
        front, error = _front_matter(tokens[0].content)
        body_line = tokens[0].map[1]
    body_start = line_starts[body_line] if body_line < len(line_starts) else len(source)
    headings = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.map is not None:
            headings.append([line_starts[tok.map[0]] - body_start, int(tok.tag[1:]), _plain(tokens[i + 1])])
    title = front.get("title") if isinstance(front.get("title"), str) else ""
    title = title.strip() or next((h[2] for h in headings if h[1] == 1 and h[2]), "")
    metadata: dict = {"front_matter": front, "headings": headings, "line_offset": body_line}
    if error:
        metadata["front_matter_error"] = error
    if encoding != "utf-8":
        metadata["encoding"] = encoding
    return Document(title, source[body_start:], metadata)
