"""Room: N browser-like clients stepping or running at once against one server; does the room batch them?

    python bench/room.py [--clients 20] [--seconds 60] [--mode run|step] [--max-tokens 64] [--url URL] [--port P]
                         [--warmup 5] [--json FILE] [--strict]

Issue 12: one shared engine for the room, every tab's Step/Run granting its sequences engine steps and each
engine step batching the granted sequences of all tabs. This measures it, in one run on one server (the machine
is noisy: the ratio of two phases measured minutes apart on the same server is what we report, never absolute
times alone):

1. one client alone for --seconds;
2. --clients clients at once for --seconds.

The pages are bench/soak.py's (heartbeat, the Gradio page-load events, "hello" and its socket ticket, /ws/lab,
the sync event, the language radio), opened before a phase starts; then every client, at once:

* --mode run: presses Run as lab.js does ({"op": "run"} over the page's bound socket; the frames, then
  {"type": "run_end"}, come back on it) and keeps it running: when its sequence finishes (run_end) it presses
  Run again, which starts a new request. Step latency = the gap between consecutive payloads while running
  (each payload is one rendered frame carrying one or more new steps; the first gap is counted from the
  press). At the phase's end it presses Pause (the pause button's event, queue=False, through
  /gradio_api/run/predict) and waits for the run to end.
* --mode step: clicks Step over the socket as soon as the previous step's payload is back; latency = send ->
  the payload with op == "step". A finished sequence is followed by another Step (a new request starts).

Each phase: --warmup seconds of clients at work, not measured, then the --seconds window. Tokens: the server's
/healthz "room" counters (steps, tokens, batch_hist, max_batch; cumulative) diffed across the window give the
aggregate tok/s and the batch sizes seen. A server without them (one engine per tab) is measured client-side:
the generated-token chips each client saw appear (html-tokens, data-gen-index), and "room stats: n/a" is printed.
Per-client tok/s is always client-side.

Errors count as in bench/soak.py (error/warning payloads, failed Gradio events, socket drops, refused tickets,
"unbound", timeouts, exceptions, server tracebacks); "dropped" is its socket drops.

Targets (phase 2 against phase 1): aggregate tok/s >= 5x one client alone; every client's p95 step latency
<= 1.5 s; 0 dropped sockets (and 0 errors); RSS growth from the end of the window's first third to its end
under 10 %. Prints a markdown table (a row per phase), the ratio and a SUMMARY line; exits 1 on a FAIL only
with --strict (a busy CI machine reports, it does not fail), 2 when the server cannot be started or reached.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package: soak.py sits beside this file
from soak import (FINISHED_MARKERS, GradioApp, Page, Stats, cpu_seconds, open_page, percentile,  # noqa: E402
                  sampler, server_options, wait_freed, with_server)

TARGET_RATIO = 5.0
TARGET_P95_S = 1.5


class RoomPage(Page):
    """A soak page that also times and counts the frames it receives while its client is measuring."""

    def __init__(self, base: str, gapp: GradioApp, client: Client):
        super().__init__(base, gapp, client.stats)
        self.client = client
        self.timing = False  # run mode: inside a Run; frames are counted and their gaps timed
        self.last_frame = 0.0
        self.gen_seen = 0  # generated-token chips in the last html-tokens this page got

    def _check_message(self, payload) -> tuple[str | None, str]:
        out = super()._check_message(payload)
        if isinstance(payload, dict) and ("figs" in payload or "html" in payload):
            self.client.frame(self, payload)
        return out


@dataclass
class Client:
    i: int
    mode: str
    stats: Stats
    window: tuple[float, float] = (float("inf"), float("inf"))  # monotonic start and end of the measured window
    frames: int = 0  # payloads received inside the window
    frames_all: int = 0  # payloads received while stepping or running, warm-up and window
    tokens: int = 0  # generated tokens seen inside the window (chips), or one per step payload without chips
    latencies: list = field(default_factory=list)  # run mode (step mode: stats.steps, bucket 1)
    runs: int = 0  # Runs that ended inside the window
    finished: int = 0  # sequences that finished inside the window

    def inside(self, t: float | None = None) -> bool:
        return self.window[0] <= (time.monotonic() if t is None else t) < self.window[1]

    def frame(self, page: RoomPage, payload: dict) -> None:
        now = time.monotonic()
        inside = self.inside(now)
        chips = (payload.get("html") or {}).get("html-tokens")
        new = 0
        if isinstance(chips, str):
            n = chips.count("data-gen-index=")
            # fewer chips: a new request started; as many: a re-render (the language radio relabels them)
            new = n - page.gen_seen if n >= page.gen_seen else n
            page.gen_seen = n
        elif payload.get("op") == "step":
            new = 1  # a step payload without the chips: one token (every tab runs one sequence here)
        if self.mode == "run" and page.timing:
            if inside:
                self.latencies.append(now - page.last_frame)
            page.last_frame = now
        if self.mode == "step" or page.timing:
            self.frames_all += 1
        if inside and (self.mode == "step" or page.timing):
            self.frames += 1
            self.tokens += new

    def step_latencies(self) -> list[float]:
        return self.latencies if self.mode == "run" else self.stats.steps.get(1, [])


@dataclass
class Phase:
    name: str
    clients: list
    seconds: float
    room0: dict | None = None
    room1: dict | None = None
    samples: list = field(default_factory=list)  # soak's sampler: (t, rss, sessions, kv blocks)
    cpu_s: float | None = None
    freed_s: float | None = None
    tracebacks: int = 0

    def kinds(self) -> Counter:
        return sum((c.stats.kinds for c in self.clients), Counter())

    def room(self) -> dict | None:
        """The server's room counters over the window, or None when it reports none."""
        if not self.room0 or not self.room1:
            return None
        hist = {int(k): self.room1.get("batch_hist", {}).get(k, 0) - self.room0.get("batch_hist", {}).get(k, 0)
                for k in self.room1.get("batch_hist", {})}
        hist = {k: n for k, n in sorted(hist.items()) if n > 0}
        steps = sum(hist.values())
        t0, t1 = self.room0.get("time_ms", {}), self.room1.get("time_ms", {})
        # the engine loop's time per step, phase by phase (ms), and the share of the window it spent stepping
        per_step = {k: (t1[k] - t0.get(k, 0)) / steps for k in t1} if steps else {}
        return {"per_step_ms": per_step,
                "busy": (t1.get("step_call", 0) - t0.get("step_call", 0)) / 1e3 / self.seconds if t1 else None,"steps": self.room1.get("steps", 0) - self.room0.get("steps", 0),
                "tokens": self.room1.get("tokens", 0) - self.room0.get("tokens", 0), "batch_hist": hist,
                "batch_mean": sum(k * n for k, n in hist.items()) / steps if steps else None,
                "batch_max": max(hist) if hist else None}

    def summary(self) -> dict:
        lat = [x for c in self.clients for x in c.step_latencies()]
        per_p95 = [percentile(c.step_latencies(), .95) for c in self.clients if c.step_latencies()]
        room = self.room()
        tokens = room["tokens"] if room else sum(c.tokens for c in self.clients)
        rss = [s[1] for s in self.samples if s[1]]
        warm = [s[1] for s in self.samples if s[1] and s[0] <= self.samples[0][0] + self.seconds / 3] if rss else []
        kinds = self.kinds()
        return {
            "phase": self.name, "clients": len(self.clients), "seconds": self.seconds, "tokens": tokens,
            "token_source": "server room" if room else "client chips", "tok_s": tokens / self.seconds,
            "client_tok_s_median": statistics.median(c.tokens / self.seconds for c in self.clients),
            "frames_per_client": sorted(c.frames for c in self.clients),
            "frames_all_per_client": sorted(c.frames_all for c in self.clients), "runs": sum(c.runs for c in self.clients),
            "finished": sum(c.finished for c in self.clients),
            "latency_p50_ms": percentile(lat, .5) * 1000 if lat else None,
            "latency_p95_ms": percentile(lat, .95) * 1000 if lat else None,
            "worst_client_p95_ms": max(per_p95) * 1000 if per_p95 else None,
            "dropped": kinds["socket dropped"], "errors": sum(kinds.values()) + self.tracebacks,
            "error_kinds": dict(kinds), "examples": sorted({e for c in self.clients for e in c.stats.examples})[:8],
            "server_tracebacks": self.tracebacks,
            "rss_start_mib": rss[0] / 2**20 if rss else None, "rss_warm_mib": warm[-1] / 2**20 if warm else None,
            "rss_end_mib": rss[-1] / 2**20 if rss else None,
            "cpu_cores": self.cpu_s / self.seconds if self.cpu_s is not None else None,
            "room": room, "freed_s": self.freed_s,
        }


