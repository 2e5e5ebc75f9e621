"""The thread governor: decode steps run on as many threads as pay *now*, measured, not assumed.

Why: torch's CPU kernels split each op over an OpenMP team, and every parallel region ends at a barrier where
the team waits for its slowest thread; a decode step runs hundreds of such regions. On a quiet 2-core machine both
threads run and 2 threads beat 1. When other processes compete for the cores, a team member is kept off its
core for a time slice at a time and every region waits for it; with OpenMP's default spinning the waiting
thread also burns the slice its partner needs, and a step collapses (136 ms with 1 thread against 2,099 ms with
2 at a load average of 10-12, issue 14). engine/openmp_env.py shortens the spinning, which removes most of the
collapse; whether 2 threads then beat 1 depends on the load of the moment (measured here: 0.4x to 1.8x the
1-thread step), and where torch was imported before the engine the default spinning stays. One thread has no
barrier to wait at, so the answer is measured, continuously.

So the governor times the uninstrumented decode steps (engine/model.py calls `before` and `after` around
them, and `restore` puts compute.THREADS back after each) and now and then runs a few steps at the other
thread count (1 or the configured maximum, compute.THREADS), keeping whichever is faster. A probe is cheap
and bounded: at most PROBE_STEPS steps, cut short after one step that is clearly slower; a lost probe doubles
the wait before the next (MIN_INTERVAL_S up to MAX_INTERVAL_S), a won one or a sudden slowdown of the current
count resets it. Steps are compared only
with steps of the same batch size (a 20-sequence decode costs more than a single one). The thread count does
not change the results: torch's kernels here give the same bits with 1 or 2 threads (tests/test_threads.py).

Only the compute thread (engine/compute.py) sets thread counts, so the governor needs no lock. `describe()`
says what it decided and why (`python -m engine ... --stats` prints it).
"""
from __future__ import annotations

import contextlib
import ctypes
import statistics
import time
from collections import deque

import torch

from . import compute, openmp_env

PROBE_STEPS = 3  # steps at the other thread count per probe (the first of them pays for waking the team)
WINDOW = 8  # recent steps per (batch size, thread count) kept for comparison
MIN_INTERVAL_S = 1.0  # first wait between probes, and after a switch or a slowdown
MAX_INTERVAL_S = 16.0  # the longest wait after lost probes: a lost probe then costs ~1 % of the time
WIN = 0.85  # a probe switches only when its median is below this fraction of the current median
CLEAR_LOSS = 1.5  # a probe step above this multiple of the current median ends the probe at once
SLOWDOWN = 1.5  # the current count's last steps this much slower than at the last decision: probe soon


