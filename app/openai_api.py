"""The OpenAI-compatible API on the lab's own port: POST /v1/completions and /v1/chat/completions (server-sent
events when `stream` is true), GET /v1/models, and GET /metrics (Prometheus text, app/metrics_api.py).

A request runs in the room's shared engine as an owner of its own ("api 3"), granted steps until it finishes as a
tab's Run is (app/openai_run.py): it batches with whatever the tabs run and shows in the room view. Bodies are
checked by app/openai_schema.py before any work; this module adds what is about the HTTP side: who may call
(`ApiSettings`: on locally, off on a public deployment unless a key is set), the body's size, how many requests
one client and everyone together may have running (`Admission`), the answer's format, and a client that goes
away (its sequences are released at once). Every POST (here and app/ops_api.py's /detokenize) reads its body
through `read_post`: a JSON content type and no foreign page's Origin (app/web_guard.py, the websockets' rule),
so a page elsewhere cannot make its visitor's browser run tokens here, key or no key.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

# module level: FastAPI resolves the routes' string annotations (PEP 563) from module globals
from fastapi import Request
from fastapi.responses import StreamingResponse

from engine.tokenizer import token_bytes

from .metrics_api import ApiMetrics
from .openai_reply import Reply
from .openai_run import RoomRun
from .openai_schema import ApiError, ApiLimits, Job, parse_chat, parse_completion, parse_tokenize, tokenize
from .ops_api import Proxies, client_address, mount_ops
from .web_guard import BODY_TIMEOUT_S, Refused, read_body

log = logging.getLogger("inferlab")

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DISCONNECT_POLL_S = 0.5
OWNER_HEADER = "X-InferLab-Owner"  # a non-streaming request checks this often whether its client is still there


@dataclass(frozen=True)
class ApiSettings:
    enabled: bool = True
    api_key: str | None = None
    why_off: str = ""  # the 403's message when not enabled
    limits: ApiLimits = field(default_factory=ApiLimits)
    # a follower page's one request of a room load (app/room_load.py) may come with its one-time ticket instead
    # of the key, even where the API is off by default: the presenter's token started the round. Not with --api off.
    room_load: bool = True
    # /metrics and /health answer anyone, as vLLM's do, unless guarded like /v1 (--guard-metrics; app/ops_api.py)
    guard_metrics: bool = False
    metrics_prefix: str = "both"  # --metrics-prefix: "both", "vllm" or "inferlab" (app/metrics_api.py)
    proxies: Proxies = field(default_factory=Proxies)  # whose X-Forwarded-For names the client (app/ops_api.py)
    # page origins allowed to POST besides this server's own; the lab's Hub adds its --allow-origin list (the
    # websockets' list: one list for both)
    allowed_origins: tuple[str, ...] = ()
    # a request body must arrive whole within this long (408 after); $INFERLAB_BODY_TIMEOUT_S, else 30 s
    body_timeout_s: float = BODY_TIMEOUT_S


def decide(host: str, api_key: str | None, mode: str = "auto", space: bool = False) -> ApiSettings:
    """Whether /v1 and /metrics answer. "auto": on when the lab listens on this machine only; on a public
    deployment (a Hugging Face Space, or any host other than loopback) only with a key. "on" and "off" force."""
    key = api_key or None
    public = space or host not in LOOPBACK
    if mode == "off":
        return ApiSettings(False, None, "the OpenAI API is turned off on this server (--api off)", room_load=False)
    if mode == "on" or key or not public:
        return ApiSettings(True, key)
    return ApiSettings(False, None, "the OpenAI API is off on this public deployment; the operator can turn it on "
                                    "by starting the lab with --api-key KEY (or $INFERLAB_API_KEY)")


def startup_line(settings: ApiSettings, url: str) -> str:
    if not settings.enabled:
        return f"OpenAI API: off ({settings.why_off})"
    who = ("requires Authorization: Bearer <--api-key>" if settings.api_key
           else "no key: anyone who can reach this port may call it")
    return f"OpenAI API: on at {url}/v1 ({who}); Prometheus metrics at {url}/metrics"


class Admission:
    """Requests running now, per client and in all; past a limit a request is answered 429 before any work."""

    def __init__(self, limits: ApiLimits):
        self.limits = limits
        self._lock = threading.Lock()
        self._by_client: Counter = Counter()

    def acquire(self, client: str) -> None:
        with self._lock:
            if sum(self._by_client.values()) >= self.limits.max_concurrent:
                raise ApiError(f"the server runs {self.limits.max_concurrent} API requests at once, its limit; try "
                               "again shortly", None, "rate_limit_exceeded", 429, "rate_limit_exceeded")
            if self._by_client[client] >= self.limits.max_concurrent_per_client:
                raise ApiError(f"one client may run {self.limits.max_concurrent_per_client} requests at once; wait "
                               "for one to finish", None, "rate_limit_exceeded", 429, "rate_limit_exceeded")
            self._by_client[client] += 1

    def release(self, client: str) -> None:
        with self._lock:
            self._by_client[client] -= 1
            if self._by_client[client] <= 0:
                del self._by_client[client]

    def running(self) -> int:
        with self._lock:
            return sum(self._by_client.values())


def served_name(model_id: str) -> str:
    """The name /v1/models lists: the model id without the lab's note on how it was loaded."""
    return model_id.split(" (")[0]


