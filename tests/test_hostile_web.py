"""Every HTTP route and websocket of the lab and of the attach page against a hostile browser (issue 36): the
cases are generated from the servers' own route tables (Gradio's routes included), so a route added later is
covered without a new test.

- DNS rebinding: a page of another site whose name later answers 127.0.0.1 is "same-origin" with a lab on this
  machine (its Origin and Host both name the foreign site). A server on loopback answers no request whose Host
  names another machine: every route and socket, checked with generated names and in Chromium, whose resolver
  is told to map the foreign name to 127.0.0.1 (what the rebinding does).
- Every state-changing route refuses a foreign Origin (403) and a body not declared JSON (415), Gradio's file
  upload excepted from the latter only; the websockets refuse a foreign Origin.
- An attach target the page chose is reached at the addresses the policy judged, never at a later answer for
  its name.
Nothing the refused requests asked for happened: no session, no token, no attach target changed.
"""
from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e_util import CHROMIUM, CHROMIUM_ARGS, chromium_available, free_port, running_server, serving

TOKEN = "web-presenter-token"
REBIND = "rebind.test"  # a foreign name; Chromium is told it answers 127.0.0.1, as a rebinding server would
SAFE = {"GET", "HEAD", "OPTIONS"}
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None)
FORM_POSTS = {"/gradio_api/upload", "/gradio_api/process_recording"}
# the recorder's model: a path not on this machine, so no tokenizer is looked for on the network
RECORDED_MODEL = "/nonexistent/recorded-model"


def route_table(app) -> list[tuple[str, str]]:
    """(method or "WS", path with its parameters filled) of every route the app serves, mounted apps and
    included routers (Gradio's /gradio_api) included."""
    from starlette.routing import Mount

    out = []

    def walk(routes, prefix=""):
        for r in routes:
            if isinstance(r, Mount):
                walk(getattr(r.app, "routes", None) or [], prefix + r.path)
            elif hasattr(r, "original_router"):  # FastAPI's included router: its routes carry their prefix
                walk(r.original_router.routes, prefix)
            elif getattr(r, "methods", None):
                path = re.sub(r"\{[^}]*\}", "x", prefix + r.path)
                out.extend((m, path) for m in sorted(r.methods))
            elif hasattr(r, "path"):
                out.append(("WS", prefix + r.path))
    walk(app.routes)
    return sorted(set(out))


class _Recorder(BaseHTTPRequestHandler):
    """An OpenAI-looking server that records (path, Host header) of every request it gets."""

    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append((self.path, self.headers.get("Host")))
        if self.path.endswith("/v1/models"):
            body, kind = json.dumps({"object": "list", "data": [{"id": RECORDED_MODEL}]}).encode(), "application/json"
        else:
            body, kind = b"vllm:num_requests_running 2\n", "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def recorder():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def servers(base_engine, recorder):
    """(lab url, lab app, attach url, attach app): the lab with its API on and no key (the loopback default) and
    an attach page pointed at the recorder, both served by uvicorn on 127.0.0.1."""
    from app.attach_server import create_attach_app

    with running_server(base_engine, presenter_token=TOKEN) as (lab, lab_app):
        page_app = create_attach_app(recorder[0], tokenizer_name="/nonexistent/tokenizer")
        with serving(page_app) as page:
            yield lab, lab_app, page, page_app


def _state(lab: str, page: str) -> tuple:
    """What a refused request must not change: the lab's sessions and KV blocks, the tokens its API generated,
    and the attach page's target."""
    health = httpx.get(lab + "/healthz", timeout=30).json()
    metrics = httpx.get(lab + "/metrics", timeout=30).text
    generated = re.search(r"^inferlab:generation_tokens_total(?:\{[^}]*\})? (\S+)$", metrics, re.M).group(1)
    target = re.search(r'id="attach-url"[^>]*?value="([^"]*)"', httpx.get(page + "/", timeout=30).text).group(1)
    return health["sessions"], health["kv_blocks_used"], generated, target


def _ws_status(url: str, path: str, host: str, origin: str | None) -> int:
    """The HTTP status a websocket handshake to `path` gets with these Host and Origin headers (101: opened)."""
    address = url.split("//", 1)[1]
    ip, port = address.split(":")
    with socket.create_connection((ip, int(port)), timeout=30) as s:
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                   + (f"Origin: {origin}\r\n" if origin else "") + "\r\n").encode())
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(1024)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1])


