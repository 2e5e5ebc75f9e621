"""Threads under shared cores (issue 14, item 5): the thread governor (engine/governor.py) and OpenMP's waiting
(engine/openmp_env.py). No timing is asserted: the governor's decisions are checked on step times given to
it, and everything it relies on (the same bits at any thread count, the count put back after each step, the
CLI reporting it) on the real model."""
import subprocess
import sys
from pathlib import Path

import threading

import pytest
import torch

from engine import SamplingParams, compute, governor
from engine.governor import GOVERNOR, MAX_INTERVAL_S, MIN_INTERVAL_S, PROBE_STEPS, Governor
from engine.model import KVStorage, SeqInput

ROOT = Path(__file__).resolve().parent.parent


needs_setter = pytest.mark.skipif(governor._SET_THREADS is None,
                                  reason="this torch build does not export per-thread OpenMP/MKL thread counts")


def new_thread_count() -> int:
    """torch's thread count on a thread that calls torch for the first time."""
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


@pytest.fixture
def two_threads():
    """The compute thread's maximum at 2 for the test (the governor rests at 1), restored after."""
    before = compute.THREADS
    compute.set_threads(2)
    yield
    compute.set_threads(before)


class Steps:
    """Feeds a Governor decode steps of given durations on the compute thread, with a clock that advances by
    each step's duration; returns the thread count each step ran at."""

    def __init__(self):
        self.now = 0.0
        self.gov = Governor(clock=lambda: self.now)
        self.model = object()

    def run(self, seconds: list[float], batch: int = 1) -> list[int]:
        def go():
            ran = []
            for s in seconds:
                self.gov.before(self.model, batch)
                ran.append(torch.get_num_threads())
                self.gov.after(self.model, batch, s)
                self.gov.restore()
                assert torch.get_num_threads() == compute.THREADS  # the rest of the engine's work is untouched
                self.now += s
            return ran
        return compute.run(go)


@needs_setter
def test_a_probe_that_loses_keeps_the_count_and_waits_longer(two_threads):
    st = Steps()
    ran = st.run([0.040] * PROBE_STEPS + [0.090])  # the probe's first step at 1 thread: clearly slower
    assert ran == [2] * PROBE_STEPS + [1]
    assert st.gov.current == 2 and st.gov.probes == 1 and st.gov.last_probe["won"] is False
    assert st.gov.interval == 2 * MIN_INTERVAL_S
    assert st.run([0.040] * 40) == [2] * 40  # 1.6 s: within the doubled wait, no probe
    for _ in range(8):  # every lost probe doubles the wait, up to the cap
        st.now += st.gov.interval
        st.run([0.040, 0.090])
    assert st.gov.interval == MAX_INTERVAL_S


@needs_setter
def test_a_probe_that_wins_switches_and_a_slowdown_brings_the_next_one_soon(two_threads):
    st = Steps()
    st.run([0.040] * PROBE_STEPS)
    ran = st.run([0.030, 0.025, 0.025])  # 1 thread: clearly faster (the first step is not judged)
    assert ran == [1, 1, 1] and st.gov.current == 1 and st.gov.switches == 1
    # switching the compute thread's count leaves the count other threads start with at 1 (engine/compute.py)
    assert new_thread_count() == 1
    assert st.run([0.025] * 3) == [1, 1, 1]  # within the wait after a switch: no probe
    st.now += MIN_INTERVAL_S
    ran = st.run([0.024] * 3 + [0.025] * 2)  # the probe at 2 threads is not faster enough: stay at 1
    assert ran == [2, 2, 2, 1, 1] and st.gov.current == 1 and st.gov.last_probe["won"] is False
    wait = st.gov.next_probe - st.now
    assert wait > MIN_INTERVAL_S
    st.run([0.080] * 3)  # the machine got busy: 1 thread slowed 3x; the next probe comes after the short wait
    assert st.gov.next_probe - st.now <= MIN_INTERVAL_S < wait


@needs_setter
def test_steps_of_another_batch_size_do_not_compare(two_threads):
    st = Steps()
    st.run([0.040] * PROBE_STEPS)
    assert st.run([0.040]) == [1]  # a probe began at batch 1...
    assert st.run([0.200], batch=8) == [2]  # ...a batch of 8 ends it unjudged and runs at the current count
    assert st.gov.last_probe is None and st.gov.current == 2