def mount(app, registry, holder, settings: ApiSettings, room_load=None):
    """Declare the routes on `app` (before Gradio's catch-all mount). Returns the ApiMetrics it counts into.
    `room_load`: the lecture's RoomLoad, whose one-time tickets stand in for the key (one request each)."""
    from fastapi.responses import JSONResponse

    limits = settings.limits
    metrics = ApiMetrics()
    admission = Admission(limits)

    def error(exc: ApiError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    def check_access(request, tickets: bool = False) -> str | None:
        """Raise unless the request may call; returns the room-load ticket it carries instead of the key (taken
        only where `tickets`: the chat route a follower's page calls)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if tickets and room_load is not None and scheme.lower() == "bearer" and room_load.is_ticket(token.strip()):
            if not settings.room_load:
                raise ApiError(settings.why_off, None, "api_disabled", 403, "permission_error")
            return token.strip()
        if not settings.enabled:
            raise ApiError(settings.why_off, None, "api_disabled", 403, "permission_error")
        if settings.api_key:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                     settings.api_key.encode()):
                raise ApiError("missing or wrong API key: send the header Authorization: Bearer <key>", None,
                               "invalid_api_key", 401)
        return None

    def ready():
        room = registry.room
        if not holder.ready or room is None:
            raise ApiError(holder.error or f"the model is still loading ({holder.progress:.0%}); try again shortly",
                           None, "model_not_ready", 503, "server_error")
        return room

    def names() -> set[str]:
        return {served_name(holder.model_id), holder.model_id, holder.source}

    async def read_post(request, cap: int):
        """The JSON body of a POST (its Origin and Content-Type were checked by app/web_guard.py's WebGuard, the
        gate of every request to this server)."""
        return await _read_json(request, cap, settings.body_timeout_s)

    @app.get("/v1/models")
    async def list_models(request: Request):
        try:
            check_access(request)
            ready()
        except ApiError as exc:
            return error(exc)
        return {"object": "list", "data": [{"id": served_name(holder.model_id), "object": "model",
                                            "created": int(app.state.started), "owned_by": "inferlab"}]}

    # /health, /metrics, /detokenize and GET /v1/models/{id}, vLLM's operations surface (app/ops_api.py)
    mount_ops(app, registry=registry, holder=holder, settings=settings, metrics=metrics, check_access=check_access,
              ready=ready, names=names, served_name=served_name, error=error, read_json=read_post)

    async def serve(request: Request, kind: str):
        try:
            ticket = check_access(request, tickets=kind == "chat")
            body = await read_post(request, limits.max_body_bytes)
            room = ready()
            parse = parse_chat if kind == "chat" else parse_completion
            job = parse(body, limits, room.engine.spec.vocab_size)
            if job.model not in names():
                raise ApiError(f"the model {job.model!r} does not exist here; GET /v1/models lists "
                               f"{served_name(holder.model_id)!r}", "model", "model_not_found", 404)
            if ticket is not None:  # bounded by the round (one request per follower), not by the client's address
                _redeem(room_load, ticket, job)
                client = None
            else:
                client = _client(request, settings.proxies)
                admission.acquire(client)  # before the tokenizer's work: a client past its limit costs nothing more
        except ApiError as exc:
            return error(exc)
        run = None

        def finish():
            if run is not None:
                run.close()
            if ticket is not None:
                complete = run is not None and len(run.finish) == len(run.tokens)
                room_load.served(ticket, run.owner if run else "", sum(run.tokens) if run else 0,
                                 "" if complete else "the request did not finish")
            if client is not None:
                admission.release(client)
        done = _once(finish)
        try:
            job = await asyncio.to_thread(_tokenize, job, room.engine, limits)
            run = RoomRun(room, job, metrics, kind="api" if ticket is None else "follower")
            await run.begin()
            if ticket is not None:
                room_load.owned(ticket, run.owner)
        except ApiError as exc:
            done()
            return error(exc)
        except BaseException:
            done()
            raise
        reply = Reply(job, served_name(holder.model_id), run)
        # the request's label in the room view ("api 3"): a client can find its own sequences there
        owner = {OWNER_HEADER: run.owner}
        if job.stream:
            return _RunStream(reply.events(), done, media_type="text/event-stream",
                              headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **owner})
        try:
            answer = await _collect(request, run, reply, error)
        finally:
            done()
        return JSONResponse(answer, headers=owner) if isinstance(answer, dict) else answer

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        """vLLM's /tokenize: the token ids (and their text with return_token_strs) of a prompt, or of messages
        through the model's chat template; what attach mode reads when it cannot load a server's tokenizer."""
        try:
            check_access(request)
            body = await read_post(request, limits.max_body_bytes)
            room = ready()
            model, prompt, generation, strs = parse_tokenize(body, limits)
            if model is not None and model not in names():
                raise ApiError(f"the model {model!r} does not exist here", "model", "model_not_found", 404)
            return await asyncio.to_thread(_tokens_answer, room.engine, prompt, generation, strs, limits)
        except ApiError as exc:
            return error(exc)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, "completion")

    app.state.started = time.time()
    return metrics


class _RunStream(StreamingResponse):
    """A stream that closes its run however the response ends: finished, failed, or the client gone (Starlette
    cancels the body when the client disconnects, and a body never started would run no finally of its own)."""

    def __init__(self, body, on_close, **kwargs):
        super().__init__(body, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _tokens_answer(engine, prompt, generation: bool, strs: bool, limits: ApiLimits) -> dict:
    tok = engine.tokenizer
    if prompt.messages is not None:
        text = tok.apply_chat_template(list(prompt.messages), tokenize=False, add_generation_prompt=generation)
        ids = tok(text, add_special_tokens=False)["input_ids"]
    else:
        ids = engine.encode(prompt.text, chat=False).token_ids if prompt.text else []
    if len(ids) > limits.max_prompt_tokens:
        raise ApiError(f"the prompt is {len(ids)} tokens; this server takes at most {limits.max_prompt_tokens}",
                       "prompt", "context_length_exceeded")
    out = {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": list(ids)}
    if strs:  # each token's bytes as text, as the engine's token chips show them
        out["token_strs"] = [token_bytes(tok, i).decode("utf-8", errors="replace") for i in ids]
    return out


def _redeem(room_load, ticket: str, job: Job) -> None:
    """A room-load ticket's one request: a streaming chat request for one answer to the round's prompt within its
    max_tokens. The ticket is spent only by a request of that shape."""
    if job.kind != "chat" or not job.stream or job.n != 1 or len(job.prompts) != 1:
        raise ApiError("a room-load ticket is good for one streaming chat request with n = 1", None,
                       "room_load_ticket", 403, "permission_error")
    rnd = room_load.round
    if rnd is None or job.prompts[0].messages != ({"role": "user", "content": rnd.prompt},):
        raise ApiError("a room-load ticket is good for the round's own prompt only", "messages", "room_load_ticket",
                       403, "permission_error")
    cap = rnd.max_tokens
    if not job.max_tokens_given or job.params.max_tokens > cap:
        raise ApiError(f"a room-load request must ask for at most {cap} tokens (max_tokens)", "max_tokens",
                       "room_load_ticket", 400)
    try:
        room_load.redeem(ticket)
    except ValueError as exc:
        raise ApiError(str(exc), None, "room_load_ticket", 403, "permission_error") from None


def _tokenize(job: Job, engine, limits: ApiLimits) -> Job:
    try:
        return tokenize(job, engine, limits)
    except ApiError:
        raise
    except ValueError as exc:  # the engine's own checks (an empty prompt, a lone surrogate)
        raise ApiError(str(exc), "messages" if job.kind == "chat" else "prompt") from None


def _once(fn):
    fired = []

    def call():
        if not fired:
            fired.append(True)
            fn()
    return call


def _client(request, proxies: Proxies | None = None) -> str:
    peer = request.client.host if request.client else "?"
    return client_address(request.headers.getlist("x-forwarded-for"), peer, proxies or Proxies())


async def _read_json(request, cap: int, timeout_s: float = BODY_TIMEOUT_S):
    """The body as JSON: capped (413), whole within `timeout_s` (408), a client gone mid-body one log line (499)."""
    try:
        data = await read_body(request, cap, timeout_s)
    except Refused as exc:
        raise ApiError(exc.message, None, exc.code, exc.status) from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ApiError("the request body is not valid JSON", None, "invalid_json") from None


async def _collect(request, run: RoomRun, reply: Reply, error):
    """A non-streaming answer: every delta gathered; a client that leaves meanwhile ends the run (checked every
    DISCONNECT_POLL_S, whether tokens are arriving or not)."""
    checked = time.monotonic()
    while True:
        try:
            deltas = await run.next(DISCONNECT_POLL_S)
        except TimeoutError:
            deltas = ()
        except ApiError as exc:
            return error(exc)
        if deltas is None:
            return reply.whole()
        reply.add(deltas)
        if time.monotonic() - checked >= DISCONNECT_POLL_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                log.info("api client left before its answer; %s released", run.owner)
                return error(ApiError("the client closed the connection", None, "client_closed", 499))

