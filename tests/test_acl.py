"""Access control: per-caller tokens, document ACLs, and nothing secret in any response.

The leak test: a corpus where half the documents are readable by the ``finance`` group only,
and a quarter by alice's team only; ``funnel serve`` and ``funnel mcp`` run as real processes
with ``--tokens``; random queries in every mode, with random filters, as alice and as bob. No
response names a document the caller may not read, quotes its text, or holds a word that only
such documents contain (other than the query's own words); fetching one answers exactly as
fetching a missing id does.
"""

from __future__ import annotations

import json
import os
import random
import re

import anyio
import httpx
import pytest

from fields_corpus import FINANCE, PUBLIC, SHARED, TEAM, acl_dense_index, random_filter
from funnel.serving.principals import ADMIN, TokenFile, as_principal, principal, token_digest
from funnel.serving.search import open_index
from test_e2e_processes import free_port, funnel_process, wait_until

ADMIN_TOKEN = "admin-token-0"
TOKENS = {"alice-token-1": {"principal": "alice", "groups": ["eng"]},
          "bob-token-2": {"principal": "bob", "groups": ["sales"]}}
ALICE = principal("alice", ["eng"])
BOB = principal("bob", ["sales"])
#: Which ACL groups each caller may read.
READS = {"alice": {"public", "alice", "eng"}, "bob": {"public"}}
MODES = ("bm25", "dense", "hybrid", "sira")
#: Random queries per mode, caller and front end: 12 in CI; the issue's full leak check is
#: ``FUNNEL_LEAK_QUERIES=1000 pytest tests/test_acl.py -k secret`` (the same code, more queries).
QUERIES_PER_MODE = int(os.environ.get("FUNNEL_LEAK_QUERIES", "12"))


@pytest.fixture(scope="module")
def acl_index(tmp_path_factory):
    corpus, root = acl_dense_index(tmp_path_factory)
    rows = [json.loads(line) for line in open(corpus)]
    return rows, root


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    path.write_text(json.dumps({token_digest(t): p for t, p in TOKENS.items()}))
    return str(path)


class Secrets:
    """What a caller must never see: ids, texts and the words only those documents hold."""

    def __init__(self, rows: list[dict], who: str, analyze):
        hidden = [r for r in rows if (r.get("acl") or ["public"])[0] not in READS[who]]
        self.ids = {r["_id"] for r in hidden}
        self.texts = [r["text"][:60] for r in hidden]
        words = set(FINANCE) | (set(TEAM) if who == "bob" else set())
        self.words = {w: {w, *analyze(w)} for w in words}

    def check(self, query: str, body: str) -> None:
        shown_ids = set(re.findall(r"(?:pub|hid)-\d{5}", body))
        assert not shown_ids & self.ids, (query, shown_ids & self.ids)
        for text in self.texts:
            assert text not in body, (query, text)
        asked = set(query.split())
        for word, forms in self.words.items():
            if word in asked:
                continue  # the caller's own word may come back (its query terms)
            for form in forms:
                assert not re.search(rf"\b{re.escape(form)}\b", body), (query, form)


def _queries(seed: int, n: int) -> list[tuple[str, dict | None, dict]]:
    rng = random.Random(seed)
    words = SHARED + PUBLIC + TEAM + FINANCE
    out = []
    for _ in range(n):
        q = " ".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
        flt = random_filter(rng) if rng.random() < 0.6 else None
        opts = {"proposer": rng.choice(["prf", "dense", "union"])} if rng.random() < 0.5 else {}
        out.append((q, flt, opts))
    return out


# -- the Python API ---------------------------------------------------------------------------

