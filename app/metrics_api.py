"""GET /metrics: the numbers serving engines export, in Prometheus' text format (version 0.0.4).

Two kinds of numbers. The room's, read from the shared engine when scraped: sequences running and waiting (every
owner's: tabs, the lecture, API clients), KV-cache usage, prefix-cache queries and hits, preemptions, steps and
generated tokens, tokens per engine step, the KV cache's configuration. And the API's own, counted as requests
run (`ApiMetrics`): time to first token, inter-token latency, end-to-end latency and each request's phases
(queued, prefill, decode), its prompt and generation tokens and its n and max_tokens, finished requests by reason.

Every family is written under two prefixes (`--metrics-prefix both`, the default): `inferlab:NAME` as the lab has
always written it (no labels but its own, so existing scrapers and the attach page read it unchanged) and
`vllm:NAME` with vLLM's labels `model_name` and `engine`, so dashboards made for vLLM (which filter on
`vllm:*{model_name="..."}`) read the lab as they read vLLM. Names, types, units and buckets are vLLM's
(vllm/v1/metrics/loggers.py). Written by hand: the format is a few lines per metric and the app needs no client
library for it (tests parse it with prometheus_client's parser).
"""
from __future__ import annotations

import threading
import time
from collections import Counter

# vLLM's buckets (vllm/v1/metrics/loggers.py), so a vLLM dashboard's quantiles mean the same here
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # vLLM's request_latency_buckets: e2e, queue, prefill, decode, inference
N_BUCKETS = (1, 2, 5, 10, 20)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREFIX = "inferlab:"
PREFIXES = {"both": ("inferlab:", "vllm:"), "inferlab": ("inferlab:",), "vllm": ("vllm:",)}
ENGINE = "0"  # vLLM's `engine` label: the index of the engine core; the lab runs one


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: vLLM's buckets for token counts."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # per bucket, not cumulative (summed when written)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += times
                break
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for upper, n in zip(self.buckets, self.counts):
            running += n
            out.append((str(upper), running))
        return out + [("+Inf", self.count)]


class RequestClock:
    """When one API request's phases began and ended, on the room loop's wall clock (time.monotonic), as vLLM
    defines them: queued from arrival until the first engine step that runs any of its sequences; prefill from
    the start of that step to the end of the step that sampled its first token; decode from there to the end of
    the step that sampled its last token; inference = prefill + decode. The steps' start and end are the room's
    own stamps (Room.step_wall), not the time the request's pump thread read the event: that thread runs at a
    lower priority than the engine (app/engine_turn.py) and may read a step late."""

    def __init__(self, arrival: float):
        self.arrival = arrival
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None

    def saw(self, event, room) -> None:
        """One of the owner's StepEvents (its own sequences only, StepEvent.for_owner)."""
        if not event.seqs:
            return
        wall = room.step_wall(event.step) if hasattr(room, "step_wall") else None
        now = time.monotonic()
        start, end = wall if wall is not None else (now, now)
        if self.scheduled is None and any(s.num_processed > 0 for s in event.seqs):
            self.scheduled = start
        if any(s.new_token is not None for s in event.seqs):
            if self.first_token is None:
                self.first_token = end
            self.last_token = end

    def phases(self, end: float) -> tuple[float, float, float]:
        """(queued, prefill, decode) seconds; a request that ended before a phase (aborted while waiting) spends
        the rest of its time in the phase it was in."""
        scheduled = self.scheduled if self.scheduled is not None else end
        first = self.first_token if self.first_token is not None else max(end, scheduled)
        last = self.last_token if self.last_token is not None else first
        return max(0.0, scheduled - self.arrival), max(0.0, first - scheduled), max(0.0, last - first)


