"""Document fields beyond id, title and text: kept per row, typed, stored as columns per shard.

Every key of a corpus row other than its id, title and text (JSONL top-level keys and the
keys of a ``metadata`` object, Parquet columns, a folder's path/size/mtime and front matter)
travels with the row as one JSON object (`encode_fields`: the row's ``fields``) and is
stored with the document. Fields that are *filterable* are also written as columns
(`write_columns`), which serving memory-maps and filters on (``serving/filters.py``):

    ======================  ================================  ==========================================
    type                    values                            files in ``fields/shard-NNNN/``
    ======================  ================================  ==========================================
    ``keyword``             a string                          ``NAME.codes.npy`` int32 (-1: absent) +
                                                              ``NAME.vocab.json`` (sorted strings)
    ``keyword_list``        a list of strings (a string is    ``NAME.ptr.npy`` int64 CSR offsets,
                            a list of one)                    ``NAME.codes.npy`` int32,
                                                              ``NAME.present.npy`` uint8, ``NAME.vocab.json``
    ``number``              an int or a float                 ``NAME.f8.npy`` float64 (NaN: absent)
    ``date``                an ISO 8601 date or date-time     ``NAME.date.npy`` int64 µs since the epoch,
                                                              UTC (a naive time is UTC; INT64_MIN: absent)
    ``bool``                true / false                      ``NAME.bool.npy`` int8 (-1: absent)
    ======================  ================================  ==========================================

Which fields are filterable: those declared at build (``funnel build --fields
year:number,tags:keyword_list`` or ``--fields @schema.json``, a JSON object name → type),
exactly those; without a declaration, every field whose values agree on a type
(`infer_schema`: strings → keyword, numbers → number, ISO dates → date, lists of
strings → keyword_list, booleans → bool). A declared field's value of another type makes
the row a reject naming the row and the field (`row_fields`, at read time, so rejects
flow like every other). ``acl`` (who may read the document: principal and group names) is
always filterable as a ``keyword_list`` and always checked: a malformed ACL must never make
a document public.

The columns are written after the lexical shards (`write_columns`, from the ``fields``
column of ``docs/shard-NNNN.parquet``), so a reindex can rewrite them from the same files
without re-reading the corpus. Every file is in the manifest with its checksum, like every
other file of a version.
"""

from __future__ import annotations

import json
import math
import os
import re
from datetime import date, datetime, timezone
from typing import Any, Iterable

import numpy as np

TYPES = ("keyword", "keyword_list", "number", "date", "bool")
#: The field whose values say who may read a document (``serving/principals.py``).
ACL_FIELD = "acl"
#: What an absent ``acl`` means (``funnel build --acl-absent``).
ACL_ABSENT = ("public", "private")
#: A name that can be a file name and a filter key: not an operator of the filter language.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
RESERVED_NAMES = frozenset({"and", "or", "not"})
MAX_FIELDS = 64            # filterable fields per index (more are kept, not filterable)
MAX_FIELDS_BYTES = 65_536  # one row's fields as JSON
MAX_KEYWORD_CHARS = 1024   # a declared keyword; inference leaves longer text unfilterable
INFER_MAX_CHARS = 256      # inference: a string field with a longer value is text, not a keyword
MAX_LIST_ITEMS = 1024
DATE_MISSING = np.iinfo(np.int64).min
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class FieldError(ValueError):
    """A bad field declaration (build input)."""


# -- values ---------------------------------------------------------------------------------

def parse_date(value: Any) -> int | None:
    """Microseconds since the epoch (UTC) of an ISO 8601 date or date-time string, or None.

    ``2025-06-01`` is midnight UTC; a date-time without an offset is read as UTC."""
    if not isinstance(value, str) or not _DATE_RE.fullmatch(value):
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _jsonable(value: Any) -> Any:
    """A Parquet/Arrow value as JSON: datetimes as ISO strings, NaN as null; raises TypeError
    for what JSON cannot hold (bytes)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    try:  # Decimal and other numbers
        import numbers
        if isinstance(value, numbers.Number):
            return float(value)
    except Exception:  # noqa: BLE001 - fall through to the error below
        pass
    raise TypeError(f"a {type(value).__name__} value")


def coerce(ftype: str, value: Any) -> tuple[bool, Any]:
    """(ok, normalized) for ``value`` as a field of type ``ftype``; absent (None) is ok."""
    if value is None:
        return True, None
    if ftype == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return ok, float(value) if ok else None
    if ftype == "bool":
        return isinstance(value, bool), value
    if ftype == "date":
        us = parse_date(value)
        return us is not None, us
    if ftype == "keyword":
        return isinstance(value, str) and len(value) <= MAX_KEYWORD_CHARS, value
    if ftype == "keyword_list":
        if isinstance(value, str):
            value = [value]
        ok = (isinstance(value, list) and len(value) <= MAX_LIST_ITEMS
              and all(isinstance(v, str) and len(v) <= MAX_KEYWORD_CHARS for v in value))
        return ok, value
    raise FieldError(f"unknown field type {ftype!r}; choose one of {', '.join(TYPES)}")


def describe(value: Any) -> str:
    """``a string ('abc')``, ``a number (3)``: a value as a reject reason shows it."""
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), f"a {type(value).__name__}")
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return f"{kind} ({shown[:40] + '…' if len(shown) > 40 else shown})"


def kind_of(value: Any) -> str:
    """What inference sees in one value: number, bool, date, string, long_string, string_list,
    null or other."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        if parse_date(value) is not None:
            return "date"
        return "string" if len(value) <= INFER_MAX_CHARS else "long_string"
    if isinstance(value, list) and all(isinstance(v, str) and len(v) <= INFER_MAX_CHARS for v in value):
        return "string_list"
    return "other"