def test_principals_see_public_documents_and_their_own_in_every_mode(acl_index):
    rows, root = acl_index
    ix = open_index(root)
    try:
        group = {r["_id"]: (r.get("acl") or ["public"])[0] for r in rows}
        for who, p in (("alice", ALICE), ("bob", BOB)):
            bound = as_principal(ix, p)
            secrets = Secrets(rows, who, ix.index.analyzer.analyze)
            for mode in MODES:
                res = bound.search("river stone harbor ledger", mode=mode, k=50)
                assert res.hits and all(group[h.doc_id] in READS[who] for h in res.hits)
                secrets.check("river stone harbor ledger", json.dumps(res.to_dict()))
            assert bound.get_document(next(iter(secrets.ids))) is None
            some = sorted(secrets.ids)[:3]
            got = bound.get_documents(some + [res.hits[0].doc_id])
            assert got["missing"] == some and [d["doc_id"] for d in got["documents"]] == [res.hits[0].doc_id]
        # bm25: only documents holding the words (the default, hybrid, would add dense neighbours)
        admin = ix.search("vexillar drumlinor", mode="bm25", k=10, principal=ADMIN)
        assert admin.hits and all(h.doc_id.startswith("hid-") for h in admin.hits)  # the data would leak
        assert ix.search("vexillar drumlinor", mode="bm25", k=10, principal=ALICE).hits == ()
        # the same filter narrows further, never widens
        res = ix.search("river", k=100, principal=BOB, filter={"cat": {"exists": True}})
        assert all(group[h.doc_id] == "public" for h in res.hits)
    finally:
        ix.close()


def test_term_stats_count_only_what_the_caller_may_read(acl_index):
    rows, root = acl_index
    ix = open_index(root)
    try:
        [fin] = ix.term_stats(["vexillar"], principal=BOB)
        assert (fin["df"], fin["cf"], fin["idf"]) == (0, 0, None)
        [fin_admin] = ix.term_stats(["vexillar"])
        assert fin_admin["df"] > 0 and fin_admin["idf"] > 0
        [river] = ix.term_stats(["river"], principal=ALICE)
        visible = [r for r in rows if (r.get("acl") or ["public"])[0] in READS["alice"]]
        tokens = [ix.index.analyzer.analyze(f"{r['title']}\n{r['text']}") for r in visible]
        assert river["df"] == sum("river" in t for t in tokens)
        assert river["cf"] == sum(t.count("river") for t in tokens)
        assert river["n_docs"] == len(visible)
        # an explanation's df is counted the same way
        hit = ix.search("river", k=1, principal=ALICE).hits[0]
        assert hit.explain["terms"]["river"]["df"] == river["df"]
    finally:
        ix.close()


def test_absent_acl_can_mean_private(tmp_path):
    from funnel.jobs.build_index import build
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in [
        {"_id": "open", "text": "river stone"}, {"_id": "mine", "text": "river stone", "acl": ["alice"]}]))
    build(str(corpus), str(tmp_path / "ix"), engine="local", acl_absent="private")
    ix = open_index(str(tmp_path / "ix"))
    try:
        assert [h.doc_id for h in ix.search("river", principal=ALICE).hits] == ["mine"]
        assert ix.search("river", principal=BOB).hits == ()
        assert {h.doc_id for h in ix.search("river").hits} == {"open", "mine"}  # local: everything
    finally:
        ix.close()


def test_tokens_file_is_reloaded_when_it_changes(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({token_digest("a"): {"principal": "alice", "groups": ["eng"]}}))
    tf = TokenFile(str(path), check_s=0)
    assert tf.lookup("a") == ALICE and tf.lookup("b") is None
    path.write_text(json.dumps({token_digest("b"): {"principal": "bob"}, "x": 1}))  # broken: the old one stays
    assert tf.lookup("a") == ALICE and "sha256" in tf.error
    path.write_text(json.dumps({token_digest("b"): {"principal": "bob"}}))
    assert tf.lookup("a") is None and tf.lookup("b") == principal("bob")
    (tmp_path / "bad.json").write_text(json.dumps({token_digest("c"): "carol"}))
    with pytest.raises(ValueError, match="must be an object"):
        TokenFile(str(tmp_path / "bad.json"))  # a bad file at start is an error, not an empty table


# -- the servers ------------------------------------------------------------------------------

