"""`funnel reindex` carries fields and ACLs: a change of metadata alone re-embeds and
re-analyzes nothing, rewrites the stored rows and the field columns, and publishes a version
that serving follows; a text change behaves as before; an unchanged corpus publishes nothing.

The corpora are ``fields_corpus.write_corpus``'s (numbers, keywords, lists, dates, booleans,
ACLs). Where the reindexed version must equal a full build of the new corpus, it is compared
file for file (sha256), as ``test_reindex.py`` does for text changes.
"""

from __future__ import annotations

import json
import os
import shutil

import httpx
import pytest

from fields_corpus import write_corpus
from funnel.jobs.build_index import build
from funnel.jobs.reindex import reindex
from funnel.pipelines.store.artifacts import list_versions, load_manifest, read_current
from funnel.serving.principals import principal, token_digest
from funnel.serving.search import open_index
from test_e2e_processes import free_port, funnel_process, wait_until

from conftest import write_jsonl

TOKENS = {"alice-token-1": {"principal": "alice", "groups": ["eng"]},
          "bob-token-2": {"principal": "bob", "groups": ["sales"]}}
ALICE, BOB = principal("alice", ["eng"]), principal("bob", ["sales"])


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _files(root: str, version: str | None = None) -> dict[str, str]:
    """{relative path: sha256} of a version (the live one by default), stats.duckdb left out
    (DuckDB's bytes are not deterministic; test_reindex compares it by its tables)."""
    m = load_manifest(os.path.join(root, version or read_current(root)))
    return {p: meta["sha256"] for p, meta in m["files"].items() if p != "stats.duckdb"}


def _under(files: dict[str, str], prefix: str) -> dict[str, str]:
    return {p: h for p, h in files.items() if p.startswith(prefix)}


def _ids(res) -> list[str]:
    return sorted(h.doc_id for h in res.hits)


# -- (a) an ACL change alone: nothing embedded, a new version, serving follows ----------------------


@pytest.fixture(scope="module")
def acl_dense(tmp_path_factory):
    """A tiny corpus with ACLs, built with vectors (MiniLM on the CPU)."""
    d = tmp_path_factory.mktemp("acl")
    corpus = str(d / "a.jsonl")
    write_corpus(corpus, n_docs=40, seed=11, acl=True)
    root = str(d / "ix")
    build(corpus, root, shards=2, dense=True, engine="local")
    return corpus, root


