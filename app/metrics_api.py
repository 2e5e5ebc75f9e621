"""GET /metrics: the numbers serving engines export, in Prometheus' text format (version 0.0.4).

Two kinds of numbers. The room's, read from the shared engine when scraped: sequences running and waiting (every
owner's: tabs, the lecture, API clients), KV-cache usage, prefix-cache queries and hits, preemptions, steps and
generated tokens. And the API's own, counted as requests run (`ApiMetrics`): time to first token, inter-token
latency and end-to-end latency histograms, prompt and generation tokens, finished requests by reason. Names
follow vLLM's (`vllm:time_to_first_token_seconds` is `inferlab:time_to_first_token_seconds`), so dashboards
made for vLLM read them with the prefix changed. Written by hand: the format is a few lines per metric and
the app needs no client library for it (tests parse it with prometheus_client's parser).
"""
from __future__ import annotations

import threading
from collections import Counter

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 240.0)
PREFIX = "inferlab:"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # per bucket, not cumulative (summed when written)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for upper, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{upper}"}} {running}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class ApiMetrics:
    """What the API's requests did, counted as they run (thread-safe: pump threads report here)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.in_flight = 0
        self.finished: Counter = Counter()

    def request_started(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.in_flight += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def token_gap(self, seconds: float) -> None:
        with self._lock:
            self.itl.observe(seconds)

    def request_finished(self, reason: str, generated: int, seconds: float) -> None:
        with self._lock:
            self.generation_tokens += generated
            self.in_flight -= 1
            self.finished[reason] += 1
            self.e2e.observe(seconds)

    def lines(self) -> list[str]:
        with self._lock:
            out = _metric("api_requests_in_flight", "gauge", "/v1 requests being generated now", self.in_flight)
            out += _metric("prompt_tokens_total", "counter", "prompt tokens of /v1 requests", self.prompt_tokens)
            out += _metric("generation_tokens_total", "counter", "tokens generated for /v1 requests",
                           self.generation_tokens)
            out += _head("request_success_total", "counter", "/v1 requests ended, by finish reason")
            reasons = self.finished or Counter({"stop": 0})
            out += [f'{PREFIX}request_success_total{{finished_reason="{r}"}} {n}' for r, n in sorted(reasons.items())]
            for name, hist, text in (("time_to_first_token_seconds", self.ttft, "from a /v1 request's arrival to "
                                      "its first token, per choice"),
                                     ("inter_token_latency_seconds", self.itl, "between two tokens of one choice"),
                                     ("e2e_request_latency_seconds", self.e2e, "from a /v1 request's arrival "
                                      "to its end")):
                out += _head(name, "histogram", text) + hist.lines(PREFIX + name)
            return out


def _head(name: str, kind: str, text: str) -> list[str]:
    return [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} {kind}"]


def _metric(name: str, kind: str, text: str, value) -> list[str]:
    return _head(name, kind, text) + [f"{PREFIX}{name} {value}"]


def room_lines(room) -> list[str]:
    """The shared engine's state now; no room yet (the model is loading) writes model_ready 0 only."""
    out = _metric("model_ready", "gauge", "1 once the model has loaded and the room's engine runs",
                  0 if room is None else 1)
    if room is None:
        return out
    engine = room.engine
    states = Counter()
    for sid in engine.seq_ids():
        try:
            states[engine.seq_view(sid).status] += 1
        except ValueError:  # released while we counted
            pass
    kv = engine.kv_stats()
    stats = room.stats()
    out += _metric("num_requests_running", "gauge", "sequences admitted and not finished (every owner's)",
                   states["running"])
    out += _metric("num_requests_waiting", "gauge", "sequences waiting for admission or recompute", states["waiting"])
    out += _metric("kv_cache_usage_perc", "gauge", "fraction of the KV pool's blocks in use (1 = full)",
                   f"{kv.used / kv.num_blocks:.6f}")
    out += _head("kv_cache_blocks", "gauge", "KV blocks by state: used, cached (reusable prefix), free")
    out += [f'{PREFIX}kv_cache_blocks{{state="{s}"}} {getattr(kv, s)}' for s in ("used", "cached", "free")]
    out += _metric("prefix_cache_queries_total", "counter", "prompt tokens looked up in the prefix cache",
                   kv.prefix_query_tokens)
    out += _metric("prefix_cache_hits_total", "counter", "prompt tokens found in the prefix cache",
                   kv.prefix_hit_tokens)
    rate = kv.prefix_hit_tokens / kv.prefix_query_tokens if kv.prefix_query_tokens else 0.0
    out += _metric("prefix_cache_hit_rate", "gauge", "prefix_cache_hits_total / prefix_cache_queries_total",
                   f"{rate:.6f}")
    out += _metric("num_preemptions_total", "counter", "sequences preempted (KV freed, recomputed later)",
                   kv.preemptions)
    out += _metric("room_steps_total", "counter", "engine steps the room has run", stats["steps"])
    out += _metric("room_generation_tokens_total", "counter", "tokens generated for every owner (tabs, lecture, API)",
                   stats["tokens"])
    out += _metric("room_owners", "gauge", "owners in the room (tabs, the lecture, API requests)", stats["owners"])
    return out


def render(room, api: ApiMetrics) -> str:
    return "\n".join(room_lines(room) + api.lines()) + "\n"
