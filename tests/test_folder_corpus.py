"""A folder of files as a corpus (issue 39): one document per Markdown, text, HTML or PDF
file, its path in the folder its id; bad files are rejects with reasons, other types are
skipped and counted; both engines publish the same index; a reindex finds added, changed
and removed files by content hash.

The folder is made in the test: real files for the real readers (markdown-it-py, selectolax,
pypdf), the PDFs written byte by byte (`make_pdf`) and encrypted with pypdf.
"""

from __future__ import annotations

import io
import json
import os

import pyarrow.parquet as pq
import pytest

from funnel.jobs.build_index import build
from funnel.jobs.reindex import reindex
from funnel.pipelines.sources import folder as folder_mod
from funnel.pipelines import formats
from funnel.pipelines.store.artifacts import load_manifest, read_current
from funnel.pipelines.sources.corpus import CorpusSpec, plan_chunks, read_chunk
from funnel.pipelines.formats.pdf import page_of
from funnel.serving.search import open_index

from test_build_engines import assert_same_index


def make_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A PDF with a text layer: one page per list of lines (Helvetica), a valid xref table."""
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    n = len(pages)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            ("<< /Type /Pages /Kids [" + " ".join(f"{4 + 2 * i} 0 R" for i in range(n)) + f"] /Count {n} >>").encode(),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, lines in enumerate(pages):
        ops = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({esc(t)}) Tj T*" for t in lines) + " ET"
        objs.append((f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                     f"/Contents {5 + 2 * i} 0 R >>").encode())
        objs.append(f"<< /Length {len(ops)} >>\nstream\n{ops}\nendstream".encode())
    if title:
        objs.append(f"<< /Title ({esc(title)}) >>".encode())
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    info = f" /Info {len(objs)} 0 R" if title else ""
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R{info} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def encrypted(pdf: bytes, user_password: str, owner_password: str | None = None) -> bytes:
    from pypdf import PdfReader, PdfWriter
    w = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    w.encrypt(user_password, owner_password=owner_password, algorithm="RC4-128")
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()


GUIDE_MD = """---
title: Field Guide to Reefs
tags: [ocean, fish]
date: 2024-03-05
path: front-matter-path
---

# Reef basics

The zebrafish lives in fresh water, not on reefs.

```
# not a heading: inside a code block
```

Tides
-----

Spring tides and neap tides.
"""

PAGE_HTML = """<!doctype html><html><head><title>Axolotl care</title></head><body>
<nav><a href="/">Home</a> <a href="/x">menuonlyword</a></nav>
<header>bannerword</header>
<main><h1>Axolotl</h1><p>The axolotl   regrows
its limbs.</p><h2>Water</h2><pre>keep  it   cool</pre><ul><li>one</li><li>two</li></ul></main>
<footer>footerword copyright</footer><script>var scriptword = 1;</script></body></html>
"""

MANUAL_RST = """Pump manual
===========

Prime the pump before use.

Maintenance
-----------

