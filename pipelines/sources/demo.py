"""The embedded demo corpus: docstrings of the Python standard library, read at run time.

It needs no download, is real prose with real vocabulary, and every machine with Python
has it. One document per documented module, class, function or method.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os

log = logging.getLogger(__name__)

DEMO_MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message",
    "enum", "fractions", "functools", "gzip", "hashlib", "heapq", "hmac", "html", "http.client",
    "http.server", "inspect", "io", "ipaddress", "itertools", "json", "logging", "math", "mimetypes",
    "multiprocessing", "operator", "os", "os.path", "pathlib", "pickle", "pprint", "queue", "random",
    "re", "secrets", "select", "shlex", "shutil", "signal", "socket", "sqlite3", "statistics",
    "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time",
    "timeit", "tokenize", "traceback", "typing", "unittest", "urllib.parse", "urllib.request",
    "uuid", "warnings", "weakref", "xml.etree.ElementTree", "zipfile", "zlib",
)


def _members(mod):
    yield mod.__name__, mod
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj):
            yield f"{mod.__name__}.{name}", obj
            for mname, m in sorted(vars(obj).items()):
                if not mname.startswith("_") and (inspect.isfunction(m) or inspect.ismethoddescriptor(m)):
                    yield f"{mod.__name__}.{name}.{mname}", m
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            yield f"{mod.__name__}.{name}", obj


def demo_documents(max_docs: int | None = 1500, min_chars: int = 80) -> list[dict]:
    """Documents ``{"_id", "title", "text"}`` from the stdlib docstrings, in a fixed order."""
    docs, seen = [], set()
    for modname in DEMO_MODULES:
        try:
            mod = importlib.import_module(modname)
        except Exception:  # a module missing from this Python build: skip it
            log.debug("demo: cannot import %s", modname)
            continue
        for qual, obj in _members(mod):
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < min_chars or qual in seen:
                continue
            seen.add(qual)
            first, _, rest = doc.partition("\n")
            docs.append({"_id": qual, "title": f"{qual} — {first.strip()}"[:200], "text": doc})
    return docs if max_docs is None else docs[:max_docs]


def write_demo_corpus(path: str, max_docs: int | None = 1500) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    docs = demo_documents(max_docs)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return len(docs)
