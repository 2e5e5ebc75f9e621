"""Constrained decoding benchmark: what a grammar mask costs per step, against the same decoding without one.

    python bench/constrained.py [--rounds 3]

For each of the lab's examples (JSON {name, age}, a date YYYY-MM-DD, yes/no, and a longer JSON list so there are
enough decode steps to time) the prompt is decoded greedily twice in fresh engine sessions: with the grammar, and
without it for the same number of tokens (ignore_eos, max_tokens = the constrained output's length), so both
runs take the same steps. Runs alternate (plain, constrained, plain, ...) for `--rounds` rounds so machine noise
hits both alike. Reported per example: tokens; the mask's build time per step (StepTiming.grammar_ms, every
step of every round: median and p95); each run's median step time and tokens/s (engine clock, prefill
included); the mask's share of a constrained step; the slowdown; and the grammar's compile time for this
tokenizer (uncached). These machines are noisy: read the ratios, not the absolute times.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import Engine, Grammar, SamplingParams  # noqa: E402
from engine import grammar as G  # noqa: E402

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
PEOPLE = {"type": "array", "items": PERSON, "minItems": 3, "maxItems": 3}
EXAMPLES = {
    "JSON {name, age}": (Grammar.json_schema(PERSON), "Invent a person. Answer as JSON with name and age."),
    "date YYYY-MM-DD": (Grammar.regex(r"\d{4}-\d{2}-\d{2}"), "When did the first person land on the Moon?"),
    "yes/no": (Grammar.choice(["yes", "no"]), "Is the sky blue? Answer yes or no."),
    "JSON list of 3 people": (Grammar.json_schema(PEOPLE), "Invent three people. Answer as a JSON list."),
}


def run(eng: Engine, prompt: str, params: SamplingParams) -> dict:
    s = eng.session()
    sid = s.add_request(prompt, params)
    events = []
    while s.has_unfinished():
        events.append(s.step(trace=False))
    res = s.result(sid)
    steps = [e.timing for e in events if e.seqs]
    return {"ids": res.token_ids, "text": res.text, "reason": res.finish_reason,
            "step_ms": [t.step_ms for t in steps], "mask_ms": [t.grammar_ms for t in steps],
            "total_s": sum(t.step_ms for t in steps) / 1e3}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def compile_ms(eng: Engine, grammar: Grammar, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        G._compiled.clear()  # the bench wants the uncached cost
        t = time.perf_counter()
        G.compile_grammar(grammar, eng.tokenizer, eng.spec.vocab_size, eng.eos_ids)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    eng = Engine.from_pretrained("bundled", device="cpu")
    t = time.perf_counter()
    G.compile_grammar(Grammar.regex("warm"), eng.tokenizer, eng.spec.vocab_size, eng.eos_ids)
    print(f"llguidance's view of the tokenizer (once per process): {(time.perf_counter() - t) * 1e3:.0f} ms")
    run(eng, "Hi", SamplingParams(max_tokens=4, temperature=0.0))  # warm-up

    rows = {}
    for name, (grammar, prompt) in EXAMPLES.items():
        con = run(eng, prompt, SamplingParams(max_tokens=200, temperature=0.0, grammar=grammar))
        rows[name] = {"grammar": grammar, "prompt": prompt, "n": len(con["ids"]), "text": con["text"],
                      "reason": con["reason"], "con": [], "plain": [], "compile_ms": compile_ms(eng, grammar)}
    for _ in range(args.rounds):
        for name, r in rows.items():
            r["plain"].append(run(eng, r["prompt"], SamplingParams(max_tokens=r["n"], temperature=0.0,
                                                                   ignore_eos=True)))
            r["con"].append(run(eng, r["prompt"], SamplingParams(max_tokens=200, temperature=0.0,
                                                                 grammar=r["grammar"])))

    print()
    print("| example | tokens | output | compile ms | mask ms/step median / p95 | step ms plain / grammar (median) "
          "| tok/s plain / grammar | mask share of a step | slowdown |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        mask = [m for run_ in r["con"] for m in run_["mask_ms"]]
        step_c = [s for run_ in r["con"] for s in run_["step_ms"]]
        step_p = [s for run_ in r["plain"] for s in run_["step_ms"]]
        tps_c = statistics.median(r["n"] / x["total_s"] for x in r["con"])
        tps_p = statistics.median(r["n"] / x["total_s"] for x in r["plain"])
        share = statistics.median(m / s for run_ in r["con"] for m, s in zip(run_["mask_ms"], run_["step_ms"]))
        text = r["text"] if len(r["text"]) <= 40 else r["text"][:39] + "…"
        print(f"| {name} | {r['n']} | `{text}` ({r['reason']}) | {r['compile_ms']:.2f} | "
              f"{statistics.median(mask):.3f} / {pct(mask, 0.95):.3f} | "
              f"{statistics.median(step_p):.1f} / {statistics.median(step_c):.1f} | {tps_p:.1f} / {tps_c:.1f} | "
              f"{share:.1%} | {tps_p / tps_c:.3f}× |")


if __name__ == "__main__":
    main()
