"""Readers of the file types a folder corpus may hold: one module per type, one registry.

Each reader module has ``read(data: bytes, name: str) -> Document``: the file's bytes in,
its title, text and type-specific metadata out. A file that cannot be read as a document
(encrypted, empty, binary, no text layer) raises `UnreadableFile` with the reason,
which the folder reader (`funnel.pipelines.sources.folder`) turns into a reject.

The registry `READERS` maps a file-name extension to its reader; extensions not in
it are skipped (and counted) by the folder reader. Readers import their library only when
called, so a build without PDFs never needs pypdf, and a missing library is named with the
extra that installs it (``pip install 'funnel[formats]'``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType


class UnreadableFile(ValueError):
    """A file of a readable type that holds no document: the message is the reject's reason."""


@dataclass(frozen=True)
class Document:
    """What a reader makes of one file.

    ``title`` may be empty (the folder reader then uses the file name); ``text`` is what is
    indexed and what character offsets in ``metadata`` (headings, page starts) point into.
    """

    title: str
    text: str
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Reader:
    """One file type: its name, the module under this package that reads it, and the PyPI
    packages that module needs (named in the error when one is missing)."""

    name: str
    module: str
    packages: tuple[str, ...] = ()

    def read(self, data: bytes, name: str) -> Document:
        """Read one file's bytes (``name`` is its path, for messages and title fallbacks)."""
        return self.load().read(data, name)

    def load(self):
        """The reader module, its library imported; an ImportError that says what to install."""
        try:
            return importlib.import_module(f"{__name__}.{self.module}")
        except ImportError as e:
            raise ImportError(f"reading {self.name} files needs {', '.join(self.packages)} ({e}); "
                              "install them with: pip install 'funnel[formats]'") from e


MARKDOWN = Reader("Markdown", "markdown", ("markdown-it-py", "mdit-py-plugins", "PyYAML"))
TEXT = Reader("text", "text")
HTML = Reader("HTML", "html", ("selectolax",))
PDF = Reader("PDF", "pdf", ("pypdf",))

#: File-name extension (lower case, with the dot) -> its reader. reStructuredText is read as
#: plain text (its section titles become the title and the heading offsets).
READERS = MappingProxyType({
    ".md": MARKDOWN, ".markdown": MARKDOWN,
    ".txt": TEXT, ".text": TEXT, ".rst": TEXT,
    ".html": HTML, ".htm": HTML, ".xhtml": HTML,
    ".pdf": PDF,
})


def extension(name: str) -> str:
    """The registry key of a file name: its last suffix, lower case (``"a/B.MD"`` -> ``".md"``)."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return base[dot:].lower() if dot > 0 else ""


def reader_for(name: str) -> Reader:
    """The reader of ``name`` by its extension; a ValueError listing the readable types if none."""
    ext = extension(name)
    try:
        return READERS[ext]
    except KeyError:
        raise ValueError(f"no reader for {ext or 'extension-less'!r} files ({name!r}); readable types: "
                         f"{', '.join(sorted(READERS))}") from None


def readable(name: str) -> bool:
    """Whether a file of this name has a reader."""
    return extension(name) in READERS


def require(extensions) -> None:
    """Import the reader of each extension (a `READERS` key): a missing library fails the
    build before any work, with the package to install, instead of rejecting every file of a type."""
    for reader in {READERS[ext] for ext in extensions}:
        reader.load()


def read_document(data: bytes, name: str) -> Document:
    """Read one file by its extension (see `READERS`)."""
    return reader_for(name).read(data, name)
