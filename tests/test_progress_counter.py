"""The Ray build's progress counter (``jobs/progress_counter.py``) on a real local Ray: counts
added in worker processes (tasks and an actor, several adds each, a process reused by
several tasks) and in the driver add up; a read right after an add sees it; ``close``
removes them, and another build's counts are its own. (The Ray actor it replaces was a
process of its own, ~155 MiB at 1M documents.)"""

from __future__ import annotations

import os


def test_counts_from_tasks_an_actor_and_the_driver_add_up(ray_session):
    import ray

    from funnel.jobs.progress_counter import ProgressCounter

    c = ProgressCounter("test-sum")

    @ray.remote(num_cpus=0.5)
    def chunk(counter, n):
        for _ in range(n):
            counter.add("read", chunks=1, docs=10)
        return os.getpid()

    @ray.remote(num_cpus=0)
    class Embedder:
        def __init__(self, counter):
            self.counter = counter

        def batch(self, n):
            self.counter.add("embed", vectors=n, cached=1)
            return os.getpid()

    pids = ray.get([chunk.remote(c, n) for n in (1, 2, 3, 4, 5, 6)])
    e = Embedder.remote(c)
    ray.get([e.batch.remote(7), e.batch.remote(8)])
    c.add("read", rejects=2)
    got = c.get()
    assert got == {"read": {"chunks": 21, "docs": 210, "rejects": 2}, "embed": {"vectors": 15, "cached": 2}}
    assert os.getpid() not in pids  # the tasks ran in worker processes
    other = ProgressCounter("test-other")
    other.add("read", docs=1)
    assert other.get() == {"read": {"docs": 1}}  # builds never mix
    c.close()
    assert c.get() == {} and other.get() == {"read": {"docs": 1}}
    other.close()
    ray.kill(e)