def test_the_route_tables_hold_what_the_generated_cases_cover(servers):
    lab, lab_app, page, page_app = servers
    lab_routes, page_routes = route_table(lab_app), route_table(page_app)
    for expected in (("POST", "/gradio_api/queue/join"), ("POST", "/gradio_api/upload"), ("POST", "/v1/completions"),
                     ("WS", "/ws/lab"), ("WS", "/ws/present"), ("WS", "/ws/follow"), ("GET", "/follow")):
        assert expected in lab_routes, expected
    assert ("POST", "/attach/target") in page_routes and any(m == "WS" for m, _ in page_routes)
    assert FORM_POSTS <= {p for m, p in lab_routes if m == "POST"}


def test_every_state_changing_route_refuses_foreign_origins_and_simple_bodies(servers):
    lab, lab_app, page, page_app = servers
    before = _state(lab, page)
    checked = 0
    for url, app in ((lab, lab_app), (page, page_app)):
        for method, path in route_table(app):
            if method in SAFE or method == "WS":
                continue
            body = b'{"url": "http://127.0.0.1:9", "prompt": "hi", "model": "x", "data": [], "fn_index": 0}'
            r = httpx.request(method, url + path, content=body, timeout=30,
                              headers={"Content-Type": "application/json", "Origin": "http://evil.example"})
            assert r.status_code == 403, (method, path, r.status_code, r.text[:200])
            kinds = ("multipart/form-data; boundary=x",) if path in FORM_POSTS else SIMPLE_TYPES
            for kind in kinds:
                headers = {"Origin": "http://evil.example"} if path in FORM_POSTS else {}
                if kind:
                    headers["Content-Type"] = kind
                r = httpx.request(method, url + path, content=body, headers=headers, timeout=30)
                assert r.status_code == (403 if path in FORM_POSTS else 415), (method, path, kind, r.text[:200])
                checked += 1
        for method, path in route_table(app):
            if method == "WS":
                host = url.split("//", 1)[1]
                assert _ws_status(url, path, host, "http://evil.example") == 403, path
                assert _ws_status(url, path, host, "null") == 403, path
    assert checked > 40
    assert _state(lab, page) == before


