"""Load from the room (lecture mode) with one follower and with N: what the presenter's summary says.

    python bench/room_load.py [--followers 8] [--max-tokens 32] [--rounds 3] [--attach URL]

Starts the lab (`python -m app` with an API key and a presenter token, or with --attach URL the attach page
pointed at that server) and drives it as a lecture does: followers on real /ws/follow sockets, the presenter on
/ws/present. Each follower does what a follower's page does (static/follow_load.js): takes the ticket the server
hands its socket, sends one streaming chat request with it (to /v1, or to the attach page's relay), measures the
time to its first token, and reports back. The numbers printed are the server's round summary (app/room_load.py):
TTFT median and 95th percentile as the followers measured them, the tokens the server generated for them per
second of the round, and the batches the engine ran with their requests (the room's step records; in attach mode
the server's requests running at once, from its /metrics).

Rounds alternate one follower and N, so that the machine's drift hits both alike (the lab waits 10 s between
rounds), after one uncounted warm-up round. Prints a row per round, then min and median over rounds and the
ratios "N followers / one".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package: soak.py sits beside this file
from soak import free_port, wait_up  # noqa: E402
PROMPT = "Write a short story about a lighthouse keeper on Mars."
COOLDOWN_S = 10.5  # app/room_load.py COOLDOWN_S, and a margin


async def follower(base: str, ws, results: list) -> None:
    """One follower's page: its ticket, its request, its TTFT, its report."""
    while True:
        msg = json.loads(await ws.recv())
        if msg.get("type") == "load":
            break
    if msg.get("skipped"):
        return
    body = {"model": msg["model"], "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": msg["max_tokens"], "temperature": msg["temperature"],
            "messages": [{"role": "user", "content": msg["prompt"]}]}
    sent, ttft, tokens, error = time.perf_counter(), None, 0, ""
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=600)) as client:
            async with client.stream("POST", base + msg["url"], json=body,
                                     headers={"Authorization": f"Bearer {msg['ticket']}"}) as r:
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    if ttft is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                        ttft = time.perf_counter() - sent
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    ok = not error and ttft is not None
    results.append(ok)
    await ws.send(json.dumps({"op": "load_report", "round": msg["round"], "ok": ok, "error": error,
                              "ttft_ms": ttft * 1e3 if ok else None, "tokens": tokens}))


async def one_round(base: str, present, n: int, args) -> dict:
    ws_base = base.replace("http", "ws", 1)
    sockets = [await connect(ws_base + "/ws/follow", proxy=None, max_size=None) for _ in range(n)]
    try:
        results: list = []
        tasks = [asyncio.create_task(follower(base, ws, results)) for ws in sockets]
        await asyncio.sleep(0.3)  # every socket registered as a viewer
        reply = await present({"op": "load", "prompt": PROMPT, "max_tokens": args.max_tokens, "temperature": 0})
        assert reply.get("type") == "ok" and reply["asked"] == n, reply
        await asyncio.gather(*tasks)
        deadline = time.time() + 60
        while True:  # the reports arrive over the sockets; the summary counts them
            s = await present({"op": "load_summary"})
            s = s["summary"]
            if s["answered"] + s["failed"] >= n or time.time() > deadline:
                return s
            await asyncio.sleep(0.3)
    finally:
        for ws in sockets:
            await ws.close()


async def measure(base: str, token: str, args) -> list[tuple[dict, dict]]:
    async with connect(base.replace("http", "ws", 1) + "/ws/present", proxy=None, max_size=None) as ws:
        async def present(msg: dict) -> dict:
            await ws.send(json.dumps(msg))
            return json.loads(await ws.recv())

        assert (await present({"op": "auth", "token": token}))["type"] == "ok"
        await one_round(base, present, 1, args)  # warm-up, not counted: the first request pays one-time costs
        rounds, last = [], time.monotonic()
        for i in range(args.rounds):
            pair = []
            for n in (1, args.followers):
                await asyncio.sleep(max(0.0, COOLDOWN_S - (time.monotonic() - last)))
                last = time.monotonic()
                s = await one_round(base, present, n, args)
                pair.append(s)
                print(row(f"round {i + 1}", n, s), flush=True)
            rounds.append(tuple(pair))
        return rounds


def row(label: str, n: int, s: dict) -> str:
    b = s.get("batches") or {}
    ms = lambda v: "–" if v is None else f"{v * 1e3:.0f}"  # noqa: E731
    return (f"| {label} | {n} | {s['answered']}/{s['asked']} | {ms(s['ttft_p50_s'])} | {ms(s['ttft_p95_s'])} | "
            f"{(s['tok_s'] or 0):.1f} | {b.get('max', '–')} | {b.get('mean', 0):.1f} |")


def report(rounds: list[tuple[dict, dict]], n: int) -> None:
    print("\n| measure (min / median over rounds) | 1 follower | "
          f"{n} followers | ratio of medians |\n|---|---:|---:|---:|")
    for name, key, scale in (("TTFT p50 ms", "ttft_p50_s", 1e3), ("TTFT p95 ms", "ttft_p95_s", 1e3),
                             ("tok/s together", "tok_s", 1.0)):
        cols = []
        for side in (0, 1):
            vals = [r[side][key] * scale for r in rounds if r[side][key] is not None]
            cols.append((min(vals), statistics.median(vals)) if vals else (float("nan"), float("nan")))
        ratio = cols[1][1] / cols[0][1] if cols[0][1] else float("nan")
        print(f"| {name} | {cols[0][0]:.1f} / {cols[0][1]:.1f} | {cols[1][0]:.1f} / {cols[1][1]:.1f} | {ratio:.2f}× |")
    sizes = [r[1]["batches"]["max"] for r in rounds if r[1].get("batches")]
    print(f"\nlargest batch with the {n} followers' requests, per round: {sizes}")


def start(args, token: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "app", "--port", str(port)]
    cmd += ["--attach", args.attach] if args.attach else ["--api-key", secrets.token_urlsafe(12)]
    log = Path(tempfile.mkdtemp(prefix="bench-room-load-")) / "server.log"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "INFERLAB_PRESENTER_TOKEN": token})
    base = f"http://127.0.0.1:{port}"
    try:  # the attach page has no /healthz: it is up when it serves its page
        wait_up(base + ("/" if args.attach else "/healthz"), proc, 600,
                lambda r: args.attach or r.json().get("ready"))
    except RuntimeError as exc:
        proc.terminate()
        sys.exit(f"the server did not start: {exc}; its log: {log}")
    print(f"started {base} (log {log})")
    return proc, base

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--followers", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--attach", default="", help="measure the attach page pointed at this server instead")
    args = ap.parse_args()
    if not 1 <= args.followers <= 48 or args.rounds < 1 or not 1 <= args.max_tokens <= 64:
        ap.error("--followers 1..48, --rounds >= 1, --max-tokens 1..64 (the room load's own caps)")
    token = secrets.token_urlsafe(12)
    proc, base = start(args, token)
    try:
        print("\n| round | followers | answered | TTFT p50 ms | TTFT p95 ms | tok/s together | max batch | "
              "mean batch |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        report(asyncio.run(measure(base, token, args)), args.followers)
    finally:
        proc.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