# -- declarations -----------------------------------------------------------------------------

def check_name(name: str) -> str | None:
    """Why ``name`` cannot be a filterable field, or None."""
    if name in RESERVED_NAMES:
        return f"{name!r} is an operator of the filter language"
    if not NAME_RE.fullmatch(name):
        return "a filterable name is a letter or _, then letters, digits, _ or -, at most 64 characters"
    return None


def parse_declaration(spec: str | dict | None) -> dict[str, str] | None:
    """``name:type,...``, ``@schema.json`` (a JSON object name → type) or a dict, as
    ``{name: type}``; None for no declaration (inference). Raises FieldError naming the
    bad part."""
    if spec is None:
        return None
    if isinstance(spec, str) and spec.startswith("@"):
        path = spec[1:]
        try:
            with open(path) as f:
                spec = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise FieldError(f"--fields {spec}: cannot read the schema file ({e}); it must be a JSON object "
                             f"name -> type, types: {', '.join(TYPES)}") from None
        if not isinstance(spec, dict):
            raise FieldError(f"--fields @{path}: the schema file must hold a JSON object name -> type")
    if isinstance(spec, str):
        pairs = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, ftype = part.partition(":")
            if not sep:
                raise FieldError(f"--fields: {part!r} has no type; write name:type, types: {', '.join(TYPES)}")
            if name.strip() in pairs:
                raise FieldError(f"--fields: {name.strip()!r} is declared twice")
            pairs[name.strip()] = ftype.strip()
        spec = pairs
    out = {}
    for name, ftype in spec.items():
        if ftype not in TYPES:
            raise FieldError(f"field {name!r}: unknown type {ftype!r}; choose one of {', '.join(TYPES)}")
        if (why := check_name(name)) is not None:
            raise FieldError(f"field {name!r} cannot be filterable: {why}")
        if name == ACL_FIELD and ftype != "keyword_list":
            raise FieldError(f"field {ACL_FIELD!r} is always a keyword_list (principal and group names)")
        out[name] = ftype
    if len(out) > MAX_FIELDS:
        raise FieldError(f"{len(out)} filterable fields declared; at most {MAX_FIELDS}")
    return out


# -- rows -----------------------------------------------------------------------------------

def row_fields(obj: dict, reserved: Iterable[str], declared: dict[str, str] | None
               ) -> tuple[str | None, str | None]:
    """(the row's fields as JSON or None when it has none, None) for a good row, (None, reason)
    for a bad one. ``reserved``: the keys that are the id, title and text. The keys of a
    ``metadata`` object join the top-level ones."""
    skip = set(reserved)
    fields: dict[str, Any] = {}
    for key, value in obj.items():
        if key in skip:
            continue
        if key == "metadata" and isinstance(value, dict):
            for mk, mv in value.items():
                if mk in fields or (mk in obj and mk not in skip and mk != "metadata"):
                    return None, f"field {mk!r} is given both at the top level and in 'metadata'"
                if mk in skip:
                    return None, f"field {mk!r} in 'metadata' is the row's id, title or text field"
                fields[str(mk)] = mv
            continue
        fields[str(key)] = value
    return encode_fields(fields, declared)