# ---- one client -------------------------------------------------------------------------------------------
async def pause(page: RoomPage) -> None:
    """The Pause button: a queue=False event, which the page posts straight to /gradio_api/run/predict."""
    for fn in page.gapp.triggered("pause", "click"):
        try:
            r = await page.http.post("/gradio_api/run/predict", json={
                "data": page.gapp.inputs(fn, page.values), "fn_index": fn, "session_hash": page.hash,
                "event_data": None, "trigger_id": page.gapp.trigger_id(fn)})
            r.raise_for_status()
        except httpx.HTTPError as exc:
            page.stats.error("gradio event failed", f"pause: {type(exc).__name__}: {exc}")


def broken(page: RoomPage) -> bool:
    return page.ws is None or not page.bound.is_set() or page.ws.close_code is not None


async def run_loop(client: Client, page: RoomPage, args, stop: asyncio.Event) -> RoomPage:
    """Run, and Run again whenever the sequence finishes, until `stop`; Pause then. The page in use at the end."""
    chain = page.gapp.triggered("run", "click")
    prompt_no = client.i
    while not stop.is_set():
        if broken(page):  # already counted; a person reloads a broken page
            page = await reopen(client, page, args, prompt_no)
            continue
        page.timing, page.last_frame = True, time.monotonic()
        frames = client.frames_all

        async def press() -> None:
            if not broken(page):  # as lab.js: over the bound socket, the frames and then run_end come back on it
                await page.run()
                return
            for fn in chain:  # the socket is down: lab.js lets the click through to Gradio
                await page.event(fn)

        task = asyncio.create_task(press())
        while not task.done() and not stop.is_set():
            await asyncio.wait({task}, timeout=0.5)  # frames past the window's end are not counted anyway
            if not task.done() and time.monotonic() - page.last_frame > args.step_timeout:
                client.stats.error("step timeout", f"no payload within {args.step_timeout:.0f} s while running")
                break
        if not task.done():  # the phase ended (or the run stalled): Pause, as a person would
            await pause(page)  # the frame of the step in flight still comes (frames_all)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), args.step_timeout)
            page.timing = False
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                if not stop.is_set():
                    page = await reopen(client, page, args, prompt_no)
                else:
                    client.stats.error("run did not stop", f"still running {args.step_timeout:.0f} s after Pause")
            continue
        page.timing = False
        if client.inside():
            client.runs += 1
            client.finished += page.gen_seen > 0
        prompt_no += 1
        await page.use_prompt(prompt_no)  # the next request: the next prompt, in its language
        if client.frames_all == frames:
            await asyncio.sleep(0.5)  # a Run that drew nothing (an error payload): not at line rate
    return page


