"""The operations surface as vLLM serves it, beside the OpenAI API (app/openai_api.py mounts it):

- `GET /health`: 200 with an empty body once the model has loaded and the room's engine loop runs; 503 with
  OpenAI's error body while it loads or after it failed to load. What load balancers and Kubernetes probes read.
- `GET /metrics`: Prometheus text (app/metrics_api.py) under the lab's names and vLLM's.
- `POST /detokenize`: vLLM's shape, {"model"?, "tokens": [ids]} -> {"prompt": text}, the inverse of /tokenize.
- `GET /v1/models/{model_id}`: the model object /v1/models lists (what `client.models.retrieve` reads); the id
  holds a slash ("HuggingFaceTB/SmolLM2-135M-Instruct"), hence the path converter.

Who may call: vLLM's `--api-key` leaves /health and /metrics open (its PUBLIC_ENDPOINTS, in
vllm/entrypoints/serve/utils/server_utils.py) and guards every other route, /tokenize and /detokenize included.
The lab does the same: /health and /metrics answer anyone (they read counters, no model work) unless the server
runs with --guard-metrics; /detokenize, like /tokenize, passes the same check as /v1 (a key where one is set, off
on a public deployment without one), since each call is tokenizer work a stranger could repeat. Its body comes
through openai_api's `read_post` (`read_json` here), the rule of every POST: Content-Type application/json and no
foreign page's Origin (app/web_guard.py), else 415 / 403 before any tokenizer work.

And whose request it is, behind a proxy: `client_address` reads X-Forwarded-For only from an allowed proxy.
"""
from __future__ import annotations

import asyncio
import ipaddress
import time
from dataclasses import dataclass

from fastapi import Request

from .metrics_api import PREFIXES, render
from .openai_schema import ApiError

MAX_FORWARDED_CHARS = 4096  # of the X-Forwarded-For header read; a longer one is cut from the left
MAX_FORWARDED_HOPS = 32
MAX_ADDRESS_CHARS = 64  # an entry that is not an address is kept as a client name this long at most
# Addresses inside a hosting platform's own network: behind "*" (a Space's proxy), hops with such an address are
# the platform's, not the visitor's (a visitor's request to a Space comes from the public internet).
PRIVATE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                                  "127.0.0.0/8", "169.254.0.0/16", "::1/128", "fc00::/7",
                                                  "fe80::/10"))


@dataclass(frozen=True)
class Proxies:
    """The proxies whose X-Forwarded-For the server believes (--forwarded-allow-ips, as uvicorn's flag reads)."""

    trust_all: bool = False  # "*": any direct peer is the proxy (a Space: only its proxy can reach the server)
    networks: tuple = ()  # addresses and CIDR networks of allowed proxies

    def __bool__(self) -> bool:
        return self.trust_all or bool(self.networks)

    def allows(self, address) -> bool:
        return self.trust_all or any(address.version == n.version and address in n for n in self.networks)


def parse_proxies(value: str | None) -> Proxies:
    """'' or None: no proxy; '*': any peer; else a comma list of addresses or networks (10.0.0.0/8).
    Raises ValueError naming an entry that is neither."""
    items = [x.strip() for x in (value or "").split(",") if x.strip()]
    if "*" in items:
        return Proxies(trust_all=True)
    nets = []
    for item in items[:256]:
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item[:80]!r} is not an IP address or network (e.g. 10.0.0.1, 10.0.0.0/8 or *)") \
                from None
    return Proxies(networks=tuple(nets))


