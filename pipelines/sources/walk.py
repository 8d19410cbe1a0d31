"""Listing a folder corpus without leaving it: symbolic links, loops, odd names, exclusions.

A local folder is walked with ``os.scandir`` rather than pyarrow's recursive selector,
which follows every symbolic link: a link to ``/etc/passwd``, to a home folder's
``.ssh``, or to ``..`` (a loop it follows until the path grows too long) would all be read
as the corpus. Here:

- Real files and folders come first: every folder under the root is walked before any
  link is resolved, so a document's id is its real path, and a link to something already
  listed adds nothing (``links["repeated"]``).
- A link is then resolved once (``os.stat`` and ``os.path.realpath``). One whose target
  lies outside the corpus folder is skipped (``links["outside"]``) and is a reject naming
  its target, unless ``follow_links`` (``--follow-links``) asks to read it; a broken link (no
  target, or a loop of links) is skipped (``links["broken"]``) and is a reject too. A link
  to a folder is walked under the link's path, a link to a file is read under the link's
  name (``links["followed"]``): its id is where it is found, the file read is its target.
- Every folder entered and every file listed is remembered by ``(st_dev, st_ino)``, so no
  folder is walked twice and a loop of links ends, whatever ``follow_links`` says.
- A link never reaches what the folder hides: a target inside the folder is checked like
  the real path it is (hidden, or left out by the `.selection` rules); outside it, a
  hidden target (a name starting with a dot) is skipped as hidden.
- A name that is not valid UTF-8 (ids are UTF-8 text) is a reject that names it with its
  bytes escaped (``bad\\xff.md``); the walk goes on.
- Hidden names (starting with a dot) and folders the rules exclude are not entered; each
  counts once, however much it holds. FIFOs, sockets and devices are never opened (a FIFO
  would block the reader forever): they count as ``special``.

A remote folder (``s3://``; no links there) is listed by pyarrow and the same hidden and
exclusion rules applied to its paths (`select_listing`), each hidden or excluded
folder again counted once.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow.fs as pafs

from .selection import Rules

LINK_COUNTS = ("followed", "outside", "broken", "repeated")


@dataclass(frozen=True)
class Found:
    """A regular file the walk keeps: its id (``rel``), the path to read, size and mtime."""

    rel: str
    path: str
    size: int
    mtime: str


@dataclass
class Walk:
    """What a walk found: the files kept, the rejects ``(id, path, reason)`` and the counts."""

    files: list[Found] = field(default_factory=list)
    rejects: list[tuple[str, str, str]] = field(default_factory=list)
    hidden: int = 0
    excluded: int = 0
    special: int = 0
    bad_names: int = 0
    links: Counter = field(default_factory=Counter)


def iso_mtime(ns: int) -> str:
    """UTC modification time to the second, ISO 8601 with ``Z`` (as the fields store it)."""
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def printable(name: str) -> str:
    """``name`` as UTF-8 text: bytes that are not UTF-8 (held as surrogates by ``os.fsdecode``)
    shown as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def walk_local(root: str, rules: Rules, follow_links: bool = False, skip_hidden: bool = True) -> Walk:
    """Walk the local folder ``root`` (see the module docstring); ids relative to it.
    ``skip_hidden`` False keeps hidden files and folders (the search for data files does)."""
    root = os.path.abspath(root)
    root_real = os.path.realpath(root)
    out = Walk()
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()
    st = os.stat(root)
    seen_dirs.add((st.st_dev, st.st_ino))
    stack: list[tuple[str, str, bool]] = [(root, "", False)]  # (folder, id prefix, reached by a link)
    links: deque[tuple[str, str]] = deque()

    def reject(rel: str, path: str, reason: str) -> None:
        out.rejects.append((printable(rel), printable(path), reason))

    def bad_name(rel: str, path: str, kind: str) -> None:
        out.bad_names += 1
        reject(rel, path, f"the {kind} name is not valid UTF-8 (shown here with its bytes escaped), and ids are "
                          f"UTF-8 text: rename it (e.g. convmv -f latin1 -t utf8 -r --notest){'' if kind == 'file' else '; nothing in it was read'}")

    def add_file(rel: str, path: str, s: os.stat_result) -> None:
        seen_files.add((s.st_dev, s.st_ino))
        out.files.append(Found(rel, path, int(s.st_size), iso_mtime(s.st_mtime_ns)))

    def enter(rel: str, path: str, s: os.stat_result, via_link: bool) -> bool:
        key = (s.st_dev, s.st_ino)
        if key in seen_dirs:
            return False
        seen_dirs.add(key)
        stack.append((path, rel + "/", via_link))
        return True

    def scan(folder: str, prefix: str, via_link: bool) -> None:
        try:
            with os.scandir(folder) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as e:
            if not prefix:
                raise
            reject(prefix.rstrip("/"), folder, f"cannot list the folder: {e.strerror or e}; nothing in it was read")
            return
        subdirs = []
        for e in items:
            rel = prefix + e.name
            if skip_hidden and e.name.startswith("."):
                out.hidden += 1
                continue
            if e.is_symlink():
                links.append((rel, e.path))
                continue
            try:
                s = e.stat(follow_symlinks=False)
            except OSError as err:
                reject(rel, e.path, f"cannot read the file's details: {err.strerror or err}")
                continue
            is_dir = stat.S_ISDIR(s.st_mode)
            if rules.excludes_dir(rel) if is_dir else rules.excludes_file(rel):
                out.excluded += 1
            elif not _utf8(e.name):
                bad_name(rel, e.path, "folder" if is_dir else "file")
            elif is_dir:
                subdirs.append((rel, e.path, s))
            elif not stat.S_ISREG(s.st_mode):
                out.special += 1
            elif via_link and (s.st_dev, s.st_ino) in seen_files:  # already listed under another path
                out.links["repeated"] += 1
            else:
                add_file(rel, e.path, s)
        for rel, path, s in reversed(subdirs):  # popped in name order
            if not enter(rel, path, s, via_link):  # a folder reached again (through a followed link)
                out.links["repeated"] += 1

    def resolve(rel: str, path: str) -> None:
        try:
            s = os.stat(path)
        except OSError as err:
            s = None
            why = ("a loop of symbolic links" if err.errno == errno.ELOOP
                   else f"its target {printable(os.readlink(path)) if os.path.islink(path) else '?'} does not exist")
        is_dir = s is not None and stat.S_ISDIR(s.st_mode)
        if rules.excludes_dir(rel) if is_dir else rules.excludes_file(rel):
            out.excluded += 1
            return
        if s is None:
            out.links["broken"] += 1
            reject(rel, path, f"broken symbolic link ({why}): skipped")
            return
        real = os.path.realpath(path)
        if _within(real, root_real):
            target = os.path.relpath(real, root_real).replace(os.sep, "/")
            if skip_hidden and target != "." and _hidden(target):
                out.hidden += 1
                return
            if target != "." and (rules.excludes_dir(target) if is_dir else rules.excludes_file(target)):
                out.excluded += 1
                return
        elif not follow_links:
            out.links["outside"] += 1
            reject(rel, path, f"symbolic link to {printable(real)}, outside the corpus folder: not read "
                              "(--follow-links reads links that leave the folder)")
            return
        elif skip_hidden and os.path.basename(real).startswith("."):
            out.hidden += 1
            return
        if not _utf8(rel):
            bad_name(rel, path, "folder" if is_dir else "file")
            return
        if is_dir:
            if enter(rel, real, s, True):
                out.links["followed"] += 1
            else:
                out.links["repeated"] += 1
        elif stat.S_ISREG(s.st_mode):
            if (s.st_dev, s.st_ino) in seen_files:
                out.links["repeated"] += 1
            else:
                out.links["followed"] += 1
                add_file(rel, real, s)
        else:
            out.special += 1

    while stack or links:
        if stack:
            scan(*stack.pop())
        else:
            resolve(*links.popleft())
    return out


