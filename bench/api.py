"""N concurrent streaming clients against an OpenAI-compatible /v1: aggregate tok/s and TTFT, against one client.

    python bench/api.py [--clients 8] [--max-tokens 64] [--rounds 3] [--endpoint chat|completions]
                        [--target URL] [--api-key K] [--model NAME] [--kv-memory-mb 256] [--json FILE]

Without --target it starts the lab (`python -m app` on a free port, with a random key) and measures its /v1: the
requests are owners in the room's shared engine, so N streams at once are batched into the same engine steps.
With --target URL (e.g. http://gpu-box:8000, a vLLM, SGLang or llama.cpp server, or another lab) it measures
that server instead; --model defaults to the first model its /v1/models lists.

Each round runs, interleaved so that a machine's drift hits both alike: one client alone (the reference), then
--clients clients at once, each with its own prompt, all streaming through the official `openai` client.
Measured at the client: TTFT = request sent -> first chunk with text; tokens = the usage chunk's
completion_tokens (stream_options.include_usage); a client's tok/s = tokens / (last chunk - request sent);
aggregate tok/s = all tokens / (last client's end - first client's start). Prints a row per round, then
min and median over rounds and the ratios "N clients / alone" (aggregate throughput, per-client speed, TTFT).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package: soak.py sits beside this file
from soak import free_port, wait_up  # noqa: E402
TOPICS = ["a dragon who learns to read", "a lighthouse keeper on Mars", "a robot that bakes bread",
          "a river that flows uphill", "a cat who runs a library", "the last tree in a city",
          "a clock that runs backwards", "a whale who sings opera", "a girl who talks to storms",
          "a train that never stops", "a painter who paints sounds", "a village under the ice"]


@dataclass
class Stream:
    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def tok_s(self) -> float | None:
        return self.tokens / (self.end - self.start) if self.end and self.tokens else None


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: with few samples the value is one that was really observed."""
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


async def one_stream(client, args, i: int) -> Stream:
    topic = TOPICS[i % len(TOPICS)]
    common = dict(model=args.model, max_tokens=args.max_tokens, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    s = Stream(time.perf_counter())
    try:
        if args.endpoint == "chat":
            stream = await client.chat.completions.create(
                messages=[{"role": "user", "content": f"Write a long story about {topic}."}], **common)
        else:
            stream = await client.completions.create(prompt=f"Here is a long story about {topic}. Once upon a time,",
                                                     **common)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                c = chunk.choices[0]
                text = c.delta.content if args.endpoint == "chat" else c.text
                if text and s.first is None:
                    s.first = now
            if getattr(chunk, "usage", None):
                s.tokens = chunk.usage.completion_tokens
            s.end = now
    except Exception as exc:  # noqa: BLE001 - a failed client is counted and named, the run goes on
        s.error = f"{type(exc).__name__}: {exc}"[:200]
    return s


async def phase(client, args, n: int) -> dict:
    streams = await asyncio.gather(*(one_stream(client, args, i) for i in range(n)))
    ok = [s for s in streams if not s.error and s.end]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    wall = max(s.end for s in ok) - min(s.start for s in ok) if ok else float("nan")
    tokens = sum(s.tokens for s in ok)
    return {"clients": n, "errors": [s.error for s in streams if s.error], "tokens": tokens,
            "agg_tok_s": tokens / wall if ok else float("nan"),
            "client_tok_s": statistics.median([s.tok_s for s in ok if s.tok_s]) if ok else float("nan"),
            "ttft_p50": percentile(ttfts, 0.5) if ttfts else float("nan"),
            "ttft_p95": percentile(ttfts, 0.95) if ttfts else float("nan"),
            "streams": [asdict(s) for s in streams]}


async def measure(base: str, args) -> list[tuple[dict, dict]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key=args.api_key or "none", max_retries=0, timeout=600)
    if not args.model:
        args.model = (await client.models.list()).data[0].id
    print(f"target {base}/v1, model {args.model}, {args.endpoint}, max_tokens {args.max_tokens}, temperature 0")
    await one_stream(client, args, 0)  # warm-up: first-request costs stay out of the rounds
    rounds = []
    for r in range(args.rounds):
        alone = await phase(client, args, 1)
        many = await phase(client, args, args.clients)
        rounds.append((alone, many))
        for p in (alone, many):
            if p["errors"]:
                print(f"  round {r + 1}, {p['clients']} client(s): {len(p['errors'])} failed: {p['errors'][0]}")
        print(f"round {r + 1}: alone {alone['agg_tok_s']:.1f} tok/s, TTFT {alone['ttft_p50']:.3f} s | "
              f"{args.clients} clients {many['agg_tok_s']:.1f} tok/s in all, {many['client_tok_s']:.1f} per client, "
              f"TTFT p50 {many['ttft_p50']:.3f} s p95 {many['ttft_p95']:.3f} s", flush=True)
    return rounds


def report(rounds: list[tuple[dict, dict]], clients: int) -> None:
    def stat(values):
        values = [v for v in values if not math.isnan(v)]
        return (min(values), statistics.median(values)) if values else (float("nan"), float("nan"))

    rows = [("aggregate tok/s", "agg_tok_s"), ("tok/s per client", "client_tok_s"), ("TTFT p50 s", "ttft_p50"),
            ("TTFT p95 s", "ttft_p95")]
    print(f"\n| measure (min / median of {len(rounds)} rounds) | 1 client alone | {clients} clients at once | "
          "ratio of medians |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        a, m = stat([x[key] for x, _ in rounds]), stat([y[key] for _, y in rounds])
        print(f"| {label} | {a[0]:.3f} / {a[1]:.3f} | {m[0]:.3f} / {m[1]:.3f} | {m[1] / a[1]:.2f}x |")
    tokens = sum(y["tokens"] for _, y in rounds)
    errors = sum(len(x["errors"]) + len(y["errors"]) for x, y in rounds)
    print(f"\n{tokens} tokens streamed to the concurrent clients over {len(rounds)} rounds; {errors} failed streams")


def start_lab(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args.api_key = args.api_key or secrets.token_urlsafe(12)
    log = Path(tempfile.mkdtemp(prefix="bench-api-")) / "server.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--api-key", args.api_key,
                             "--kv-memory-mb", str(args.kv_memory_mb)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/healthz", proc, args.ready_timeout, lambda r: r.json().get("ready"))
    except RuntimeError as exc:
        proc.terminate()
        sys.exit(f"the lab did not start: {exc}; its log: {log}")
    print(f"lab started on {base} (log {log})")
    return proc, base

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    ap.add_argument("--target", default="", help="an OpenAI-compatible server's base URL (default: start the lab)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    ap.add_argument("--model", default="", help="default: the first model the server lists")
    ap.add_argument("--kv-memory-mb", type=int, default=256, help="the started lab's KV pool")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--json", default="", help="write every stream's numbers here")
    args = ap.parse_args()
    if args.clients < 1 or args.rounds < 1 or args.max_tokens < 1:
        ap.error("--clients, --rounds and --max-tokens must be at least 1")
    proc = None
    base = args.target.rstrip("/").removesuffix("/v1")
    if not base:
        proc, base = start_lab(args)
    try:
        rounds = asyncio.run(measure(base, args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    report(rounds, args.clients)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "api_key"},
                                               "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