class ApiMetrics:
    """What the API's requests did, counted as they run (thread-safe: pump threads report here)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(E2E_BUCKETS)
        self.prefill = Histogram(E2E_BUCKETS)
        self.decode = Histogram(E2E_BUCKETS)
        self.inference = Histogram(E2E_BUCKETS)
        self.n = Histogram(N_BUCKETS)
        self.token_hists: dict[str, Histogram] | None = None  # made once the model's context length is known
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

    def request_finished(self, reason: str, generated: int, seconds: float, run=None) -> None:
        """A request ended (finished or aborted). `run`, the RoomRun, adds vLLM's per-request histograms: its
        phases (run.clock), prompt and generation tokens, and its n and max_tokens parameters."""
        with self._lock:
            self.generation_tokens += generated
            self.in_flight -= 1
            self.finished[reason] += 1
            self.e2e.observe(seconds)
            if run is None:
                return
            queued, prefill, decode = run.clock.phases(time.monotonic())
            self.queue.observe(queued)
            self.prefill.observe(prefill)
            self.decode.observe(decode)
            self.inference.observe(prefill + decode)
            hists = self._token_hists(run.engine.max_model_len)
            hists["request_prompt_tokens"].observe(run.prompt_tokens)
            hists["request_generation_tokens"].observe(generated)
            self.n.observe(run.job.n)
            # the max_tokens each choice ran with (a default settled by the prompt's length), as vLLM observes
            # its sampling params' max_tokens; the first choice's stands for the request
            choices = run.job.choices()
            if choices:
                hists["request_params_max_tokens"].observe(choices[0][2].max_tokens)

    def _token_hists(self, max_model_len: int) -> dict[str, Histogram]:
        if self.token_hists is None:
            buckets = build_1_2_5_buckets(max_model_len)
            self.token_hists = {name: Histogram(buckets) for name in
                                ("request_prompt_tokens", "request_generation_tokens", "request_params_max_tokens")}
        return self.token_hists

    def lines(self, model_name: str = "", prefixes: tuple[str, ...] = (PREFIX,), max_model_len: int | None = None
              ) -> list[str]:
        w = Writer(prefixes, model_name)
        with self._lock:
            if max_model_len is not None:
                self._token_hists(max_model_len)
            w.value("api_requests_in_flight", "gauge", "/v1 requests being generated now", self.in_flight)
            w.value("prompt_tokens_total", "counter", "prompt tokens of /v1 requests", self.prompt_tokens)
            w.value("generation_tokens_total", "counter", "tokens generated for /v1 requests",
                    self.generation_tokens)
            reasons = self.finished or Counter({"stop": 0})
            w.samples("request_success_total", "counter", "/v1 requests ended, by finish reason",
                      [({"finished_reason": r}, n) for r, n in sorted(reasons.items())])
            w.histogram("time_to_first_token_seconds", "from a /v1 request's arrival to its first token, per "
                        "choice", self.ttft)
            w.histogram("inter_token_latency_seconds", "between two tokens of one choice", self.itl)
            # vLLM's older name for the same gaps, which its example dashboards still draw
            w.histogram("time_per_output_token_seconds", "between two tokens of one choice", self.itl)
            w.histogram("e2e_request_latency_seconds", "from a /v1 request's arrival to its end", self.e2e)
            w.histogram("request_queue_time_seconds", "from a /v1 request's arrival to the start of the first "
                        "engine step that ran it (WAITING)", self.queue)
            w.histogram("request_prefill_time_seconds", "from its first engine step to the end of the step that "
                        "sampled its first token (PREFILL)", self.prefill)
            w.histogram("request_decode_time_seconds", "from its first token to its last (DECODE)", self.decode)
            w.histogram("request_inference_time_seconds", "prefill + decode (RUNNING)", self.inference)
            for name, text in (("request_prompt_tokens", "prompt tokens of a /v1 request (all its prompts)"),
                               ("request_generation_tokens", "tokens generated for a /v1 request (all its "
                                                             "choices)"),
                               ("request_params_max_tokens", "the max_tokens a /v1 request ran with")):
                if self.token_hists is not None:
                    w.histogram(name, text, self.token_hists[name])
            w.histogram("request_params_n", "the n parameter of a /v1 request", self.n)
        return w.lines


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Writer:
    """Families under each prefix: `inferlab:` with only the family's own labels, `vllm:` with vLLM's
    model_name and engine labels first."""

    def __init__(self, prefixes: tuple[str, ...], model_name: str):
        self.prefixes = prefixes
        self.model_name = model_name
        self.lines: list[str] = []

    def _labels(self, prefix: str, own: dict, le: str | None = None) -> str:
        labels = {"model_name": self.model_name, "engine": ENGINE} if prefix == "vllm:" else {}
        labels.update(own)
        if le is not None:
            labels["le"] = le
        if not labels:
            return ""
        return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"

    def _head(self, prefix: str, name: str, kind: str, text: str) -> None:
        self.lines += [f"# HELP {prefix}{name} {text}", f"# TYPE {prefix}{name} {kind}"]

    def samples(self, name: str, kind: str, text: str, samples: list[tuple[dict, object]]) -> None:
        for prefix in self.prefixes:
            self._head(prefix, name, kind, text)
            self.lines += [f"{prefix}{name}{self._labels(prefix, own)} {value}" for own, value in samples]

    def value(self, name: str, kind: str, text: str, value) -> None:
        self.samples(name, kind, text, [({}, value)])

    def histogram(self, name: str, text: str, hist: Histogram) -> None:
        for prefix in self.prefixes:
            self._head(prefix, name, "histogram", text)
            full = prefix + name
            self.lines += [f"{full}_bucket{self._labels(prefix, {}, le)} {n}" for le, n in hist.cumulative()]
            self.lines += [f"{full}_sum{self._labels(prefix, {})} {hist.sum:.6f}",
                           f"{full}_count{self._labels(prefix, {})} {hist.count}"]


def room_lines(room, w: Writer) -> None:
    """The shared engine's state now; no room yet (the model is loading) writes model_ready 0 only."""
    w.value("model_ready", "gauge", "1 once the model has loaded and the room's engine runs", 0 if room is None else 1)
    if room is None:
        return
    engine = room.engine
    states = Counter()
    for sid in engine.seq_ids():
        try:
            states[engine.seq_view(sid).status] += 1
        except ValueError:  # released while we counted
            pass
    kv = engine.kv_stats()
    stats = room.stats()
    w.value("num_requests_running", "gauge", "sequences admitted and not finished (every owner's)", states["running"])
    w.value("num_requests_waiting", "gauge", "sequences waiting for admission or recompute", states["waiting"])
    w.value("kv_cache_usage_perc", "gauge", "fraction of the KV pool's blocks in use (1 = full)",
            f"{kv.used / kv.num_blocks:.6f}")
    w.samples("kv_cache_blocks", "gauge", "KV blocks by state: used, cached (reusable prefix), free",
              [({"state": s}, getattr(kv, s)) for s in ("used", "cached", "free")])
    w.value("prefix_cache_queries_total", "counter", "prompt tokens looked up in the prefix cache",
            kv.prefix_query_tokens)
    w.value("prefix_cache_hits_total", "counter", "prompt tokens found in the prefix cache", kv.prefix_hit_tokens)
    rate = kv.prefix_hit_tokens / kv.prefix_query_tokens if kv.prefix_query_tokens else 0.0
    w.value("prefix_cache_hit_rate", "gauge", "prefix_cache_hits_total / prefix_cache_queries_total", f"{rate:.6f}")
    w.value("num_preemptions_total", "counter", "sequences preempted (KV freed, recomputed later)", kv.preemptions)
    w.value("room_steps_total", "counter", "engine steps the room has run", stats["steps"])
    w.value("room_generation_tokens_total", "counter", "tokens generated for every owner (tabs, lecture, API)",
            stats["tokens"])
    w.value("room_owners", "gauge", "owners in the room (tabs, the lecture, API requests)", stats["owners"])
    # every step of the room (tabs and the lecture as well as API requests): prompt tokens prefilled in the step
    # plus tokens sampled in it, as vLLM counts an iteration's prompt and generation tokens
    steps = Histogram(ITERATION_BUCKETS)
    for tokens, count in room.step_token_counts().items():
        steps.observe(tokens, count)
    w.histogram("iteration_tokens_total", "tokens per engine step (prompt tokens prefilled + tokens sampled)", steps)
    # vLLM's CacheConfig as an info gauge; the lab's KV cache is in the model's own dtype, vLLM's "auto"
    prefix_caching = getattr(getattr(engine, "blocks", None), "enable_prefix_caching", True)
    w.samples("cache_config_info", "gauge", "the KV cache's configuration (labels); always 1",
              [({"block_size": kv.block_size, "cache_dtype": "auto", "enable_prefix_caching": str(prefix_caching),
                 "num_gpu_blocks": kv.num_blocks, "num_cpu_blocks": "None",
                 "kv_bytes_per_token": kv.bytes_per_token}, 1)])


def render(room, api: ApiMetrics, model_name: str = "", prefixes: tuple[str, ...] = (PREFIX,)) -> str:
    w = Writer(prefixes, model_name)
    room_lines(room, w)
    max_len = room.engine.max_model_len if room is not None else None
    return "\n".join(w.lines + api.lines(model_name, prefixes, max_len)) + "\n"