def _thread_setter():
    """A function that sets the calling thread's OpenMP and MKL thread counts, or None where this build does not
    export them. Not torch.set_num_threads: that also changes the count every thread that first calls torch
    later starts with, which engine/compute.py keeps at 1 for threads other than the compute thread."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = [line.split()[-1] for line in maps if line.rstrip().endswith((".so", ".so.1"))]
        gomp = next(p for p in loaded if "/libgomp" in p)
        cpu = next(p for p in loaded if p.endswith("/libtorch_cpu.so"))
        # MKL_Set_Num_Threads_Local is the C entry; mkl_set_num_threads_local is Fortran's here (it takes a pointer)
        omp_set, mkl_set = ctypes.CDLL(gomp).omp_set_num_threads, ctypes.CDLL(cpu).MKL_Set_Num_Threads_Local
    except (OSError, StopIteration, AttributeError):  # not Linux, another OpenMP, no MKL
        return None
    omp_set.argtypes = mkl_set.argtypes = [ctypes.c_int]

    def set_threads(n: int) -> None:
        omp_set(n)  # what torch.set_num_threads does for the calling thread, without the global default
        mkl_set(n)
    return set_threads


_SET_THREADS = _thread_setter()


class Governor:
    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.enabled = _SET_THREADS is not None  # off where the thread count cannot be set per thread
        self.ceiling = 0  # compute.THREADS when last seen; after a change (set_threads) it probes at once
        # (model, batch bucket) -> its thread count: models differ (the lab's q4 kernels gain from 2 threads
        # where fp32's oneDNN ones may not), so one model's probes do not move another's count
        self.choice: dict[tuple, int] = {}
        self.last_key: tuple | None = None
        self.steps: dict[tuple, deque] = {}  # (key, threads) -> recent step seconds
        self.interval = MIN_INTERVAL_S
        self.next_probe = 0.0  # clock() time
        self.probe: tuple[int, tuple, list[float]] | None = None  # (threads, key, step seconds)
        # key: (model, batch bucket) -> the current count's median at the last decision
        self.baseline: dict[tuple, float] = {}
        self.probes = self.switches = 0
        self.last_probe: dict | None = None

    def _ceiling_changed(self) -> None:
        """compute.set_threads changed the maximum: keep what was measured (per thread count), look again now."""
        self.ceiling = compute.THREADS
        if self.ceiling > 1:  # at 1 the governor rests: its last choices stay for when the maximum returns
            self.choice = {key: min(n, self.ceiling) for key, n in self.choice.items()}
        self.probe = None
        self.next_probe = self.clock()

    def before(self, model: object, batch: int) -> None:
        """Called on the compute thread before an uninstrumented decode step of `model` over `batch` sequences:
        sets the thread count the step runs at. (A drafter's steps are not compared with its target's.)"""
        if compute.THREADS != self.ceiling:
            self._ceiling_changed()
        if not self.enabled or self.ceiling <= 1:
            return
        key = self.last_key = (id(model), _bucket(batch))
        if self.probe is not None and self.probe[1] != key:
            self.probe = None  # another batch size or model: its steps do not compare; try again later
        current = self._current(key)
        if self.probe is None and self.clock() >= self.next_probe \
                and len(self.steps.get((key, current), ())) >= PROBE_STEPS:
            other = 1 if current > 1 else self.ceiling
            self.probe = (other, key, [])
            self.probes += 1
        want = self.probe[0] if self.probe is not None else current
        if torch.get_num_threads() != want:
            _SET_THREADS(want)

    def after(self, model: object, batch: int, seconds: float) -> None:
        """Called after that step with its wall time."""
        if not self.enabled or self.ceiling <= 1:
            return
        key = (id(model), _bucket(batch))
        threads = torch.get_num_threads()
        self.steps.setdefault((key, threads), deque(maxlen=WINDOW)).append(seconds)
        mine = self.steps.get((key, self._current(key)))
        if self.probe is None:
            if mine and len(mine) >= 3 and key in self.baseline:
                recent = sorted((mine[-1], mine[-2], mine[-3]))[1]  # the last three's median, every step: cheaply
                if recent > SLOWDOWN * self.baseline[key]:
                    self._wait(MIN_INTERVAL_S)  # the machine changed under us: look again soon
                    self.baseline[key] = recent
            return
        other, _, times = self.probe
        times.append(seconds)
        ref = statistics.median(mine)
        if seconds > CLEAR_LOSS * ref or len(times) >= PROBE_STEPS:
            self._decide(key, other, times, ref)

    def restore(self) -> None:
        """After the step: the compute thread's count back to compute.THREADS, so the rest of the engine's work
        (sampling, instrumented forwards) runs as it did without the governor."""
        if self.enabled and torch.get_num_threads() != compute.THREADS:
            _SET_THREADS(compute.THREADS)

    def _decide(self, key: tuple, other: int, times: list[float], ref: float) -> None:
        # the probe's first step wakes (or dismisses) a team: judged alone only when it is clearly slower
        probe = statistics.median(times[1:] if len(times) > 1 else times)
        won = probe < WIN * ref
        self.last_probe = {"threads": other, "probe_ms": round(probe * 1e3, 2),
                           "current_threads": self._current(key), "current_ms": round(ref * 1e3, 2), "won": won}
        self.probe = None
        if won:
            self.choice[key] = other
            self.switches += 1
            self.baseline[key] = probe
            self._wait(MIN_INTERVAL_S)
        else:
            self.baseline[key] = ref
            self._wait(min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, self.interval * 2)))

    def _current(self, key: tuple) -> int:
        return self.choice.get(key, self.ceiling)

    @property
    def current(self) -> int:
        """The thread count of the last step's model and batch size (the configured maximum before any step)."""
        return self._current(self.last_key) if self.last_key is not None else (self.ceiling or compute.THREADS)

    def _wait(self, interval: float) -> None:
        self.interval = interval
        self.next_probe = self.clock() + interval

    def describe(self) -> dict:
        """What the governor runs now and the evidence: its last probe, the recent median per thread count."""
        order = sorted(self.steps.items(), key=lambda item: (item[0][0][1], item[0][1]))  # batch, threads
        medians = {f"{threads} threads, batch <= {key[1]}": round(statistics.median(ts) * 1e3, 2)
                   for (key, threads), ts in order if ts}
        return {"enabled": self.enabled, "openmp": openmp_env.SETTING, "threads": self.current,
                "max_threads": compute.THREADS, "probes": self.probes, "switches": self.switches,
                "probe_wait_s": round(self.interval, 1), "last_probe": self.last_probe, "recent_step_ms": medians}


def _bucket(batch: int) -> int:
    """Batch sizes compared together: 1, 2, 3-4, 5-8, ... (a power of two at the top of each)."""
    return 1 << max(0, batch - 1).bit_length()


GOVERNOR = Governor()


@contextlib.contextmanager
def one_thread():
    """The calling thread's torch ops on one thread for the block (then its count as before). For sampling: its
    ops are small (a vocabulary-sized vector), and on 2 threads each parallel region first wakes a sleeping team
    member: a sum over 49,152 logits took 180 us, ~10x its work; a decode step's sampling took ~1 ms."""
    before = torch.get_num_threads()
    if _SET_THREADS is None or before == 1:
        yield
        return
    _SET_THREADS(1)
    try:
        yield
    finally:
        _SET_THREADS(before)


def set_enabled(on: bool) -> None:
    """Turn the governor off (every step then runs on compute.THREADS threads) or back on (it keeps what it
    measured before)."""
    def apply():
        GOVERNOR.enabled = bool(on) and _SET_THREADS is not None
        GOVERNOR.probe = None
    compute.run(apply)