def test_an_acl_change_embeds_nothing_and_serving_follows(acl_dense, tmp_path):
    corpus_a, built = acl_dense
    root = str(tmp_path / "ix")
    shutil.copytree(built, root)
    rows = _rows(corpus_a)
    doc = next(r for r in rows if r.get("acl") == ["eng"])  # alice reads it through her group
    query, narrow = doc["title"], {"n": doc["n"]}
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({token_digest(t): p for t, p in TOKENS.items()}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def seen_by(http, token: str, mode: str) -> bool:
        r = http.post(f"{base}/search", json={"query": query, "mode": mode, "k": 20, "filter": narrow},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        return doc["_id"] in {h["doc_id"] for h in r.json()["hits"]}

    with funnel_process("serve", root, "--port", str(port), "--tokens", str(tokens)) as (proc, output), \
            httpx.Client(timeout=120) as http:
        wait_until(lambda: http.get(f"{base}/health").status_code == 200, proc, output, "funnel serve")
        for mode in ("bm25", "dense"):
            assert seen_by(http, "alice-token-1", mode) and not seen_by(http, "bob-token-2", mode), mode

        # Revoke alice's group, grant bob's: the text is the same, only the ACL moves.
        corpus_b = write_jsonl(tmp_path / "b.jsonl",
                               [{**r, "acl": ["sales"]} if r["_id"] == doc["_id"] else r for r in rows])
        before = _files(root)
        rep = reindex(root, corpus_b, executor="local")
        assert rep.published and rep.version == "v000002"
        assert (rep.fields_changed, rep.changed, rep.added, rep.deleted) == (1, 0, 0, 0)
        assert rep.unchanged == len(rows) - 1
        m = load_manifest(os.path.join(root, "v000002"))
        assert rep.dense == {"reused": m["dense"]["ntotal"], "from_cache": 0, "embedded": 0}  # nothing embedded
        after = _files(root)
        # Nothing analyzed or embedded: postings, vocabulary and vectors are the live version's files.
        for part in ("lexical/", "dense/", "docs/ids.arrow"):
            assert _under(after, part) == _under(before, part) and _under(after, part), part
        assert _under(after, "fields/") != _under(before, "fields/")
        changed = [p for p, h in _under(after, "docs/shard-").items() if before[p] != h]
        # the one shard's rows: its parquet record and its store (pipelines/store/docstore.py)
        assert sorted(changed) == [f"docs/{s}{ext}" for s in {p.split("/")[1].split(".")[0] for p in changed}
                                   for ext in (".parquet", ".store", ".store.npy")]
        assert len(changed) == 3
        assert m["reindex"]["fields_changed"] == 1 and m["fields"]["schema"]["acl"] == "keyword_list"

        wait_until(lambda: http.get(f"{base}/health").json()["version"] == "v000002", proc, output,
                   "funnel serve switching to v000002")
        for mode in ("bm25", "dense", "hybrid"):
            assert not seen_by(http, "alice-token-1", mode) and seen_by(http, "bob-token-2", mode), mode
        assert http.get(f"{base}/documents/{doc['_id']}",
                        headers={"Authorization": "Bearer alice-token-1"}).status_code == 404
        assert http.get(f"{base}/documents/{doc['_id']}",
                        headers={"Authorization": "Bearer bob-token-2"}).json()["doc_id"] == doc["_id"]

    # (d) the same corpus again: no change, nothing published.
    again = reindex(root, corpus_b, executor="local")
    assert not again.published and again.fields_changed == 0 and list_versions(root) == ["v000001", "v000002"]


def test_a_text_change_still_embeds_what_changed(acl_dense, tmp_path):
    corpus_a, built = acl_dense
    root = str(tmp_path / "ix")
    shutil.copytree(built, root)
    rows = _rows(corpus_a)
    edited, relabeled = rows[3]["_id"], rows[4]["_id"]
    rows_b = [{**r, "text": r["text"] + " freshly revised wording"} if r["_id"] == edited
              else {**r, "cat": "postmortem"} if r["_id"] == relabeled else r for r in rows]
    rep = reindex(root, write_jsonl(tmp_path / "b.jsonl", rows_b), executor="local")
    assert (rep.changed, rep.fields_changed, rep.added, rep.deleted) == (1, 1, 0, 0)
    ix = open_index(root)
    fresh = len(ix.passage_spans(ix.index.docs.docno_of(edited), ""))
    assert rep.dense["embedded"] + rep.dense["from_cache"] == fresh and rep.dense["reused"] > 0
    assert _ids(ix.search(rows[4]["title"], k=10, filter={"cat": "postmortem"})) == [relabeled]
    assert _ids(ix.search("freshly revised wording", k=1)) == [edited]


# -- (b) field values, new fields, type changes: the filter follows; equal to a full build -------------


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_field_changes_follow_and_equal_a_full_build(executor, ray_session, tmp_path):
    corpus_a = str(tmp_path / "a.jsonl")
    write_corpus(corpus_a, n_docs=300, seed=5, acl=True)
    rows = _rows(corpus_a)
    root, full = str(tmp_path / "re"), str(tmp_path / "full")
    build(corpus_a, root, shards=3, engine="local")
    assert load_manifest(os.path.join(root, "v000001"))["fields"]["schema"]["flag"] == "bool"
    x, y, z = rows[10]["_id"], rows[20]["_id"], rows[30]["_id"]
    old_cat = rows[10].get("cat")
    rows_b = []
    for r in rows:
        if r["_id"] == x:
            r = {**r, "cat": "postmortem"}            # a new keyword value
        elif r["_id"] == y:
            r = {**r, "n": 123456.5}                  # a number moves
        elif r["_id"] == z:
            r = {**r, "flag": "maybe"}                # flag's values no longer agree: not filterable
        if int(r["_id"][4:]) % 50 == 0:
            r = {**r, "team": "search"}               # a field appears
        rows_b.append(r)
    corpus_b = write_jsonl(tmp_path / "b.jsonl", rows_b)
    rep = reindex(root, corpus_b, executor=executor)
    assert rep.executor == executor and (rep.changed, rep.added, rep.deleted) == (0, 0, 0)
    assert rep.fields_changed == 3 + sum(int(r["_id"][4:]) % 50 == 0 for r in rows)

    ix = open_index(root)
    assert _ids(ix.search(rows[10]["title"], k=5, filter={"cat": "postmortem"})) == [x]
    if old_cat is not None:
        assert x not in _ids(ix.search(rows[10]["title"], k=300, filter={"cat": old_cat}))
    assert _ids(ix.search(rows[20]["title"], k=5, filter={"n": {"gte": 100_000}})) == [y]
    teamed = sorted(r["_id"] for r in rows_b if "team" in r)
    assert _ids(ix.search("river stone market signal garden", k=300, filter={"team": "search"})) == \
        sorted(set(teamed) & set(_ids(ix.search("river stone market signal garden", k=300))))
    fields = ix.index.manifest["fields"]
    assert fields["schema"]["team"] == "keyword" and "flag" not in fields["schema"]
    assert "mixed" in fields["not_filterable"]["flag"]

    # The reindexed version is the full build of the new corpus, file for file.
    build(corpus_b, full, shards=3, engine="local")
    assert _files(root) == _files(full)
    assert ix.index.manifest["fields"] == load_manifest(os.path.join(full, read_current(full)))["fields"]


def test_a_declared_field_of_the_wrong_type_is_a_reject(tmp_path):
    rows = [{"_id": f"d{i}", "title": f"note {i}", "text": f"plain words number {i}", "year": 2000 + i,
             "acl": ["eng"] if i % 2 else ["sales"]} for i in range(12)]
    root = str(tmp_path / "ix")
    build(write_jsonl(tmp_path / "a.jsonl", rows), root, shards=2, engine="local", fields="year:number")
    rows[5] = {**rows[5], "year": "last year"}
    rows[6] = {**rows[6], "acl": "sales"}  # a string is an ACL of one name
    rep = reindex(root, write_jsonl(tmp_path / "b.jsonl", rows), executor="local")
    assert (rep.n_rejects, rep.deleted, rep.fields_changed) == (1, 1, 1)
    with open(rep.rejects_path) as f:
        [bad] = [json.loads(line) for line in f]
    assert bad["line"] == 6 and "field 'year'" in bad["reason"] and "declared number" in bad["reason"]
    ix = open_index(root)
    assert ix.index.manifest["fields"]["schema"] == {"year": "number", "acl": "keyword_list"}
    assert ix.index.manifest["fields"]["declared"] is True
    assert ix.get_document("d5") is None
    assert ix.get_document("d6", principal=BOB) is not None
    assert _ids(ix.search("plain words", k=20, principal=ALICE)) == sorted(f"d{i}" for i in (1, 3, 7, 9, 11))


# -- (c) a folder of files: front matter, size and mtime are fields -------------------------------


def test_a_folder_acl_change_in_front_matter(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, acl in (("alpha.md", "eng"), ("beta.md", "sales"), ("gamma.md", "eng")):
        (docs / name).write_text(f"---\nacl: [{acl}]\nkind: runbook\n---\n\n# {name}\n\nRestart the "
                                 f"{name[:-3]} service with care.\n")
    root = str(tmp_path / "ix")
    build(str(docs), root, engine="local")
    ix = open_index(root)
    assert _ids(ix.search("restart service", k=10, principal=ALICE)) == ["alpha.md", "gamma.md"]
    (docs / "alpha.md").write_text((docs / "alpha.md").read_text().replace("acl: [eng]", "acl: [sales, ops]"))
    rep = reindex(root, str(docs), executor="local")
    assert (rep.fields_changed, rep.changed, rep.added, rep.deleted) == (1, 0, 0, 0) and rep.published
    ix = open_index(root)
    assert _ids(ix.search("restart service", k=10, principal=ALICE)) == ["gamma.md"]
    assert _ids(ix.search("restart service", k=10, principal=BOB)) == ["alpha.md", "beta.md"]
    assert _ids(ix.search("restart", k=10, filter={"acl": "ops"})) == ["alpha.md"]
    assert "alpha.md" in _ids(ix.search("restart", k=10, filter={"size": os.path.getsize(docs / "alpha.md")}))
    assert not reindex(root, str(docs), executor="local").published
