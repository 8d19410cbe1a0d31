"""Shared fixtures: one local Ray per test session, small real corpora, built indexes."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, settings

# Property tests: the same examples on every run (a red CI must mean a bug, not a draw), and
# no health check failing a test for how its inputs were generated (big texts are the point
# of the budget tests) or how long they took on a loaded 2-core machine.
settings.register_profile("funnel", derandomize=True, suppress_health_check=[
    HealthCheck.data_too_large, HealthCheck.too_slow, HealthCheck.large_base_example])
settings.load_profile("funnel")

SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
BEIR = os.path.join(SHARED, "beir")
LUCENE = os.path.join(SHARED, "reference", "lucene")


def need_shared(*parts: str) -> str:
    """Path under ../shared/data, or skip with the reason (CI and developers have it)."""
    p = os.path.join(SHARED, *parts)
    if not os.path.exists(p):
        pytest.skip(f"{p} is absent: the shared BEIR data is needed for this test")
    return p


@pytest.fixture(scope="session")
def ray_session():
    import ray
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
    yield
    ray.shutdown()


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return str(path)


@pytest.fixture(scope="session")
def beir_index(ray_session, tmp_path_factory):
    """``beir_index(name, dense=False)``: the root of an index of ``../shared/data/beir/NAME``
    (4 shards), built once per session under pytest's temporary folder, never in the checkout
    (``funnel eval``'s default, ``.funnel/indexes/NAME``, is relative to the working
    directory). Document embeddings are still cached across runs by content hash, under
    ``$FUNNEL_CACHE`` (default ``~/.cache/funnel``)."""
    built: dict[tuple[str, bool], str] = {}

    def get(name: str, dense: bool = False) -> str:
        from funnel.serving.frontends.cli import ensure_index
        key = (name, dense)
        if key not in built:
            ddir = need_shared("beir", name)
            built[key] = ensure_index(ddir, str(tmp_path_factory.mktemp(f"beir-{name}")), dense, 4)
        return built[key]

    return get


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory) -> str:
    from funnel.pipelines.sources.demo import write_demo_corpus
    p = tmp_path_factory.mktemp("demo") / "corpus.jsonl"
    write_demo_corpus(str(p), max_docs=400)
    return str(p)


@pytest.fixture(scope="session")
def demo_index_1(ray_session, demo_corpus, tmp_path_factory) -> str:
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("ix1"))
    build(demo_corpus, root, shards=1)
    return root


@pytest.fixture(scope="session")
def demo_index_4(ray_session, demo_corpus, tmp_path_factory) -> str:
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("ix4"))
    build(demo_corpus, root, shards=4)
    return root


# The modules that take longest (``--durations`` of ``make test`` on the 2-core machine, each
# with a test of 25 s or more) run first, longest first; every other module keeps its place,
# and every module keeps its own tests' order (module fixtures are built once). Why: xdist's
# worksteal hands each worker half of this order, then an idle worker takes half of what the
# other has not started, so long tests started last would end the run with one worker idle.
SLOW_FIRST = ("test_readme_tour.py", "test_batch_bm25.py", "test_acl.py", "test_http.py",
              "test_folder_options.py", "test_cli_build.py", "test_index_structure.py",
              "test_faults_served_bits.py", "test_build_no_shared_disk.py", "test_masked_pruning.py",
              "test_mcp.py", "test_passages_dense.py", "test_hardening_round2.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: ties keep their order