Oil the quokka bearing yearly.
"""

PDF_PAGES = [["Survey of marine mammals", "Introduction and methods"],
             ["Seals and sea lions were counted."],
             ["The narwhal tusk is a tooth.", "Page three ends here."]]


def write_folder(root) -> str:
    os.makedirs(root / "notes", exist_ok=True)
    os.makedirs(root / ".hidden", exist_ok=True)
    (root / "guide.md").write_text(GUIDE_MD)
    (root / "notes" / "plain.txt").write_text("A plain text note about the kakapo parrot.\r\nSecond line.\n")
    (root / "notes" / "manual.rst").write_text(MANUAL_RST)
    (root / "page.html").write_text(PAGE_HTML)
    report = make_pdf(PDF_PAGES, title="Marine Survey")
    (root / "report.pdf").write_bytes(report)
    (root / "owner-locked.pdf").write_bytes(encrypted(make_pdf([["The dugong grazes seagrass."]]), "", "owner"))
    (root / "locked.pdf").write_bytes(encrypted(report, "secret"))
    (root / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R")
    (root / "scan.pdf").write_bytes(make_pdf([[]]))  # a page without a text layer
    (root / "blob.txt").write_bytes(b"PK\x03\x04\x00\x00binary\xff\xfe")
    (root / "empty.md").write_text("  \n\n")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (root / "tool.py").write_text("print('not a document')\n")
    (root / ".hidden" / "secret.md").write_text("# hidden\n")
    return str(root)


READ = {"guide.md", "notes/plain.txt", "notes/manual.rst", "page.html", "report.pdf", "owner-locked.pdf"}
REJECTED = {"locked.pdf": "encrypted PDF: it needs a password", "broken.pdf": "damaged PDF",
            "scan.pdf": "PDF has no text layer", "blob.txt": "binary data, not text: control byte 0x03",
            "empty.md": "empty file"}


@pytest.fixture
def docs_folder(tmp_path) -> str:
    return write_folder(tmp_path / "docs")


def _rows(path: str) -> tuple[dict, dict]:
    rows, rejects = folder_mod.read_folder(path)
    return {r["doc_id"]: r for r in rows}, {r["doc_id"]: r["reason"] for r in rejects}


def test_each_type_is_read_into_id_title_text_and_fields(docs_folder):
    rows, rejects = _rows(docs_folder)
    assert set(rows) == READ
    assert set(rejects) == set(REJECTED)
    for doc_id, reason in REJECTED.items():
        assert reason in rejects[doc_id], (doc_id, rejects[doc_id])

    md = rows["guide.md"]
    f = json.loads(md["fields"])
    assert md["title"] == "Field Guide to Reefs"  # front matter title wins over the first heading
    assert md["text"].startswith("\n# Reef basics") and "title:" not in md["text"]
    assert f["tags"] == ["ocean", "fish"] and f["date"] == "2024-03-05"
    assert f["path"] == "guide.md" and f["front_matter_path"] == "front-matter-path"
    assert f["format"] == "markdown" and f["size"] == len(GUIDE_MD.encode()) and f["line_offset"] == 6
    assert f["mtime"].endswith("Z") and f["mtime"][:4].isdigit()
    # Headings: ATX and setext, not the '#' line in the code block; offsets point at them.
    assert [(lv, t) for _, lv, t in f["headings"]] == [(1, "Reef basics"), (2, "Tides")]
    for off, _, t in f["headings"]:
        assert md["text"][off:].lstrip("# ").startswith(t)
    # Line n of the text is line n + line_offset of the file.
    line = md["text"].split("\n").index("Spring tides and neap tides.")
    assert GUIDE_MD.split("\n")[line + f["line_offset"]] == "Spring tides and neap tides."

    txt = rows["notes/plain.txt"]
    assert txt["title"] == "plain"  # no title in plain text: the file name
    assert txt["text"] == "A plain text note about the kakapo parrot.\nSecond line.\n"
    rst = rows["notes/manual.rst"]
    rf = json.loads(rst["fields"])
    assert rst["title"] == "Pump manual" and [h[2] for h in rf["headings"]] == ["Pump manual", "Maintenance"]
    assert rst["text"][rf["headings"][1][0]:].startswith("Maintenance")

    html = rows["page.html"]
    assert html["title"] == "Axolotl care"
    assert "The axolotl regrows its limbs." in html["text"] and "keep  it   cool" in html["text"]
    for chrome in ("menuonlyword", "bannerword", "footerword", "scriptword", "Home"):
        assert chrome not in html["text"]
    hf = json.loads(html["fields"])
    assert [(lv, t) for _, lv, t in hf["headings"]] == [(1, "Axolotl"), (2, "Water")]
    assert all(html["text"][o:].startswith(t) for o, _, t in hf["headings"])

    pdf = rows["report.pdf"]
    pf = json.loads(pdf["fields"])
    assert pdf["title"] == "Marine Survey" and pf["pages"] == 3 and pf["format"] == "pdf"
    at = pdf["text"].index("narwhal")
    assert page_of(pf["page_starts"], at) == 3 == pdf["text"].count("\f", 0, at) + 1
    assert page_of(pf["page_starts"], pdf["text"].index("Seals")) == 2
    assert page_of(pf["page_starts"], 0) == 1
    assert [pdf["text"][s:].split("\n", 1)[0] for s in pf["page_starts"]] == [
        "Survey of marine mammals", "Seals and sea lions were counted.", "The narwhal tusk is a tooth."]
    # An owner password alone (no user password) restricts printing, not reading.
    assert "dugong" in rows["owner-locked.pdf"]["text"]


def test_skipped_and_hidden_files_are_counted(docs_folder):
    chunks = plan_chunks(CorpusSpec(path=docs_folder))  # auto: no JSONL or Parquet here, so files
    assert {c.kind for c in chunks} == {"files"}
    s = folder_mod.listing_summary(chunks)
    assert s == {"readable": len(READ) + len(REJECTED),
                 "by_type": {".html": 1, ".md": 2, ".pdf": 5, ".rst": 1, ".txt": 2},
                 "skipped": 2, "skipped_by_type": {".png": 1, ".py": 1}, "hidden": 1, "excluded": 0,
                 "links": {"followed": 0, "outside": 0, "broken": 0, "repeated": 0}, "bad_names": 0,
                 "funnelignore": False}


def test_over_the_size_bound_is_a_reject(docs_folder, monkeypatch):
    bound = os.path.getsize(os.path.join(docs_folder, "guide.md")) - 1
    monkeypatch.setattr(folder_mod, "MAX_FILE_BYTES", bound)
    rows, rejects = _rows(docs_folder)
    assert rejects["guide.md"] == (f"file of {bound + 1} bytes is over the {bound} bytes bound of one document "
                                   "(funnel.pipelines.sources.folder.MAX_FILE_BYTES); split it")
    assert "notes/plain.txt" in rows  # smaller than the bound


def test_registry_errors_name_the_choices():
    with pytest.raises(ValueError) as e:
        formats.reader_for("slides/deck.PPTX")
    assert str(e.value).endswith("readable types: " + ", ".join(sorted(formats.READERS)))
    assert formats.reader_for("A/B.MD") is formats.MARKDOWN and formats.extension("Makefile") == ""
    missing = formats.Reader("Word", "no_such_reader_module", ("python-docx",))
    with pytest.raises(ImportError, match=r"needs python-docx .*pip install 'funnel\[formats\]'"):
        missing.read(b"", "a.docx")


def test_a_folder_without_documents_is_a_clear_error(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"no corpus files in folder .*1 files of other types \(\.png 1\)"):
        plan_chunks(CorpusSpec(path=str(tmp_path)))
    # One file of another type is not a document either (one document file is a corpus of one:
    # test_folder_links.py).
    with pytest.raises(ValueError, match=r"--format files reads documents \(\.htm, .*and '.*a\.png' is none"):
        plan_chunks(CorpusSpec(path=str(tmp_path / "a.png"), format="files"))


def test_a_folder_changed_under_a_worker_fails_clearly(docs_folder):
    spec = CorpusSpec(path=docs_folder, format="files")
    chunk = plan_chunks(spec)[0]
    folder_mod._LISTINGS.clear()  # as on a Ray worker, which lists the folder itself
    assert len(read_chunk(chunk, spec).rows) == len(READ)
    with open(os.path.join(docs_folder, "aardvark.md"), "w") as f:
        f.write("# new file that sorts first\n")
    folder_mod._LISTINGS.clear()
    with pytest.raises(RuntimeError, match="changed while it was read"):
        read_chunk(chunk, spec)


def test_build_from_the_cli_then_search(docs_folder, tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    root = str(tmp_path / "ix")
    assert main(["build", "--corpus", docs_folder, "--out", root, "--engine", "local"]) == 0
    out = capsys.readouterr().out
    assert f"{len(READ)} documents" in out and f"{len(REJECTED)} rejected" in out
    assert "files: 11 read (.html 1, .md 2, .pdf 5, .rst 1, .txt 2), 2 skipped of other types, 1 hidden skipped" in out
    vdir = os.path.join(root, read_current(root))
    m = load_manifest(vdir)
    assert m["corpus"]["files"]["skipped_by_type"] == {".png": 1, ".py": 1}
    assert m["corpus"]["n_docs"] == len(READ) and m["corpus"]["spec"]["format"] == "auto"
    with open(os.path.join(vdir, "rejects.jsonl")) as f:
        rejects = {r["doc_id"]: r for r in map(json.loads, f)}
    assert set(rejects) == set(REJECTED)
    assert rejects["locked.pdf"]["path"] == os.path.join(docs_folder, "locked.pdf")
    assert all(REJECTED[d] in r["reason"] for d, r in rejects.items())

    ix = open_index(root)
    for query, want in (("narwhal tusk", "report.pdf"), ("axolotl limbs", "page.html"),
                        ("zebrafish", "guide.md"), ("quokka bearing", "notes/manual.rst"),
                        ("kakapo parrot", "notes/plain.txt")):
        hits = ix.search(query, k=3).hits
        assert hits and hits[0].doc_id == want, (query, hits)
    assert ix.search("menuonlyword", k=3).hits == ()  # navigation is not indexed
    # The stored document keeps its fields: the PDF's page of a hit's term.
    docs = pq.read_table(os.path.join(vdir, "docs", "shard-0000.parquet")).to_pylist()
    pdf = next(d for d in docs if d["doc_id"] == "report.pdf")
    assert page_of(json.loads(pdf["fields"])["page_starts"], pdf["text"].index("narwhal")) == 3


def test_both_engines_publish_the_same_index(ray_session, docs_folder, tmp_path):
    # Small chunks: several chunks, so the Ray engine reads the folder in parallel tasks.
    assert len(plan_chunks(CorpusSpec(path=docs_folder), target_bytes=600)) > 3
    local, ray_ = str(tmp_path / "local"), str(tmp_path / "ray")
    a = build(docs_folder, local, engine="local", chunk_bytes=600)
    folder_mod._LISTINGS.clear()
    b = build(docs_folder, ray_, engine="ray", chunk_bytes=600)
    assert (a.engine["name"], b.engine["name"]) == ("local", "ray")
    assert (a.n_docs, a.n_rejects, a.files) == (b.n_docs, b.n_rejects, b.files) == (len(READ), len(REJECTED), a.files)
    assert_same_index(local, ray_)


def test_reindex_finds_added_changed_and_removed_files(docs_folder, tmp_path):
    root = str(tmp_path / "ix")
    build(docs_folder, root, engine="local")  # path, size, mtime, front matter: inferred filterable fields
    os.utime(os.path.join(docs_folder, "page.html"), (1, 1))  # a new mtime alone: no change (issue 48)
    os.remove(os.path.join(docs_folder, "notes", "plain.txt"))
    with open(os.path.join(docs_folder, "guide.md"), "a") as f:
        f.write("\n## Update\n\nThe manatee visits warm springs.\n")
    with open(os.path.join(docs_folder, "notes", "new.md"), "w") as f:
        f.write("# Added\n\nA page about the pangolin.\n")
    rep = reindex(root, docs_folder, executor="local")
    assert (rep.added, rep.changed, rep.deleted, rep.fields_changed, rep.touched) == (1, 1, 1, 0, 1)
    assert rep.unchanged == len(READ) - 2 and rep.n_docs == len(READ) and rep.n_rejects == len(REJECTED)
    ix = open_index(root)
    # The touched file keeps the mtime of the content indexed.
    assert ix.search("axolotl", k=10, filter={"mtime": {"lt": "1971-01-01"}}).hits == ()
    assert [h.doc_id for h in ix.search("axolotl", k=10, filter={"mtime": {"gte": "1971-01-01"}}).hits] == ["page.html"]
    assert ix.search("pangolin", k=1).hits[0].doc_id == "notes/new.md"
    assert ix.search("manatee", k=1).hits[0].doc_id == "guide.md"
    assert ix.search("kakapo", k=3).hits == ()
    assert reindex(root, docs_folder, executor="local").published is False  # nothing changed since



@pytest.fixture
def s3_bucket(monkeypatch):
    """A bucket on moto's S3 server on 127.0.0.1 (real HTTP), reached as S3 is: pyarrow's S3
    filesystem through ``AWS_ENDPOINT_URL`` (as in test_s3.py)."""
    from moto.server import ThreadedMotoServer
    import boto3
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", f"http://{host}:{port}"),
                 ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(k, v)
    client = boto3.client("s3")
    client.create_bucket(Bucket="docs")
    yield client
    server.stop()


def test_a_folder_on_s3(docs_folder, s3_bucket, tmp_path):
    for d, _, files in os.walk(docs_folder):
        for name in files:
            rel = os.path.relpath(os.path.join(d, name), docs_folder).replace(os.sep, "/")
            with open(os.path.join(d, name), "rb") as f:
                s3_bucket.put_object(Bucket="docs", Key=f"kb/{rel}", Body=f.read())
    local_rows, local_rejects = _rows(docs_folder)
    rows, rejects = _rows("s3://docs/kb")
    assert set(rows) == READ and rejects == local_rejects
    for doc_id, row in rows.items():
        fields, local = json.loads(row["fields"]), json.loads(local_rows[doc_id]["fields"])
        assert (row["title"], row["text"]) == (local_rows[doc_id]["title"], local_rows[doc_id]["text"])
        assert {k: v for k, v in fields.items() if k != "mtime"} == {k: v for k, v in local.items() if k != "mtime"}
    root = str(tmp_path / "ix")
    rep = build("s3://docs/kb", root, engine="local")
    assert (rep.n_docs, rep.n_rejects, rep.files["skipped"], rep.files["hidden"]) == (len(READ), len(REJECTED), 2, 1)
    assert open_index(root).search("narwhal", k=1).hits[0].doc_id == "report.pdf"


def test_auto_format_ignores_stray_json_and_refuses_a_mixed_folder(tmp_path):
    """A docs folder with a package.json is a folder of files; data files beside documents
    is ambiguous and the error names --format."""
    from funnel.pipelines.sources.corpus import resolve_files
    (tmp_path / "guide.md").write_text("# Guide\n\nInstall it.\n")
    (tmp_path / "package.json").write_text("{}")
    assert resolve_files(CorpusSpec(str(tmp_path)))[2] == "files"
    (tmp_path / "data.jsonl").write_text(json.dumps({"_id": "1", "text": "x"}) + "\n")
    with pytest.raises(ValueError, match="--format files"):
        resolve_files(CorpusSpec(str(tmp_path)))
    assert resolve_files(CorpusSpec(str(tmp_path), format="jsonl"))[2] == "jsonl"
    assert resolve_files(CorpusSpec(str(tmp_path), format="files"))[2] == "files"


TEXINFO_HTML = """<!DOCTYPE html><html><head><title>Invoking (GNU Grep 3.11)</title></head><body lang="en">
<div class="chapter-level-extent" id="Invoking">
<div class="nav-panel">
<p>Next: <a href="Regular-Expressions.html" accesskey="n" rel="next">Regular Expressions</a>, Previous:
<a href="Introduction.html" accesskey="p" rel="prev">Introduction</a>, Up: <a href="index.html" accesskey="u"
rel="up">grep</a> &nbsp; [<a href="index.html#SEC_Contents" title="Table of contents" rel="contents">Contents</a>][<a
href="Index.html" title="Index" rel="index">Index</a>]</p>
</div>
<hr>
<h2 class="chapter" id="Invoking-grep"><span>2 Invoking grep<a class="copiable-link" href="#Invoking-grep"> &para;</a></span></h2>
<p>The general synopsis of the grep command line is the wildebeest form.</p>
<hr>
<div class="nav-panel">
<p>Next: <a href="Regular-Expressions.html" rel="next">Regular Expressions</a>, Previous: <a href="Introduction.html"
rel="prev">Introduction</a>, Up: <a href="index.html" rel="up">grep</a></p>
</div>
</div></body></html>
"""

OLD_TEXINFO_HTML = """<html><head><title>Old manual</title></head><body>
<div class="header"><p>Next: <a href="B.html" rel="next">B</a>, Up: <a href="index.html" rel="up">Top</a></p></div>
<div class="node"><a name="A"></a><p>Previous:&nbsp;<a rel="previous" href="Z.html">Z</a></p></div>
<h2 class="chapter">1 Alpha</h2><p>The okapi section.</p>
<div class="node node-article"><p>A Drupal article body about the jerboa.</p></div>
</body></html>
"""

SPHINX_HTML = """<html><head><title>Install &#8212; Docs</title></head><body>
<div role="main"><section id="install"><h1>Install<a class="headerlink" href="#install" title="Link to this
heading">¶</a></h1><p>Run the quokka installer.</p><section id="options"><h2>Options<a class="headerlink"
href="#options" title="Permalink to this headline">¶</a></h2><p>There are none.</p></section></section></div>
</body></html>
"""


def test_html_drops_texinfo_navigation_and_permalink_marks():
    doc = formats.read_document(TEXINFO_HTML.encode(), "grep/Invoking.html")
    assert doc.text.startswith("2 Invoking grep\n\nThe general synopsis") and "wildebeest form." in doc.text
    for chrome in ("Next:", "Previous:", "Up:", "[Contents]", "Index", "¶"):
        assert chrome not in doc.text, chrome
    assert doc.metadata["headings"] == [[0, 2, "2 Invoking grep"]]

    old = formats.read_document(OLD_TEXINFO_HTML.encode(), "old/A.html")
    assert "Next:" not in old.text and "Previous:" not in old.text and "The okapi section." in old.text
    assert "jerboa" in old.text  # a div.node without navigation links is content

    sphinx = formats.read_document(SPHINX_HTML.encode(), "install.html")
    assert "¶" not in sphinx.text and sphinx.text.startswith("Install\n\nRun the quokka installer.")
    assert [h[2] for h in sphinx.metadata["headings"]] == ["Install", "Options"]


@pytest.mark.parametrize("source, title", [
    ("---\ntitle: From Front Matter\n---\n## Section\n\n# Top\n", "From Front Matter"),
    ("## A section first\n\nText.\n\n# The Real Title\n\nMore.\n", "The Real Title"),
    ("Setext Title\n============\n\n## Sub\n", "Setext Title"),
    ("## Only sections\n\nText.\n\n### Deeper\n", ""),
])
def test_markdown_title_is_front_matter_then_h1_then_the_file_name(tmp_path, source, title):
    assert formats.read_document(source.encode(), "x.md").title == title
    (tmp_path / "release-notes.md").write_text(source)
    rows, _ = folder_mod.read_folder(str(tmp_path))
    assert rows[0]["title"] == (title or "release-notes")