async def step_loop(client: Client, page: RoomPage, args, stop: asyncio.Event) -> RoomPage:
    """Step as soon as the last step's payload is back, until `stop`; a finished sequence: Step again."""
    prompt_no = client.i
    while not stop.is_set():
        if broken(page):
            page = await reopen(client, page, args, prompt_no)
            continue
        result = await page.step(args.step_timeout)
        if result is None:
            if not stop.is_set():
                page = await reopen(client, page, args, prompt_no)  # a stuck page gets reloaded
            continue
        kind, text = result
        if kind == "info" and any(m in text for m in FINISHED_MARKERS):
            client.finished += client.inside()
            prompt_no += 1
            await page.use_prompt(prompt_no)
    return page


async def reopen(client: Client, page: RoomPage, args, prompt_no: int) -> RoomPage:
    await page.close()
    await asyncio.sleep(1.0)
    return await open_page(RoomPage(page.base, page.gapp, client), client.i, args.max_tokens, prompt_no)


async def client_task(client: Client, page: RoomPage, args, go: asyncio.Event, stop: asyncio.Event) -> None:
    try:
        await go.wait()
        page = await (run_loop if args.mode == "run" else step_loop)(client, page, args, stop)
    finally:
        await page.close()


# ---- a phase ----------------------------------------------------------------------------------------------
async def healthz(base: str) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            return (await c.get("/healthz")).json()
    return {}


