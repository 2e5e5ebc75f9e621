"""Soak: N browser-like clients over the real server for M minutes; errors, latency, memory, leaks.

    python bench/soak.py [--clients 20] [--minutes 5] [--interval 60] [--url http://HOST:PORT] [--port P]

Starts `python -m app` as a subprocess (or attaches to --url) and runs N emulated pages in one asyncio loop.
Each page does what the browser and static/lab.js do, over the same endpoints:

* page load: opens Gradio's heartbeat stream (GET /gradio_api/heartbeat/{session_hash}; Gradio runs
  demo.unload, which frees the tab's session, when that stream ends), then runs the page-load events through
  Gradio's queue (POST /gradio_api/queue/join + GET /gradio_api/queue/data, protocol sse_v3): the model
  status, "hello" (the tab's socket ticket; it creates the tab's session) and one tick of the calculators'
  timer. All events of one page carry that page's one session hash.
* then /ws/lab?ticket=T (with the page's Origin, as a browser sends it) and waits for {"type": "bound"}.
* Step: {"op": "step", "inputs": {...}} over the socket, every value as lab.js reads it off the controls;
  latency = send -> first payload with op == "step" (the sequence selector rides in that payload: no Gradio
  event follows a step). A language switch fires the language radio's Gradio change events.
* a finished sequence (the step payload's message) is followed by Reset (the reset button's Gradio event and
  its .then) or simply by another Step, which starts a new request; Reset also every 50-70 steps.
* churn: every 4th client reloads its page now and then (heartbeat and socket closed, a new page opened).

Counted as errors: payloads whose message is an error or warning (app/render.py message_html classes
il-msg-error / il-msg-warn, e.g. "the lab is full"), failed Gradio events, socket drops, refused tickets,
"unbound", step timeouts, exceptions; plus tracebacks in the server's log when this script started it.

After the run every page closes; the server's /healthz is polled until "sessions" and "kv_blocks_used" are
0. Targets: 0 errors; RSS growth after warm-up (RSS at the end of the last interval against the end of the
first) under 10 %; every session and KV block freed within 60 s of the close. Prints a markdown table per
interval and a SUMMARY line; exits 1 on any FAIL, 2 when the server cannot be started or reached.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import math
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

ROOT = Path(__file__).resolve().parent.parent

# (lang, prompt): what a room types, in both of the page's languages
PROMPTS = [("ru", "Что такое гравитация?"), ("en", "What is gravity?"),
           ("en", "Write a haiku about the sea."), ("ru", "Расскажи коротко, как работает внимание в трансформере."),
           ("en", "Explain the KV cache in one sentence.")]
# the step payload's message when nothing is left to run (app/i18n.py "finished", en and ru)
FINISHED_MARKERS = ("All sequences finished", "Все последовательности завершены")
# what lab.js reports as in view on a fresh page (the sampling view), as the brief's recorded click sends it
VISIBLE = json.dumps({"ids": ["chart-logits", "chart-sampling"], "near": []})
GRADIO_TIMEOUT_S = 60.0


# ---- results ------------------------------------------------------------------------------------------------
@dataclass
class Stats:
    t0: float
    interval: float
    duration: float
    steps: dict = field(default_factory=dict)  # bucket -> [latency s]
    errors: dict = field(default_factory=dict)  # bucket -> count
    first_steps: list = field(default_factory=list)  # latencies of each page's first step (also in `steps`)
    kinds: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    samples: list = field(default_factory=list)  # (t, rss bytes or None, sessions or None, kv blocks or None)
    resets: int = 0
    finished: int = 0  # step payloads that said every sequence had finished
    churns: int = 0
    pages: int = 0
    rss_idle: int | None = None  # before any page opened
    rss_after: int | None = None  # once everything was freed (or the wait ended): what the close gave back
    healthz_max_s: float = 0.0  # the slowest /healthz answer while the clients were on
    healthz_failed: int = 0
    healthz_failure: str = ""
    cpu_s: float | None = None  # server CPU seconds while the clients were on (per step: is it the load or us?)

    def bucket(self, t: float) -> int:
        return max(0, int((t - self.t0) // self.interval))

    def step(self, latency: float, first: bool) -> None:
        self.steps.setdefault(self.bucket(time.monotonic()), []).append(latency)
        if first:  # a page's first step (prefill, every panel's HTML) is every visitor's first impression
            self.first_steps.append(latency)

    def error(self, kind: str, detail: str = "") -> None:
        b = self.bucket(time.monotonic())
        self.errors[b] = self.errors.get(b, 0) + 1
        self.kinds[kind] += 1
        example = f"{kind}: {detail[:300]}"
        if len(self.examples) < 8 and example not in self.examples:  # distinct ones: the first of each says most
            self.examples.append(example)


def message_kind(payload) -> tuple[str | None, str]:
    """The class and text of a payload's message line (render.message_html), or (None, "")."""
    if not isinstance(payload, dict):
        return None, ""
    msg = (payload.get("html") or {}).get("html-message") or ""
    m = re.search(r'class="il-msg il-msg-(\w+)"', msg)
    text = html.unescape(re.sub(r"<[^>]+>", "", msg))
    return (m.group(1) if m else None), text


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (no interpolation: with few samples it is a real observed latency)."""
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


# ---- the server ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time the process has used (/proc/<pid>/stat utime and stime, in clock ticks)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def pid_listening_on(port: int) -> int | None:
    """The local process listening on `port` (for --url on this machine): /proc/net/tcp's socket inode, then
    the process holding that inode. None when it cannot be found (another user's process, another host)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(cols[9])
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(pid)
    return None


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM if this script is killed (a test's timeout) instead of living on
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(port: int, max_sessions: int, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        # the interpreter itself (no shell in between): its pid is the server whose RSS is read
        return subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--host", "127.0.0.1",
                                 "--max-sessions", str(max_sessions)], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float, ready=lambda response: True) -> None:
    """Poll `url` until it answers 200 and `ready(response)` holds; RuntimeError if `proc` exits or time runs out
    (for the benchmarks that start a server of their own without an event loop)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(url, timeout=5)
            if r.status_code == 200 and ready(r):
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s")


async def wait_ready(base: str, proc: subprocess.Popen | None, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as c:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                h = (await c.get(base + "/healthz")).json()
                if h.get("error"):
                    raise RuntimeError(f"the model did not load: {h['error']}")
                if h.get("ready"):
                    return h
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s")


# ---- the page's Gradio side --------------------------------------------------------------------------------
class GradioApp:
    """What a page knows from /config: component defaults and the events its controls trigger."""

    def __init__(self, config: dict):
        self.comps = {c["id"]: c for c in config["components"]}
        self.by_elem = {c.get("props", {}).get("elem_id"): c["id"] for c in self.comps.values()
                        if c.get("props", {}).get("elem_id")}
        self.deps = {d.get("id", i): d for i, d in enumerate(config["dependencies"])}
        self.defaults = {cid: c.get("props", {}).get("value") for cid, c in self.comps.items()}

    def api(self, name: str) -> int:
        return next(i for i, d in self.deps.items() if d.get("api_name") == name)

    def triggered(self, elem_id: str | None, trigger: str) -> list[int]:
        """Server-side events of (component, trigger), each followed by its .then() chain, in order."""
        target = self.by_elem.get(elem_id) if elem_id else None
        first = [i for i, d in self.deps.items() if d.get("backend_fn") and
                 any(t[1] == trigger and (elem_id is None or t[0] == target) for t in d["targets"])]
        out = []
        for i in first:
            chain = [i]
            while True:  # .then() steps run after their parent (only_on_success is off for all of ours)
                nxt = [j for j, d in self.deps.items() if d.get("trigger_after") == chain[-1]]
                if not nxt:
                    break
                chain.append(nxt[0])
            out += [j for j in chain if self.deps[j].get("backend_fn")]
        return out

    def inputs(self, fn: int, values: dict) -> list:
        return [values.get(cid, self.defaults.get(cid)) for cid in self.deps[fn]["inputs"]]

    def trigger_id(self, fn: int) -> int | None:
        t = self.deps[fn]["targets"]
        return t[0][0] if t and isinstance(t[0][0], int) else None


class Page:
    """One browser tab: its session hash, heartbeat stream, Gradio events and /ws/lab socket."""

    def __init__(self, base: str, gapp: GradioApp, stats: Stats):
        self.base, self.gapp, self.stats = base, gapp, stats
        self.hash = secrets.token_hex(6)[:11]  # the browser's is Math.random().toString(36): random, per page load
        self.values = dict(gapp.defaults)  # the page's controls, by component id
        self.values[gapp.by_elem["visible"]] = VISIBLE
        self.http: httpx.AsyncClient | None = None
        self.ws = None
        self.tasks: list[asyncio.Task] = []
        self.events_lock = asyncio.Lock()  # one queue stream per session at a time (see event())
        self.bound = asyncio.Event()
        self.step_waiter: asyncio.Future | None = None
        self.run_waiter: asyncio.Future | None = None  # a Run sent over the socket, until run_end
        self.closing = False
        self.steps_done = 0

    def set(self, elem_id: str, value) -> None:
        self.values[self.gapp.by_elem[elem_id]] = value

    def get(self, elem_id: str):
        return self.values.get(self.gapp.by_elem[elem_id])

    async def open(self) -> None:
        self.stats.pages += 1
        # each page its own connections, as each browser tab has: closing the page drops them for sure
        self.http = httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(GRADIO_TIMEOUT_S),
                                      limits=httpx.Limits(max_connections=None, max_keepalive_connections=4))
        self.tasks.append(asyncio.create_task(self._heartbeat()))
        load = self.gapp.triggered(None, "load")
        hello = self.gapp.api("hello")
        ticket = None
        for fn in load:
            out = await self.event(fn)
            if fn == hello and out is not None:
                ticket = out[0] if isinstance(out[0], str) and out[0] else None
        # the calculators' timer: its first tick (after a second on the page) stops it once the model is ready
        for fn in self.gapp.triggered(None, "tick"):
            if self.gapp.deps[fn].get("api_name") == "calc_ready":
                await self.event(fn)
        if ticket is None:
            self.stats.error("no ticket", "hello returned no socket ticket")
            return
        scheme, host = self.base.split("://", 1)
        # a browser sends its page's Origin: the same-host check (app/live.py origin_allowed) is exercised
        self.ws = await connect(f"{'wss' if scheme == 'https' else 'ws'}://{host}/ws/lab?ticket={ticket}", proxy=None, max_size=None,
                                origin=self.base, ping_interval=None, open_timeout=GRADIO_TIMEOUT_S)
        self.tasks.append(asyncio.create_task(self._receive()))
        try:
            await asyncio.wait_for(self.bound.wait(), 30)
        except TimeoutError:
            self.stats.error("not bound", "no {\"type\": \"bound\"} within 30 s of opening the socket")

    async def close(self) -> None:
        """The tab closes: its socket and heartbeat stream end (Gradio then runs demo.unload)."""
        self.closing = True
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.http is not None:
            await self.http.aclose()

    async def _heartbeat(self) -> None:
        try:
            async with self.http.stream("GET", f"/gradio_api/heartbeat/{self.hash}",
                                        timeout=httpx.Timeout(None)) as resp:
                async for _ in resp.aiter_lines():
                    pass
            if not self.closing:
                self.stats.error("heartbeat ended", "the server closed the heartbeat stream")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is one counted error, the page carries on
            if not self.closing:
                self.stats.error("heartbeat failed", f"{type(exc).__name__}: {exc}")

    async def event(self, fn: int):
        """One Gradio event through the queue: join, then read this session's stream until it completes.
        Events of one page run one at a time: two open streams of one session would share its messages."""
        async with self.events_lock:
            try:
                r = await self.http.post("/gradio_api/queue/join", json={
                    "data": self.gapp.inputs(fn, self.values), "fn_index": fn, "session_hash": self.hash,
                    "event_data": None, "trigger_id": self.gapp.trigger_id(fn)})
                r.raise_for_status()
                event_id = r.json()["event_id"]
                async with self.http.stream("GET", "/gradio_api/queue/data",
                                            params={"session_hash": self.hash}) as resp:
                    resp.raise_for_status()
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        msg = json.loads(line[5:])
                        if msg.get("msg") == "process_completed" and msg.get("event_id") == event_id:
                            if not msg.get("success"):
                                self.stats.error("gradio event failed",
                                                 f"{self.gapp.deps[fn].get('api_name')}: {msg.get('output')}")
                                return None
                            data = (msg.get("output") or {}).get("data") or []
                            for value in data:  # a payload returned through Gradio (no socket) can hold an error
                                if isinstance(value, str) and value.startswith("{"):
                                    with contextlib.suppress(ValueError):
                                        self._check_message(json.loads(value))
                            return data
                        if msg.get("msg") == "unexpected_error":
                            raise RuntimeError(msg.get("message"))
                raise RuntimeError("the queue stream closed before the event completed")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                self.stats.error("gradio event failed", f"{self.gapp.deps[fn].get('api_name')}: "
                                                        f"{type(exc).__name__}: {exc}")
                return None

    def _check_message(self, payload) -> tuple[str | None, str]:
        kind, text = message_kind(payload)
        if kind in ("error", "warn"):
            self.stats.error(f"message {kind}", text)
        return kind, text

    async def _receive(self) -> None:
        try:
            async for raw in self.ws:
                msg = json.loads(raw)
                typ = msg.get("type")
                if typ == "payload":
                    p = msg.get("payload") or {}
                    kind, text = self._check_message(p)
                    if p.get("op") == "step" and self.step_waiter is not None and not self.step_waiter.done():
                        self.step_waiter.set_result((kind, text))
                elif typ == "run_end":
                    if self.run_waiter is not None and not self.run_waiter.done():
                        self.run_waiter.set_result(True)
                elif typ == "bound":
                    self.bound.set()
                elif typ == "unbound":
                    self.bound.clear()
                    self.stats.error("unbound", "the server says this tab's session is gone")
                elif typ == "error":
                    self.stats.error("socket error", str(msg.get("error")))
            if not self.closing:
                self.stats.error("socket dropped", f"closed by the server: {self.ws.close_code} {self.ws.close_reason}")
        except asyncio.CancelledError:
            raise
        except ConnectionClosed as exc:
            if not self.closing:
                self.stats.error("socket dropped", str(exc))
        except Exception as exc:  # noqa: BLE001
            if not self.closing:
                self.stats.error("socket receive failed", f"{type(exc).__name__}: {exc}")
        finally:
            if self.step_waiter is not None and not self.step_waiter.done():
                self.step_waiter.set_result(("dropped", ""))
            if self.run_waiter is not None and not self.run_waiter.done():
                self.run_waiter.set_result(False)

    def step_inputs(self) -> dict:
        v = self.get
        return {"prompt": v("prompt"), "chat": bool(v("chat")), "system": v("system") or "",
                "temperature": str(v("temperature")), "top_k": str(v("top_k")), "top_p": str(v("top_p")),
                "min_p": str(v("min_p")), "rep": str(v("repetition_penalty")),
                "freq": str(v("frequency_penalty")), "pres": str(v("presence_penalty")), "seed": str(v("seed")),
                "max_tokens": str(v("max_tokens")), "stop": v("stop") or "", "lang": v("lang"),
                "layer": str(v("layer")), "head": str(v("head")), "word": v("bpe_word") or "",
                "npos": str(v("neighbour_pos")), "visible": VISIBLE}

    async def run(self) -> bool:
        """Click Run as lab.js does once its socket is bound: {"op": "run"} over the socket. Returns when the
        server says the Run ended (run_end: Pause, or the sequence finished); False if the socket dropped."""
        self.run_waiter = asyncio.get_running_loop().create_future()
        try:
            await self.ws.send(json.dumps({"op": "run", "inputs": self.step_inputs()}, ensure_ascii=False))
        except ConnectionClosed as exc:
            if not self.closing:
                self.stats.error("socket dropped", f"on send: {exc}")
            return False
        return await self.run_waiter

    async def step(self, timeout_s: float) -> tuple[str | None, str] | None:
        """Click Step; the step payload's (message kind, text), or None after a timeout or a drop."""
        if self.ws is None or not self.bound.is_set():
            self.stats.error("step without socket", "the page has no bound socket")
            return None
        self.step_waiter = asyncio.get_running_loop().create_future()
        t = time.monotonic()
        try:
            await self.ws.send(json.dumps({"op": "step", "inputs": self.step_inputs()}, ensure_ascii=False))
            result = await asyncio.wait_for(self.step_waiter, timeout_s)
        except TimeoutError:
            self.stats.error("step timeout", f"no step payload within {timeout_s:.0f} s")
            return None
        except ConnectionClosed as exc:
            if not self.closing:
                self.stats.error("socket dropped", f"on send: {exc}")
            return None
        if result[0] == "dropped":
            return None
        self.stats.step(time.monotonic() - t, first=self.steps_done == 0)
        self.steps_done += 1
        return result

    async def reset(self) -> None:
        self.stats.resets += 1
        for fn in self.gapp.triggered("reset", "click"):
            await self.event(fn)

    async def use_prompt(self, n: int) -> None:
        """The n-th of PROMPTS in the prompt box, the page in its language."""
        lang, prompt = PROMPTS[n % len(PROMPTS)]
        self.set("prompt", prompt)
        await self.switch_lang(lang)

    async def switch_lang(self, lang: str) -> None:
        if self.get("lang") == lang:
            return
        self.set("lang", lang)
        # every server-side listener of the radio's change (relabel, calculators, ...), as the page fires them
        for fn in self.gapp.triggered("lang", "change"):
            await self.event(fn)


async def open_page(page: Page, i: int, max_tokens: int | None, prompt_no: int) -> Page:
    """Client i's page loaded (failures counted on its stats), with its seed, max tokens and the prompt_no-th prompt."""
    page.set("seed", 1000 + i)  # per client: the rooms' streams differ
    if max_tokens is not None:
        page.set("max_tokens", max_tokens)
    try:
        await page.open()  # the page-load events read no prompt: it is typed (and the language chosen) after
        await page.use_prompt(prompt_no)
    except Exception as exc:  # noqa: BLE001
        page.stats.error("page open failed", f"{type(exc).__name__}: {exc}")
    return page


async def user(i: int, base: str, gapp: GradioApp, stats: Stats, args, stop: asyncio.Event) -> None:
    """One person at a page: Step every 0.5-2 s, a new prompt (and language) per request, Reset now and then,
    a reload now and then (every 4th client)."""
    rng = random.Random(args.seed * 1000 + i)
    churner = args.churn_every > 0 and i % 4 == 3
    prompt_no = rng.randrange(len(PROMPTS))

    def next_churn() -> float:
        return time.monotonic() + rng.expovariate(1 / args.churn_every) if churner else math.inf

    async def new_page() -> Page:
        return await open_page(Page(base, gapp, stats), i, args.max_tokens, prompt_no)

    await asyncio.sleep(rng.uniform(0, min(3.0, args.minutes * 6)))  # a room does not arrive in one instant
    page = await new_page()
    churn_at, steps_since_reset, reset_after = next_churn(), 0, rng.randint(50, 70)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.uniform(args.think_min, args.think_max))
            if stop.is_set():
                break
            if time.monotonic() >= churn_at:  # a reload: this tab closes, a new one opens
                stats.churns += 1
                await page.close()
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                page, churn_at, steps_since_reset = await new_page(), next_churn(), 0
                continue
            if page.ws is None or not page.bound.is_set() or page.ws.close_code is not None:
                await page.close()  # already counted; a person reloads a broken page
                await asyncio.sleep(1.0)
                page = await new_page()
                continue
            result = await page.step(args.step_timeout)
            if result is None:
                if not stop.is_set():
                    await page.close()  # a stuck page gets reloaded, as a person would
                    page = await new_page()
                continue
            steps_since_reset += 1
            kind, text = result
            finished = kind == "info" and any(m in text for m in FINISHED_MARKERS)
            stats.finished += finished
            if finished or steps_since_reset >= reset_after:
                # the next request gets the next prompt, in its language
                prompt_no += 1
                await page.use_prompt(prompt_no)
                # finished: half the people press Reset, the others just Step again (a new request starts)
                if steps_since_reset >= reset_after or rng.random() < 0.5:
                    await page.reset()
                    steps_since_reset, reset_after = 0, rng.randint(50, 70)
    finally:
        await page.close()


