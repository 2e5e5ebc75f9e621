"""Attach mode's client side: the lab pointed at a running OpenAI-compatible server (vLLM, SGLang, llama.cpp's
server, another lab) instead of its own engine.

The lab stays read-only towards the server except for the requests its user sends: `AttachTarget.stream_chat`
sends one streaming chat request with logprobs and yields an `AttachRun` as each chunk arrives (the deltas, each
token's top-N log-probabilities as the server reports them, arrival times measured here); `scrape` reads the
server's /metrics into a bounded time series of the quantities serving engines export under their own names
(vLLM, SGLang, llama.cpp, this lab). What the server does not expose — attention, block tables, the logit lens —
is not invented: app/charts/attach.py says so.

Where the page may point it (`POST /attach/target`): `parse_target_url` normalises the URL (a numeric host in any
spelling the resolver takes, `0x7f000001`, `2130706433`, `127.1`, `[::ffff:127.0.0.1]`, becomes its one plain
form) and `TargetPolicy` judges every address the host resolves to, never the string: loopback, the server
`--attach` named at start, and what $INFERLAB_ATTACH_ALLOW lists. Redirects are never followed, so an allowed
server cannot send the lab's requests on to an address the policy refuses.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections import deque
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("inferlab")

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


MAX_URL_CHARS = 300
LOOPBACK_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,62}\.?)*$")


def _numeric_host(host: str):
    """The address a numeric host names, in any spelling the system's resolver takes (inet_aton's: hex, octal,
    one number, fewer than four parts); None for a name. An IPv4-mapped IPv6 address is its IPv4 one: that is
    where a connection to it goes."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, ValueError):
        return None
    return _plain(ipaddress.ip_address(infos[0][4][0].split("%", 1)[0]))


def _plain(address):
    return address.ipv4_mapped if address.version == 6 and address.ipv4_mapped else address


def parse_target_url(url) -> str:
    """An attach target's URL, checked and normalised: http(s), a host, no credentials, query or fragment, at most
    300 characters; scheme and host in lower case, a numeric host in its plain form, a name in IDNA's ASCII, no
    trailing slash or /v1. ValueError (its message names the URL) otherwise."""
    if not isinstance(url, str) or not 0 < len(url.strip()) <= MAX_URL_CHARS:
        raise ValueError(f"the server's URL must be 1 to {MAX_URL_CHARS} characters")
    text = url.strip()
    if any(c.isspace() or ord(c) < 32 or c == "\\" for c in text):
        raise ValueError("the server's URL must not hold spaces, control characters or backslashes")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the server's URL must start with http:// or https:// and name a host")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment \
            or "@" in parts.netloc:
        raise ValueError("the server's URL must carry no user, password, query or fragment (the key has its own "
                         "field)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the server's URL has a port that is not a number from 0 to 65535") from None
    if port == 0:
        raise ValueError("the server's URL has port 0, which no server listens on")
    address = _numeric_host(parts.hostname)
    if address is not None:
        host = f"[{address}]" if address.version == 6 else str(address)
    else:
        try:
            host = parts.hostname.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise ValueError("the server's URL names a host that is not a valid host name") from None
        if not _HOST_NAME.match(host):
            raise ValueError("the server's URL names a host that is not a valid host name")
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"


def resolve(url: str) -> list:
    """Every address the URL's host resolves to (IPv4-mapped ones as IPv4), as a connection would look it up;
    ValueError when it resolves to none."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"the server's host {parts.hostname!r} does not resolve here ({exc})") from None
    out = []
    for info in infos:
        a = _plain(ipaddress.ip_address(info[4][0].split("%", 1)[0]))
        if a not in out:
            out.append(a)
    if not out:
        raise ValueError(f"the server's host {parts.hostname!r} resolves to no address")
    return out


class TargetPolicy:
    """The addresses the attach page may be pointed at from the page (the operator's own --attach URL is not
    judged: they chose it). Loopback, the addresses the start server resolved to, and `allow` (networks,
    addresses or host names, e.g. from $INFERLAB_ATTACH_ALLOW). A host is judged by every address it resolves
    to, so no spelling of an address (or a name that resolves to one) gets past a refusal; an unspecified,
    multicast or broadcast address (0.0.0.0, which Linux connects to this machine) is no server's and always
    refused."""

    def __init__(self, allow=(), loopback: bool = True):
        self.networks: list = list(LOOPBACK_NETWORKS) if loopback else []
        for entry in allow:
            self.allow(entry)

    def allow(self, entry: str) -> None:
        """Add a network ('10.0.0.0/8'), an address, or a host name (its addresses now)."""
        entry = str(entry).strip()
        if not entry:
            return
        try:
            self.networks.append(ipaddress.ip_network(entry, strict=False))
            return
        except ValueError:
            pass
        url = parse_target_url(entry if "://" in entry else f"http://{entry}")
        for a in resolve(url):
            self.networks.append(ipaddress.ip_network(a))

    def allow_url(self, url: str) -> None:
        """Allow the addresses `url`'s host resolves to (the server attached at start: the page may come back)."""
        for a in resolve(url):
            self.networks.append(ipaddress.ip_network(a))

    def check(self, url: str) -> list:
        """The addresses of `url`'s host; ValueError naming the first one refused (then nothing is contacted)."""
        host = urlsplit(url).hostname
        addresses = resolve(url)
        for a in addresses:
            if a.is_unspecified or a.is_multicast or a == ipaddress.ip_address("255.255.255.255"):
                raise ValueError(f"the server's host {host!r} is {a}, which is no server's address")
            if not any(a.version == n.version and a in n for n in self.networks):
                what = f"address {a} is" if host.strip("[]") == str(a) else f"host {host!r} resolves to {a},"
                raise ValueError(f"the server's {what} where this attach page may not send requests: it may reach "
                                 "this machine, the server it was started with, and what the operator lists in "
                                 "$INFERLAB_ATTACH_ALLOW")
        return addresses

    @classmethod
    def from_environment(cls) -> "TargetPolicy":
        policy = cls()
        for entry in os.environ.get("INFERLAB_ATTACH_ALLOW", "").split(","):
            try:
                policy.allow(entry)
            except ValueError as exc:  # a name that does not resolve now: said at start, not fatal
                log.warning("INFERLAB_ATTACH_ALLOW entry %r skipped: %s", entry.strip()[:80], exc)
        return policy


