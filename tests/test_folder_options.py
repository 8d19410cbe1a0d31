"""Folder corpora, the options around them (issue 48): a single document file as the corpus
(items 2), ``--include`` / ``--exclude`` and ``.funnelignore`` (item 6, recorded in the
manifest and reused by a reindex), and a touched file that is no change to reindex (item 7).

Real folders on the local disk, the local engine, real reindexes.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from funnel.jobs.build_index import build
from funnel.jobs.reindex import describe_report, reindex
from funnel.pipelines.sources import folder as folder_mod
from funnel.pipelines.store.artifacts import list_versions, load_manifest, read_current
from funnel.pipelines.sources.corpus import CorpusError, CorpusSpec, plan_chunks, resolve_files
from funnel.pipelines.sources.selection import Rules
from funnel.serving.search import open_index

from test_folder_corpus import make_pdf


def _version(root: str) -> str:
    return os.path.join(root, read_current(root))


def _ids(root: str) -> list:
    import pyarrow.parquet as pq
    d = os.path.join(_version(root), "docs")
    return sorted(i for n in os.listdir(d) if n.startswith("shard-") and n.endswith(".parquet")
                  for i in pq.read_table(os.path.join(d, n)).column("doc_id").to_pylist())


# -- a single file as the corpus ----------------------------------------------------------


@pytest.mark.parametrize("name", ["notes.md", "manual.pdf", "page.html"])
def test_a_single_document_file_is_a_corpus_of_one(tmp_path, capsys, name):
    from funnel.serving.frontends.cli import main
    body = {"notes.md": b"# Notes\n\nThe wombat sleeps by day.\n" + b"More lines.\n" * 50,
            "manual.pdf": make_pdf([["The wombat manual"], ["Page two."]]),
            "page.html": b"<html><head><title>Wombats</title></head><body><p>The wombat sleeps.</p></body></html>"}[name]
    (tmp_path / name).write_bytes(body)
    ix = str(tmp_path / "ix")
    assert main(["build", "--corpus", str(tmp_path / name), "--out", ix, "--engine", "local"]) == 0
    out = capsys.readouterr().out
    assert "1 documents" in out and "0 rejected" in out and "files: 1 read" in out
    assert _ids(ix) == [name]
    assert open_index(ix).search("wombat", k=1).hits[0].doc_id == name
    m = load_manifest(_version(ix))
    assert m["corpus"]["files"]["readable"] == 1 and m["corpus"]["n_docs"] == 1
    # A reindex of the same file changes nothing.
    assert reindex(ix, str(tmp_path / name), executor="local").published is False


def test_what_a_single_file_is_read_as(tmp_path):
    def fmt(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return resolve_files(CorpusSpec(str(tmp_path / name)))[2]

    row = json.dumps({"_id": "1", "text": "x"}).encode() + b"\n"
    assert fmt("rows.jsonl", row) == "jsonl" and fmt("rows.json", row) == "jsonl"
    assert fmt("rows.txt", row) == "jsonl"            # a .txt of JSON objects is JSONL
    assert fmt("export", row) == "jsonl"              # no extension: by content
    assert fmt("note.txt", b"Plain words.\n") == "files"
    assert fmt("rows.gz", b"\x1f\x8b\x08\x00") == "jsonl"
    with pytest.raises(CorpusError, match=r"cannot tell what .*report\.docx holds: .*--format jsonl"):
        fmt("report.docx", b"PK\x03\x04 a word document")
    # --format files on a single document: a corpus of one
    (tmp_path / "one.md").write_text("# One\n")
    assert resolve_files(CorpusSpec(str(tmp_path / "one.md"), format="files"))[2] == "files"


def test_no_message_points_at_a_rejects_file_that_was_not_published(tmp_path, caplog):
    """Every row rejected: nothing is published, and no line says 'rejects.jsonl in the new
    version'; the error names the file kept, which exists. A build with rejects that does
    publish names its version's rejects.jsonl, which exists."""
    from funnel.jobs.build_index import BuildError
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{also not\n")
    caplog.set_level(logging.INFO, logger="funnel")
    with pytest.raises(BuildError) as e:
        build(str(bad), str(tmp_path / "ix"), engine="local")
    kept = str(e.value).rsplit("The reasons are in ", 1)[1]
    assert os.path.isfile(kept) and "new version" not in caplog.text
    assert not any("rejects.jsonl" in r.getMessage() for r in caplog.records)
    caplog.clear()
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"_id": "1", "text": "a fine row"}) + "\nnot json\n")
    rep = build(str(good), str(tmp_path / "ix2"), engine="local")
    named = [r.getMessage() for r in caplog.records if "rejects.jsonl" in r.getMessage()]
    assert named == [f"1 rows rejected; see {rep.rejects_path}"] and os.path.isfile(rep.rejects_path)


# -- --include, --exclude, .funnelignore ----------------------------------------------------


def test_rules_follow_gitignore_syntax():
    r = Rules(ignore=("# a comment", "build/", "*.tmp.md", "!keep.tmp.md", "/top.md", "docs/**/draft-*"),
              exclude=("secret?.md",), include=("*.md", "notes/**"))
    excluded = {"x.tmp.md", "sub/x.tmp.md", "top.md", "docs/a/b/draft-1.md", "docs/draft-2.md", "secret1.md",
                "a.txt", "sub/a.html"}
    kept = {"keep.tmp.md", "sub/top.md", "docs/a/final.md", "secret10.md", "notes/a.txt", "notes/x/y.html",
            "a.md"}
    assert {p for p in excluded | kept if r.excludes_file(p)} == excluded
    assert r.excludes_dir("build") and r.excludes_dir("sub/build") and not r.excludes_dir("docs")
    with pytest.raises(ValueError, match=r"--exclude or \.funnelignore: not a valid \.gitignore pattern"):
        CorpusSpec("x", exclude=("!",))
    with pytest.raises(ValueError, match="--include takes a non-empty pattern"):
        CorpusSpec("x", include=("  ",))