async def sampler(base: str, pid: int | None, stats: Stats, stop: asyncio.Event) -> None:
    """Server RSS and /healthz once a second until the run ends, and once more at its end (the table reads each
    interval's last sample)."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as c:
        while True:
            final = stop.is_set()
            sessions = blocks = None
            t = time.monotonic()
            try:
                h = (await c.get("/healthz")).json()
                sessions, blocks = h.get("sessions"), h.get("kv_blocks_used")
                stats.healthz_max_s = max(stats.healthz_max_s, time.monotonic() - t)
            except (httpx.HTTPError, ValueError) as exc:  # not an error of the page's: reported on its own line
                stats.healthz_failed += 1
                stats.healthz_failure = f"{type(exc).__name__} after {time.monotonic() - t:.1f} s"
            # the end-of-run sample counts in the last interval even if it lands just past its edge
            stats.samples.append((min(time.monotonic(), stats.t0 + stats.duration - 1e-3) if final else
                                  time.monotonic(), rss_bytes(pid), sessions, blocks))
            if final:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def wait_freed(base: str, timeout_s: float) -> tuple[float | None, dict]:
    """Seconds until /healthz reports no sessions and no KV blocks in use (None if not within timeout_s)."""
    t0 = time.monotonic()
    last: dict = {}
    async with httpx.AsyncClient(base_url=base, timeout=10) as c:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                last = (await c.get("/healthz")).json()
                if "sessions" not in last or "kv_blocks_used" not in last:
                    return None, last  # the server does not report them: nothing to wait for
                if last["sessions"] == 0 and last["kv_blocks_used"] == 0:
                    return time.monotonic() - t0, last
            if time.monotonic() - t0 > timeout_s:
                return None, last
            await asyncio.sleep(0.5)


async def soak(base: str, pid: int | None, args) -> tuple[Stats, float | None, dict]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        gapp = GradioApp((await c.get("/config")).json())
    stats = Stats(t0=time.monotonic(), interval=args.interval, duration=args.minutes * 60)
    stats.rss_idle = rss_bytes(pid)
    cpu0 = cpu_seconds(pid)
    stop = asyncio.Event()
    # sampled while the clients are on (the table's rows); the close and the freeing are reported apart
    sample_task = asyncio.create_task(sampler(base, pid, stats, stop))
    users = [asyncio.create_task(user(i, base, gapp, stats, args, stop)) for i in range(args.clients)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.minutes * 60)
    stop.set()
    await sample_task
    cpu1 = cpu_seconds(pid)
    if cpu0 is not None and cpu1 is not None:
        stats.cpu_s = cpu1 - cpu0
    # each page finishes its click in flight, then closes (bounded: a stuck step is already an error)
    done, pending = await asyncio.wait(users, timeout=args.step_timeout + 30)
    for t in pending:
        stats.error("client did not stop", "cancelled")
        t.cancel()
    for t in done:
        if t.exception() is not None:
            stats.error("client crashed", f"{type(t.exception()).__name__}: {t.exception()}")
    freed_s, last = await wait_freed(base, args.free_timeout)
    await asyncio.sleep(1.0)  # release_memory runs right after the drop; give it a moment before reading
    stats.rss_after = rss_bytes(pid)
    return stats, freed_s, last


# ---- report ------------------------------------------------------------------------------------------------
def report(stats: Stats, freed_s: float | None, last: dict, args, server_tracebacks: int | None) -> bool:
    n_buckets = max(1, math.ceil(args.minutes * 60 / args.interval - 1e-9))
    unit = "min" if args.interval == 60 else f"{args.interval:g} s"
    print(f"\n| {unit} | steps | errors | p50 ms | p95 ms | RSS MB | sessions | KV blocks |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    rss_end = []
    for b in range(n_buckets):
        lat = stats.steps.get(b, []) + (sum((stats.steps.get(k, []) for k in stats.steps if k >= n_buckets), [])
                                        if b == n_buckets - 1 else [])
        errs = stats.errors.get(b, 0) + (sum(v for k, v in stats.errors.items() if k >= n_buckets)
                                         if b == n_buckets - 1 else 0)
        in_b = [s for s in stats.samples if stats.bucket(s[0]) == b]
        rss = in_b[-1][1] if in_b and in_b[-1][1] is not None else None
        sessions = in_b[-1][2] if in_b else None
        blocks = in_b[-1][3] if in_b else None
        rss_end.append(rss)
        fmt = (lambda x: f"{x * 1000:.0f}")
        print(f"| {b + 1} | {len(lat)} | {errs} | {fmt(percentile(lat, .5)) if lat else '-'} | "
              f"{fmt(percentile(lat, .95)) if lat else '-'} | {f'{rss / 2**20:.0f}' if rss else 'n/a'} | "
              f"{sessions if sessions is not None else 'n/a'} | {blocks if blocks is not None else 'n/a'} |")
    all_lat = sum(stats.steps.values(), [])
    total_errors = sum(stats.errors.values())
    print(f"\nsteps {len(all_lat)}, pages opened {stats.pages}, reloads {stats.churns}, finished sequences "
          f"{stats.finished}, resets {stats.resets}"
          + (f", latency p50 {percentile(all_lat, .5) * 1000:.0f} ms p95 {percentile(all_lat, .95) * 1000:.0f} ms "
             f"max {max(all_lat) * 1000:.0f} ms" if all_lat else ""))
    if stats.first_steps:
        later = list(all_lat)
        for x in stats.first_steps:
            later.remove(x)
        print(f"a page's first step: p50 {percentile(stats.first_steps, .5) * 1000:.0f} ms, p95 "
              f"{percentile(stats.first_steps, .95) * 1000:.0f} ms ({len(stats.first_steps)} pages); later steps: "
              + (f"p50 {percentile(later, .5) * 1000:.0f} ms, p95 {percentile(later, .95) * 1000:.0f} ms"
                 if later else "none"))
    if stats.cpu_s is not None and all_lat:
        wall = args.minutes * 60
        print(f"server CPU: {stats.cpu_s:.0f} s in {wall:.0f} s ({stats.cpu_s / wall:.2f} cores), "
              f"{stats.cpu_s / len(all_lat):.2f} s per step (page loads, resets and sockets included)")
    print(f"/healthz while the clients were on: slowest answer {stats.healthz_max_s * 1000:.0f} ms"
          + (f", {stats.healthz_failed} unanswered ({stats.healthz_failure})" if stats.healthz_failed else ""))
    if stats.rss_idle and stats.rss_after:
        print(f"server RSS: {stats.rss_idle / 2**20:.0f} MB before the first page, {stats.rss_after / 2**20:.0f} MB "
              f"after the close")
    if stats.kinds:
        print("errors by kind: " + ", ".join(f"{k} {n}" for k, n in stats.kinds.most_common()))
        for e in stats.examples:
            print(f"  e.g. {e}")
    if server_tracebacks:
        print(f"server log: {server_tracebacks} traceback(s)")

    verdicts = []
    errors_all = total_errors + (server_tracebacks or 0)
    ok_errors = errors_all == 0 and len(all_lat) > 0
    verdicts.append(ok_errors)
    parts = [f"errors {total_errors}" + (f" (+{server_tracebacks} server tracebacks)" if server_tracebacks else "")
             + f" {'PASS' if ok_errors else 'FAIL'}" + ("" if all_lat else " (no step completed)")]
    if len(rss_end) >= 2 and rss_end[0] and rss_end[-1]:
        growth = rss_end[-1] / rss_end[0] - 1
        ok_rss = growth < args.rss_growth
        verdicts.append(ok_rss)
        parts.append(f"RSS growth after warm-up {growth * 100:+.1f}% ({rss_end[0] / 2**20:.0f} -> "
                     f"{rss_end[-1] / 2**20:.0f} MB) {'PASS' if ok_rss else 'FAIL'}")
    else:
        parts.append("RSS growth n/a (" + ("no server pid" if not any(rss_end) else "a single interval") + ")")
    if "sessions" in last and "kv_blocks_used" in last:
        ok_free = freed_s is not None
        verdicts.append(ok_free)
        parts.append(f"freed sessions {last['sessions']} kv_blocks_used {last['kv_blocks_used']}"
                     + (f" after {freed_s:.1f} s" if ok_free else f" still held after {args.free_timeout:.0f} s")
                     + f" {'PASS' if ok_free else 'FAIL'}")
    else:
        parts.append("freed n/a (/healthz reports no sessions/kv_blocks_used)")
    ok = all(verdicts)
    print("SUMMARY: " + " | ".join(parts) + f" => {'PASS' if ok else 'FAIL'}")
    return ok


# ---- shared with bench/room.py: the server a bench starts or attaches to --------------------------------
def server_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--url", default="", help="attach to a running server, e.g. http://127.0.0.1:7860 (the freed target expects these clients to "
                         "be its only visitors)")
    ap.add_argument("--pid", type=int, default=None,
                    help="with --url: the server's pid for RSS (default: whoever listens on the url's local port)")
    ap.add_argument("--port", type=int, default=0, help="port for the server this script starts (default: a free one)")
    ap.add_argument("--max-sessions", type=int, default=None, help="for the started server (default: clients + 4)")
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for the model to load")
    ap.add_argument("--server-log", default="", help="keep the started server's output here")


def bring_up(args, what: str, log_prefix: str):
    """Start `python -m app` (or attach to --url) and wait until its model is ready: (base url, process or None,
    server pid or None, log path or None); None (after printing why, the server stopped) when it is not."""
    proc, log_path, pid = None, None, args.pid
    if args.url:
        base = args.url.rstrip("/")
    else:
        port = args.port or free_port()
        base = f"http://127.0.0.1:{port}"
        log_path = Path(args.server_log) if args.server_log else Path(tempfile.mkdtemp(prefix=log_prefix)) / "server.log"
        proc = start_server(port, args.max_sessions or args.clients + 4, log_path)
        pid = proc.pid
    try:
        t = time.monotonic()
        asyncio.run(wait_ready(base, proc, args.ready_timeout))
        if pid is None and re.match(r"https?://(127\.0\.0\.1|localhost)(:\d+)?$", base):
            # looked up once it answers: a server still starting may not listen yet
            pid = pid_listening_on(int(base.rsplit(":", 1)[1]) if base.count(":") == 2 else 80)
        idle = rss_bytes(pid)
        print(f"server {base} ready after {time.monotonic() - t:.1f} s (pid {pid if pid else 'unknown'}, RSS "
              f"{f'{idle / 2**20:.0f} MB' if idle else 'n/a'}); {what}", flush=True)
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"SUMMARY: server not available: {exc} => FAIL")
        if log_path is not None and log_path.exists():
            print(log_path.read_text()[-3000:])
        if proc is not None:
            stop_server(proc)
        return None
    except BaseException:
        if proc is not None:
            stop_server(proc)
        raise
    return base, proc, pid, log_path


def with_server(args, what: str, log_prefix: str, work):
    """bring_up, then asyncio.run(work(base url, server pid)), then the started server stopped: (work's result,
    the server's exit code if it exited meanwhile else None, server_tracebacks); None if it was not available."""
    up = bring_up(args, what, log_prefix)
    if up is None:
        return None
    base, proc, pid, log_path = up
    try:
        result = asyncio.run(work(base, pid))
        exited = proc.returncode if proc is not None and proc.poll() is not None else None
    finally:
        if proc is not None:
            stop_server(proc)
    return result, exited, server_tracebacks(log_path)


def server_tracebacks(log_path: Path | None) -> int | None:
    """Tracebacks in the log of the server this script started (the first one printed); None without a log."""
    if log_path is None or not log_path.exists():
        return None
    text = log_path.read_text(errors="replace")
    tracebacks = text.count("Traceback (most recent call last)")
    if tracebacks:
        i = text.find("Traceback (most recent call last)")
        print(f"server log ({log_path}), first traceback:\n{text[i:i + 3000]}")
    return tracebacks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=60.0,
                    help="seconds per table row; the first row is the warm-up the RSS growth is measured from")
    server_options(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--think-min", type=float, default=0.5, help="seconds between a step's payload and the next click")
    ap.add_argument("--think-max", type=float, default=2.0)
    ap.add_argument("--churn-every", type=float, default=60.0,
                    help="mean seconds between reloads of every 4th client's page (0: no reloads)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="the page's max tokens box (default: the page's own, 64); smaller finishes sequences sooner")
    ap.add_argument("--step-timeout", type=float, default=60.0, help="a step payload later than this is an error")
    ap.add_argument("--free-timeout", type=float, default=60.0, help="target: all freed within this after the close")
    ap.add_argument("--rss-growth", type=float, default=0.10, help="target: RSS growth after warm-up below this")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.minutes <= 0 or args.interval <= 0:
        ap.error("--clients, --minutes and --interval must be positive")

    done = with_server(args, f"{args.clients} clients for {args.minutes:g} min", "soak-",
                       lambda base, pid: soak(base, pid, args))
    if done is None:
        return 2
    (stats, freed_s, last), exited, tracebacks = done
    if exited is not None:
        stats.error("server exited", f"code {exited}")
    return 0 if report(stats, freed_s, last, args, tracebacks) else 1


if __name__ == "__main__":
    sys.exit(main())