def test_no_secret_reaches_a_caller_over_http(acl_index, tokens_file):
    rows, root = acl_index
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ix = open_index(root)
    analyze = ix.index.analyzer.analyze
    ix.close()
    with funnel_process("serve", root, "--port", str(port), "--token", ADMIN_TOKEN, "--tokens", tokens_file) \
            as (proc, output), httpx.Client(timeout=180) as http:
        wait_until(lambda: http.get(f"{base}/health").status_code == 200, proc, output, "funnel serve")
        assert http.post(f"{base}/search", json={"query": "river"}).status_code == 401
        missing = http.get(f"{base}/documents/no-such-id", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert missing.status_code == 404
        for n, (token, spec) in enumerate(TOKENS.items()):
            who = spec["principal"]
            auth = {"Authorization": f"Bearer {token}"}
            secrets = Secrets(rows, who, analyze)
            for mode in MODES:
                for q, flt, opts in _queries(100 * n + MODES.index(mode), QUERIES_PER_MODE):
                    body = {"query": q, "mode": mode, "k": 20, "filter": flt,
                            "options": opts if mode == "sira" else {}}
                    r = http.post(f"{base}/search", json=body, headers=auth)
                    assert r.status_code == 200, r.text
                    secrets.check(q, r.text)
            stats = http.post(f"{base}/term_stats", json={"terms": list(FINANCE)}, headers=auth).json()
            assert all(f["df"] == 0 for s in stats["stats"] for f in s["forms"])
            secrets.check(" ".join(FINANCE), json.dumps(stats))  # the words asked for, nothing more
            hidden = sorted(secrets.ids)[0]
            r = http.get(f"{base}/documents/{hidden}", headers=auth)
            assert r.status_code == 404
            assert r.json()["error"] == missing.json()["error"].replace("no-such-id", hidden)
        admin = http.post(f"{base}/search", json={"query": "vexillar", "k": 5},
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        assert admin["hits"] and all(h["doc_id"].startswith("hid-") for h in admin["hits"])


def test_no_secret_reaches_a_caller_over_mcp(acl_index, tokens_file):
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    rows, root = acl_index
    port = free_port()
    ix = open_index(root)
    analyze = ix.index.analyzer.analyze
    ix.close()

    async def calls(token: str, seed: int):
        out = []
        with anyio.fail_after(900):
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=180) as client, \
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=180) as s:
                await s.initialize()
                for mode in MODES:
                    for q, flt, opts in _queries(seed + MODES.index(mode), QUERIES_PER_MODE):
                        args = {"query": q, "mode": mode, "k": 20, "filter": flt}
                        if mode == "sira" and opts:
                            args["options"] = opts
                        res = await s.call_tool("search", args)
                        assert not res.is_error, res.content[0].text
                        out.append((q, res.content[0].text + json.dumps(res.structured_content)))
                secret = Secrets(rows, TOKENS[token]["principal"], analyze)
                hidden = await s.call_tool("get_document", {"doc_id": sorted(secret.ids)[0]})
                missing = await s.call_tool("get_document", {"doc_id": "no-such-id"})
                stats = await s.call_tool("term_stats", {"terms": ["vexillar"]})
        return out, hidden, missing, stats

    def listening() -> bool:
        import socket
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    with funnel_process("mcp", root, "--transport", "streamable-http", "--port", str(port), "--token", ADMIN_TOKEN,
                        "--tokens", tokens_file) as (proc, output):
        wait_until(listening, proc, output, "funnel mcp")
        for n, (token, spec) in enumerate(TOKENS.items()):
            secrets = Secrets(rows, spec["principal"], analyze)
            out, hidden, missing, stats = anyio.run(calls, token, 500 + 100 * n)
            for q, body in out:
                secrets.check(q, body)
            assert hidden.is_error and missing.is_error
            hid = sorted(secrets.ids)[0]
            assert hidden.content[0].text == missing.content[0].text.replace("no-such-id", hid)
            assert stats.structured_content["stats"][0]["forms"][0]["df"] == 0