async def phase(name: str, n: int, base: str, pid: int | None, gapp: GradioApp, args) -> Phase:
    t = time.monotonic()
    # bucket 0: the warm-up (and anything before it), bucket 1: the window, 2 on: after it (soak's Stats.bucket)
    clients = [Client(i, args.mode, Stats(t0=t, interval=args.seconds, duration=args.seconds)) for i in range(n)]
    pages = await asyncio.gather(*(open_page(RoomPage(base, gapp, c), c.i, args.max_tokens, c.i) for c in clients))
    print(f"{name}: {n} page(s) open after {time.monotonic() - t:.1f} s", flush=True)
    go, stop = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(client_task(c, p, args, go, stop)) for c, p in zip(clients, pages)]
    start = time.monotonic() + args.warmup
    for c in clients:
        c.window = (start, start + args.seconds)
        c.stats.t0 = start - args.seconds
    go.set()
    await asyncio.sleep(args.warmup)
    ph = Phase(name, clients, args.seconds, room0=(await healthz(base)).get("room"))
    cpu0 = cpu_seconds(pid)
    sampled = Stats(t0=start, interval=args.seconds, duration=args.seconds)
    sample_task = asyncio.create_task(sampler(base, pid, sampled, stop))
    await asyncio.sleep(max(0.0, start + args.seconds - time.monotonic()))
    ph.room1 = (await healthz(base)).get("room")
    cpu1 = cpu_seconds(pid)
    stop.set()
    await sample_task
    ph.samples = sampled.samples
    if cpu0 is not None and cpu1 is not None:
        ph.cpu_s = cpu1 - cpu0
    done, pending = await asyncio.wait(tasks, timeout=args.step_timeout + 30)
    for task, c in zip(tasks, clients):
        if task in pending:
            c.stats.error("client did not stop", "cancelled")
            task.cancel()
        elif task.exception() is not None:
            c.stats.error("client crashed", f"{type(task.exception()).__name__}: {task.exception()}")
    ph.freed_s, _ = await wait_freed(base, 60.0)  # the next phase starts on an empty server
    return ph