# foreign names in the Host header: domains, other addresses, and loopback written as no browser writes it
_label = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
FOREIGN_HOSTS = st.one_of(
    st.builds(lambda a, b: f"{a}.{b}", _label, st.sampled_from(["test", "example", "com", "internal", "local"])),
    st.builds(lambda a, b, c: f"{a}.{b}.{c}", _label, _label, st.sampled_from(["net", "io", "ru"])),
    st.ip_addresses(v=4).filter(lambda a: not a.is_loopback).map(str),
    st.ip_addresses(v=6).filter(lambda a: not a.is_loopback).map(lambda a: f"[{a}]"),
    st.sampled_from(["2130706433", "0x7f000001", "127.1", "0", "localhost.evil.example", "127.0.0.1.nip.io"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=FOREIGN_HOSTS, data=st.data())
def test_a_request_for_a_foreign_host_name_is_refused_on_every_route(servers, name, data):
    lab, lab_app, page, page_app = servers
    url, app = data.draw(st.sampled_from([(lab, lab_app), (page, page_app)]))
    port = url.rsplit(":", 1)[1]
    host = f"{name}:{port}"
    method, path = data.draw(st.sampled_from(route_table(app)))
    if method == "WS":  # the rebinding page's own origin: Origin and Host agree, so only the Host rule stops it
        assert _ws_status(url, path, host, f"http://{host}") == 403
        return
    r = httpx.request(method, url + path, timeout=30, content=b"{}",
                      headers={"Host": host, "Origin": f"http://{host}", "Content-Type": "application/json"})
    assert r.status_code == 403, (method, path, host, r.status_code, r.text[:200])
    if method != "HEAD":
        error = r.json()["error"]
        text = error["message"] if isinstance(error, dict) else error
        assert "answers only requests for this machine" in text


def test_this_machines_names_are_served(servers):
    lab, _, page, _ = servers
    for url in (lab, page):
        port = url.rsplit(":", 1)[1]
        for host in ("localhost", "127.0.0.1", "127.0.0.2", "lab.localhost", "LOCALHOST"):
            r = httpx.get(url + "/", headers={"Host": f"{host}:{port}"}, timeout=30)
            assert r.status_code == 200, (url, host)
        assert _ws_status(url, "/ws/follow", f"localhost:{port}", f"http://localhost:{port}") == 101


@pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
def test_a_rebound_name_reaches_nothing_in_chromium(servers):
    """Chromium's resolver maps the foreign name to 127.0.0.1, as the rebinding attacker's DNS does: the lab's
    page, its API and the attach page answer 403 for that name, and the same servers still answer their own."""
    from playwright.sync_api import sync_playwright

    lab, _, page_url, _ = servers
    before = _state(lab, page_url)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBIND} 127.0.0.1"])
        try:
            page = b.new_page()
            for url in (lab, page_url):
                rebound = url.replace("127.0.0.1", REBIND)
                response = page.goto(rebound + "/")
                assert response.status == 403
                assert "answers only requests for this machine" in page.content()
                # the page's own script, same-origin with the rebound name: every POST and socket refused
                out = page.evaluate("""async () => {
                  const post = (path, body) => fetch(path, {method: "POST", headers: {"Content-Type":
                      "application/json"}, body: JSON.stringify(body)}).then((r) => r.status, () => "failed");
                  const ws = (path) => new Promise((done) => { const s = new WebSocket(
                      location.origin.replace("http", "ws") + path); s.onopen = () => done("open");
                      s.onerror = () => done("refused"); });
                  return [await post("/v1/completions", {model: "x", prompt: "Once", max_tokens: 4}),
                          await post("/attach/target", {url: "http://127.0.0.1:9"}),
                          await ws("/ws/follow")];
                }""")
                assert out == [403, 403, "refused"], (url, out)
            # the same servers under this machine's names: served
            assert page.goto(lab.replace("127.0.0.1", "localhost") + "/follow").status == 200
            assert page.goto(page_url + "/").status == 200
        finally:
            b.close()
    assert _state(lab, page_url) == before


def test_a_target_the_page_chose_is_reached_at_the_addresses_judged(recorder, monkeypatch):
    """The policy judges a name's addresses once; every later request goes to them, with the name in the Host
    header. Here the name's answer changes after the check to an address the policy refuses (192.0.2.1): the
    target's /v1/models and /metrics still reach the judged address, and the name is not looked up again."""
    from app.attach import AttachTarget, parse_target_url
    from app.attach_server import Attachment

    start, seen = recorder
    port = start.rsplit(":", 1)[1]
    real = socket.getaddrinfo
    lookups = []

    def resolver(host, *args, **kwargs):
        if host != REBIND or kwargs.get("flags", 0) & socket.AI_NUMERICHOST:  # a name is no numeric host
            return real(host, *args, **kwargs)
        lookups.append(host)
        address = "127.0.0.1" if len(lookups) == 1 else "192.0.2.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(args[0]) if args and args[0] else 0))]

    attachment = Attachment(AttachTarget(start), tokenizer_name="/nonexistent/tokenizer")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    seen.clear()
    target = AttachTarget(parse_target_url(f"http://{REBIND}:{port}"))
    attachment.switch(target)
    assert [str(a) for a in target.addresses] == ["127.0.0.1"] and target.model == RECORDED_MODEL
    target.scrape()
    assert target.series and target.series[-1][1]["running"] == 2
    assert seen == [("/v1/models", f"{REBIND}:{port}"), ("/metrics", f"{REBIND}:{port}")], seen
    assert lookups == [REBIND]  # judged once; never asked again
    # a name that answers a refused address at the check is refused, and nothing is contacted
    lookups.append("again")  # from now on the name answers 192.0.2.1 at the check too
    with pytest.raises(ValueError, match="resolves to 192.0.2.1"):
        attachment.switch(AttachTarget(parse_target_url(f"http://{REBIND}:{port}")))
    assert attachment.target is target


def test_a_pinned_https_target_keeps_its_name_for_tls():
    """Over https the judged address is dialled while the name stays the TLS server name (its certificate is
    checked against the name) and the Host header; several addresses are tried in the resolver's order."""
    import ipaddress

    from app.attach import AttachTarget

    target = AttachTarget("https://models.example:8443/base", "KEY")
    target.pin([ipaddress.ip_address("10.1.2.3"), ipaddress.ip_address("fd00::7")])
    with httpx.Client() as client:
        requests = target._requests(client, "GET", "/v1/models")
    assert [str(r.url) for r in requests] == ["https://10.1.2.3:8443/base/v1/models",
                                              "https://[fd00::7]:8443/base/v1/models"]
    for r in requests:
        assert r.headers["authorization"] == "Bearer KEY" and r.headers["host"] == "models.example:8443"
        assert r.extensions["sni_hostname"] == "models.example"


# ---- every socket against generated messages -----------------------------------------------------------------
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                  max_size=4), max_leaves=16)


def _messages(ops: tuple[str, ...], fields: tuple[str, ...]):
    """Text frames a hostile client sends: not JSON, JSON that is no object, and objects whose op and fields
    are near the protocol's (its ops and names with values of every kind)."""
    shaped = st.fixed_dictionaries({"op": st.sampled_from((*ops, "", "nope", 1))},
                                   optional={f: _json for f in fields})
    return st.one_of(st.text(max_size=120), _json, shaped).map(
        lambda m: m if isinstance(m, str) else json.dumps(m, allow_nan=True))


