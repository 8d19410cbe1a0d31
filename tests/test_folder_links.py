"""A folder corpus does not leave its folder (issue 46, item 1): symbolic links that lead out
of it are skipped, counted and listed in rejects.jsonl; links inside it are read once (a
link to ``.`` or ``..`` indexes nothing twice and ends); broken links and file names that
are not UTF-8 are rejects naming the file, and the rest of the build goes on.

Every folder, file and link is made in the test on the local disk (the real walk, the real
readers, the local engine; one Ray build checks that workers list the folder as the driver
planned it).
"""

from __future__ import annotations

import json
import os

import pytest

from funnel.jobs.build_index import build
from funnel.pipelines.sources import folder as folder_mod
from funnel.pipelines.store.artifacts import load_manifest, read_current
from funnel.serving.search import open_index


def _outside(tmp_path):
    out = tmp_path / "outside"
    (out / "private").mkdir(parents=True)
    (out / "secret.txt").write_text("The zanzibarite passphrase is written here.\n")
    (out / "private" / "key.md").write_text("# Key\n\nThe quetzalcoatlus key material.\n")
    (out / ".ssh").mkdir()
    (out / ".ssh" / "id.md").write_text("# Hidden\n\nThe ocelot private key.\n")
    return out


def _corpus(tmp_path):
    """kb/ with two real files and three links out of it: a file, a folder under an ordinary
    name, and a hidden folder (``.ssh``) under an ordinary name."""
    out = _outside(tmp_path)
    root = tmp_path / "kb"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# Alpha\n\nThe aardvark digs at night.\n")
    (root / "sub" / "b.txt").write_text("The bandicoot burrows.\n")
    os.symlink(out / "secret.txt", root / "leak.txt")
    os.symlink(out / "private", root / "notes")
    os.symlink(out / ".ssh", root / "keys")
    return root


def _version(root: str) -> str:
    return os.path.join(root, read_current(root))


def _rejects(root: str) -> dict:
    with open(os.path.join(_version(root), "rejects.jsonl"), encoding="utf-8") as f:
        return {r["doc_id"]: r for r in map(json.loads, f)}


def _ids(root: str) -> set:
    import pyarrow.parquet as pq
    d = os.path.join(_version(root), "docs")
    return {i for n in os.listdir(d) if n.startswith("shard-") and n.endswith(".parquet")
            for i in pq.read_table(os.path.join(d, n)).column("doc_id").to_pylist()}