def _kb(root):
    for rel, text in {"guide.md": "# Guide\n\nThe gecko guide.\n",
                      "drafts/d.md": "# Draft\n\nThe dingo draft.\n",
                      "docs/a.md": "# A\n\nThe anteater page.\n",
                      "docs/old/o.md": "# Old\n\nThe okapi page.\n",
                      "docs/x.tmp.md": "# Tmp\n\nThe tapir scratch.\n",
                      "notes/n.txt": "The narwhal note.\n",
                      "site/index.html": "<p>The heron page.</p>",
                      "build/out.md": "# Built\n\nThe bison output.\n"}.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)) or root, exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    with open(os.path.join(root, ".funnelignore"), "w") as f:
        f.write("# generated output\nbuild/\n*.tmp.md\n")
    return str(root)


def test_include_exclude_and_funnelignore_choose_the_files(tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    kb, ix = _kb(tmp_path / "kb"), str(tmp_path / "ix")
    assert main(["build", "--corpus", kb, "--out", ix, "--engine", "local", "--exclude", "drafts/",
                 "--exclude", "docs/old/", "--include", "**/*.md", "--include", "notes/"]) == 0
    out = capsys.readouterr().out
    assert _ids(ix) == ["docs/a.md", "guide.md", "notes/n.txt"]
    # build/, docs/x.tmp.md (.funnelignore), drafts/, docs/old/ (--exclude), site/index.html (not included)
    assert ", 5 excluded (.funnelignore)" in out
    m = load_manifest(_version(ix))
    assert m["corpus"]["files"]["excluded"] == 5 and m["corpus"]["files"]["funnelignore"] is True
    assert m["corpus"]["spec"]["exclude"] == ["drafts/", "docs/old/"]
    assert m["corpus"]["spec"]["include"] == ["**/*.md", "notes/"]
    with open(os.path.join(_version(ix), "rejects.jsonl")) as f:
        assert f.read() == ""  # excluded files are counted, not rejected
    assert open_index(ix).search("dingo", k=1).hits == ()

    # The reindex lists the folder by the recorded patterns: a new draft stays out, a new note is in.
    with open(os.path.join(kb, "drafts", "e.md"), "w") as f:
        f.write("# Draft 2\n\nThe echidna draft.\n")
    with open(os.path.join(kb, "notes", "m.txt"), "w") as f:
        f.write("The marmot note.\n")
    rep = reindex(ix, kb, executor="local")
    assert (rep.added, rep.deleted, rep.changed) == (1, 0, 0)
    assert _ids(ix) == ["docs/a.md", "guide.md", "notes/m.txt", "notes/n.txt"]
    # Flags given to the reindex replace the recorded ones (and are recorded in turn).
    rep = reindex(ix, kb, executor="local", exclude=["docs/old/"])
    assert rep.added == 2 and "drafts/d.md" in _ids(ix) and "drafts/e.md" in _ids(ix)
    assert load_manifest(_version(ix))["corpus"]["spec"]["exclude"] == ["docs/old/"]


def test_patterns_are_for_folders_of_documents(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"_id": "1", "text": "x"}) + "\n")
    with pytest.raises(CorpusError, match=r"--include and --exclude choose the files of a folder of documents"):
        plan_chunks(CorpusSpec(str(rows), exclude=("*.md",)))


def test_everything_excluded_says_so(tmp_path):
    kb = _kb(tmp_path / "kb")
    with pytest.raises(ValueError, match=r"no corpus files in folder .* excluded by --include, --exclude or "
                                         r"\.funnelignore"):
        folder_mod.read_folder(kb, include=("*.rst",))


# -- a touched file is no change ------------------------------------------------------------


def test_a_touched_file_publishes_nothing(tmp_path):
    kb, ix = _kb(tmp_path / "kb"), str(tmp_path / "ix")
    build(kb, ix, engine="local")
    before = read_current(ix)
    for rel in ("guide.md", "docs/a.md"):
        os.utime(os.path.join(kb, rel), (2_000_000_000, 2_000_000_000))
    rep = reindex(ix, kb, executor="local")
    assert not rep.published and read_current(ix) == before and list_versions(ix) == [before]
    assert (rep.touched, rep.fields_changed, rep.changed) == (2, 0, 0)
    assert "2 files with only a new modification time" in describe_report(rep)
    assert describe_report(rep).startswith("no changes:")
    # With a real change beside them, the touched files keep the mtime they were indexed with.
    with open(os.path.join(kb, "notes", "n.txt"), "a") as f:
        f.write("The nilgai too.\n")
    rep = reindex(ix, kb, executor="local")
    assert rep.published and (rep.changed, rep.touched, rep.fields_changed) == (1, 2, 0)
    assert open_index(ix).search("gecko", k=1, filter={"mtime": {"gte": "2033-01-01"}}).hits == ()
    assert open_index(ix).search("nilgai", k=1).hits[0].doc_id == "notes/n.txt"