@needs_setter
def test_one_models_probes_do_not_move_anothers_count(two_threads):
    """Two models in one process (a bench timing every format, a drafter and its target): each keeps its own
    count."""
    st, other = Steps(), Steps()
    other.gov, other.now = st.gov, st.now
    st.run([0.040] * PROBE_STEPS)
    assert st.run([0.030, 0.025, 0.025]) == [1, 1, 1]  # the first model is faster on 1 thread
    other.now = st.now
    assert other.run([0.010] * 5) == [2] * 5  # the second still runs on 2: nothing was measured for it
    assert st.run([0.025]) == [1]


def test_off_and_at_one_thread_the_governor_does_nothing(two_threads):
    st = Steps()
    st.gov.enabled = False
    assert st.run([0.040] * 10) == [2] * 10 and st.gov.probes == 0
    st.gov.enabled = True
    compute.set_threads(1)
    assert st.run([0.040] * 10) == [1] * 10 and st.gov.probes == 0


def _steps(model):
    """Logits of a prefill, two single decodes and a batched decode of 3, and the K/V they wrote."""
    kv = KVStorage(model.spec, 16, 16, model.dtype, model.device)
    slots = [torch.arange(i * 64, i * 64 + 64) for i in range(3)]
    out = [model.forward([SeqInput(list(range(100, 140)), 0, slots[0][:40]),
                          SeqInput(list(range(300, 310)), 0, slots[1][:10]),
                          SeqInput(list(range(500, 505)), 0, slots[2][:5])], kv)[0]]
    out.append(model.forward([SeqInput([7], 40, slots[0][:41])], kv)[0])
    out.append(model.forward([SeqInput([8], 41, slots[0][:42])], kv)[0])
    out.append(model.forward([SeqInput([9], 42, slots[0][:43]), SeqInput([9], 10, slots[1][:11]),
                              SeqInput([9], 5, slots[2][:6])], kv)[0])
    return out + [kv.k, kv.v]


def test_the_thread_count_does_not_change_the_bits(base_engine, two_threads):
    """What lets the governor switch counts between steps: the same logits and K/V at 1 and 2 threads, prefill
    and decode (the governor is off here, so each run keeps its count)."""
    from engine import governor

    governor.set_enabled(False)
    try:
        runs = []
        for n in (1, 2):
            compute.set_threads(n)
            runs.append(compute.run(_steps, base_engine.model))
    finally:
        governor.set_enabled(True)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@needs_setter
def test_the_engine_runs_its_decode_steps_through_the_governor(engine, two_threads):
    """Engine.generate's decode steps are timed by the process's governor (its window for this model and batch
    size fills), the compute thread is back at compute.THREADS after them, and the greedy text is the text
    of the same request with the governor off."""
    texts = []
    for on in (True, False):
        from engine import governor

        governor.set_enabled(on)
        try:
            texts.append(engine.generate("What is gravity?", SamplingParams(max_tokens=12, temperature=0.0)).text)
        finally:
            governor.set_enabled(True)
    assert texts[0] == texts[1] and texts[0]
    seen = compute.run(lambda: {k for (k, _threads) in GOVERNOR.steps})
    assert (id(engine.model), 1) in seen
    assert compute.run(torch.get_num_threads) == compute.THREADS
    assert new_thread_count() == 1


def test_set_threads_leaves_other_threads_single(two_threads):
    """compute.set_threads changes the compute thread's count only: a thread that first calls torch afterwards
    still starts with 1 (torch.set_num_threads alone would have made it 2)."""
    assert compute.run(torch.get_num_threads) == 2
    assert new_thread_count() == 1


def test_the_cli_sets_the_spin_count_and_reports_the_threads():
    """`python -m engine --stats` imports the engine before torch, so the short OpenMP spin applies (an
    environment that chose its own keeps it), and the last line says what the governor decided."""
    cmd = [sys.executable, "-m", "engine", "What is gravity?", "--temperature", "0", "--max-tokens", "6", "--stats"]
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("[decode threads: ") and "OpenMP: GOMP_SPINCOUNT=1000 (set by the engine)" in line
    out = subprocess.run(cmd, cwd=ROOT, env=env | {"OMP_WAIT_POLICY": "PASSIVE"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "OpenMP: OMP_WAIT_POLICY=PASSIVE (set by the environment)" in out.stderr