def test_links_out_of_the_folder_are_skipped_counted_and_rejected(tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    root, ix = _corpus(tmp_path), str(tmp_path / "ix")
    assert main(["build", "--corpus", str(root), "--out", ix, "--engine", "local"]) == 0
    out = capsys.readouterr().out
    assert "links: 0 followed, 3 leading outside the folder skipped, 0 broken" in out
    index = open_index(ix)
    for word in ("zanzibarite", "quetzalcoatlus", "ocelot"):
        assert index.search(word, k=5).hits == (), word
    assert index.search("aardvark", k=1).hits[0].doc_id == "a.md"
    assert _ids(ix) == {"a.md", "sub/b.txt"}
    files = load_manifest(_version(ix))["corpus"]["files"]
    assert files["links"] == {"followed": 0, "outside": 3, "broken": 0, "repeated": 0} and files["readable"] == 2
    rejects = _rejects(ix)
    assert set(rejects) == {"leak.txt", "notes", "keys"}
    assert rejects["leak.txt"]["reason"].startswith(f"symbolic link to {tmp_path / 'outside' / 'secret.txt'}, "
                                                    "outside the corpus folder: not read (--follow-links")
    assert rejects["notes"]["path"] == str(root / "notes")


def test_follow_links_reads_them_but_not_what_is_hidden(tmp_path):
    root, ix = _corpus(tmp_path), str(tmp_path / "ix")
    rep = build(str(root), ix, engine="local", follow_links=True)
    assert _ids(ix) == {"a.md", "sub/b.txt", "leak.txt", "notes/key.md"}  # keys -> .ssh: hidden
    assert rep.files["links"] == {"followed": 2, "outside": 0, "broken": 0, "repeated": 0} and rep.n_rejects == 0
    assert open_index(ix).search("zanzibarite", k=1).hits[0].doc_id == "leak.txt"
    assert load_manifest(_version(ix))["corpus"]["spec"]["follow_links"] is True


def test_loops_end_and_each_file_is_read_once(tmp_path):
    root = tmp_path / "kb"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# Alpha\n\nThe aardvark.\n")
    (root / "sub" / "b.txt").write_text("The bandicoot.\n")
    os.symlink("..", root / "sub" / "up")    # the folder itself, from below
    os.symlink(".", root / "self")           # the folder itself
    os.symlink("a.md", root / "alias.md")    # a file already read
    os.symlink("..", root / "loop")          # the folder above: outside
    os.symlink("nowhere.md", root / "dangling.md")
    os.symlink("me", root / "me")            # a link to itself
    for follow in (False, True):
        rows, rejects = folder_mod.read_folder(str(root), follow_links=follow)
        ids = [r["doc_id"] for r in rows]
        assert sorted(ids) == ["a.md", "sub/b.txt"], (follow, ids)  # each once, by its real path
        s = folder_mod._LISTINGS[str(root)].summary()
        # Followed, loop (..) is walked, and the folder in it is this one again: repeated.
        assert s["links"] == {"followed": int(follow), "outside": 0 if follow else 1, "broken": 2,
                              "repeated": 4 if follow else 3}, (follow, s["links"])
        reasons = {r["doc_id"]: r["reason"] for r in rejects}
        assert reasons["dangling.md"] == "broken symbolic link (its target nowhere.md does not exist): skipped"
        assert reasons["me"] == "broken symbolic link (a loop of symbolic links): skipped"
        assert ("loop" in reasons) is not follow
    ix = str(tmp_path / "ix")
    rep = build(str(root), ix, engine="local")
    assert (rep.n_docs, rep.n_rejects) == (2, 3) and rep.files["links"]["broken"] == 2
    assert set(_rejects(ix)) == {"dangling.md", "me", "loop"}


def test_a_file_name_that_is_not_utf8_is_one_reject_naming_it(tmp_path):
    root = tmp_path / "kb"
    (root / "docs").mkdir(parents=True)
    (root / "a.md").write_text("# Alpha\n\nThe aardvark.\n")
    bad = os.path.join(os.fsencode(root), b"caf\xe9.md")
    with open(bad, "wb") as f:
        f.write(b"# Cafe\n\nThe capybara.\n")
    os.mkdir(os.path.join(os.fsencode(root), b"d\xff"))
    with open(os.path.join(os.fsencode(root), b"d\xff", b"inner.md"), "wb") as f:
        f.write(b"# Inner\n")
    ix = str(tmp_path / "ix")
    rep = build(str(root), ix, engine="local")
    assert (rep.n_docs, rep.n_rejects, rep.files["bad_names"]) == (1, 2, 2)
    rejects = _rejects(ix)
    assert set(rejects) == {"caf\\xe9.md", "d\\xff"}
    assert rejects["caf\\xe9.md"]["reason"].startswith("the file name is not valid UTF-8 (shown here with its bytes "
                                                       "escaped)")
    assert rejects["caf\\xe9.md"]["path"] == f"{root}/caf\\xe9.md"
    assert "folder name" in rejects["d\\xff"]["reason"] and "nothing in it was read" in rejects["d\\xff"]["reason"]
    assert open_index(ix).search("capybara", k=1).hits == ()


def test_ray_workers_list_the_folder_with_the_same_options(ray_session, tmp_path):
    """The Ray engine's tasks list the folder again (as on another node): with links followed
    and patterns given, they must find the files the driver planned, or fail."""
    from test_build_engines import assert_same_index
    root = _corpus(tmp_path)
    (root / "drafts").mkdir()
    (root / "drafts" / "d.md").write_text("# Draft\n\nThe dingo draft.\n")
    for i in range(6):
        (root / f"n{i}.md").write_text(f"# Note {i}\n\n" + "The numbat note. " * 40)
    opts = {"follow_links": True, "exclude": ("drafts/",), "include": ("*.md", "*.txt")}
    local, ray_ = str(tmp_path / "local"), str(tmp_path / "ray")
    a = build(str(root), local, engine="local", chunk_bytes=600, **opts)
    folder_mod._LISTINGS.clear()
    b = build(str(root), ray_, engine="ray", chunk_bytes=600, **opts)
    assert a.files == b.files and a.files["excluded"] == 1 and a.n_docs == 10
    assert_same_index(local, ray_)


@pytest.mark.parametrize("target", ["file", "folder"])
def test_a_link_inside_the_folder_to_a_hidden_or_excluded_path_is_not_read(tmp_path, target):
    root = tmp_path / "kb"
    (root / ".private").mkdir(parents=True)
    (root / "a.md").write_text("# Alpha\n\nThe aardvark.\n")
    (root / ".private" / "p.md").write_text("# Private\n\nThe pangolin secret.\n")
    os.symlink(".private/p.md" if target == "file" else ".private", root / "public")
    rows, rejects = folder_mod.read_folder(str(root))
    assert [r["doc_id"] for r in rows] == ["a.md"] and rejects == []
    assert folder_mod._LISTINGS[str(root)].summary()["hidden"] == 2  # .private, and the link to it


def test_a_folder_of_data_files_does_not_follow_links_out_either(tmp_path, caplog):
    """The search for JSONL and Parquet files walks the folder the same way: a link out of it
    is not read, and a warning names it (rows have no place for such a reject)."""
    from funnel.pipelines.sources.corpus import CorpusSpec, resolve_files
    out = _outside(tmp_path)
    (out / "rows.jsonl").write_text(json.dumps({"_id": "x", "text": "outside row"}) + "\n")
    root = tmp_path / "data"
    root.mkdir()
    (root / "a.jsonl").write_text(json.dumps({"_id": "1", "text": "inside row"}) + "\n")
    os.symlink(out / "rows.jsonl", root / "b.jsonl")
    assert resolve_files(CorpusSpec(str(root)))[1:] == ([str(root / "a.jsonl")], "jsonl")
    assert "b.jsonl not read: symbolic link to" in caplog.text
    assert resolve_files(CorpusSpec(str(root), follow_links=True))[1] == [str(root / "a.jsonl"),
                                                                          str(out / "rows.jsonl")]
