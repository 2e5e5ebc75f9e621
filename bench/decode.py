"""Decode speed by wall clock, like with like: our engine in each weight format against transformers'
`generate` on the same weights (and llama.cpp on the same GGUF when llama-cpp-python is installed).

    python bench/decode.py [--tokens 64] [--rounds 5] [--formats fp32,bf16,int8,q4] [--threads N]

What is timed: the wall clock of each contender's public API, per generated token, greedy, batch 1, the same
prompt ids, the same thread count. Per-token decode time = (time to generate 1 + N tokens - time to generate 1
token) / N, so the prompt's prefill cancels out; both runs start from an empty cache (our engine: a fresh
session with prefix caching off). Contenders run interleaved, round after round, so machine noise hits them
alike; reported: min and median over rounds, and ratios of medians against transformers fp32.

Also printed per format: the bytes a decode step reads (weights + KV), the floor they set at this machine's
measured memory bandwidth, and the fraction of that floor our step reaches (issue 14 asks >= 70 %).
These machines are noisy: read the ratios from one run, not absolute times.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine import Engine, SamplingParams, compute  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--threads", type=int, default=0, help="torch (and llama.cpp) threads; 0: torch's default")
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if args.threads:
        compute.set_threads(args.threads)
    torch.manual_seed(0)

    engines = {f: Engine.from_pretrained("bundled", weights=f) for f in formats}
    ref = next(iter(engines.values()))
    from transformers import AutoModelForCausalLM

    # the reference runs on the compute thread too (engine/compute.py: one OpenMP team, the same threads)
    hf = compute.run(lambda: AutoModelForCausalLM.from_pretrained(str(ref.loaded.source_dir),
                                                                  dtype=torch.float32).eval())
    llm, why = load_llama_cpp(ref.loaded.gguf, compute.THREADS)
    ids = ref.encode(PROMPT).token_ids
    contenders = {f"ours {f}": (ours, e) for f, e in engines.items()}
    contenders["transformers fp32"] = (transformers_run, hf)
    if llm is not None:
        contenders["llama.cpp Q4_1"] = (llama_cpp_run, llm)
    for run, ctx in contenders.values():  # warm-up: first calls allocate, pack and page in
        per_token(run, ctx, ids, 4)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (run, ctx) in contenders.items():
            times[name].append(per_token(run, ctx, ids, args.tokens))

    bw = measure_bandwidth("cpu")
    base = statistics.median(times["transformers fp32"])
    print(f"model: {ref.model_id}; prompt {len(ids)} tokens; {args.tokens} decode tokens x {args.rounds} rounds; "
          f"threads {compute.THREADS}; memory bandwidth {bw / 1e9:.1f} GB/s (measured now)")
    print(f"{'contender':22s} {'min ms/tok':>10s} {'median':>8s} {'tok/s':>7s} {'vs transformers':>16s} "
          f"{'MB/step':>8s} {'floor ms':>9s} {'of floor':>9s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        row = f"{name:22s} {min(ts):10.1f} {med:8.1f} {1e3 / med:7.1f} {base / med:15.2f}x"
        if name.startswith("ours"):
            eng = engines[name.split()[1]]
            step_bytes = eng.model.weight_bytes_per_step + eng.kv_bytes_per_token * (len(ids) + args.tokens // 2)
            floor = step_bytes / bw * 1e3
            row += f" {step_bytes / 1e6:8.0f} {floor:9.1f} {floor / med:9.0%}"
        print(row)
    if llm is None:
        print(f"llama.cpp: skipped ({why})")
    print("kernels (measured at load):")
    for f, e in engines.items():
        print(f"  {f}: " + "; ".join(f"{k} {v['decode']}" for k, v in e.model.kernels().items()))


if __name__ == "__main__":
    main()
