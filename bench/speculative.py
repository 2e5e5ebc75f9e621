"""Speculative decoding benchmark: every drafter against plain decoding of the same prompt, in one run.

    python bench/speculative.py [--tokens 128] [--repeats 1] [--k 4]

Two prompts: an extractive one (copy a paragraph: prompt lookup should shine) and an open one (write a story).
For each drafter the prompt is decoded greedily with plain decoding and with speculation, alternating, in fresh
engine sessions (engine.speculative.compare_with_plain); the table shows decode tok/s of both, the speed-up,
the acceptance rate α (accepted / checked drafts), measured tokens per target pass (per decode round) and the
formula (1 − α^(k+1)) / (1 − α) at that α, for the configured k and averaged over each round's actual k.
The "draft" drafter uses the bundled model as its own draft (SmolLM2-135M is the smallest model with this
tokenizer here), so it shows the cost of a draft model that is as big as the target. These machines are noisy:
read the ratios, not the absolute times.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine import Engine, SamplingParams, SpeculativeConfig, compute  # noqa: E402
from engine.metrics import expected_tokens_per_pass  # noqa: E402
from engine.speculative import compare_with_plain  # noqa: E402

PASSAGE = ("The lighthouse stood on a rock at the edge of the bay. Every evening the keeper climbed the spiral "
           "stairs, trimmed the wick and wound the clockwork that turned the great lens. Ships far out at sea saw "
           "the beam sweep across the water and knew where the reef lay.")
PROMPTS = {
    "extractive": f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    "open": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def drafters(eng: Engine, k: int) -> dict[str, SpeculativeConfig]:
    return {
        "ngram": SpeculativeConfig("ngram", k),
        f"early_exit (L={eng.spec.num_layers // 3})": SpeculativeConfig("early_exit", max(1, k - 1)),
        "draft (bundled)": SpeculativeConfig("draft", max(1, k - 1), draft_model=eng),
    }


def fmt(v, d=2) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--k", type=int, default=4, help="drafts per round for n-gram (model drafters use k − 1)")
    args = ap.parse_args()
    torch.manual_seed(0)

    eng = Engine.from_pretrained("bundled", device="cpu")
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    # warm-up: oneDNN primitives for every row count a round can use
    compare_with_plain(eng, eng.encode("Hi").token_ids, params, SpeculativeConfig("ngram", args.k), max_tokens=8)

    rows, ngram_extractive = [], None
    for pname, prompt in PROMPTS.items():
        ids = eng.encode(prompt).token_ids
        for dname, cfg in drafters(eng, args.k).items():
            r = compare_with_plain(eng, ids, params, cfg, repeats=args.repeats)
            st = r["speculative"]["stats"]
            rows.append([pname, dname, cfg.num_tokens, r["plain"]["tok_s"], r["speculative"]["tok_s"], r["speedup"],
                         st["alpha"], st["tokens_per_round"], expected_tokens_per_pass(st["alpha"], cfg.num_tokens),
                         st["expected_tokens_per_round"], r["speculative"]["tokens"], r["same_tokens"]])
            if pname == "extractive" and cfg.method == "ngram":
                ngram_extractive = r["speedup"]
            print(f"  {pname:10s} {dname:20s} done", file=sys.stderr)

    print(f"model: {eng.model_id}; greedy, up to {args.tokens} tokens; medians of {args.repeats} alternating run(s); "
          f"torch threads {compute.THREADS}")
    print()
    print("| prompt | drafter | k | plain tok/s | spec tok/s | speed-up | α | tokens/pass measured | "
          "formula (1−α^(k+1))/(1−α) | formula, rounds' k | tokens | same ids |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p, d, k, pt, st_, sp, a, m, f, fr, n, same in rows:
        print(f"| {p} | {d} | {k} | {fmt(pt, 1)} | {fmt(st_, 1)} | {fmt(sp)}× | {fmt(a)} | {fmt(m)} | {fmt(f)} | "
              f"{fmt(fr)} | {n} | {'yes' if same else 'NO'} |")
    print()
    print(f"n-gram on the extractive prompt: {fmt(ngram_extractive)}× plain decoding (target >= 1.5x)")


if __name__ == "__main__":
    main()
