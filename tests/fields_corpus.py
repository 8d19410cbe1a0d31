"""Synthetic corpora with fields and ACLs for the filter and access-control tests.

Words are drawn from small vocabularies so that queries match many documents; every value
is a function of the seed, so an index built from it is the same on every run.
"""

from __future__ import annotations

import json
import random

SHARED = ("river", "stone", "market", "signal", "garden", "engine", "harbor", "ledger", "window", "orbit",
          "copper", "valley", "lantern", "meadow", "thunder", "canyon", "pepper", "violet", "anchor", "pilot")
PUBLIC = ("apple", "bridge", "castle", "dolphin", "falcon", "glacier", "island", "jungle", "kettle", "lemon")
#: Words only documents readable by ``alice``'s team hold (acl alice or eng).
TEAM = ("zephyrine", "quillback", "marrowfen", "tindalow", "brasquet", "yewmantle")
#: Words only the finance documents hold (acl finance): secret to alice and to bob.
FINANCE = ("vexillar", "drumlinor", "ospreyth", "caldrune", "fennoquist", "wherrimund")
CATS = ("runbook", "memo", "howto", "report", "faq")
TAGS = ("billing", "auth", "search", "infra", "mobile", "web")


def _text(rng: random.Random, words: tuple[str, ...], n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n))


def write_corpus(path: str, n_docs: int = 1200, seed: int = 7, acl: bool = False) -> dict[str, str]:
    """Write a JSONL corpus; returns {doc_id: its ACL group} ("public", "alice", "eng",
    "finance"). Fields: ``n`` (a number in [0, 10000)), ``cat`` (keyword), ``tags`` (a list),
    ``day`` (a date in 2024-2025), ``flag`` (bool); with ``acl``: ids ``pub-*`` are public
    or readable by alice's team, ``hid-*`` are finance-only (half the corpus)."""
    rng = random.Random(seed)
    groups = {}
    with open(path, "w") as f:
        for i in range(n_docs):
            group = "public"
            if acl:
                group = "finance" if i % 2 else rng.choice(["public", "public", "alice", "eng"])
            words = SHARED + (FINANCE if group == "finance" else TEAM if group in ("alice", "eng") else PUBLIC)
            doc_id = ("hid-" if group == "finance" else "pub-") + f"{i:05d}" if acl else f"d{i:05d}"
            row = {"_id": doc_id, "title": _text(rng, words, 3), "text": _text(rng, words, rng.randint(8, 40)),
                   "n": rng.randrange(10_000), "cat": rng.choice(CATS),
                   "tags": rng.sample(TAGS, rng.randint(0, 3)),
                   "day": f"{rng.choice([2024, 2025])}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                   "flag": rng.random() < 0.3}
            if rng.random() < 0.1:
                del row["cat"]  # some documents lack a field
            if group != "public":
                row["acl"] = [group]
            groups[doc_id] = group
            f.write(json.dumps(row) + "\n")
    return groups


def random_filter(rng: random.Random) -> dict:
    """A random filter over `write_corpus`'s fields, of any selectivity."""
    kind = rng.randrange(8)
    if kind == 0:
        return {"n": {"lt": rng.choice([1, 10, 100, 1000, 5000, 10_000])}}
    if kind == 1:
        return {"cat": rng.choice(CATS)}
    if kind == 2:
        return {"tags": {rng.choice(["any", "all"]): rng.sample(TAGS, rng.randint(1, 2))}}
    if kind == 3:
        return {"day": {"gte": f"2025-{rng.randint(1, 12):02d}-01"}, "flag": rng.random() < 0.5}
    if kind == 4:
        return {"or": [{"cat": {"in": rng.sample(CATS, 2)}}, {"n": {"gte": rng.randrange(10_000)}}]}
    if kind == 5:
        return {"not": {"cat": {"exists": True}}}
    if kind == 6:
        return {"and": [{"n": {"gte": rng.randrange(5000)}}, {"not": {"tags": {"any": [rng.choice(TAGS)]}}}]}
    return {"n": {"gte": 0}}


def matches(row: dict, flt: dict) -> bool:
    """The filter language interpreted on one corpus row, in plain Python: the oracle that
    ``serving/filters.py``'s vectorized evaluation is checked against."""
    from funnel.pipelines.sources.fields import parse_date

    def cond(name: str, op: str, want) -> bool:
        v = row["_id"] if name == "doc_id" else row.get(name)
        if op == "exists":
            return (v is not None) == want
        if v is None:
            return False
        if name == "day":
            v, want = parse_date(v), ([parse_date(x) for x in want] if isinstance(want, list) else parse_date(want))
        if op == "prefix":
            return any(x.startswith(want) for x in (v if isinstance(v, list) else [v]))
        if isinstance(v, list):
            if op in ("eq",):
                return want in v
            if op in ("in", "any"):
                return any(x in v for x in want)
            if op == "all":
                return all(x in v for x in want)
        if op == "eq":
            return v == want
        if op == "in":
            return v in want
        return {"gte": v >= want, "gt": v > want, "lte": v <= want, "lt": v < want}[op]

    for key, val in flt.items():
        if key == "and" and not all(matches(row, f) for f in val):
            return False
        if key == "or" and not any(matches(row, f) for f in val):
            return False
        if key == "not" and matches(row, val):
            return False
        if key in ("and", "or", "not"):
            continue
        ops = val if isinstance(val, dict) else {"eq": val}
        if not all(cond(key, op, w) for op, w in ops.items()):
            return False
    return True


_BUILT: dict[str, str] = {}


def acl_dense_index(tmp_path_factory) -> tuple[str, str]:
    """(corpus path, index root) of a 400-document corpus with ACLs, built once per test
    session with dense vectors (2 shards, local engine)."""
    if "acl" not in _BUILT:
        from funnel.jobs.build_index import build
        d = tmp_path_factory.mktemp("acl-dense")
        corpus = str(d / "corpus.jsonl")
        write_corpus(corpus, n_docs=400, seed=11, acl=True)
        build(corpus, str(d / "ix"), shards=2, dense=True, engine="local")
        _BUILT["acl"] = corpus
        _BUILT["acl_root"] = str(d / "ix")
    return _BUILT["acl"], _BUILT["acl_root"]
