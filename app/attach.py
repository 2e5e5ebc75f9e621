"""Attach mode's client side: the lab pointed at a running OpenAI-compatible server (vLLM, SGLang, llama.cpp's
server, another lab) instead of its own engine.

The lab stays read-only towards the server except for the requests its user sends: `AttachTarget.stream_chat`
sends one streaming chat request with logprobs and yields an `AttachRun` as each chunk arrives (the deltas, each
token's top-N log-probabilities as the server reports them, arrival times measured here); `scrape` reads the
server's /metrics into a bounded time series of the quantities serving engines export under their own names
(vLLM, SGLang, llama.cpp, this lab). What the server does not expose — attention, block tables, the logit lens —
is not invented: app/charts/attach.py says so.
"""
from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import httpx

MAX_PROMPT_CHARS = 20000
MAX_TOKENS = 2048
MAX_TOP = 20
SERIES_POINTS = 600  # /metrics samples kept (ten minutes at one a second)
SCRAPE_EVERY_S = 1.0
ABSENT_BACKOFF_S = (2.0, 60.0)  # after a 404 from /metrics: wait 2 s, doubling to a minute, before asking again
ABSENT_STATUS = (404, 405, 501)  # the server has no /metrics (llama-cpp-python's server answers 404)

# Each quantity the metrics chart draws, and the names serving engines export it under (after their prefix:
# "vllm:", "sglang:", "llamacpp:", "inferlab:").
QUANTITIES = {
    "kv_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage", "kv_cache_usage_ratio"),
    "running": ("num_requests_running", "num_running_reqs", "requests_processing"),
    "waiting": ("num_requests_waiting", "num_queue_reqs", "requests_deferred"),
    "prefix_hits": ("prefix_cache_hits_total", "prefix_cache_hits"),
    "prefix_queries": ("prefix_cache_queries_total", "prefix_cache_queries"),
    "hit_rate": ("cache_hit_rate", "prefix_cache_hit_rate"),
    "preemptions": ("num_preemptions_total", "num_preemptions"),
}
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass
class Token:
    text: str  # the token as the server names it
    logprob: float | None
    top: list[tuple[str, float]]  # the server's top-N: (token, logprob), most likely first
    delta: str  # the text this chunk added
    t: float  # seconds from sending the request to this chunk's arrival


@dataclass
class AttachRun:
    prompt: str
    params: dict
    tokens: list[Token] = field(default_factory=list)
    ttft: float | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    error: str = ""
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(t.delta for t in self.tokens)


def parse_metrics(text: str) -> dict[str, float]:
    """{quantity: value} from Prometheus text: each QUANTITIES entry found under any engine's name.

    One reading per quantity: a server may write a family under two prefixes (this lab's `--metrics-prefix both`,
    the default, writes `inferlab:NAME` and `vllm:NAME`) or under two of its names (vLLM with its deprecated
    gpu_cache_usage_perc shown beside kv_cache_usage_perc), and adding those up would count it twice. So the
    `vllm:` reading is taken where there is one (what vLLM itself sends), else the `inferlab:` one, else every
    prefix found; of the names under it, the first QUANTITIES lists. The samples of that one name are summed over
    their labels, as a server with several models or engines reports one per label set."""
    readings: dict[str, dict[tuple[str, str], float]] = {}  # quantity -> {(prefix, name): value summed over labels}
    by_suffix = {name: q for q, names in QUANTITIES.items() for name in names}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        prefix, _, name = m.group(1).rpartition(":")
        q = by_suffix.get(name)
        if q is None:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(v):
            got = readings.setdefault(q, {})
            got[prefix, name] = got.get((prefix, name), 0.0) + v
    values = {q: _one_reading(QUANTITIES[q], got) for q, got in readings.items()}
    if "hit_rate" not in values and values.get("prefix_queries"):
        values["hit_rate"] = values.get("prefix_hits", 0.0) / values["prefix_queries"]
    return values


PREFERRED_PREFIXES = ("vllm", "inferlab")  # whichever comes first is read when a server writes both


def _one_reading(names: tuple[str, ...], got: dict[tuple[str, str], float]) -> float:
    """The value of one quantity from its readings {(prefix, name): value}: one prefix and one name (see
    parse_metrics)."""
    prefixes = {prefix for prefix, _ in got}
    chosen = next(({p} for p in PREFERRED_PREFIXES if p in prefixes), prefixes)
    name = next(n for n in names if any((p, n) in got for p in chosen))
    return sum(got[p, name] for p in chosen if (p, name) in got)


