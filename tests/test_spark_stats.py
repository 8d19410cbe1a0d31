"""jobs/spark_stats.py writes the same stats.duckdb as a funnel build: every term's df and cf,
the collection row and the per-shard rows, with the same rows rejected.

Each case builds an index with ``build(..., engine="local")`` (the same pure stages as the
Ray engine; ``tests/test_build_engines.py`` proves those two publish the same files) and
runs the Spark job on the same corpus, on one local[2] Spark session for the module.
"""

from __future__ import annotations

import json
import os
import shutil

import duckdb
import pytest

pytest.importorskip("pyspark")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("pyspark needs a Java runtime (java on PATH or JAVA_HOME)", allow_module_level=True)

from funnel.jobs.build_index import build  # noqa: E402
from funnel.jobs.spark_stats import SparkStatsError, _session, compute_stats, main  # noqa: E402

TINY = os.path.join(os.path.dirname(__file__), "data", "tiny-beir")


@pytest.fixture(scope="module")
def spark():
    s, created = _session("local[2]", app_name="funnel-test-spark-stats")
    yield s
    if created:
        s.stop()


def _tables(db: str) -> dict:
    con = duckdb.connect(db, read_only=True)
    try:
        return {
            "terms": con.execute("SELECT term, df, cf FROM terms ORDER BY term").fetchall(),
            "collection": con.execute("SELECT * FROM collection").fetchall(),
            "shards": con.execute("SELECT * FROM shards ORDER BY shard").fetchall(),
            "schema": con.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                                  "ORDER BY table_name, ordinal_position").fetchall(),
        }
    finally:
        con.close()


def _assert_same(build_db: str, spark_db: str) -> dict:
    a, b = _tables(build_db), _tables(spark_db)
    assert b["schema"] == a["schema"]
    assert len(b["terms"]) == len(a["terms"]) > 0
    diff = [(x, y) for x, y in zip(a["terms"], b["terms"]) if x != y]
    assert not diff, f"{len(diff)} terms differ, first: {diff[:5]}"
    assert b["collection"] == a["collection"]
    assert b["shards"] == a["shards"]
    return a


def _build_db(corpus: str, root, **kw) -> tuple[str, object]:
    rep = build(corpus, str(root), engine="local", progress_seconds=0, **kw)
    return os.path.join(str(root), rep.version, "stats.duckdb"), rep


def test_tiny_beir_equals_the_build(spark, tmp_path):
    build_db, rep = _build_db(TINY, tmp_path / "index")
    out = str(tmp_path / "spark.duckdb")
    srep = compute_stats(TINY, out, spark=spark)
    t = _assert_same(build_db, out)
    assert srep.n_docs == rep.n_docs == 40 and srep.n_rejects == rep.n_rejects == 0
    assert srep.n_terms == len(t["terms"])


def _messy_rows() -> list[str]:
    """Bad rows of every kind the build rejects, duplicate ids, stopword-only and title-only docs."""
    good = [json.dumps({"_id": f"g{i:03d}", "title": f"Study {i} of protein kinase",
                        "text": f"Cells expressing gene{i % 7} showed {'increased' if i % 2 else 'reduced'} "
                                f"apoptosis; the mice's tumours (n={i}) were measured. Naïve café ß-catenin."})
            for i in range(60)]
    rows = good[:20] + [
        "{not json",
        json.dumps({"title": "no id", "text": "missing identifier"}),
        json.dumps({"_id": 7, "text": "numeric id"}),
        json.dumps({"_id": "bad-text", "text": ["a", "list"]}),
        '{"_id": "surrogate", "text": "lone \\ud800 surrogate"}',
        json.dumps({"_id": "empty", "title": " ", "text": "  "}),
        json.dumps({"_id": "stop-only", "title": "", "text": "the a an and of"}),
        json.dumps({"_id": "title-only", "title": "Hippocampal neurogenesis", "text": ""}),
        json.dumps({"_id": "dup", "title": "First copy", "text": "zebrafish regeneration of fins"}),
        "",
        json.dumps([1, 2, 3]),
    ] + good[20:40] + [
        json.dumps({"_id": "dup", "title": "Second copy", "text": "axolotl limb regrowth"}),
        json.dumps({"_id": "g005", "title": "Late duplicate", "text": "must not count"}),
    ] + good[40:]
    return rows


def test_rejects_duplicates_and_shards_equal_the_build(spark, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(_messy_rows()) + "\n")
    build_db, rep = _build_db(str(corpus), tmp_path / "index", shards=3, chunk_bytes=2000)
    out = str(tmp_path / "spark.duckdb")
    # Different chunking and partitioning from the build's: the result must not depend on it.
    srep = compute_stats(str(corpus), out, shards=3, chunk_bytes=700, partitions=5, spark=spark)
    t = _assert_same(build_db, out)
    assert srep.n_docs == rep.n_docs == 60 + 3  # the good rows, stop-only, title-only, the first "dup"
    assert srep.n_rejects == rep.n_rejects and srep.n_duplicates == 2
    terms = dict((term, (df, cf)) for term, df, cf in t["terms"])
    assert "zebrafish" in terms and "axolotl" not in terms and "late" not in terms  # first copy kept
    assert len(t["shards"]) == 3 and t["collection"][0][1] == t["collection"][0][0] - 1  # stop-only is empty


def test_parquet_corpus_equals_the_build(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [json.loads(r) for r in _messy_rows() if r.startswith('{"_id": "g')]
    rows[3]["text"] = None  # a reject in Parquet too
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=17)
    build_db, rep = _build_db(str(path), tmp_path / "index", shards=2)
    out = str(tmp_path / "spark.duckdb")
    srep = compute_stats(str(path), out, shards=2, spark=spark)
    _assert_same(build_db, out)
    assert srep.n_rejects == rep.n_rejects == 2  # the null text and the late g005 duplicate
    assert srep.chunks == 4


def test_no_valid_rows_writes_nothing(spark, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text("{oops\n" + json.dumps({"title": "no id", "text": "x"}) + "\n")
    out = tmp_path / "spark.duckdb"
    with pytest.raises(SparkStatsError, match="no valid documents.*2 rows"):
        compute_stats(str(corpus), str(out), spark=spark)
    assert not out.exists() and os.listdir(tmp_path) == ["bad.jsonl"]


def test_cli(spark, tmp_path, capsys):
    out = str(tmp_path / "stats.duckdb")
    assert main(["--corpus", TINY, "--out", out]) == 0
    assert "wrote" in capsys.readouterr().out
    assert _tables(out)["collection"][0][0] == 40
    assert main(["--corpus", str(tmp_path / "missing"), "--out", out]) == 2