def _address(text: str):
    """An X-Forwarded-For entry as an address ('1.2.3.4', '1.2.3.4:5678', '[::1]:80', '::1'); None if it is not one."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # IPv4 with a port
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def client_address(forwarded: list[str] | str | None, peer: str, proxies: Proxies) -> str:
    """Whose request this is, for the per-client admission limit. The direct peer, unless it is an allowed proxy
    and sent X-Forwarded-For: then the right-most address in that header that is not itself an allowed proxy
    (each proxy appends the address it received the request from; what a client wrote itself stands to the left
    and is never reached while a proxy's entry is there). With "*" every peer is a proxy; in the header, hops
    with private addresses are the platform's own, so the client is the right-most public address (or the
    right-most entry when all are private: a proxy on the same network). `forwarded`: the header's values, in
    order (a header may be sent several times)."""
    if not proxies:
        return peer
    peer_address = _address(peer)
    if peer_address is None or not proxies.allows(peer_address):
        return peer
    if isinstance(forwarded, str):
        forwarded = [forwarded]
    text = ",".join(forwarded or ())[-MAX_FORWARDED_CHARS:]
    hops = [h.strip() for h in text.split(",") if h.strip()][-MAX_FORWARDED_HOPS:]
    if not hops:
        return peer
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:  # a proxy appends addresses; anything else stops the walk, named as it came
            return hop[:MAX_ADDRESS_CHARS]
        if proxies.trust_all:
            if not any(address.version == n.version and address in n for n in PRIVATE):
                return str(address)
        elif not proxies.allows(address):
            return str(address)
    # every hop is a proxy: the nearest entry is the most that can be vouched for
    return str(_address(hops[-1])) if proxies.trust_all else str(_address(hops[0]))


def model_object(model_id: str, started: float) -> dict:
    """One entry of GET /v1/models (app/openai_api.py writes the list with the same fields)."""
    return {"id": model_id, "object": "model", "created": int(started), "owned_by": "inferlab"}


def mount_ops(app, *, registry, holder, settings, metrics, check_access, ready, names, served_name, error,
              read_json) -> None:
    """Declare /health, /metrics, /detokenize and GET /v1/models/{id} on `app`. The callables are
    openai_api.mount's own: the access check, the model-ready check (503), the model's names, the error
    answer and the capped body reader, so every route answers in the same words."""
    from fastapi.responses import JSONResponse, PlainTextResponse, Response

    limits = settings.limits
    guard = getattr(settings, "guard_metrics", False)
    prefixes = PREFIXES.get(getattr(settings, "metrics_prefix", "both"), PREFIXES["both"])
    scrape_lock = asyncio.Lock()
    last: list = [None]  # (when the last render started, its text)

    def render_now(room) -> str:
        name = served_name(holder.model_id) if holder.model_id else ""
        for attempt in range(3):
            try:
                return render(room, metrics, name, prefixes)
            except (KeyError, RuntimeError):  # the engine changed a sequence while kv_stats read it: read again
                if attempt == 2:
                    raise
        return ""

    @app.get("/health")
    async def health(request: Request):
        try:
            if guard:
                check_access(request)
            room = ready()
            if not room.alive():
                raise ApiError("the engine loop has stopped", None, "engine_dead", 503, "server_error")
        except ApiError as exc:
            return error(exc)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus(request: Request):
        try:
            if guard:
                check_access(request)
        except ApiError as exc:
            return error(exc)
        # one render at a time, however many scrape (it reads every sequence and the KV pool under the engine's
        # locks); a scrape that waited while another rendered takes that text if the render began after it came
        arrived = time.monotonic()
        async with scrape_lock:
            if last[0] is not None and last[0][0] >= arrived:
                text = last[0][1]
            else:
                began = time.monotonic()
                text = await asyncio.to_thread(render_now, registry.room if holder.ready else None)
                last[0] = (began, text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's /detokenize: {"model"?, "tokens": [ids]} -> {"prompt": text}; special tokens are kept, as
        vLLM's are, so /tokenize's ids of a chat come back as the chat template's text."""
        try:
            check_access(request)
            body = await read_json(request, limits.max_body_bytes)
            room = ready()
            model, ids = parse_detokenize(body, limits, _vocabulary(room.engine))
            if model is not None and model not in names():
                raise ApiError(f"the model {model!r} does not exist here", "model", "model_not_found", 404)
            text = await asyncio.to_thread(room.engine.tokenizer.decode, ids)
        except ApiError as exc:
            return error(exc)
        return {"prompt": text}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(request: Request, model_id: str):
        try:
            check_access(request)
            ready()
            if model_id[:1000] not in names():
                raise ApiError(f"The model {model_id[:200]!r} does not exist; GET /v1/models lists "
                               f"{served_name(holder.model_id)!r}", "model", "model_not_found", 404)
        except ApiError as exc:
            return error(exc)
        return JSONResponse(model_object(served_name(holder.model_id), app.state.started))


def _vocabulary(engine) -> int:
    """Ids the tokenizer can decode: the model's vocabulary, or the tokenizer's where it has fewer entries (an
    embedding padded past the tokenizer)."""
    try:
        return min(engine.spec.vocab_size, len(engine.tokenizer))
    except TypeError:
        return engine.spec.vocab_size


def parse_detokenize(body, limits, vocab_size: int) -> tuple[str | None, list[int]]:
    """(model or None, the ids) of a /detokenize body, each field checked before any tokenizer work."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    unknown = sorted(set(body) - {"model", "tokens"})
    if unknown:
        raise ApiError(f"unknown field {unknown[0][:80]!r}; /detokenize takes model and tokens", unknown[0][:80],
                       "unknown_parameter")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ApiError("model must be the name GET /v1/models lists", "model")
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise ApiError("tokens must be a list of token ids", "tokens", "missing_required_parameter" if ids is None
                       else "invalid_type")
    if len(ids) > limits.max_prompt_tokens:
        raise ApiError(f"tokens holds {len(ids)} ids; this server decodes at most {limits.max_prompt_tokens}",
                       "tokens", "too_many_tokens")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool):
            raise ApiError(f"tokens[{i}] must be an integer token id", "tokens", "invalid_type")
        if not 0 <= t < vocab_size:
            raise ApiError(f"tokens[{i}] = {t} is not a token id: the vocabulary has ids 0 to {vocab_size - 1}",
                           "tokens", "invalid_token_id")
    return model, ids
