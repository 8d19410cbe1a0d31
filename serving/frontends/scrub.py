"""Background scrub: a long-running server re-hashes the files it serves, and stops serving
a version whose bytes no longer match its manifest.

The default open (``verify="cached"``) hashes a file only where its stat changed since this
host last hashed it. Decay below the file system (a bad sector, a flipped bit on a disk or
in a copy) leaves the stat as it was, so it goes unseen at open and the server answers
from damaged arrays: wrong rankings, wrong ids. Storage engines answer this with
checksums re-read in the background (a ZFS scrub, Ceph's deep scrub); so does this.

`Scrubber` hashes every file of the served version against the sha256 its manifest
(the copy opened, in memory) records, and checks the manifest on disk against its own
checksum; reads are paced to a byte budget (``rate_mb_s``, MiB/s) so a pass costs a
bounded share of the disk and of one core. ``run_once()`` is one pass, synchronous (tests
call it directly). On a mismatch, an unreadable, missing or resized file it

1. forgets this host's record of the file (``pipelines.store.artifacts`` stamps), so the next
   cached open on this host hashes it again and refuses the version, a restart included;
2. calls ``VersionFollower.quarantine``: searches are refused at once (HTTP 503), then the
   newest older version that passes a full verification is served, with ``/health``
   "degraded" naming the damaged version, file and reason; with none, the server stays
   "unavailable" (503) until a good version is published;
3. logs the failure (ERROR).

It reads through the page cache, so it checks what the server itself would read from the
file; a page damaged on disk is seen once the cache no longer holds the good copy. A query
can find such damage first (a value no sound index holds, ``IndexVersion.damaged``): that
takes the same three steps at once.

`ScrubThread` runs a pass every ``interval_s`` seconds (measured from the end of
one pass to the start of the next; the first ``first_delay_s`` after the server starts,
so it never competes with the warm-up) on a daemon thread at the lowest CPU priority
(per-thread nice 19 on Linux). ``funnel serve`` and ``funnel mcp`` start one
(``--scrub-interval``, ``--scrub-rate``); ``--scrub-interval 0`` turns it off.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from funnel.pipelines.store.artifacts import MANIFEST, IndexFormatError, load_manifest

from ..index import IndexVersion, VersionFollower, forget_verification

log = logging.getLogger(__name__)

#: Seconds from the end of one pass to the start of the next (``--scrub-interval``): with the
#: default rate a pass over 1M synthetic documents (1.6 GB) takes minutes, so every file is
#: re-read about four times a day; an index up to ~170 GB still gets a pass at least twice a day.
DEFAULT_INTERVAL_S = 6 * 3600.0
#: Read budget in MiB/s (``--scrub-rate``): a small share of a disk's bandwidth, and about one
#: percent of one core for sha256.
DEFAULT_RATE_MB_S = 8.0
#: Seconds after the server starts before the first pass.
FIRST_DELAY_S = 60.0
#: Bytes read per step; the pacing sleeps between steps.
CHUNK = 1 << 20


@dataclass(frozen=True)
class ScrubConfig:
    """How often and how fast to scrub; validated here, once, at the boundary (CLI, API)."""

    interval_s: float = DEFAULT_INTERVAL_S
    rate_mb_s: float = DEFAULT_RATE_MB_S
    first_delay_s: float = FIRST_DELAY_S

    def __post_init__(self):
        for name, v, lo in (("interval_s", self.interval_s, 0.0), ("rate_mb_s", self.rate_mb_s, None),
                            ("first_delay_s", self.first_delay_s, 0.0)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 \
                    or (lo is None and v <= 0):
                want = "a finite number above 0" if lo is None else "a finite number, 0 or more"
                flag = {"interval_s": "--scrub-interval SECONDS (0 turns the scrub off)",
                        "rate_mb_s": "--scrub-rate MB/s"}.get(name, name)
                raise ValueError(f"scrub {name} must be {want}, got {v!r}: set {flag}")

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0


@dataclass(frozen=True)
class ScrubResult:
    """One pass: the version it covered (None: nothing was served), the files and bytes
    it hashed, wall and CPU seconds (this thread's), the damaged file (relative) and why,
    and whether it covered every file (False: stopped, or the served version changed)."""

    version: str | None
    files: int
    bytes: int
    seconds: float
    cpu_seconds: float
    damaged: str | None = None
    reason: str | None = None
    complete: bool = True


def _index_of(served) -> IndexVersion:
    """The IndexVersion behind what a follower serves (an IndexVersion or a VersionSearcher)."""
    return served if isinstance(served, IndexVersion) else served.index


class Scrubber:
    """Re-hashes the version ``follower`` serves, paced to ``rate_mb_s`` (module docstring).

    ``clock`` and ``sleep`` (default: a wait that `stop` interrupts) are what the
    pacing reads and calls; tests pass their own.
    """

    def __init__(self, follower: VersionFollower, rate_mb_s: float = DEFAULT_RATE_MB_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] | None = None):
        ScrubConfig(rate_mb_s=rate_mb_s)  # the same check as the CLI's
        self.follower = follower
        self.rate = rate_mb_s * 2 ** 20
        self._clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self.last: ScrubResult | None = None

    def stop(self) -> None:
        """End the pass under way at its next step; later passes return at once."""
        self._stop.set()

    def _still_served(self, fdir: str) -> bool:
        got = self.follower.serving()
        return got is not None and got[0] == fdir

    def run_once(self) -> ScrubResult:
        """One pass over the served version's files; see the module docstring."""
        t0, c0 = self._clock(), time.thread_time()
        got = self.follower.serving()
        if got is None:
            return ScrubResult(None, 0, 0, 0.0, 0.0, complete=False)
        fdir, served = got
        ix = _index_of(served)
        files = ix.manifest.get("files") or {}
        paced = _Pacer(self.rate, self._clock, self._sleep, self._stop)
        n = 0
        damaged = reason = None
        for rel, meta in sorted(files.items()):
            if self._stop.is_set() or not self._still_served(fdir):
                break
            reason = _file_problem(os.path.join(ix.dir, rel), meta, paced)
            if reason is not None:
                damaged = rel
                break
            if self._stop.is_set():  # stopped inside this file
                break
            n += 1
        else:
            try:  # the manifest on disk: its own checksum, and the files it lists are the ones served
                if load_manifest(ix.dir).get("files") != files:
                    damaged, reason = MANIFEST, f"{MANIFEST} lists other files than when the version was opened"
            except IndexFormatError as e:
                damaged, reason = MANIFEST, f"fails its check ({e})"
        complete = damaged is None and n == len(files)
        if damaged is not None and not self._stop.is_set() and self._still_served(fdir):
            self._report(fdir, ix, damaged, reason)
        elif damaged is not None:  # stopped, or no longer served: a pass over it again decides
            damaged = reason = None
        res = ScrubResult(ix.version, n, paced.done, self._clock() - t0, time.thread_time() - c0,
                          damaged, reason, complete)
        if complete:
            log.info("scrub of %s: %d files, %.1f MiB matched their checksums in %.1fs", ix.version, n,
                     paced.done / 2 ** 20, res.seconds)
        self.last = res
        return res

    def _report(self, fdir: str, ix: IndexVersion, rel: str, reason: str) -> None:
        log.error("scrub: %s/%s is damaged: %s", ix.dir, rel, reason)
        forget_verification(ix.dir, rel)  # the next cached open on this host hashes it (and refuses the version)
        self.follower.quarantine(fdir, rel, f"{rel} {reason} (found by the background scrub)")


class _Pacer:
    """Sleeps so that bytes read stay within ``rate`` per second since the pass began."""

    def __init__(self, rate: float, clock, sleep, stop: threading.Event):
        self.rate, self.clock, self.sleep, self.stop = rate, clock, sleep, stop
        self.t0 = clock()
        self.done = 0

    def __call__(self, n: int) -> None:
        self.done += n
        ahead = self.done / self.rate - (self.clock() - self.t0)
        if ahead > 0:
            self.sleep(ahead)


def _file_problem(path: str, meta: dict, paced: _Pacer) -> str | None:
    """Why the file at ``path`` does not match ``meta`` (size, sha256), or None."""
    h = hashlib.sha256()
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size != meta.get("size"):
                return f"has {size} bytes, the manifest says {meta.get('size')}"
            while True:
                if paced.stop.is_set():
                    return None
                b = f.read(CHUNK)
                if not b:
                    break
                h.update(b)
                paced(len(b))
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if h.hexdigest() != meta.get("sha256"):
        return "does not match its sha256 in the manifest (damaged on disk since it was published)"
    return None


class ScrubThread:
    """Runs ``scrubber.run_once()`` every ``interval_s`` on a low-priority daemon thread."""

    def __init__(self, scrubber: Scrubber, interval_s: float = DEFAULT_INTERVAL_S,
                 first_delay_s: float = FIRST_DELAY_S):
        ScrubConfig(interval_s=interval_s, first_delay_s=first_delay_s)
        self.scrubber = scrubber
        self.interval_s = interval_s
        self.first_delay_s = first_delay_s
        self._thread = threading.Thread(target=self._run, name="funnel-scrub", daemon=True)

    def start(self) -> "ScrubThread":
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop (the pass under way ends at its next step) and wait for the thread."""
        self.scrubber.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:  # Linux: a thread is a task with its own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        stop = self.scrubber._stop
        if stop.wait(self.first_delay_s):
            return
        while not stop.is_set():
            try:
                self.scrubber.run_once()
            except Exception:  # noqa: BLE001 - a scrub bug must not take the server down
                log.exception("scrub pass failed; the next one runs in %.0fs", self.interval_s)
            if stop.wait(self.interval_s):
                return


def start_scrub(follower: VersionFollower, config: ScrubConfig | None) -> ScrubThread | None:
    """A started `ScrubThread` for ``config``; None when it is off (interval 0)."""
    config = config or ScrubConfig()
    if not config.enabled:
        log.info("background scrub off (--scrub-interval 0): damage that leaves a file's stat unchanged "
                 "is not seen until `funnel verify`")
        return None
    log.info("background scrub: a pass every %.0fs at %.1f MiB/s", config.interval_s, config.rate_mb_s)
    return ScrubThread(Scrubber(follower, config.rate_mb_s), config.interval_s, config.first_delay_s).start()
