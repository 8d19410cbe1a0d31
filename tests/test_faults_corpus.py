"""Bad input rows (issue 16): one bad row is a reject with a reason, never a failed build."""

from __future__ import annotations

import json
import os

import pytest
from conftest import write_jsonl

from funnel.pipelines.sources.corpus import CorpusSpec, plan_chunks, read_chunk

# Lone surrogates are valid JSON ("\ud800" escapes) but not encodable Unicode text.
SURROGATE_ROWS = [
    '{"_id": "good1", "text": "plain text about apples"}',
    '{"_id": "bad-text", "text": "broken \\ud800 text"}',
    '{"_id": "bad-title", "title": "\\udfff", "text": "fine text"}',
    '{"_id": "bad-\\ud83d-id", "text": "fine text"}',
    '{"_id": "pair", "text": "an emoji \\ud83d\\ude00 is a valid surrogate pair"}',
    '{"_id": "good2", "text": "bananas are yellow"}',
]


def _read_all(path: str):
    spec = CorpusSpec(path=path)
    rows, rejects = [], []
    for chunk in plan_chunks(spec):
        res = read_chunk(chunk, spec)
        rows += res.rows
        rejects += res.rejects
    return rows, rejects


def test_lone_surrogates_become_rejects_with_reasons(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", SURROGATE_ROWS)
    rows, rejects = _read_all(path)
    assert [r["doc_id"] for r in rows] == ["good1", "pair", "good2"]
    by_line = {r["line"]: r for r in rejects}
    assert sorted(by_line) == [2, 3, 4]
    assert "field 'text'" in by_line[2]["reason"] and "surrogate" in by_line[2]["reason"]
    assert by_line[2]["doc_id"] == "bad-text"
    assert "field 'title'" in by_line[3]["reason"] and "surrogate" in by_line[3]["reason"]
    assert "field '_id'" in by_line[4]["reason"] and "surrogate" in by_line[4]["reason"]
    for r in rejects:  # every reject can be written as UTF-8 (rejects.jsonl, ensure_ascii=False)
        json.dumps(r, ensure_ascii=False).encode("utf-8")


def test_a_surrogate_row_does_not_fail_the_build(ray_session, tmp_path):
    from funnel.jobs.build_index import build
    from funnel.serving.search import open_index
    path = write_jsonl(tmp_path / "c.jsonl", SURROGATE_ROWS)
    rep = build(path, str(tmp_path / "ix"), shards=2)
    assert rep.n_docs == 3 and rep.n_rejects == 3
    with open(rep.rejects_path, encoding="utf-8") as f:
        rejects = [json.loads(line) for line in f]
    assert [r["line"] for r in rejects] == [2, 3, 4]
    assert all("surrogate" in r["reason"] for r in rejects)
    ix = open_index(str(tmp_path / "ix"))
    assert ix.search("bananas", k=3).hits[0].doc_id == "good2"


def test_all_rows_bad_keeps_the_rejects_and_says_where(ray_session, tmp_path):
    from funnel.jobs.build_index import BuildError, build
    path = write_jsonl(tmp_path / "c.jsonl", ['{"_id": "a", "text": "\\ud800"}', "[1, 2]", "{not json"])
    root = tmp_path / "ix"
    with pytest.raises(BuildError) as e:
        build(path, str(root), shards=2)
    msg = str(e.value)
    assert "no valid documents" in msg
    kept = [os.path.join(root, n) for n in os.listdir(root) if n.startswith("rejects-") and n.endswith(".jsonl")]
    assert len(kept) == 1 and kept[0] in msg
    with open(kept[0], encoding="utf-8") as f:
        rejects = [json.loads(line) for line in f]
    assert [r["line"] for r in rejects] == [1, 2, 3]
    assert "surrogate" in rejects[0]["reason"] and "invalid JSON" in rejects[2]["reason"]
    assert e.value.__cause__ is None  # the reasons, not Ray's traceback