def encode_fields(fields: dict[str, Any], declared: dict[str, str] | None = None
                  ) -> tuple[str | None, str | None]:
    """(canonical JSON of ``fields`` or None when empty, None), or (None, reason) when a value
    breaks its declared type (or ``acl``'s), JSON cannot hold it, or it is too large. Folder
    corpora hand their path/size/mtime and front matter through here too."""
    if not fields:
        return None, None
    try:
        clean = {str(k): _jsonable(v) for k, v in fields.items()}
    except TypeError as e:
        return None, f"a field holds {e}, which cannot be kept: use strings, numbers, booleans, dates or lists"
    checks = dict(declared or {})
    checks[ACL_FIELD] = "keyword_list"
    for name, ftype in checks.items():
        if name in clean:
            ok, _ = coerce(ftype, clean[name])
            if not ok:
                what = "is always" if name == ACL_FIELD and not (declared and name in declared) else "is declared"
                return None, f"field {name!r} is {describe(clean[name])}; it {what} {ftype}" + (
                    " (a list of principal and group names)" if name == ACL_FIELD else "")
    text = json.dumps(clean, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    if len(text.encode("utf-8")) > MAX_FIELDS_BYTES:
        return None, f"the row's fields take {len(text.encode('utf-8')):,} bytes as JSON; at most {MAX_FIELDS_BYTES:,}"
    return text, None


# -- schema ---------------------------------------------------------------------------------

def observe(kinds: dict[str, set[str]], fields_json: Iterable[str | None]) -> dict[str, set[str]]:
    """Add each field's value kinds (`kind_of`) seen in ``fields_json`` to ``kinds``."""
    for text in fields_json:
        if not text:
            continue
        for name, value in json.loads(text).items():
            kinds.setdefault(name, set()).add(kind_of(value))
    return kinds


def infer_type(kinds: set[str]) -> tuple[str | None, str]:
    """(type, "") for a field whose values agree, else (None, why it is not filterable)."""
    k = set(kinds) - {"null"}
    if not k:
        return None, "every value is null"
    if k == {"number"}:
        return "number", ""
    if k == {"bool"}:
        return "bool", ""
    if k == {"date"}:
        return "date", ""
    if k <= {"date", "string"}:
        return "keyword", ""
    if "string_list" in k and k <= {"string_list", "string", "date"}:
        return "keyword_list", ""
    if "long_string" in k and k <= {"long_string", "string", "date"}:
        return None, (f"text longer than {INFER_MAX_CHARS} characters, not a keyword "
                      "(declare it with --fields NAME:keyword to filter on it anyway)")
    return None, f"values of mixed or unsupported kinds ({', '.join(sorted(k))})"


def infer_schema(kinds: dict[str, set[str]]) -> tuple[dict[str, str], dict[str, str]]:
    """({name: type} of the filterable fields, {name: why not} of the others), names sorted."""
    schema, skipped = {}, {}
    for name in sorted(kinds):
        if (why := check_name(name)) is not None:
            skipped[name] = why
            continue
        ftype, why = (("keyword_list", "") if name == ACL_FIELD else infer_type(kinds[name]))
        if ftype is None:
            skipped[name] = why
        elif len(schema) >= MAX_FIELDS:
            skipped[name] = f"more than {MAX_FIELDS} filterable fields (declare the ones to keep with --fields)"
        else:
            schema[name] = ftype
    return schema, skipped


# -- columns --------------------------------------------------------------------------------

def shard_dir(version_dir: str, shard: int) -> str:
    return os.path.join(version_dir, "fields", f"shard-{shard:04d}")


def column_files(name: str, ftype: str) -> tuple[str, ...]:
    """The file names of one field's column, in the order `write_columns` writes them."""
    return {"number": (f"{name}.f8.npy",), "date": (f"{name}.date.npy",), "bool": (f"{name}.bool.npy",),
            "keyword": (f"{name}.codes.npy", f"{name}.vocab.json"),
            "keyword_list": (f"{name}.ptr.npy", f"{name}.codes.npy", f"{name}.present.npy",
                             f"{name}.vocab.json")}[ftype]


def build_column(ftype: str, values: list) -> dict[str, Any]:
    """One shard's column of one field from its normalized values (None: absent), as
    ``{file suffix: array or vocabulary list}``."""
    n = len(values)
    if ftype == "number":
        return {"f8": np.array([np.nan if v is None else v for v in values], dtype=np.float64).reshape(n)}
    if ftype == "date":
        return {"date": np.array([DATE_MISSING if v is None else v for v in values], dtype=np.int64).reshape(n)}
    if ftype == "bool":
        return {"bool": np.array([-1 if v is None else int(v) for v in values], dtype=np.int8).reshape(n)}
    if ftype == "keyword":
        vocab = sorted({v for v in values if v is not None})
        at = {v: i for i, v in enumerate(vocab)}
        return {"codes": np.array([-1 if v is None else at[v] for v in values], dtype=np.int32).reshape(n),
                "vocab": vocab}
    vocab = sorted({x for v in values if v is not None for x in v})
    at = {v: i for i, v in enumerate(vocab)}
    lists = [sorted({at[x] for x in v}) if v is not None else [] for v in values]
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    codes = np.array([c for x in lists for c in x], dtype=np.int32).reshape(int(ptr[-1]))
    present = np.array([v is not None for v in values], dtype=np.uint8).reshape(n)
    return {"ptr": ptr, "codes": codes, "present": present, "vocab": vocab}


def write_shard_columns(out_dir: str, schema: dict[str, str], fields_json: list[str | None]) -> int:
    """Write every schema field's column for one shard (``fields_json`` in local-id order);
    returns how many values were kept. A value that does not fit its type (possible only
    under inference where a shard disagrees, which `infer_schema` rules out) is absent."""
    from ..store.artifacts import save_npy_atomic, write_json_atomic
    os.makedirs(out_dir, exist_ok=True)
    rows = [json.loads(t) if t else {} for t in fields_json]
    kept = 0
    for name, ftype in schema.items():
        values = []
        for r in rows:
            ok, v = coerce(ftype, r.get(name))
            values.append(v if ok else None)
            kept += v is not None and ok
        for suffix, data in build_column(ftype, values).items():
            if suffix == "vocab":
                write_json_atomic(os.path.join(out_dir, f"{name}.vocab.json"), data)
            else:
                save_npy_atomic(os.path.join(out_dir, f"{name}.{suffix}.npy"), data)
    return kept


def _shard_fields(version_dir: str, shard: int) -> list[str | None]:
    """The ``fields`` column of ``docs/shard-NNNN.parquet`` (all None where it has none)."""
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(os.path.join(version_dir, "docs", f"shard-{shard:04d}.parquet"))
    if "fields" not in pf.schema_arrow.names:
        return [None] * pf.metadata.num_rows
    return pf.read(columns=["fields"]).column("fields").to_pylist()


def write_columns(version_dir: str, n_shards: int, declared: dict[str, str] | None,
                  acl_absent: str = "public") -> dict | None:
    """The fields stage of a build (or reindex): infer the schema where none is declared,
    write every shard's columns under ``fields/``, and return the manifest's ``fields``
    section (None when no document has a field and nothing is declared, so an index without
    fields stays as it was)."""
    if acl_absent not in ACL_ABSENT:
        raise FieldError(f"unknown acl_absent {acl_absent!r}; choose one of {', '.join(ACL_ABSENT)}")
    kinds: dict[str, set[str]] = {}
    for s in range(n_shards):
        observe(kinds, _shard_fields(version_dir, s))
    if declared is None:
        schema, skipped = infer_schema(kinds)
    else:
        schema = dict(declared)
        skipped = {n: "not declared (--fields)" for n in sorted(kinds) if n not in schema}
    if acl_absent == "private" or ACL_FIELD in kinds:
        schema.setdefault(ACL_FIELD, "keyword_list")
    if not schema and not kinds:
        return None
    counts = dict.fromkeys(schema, 0)
    for s in range(n_shards):
        values = _shard_fields(version_dir, s)
        rows = [json.loads(t) if t else {} for t in values]
        for name in schema:
            counts[name] += sum(1 for r in rows if r.get(name) is not None)
        write_shard_columns(shard_dir(version_dir, s), schema, values)
    return {"schema": schema, "declared": declared is not None, "acl_absent": acl_absent,
            "not_filterable": skipped, "present": counts}


def _field_type_ok(t) -> bool:
    """Whether an Arrow column of type ``t`` can be kept as a field (strings, numbers, booleans,
    dates and timestamps, and lists of those)."""
    import pyarrow as pa
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _field_type_ok(t.value_type) and not (pa.types.is_list(t.value_type)
                                                      or pa.types.is_large_list(t.value_type))
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
            or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t) or pa.types.is_decimal(t) or pa.types.is_null(t))


def parquet_field_columns(schema, taken: list[str]) -> list[str]:
    """The Parquet columns besides ``taken`` (id, title, text) that rows keep as fields: those
    of a type a field can hold. Others (binary, structs, maps) are left out, with a log line."""
    import logging
    out, left = [], []
    for f in schema:
        if f.name in taken:
            continue
        (out if _field_type_ok(f.type) else left).append(f.name)
    if left:
        logging.getLogger(__name__).info("Parquet columns not kept as fields (their type is not a string, number, "
                                         "boolean, date or a list of these): %s", ", ".join(left))
    return out