class AttachTarget:
    def __init__(self, url: str, api_key: str | None = None, model: str | None = None):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.series: deque = deque(maxlen=SERIES_POINTS)  # (unix time, {quantity: value})
        self.metrics_note = ""  # why there are no metrics, when there are none
        self.metrics_absent = False  # the server answered that it has no /metrics (404): asked again after backoff
        self.scrapes = 0  # requests sent to the server's /metrics
        self._backoff = 0.0  # seconds until the next request after the last 404 (0: none)
        self._scraped = 0.0
        self._lock = threading.Lock()

    def resolve_model(self, timeout: float = 30) -> str:
        """--model, else the first model the server's /v1/models lists (read either way: the server must answer)."""
        r = httpx.get(self.url + "/v1/models", headers=self.headers, timeout=timeout)
        r.raise_for_status()
        if not self.model:
            self.model = r.json()["data"][0]["id"]
        return self.model

    def retry_s(self) -> float:
        """Seconds until /metrics is worth asking again: SCRAPE_EVERY_S, or the backoff after a 404."""
        return max(SCRAPE_EVERY_S, self._backoff)

    def scrape(self) -> deque:
        """Read the server's /metrics (at most once a second, whoever asks) into the series. After a 404 (the
        server has none: llama-cpp-python's) it is asked again only after 2 s, then 4, 8, ... up to a minute."""
        with self._lock:
            if time.time() - self._scraped < self.retry_s():
                return self.series
            self._scraped = time.time()
            self.scrapes += 1
        try:
            r = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10)
            if r.status_code in ABSENT_STATUS:
                with self._lock:
                    lo, hi = ABSENT_BACKOFF_S
                    self._backoff = min(hi, max(lo, self._backoff * 2))
                    self.metrics_absent = True
                self.metrics_note = f"absent: HTTP {r.status_code}"
                return self.series
            r.raise_for_status()
            values = parse_metrics(r.text)
            self.metrics_note = "" if values else "no_known_metrics"
            self._backoff, self.metrics_absent = 0.0, False
        except httpx.HTTPError as exc:
            self.metrics_note, values = f"unreachable: {exc}"[:200], {}
        if values:
            with self._lock:
                self.series.append((time.time(), values))
        return self.series

    def stream_chat(self, prompt: str, params: dict, system: str | None = None):
        """Send one streaming chat request with logprobs; yield the run after every chunk (the same object,
        growing), last with done=True. Errors end the run with `error` set, never an exception."""
        run = AttachRun(prompt, params)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        body = {"model": self.resolve_model(), "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, "logprobs": True, **params}
        sent = time.perf_counter()
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, headers=self.headers,
                              timeout=httpx.Timeout(30, read=600)) as r:
                if r.status_code != 200:
                    r.read()
                    run.error = _error_text(r)
                else:
                    for line in r.iter_lines():
                        if _take(run, line, time.perf_counter() - sent):
                            yield run
        except httpx.HTTPError as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:300]
        run.done = True
        yield run


def _error_text(r) -> str:
    try:
        return f"HTTP {r.status_code}: {r.json()['error']['message']}"[:300]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {r.status_code}: {r.text[:200]}"


def _take(run: AttachRun, line: str, t: float) -> bool:
    """One server-sent line into the run; True when it changed something the page shows."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if data == "[DONE]":
        return False
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    if "error" in chunk:
        run.error = str(chunk["error"].get("message", chunk["error"]))[:300]
        return True
    if chunk.get("usage"):
        run.usage = chunk["usage"]
    changed = bool(chunk.get("usage"))
    for choice in chunk.get("choices") or []:
        delta = (choice.get("delta") or {}).get("content") or ""
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        if entries:
            for i, e in enumerate(entries):  # a chunk may carry several tokens (llama.cpp, vLLM under load)
                top = [(x.get("token", ""), float(x["logprob"])) for x in e.get("top_logprobs") or []
                       if x.get("logprob") is not None]
                run.tokens.append(Token(e.get("token", ""), e.get("logprob"), top, delta if i == 0 else "", t))
            changed = True
        elif delta:
            run.tokens.append(Token(delta, None, [], delta, t))
            changed = True
        if delta and run.ttft is None:
            run.ttft = t
        if choice.get("finish_reason"):
            run.finish_reason = choice["finish_reason"]
            changed = True
    return changed
