"""What every state-changing HTTP request must show before it is served: a JSON body, from no foreign page.

A page on another site can make its visitor's browser POST to any address that browser reaches (this lab on
127.0.0.1 included) without asking first, as long as the request is "CORS-simple": a Content-Type of
text/plain, multipart/form-data or application/x-www-form-urlencoded and no custom headers (`fetch` with
mode "no-cors", a plain <form>). That page never reads the answer, but the server does the work: an attach
target changed, tokens generated on the lab's engine. Two rules close this for every route that changes state:

- the body must be declared `application/json`. A browser sends that type to another origin only after a
  CORS preflight, which these servers never grant (they send no Access-Control-Allow-* headers), so the
  request of a foreign page never arrives;
- a browser's Origin header, when there is one, must be this server's own or one the operator allowed
  (--allow-origin, $INFERLAB_ALLOWED_ORIGINS): the very rule, and the very list, the websockets apply
  (app/live.py `origin_allowed`). Scripts (curl, the official `openai` client, LiteLLM) send no Origin.

A third rule closes DNS rebinding on a server that listens on this machine only: a page of another site can
have its own name answer 127.0.0.1 a moment after it loaded, and its script is then "same-origin" with the lab
(Origin and Host both name the foreign site, so the Origin rule passes). Such a server answers only requests
whose Host header names this machine (localhost, 127.x.y.z, [::1]) or a host the operator allowed; HTTP and
websockets alike (`WebGuard`).

`read_body` is the one body reader behind them: capped, with a deadline (a body shorter than its
Content-Length would otherwise hold the request open for ever), and a client that leaves mid-body is one log
line, not a traceback.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect

from .live import origin_allowed

log = logging.getLogger("inferlab")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
JSON_TYPE = "application/json"


def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        value = default
    return value if value > 0 else default


# the whole body must arrive within this long after the handler starts reading it ($INFERLAB_BODY_TIMEOUT_S)
BODY_TIMEOUT_S = _seconds("INFERLAB_BODY_TIMEOUT_S", 30.0)


class Refused(Exception):
    """Why a request is not served: an HTTP status, a short machine code and a sentence for the caller."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def request_host(headers) -> str | None:
    """The host the page was loaded from, as the websockets read it (behind a proxy: X-Forwarded-Host)."""
    return headers.get("x-forwarded-host") or headers.get("host")


def is_json(content_type: str | None) -> bool:
    """`application/json`, with or without parameters (charset=utf-8), in any case."""
    return (content_type or "").split(";", 1)[0].strip().lower() == JSON_TYPE


def check_origin(headers, allowed_origins: tuple[str, ...] = ()) -> None:
    """Raise Refused (403) when a browser sent the request from a page of another site."""
    origin = headers.get("origin")
    if not origin_allowed(origin, request_host(headers), tuple(allowed_origins)):
        raise Refused(403, "cross_origin",
                      f"requests from a page of another site ({str(origin)[:80]}) are refused here; the operator "
                      "can allow that page's origin with --allow-origin")


def check_state_change(headers, allowed_origins: tuple[str, ...] = ()) -> None:
    """Raise Refused unless a state-changing request may be served: 403 for a foreign page's Origin, 415 for a
    body not declared as JSON."""
    check_origin(headers, allowed_origins)
    if not is_json(headers.get("content-type")):
        raise Refused(415, "unsupported_media_type",
                      "the request body must be JSON sent with the header Content-Type: application/json "
                      "(curl: -H 'Content-Type: application/json')")


async def read_body(request, cap: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The request's body, at most `cap` bytes (413), whole within `timeout_s` (408); a client that leaves
    before sending it all is logged in one line and answered 499 (nobody reads that answer)."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > cap):
        raise Refused(413, "body_too_large", f"the request body must be at most {cap} bytes")
    data = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                data += chunk
                if len(data) > cap:
                    raise Refused(413, "body_too_large", f"the request body must be at most {cap} bytes")
    except TimeoutError:
        log.info("%s %s: the request body did not arrive within %g s", request.method, request.url.path, timeout_s)
        raise Refused(408, "request_timeout",
                      f"the request body did not arrive within {timeout_s:g} s (shorter than its "
                      "Content-Length?)") from None
    except ClientDisconnect:
        log.info("%s %s: the client left before sending its whole body", request.method, request.url.path)
        raise Refused(499, "client_closed", "the client closed the connection before its body arrived") from None
    return bytes(data)


def host_name(host: str | None) -> str:
    """The name in a Host header, without its port and brackets, in lower case ('' when there is none)."""
    host = (host or "").strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def names_this_machine(name: str) -> bool:
    """localhost (and *.localhost, which browsers resolve to loopback themselves), or a loopback address in its
    plain spelling (a browser writes a numeric host that way)."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_allowed(host: str | None, allowed_origins: tuple[str, ...] = ()) -> bool:
    """The rule of a server pinned to this machine: the Host header names this machine or the host of an origin
    the operator allowed (--allow-origin)."""
    name = host_name(host)
    return names_this_machine(name) or name in {(urlsplit(o.strip()).hostname or "") for o in allowed_origins}


def openai_refusal(exc: Refused) -> dict:
    """A refusal in OpenAI's error shape (what the API's clients parse; Gradio's page never meets one)."""
    return {"error": {"message": exc.message, "type": "permission_error" if exc.status == 403 else
                      "invalid_request_error", "param": None, "code": exc.code}}


class WebGuard:
    """ASGI middleware, every request's first gate, so a route added later cannot forget a rule:
    - with `pin_host` (the server listens on loopback only), a request whose Host header names another machine
      is refused, HTTP (403) and websocket (closed before it opens) alike;
    - every request but GET, HEAD and OPTIONS passes `check_state_change`, except that the `form_paths` (Gradio's
      file uploads, multipart from its own page) need only the Origin rule.
    `origins()`: the allowed origins now (the Hub's list). `refusal(exc)`: the JSON body of a refusal (default
    {"error": message}, as the attach page's routes answer)."""

    def __init__(self, app, origins, pin_host: bool = False, form_paths: tuple[str, ...] = (), refusal=None):
        self.app, self.origins, self.pin_host, self.form_paths = app, origins, pin_host, form_paths
        self.refusal = refusal or (lambda exc: {"error": exc.message})

    def check(self, scope, headers) -> None:
        if self.pin_host and not host_allowed(headers.get("host"), self.origins()):
            raise Refused(403, "foreign_host",
                          "this server answers only requests for this machine, not for "
                          f"{host_name(headers.get('host'))[:80]!r} "
                          "(open it as localhost or 127.0.0.1; the operator can allow another name with "
                          "--allow-origin http://NAME:PORT)")
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            if scope["path"] in self.form_paths:
                check_origin(headers, self.origins())
            else:
                check_state_change(headers, self.origins())

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self.check(scope, headers)
        except Refused as exc:
            log.info("%s %s refused (%s): host %s, origin %s, content type %s", scope.get("method", "WEBSOCKET"),
                     scope["path"][:80], exc.code, str(headers.get("host"))[:80], str(headers.get("origin"))[:80],
                     str(headers.get("content-type"))[:60])
            if scope["type"] == "websocket":  # closed before it is accepted: the server answers 403
                await send({"type": "websocket.close", "code": 1008})
                return
            from starlette.responses import JSONResponse

            await JSONResponse(self.refusal(exc), status_code=exc.status)(scope, receive, send)
            return
        await self.app(scope, receive, send)
