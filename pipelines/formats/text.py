"""Plain text (``.txt``) and reStructuredText (``.rst``), read as text.

No library: the text is the file's content. UTF-8 is expected (a byte-order mark is
dropped); a file that is not UTF-8 but holds no control bytes is read as Windows-1252, the
usual encoding of older text files, and says so in ``metadata["encoding"]``. A NUL or
another control byte means binary data behind a text extension: a reject. Line endings
are normalized to ``\\n``, so line ``n`` of the text is line ``n`` of the file.

For ``.rst`` the section titles (a line underlined, and optionally overlined, by one
repeated punctuation character at least as long as the title) give the heading offsets,
their levels (in order of first use of each adornment, as docutils assigns them) and the
title (the first one).
"""

from __future__ import annotations

import re

from . import Document, UnreadableFile

#: Control bytes that do not occur in text (all C0 controls but tab, newline, form feed, CR, ESC).
_BINARY = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")
_RST_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1+\s*$")


def decode_text(data: bytes, name: str) -> tuple[str, str]:
    """(text, encoding) of a text file's bytes, line endings normalized to ``\\n``.

    Raises `UnreadableFile` for an empty file (nothing but whitespace) or binary data.
    """
    bad = _BINARY.search(data)
    if bad is not None:
        raise UnreadableFile(f"binary data, not text: control byte 0x{data[bad.start()]:02x} at byte "
                             f"{bad.start()} of a {_ext(name)} file")
    try:
        text, encoding = data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = data.decode("cp1252", errors="replace"), "cp1252"
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise UnreadableFile("empty file" if not data else "empty file (whitespace only)")
    return text, encoding


def _ext(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    return base[base.rfind("."):] if "." in base else "extension-less"


def rst_headings(text: str) -> list[list]:
    """``[offset, level, title]`` of each reStructuredText section title, in text order."""
    lines = text.split("\n")
    starts, pos = [], 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    levels: dict[tuple[str, bool], int] = {}
    out, i = [], 0
    while i + 1 < len(lines):
        over = _RST_ADORNMENT.match(lines[i])
        title_i = i + 1 if over else i
        if title_i + 1 >= len(lines):
            break
        title = lines[title_i].strip()
        under = _RST_ADORNMENT.match(lines[title_i + 1])
        if title and not _RST_ADORNMENT.match(lines[title_i]) and under and \
                len(lines[title_i + 1].rstrip()) >= len(title) and (not over or over.group(1) == under.group(1)):
            style = (under.group(1), bool(over))
            level = levels.setdefault(style, len(levels) + 1)
            out.append([starts[i], level, title])
            i = title_i + 2
            continue
        i += 1
    return out


def read(data: bytes, name: str) -> Document:
    text, encoding = decode_text(data, name)
    metadata: dict = {"encoding": encoding} if encoding != "utf-8" else {}
    title = ""
    if name.lower().endswith(".rst"):
        headings = rst_headings(text)
        metadata["headings"] = headings
        title = headings[0][2] if headings else ""
    return Document(title, text, metadata)