class AttachTarget:
    """One OpenAI-compatible server. Every request the lab sends it goes through `call`, `open` or `aopen`, so a
    target whose addresses the policy checked (`pin`) is reached at those addresses only."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.addresses: list = []  # where requests go when pinned; empty: the name is looked up as usual
        self.series: deque = deque(maxlen=SERIES_POINTS)  # (unix time, {quantity: value})
        self.metrics_note = ""  # why there are no metrics, when there are none
        self.metrics_absent = False  # the server answered that it has no /metrics (404): asked again after backoff
        self.scrapes = 0  # requests sent to the server's /metrics
        self._backoff = 0.0  # seconds until the next request after the last 404 (0: none)
        self._scraped = 0.0
        self._lock = threading.Lock()

    def pin(self, addresses) -> None:
        """Send every later request to these addresses (the ones the policy judged) instead of looking the host
        up again: a name that answers differently after the check (DNS rebinding) cannot move the lab's requests
        to an address the policy refuses. The URL's own host still goes out as the Host header and, over https,
        as the TLS server name that the certificate is checked against."""
        self.addresses = list(addresses)

    def _requests(self, client, method: str, path: str, **kw) -> list:
        """The requests to try, in order, for one call to `path`: the URL as given, or, pinned, one per checked
        address (the host's name as the Host header and, over https, as the TLS server name)."""
        if not self.addresses:
            return [client.build_request(method, self.url + path, headers=self.headers, **kw)]
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        tls = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
        return [client.build_request(method, f"{parts.scheme}://{f'[{a}]' if a.version == 6 else a}{port}"
                                             f"{parts.path}{path}",
                                     headers={**self.headers, "Host": parts.netloc}, extensions=tls, **kw)
                for a in self.addresses]

    def _client_options(self, timeout) -> dict:
        # no redirects (an allowed server must not send the lab's requests elsewhere); a pinned target ignores the
        # environment's proxies (a proxy would reach the name, not the judged address)
        return dict(timeout=timeout, follow_redirects=False, trust_env=not self.addresses)

    @contextmanager
    def open(self, method: str, path: str, timeout, **kw):
        """A streamed response to one request; with a pin, each checked address is tried in turn until one
        accepts the connection, as a resolver's list would be."""
        with httpx.Client(**self._client_options(timeout)) as client:
            failed = None
            for request in self._requests(client, method, path, **kw):
                try:
                    r = client.send(request, stream=True)
                    break
                except httpx.ConnectError as exc:
                    failed = exc
            else:
                raise failed
            try:
                yield r
            finally:
                r.close()

    def call(self, method: str, path: str, timeout, **kw) -> httpx.Response:
        """One request, its whole answer read."""
        with self.open(method, path, timeout, **kw) as r:
            r.read()
            return r

    @asynccontextmanager
    async def aopen(self, method: str, path: str, timeout, **kw):
        """`open` for the event loop."""
        async with httpx.AsyncClient(**self._client_options(timeout)) as client:
            failed = None
            for request in self._requests(client, method, path, **kw):
                try:
                    r = await client.send(request, stream=True)
                    break
                except httpx.ConnectError as exc:
                    failed = exc
            else:
                raise failed
            try:
                yield r
            finally:
                await r.aclose()

    def resolve_model(self, timeout: float = 30) -> str:
        """--model, else the first model the server's /v1/models lists (read either way: the server must answer)."""
        r = self.call("GET", "/v1/models", timeout)
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
            r = self.call("GET", "/metrics", 10)
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
            with self.open("POST", "/v1/chat/completions", httpx.Timeout(30, read=600), json=body) as r:
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
