"""The Ray build's progress counts, kept in Ray's own key-value store (the GCS's).

Workers add what they did (chunks read, documents indexed, vectors embedded) with
`ProgressCounter.add`; the driver sums them with `ProgressCounter.get` for its progress log
line, and reindexing reports its vectors from them. Each process keeps its running totals
and writes them under a key of its own (one write per add, no read), so adds from many
processes never race, and a reader sums one key a process.

Why not a Ray actor, as before: an actor is a worker process of its own, ~155 MiB of
resident memory at 1M documents (``bench_build_memory``'s process table: ``ray::BuildProgress``),
held through the whole build beside the two shard workers; the key-value store lives in the
GCS, which runs anyway. The keys are removed by `close`.
"""

from __future__ import annotations

import json
import threading
import uuid

#: This process's key suffix: every copy of a counter in this process adds up under it.
_PROCESS = uuid.uuid4().hex
_LOCK = threading.Lock()
_TOTALS: dict[str, dict[str, dict[str, int]]] = {}  # key prefix -> stage -> name -> count


class ProgressCounter:
    """Counts per stage, summed over every process that adds to them (module docstring).
    Picklable: it travels to tasks and actors as its key prefix."""

    def __init__(self, name: str | None = None):
        self.prefix = f"funnel-progress/{name or uuid.uuid4().hex}/"

    def add(self, stage: str, **counts: int) -> None:
        """Add ``counts`` to ``stage``'s (written before it returns: a reader after this
        sees them)."""
        from ray.experimental import internal_kv as kv
        with _LOCK:
            mine = _TOTALS.setdefault(self.prefix, {})
            c = mine.setdefault(stage, {})
            for k, v in counts.items():
                c[k] = c.get(k, 0) + int(v)
            body = json.dumps(mine)
        kv._internal_kv_put(self.prefix + _PROCESS, body, overwrite=True)

    def get(self) -> dict[str, dict[str, int]]:
        """{stage: {name: count}} over every process."""
        from ray.experimental import internal_kv as kv
        out: dict[str, dict[str, int]] = {}
        for key in kv._internal_kv_list(self.prefix):
            raw = kv._internal_kv_get(key)
            for stage, c in (json.loads(raw) if raw else {}).items():
                o = out.setdefault(stage, {})
                for k, v in c.items():
                    o[k] = o.get(k, 0) + int(v)
        return out

    def close(self) -> None:
        """Remove the counts (a cluster's GCS outlives the build)."""
        from ray.experimental import internal_kv as kv
        try:
            kv._internal_kv_del(self.prefix, del_by_prefix=True)
        except Exception:  # Ray already stopped: nothing is left to remove
            pass
