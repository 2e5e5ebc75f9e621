"""CLI: python -m engine "prompt" [--temperature T ...] streams the answer as it is generated."""
from __future__ import annotations

import argparse
import sys

from . import native
from .kernels import FORMATS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine", description="Stream a completion from InferLab's engine.")
    ap.add_argument("prompt", help="the user message (or raw text with --raw)")
    ap.add_argument("--model", default="bundled", help="'bundled', a local Hugging Face directory, or a hub id")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    ap.add_argument("--weights", default="fp32", choices=FORMATS,
                    help="the projections' format: fp32 (the reference), bf16, int8 or q4 (the GGUF's 4-bit weights)")
    ap.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    ap.add_argument("--system", default=None, help="system prompt for the chat template")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    ap.add_argument("--frequency-penalty", type=float, default=0.0)
    ap.add_argument("--presence-penalty", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    ap.add_argument("--stats", action="store_true",
                    help="print the kernel chosen for each projection, and TTFT, TPOT and the finish reason at the end")
    args = ap.parse_args(argv)

    from . import Engine, ModelLoadError, SamplingParams

    try:
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty, seed=args.seed,
            stop=tuple(args.stop))
        eng = Engine.from_pretrained(
            args.model, device=args.device, weights=args.weights,
            progress=lambda f, msg: print(f"[{f:4.0%}] {msg}", file=sys.stderr, flush=True))
        if args.stats:  # measured at load on this machine (engine/kernels.py)
            for name, k in eng.model.kernels().items():
                print(f"[{name:>7}: {k['format']}; one row {k['single']}; decode batch {k['decode']}; "
                      f"prefill {k['prefill']}]", file=sys.stderr)
            print(f"[the lab's CPU kernels: {native.status()}]", file=sys.stderr)
            print(f"[a single sequence's decode step: {eng.model.decode_path}]", file=sys.stderr)
            print(f"[attention: {eng.model.attention}]", file=sys.stderr)
        rid = eng.add_request(args.prompt, params, chat=not args.raw, system=args.system)
        for ev in eng._drive(rid):
            if ev.emitted:
                print(ev.emitted, end="", flush=True)
        print()
    except (ValueError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if args.stats:
        res = eng.result(rid)
        print(f"[{len(res.token_ids)} tokens, finish: {res.finish_reason}, TTFT {res.ttft_s * 1e3:.0f} ms, "
              f"TPOT {(res.tpot_s or 0) * 1e3:.1f} ms]", file=sys.stderr)
        print(f"[{threads_line()}]", file=sys.stderr)
    return 0


def threads_line() -> str:
    """The decode threads the governor settled on, its evidence, and OpenMP's waiting (engine/governor.py)."""
    from . import compute
    from .governor import GOVERNOR

    g = compute.run(GOVERNOR.describe)
    line = f"decode threads: {g['threads']} of {g['max_threads']} ({g['probes']} probes, {g['switches']} switches"
    p = g["last_probe"]
    if p:
        line += (f"; last probe: {p['threads']} threads {p['probe_ms']} ms/step against {p['current_threads']} "
                 f"{p['current_ms']} ms, {'kept' if p['won'] else 'dropped'}")
    return line + f"); OpenMP: {g['openmp']}"


if __name__ == "__main__":
    sys.exit(main())
