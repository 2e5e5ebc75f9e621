"""Decode benchmark: our engine against transformers' generate on the same weights, in one run.

    python bench/decode.py [--tokens 64] [--repeats 3]

Prints batch-1 decode ms/step and tok/s (instrumentation off and full), transformers' generate on the same
weights and prompt, the ratio, this machine's measured memory bandwidth, the roofline fraction
(bytes per step ÷ bandwidth ÷ step time) and batch-8 aggregate tok/s. These machines are noisy: read the
ratios, not the absolute times. Medians over the decode steps of `--repeats` runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine import Capture, Engine, SamplingParams, compute  # noqa: E402
from engine.metrics import measure_bandwidth  # noqa: E402

PROMPT = "Что такое гравитация? Explain it step by step."
BATCH_PROMPTS = [
    "Что такое гравитация?", "What is gravity?", "Name three planets.", "Write a haiku about the sea.",
    "Explain photosynthesis simply.", "What is 17 * 23?", "日本の首都はどこですか？", "def fib(n):",
]


def decode_steps(eng: Engine, prompts: list[str], tokens: int, trace: bool) -> tuple[list[float], int]:
    """Run the prompts together; return the step times (ms) of pure-decode steps and their batch size."""
    p = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request(q, p) for q in prompts]
    times = []
    while eng.has_unfinished():
        ev = eng.step(trace=trace)
        if ev.seqs and all(s.phase == "decode" for s in ev.seqs) and len(ev.seqs) == len(ids):
            times.append(ev.timing.step_ms)
    return times, len(ids)


def hf_decode_ms(hf, ids: list[int], tokens: int) -> float:
    x = torch.tensor([ids])
    kw = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        t = time.perf_counter()
        hf.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        hf.generate(x, max_new_tokens=tokens + 1, min_new_tokens=tokens + 1, **kw)
        total = time.perf_counter() - t
    return (total - prefill) / tokens * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)

    eng = Engine.from_pretrained("bundled", device="cpu")
    from transformers import AutoModelForCausalLM

    # the reference runs on the engine's compute thread too: torch runs single-threaded on every other thread
    # (a second OpenMP team would slow both down on a small machine, engine/compute.py)
    hf = compute.run(lambda: AutoModelForCausalLM.from_pretrained(str(eng.loaded.source_dir),
                                                                  dtype=torch.float32).eval())
    ids = eng.encode(PROMPT).token_ids
    decode_steps(eng.session(), [PROMPT], 8, trace=False)  # warm-up

    light, full, hf_ms, batch = [], [], [], []
    for _ in range(args.repeats):
        # interleave the contenders so machine noise hits all of them alike
        light += decode_steps(eng.session(), [PROMPT], args.tokens, trace=False)[0]
        hf_ms.append(compute.run(hf_decode_ms, hf, ids, args.tokens))
        inst = eng.session()
        inst.instrument = Capture()
        full += decode_steps(inst, [PROMPT], args.tokens, trace=True)[0]
        batch += decode_steps(eng.session(), BATCH_PROMPTS, args.tokens, trace=False)[0]

    measure_bandwidth.cache_clear()
    bw = measure_bandwidth("cpu")
    step_bytes = eng.model.weight_bytes_per_step + eng.kv_bytes_per_token * (len(ids) + args.tokens // 2)
    ours, theirs, inst_ms, b8 = (statistics.median(v) for v in (light, hf_ms, full, batch))
    floor_ms = step_bytes / bw * 1e3
    rows = [
        ("ours, batch 1, instrumentation off", ours, 1e3 / ours),
        ("ours, batch 1, full instrumentation", inst_ms, 1e3 / inst_ms),
        ("transformers generate, batch 1", theirs, 1e3 / theirs),
        ("ours, batch 8 (aggregate)", b8, 8e3 / b8),
    ]
    print(f"model: {eng.model_id}; prompt {len(ids)} tokens; {args.tokens} decode steps × {args.repeats} runs; "
          f"torch threads {compute.THREADS}")
    print(f"{'':40s} {'ms/step':>9s} {'tok/s':>8s}")
    for name, ms, tps in rows:
        print(f"{name:40s} {ms:9.1f} {tps:8.1f}")
    print()
    print(f"speed-up vs transformers generate (batch 1):   {theirs / ours:5.2f}x   (target >= 1.5x)")
    print(f"memory read bandwidth (measured now):          {bw / 1e9:5.1f} GB/s")
    print(f"bytes per decode step (weights + KV):          {step_bytes / 1e6:5.0f} MB -> floor {floor_ms:.1f} ms")
    print(f"roofline fraction (floor / our step):          {floor_ms / ours:5.0%}   (target >= 70%)")
    print(f"batch-8 aggregate tok/s vs batch 1:            {(8e3 / b8) / (1e3 / ours):5.2f}x   (target >= 5x)")
    print(f"full instrumentation / light step:             {inst_ms / ours:5.2f}x   (target <= 1.5x)")


if __name__ == "__main__":
    main()
