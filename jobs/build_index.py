"""Build a funnel index on Ray: read -> validate -> hash-partition -> shards -> publish.

    python jobs/build_index.py --corpus PATH --out INDEX_ROOT [--shards N | --shard-mib M] [--engine auto|ray|local]
    ray job submit --working-dir . -- python jobs/build_index.py --corpus ... --out ...

Two engines run the same stages (the pure functions of ``funnel.pipelines``) and publish
the same files: ``ray`` (Ray tasks for the lexical stages, Ray Data for embedding; a fresh
local Ray unless RAY_ADDRESS names a cluster, even when a ``ray start`` cluster runs on the
machine) and ``local`` (this process, ``funnel.jobs.local_engine``). ``auto`` picks local for
a small corpus when RAY_ADDRESS is unset (`choose_engine`), and the shard count follows the
corpus size (one per 256 MiB, or per ``--shard-mib``) unless ``--shards`` is given
(`choose_shards`); on Ray a shard's size bounds a shard task's memory. The manifest's
``build.engine``, ``build.shards`` and ``build.ray`` say what ran and why. The driver
holds chunk descriptions and one summary row per shard, never the corpus; on Ray, workers
add their progress to a counter in Ray's key-value store that the driver logs every few seconds.

Ray workers need no disk shared with the driver: they write its staging folder in place only
on a Ray that runs on this machine alone (`choose_worker_files`, ``--[no-]shared-disk``).
Elsewhere each shard task builds in a folder of its own and its files come back as rows
(`funnel.jobs.worker_files`), written by the driver as they arrive; the chunks' reject
reports are the read tasks' results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from funnel.pipelines.progress import DEFAULT_INTERVAL

log = logging.getLogger("funnel.build")


@dataclass
class BuildReport:
    version: str
    index_root: str
    n_docs: int
    n_rejects: int
    n_shards: int
    seconds: float
    stage_seconds: dict = field(default_factory=dict)
    rejects_path: str = ""
    ray: dict = field(default_factory=dict)      # which Ray ran it (the manifest's build.ray); {} on local
    dense: dict | None = None                    # the manifest's dense section, None without --dense
    engine: dict = field(default_factory=dict)   # the manifest's build.engine: name, requested, reason
    shard_plan: dict = field(default_factory=dict)  # the manifest's build.shards: n, requested, reason
    enrichment: dict | None = None               # the manifest's enrichment section, None without --enrich
    files: dict | None = None                    # a folder corpus's file counts (the manifest's corpus.files)
    bm25_passages: dict | None = None            # the manifest's bm25_passages section, None without the option

    def to_dict(self) -> dict:
        return self.__dict__.copy()


class BuildError(RuntimeError):
    """The build stopped; nothing was published."""


ENGINES = ("auto", "ray", "local")

#: Auto shard count: one shard per this many bytes of corpus text (JSONL bytes, or Parquet's
#: uncompressed bytes). Build memory follows shard size: a Ray shard worker (or the local
#: engine's process) peaks at ~5.5 bytes per corpus byte, ~1.1-1.2 GiB for the 200 MiB shards of
#: 1M synthetic documents (bench/bench_build_memory.py; ``--shard-mib`` sets a smaller size). At query time each extra shard
#: costs a few µs per query, noise once a shard holds 256 MiB; below the target one shard
#: answers fastest. Figures: bench/RESULTS.md, "Notes: figures moved from code comments".
SHARD_TARGET_BYTES = 256 << 20
#: Auto engine: never in-process above this size (a corpus of more than one auto shard).
LOCAL_MAX_BYTES = SHARD_TARGET_BYTES
#: What a local Ray adds before and around the work (start-up, Ray Data planning, the
#: shuffle), and what the local engine builds per second on one core, as bench/bench_build.py
#: measured them (bench/RESULTS.md, "Notes: figures moved from code comments"). They set
#: where Ray's parallel shards pay for its start.
RAY_FIXED_SECONDS = 12.0
LOCAL_BYTES_PER_SECOND = 6.0e6
#: Corpus bytes the dense stage embeds per CPU second on a CPU, per --embed-runtime: MiniLM's
#: passages of 256 word pieces (~1,000 bytes of corpus each, overlap included) at the passages
#: per CPU second bench/bench_cpu_embed.py measured (torch ~16, onnxruntime fp32 ~18, int8 ~38).
#: Embedding is the whole cost of a CPU build with --dense; either engine spreads it over every core.
EMBED_BYTES_PER_CPU_SECOND = {"torch": 16e3, "onnx": 18e3, "onnx-int8": 38e3}


def corpus_bytes(spec) -> int:
    """Bytes of corpus text: JSONL file sizes (decompressed, for .gz/.zst), Parquet row groups'
    uncompressed sizes (metadata only)."""
    from funnel.pipelines.sources.corpus import jsonl_text_bytes, resolve_files
    fs, files, fmt = resolve_files(spec)
    if fmt == "files":  # a folder of documents: the sizes its listing gave (pipelines.sources.folder)
        from funnel.pipelines.sources.folder import listed_bytes
        return listed_bytes(files)
    if fmt != "parquet":
        return sum(jsonl_text_bytes(fs, f) for f in files)
    import pyarrow.parquet as pq
    total = 0
    for path in files:
        with fs.open_input_file(path) as f:
            md = pq.ParquetFile(f).metadata
            total += sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    return total


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


POSTINGS_FORMATS = ("plain", "packed")


def choose_shards(requested: int | None, nbytes: int, target: int = SHARD_TARGET_BYTES) -> tuple[int, str]:
    """(shard count, why): ``requested`` when given, else one shard per ``target`` bytes of corpus."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--shards must be >= 1, got {requested}")
        return requested, f"set by --shards {requested}"
    n = max(1, -(-nbytes // target))
    return n, (f"auto: {_mib(nbytes)} of corpus, one shard per {_mib(target)} (fewer shards answer "
               f"queries faster; a shard's size bounds the build's memory)")


def embed_estimate(nbytes: int, cpus: int | None = None, runtime: str = "auto") -> str:
    """``; embedding (--dense, onnx-int8) ~42m more on 2 CPU(s)`` for ``nbytes`` of corpus on a
    CPU (``EMBED_BYTES_PER_CPU_SECOND``), for the engine line of a dense build: the lexical
    estimate leaves it out, and on a CPU it is most of the build (a GPU makes it less)."""
    from funnel.pipelines.dense.embed import CPU_RUNTIME
    from funnel.pipelines.progress import format_duration
    name = CPU_RUNTIME if runtime == "auto" else runtime
    n = max(1, cpus or os.cpu_count() or 1)
    secs = nbytes / (EMBED_BYTES_PER_CPU_SECOND[name] * n)
    return f"; embedding (--dense, {name} on a CPU) ~{format_duration(secs)} more on {n} CPU(s)"


def choose_engine(requested: str, nbytes: int, n_shards: int, cpus: int | None = None) -> tuple[str, str]:
    """(engine, why) for ``--engine``: ``ray`` or ``local`` as asked; ``auto`` decides by size.

    ``auto`` is ``ray`` when RAY_ADDRESS names a cluster or the corpus is over
    ``LOCAL_MAX_BYTES``. Otherwise Ray's only gain is running ``p = min(shards, cpus)``
    shards at once: an in-process build of ``t = nbytes / LOCAL_BYTES_PER_SECOND`` seconds
    would save ``t·(1 - 1/p)``, which must beat ``RAY_FIXED_SECONDS``; with one shard (the
    auto count below 256 MiB) Ray can only add its start-up, so ``local`` wins.
    """
    if requested not in ENGINES:
        raise ValueError(f"unknown engine {requested!r}; choose one of {', '.join(ENGINES)}")
    if requested != "auto":
        return requested, f"set by --engine {requested}"
    if os.environ.get("RAY_ADDRESS"):
        return "ray", f"auto: RAY_ADDRESS={os.environ['RAY_ADDRESS']} names a cluster"
    if nbytes > LOCAL_MAX_BYTES:
        return "ray", f"auto: {_mib(nbytes)} of corpus is over the in-process limit of {_mib(LOCAL_MAX_BYTES)}"
    p = max(1, min(n_shards, cpus or os.cpu_count() or 1))
    est = nbytes / LOCAL_BYTES_PER_SECOND
    saved = est * (1 - 1 / p)
    if saved > RAY_FIXED_SECONDS:
        return "ray", (f"auto: {_mib(nbytes)} of corpus, ~{est:.0f}s in-process without embedding; {p} shards in "
                       f"parallel on Ray would save ~{saved:.0f}s, more than Ray's ~{RAY_FIXED_SECONDS:.0f}s start")
    return "local", (f"auto: {_mib(nbytes)} of corpus and RAY_ADDRESS unset: ~{est:.0f}s in-process without "
                     f"embedding, where Ray would add ~{RAY_FIXED_SECONDS:.0f}s of start-up and save ~{saved:.0f}s")


def choose_worker_files(shared_disk: bool | None, ray_info: dict, nodes_here: bool = False) -> tuple[bool, str]:
    """(ship, why): whether the Ray workers send the files they write back through Ray.

    ``shared_disk`` (``--shared-disk`` / ``--no-shared-disk``) decides when given. Otherwise
    workers write the driver's staging folder in place only on a Ray that is certainly on this
    machine: a local Ray funnel started, or the Ray this process initialized when it has one
    node here (``nodes_here``). A RAY_ADDRESS cluster may run workers on other machines (or add
    them while the build runs), which see none of this machine's disk, so they ship.
    """
    if shared_disk is not None:
        return (False, "set by --shared-disk: the workers write the staging folder in place") if shared_disk \
            else (True, "set by --no-shared-disk: the workers send their files back through Ray")
    kind = ray_info.get("cluster")
    if kind == "local" or (kind == "existing" and nodes_here):
        return False, "auto: every Ray worker runs on this machine and writes the staging folder in place"
    where = f"the Ray cluster at {ray_info.get('address')}" if kind == "cluster" else "a Ray with other nodes"
    return True, (f"auto: {where} may run workers on other machines, which do not see this machine's "
                  f"disk: they send their files back through Ray (--shared-disk if they share it)")


def _nodes_here(ray_info: dict) -> bool:
    """Whether the Ray has exactly one node and it is this machine's."""
    import ray
    if ray_info.get("nodes") != 1:
        return False
    try:
        here = ray.util.get_node_ip_address()
        return all(n.get("NodeManagerAddress") == here for n in ray.nodes() if n.get("Alive"))
    except Exception:
        return False


class _DropNotices(logging.Filter):
    """Drops the log records of a Ray logger that start with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


# Ray notices that read like errors on every normal build, and why each one is noise here:
# - token auth: Ray 2.60 turns token authentication on for a new local cluster (as it
#   should) and says so at WARNING level; the cluster stays protected, the notice goes.
# - progress bars: the build reports its own progress (ProgressLog), so Ray Data's bars are
#   off and its "Progress bars disabled" warning says nothing.
_RAY_NOTICES = {
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled",),
    "ray.data._internal.progress": ("Progress bars disabled",),
}


def _quiet_ray_notices() -> None:
    for name, prefixes in _RAY_NOTICES.items():
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropNotices) for f in lg.filters):
            lg.addFilter(_DropNotices(prefixes))


#: Object store of a local Ray that funnel starts (``$FUNNEL_RAY_OBJECT_STORE_BYTES`` overrides):
#: the read tasks' per-shard parts wait there for the shard tasks, and Ray spills what does
#: not fit to disk, so the build's shared memory stays at this size, not the corpus's (Ray's
#: own default, 30% of the machine's memory, stays where it is smaller). A cluster's store is
#: its own setting.
LOCAL_OBJECT_STORE_BYTES = 2 << 30


def init_ray(num_cpus: int | None = None) -> dict:
    """Start or join Ray; returns which cluster the build runs on (logged and put in the manifest).

    With RAY_ADDRESS unset this starts a fresh local Ray (``address="local"``) even when a
    ``ray start`` cluster runs on the machine, as docs/building-at-scale.md says ("a fresh
    local Ray unless RAY_ADDRESS names a cluster"). A Ray that the calling program already
    initialized is used as it is.
    """
    _quiet_ray_notices()
    import ray
    address = os.environ.get("RAY_ADDRESS") or None
    if ray.is_initialized():
        kind, started_by = "existing", "the calling program"
    elif address:
        kind, started_by = "cluster", "RAY_ADDRESS"
        if num_cpus is not None:
            log.warning("--num-cpus %d is ignored: RAY_ADDRESS=%s names a cluster", num_cpus, address)
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        kind, started_by = "local", "funnel"
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        store = int(os.environ.get("FUNNEL_RAY_OBJECT_STORE_BYTES") or min(LOCAL_OBJECT_STORE_BYTES, int(0.3 * ram)))
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=True, logging_level=logging.WARNING, object_store_memory=store)
    if kind != "existing":  # the calling program's Ray Data settings stay its own
        ray.data.DataContext.get_current().enable_progress_bars = False  # ProgressLog reports progress
        if not log.isEnabledFor(logging.DEBUG):
            logging.getLogger("ray.data").setLevel(logging.WARNING)
    res = ray.cluster_resources()
    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # a Ray Client (ray://) session has no GCS address of its own
        gcs = address
    info = {"cluster": kind, "started_by": started_by, "address": gcs,
            "nodes": sum(1 for n in ray.nodes() if n.get("Alive")), "cpus": res.get("CPU", 0),
            "gpus": res.get("GPU", 0)}
    what = {"local": "a new local Ray started by funnel (RAY_ADDRESS is unset)",
            "cluster": f"the Ray cluster at RAY_ADDRESS={address}",
            "existing": "the Ray this process had already initialized"}[kind]
    log.info("ray: %s, address %s: %d node(s), %g CPUs, %g GPUs", what, info["address"], info["nodes"],
             info["cpus"], info["gpus"])
    return info


def max_restarts(ray_info: dict) -> dict:
    """Actor fault tolerance for Ray Data actor pools: off on a one-machine Ray.

    Ray Data passes an actor's constructor through the object store and restarts actors
    forever by default, and Ray logs an error line (core_worker.cc, "constructor arguments
    in the object store and max_restarts > 0") for every such actor. On one machine a
    crashed actor means a real fault (say, out of memory) that a restart would only repeat,
    and a lost node is the whole build anyway; on a RAY_ADDRESS cluster, where nodes come
    and go (autoscaling, preemption), restarts are worth that line.
    """
    one_machine = ray_info.get("cluster") == "local" or (ray_info.get("cluster") == "existing"
                                                         and ray_info.get("nodes") == 1)
    return {"max_restarts": 0} if one_machine else {}


def progress_counter():
    """The counter the workers add their progress to and the driver polls
    (``funnel.jobs.progress_counter``: Ray's key-value store, not an actor process)."""
    from funnel.jobs.progress_counter import ProgressCounter
    return ProgressCounter()


def _counts(counter, stage: str) -> dict[str, int]:
    return counter.get().get(stage, {})


#: Test-only fault injection (tests/test_faults_ray_workers.py), ``STAGE:N:MARKER``: the Ray
#: worker running item N of STAGE (``parse``: chunk N; ``shard``: shard N) SIGKILLs itself
#: once, when it is the first to create the file MARKER (which gets its pid); the retry finds
#: MARKER and goes on. Read in the driver, which passes it to the tasks; unset, no effect.
FAULT_ENV = "FUNNEL_FAULT_KILL"


def _fault_hook(stage: str, spec: str | None):
    """``die(i)`` for the `FAULT_ENV` value ``spec`` aimed at ``stage``, else None (the normal case)."""
    if not spec or spec.split(":", 1)[0] != stage:
        return None
    _, n, marker = spec.split(":", 2)

    def die(i: int) -> None:
        if i != int(n):
            return
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # the retry of the killed task
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        import signal
        os.kill(os.getpid(), signal.SIGKILL)

    return die


def _read_chunk_task(chunk_dict: dict, spec_dict: dict, n_shards: int, counter=None, fault: str | None = None,
                     spill_to: str | None = None) -> tuple:
    """Ray task of the read stage: one chunk's valid rows as ``n_shards`` Arrow tables (one per
    shard, into the object store, which spills to disk when full), then the chunk's report
    (lines, valid rows, rejects). All are the task's own return values, owned by the driver:
    a lost one is rebuilt by running the task again.

    With ``spill_to`` (a work folder every worker shares with the driver) the rows go there
    instead, per shard, as the local engine spills them (``local_engine._spill``), and the
    report is the only return value: no shard's rows wait in shared memory."""
    from funnel.jobs.local_engine import _spill, split_by_shard
    from funnel.pipelines.sources.corpus import Chunk, CorpusSpec, read_chunk

    chunk = Chunk(**{k: chunk_dict[k] for k in ("index", "path", "kind", "start", "end", "row_group",
                                                "compression")})
    res = read_chunk(chunk, CorpusSpec(**spec_dict))
    die = _fault_hook("parse", fault)
    if die is not None:
        die(chunk.index)
    if counter is not None:
        counter.add("read", chunks=1, docs=len(res.rows), rejects=len(res.rejects))
    report = {"chunk": chunk.index, "path": chunk.path, "lines": res.lines, "rows": len(res.rows),
              "rejects": res.rejects}
    if spill_to is not None:
        _spill(spill_to, chunk.index, res.rows, n_shards)  # a retry rewrites the same files
        return report
    return (*split_by_shard(res.rows, n_shards), report)


def _shard_task(shard: int, out_dir: str, work_dir: str, analyzer_cfg: dict, counter, ship: bool,
                fault: str | None, spilled: bool, *parts):
    """Ray task of the shard stage (a streaming generator): build shard ``shard`` from its
    ``parts`` (one table per chunk, in chunk order), yield rows of `worker_files`. With
    ``spilled`` the parts are the read tasks' reports (waited for, not read) and the rows are
    the ones they spilled under ``work_dir`` (``local_engine._shard_rows``).

    Without ``ship`` the shard's files go to the driver's ``out_dir``/``work_dir`` (a disk the
    workers share) and the task yields its summary row; with ``ship`` they go to a temporary
    folder of the worker (as ``out/...`` and ``work/...``) and come back to the driver as rows.
    The task holds its own shard's documents only, so a shard's size bounds its memory.
    """
    import tempfile

    import pyarrow as pa

    from funnel.jobs.worker_files import result_rows
    from funnel.pipelines.lexical.analysis import AnalyzerConfig
    from funnel.pipelines.lexical.shard import index_shard_docs, shard_summary, write_shard_docs

    from funnel.jobs.local_engine import _shard_rows

    cfg = AnalyzerConfig(stopwords=analyzer_cfg["stopwords"], stemmer=analyzer_cfg["stemmer"])
    # Arrow buffers: read from the spilled files, or in the object store's shared memory, not copied
    rows = _shard_rows(work_dir, shard) if spilled else pa.concat_tables(parts)
    del parts
    tmp = tempfile.mkdtemp(prefix=f"funnel-shard-{shard:04d}-") if ship else None
    dirs = (os.path.join(tmp, "out"), os.path.join(tmp, "work")) if ship else (out_dir, work_dir)
    progress = (lambda n: counter.add("index", docs=n)) if counter is not None else None
    try:
        docs = write_shard_docs(rows, shard, *dirs)
        del rows
        s = shard_summary(docs, index_shard_docs(shard, dirs[0], cfg, progress=progress))
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    die = _fault_hook("shard", fault)
    if die is not None:  # after the shard's files are written: the retry writes them again
        die(shard)
    if counter is not None:
        counter.add("index", shards=1)
    yield from result_rows(shard, s, tmp)


def _row_table(row: dict):
    """One row of `worker_files` (a dict of one-element arrays) as the pyarrow table
    `FileReceiver` reads."""
    import pyarrow as pa
    return pa.table({k: pa.array(list(v)) for k, v in row.items()})


def keep_rejects(work_dir: str, out: str, staging: str) -> tuple[str, int]:
    """The rejects of a build that publishes nothing, kept as ``INDEX_ROOT/rejects-<build id>.jsonl``.

    Only a build whose every row was rejected keeps them, and its error names the file: the
    reasons of every row are what it takes to fix the corpus, too many for a message, and
    beside the index they are found, and survive a remote root's temporary folders. ``funnel
    gc`` removes them with the other debris of failed builds. A build that fails before reading
    a row (no rows, a wrong Parquet schema) or for another reason leaves nothing in the root.
    """
    path = os.path.join(out, f"rejects-{os.path.basename(staging).split('-', 1)[1]}.jsonl")
    return path, collect_rejects(work_dir, path)


def collect_rejects(work_dir: str, out_path: str) -> int:
    """Merge per-chunk and per-shard reject files into one rejects.jsonl, in corpus order,
    with absolute 1-based line numbers per file."""
    rdir = os.path.join(work_dir, "rejects")
    chunks = {}
    shard_rejects = []
    for name in sorted(os.listdir(rdir)) if os.path.isdir(rdir) else []:
        with open(os.path.join(rdir, name)) as f:
            data = json.load(f)
        if name.startswith("chunk-"):
            chunks[data["chunk"]] = data
        else:
            shard_rejects.extend(data)
    # Line offset of each chunk inside its file.
    offset, prev_path, base = {}, None, 0
    for idx in sorted(chunks):
        c = chunks[idx]
        if c["path"] != prev_path:
            base, prev_path = 0, c["path"]
        offset[idx] = base
        base += c["lines"]
    rows = []
    for c in chunks.values():
        for r in c["rejects"]:
            rows.append({**r, "line": offset[r["chunk"]] + r["line"]})
    for r in shard_rejects:
        first_chunk, first_line = r.pop("first")
        rows.append({**r, "path": chunks.get(r["chunk"], {}).get("path"),
                     "line": offset.get(r["chunk"], 0) + r["line"],
                     "reason": f"duplicate id {r['doc_id']!r} (first seen at line "
                               f"{offset.get(first_chunk, 0) + first_line})"})
    rows.sort(key=lambda r: (r["chunk"], r["line"]))
    with open(out_path, "w") as f:
        for r in rows:
            r.pop("chunk", None)
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)


def _ray_lexical(chunks: list, spec, shards: int, staging: str, work: str, analyzer_cfg: dict, counter,
                 progress_seconds: float, ship: bool = False) -> list[dict]:
    """The lexical stages on Ray: a task per chunk reads it and splits its rows by shard; a
    task per shard builds that shard from its parts. The shard summaries.

    Why Ray tasks and not a Ray Data ``groupby("shard").map_groups``: that shuffle held the
    shuffled rows in two long-lived aggregator processes until every shard was built, and
    built the shards inside them, so the build's memory grew with the corpus. Here the parts
    wait in the object store (shared memory, spilled to disk when full) and each shard task
    holds one shard: the shard size (``--shards``, or one per ``SHARD_TARGET_BYTES``) bounds a
    worker's memory.

    Workers write nothing under ``staging`` or ``work`` unless ``ship`` is False (a disk they
    share with this process): the chunks' reports are task results, and with ``ship`` each
    shard's files come back as rows (`funnel.jobs.worker_files`), written here as they
    arrive. Retries (a killed worker) rerun the task; the receiver takes the same bytes again.
    """
    import ray

    from funnel.jobs.worker_files import FileReceiver
    from funnel.pipelines.progress import ProgressLog, Status

    def lexical_status() -> Status:
        read, index = _counts(counter, "read"), _counts(counter, "index")
        if read.get("chunks", 0) < len(chunks) or not index:
            return Status("read + analyze", read.get("docs", 0), fraction=read.get("chunks", 0) / len(chunks),
                          detail=f"chunk {read.get('chunks', 0)} of {len(chunks)}, "
                                 f"{read.get('rejects', 0):,} rejected")
        return Status("index shards", index.get("docs", 0), total=read.get("docs", 0),
                      detail=f"{index.get('shards', 0)} of {shards} shards written")

    # Workers that share this disk spill each chunk's rows to the work folder, per shard, and
    # each shard task reads its own back: nothing waits in the object store, whose shared
    # memory otherwise held every shard's rows (the whole corpus, ~1 GiB at 1M synthetic
    # documents) until the last shard was built. Shipped workers pass them through Ray.
    spilled = not ship
    read = ray.remote(_read_chunk_task).options(num_returns=1 if spilled else shards + 1, num_cpus=1)
    # max_calls=1: each shard in a fresh worker process, which gives all its memory back when it
    # exits (a worker reused for the next shard kept the last one's heap: 1.7 GB for 80 MiB shards).
    build = ray.remote(max_calls=1)(_shard_task).options(num_returns="streaming", num_cpus=1)
    receiver = FileReceiver({"out": staging, "work": work})
    spec_dict, fault = spec.to_dict(), os.environ.get(FAULT_ENV)
    with ProgressLog(lexical_status, progress_seconds, log):
        parts = [read.remote(c.to_dict(), spec_dict, shards, counter, fault, work if spilled else None)
                 for c in chunks]
        reports = parts if spilled else [p[shards] for p in parts]
        gens = [build.remote(s, staging, work, analyzer_cfg, counter, ship, fault, spilled,
                             *(reports if spilled else [p[s] for p in parts]))
                for s in range(shards)]
        os.makedirs(os.path.join(work, "rejects"), exist_ok=True)
        for report in ray.get(reports):
            with open(os.path.join(work, "rejects", f"chunk-{int(report['chunk']):06d}.json"), "w") as f:
                json.dump(report, f)
        del parts, reports  # the shard tasks hold their own references
        for gen in gens:
            for ref in gen:
                receiver.add(_row_table(ray.get(ref)))
                del ref
    if receiver.bytes:
        log.info("lexical: %s of shard files came back from the workers through Ray", _mib(receiver.bytes))
    return receiver.finish()


#: The embedded SmolLM2 server is restarted after this many documents (its memory grows with
#: every request; see ``LocalLlamaServer.restart``).
LOCAL_LLM_RECYCLE_EVERY = 200


def _recycling(propose, srv, every: int = LOCAL_LLM_RECYCLE_EVERY):
    """``propose`` that restarts ``srv`` before every ``every``-th call (a request in flight
    then fails its attempt and is retried by the client's backoff)."""
    import threading
    lock = threading.Lock()
    calls = [0]

    def call(title: str, text: str):
        with lock:
            calls[0] += 1
            if calls[0] % every == 0:
                log.info("enrich: restarting the local LLM server after %d documents (its memory grows per "
                         "request)", calls[0])
                srv.restart()
        return propose(title, text)

    return call


def _run_enrichment(staging: str, work: str, shards: int, settings, analyzer, stats, shard_rows: list[dict],
                    cache_dir: str | None, progress_seconds: float) -> dict:
    """SIRA enrichment of the staged shards (in this process for both engines: the LLM endpoint is
    the parallel part); updates ``shard_rows`` with the enriched counts, returns the manifest section."""
    import contextlib
    import dataclasses

    from funnel.jobs.local_engine import run_enrich

    propose = None
    with contextlib.ExitStack() as stack:
        if settings.base_url == "local":
            from funnel.pipelines.enrich import EnrichClient
            from funnel.serving.chat import SMOLLM2_GGUF, LocalLlamaServer
            srv = stack.enter_context(LocalLlamaServer(alias=SMOLLM2_GGUF.removesuffix(".gguf")))
            settings = dataclasses.replace(settings, base_url=srv.base_url, model=srv.alias)
            propose = _recycling(EnrichClient(settings).propose, srv)
        log.info("enrich: %s at %s, %s, tau %g, max_n %d, %d requests in flight", settings.model,
                 settings.base_url, settings.prompt_id, settings.tau, settings.max_n, settings.concurrency)
        section, new_rows = run_enrich(staging, work, shards, settings, analyzer.config.to_dict(),
                                       stats.n_docs_nonempty, cache_dir=cache_dir,
                                       progress_seconds=progress_seconds, propose=propose)
    for s, row in new_rows.items():
        shard_rows[s].update(row)
    return section


def build(corpus: str, out: str, shards: int | None = None, strict: bool = False, fmt: str = "auto",
          id_field: str | None = None, title_field: str = "title", text_field: str = "text",
          keep_versions: int | None = None, dense: bool = False, embed_model: str | None = None,
          embed_batch_size: int = 64, chunk_bytes: int = 4 << 20, num_cpus: int | None = None,
          progress_seconds: float = DEFAULT_INTERVAL, engine: str = "auto", enrich=None,
          enrich_cache: str | None = "default", shared_disk: bool | None = None,
          shard_mib: int | None = None, limits: dict | None = None, fields=None,
          acl_absent: str = "public", passages=None, bm25_passages: bool = False,
          dense_memory_budget: int | str | None = None, include=(), exclude=(),
          follow_links: bool = False, embed_runtime: str = "auto", postings: str = "plain") -> BuildReport:
    """Build and publish a new index version under ``out``; see the module docstring.

    ``passages`` (`funnel.pipelines.dense.passages.PassageSettings`; default on) splits every
    document into passages of the embedder's window for the dense stage (DESIGN.md, "Long
    documents"); ``PassageSettings(enabled=False)`` embeds each document whole.

    ``bm25_passages`` (needs ``dense`` with passages on) also indexes every passage as a BM25
    document of its own, in the version's ``bm25-passages/`` folder, and serving then scores
    BM25 by a document's best passage (`funnel.pipelines.lexical.passage_bm25`); off, BM25 is
    whole-document, as Lucene scores it.

    ``dense_memory_budget`` (bytes, or a size such as ``"4GiB"``; None: the default, 4 GiB)
    bounds the dense index's lists in RAM at serving: above it the FAISS shards are IVF-PQ,
    re-scored exactly from the vectors on disk (`funnel.pipelines.dense.vectors`).

    ``fields`` declares the filterable fields (``"year:number,tags:keyword_list"``,
    ``"@schema.json"`` or a dict; None: inferred) and ``acl_absent`` what a document without
    an ``acl`` field is (``public`` or ``private``): see `funnel.pipelines.sources.fields`.

    ``limits`` bounds every corpus row (`funnel.pipelines.sources.corpus.CorpusSpec`'s
    ``max_depth``, ``max_field_bytes``, ``max_row_bytes``; unset: the defaults).

    ``include``, ``exclude`` (``.gitignore`` patterns, matched against a file's path in the
    folder) and ``follow_links`` (read symbolic links that leave the folder) choose the files
    of a folder of documents (`funnel.pipelines.sources.selection`, `funnel.pipelines.sources.walk`).

    ``enrich`` (a `funnel.pipelines.enrich.EnrichSettings`; base_url ``"local"`` starts
    the embedded SmolLM2) adds SIRA corpus enrichment after the DF reduce
    (`funnel.jobs.local_engine.run_enrich`); ``enrich_cache`` is its cache root
    (``"default"``: beside the embedding cache; None: no cache).

    ``shards`` None chooses the count from the corpus size (`choose_shards`);
    ``engine`` is ``auto``, ``ray`` or ``local`` (`choose_engine`). ``shared_disk``
    says whether the Ray workers can write this machine's staging folder (None: decided by
    `choose_worker_files`); where they cannot, their files come back through Ray. Every
    ``progress_seconds`` (0: never) the long stages log one line to ``funnel.build`` at
    INFO: stage, documents done, rate, ETA.
    """
    if postings not in POSTINGS_FORMATS:
        raise ValueError(f"postings={postings!r}: choose one of {', '.join(POSTINGS_FORMATS)}")
    if postings == "packed":
        from funnel.serving import kernels
        if not kernels.HAVE_NUMBA:  # the codec would run as Python, hours at millions of documents
            raise ValueError("--postings packed needs numba (pip install numba, and FUNNEL_NUMBA unset); "
                             "or build with --postings plain")
    from funnel.pipelines.store import remote
    from funnel.pipelines.lexical.analysis import Analyzer
    from funnel.pipelines.store.artifacts import new_staging_dir, publish, release_staging
    from funnel.pipelines.sources.corpus import CorpusSpec, plan_chunks
    from funnel.pipelines.store.docorder import write_doc_ids
    from funnel.pipelines.lexical.postings import finalize_shard
    from funnel.pipelines.lexical.shard import build_lexical_shard, combine_fingerprints, shard_name
    from funnel.pipelines.lexical.stats import load_vocabulary, reduce_term_stats, write_vocabulary

    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if shards is not None and shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    if shard_mib is not None and (shard_mib < 1 or shards is not None):
        raise ValueError(f"--shard-mib must be >= 1 and is not used with --shards (got {shard_mib})")
    if bm25_passages:
        from funnel.pipelines.lexical.passage_bm25 import check_options
        check_options(dense, passages is None or passages.enabled, enrich is not None)
    if dense_memory_budget is not None:
        from funnel.pipelines.dense.vectors import parse_memory_budget
        dense_memory_budget = parse_memory_budget(dense_memory_budget)  # a bad size fails before any work
    t0 = time.time()
    timings = {}
    from funnel.pipelines.sources.fields import ACL_ABSENT, parse_declaration
    if acl_absent not in ACL_ABSENT:
        raise ValueError(f"unknown --acl-absent {acl_absent!r}; choose one of {', '.join(ACL_ABSENT)}")
    spec = CorpusSpec(path=corpus, format=fmt, id_field=id_field, title_field=title_field,
                      text_field=text_field, **(limits or {}), fields=parse_declaration(fields),
                      include=tuple(include or ()), exclude=tuple(exclude or ()), follow_links=follow_links)
    chunks = plan_chunks(spec, target_bytes=chunk_bytes)
    from funnel.pipelines.sources.folder import listing_summary
    files_info = listing_summary(chunks)  # readable, skipped and hidden files of a folder corpus, else None
    nbytes = corpus_bytes(spec)
    requested_shards = shards
    shards, shards_why = choose_shards(requested_shards, nbytes,
                                       SHARD_TARGET_BYTES if shard_mib is None else shard_mib << 20)
    engine_name, engine_why = choose_engine(engine, nbytes, shards, num_cpus)
    if dense:
        from funnel.pipelines.dense.embed import RUNTIME_CHOICES
        if embed_runtime not in RUNTIME_CHOICES:
            raise ValueError(f"unknown --embed-runtime {embed_runtime!r}; choose one of {', '.join(RUNTIME_CHOICES)}")
        if not (embed_model or "").startswith("openai:"):
            engine_why += embed_estimate(nbytes, num_cpus, embed_runtime)
    engine_info = {"name": engine_name, "requested": engine, "reason": engine_why, "corpus_bytes": nbytes}
    shard_info = {"n": shards, "requested": requested_shards if requested_shards is not None else "auto",
                  "reason": shards_why}
    log.info("corpus %s: %d chunks, %s; %d shard(s) (%s); engine %s (%s)", corpus, len(chunks), _mib(nbytes),
             shards, shards_why, engine_name, engine_why)
    analyzer = Analyzer()
    # A remote INDEX_ROOT (s3://...) is staged in the local cache and uploaded by remote.publish.
    if remote.is_remote(out):
        remote.resolve(out)  # bucket and credentials fail here, before the work
        local, publish_to = remote.local_root(out), remote.publish
    else:
        local, publish_to = out, publish
    staging = new_staging_dir(local)
    work = os.path.join(local, ".work-" + os.path.basename(staging).split("-", 1)[1])
    os.makedirs(work)
    counter = None
    try:
        ray_info: dict = {}
        t = time.time()
        if engine_name == "ray":
            ray_info = init_ray(num_cpus)
            ship, ship_why = choose_worker_files(shared_disk, ray_info, _nodes_here(ray_info))
            ray_info["worker_files"] = {"shipped": ship, "reason": ship_why}
            log.info("worker files: %s", ship_why)
            counter = progress_counter()
            summaries = _ray_lexical(chunks, spec, shards, staging, work, analyzer.config.to_dict(), counter,
                                     progress_seconds, ship=ship)
        else:
            from funnel.jobs.local_engine import run_lexical
            if num_cpus is not None:
                log.info("--num-cpus %d is ignored: the local engine runs in this process", num_cpus)
            summaries = run_lexical(chunks, spec, shards, staging, work, analyzer.config.to_dict(),
                                    progress_seconds)
        timings["read_analyze_shard"] = round(time.time() - t, 2)
        by_shard = {int(s["shard"]): s for s in summaries}
        empty = {"doc_id": [], "title": [], "text": [], "content_hash": [], "chunk": [], "line": []}
        for s in range(shards):  # a shard that received no documents still exists, empty
            if s not in by_shard:
                by_shard[s] = build_lexical_shard(empty, s, staging, work)
        shard_rows = [by_shard[s] for s in range(shards)]

        n_rejects = collect_rejects(work, os.path.join(staging, "rejects.jsonl"))
        n_docs = sum(int(r["n_docs"]) for r in shard_rows)
        log.info("lexical: %d documents in %d shards, %d rejected, %.1fs", n_docs, shards, n_rejects,
                 timings["read_analyze_shard"])
        if strict and n_rejects:
            with open(os.path.join(staging, "rejects.jsonl")) as f:
                first = [json.loads(line) for _, line in zip(range(3), f)]
            raise BuildError(f"--strict: {n_rejects} rows rejected (first: {first}); nothing published")
        if n_docs == 0 and n_rejects == 0:  # only blank lines: nothing to reject, nothing to keep
            from funnel.pipelines.sources.corpus import empty_corpus_message
            raise BuildError(empty_corpus_message(spec))
        if n_docs == 0:
            with open(os.path.join(staging, "rejects.jsonl"), encoding="utf-8") as f:
                first = json.loads(f.readline())
            kept, _ = keep_rejects(work, local, staging)
            raise BuildError(f"no valid documents in {corpus}: all {n_rejects} rows were rejected (the first, "
                             f"line {first['line']}: {first['reason']}); nothing published. The reasons are "
                             f"in {kept}")

        t = time.time()
        term_files = [os.path.join(staging, "lexical", shard_name(s), "terms.parquet") for s in range(shards)]
        stats = reduce_term_stats(term_files, shard_rows, os.path.join(staging, "stats.duckdb"))
        timings["df_reduce"] = round(time.time() - t, 2)
        enrichment = None
        if enrich is not None:
            t = time.time()
            enrichment = _run_enrichment(staging, work, shards, enrich, analyzer, stats, shard_rows,
                                         enrich_cache, progress_seconds)
            stats = reduce_term_stats(term_files, shard_rows, os.path.join(staging, "stats.duckdb"))
            from funnel.pipelines.enrich import write_audit
            edir = os.path.join(work, "enrich")
            write_audit(os.path.join(staging, "stats.duckdb"),
                        [os.path.join(edir, f"audit-{s:04d}.parquet") for s in range(shards)],
                        [os.path.join(edir, f"docs-{s:04d}.parquet") for s in range(shards)])
            timings["enrich"] = round(time.time() - t, 2)
        global_terms, df, cf = load_vocabulary(os.path.join(staging, "stats.duckdb"))
        write_vocabulary(staging, global_terms, df, cf)  # the copy serving reads (pipelines.lexical.stats)
        for s in range(shards):
            finalize_shard(os.path.join(staging, "lexical", shard_name(s)), global_terms, stats.avgdl,
                           packed=postings == "packed")
        del global_terms, df, cf
        write_doc_ids(staging, shards)  # every doc_id and its rank in doc_id order (pipelines.store.docorder)
        from funnel.pipelines.sources.fields import write_columns  # filterable fields as columns per shard
        t = time.time()
        fields_section = write_columns(staging, shards, spec.fields, acl_absent)
        timings["fields"] = round(time.time() - t, 2)

        manifest = {
            "kind": "funnel-index",
            "corpus": {"source": corpus, "spec": spec.to_dict(),
                       "fingerprint": combine_fingerprints([r["fingerprint_sum"] for r in shard_rows]),
                       "n_docs": n_docs, "n_rejects": n_rejects,
                       **({"files": files_info} if files_info else {})},  # a folder's counts (pipelines.sources.folder)
            "analyzer": analyzer.describe(),
            "bm25": {"k1": 0.9, "b": 0.4, "length_norm": "lucene-byte4",
                     "document": "title + '\\n' + text (Pyserini BEIR flat)"},
            "collection": stats.to_dict(),
            "shards": [{"shard": s, "n_docs": int(r["n_docs"]), "total_terms": int(r["total_terms"]),
                        "n_terms": int(r["n_terms"])} for s, r in enumerate(shard_rows)],
            "dense": None,
            "enrichment": enrichment,
            **({"fields": fields_section} if fields_section is not None else {}),
            "build": {"seconds": None, "stages": timings, "engine": engine_info, "shards": shard_info,
                      "ray": ray_info},
        }
        if dense:
            t = time.time()
            if engine_name == "ray":
                from funnel.jobs.embed_stage import run_dense_stage
                manifest["dense"] = run_dense_stage(staging, shards, embed_model, embed_batch_size, n_docs=n_docs,
                                                    counter=counter, progress_seconds=progress_seconds,
                                                    actor_options=max_restarts(ray_info), ship=ship,
                                                    release_ray=ray_info.get("cluster") == "local",
                                                    passages=passages, memory_budget=dense_memory_budget,
                                                    runtime=embed_runtime)
            else:
                from funnel.jobs.local_engine import run_dense
                manifest["dense"] = run_dense(staging, shards, embed_model, embed_batch_size, n_docs=n_docs,
                                              progress_seconds=progress_seconds, passages=passages,
                                              memory_budget=dense_memory_budget, runtime=embed_runtime)
            timings["dense"] = round(time.time() - t, 2)
        if bm25_passages:
            t = time.time()
            from funnel.jobs.passage_bm25 import run_passage_bm25
            # In process where Ray workers could not read this process's work folder.
            manifest["bm25_passages"] = run_passage_bm25(
                staging, work, shards, engine="local" if engine_name == "local" or ray_info.get(
                    "worker_files", {}).get("shipped") else "auto", num_cpus=num_cpus,
                progress_seconds=progress_seconds, shard_mib=shard_mib, shared_disk=shared_disk, limits=limits)
            timings["bm25_passages"] = round(time.time() - t, 2)
        manifest["build"]["seconds"] = round(time.time() - t0, 2)
        if enrichment is None:
            del manifest["enrichment"]  # an un-enriched manifest stays as it was
        version = publish_to(out, staging, manifest, keep=keep_versions)
    except BaseException:
        release_staging(staging, remove=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if counter is not None:
            counter.close()
    secs = round(time.time() - t0, 2)
    log.info("published %s/%s: %d docs, %d rejects, %.1fs, engine %s", out, version, n_docs, n_rejects, secs,
             engine_name)
    if n_rejects:  # only now: a build that publishes nothing has no version to point at
        log.warning("%d rows rejected; see %s", n_rejects, os.path.join(out, version, "rejects.jsonl"))
    return BuildReport(version, out, n_docs, n_rejects, shards, secs, timings,
                       os.path.join(out, version, "rejects.jsonl"), ray=ray_info, dense=manifest["dense"],
                       engine=engine_info, shard_plan=shard_info, enrichment=enrichment, files=files_info,
                       bm25_passages=manifest.get("bm25_passages"))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown, except where the help text already says it (``default: ...``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or "default:" in (action.help or "") or "(required)" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def add_corpus_arguments(p) -> None:
    """How to read the corpus: the flags every job that reads one (build, spark_stats) shares."""
    p.add_argument("--format", dest="fmt", default="auto", choices=["auto", "beir", "jsonl", "parquet", "files"],
                   help="corpus format; auto goes by the file names (files: a folder of Markdown, text, HTML and "
                        "PDF files, one document each; auto takes a folder for one when it holds no JSONL or Parquet)")
    p.add_argument("--id-field", default=None,
                   help="the document id field (default: the first of _id, id, docid, doc_id present)")
    p.add_argument("--title-field", default="title", help="the title field")
    p.add_argument("--text-field", default="text", help="the text field")


def add_folder_arguments(p, reindex: bool = False) -> None:
    """Which files of a folder of documents are read (build and reindex; a reindex's default
    is what the live version recorded)."""
    was = " (default: the live version's)" if reindex else ""
    p.add_argument("--include", action="append", default=None, metavar="PATTERN",
                   help="a folder corpus: read only files matching one of these .gitignore-style patterns on "
                        f"their path in the folder, e.g. 'docs/**/*.md' or '*.html'; repeatable"
                        f"{was or ' (default: every file)'}")
    p.add_argument("--exclude", action="append", default=None, metavar="PATTERN",
                   help="a folder corpus: leave out files and folders matching these .gitignore-style patterns, "
                        "after the folder's .funnelignore, e.g. 'drafts/' or '**/*.draft.md'; repeatable"
                        f"{was or ' (default: none)'}")
    p.add_argument("--follow-links", action=argparse.BooleanOptionalAction, default=None if reindex else False,
                   help="a folder corpus: also read symbolic links that lead outside the folder (they may expose "
                        "any file this process can read; links are never followed twice, so loops end); off: "
                        f"such links are skipped and listed in rejects.jsonl{was or ' (default: off)'}")


def add_limit_arguments(p) -> None:
    """The bounds on every corpus row (a row over one is a reject naming the field and the limit)."""
    from funnel.pipelines.sources.limits import DEFAULT_MAX_DEPTH, DEFAULT_MAX_FIELD_BYTES, DEFAULT_MAX_ROW_BYTES
    p.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH,
                   help="deepest nesting of a field's value ([] and {}) in a row")
    p.add_argument("--max-field-mib", type=float, default=DEFAULT_MAX_FIELD_BYTES / (1 << 20),
                   help="largest field of a row, in MiB of UTF-8")
    p.add_argument("--max-row-mib", type=float, default=DEFAULT_MAX_ROW_BYTES / (1 << 20),
                   help="largest row (a JSONL line; Parquet: its id, title and text), in MiB")


def limits_from_args(a: argparse.Namespace) -> dict:
    """``build(limits=...)`` from the flags of `add_limit_arguments`."""
    return {"max_depth": a.max_depth, "max_field_bytes": int(a.max_field_mib * (1 << 20)),
            "max_row_bytes": int(a.max_row_mib * (1 << 20))}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The build options; help strings leave the default to the parser's formatter."""
    p.add_argument("--corpus", required=True,
                   help="the corpus: a BEIR folder (corpus.jsonl), a .jsonl or .parquet file or a folder "
                        "of them, or a folder of Markdown, text, HTML and PDF files (each file a document, its "
                        "path in the folder its id); a local path or a pyarrow filesystem URI (file://, s3://, "
                        "gs://) (required)")
    p.add_argument("--out", required=True, help="INDEX_ROOT: versions and the CURRENT pointer live here (required)")
    p.add_argument("--shards", type=int, default=None,
                   help="hash partitions of the index (default: auto, one per 256 MiB of corpus: 1 for a "
                        "small corpus, which answers queries fastest)")
    p.add_argument("--shard-mib", type=int, default=None,
                   help="auto shard count from this shard size instead of 256 MiB of corpus: a shard's size "
                        "bounds a Ray shard task's memory (~5.5 bytes per corpus byte at 200 MiB, measured on "
                        "synthetic text), at a few µs per shard per query (default: none, 256 MiB)")
    p.add_argument("--engine", default="auto", choices=ENGINES,
                   help="where the stages run: ray (Ray Data; a local Ray unless RAY_ADDRESS is set), local "
                        "(this process, no Ray), or auto: local for a small corpus when RAY_ADDRESS is unset "
                        "(default: auto)")
    p.add_argument("--postings", default="plain", choices=POSTINGS_FORMATS,
                   help="how the BM25 postings are stored: plain (4-byte document ids, 2-byte tfs and 2-byte "
                        "impact levels: the fastest queries) or packed (gaps and tfs bit-packed per block of 128, "
                        "about 1-2 bytes a posting; serving decodes the terms queries read into a bounded cache, "
                        "FUNNEL_POSTINGS_CACHE_MB: a fraction of the memory, slower queries; "
                        "docs/index-format.md) (default: plain)")
    p.add_argument("--strict", action="store_true", help="publish nothing if any row is rejected")
    p.add_argument("--shared-disk", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the Ray workers can write this machine's staging folder (a disk they share); "
                        "--no-shared-disk: they send their files back through Ray (default: auto, in place only "
                        "on a Ray that runs on this machine alone)")
    add_corpus_arguments(p)
    add_folder_arguments(p)
    add_limit_arguments(p)
    p.add_argument("--fields", default=None, metavar="NAME:TYPE,...|@FILE",
                   help="the filterable fields, e.g. year:number,tags:keyword_list,updated:date, or @schema.json "
                        "(a JSON object name -> type; types keyword, keyword_list, number, date, bool); a row "
                        "whose value has another type is rejected (default: inferred from the values)")
    p.add_argument("--acl-absent", default="public", choices=("public", "private"),
                   help="what a document without an 'acl' field (the principals and groups that may read it) is "
                        "to callers of funnel serve / mcp --tokens")
    p.add_argument("--keep-versions", type=int, default=None,
                   help="delete all but the newest N versions after publishing (default: keep all)")
    p.add_argument("--dense", dest="dense", action="store_true",
                   help="also embed every document into FAISS shards (enables modes dense and hybrid)")
    p.add_argument("--no-dense", dest="dense", action="store_false", help="BM25 only")
    p.set_defaults(dense=False)
    p.add_argument("--embed-model", default=None,
                   help="sentence-transformers model (name or local path), or openai:MODEL@BASE_URL for "
                        "an OpenAI-compatible /v1/embeddings endpoint (default: all-MiniLM-L6-v2)")
    p.add_argument("--embed-batch-size", type=int, default=64, help="documents per embedding batch")
    from funnel.pipelines.dense.embed import RUNTIME_CHOICES
    p.add_argument("--embed-runtime", choices=tuple(RUNTIME_CHOICES), default="auto",
                   help="where a local embedding model runs: auto is torch on a GPU and onnxruntime int8 on a CPU "
                        "(faster than torch there; its index is queried with int8); onnx is onnxruntime fp32, the "
                        "same vectors as torch's; queries need no torch either way")
    p.add_argument("--passages", choices=("on", "off"), default="on",
                   help="on: split documents into passages of the embedder's window, one vector each, a "
                        "document scored by its best passage; off: one vector per document (its first window)")
    p.add_argument("--passage-tokens", type=int, default=None, metavar="N",
                   help="tokens per passage, special tokens included (default: the embedding model's maximum "
                        "sequence length; 256 for an endpoint)")
    p.add_argument("--passage-overlap", type=float, default=0.15, metavar="F",
                   help="fraction of a passage repeated at the start of the next, in [0, 0.5)")
    p.add_argument("--passage-split-above", type=float, default=4.0, metavar="W",
                   help="a document of at most W passage windows is embedded whole (the model reads its first "
                        "window, as without passages); 1 splits every document longer than one window")
    p.add_argument("--dense-memory-budget", default=None, metavar="SIZE",
                   help="RAM the dense index's lists may take at serving, e.g. 512MiB or 16GiB; above it the FAISS "
                        "shards are IVF-PQ (dim/4-byte codes) re-scored exactly from the vectors on disk "
                        "(default: 4GiB, IVF-Flat up to ~2.7M vectors of dim 384)")
    p.add_argument("--bm25-passages", action="store_true",
                   help="also index every passage for BM25 and score a document by its best passage (MaxP) "
                        "instead of as a whole; needs --dense (default: off, whole-document BM25 as Lucene scores it)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs of the local Ray that funnel starts; ignored with RAY_ADDRESS and by --engine local "
                        "(default: all of this machine's)")
    p.add_argument("--enrich", action="store_true",
                   help="SIRA corpus enrichment: an LLM adds the search phrases each document lacks (DF-filtered) "
                        "to its BM25 terms; needs --llm-base-url and --llm-model, or --llm local")
    p.add_argument("--llm", default=None, choices=["local"],
                   help="local: the embedded SmolLM2-135M (xllamacpp, CPU; ~1 hour for SciFact) (default: none; use --llm-base-url)")
    p.add_argument("--llm-base-url", default=None,
                   help="OpenAI-compatible endpoint root with /v1 (vLLM, TGI, llama.cpp, OpenAI); "
                        "the key is read from $OPENAI_API_KEY (default: none)")
    p.add_argument("--llm-model", default=None, help="model name sent to --llm-base-url (default: none)")
    p.add_argument("--enrich-task", default="general",
                   choices=["general", "qa", "factcheck", "argument", "duplicate", "citation"],
                   help="what searchers look for, which picks the prompt")
    p.add_argument("--enrich-tau", type=float, default=0.1,
                   help="keep a phrase if one of its 1..max_n word windows is in at most tau*N documents")
    p.add_argument("--enrich-max-n", type=int, default=2, help="longest phrase window and n-gram term (1-3)")
    p.add_argument("--enrich-concurrency", type=int, default=4, help="LLM requests in flight")
    p.add_argument("--enrich-timeout", type=float, default=60.0, help="seconds per LLM request")
    p.add_argument("--enrich-retries", type=int, default=2, help="retries of a request that times out or gets 429/5xx")
    p.add_argument("--enrich-cache", default="default",
                   help="enrichment cache root (default: $FUNNEL_CACHE/enrichment, beside the embedding cache); "
                        "'none' disables it")
    p.add_argument("--progress-seconds", type=float, default=DEFAULT_INTERVAL,
                   help="seconds between progress lines of a long stage; 0 turns them off")


def describe_report(rep: BuildReport) -> str:
    """What a build published, for the terminal: counts, modes it can serve, Ray, next step."""
    ray_used = {"local": "a local Ray started by funnel", "cluster": f"the Ray cluster at {rep.ray.get('address')}",
                "existing": "the Ray this process had initialized"}.get(rep.ray.get("cluster"), "Ray")
    where = "in this process (engine local, no Ray)" if rep.engine.get("name") == "local" else f"on {ray_used}"
    lines = [f"published {rep.index_root}/{rep.version}: {rep.n_docs} documents in {rep.n_shards} shards, "
             f"{rep.n_rejects} rejected ({rep.rejects_path}), {rep.seconds:.1f}s {where}"]
    if rep.engine:
        lines.append(f"  engine: {rep.engine['name']} ({rep.engine['reason']})")
    if rep.shard_plan:
        lines.append(f"  shards: {rep.shard_plan['n']} ({rep.shard_plan['reason']})")
    if rep.files:
        f = rep.files
        lines.append(f"  files: {f['readable']} read ({', '.join(f'{k} {v}' for k, v in f['by_type'].items())}), "
                     f"{f['skipped']} skipped of other types, {f['hidden']} hidden skipped"
                     + (f", {f['excluded']} excluded" if f.get("excluded") else "")
                     + (" (.funnelignore)" if f.get("funnelignore") else ""))
        links = f.get("links") or {}
        if any(links.values()) or f.get("bad_names"):
            lines.append(f"  links: {links.get('followed', 0)} followed, {links.get('outside', 0)} leading outside "
                         f"the folder skipped, {links.get('broken', 0)} broken, {links.get('repeated', 0)} to "
                         f"files or folders already read; {f.get('bad_names', 0)} names not UTF-8 (each skip a "
                         "reject, in rejects.jsonl)")
    if rep.dense:
        fp = rep.dense.get("fingerprint") or {}
        per = ""
        if rep.dense.get("passages"):
            per = f" (passages of {rep.dense['passages'].get('window')} tokens; a document scores its best)"
        rt = f" ({fp['runtime']} {fp['precision']})" if fp.get("runtime") else ""
        lines.append(f"  dense: {fp.get('model', '?')}{rt}, {rep.dense.get('dim')}-d, FAISS {rep.dense.get('factory')}, "
                     f"{rep.dense.get('ntotal')} vectors{per}")
        if rep.dense.get("refine"):
            lines.append(f"  dense: IVF-Flat would exceed the memory budget ({rep.dense['memory_budget']:,} bytes): "
                         f"PQ codes in RAM ({rep.dense['list_bytes']:,} bytes), each result re-scored exactly from "
                         "dense/emb-*.npy")
    if rep.enrichment:
        c = rep.enrichment["counts"]
        lines.append(f"  enrichment: {rep.enrichment['model']} ({rep.enrichment['prompt_id']}): {c['documents']} docs, "
                     f"{c['cached']} from the cache, {c['enriched']} asked, {c['failed']} failed; "
                     f"{c['phrases_kept']} of {c['phrases_proposed']} phrases kept "
                     f"(funnel enrich-report {rep.index_root})")
    if rep.bm25_passages:
        lines.append(f"  bm25: a document scores its best passage ({rep.bm25_passages['n_passages']} passages "
                     f"indexed in {rep.bm25_passages['dir']}/)")
    modes = "bm25, dense, hybrid" if rep.dense else "bm25 (build with --dense for dense and hybrid)"
    lines.append(f"  modes: {modes}")
    lines.append(f'  next:  funnel search {rep.index_root} "your question"')
    return "\n".join(lines)


def llm_endpoint_of(a: argparse.Namespace) -> tuple[str, str] | None:
    """(base_url, model) of ``--llm local`` (``("local", "local")``) or ``--llm-base-url
    --llm-model``; None when neither is given (build and reindex read the same flags)."""
    if getattr(a, "llm", None) == "local":
        return ("local", "local")
    if getattr(a, "llm_base_url", None):
        if not a.llm_model:
            raise ValueError("--llm-base-url needs --llm-model")
        return (a.llm_base_url, a.llm_model)
    return None


def enrich_settings_from_args(a: argparse.Namespace):
    """The `EnrichSettings` of ``--enrich ...``, or None without ``--enrich``."""
    if not getattr(a, "enrich", False):
        return None
    from funnel.pipelines.enrich import EnrichSettings
    endpoint = llm_endpoint_of(a)
    if endpoint is None:
        raise ValueError("--enrich needs an LLM: --llm-base-url URL --llm-model NAME (vLLM, TGI, llama.cpp, "
                         "OpenAI), or --llm local for the embedded SmolLM2")
    base_url, model = endpoint
    return EnrichSettings(base_url=base_url, model=model, task=a.enrich_task, tau=a.enrich_tau,
                          max_n=a.enrich_max_n, concurrency=a.enrich_concurrency, timeout=a.enrich_timeout,
                          retries=a.enrich_retries)


def passage_settings_from_args(a: argparse.Namespace):
    """``--passages``, ``--passage-tokens``, ``--passage-overlap`` as PassageSettings (a bad
    value fails here, before any work, with the valid range)."""
    from funnel.pipelines.dense.passages import PassageSettings
    return PassageSettings(enabled=getattr(a, "passages", "on") == "on",
                           overlap=getattr(a, "passage_overlap", 0.15), window=getattr(a, "passage_tokens", None),
                           split_above=getattr(a, "passage_split_above", 4.0))


def run_from_args(a: argparse.Namespace) -> BuildReport:
    rep = build(a.corpus, a.out, shards=a.shards, strict=a.strict, fmt=a.fmt, id_field=a.id_field,
                title_field=a.title_field, text_field=a.text_field, keep_versions=a.keep_versions,
                dense=a.dense, embed_model=a.embed_model, embed_batch_size=a.embed_batch_size,
                embed_runtime=getattr(a, "embed_runtime", "auto"), num_cpus=a.num_cpus,
                progress_seconds=a.progress_seconds, engine=a.engine,
                shared_disk=getattr(a, "shared_disk", None), enrich=enrich_settings_from_args(a),
                shard_mib=getattr(a, "shard_mib", None), limits=limits_from_args(a),
                fields=getattr(a, "fields", None), acl_absent=getattr(a, "acl_absent", "public"),
                passages=passage_settings_from_args(a), bm25_passages=getattr(a, "bm25_passages", False),
                dense_memory_budget=getattr(a, "dense_memory_budget", None),
                include=getattr(a, "include", None) or (), exclude=getattr(a, "exclude", None) or (),
                follow_links=bool(getattr(a, "follow_links", False)),
                postings=getattr(a, "postings", "plain"),
                enrich_cache=None if getattr(a, "enrich_cache", "default") == "none"
                else getattr(a, "enrich_cache", "default"))
    print(describe_report(rep))
    return rep


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(prog="build_index", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        run_from_args(a)
    except (BuildError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
