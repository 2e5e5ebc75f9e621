"""Decode speed by wall clock, like with like: our engine in each weight format against transformers'
`generate` on the same weights (and llama.cpp on the same GGUF when llama-cpp-python is installed).

    python bench/decode.py [--tokens 64] [--rounds 5] [--formats fp32,bf16,int8,q4] [--threads N] [--busy N]

What is timed: the wall clock of each contender's public API, per generated token, greedy, batch 1, the same
prompt ids, the same thread count. Per-token decode time = (time to generate 1 + N tokens - time to generate 1
token) / N, so the prompt's prefill cancels out; both runs start from an empty cache (our engine: a fresh
session with prefix caching off). Contenders run interleaved, round after round, so machine noise hits them
alike; reported: min and median over rounds, and ratios of medians against transformers fp32.

Also printed per format: the bytes a decode step reads (weights + KV), the floor they set at this machine's
measured memory bandwidth, and the fraction of that floor our step reaches (issue 14 asks >= 70 %). The bandwidth
is measured just before each of our contenders' runs, in every round: "of floor" is the median over rounds of
that round's floor / that round's step (a host whose speed drifts over tens of seconds moves both alike; the
steps' and bandwidths' medians compared with each other are printed as "medians"), and the best of seven passes
after the rounds gives "at best bw" (a peak: on these shared hosts it moves 28-58 GB/s). These machines are
noisy: read the ratios from one run, not absolute times.

--busy N: the same, with N busy processes beside us for the whole run (`python -c "while True: pass"`: each
wants a core all the time, as another tenant's CPU-bound work would; a matmul loop would also take memory
bandwidth, which moves the floor we compare with, so it mixes two effects). The contenders become: ours as
shipped (the thread governor, engine/governor.py), ours on 1 thread, ours on every thread with the governor
off (the collapse it prevents: its steps take seconds, so it runs only --busy-tokens tokens) and transformers.
Issue 14 asks ours <= 1.5x ours-on-1-thread in these conditions.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import Engine, SamplingParams, compute, governor  # noqa: E402  (before torch: engine/openmp_env.py)
import torch  # noqa: E402
from engine.kernels import FORMATS  # noqa: E402
from engine.metrics import measure_bandwidth  # noqa: E402

PROMPT = "Что такое гравитация? Explain it step by step."


def ours(eng: Engine, ids: list[int], n: int) -> float:
    """Seconds to generate n tokens from PROMPT (whose chat-template ids are `ids`) through Engine.generate."""
    sess = eng.session(enable_prefix_caching=False, kv_memory=32 << 20)
    t = time.perf_counter()
    sess.generate(PROMPT, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return time.perf_counter() - t


def transformers_run(hf, ids: list[int], n: int) -> float:
    x = torch.tensor([ids])
    with torch.inference_mode():
        t = time.perf_counter()
        hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, temperature=None, top_p=None,
                    top_k=None)
        return time.perf_counter() - t


def llama_cpp_run(llm, ids: list[int], n: int) -> float:
    llm.reset()  # an empty cache, as for the others
    t = time.perf_counter()
    for i, _ in enumerate(llm.generate(ids, top_k=1, temp=0.0, reset=True)):  # greedy; eos does not stop a generator
        if i + 1 >= n:
            break
    return time.perf_counter() - t


def load_llama_cpp(gguf: Path | None, threads: int):
    """(Llama or None, why not)."""
    if gguf is None:
        return None, "the model was not loaded from a GGUF file"
    try:
        from llama_cpp import Llama
    except ImportError:
        return None, "llama-cpp-python is not installed (pip install llama-cpp-python; it builds from source)"
    # use_extra_bufts=False: ggml's AMX Q4_1 path crashed with an illegal instruction on this CPU (DESIGN.md)
    return Llama(model_path=str(gguf), n_threads=threads, n_ctx=512, verbose=False, use_extra_bufts=False), ""


def per_token(run, ctx, ids: list[int], n: int) -> float:
    """ms per decode token by wall clock: (1 + n tokens) minus 1 token, prefill cancelled."""
    return (compute.run(run, ctx, ids, n + 1) - compute.run(run, ctx, ids, 1)) / n * 1e3


@contextlib.contextmanager
def busy_processes(n: int):
    """n processes that each spin a core until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def pinned(threads: int | None, governed: bool):
    """A contender's setting: the compute thread's maximum (None: as configured) and the governor on or off."""
    def apply(ceiling: int):
        compute.set_threads(threads or ceiling)
        governor.set_enabled(governed)
    return apply


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--threads", type=int, default=0, help="torch (and llama.cpp) threads; 0: torch's default")
    ap.add_argument("--busy", type=int, default=0, help="N busy background processes for the whole run")
    ap.add_argument("--busy-tokens", type=int, default=4,
                    help="tokens per round for the ungoverned contender under --busy (its steps take seconds)")
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if args.threads:
        compute.set_threads(args.threads)
    ceiling = compute.THREADS
    torch.manual_seed(0)

    engines = {f: Engine.from_pretrained("bundled", weights=f) for f in formats}
    ref = next(iter(engines.values()))
    from transformers import AutoModelForCausalLM

    # the reference runs on the compute thread too (engine/compute.py: one OpenMP team, the same threads)
    hf = compute.run(lambda: AutoModelForCausalLM.from_pretrained(str(ref.loaded.source_dir),
                                                                  dtype=torch.float32).eval())
    llm, why = load_llama_cpp(ref.loaded.gguf, ceiling)
    ids = ref.encode(PROMPT).token_ids
    # name -> (run, its context, setting, tokens per round)
    as_shipped = pinned(None, True)
    contenders = {f"ours {f}": (ours, e, as_shipped, args.tokens) for f, e in engines.items()}
    if args.busy:
        for f, e in engines.items():
            contenders[f"ours {f}, 1 thread"] = (ours, e, pinned(1, True), args.tokens)
            if ceiling > 1:
                contenders[f"ours {f}, {ceiling}t no governor"] = (ours, e, pinned(None, False), args.busy_tokens)
    contenders["transformers fp32"] = (transformers_run, hf, as_shipped, args.tokens)
    if llm is not None:
        contenders["llama.cpp Q4_1"] = (llama_cpp_run, llm, as_shipped, args.tokens)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with busy_processes(args.busy) if args.busy else contextlib.nullcontext():
        for run, ctx, setting, _ in contenders.values():  # warm-up: first calls allocate, pack and page in
            setting(ceiling)
            per_token(run, ctx, ids, 4)
        buffer = torch.ones(512 << 18)  # 512 MB, far larger than any cache
        bws: dict[str, list[float]] = {name: [] for name in contenders if name.startswith("ours")}
        for _ in range(args.rounds):
            for name, (run, ctx, setting, n) in contenders.items():
                if name in bws:  # on every thread, as shipped: the machine's bandwidth now, not a 1-thread sum's
                    as_shipped(ceiling)
                    bws[name].append(compute.run(round_bandwidth, buffer))
                setting(ceiling)
                times[name].append(per_token(run, ctx, ids, n))
        as_shipped(ceiling)
        threads_now = compute.run(governor.GOVERNOR.describe)
        del buffer

    peak = measure_bandwidth("cpu")
    report(args, engines, ids, times, bws, peak, ceiling)
    print(f"thread governor at the end: {threads_now}")
    if llm is None:
        print(f"llama.cpp: skipped ({why})")
    print("kernels (measured at load):")
    for f, e in engines.items():
        print(f"  {f}: " + "; ".join(f"{k} {v['single']}" for k, v in e.model.kernels().items()))