# ---- report -----------------------------------------------------------------------------------------------
def fmt(x, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def report(phases: list[dict], args) -> bool:
    print(f"\nmode {args.mode}, max tokens {args.max_tokens if args.max_tokens is not None else 'page default'}, "
          f"window {args.seconds:g} s after {args.warmup:g} s of warm-up")
    print("\n| phase | clients | seconds | tokens | agg tok/s | client tok/s (median) | latency p50 ms | "
          "latency p95 ms | worst client p95 ms | dropped | errors | RSS start/end MiB | batch mean/max | "
          "batch histogram |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for p in phases:
        room = p["room"]
        hist = " ".join(f"{k}:{v}" for k, v in room["batch_hist"].items()) if room else "n/a"
        print(f"| {p['phase']} | {p['clients']} | {p['seconds']:g} | {p['tokens']} | {p['tok_s']:.2f} | "
              f"{p['client_tok_s_median']:.2f} | {fmt(p['latency_p50_ms'])} | {fmt(p['latency_p95_ms'])} | "
              f"{fmt(p['worst_client_p95_ms'])} | {p['dropped']} | {p['errors']} | "
              f"{fmt(p['rss_start_mib'])}/{fmt(p['rss_end_mib'])} | "
              f"{fmt(room and room['batch_mean'], '.2f')}/{fmt(room and room['batch_max'], 'd')} | {hist} |")
    print()
    for p in phases:
        frames = p["frames_per_client"]
        print(f"{p['phase']}: tokens from {p['token_source']}; payloads per client in the window min {frames[0]} "
              f"median {frames[len(frames) // 2]} max {frames[-1]}, with the warm-up min "
              f"{p['frames_all_per_client'][0]}; runs {p['runs']}, finished sequences {p['finished']}; "
              f"server CPU {fmt(p['cpu_cores'], '.2f')} cores; sessions freed "
              + (f"{p['freed_s']:.1f} s after the close" if p["freed_s"] is not None else "n/a"))
        ps = (p["room"] or {}).get("per_step_ms")
        if ps:
            print(f"  engine per step (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in ps.items())
                  + f"; engine loop busy {fmt(p['room']['busy'] * 100, '.0f')} % of the window")
        if p["error_kinds"]:
            print(f"  errors by kind: " + ", ".join(f"{k} {n}" for k, n in Counter(p["error_kinds"]).most_common()))
            for e in p["examples"]:
                print(f"  e.g. {e}")
    if any(p["room"] is None for p in phases):
        print("room stats: n/a (server has no room)")
    one, many = phases
    ratio = many["tok_s"] / one["tok_s"] if one["tok_s"] > 0 else None
    print(f"ratio: {fmt(ratio, '.2f')}x aggregate tok/s ({many['clients']} clients against one alone)")

    parts, ok = [], []
    ok.append(ratio is not None and ratio >= TARGET_RATIO)
    parts.append(f"ratio {fmt(ratio, '.2f')}x (>= {TARGET_RATIO:g}) {'PASS' if ok[-1] else 'FAIL'}")
    p95 = many["worst_client_p95_ms"]
    ok.append(p95 is not None and p95 <= TARGET_P95_S * 1000)
    parts.append(f"worst client p95 {fmt(p95)} ms (<= {TARGET_P95_S * 1000:.0f}) {'PASS' if ok[-1] else 'FAIL'}")
    dropped = sum(p["dropped"] for p in phases)
    ok.append(dropped == 0)
    parts.append(f"dropped sockets {dropped} {'PASS' if ok[-1] else 'FAIL'}")
    errors = sum(p["errors"] for p in phases)
    ok.append(errors == 0)
    parts.append(f"errors {errors} {'PASS' if ok[-1] else 'FAIL'}")
    if many["rss_warm_mib"] and many["rss_end_mib"]:
        growth = many["rss_end_mib"] / many["rss_warm_mib"] - 1
        ok.append(growth < args.rss_growth)
        parts.append(f"RSS after warm-up {growth * 100:+.1f}% ({many['rss_warm_mib']:.0f} -> "
                     f"{many['rss_end_mib']:.0f} MiB) {'PASS' if ok[-1] else 'FAIL'}")
    else:
        parts.append("RSS n/a (no server pid)")
    verdict = all(ok)
    print("SUMMARY: " + " | ".join(parts) + f" => {'PASS' if verdict else 'FAIL'}")
    return verdict


async def bench(base: str, pid: int | None, args) -> list[Phase]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        gapp = GradioApp((await c.get("/config")).json())
    return [await phase("1 alone", 1, base, pid, gapp, args),
            await phase(f"{args.clients} at once", args.clients, base, pid, gapp, args)]


OPTIONS = [  # flag, type, default, help
    ("--clients", int, 20, "clients in the second phase (the first has one)"),
    ("--seconds", float, 60.0, "measured seconds per phase"),
    ("--warmup", float, 5.0, "seconds of each phase before its window (clients at work, not measured)"),
    ("--max-tokens", int, None, "the page's max tokens box (default: the page's own, 64)"),
    ("--step-timeout", float, 60.0, "no payload for this long while stepping or running is an error"),
    ("--rss-growth", float, 0.10, "target: RSS growth from the end of the window's first third to its end"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, typ, default, text in OPTIONS:
        ap.add_argument(flag, type=typ, default=default, help=text)
    ap.add_argument("--mode", choices=("run", "step"), default="run",
                    help="run: Run kept running (pressed again when it ends); step: Step as soon as the last one is back")
    ap.add_argument("--json", default="", help="also write the phases' numbers here")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target fails (default: just report)")
    server_options(ap)
    args = ap.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.warmup < 0:
        ap.error("--clients and --seconds must be positive, --warmup not negative")

    done = with_server(args, f"1 client, then {args.clients}, {args.seconds:g} s each ({args.mode} mode)", "room-",
                       lambda base, pid: bench(base, pid, args))
    if done is None:
        return 2
    phases, exited, tracebacks = done
    if exited is not None:
        phases[-1].clients[0].stats.error("server exited", f"code {exited}")
    phases[-1].tracebacks = tracebacks or 0
    results = [p.summary() for p in phases]
    ok = report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "phases": results, "pass": ok}, indent=1))
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