class _Errors:
    """Log records of this process that carry an exception (a handler's traceback) while a test runs."""

    def __enter__(self):
        import logging

        self.records, self.handler = [], logging.Handler()
        self.handler.emit = lambda r: self.records.append(r) if r.exc_info else None
        logging.getLogger().addHandler(self.handler)
        return self.records

    def __exit__(self, *exc):
        import logging

        logging.getLogger().removeHandler(self.handler)


async def _exchange(url: str, path: str, frames: list[str], expect, origin: str | None = None) -> list[dict]:
    """Send each frame on one socket and wait for the server's answer to it (`expect(msg)` says which message
    answers); the socket must stay open throughout."""
    import asyncio

    from websockets.asyncio.client import connect

    answers = []
    async with connect(url.replace("http://", "ws://") + path, proxy=None, max_size=None, origin=origin) as ws:
        for frame in frames:
            await ws.send(frame)
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if expect(msg):
                    answers.append(msg)
                    break
    return answers


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_messages(("load_report",), ("round", "ok", "ttft_ms", "tokens", "error")), min_size=1,
                       max_size=6),
       data=st.data())
def test_viewer_sockets_answer_every_generated_message(servers, frames, data):
    import asyncio

    lab, _, page, _ = servers
    url = data.draw(st.sampled_from([lab, page]))
    with _Errors() as errors:
        answers = asyncio.run(_exchange(url, "/ws/follow", frames, lambda m: m["type"] in ("ok", "error")))
    assert len(answers) == len(frames) and all(a["type"] == "error" and a["error"] for a in answers)
    assert not errors, [r.getMessage() for r in errors]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_messages(("start", "step", "reset", "load", "load_summary"),
                                 ("prompt", "chat", "system", "params", "count", "max_tokens", "temperature")),
                       min_size=1, max_size=6),
       data=st.data())
def test_presenter_sockets_answer_every_generated_message_before_auth(servers, frames, data):
    """Without the token nothing a script sends is run: each message is answered with an error, the socket
    stays, and no KV block is taken."""
    import asyncio

    lab, _, page, _ = servers
    url = data.draw(st.sampled_from([lab, page]))
    before = _state(lab, page)
    with _Errors() as errors:
        answers = asyncio.run(_exchange(url, "/ws/present", frames, lambda m: m["type"] in ("ok", "error")))
    assert [a["type"] for a in answers] == ["error"] * len(frames)
    assert _state(lab, page) == before
    assert not errors, [r.getMessage() for r in errors]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_messages(("start", "step", "reset", "load_summary"),
                                 ("prompt", "chat", "system", "params", "count")), min_size=1, max_size=4))
def test_an_authenticated_presenter_script_gets_an_answer_to_every_generated_message(servers, frames):
    """The presenter's own bad messages (wrong types, unknown SamplingParams fields, counts out of range) are
    answered, never raised into the socket or the log; the lab still serves a page afterwards."""
    import asyncio

    lab = servers[0]
    auth = json.dumps({"op": "auth", "token": TOKEN})
    with _Errors() as errors:
        answers = asyncio.run(_exchange(lab, "/ws/present", [auth, *frames],
                                        lambda m: m["type"] in ("ok", "error")))
    assert answers[0] == {"type": "ok", "op": "auth"}
    assert all(a["type"] == "ok" or a["error"] for a in answers[1:])
    assert not errors, [r.getMessage() for r in errors]
    assert httpx.get(lab + "/healthz", timeout=30).json()["ready"]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_messages(("step", "focus", "view"), ("inputs", "seq")), min_size=1, max_size=4))
def test_a_tab_socket_answers_every_generated_message(servers, frames):
    """A tab's socket (bound to its session by the ticket of its page load) answers each message with a
    payload, an error one for what it cannot read, and stays open."""
    import asyncio

    from test_hostile_sessions import Page, fresh

    lab = servers[0]
    ticket, message = Page(lab).hello(fresh(), headers={"Origin": lab})
    assert ticket and not message

    async def go():
        from websockets.asyncio.client import connect

        async with connect(lab.replace("http://", "ws://") + f"/ws/lab?ticket={ticket}", proxy=None,
                           max_size=None, origin=lab) as ws:
            while json.loads(await ws.recv())["type"] != "bound":
                pass
            got = 0
            for frame in frames:
                await ws.send(frame)
                while json.loads(await asyncio.wait_for(ws.recv(), 120))["type"] != "payload":
                    pass
                got += 1
            return got

    with _Errors() as errors:
        assert asyncio.run(go()) == len(frames)
    assert not errors, [r.getMessage() for r in errors]