def select_listing(infos, root: str, rules: Rules) -> Walk:
    """The files of a recursive pyarrow listing of ``root`` (a remote folder: no links), with
    the hidden and exclusion rules applied as `walk_local` applies them."""
    out = Walk()
    verdict: dict[str, str | None] = {}  # folder rel -> "hidden" | "excluded" | None
    counted: set[str] = set()

    def folder(d: str) -> str | None:
        if d not in verdict:
            parent, _, name = d.rpartition("/")
            v = folder(parent) if parent else None
            if v is None:
                v = "hidden" if name.startswith(".") else "excluded" if rules.excludes_dir(d) else None
            verdict[d] = v
        return verdict[d]

    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(root) + 1:].replace(os.sep, "/")
        parts = rel.split("/")
        why = None
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            why = folder(d)
            if why is not None:  # d is the top folder left out (its parents are not): counted once
                if d not in counted:
                    counted.add(d)
                    setattr(out, why, getattr(out, why) + 1)
                break
        if why is not None:
            continue
        if parts[-1].startswith("."):
            out.hidden += 1
        elif rules.excludes_file(rel):
            out.excluded += 1
        else:
            mtime = ""
            if info.mtime is not None:
                m = info.mtime if info.mtime.tzinfo else info.mtime.replace(tzinfo=timezone.utc)
                mtime = m.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
            out.files.append(Found(rel, info.path, int(info.size or 0), mtime))
    return out
