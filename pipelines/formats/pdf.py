"""PDF (``.pdf``): the text layer, page by page, with page numbers kept for citations.

Library: pypdf (py-pdf's pure-Python reader: maintained, no compiled or system dependency,
so it installs and behaves the same on every worker; it opens PDFs whose owner password
only restricts printing, and reports the ones that need a user password). pdfminer.six
keeps finer layout, which a search index does not need, at a higher cost per page.

The text is the pages' text joined by a form feed on a line of its own (``"\\n\\f\\n"``: a
page break is also a paragraph break for the passage splitter), so the page of any offset is
``text.count("\\f", 0, offset) + 1``, from the indexed text alone; ``metadata["page_starts"]``
holds the offset where each page begins (page ``i + 1`` starts at ``page_starts[i]``; see
`page_of`) and ``metadata["pages"]`` the page count. A page whose text cannot be
extracted is kept empty and listed in ``metadata["page_errors"]``; a PDF without any text
(scanned images), an encrypted one without its password, or a damaged one is a reject.
"""

from __future__ import annotations

import bisect
import io
import logging

from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

from . import Document, UnreadableFile

log = logging.getLogger(__name__)
# pypdf logs a warning for every irregularity it reads past (a missing EOF marker, a bad
# xref offset); the reader's verdict is the row or the reject, so only its errors are shown.
logging.getLogger("pypdf").setLevel(logging.ERROR)

#: Between two pages' text.
PAGE_BREAK = "\n\f\n"


def page_of(page_starts: list[int], offset: int) -> int:
    """The 1-based page number holding character ``offset`` of a PDF document's text."""
    return max(1, bisect.bisect_right(page_starts, offset))


def _open(data: bytes) -> PdfReader:
    if not data.lstrip()[:5] == b"%PDF-":
        raise UnreadableFile("not a PDF: the file does not start with %PDF-")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                ok = reader.decrypt("")  # an owner password alone still lets anyone read
            except DependencyError as e:
                raise UnreadableFile(f"encrypted PDF that needs a cryptography library to open: {e}") from e
            if not ok:
                raise UnreadableFile("encrypted PDF: it needs a password to open")
        len(reader.pages)  # reads the page tree: a damaged one fails here
    except UnreadableFile:
        raise
    except FileNotDecryptedError as e:
        raise UnreadableFile("encrypted PDF: it needs a password to open") from e
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        raise UnreadableFile(f"damaged PDF: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from e
    return reader


def read(data: bytes, name: str) -> Document:
    reader = _open(data)
    n_pages = len(reader.pages)
    if n_pages == 0:
        raise UnreadableFile("PDF has no pages")
    pages, errors = [], []
    for i in range(n_pages):
        try:
            text = reader.pages[i].extract_text() or ""
        except Exception as e:  # noqa: BLE001 - one bad page (any pypdf failure) must not lose the others
            log.debug("%s: page %d: %s", name, i + 1, e)
            text, _ = "", errors.append(i + 1)
        pages.append(text.replace("\x00", "").replace("\f", "\n").replace("\r\n", "\n").replace("\r", "\n"))
    if not any(p.strip() for p in pages):
        raise UnreadableFile(f"PDF has no text layer ({n_pages} page{'s' if n_pages > 1 else ''} of images?); "
                             "OCR it first")
    starts, pos = [], 0
    for p in pages:
        starts.append(pos)
        pos += len(p) + len(PAGE_BREAK)
    title = ""
    try:
        title = " ".join(str((reader.metadata or {}).get("/Title") or "").split())
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError):
        pass
    metadata = {"pages": n_pages, "page_starts": starts}
    if errors:
        metadata["page_errors"] = errors
    return Document(title, PAGE_BREAK.join(pages), metadata)
