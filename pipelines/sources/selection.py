"""Which files of a folder corpus are read: ``--include``, ``--exclude`` and ``.funnelignore``.

Patterns have the syntax and meaning of a ``.gitignore`` line (read by ``pathspec``'s
``GitIgnoreSpec``, which follows git's own rules): ``#`` starts a comment, ``!`` negates,
a trailing ``/`` matches folders only, a leading ``/`` anchors a pattern at the corpus
folder, a pattern without a ``/`` matches a name at any depth, and ``*``, ``?``, ``[...]``
and ``**`` match as in git. Paths are matched relative to the corpus folder, with ``/``
separators.

- ``.funnelignore`` at the corpus folder's top and ``--exclude`` patterns (after the file's
  lines, so a flag has the last word) leave files out; a folder they match is not entered,
  so, as in git, no pattern can take back a file inside an excluded folder.
- ``--include`` patterns, when any are given, keep only the files one of them matches
  (after the exclusions).

What is left out is counted (the listing's ``excluded``), never rejected. The rules are a
function of the patterns alone (`Rules.key`), so a worker that lists the folder again
applies the same ones, and a reindex reuses the patterns the build recorded in its manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs

#: The ignore file at the top of a corpus folder.
IGNORE_FILE = ".funnelignore"
#: Largest ignore file read; a bigger one is an error (it is a list of patterns, not data).
MAX_IGNORE_BYTES = 1 << 20


def _spec(lines: list[str], origin: str):
    import pathspec
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except ValueError as e:  # pathspec's GitIgnorePatternError
        raise ValueError(f"{origin}: not a valid .gitignore pattern: {e}") from None


@dataclass(frozen=True)
class Rules:
    """The patterns of one listing: ``ignore`` (the ``.funnelignore`` lines), ``exclude`` and
    ``include`` (the flags'), compiled once."""

    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] = ()

    def __post_init__(self):
        out = self.ignore + self.exclude
        object.__setattr__(self, "_out", _spec(list(out), "--exclude or .funnelignore") if out else None)
        inc = None
        for p in self.include:  # each checked alone, so the error names the pattern
            _spec([p], f"--include {p!r}")
        if self.include:
            inc = _spec(list(self.include), "--include")
        object.__setattr__(self, "_in", inc)

    def key(self) -> tuple:
        return (self.ignore, self.exclude, self.include)

    def excludes_dir(self, rel: str) -> bool:
        """Whether the folder ``rel`` (relative, no trailing ``/``) is left out, not entered."""
        return self._out is not None and self._out.match_file(rel + "/")

    def excludes_file(self, rel: str) -> bool:
        """Whether the file ``rel`` is left out: excluded, or not included."""
        if self._out is not None and self._out.match_file(rel):
            return True
        return self._in is not None and not self._in.match_file(rel)


def _patterns(values, flag: str) -> tuple[str, ...]:
    out = []
    for v in values or ():
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"{flag} takes a non-empty pattern (e.g. 'docs/**/*.md'), got {v!r}")
        out.append(v.strip())
    return tuple(out)


def normalize_patterns(include, exclude) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(include, exclude)`` as tuples of patterns, each checked: a ValueError names a bad one."""
    inc, exc = _patterns(include, "--include"), _patterns(exclude, "--exclude")
    Rules((), exc, inc)  # compiles them: an invalid pattern fails here, before any listing
    return inc, exc


def read_ignore_file(fs: pafs.FileSystem, root: str) -> tuple[str, ...]:
    """The lines of ``root``/.funnelignore (none if there is no such file)."""
    path = root.rstrip("/") + "/" + IGNORE_FILE
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        return ()
    if (info.size or 0) > MAX_IGNORE_BYTES:
        raise ValueError(f"{path} is {info.size:,} bytes, over the {MAX_IGNORE_BYTES:,} bytes an ignore file may "
                         "hold: it lists patterns, one a line, as a .gitignore does")
    with fs.open_input_stream(path) as f:
        data = f.read(MAX_IGNORE_BYTES + 1)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e}); save it as UTF-8") from None
    lines = tuple(line.rstrip("\r") for line in text.split("\n"))
    _spec(list(lines), path)
    return lines


def rules_for(fs: pafs.FileSystem, root: str, include=(), exclude=()) -> Rules:
    """The rules of a corpus folder: its ``.funnelignore`` and the patterns given."""
    inc, exc = normalize_patterns(include, exclude)
    return Rules(read_ignore_file(fs, root), exc, inc)