def round_bandwidth(buffer: torch.Tensor) -> float:
    """Read bandwidth now, bytes/s: the median of three sums over `buffer` (like the steps, a median; the best of
    seven at one moment, `measure_bandwidth`, catches the host's quiet instants: 28-58 GB/s on the same machine
    within an hour)."""
    passes = []
    for _ in range(3):
        t = time.perf_counter()
        buffer.sum()
        passes.append(time.perf_counter() - t)
    return buffer.numel() * 4 / statistics.median(passes)


def report(args, engines: dict, ids: list[int], times: dict[str, list[float]], bws: dict[str, list[float]],
           peak: float, ceiling: int) -> None:
    base = statistics.median(times["transformers fp32"])
    bw = statistics.median(b for runs in bws.values() for b in runs)
    print(f"model: {next(iter(engines.values())).model_id}; prompt {len(ids)} tokens; {args.tokens} decode tokens "
          f"x {args.rounds} rounds; threads {ceiling}; busy processes {args.busy}; memory bandwidth "
          f"{bw / 1e9:.1f} GB/s (median of those measured before our runs{', beside the busy processes' if args.busy else ''}; "
          f"best of seven after the rounds{', without them' if args.busy else ''}: {peak / 1e9:.1f})")
    print(f"{'contender':28s} {'min ms/tok':>10s} {'median':>8s} {'tok/s':>7s} {'vs transformers':>16s} "
          f"{'vs ours 1t':>10s} {'MB/step':>8s} {'floor ms':>9s} {'of floor':>9s} {'medians':>8s} {'at best bw':>10s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        row = f"{name:28s} {min(ts):10.1f} {med:8.1f} {1e3 / med:7.1f} {base / med:15.2f}x"
        fmt = name.split()[1].rstrip(",") if name.startswith("ours") else None
        one = times.get(f"ours {fmt}, 1 thread")
        row += f" {med / statistics.median(one):9.2f}x" if one else f" {'':>10s}"
        if fmt:
            eng = engines[fmt]
            step_bytes = eng.model.weight_bytes_per_step + eng.kv_bytes_per_token * (len(ids) + args.tokens // 2)
            # each round's floor (at the bandwidth measured just before) over that round's step
            paired = statistics.median(step_bytes / b * 1e3 / t for b, t in zip(bws[name], ts))
            mine = statistics.median(bws[name])
            row += (f" {step_bytes / 1e6:8.0f} {step_bytes / mine * 1e3:9.1f} {paired:9.0%} "
                    f"{step_bytes / mine * 1e3 / med:8.0%} {step_bytes / peak * 1e3 / med:10.0%}")
        print(row)


if __name__ == "__main__":
    main()
