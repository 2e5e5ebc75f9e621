"""Issue 36, classes 3 and 4 and two socket bugs, against a real server (uvicorn, Gradio's queue over HTTP, real
websockets): one client cannot fill the lab with page loads, cannot lock the presenter out, a binary frame is
answered, and the scripted lecture's KV blocks leave with its script.

A page load here is what lab.js's page does: Gradio's "hello" event through the queue (POST queue/join, then the
session's event stream), then /ws/lab with the ticket it returned.
"""
import asyncio
import json
import secrets
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from app.openai_api import ApiSettings
from app.ops_api import parse_proxies
from app.session import PageLoads
from e2e_util import running_server

TOKEN = "sessions-presenter-token"
DELAY_S = 0.03  # the wrong-token delay these servers run with (the default is 1 s)
MAX_SESSIONS = 6


@pytest.fixture(scope="module")
def plain(base_engine):
    """No proxy configured (the default off a Space): X-Forwarded-For must be ignored."""
    with running_server(base_engine, presenter_token=TOKEN, max_sessions=MAX_SESSIONS,
                        wrong_token_delay_s=DELAY_S) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def proxied(base_engine):
    """Behind a proxy on 127.0.0.1 (--forwarded-allow-ips 127.0.0.1): its X-Forwarded-For names the client."""
    api = ApiSettings(proxies=parse_proxies("127.0.0.1"))
    with running_server(base_engine, presenter_token=TOKEN, max_sessions=MAX_SESSIONS, api=api,
                        wrong_token_delay_s=DELAY_S) as (url, app):
        yield url, app


class Page:
    """Gradio's side of a page: its events by api_name, with the components' default values."""

    def __init__(self, url: str):
        config = httpx.get(url + "/config", timeout=30).json()
        self.url = url
        self.deps = {d.get("id", i): d for i, d in enumerate(config["dependencies"])}
        self.defaults = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
        self.elem = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}

    def fn(self, api_name: str) -> int:
        return next(i for i, d in self.deps.items() if d.get("api_name") == api_name)

    def event(self, api_name: str, session_hash: str, headers=None, values=None):
        """One event through Gradio's queue, as the page sends it; returns its output data."""
        fn = self.fn(api_name)
        values = values or {}
        data = [values.get(cid, self.defaults.get(cid)) for cid in self.deps[fn]["inputs"]]
        with httpx.Client(base_url=self.url, timeout=60, headers=headers or {}) as c:
            r = c.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn, "session_hash": session_hash,
                                                       "event_data": None, "trigger_id": None})
            r.raise_for_status()
            event_id = r.json()["event_id"]
            with c.stream("GET", "/gradio_api/queue/data", params={"session_hash": session_hash}) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_completed" and msg.get("event_id") == event_id:
                        assert msg.get("success"), msg
                        return msg["output"]["data"]
        raise AssertionError("the event stream ended before the event completed")

    def hello(self, session_hash: str, headers=None):
        """(ticket or None, the message the page would show or '')."""
        ticket, payload = self.event("hello", session_hash, headers)
        message = json.loads(payload)["html"]["html-message"] if isinstance(payload, str) and payload else ""
        return (ticket if isinstance(ticket, str) and ticket else None), message


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://")


async def recv(ws, timeout=30) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def recv_until(ws, pred, timeout=60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        msg = await recv(ws, max(0.1, deadline - time.monotonic()))
        if pred(msg):
            return msg


def fresh() -> str:
    return secrets.token_hex(6)[:11]  # a browser's session hash: random per page load


def drop_all(app) -> None:
    """Between tests: every tab closed, every address's page-load budget full again."""
    for key in list(app.state.registry.sessions):
        app.state.registry.drop(key)
    app.state.registry.page_loads = PageLoads()


# ---- class 3: page loads cannot fill the lab ---------------------------------------------------------------
def test_socketless_page_loads_leave_places_for_real_visitors(plain):
    url, app = plain
    registry, page = app.state.registry, Page(url)
    drop_all(app)
    loads = [page.hello(fresh()) for _ in range(30)]  # the flood: 30 page loads, no socket, no heartbeat
    assert all(ticket and not message for ticket, message in loads)
    assert len(registry.sessions) == 0  # a page load holds no place

    async def real_visitor():  # the page's own sequence: hello, then its socket with the ticket
        key = fresh()
        ticket, message = page.hello(key, headers={"Origin": url})
        assert ticket and not message
        async with connect(ws_url(url) + f"/ws/lab?ticket={ticket}", proxy=None, max_size=None, origin=url) as ws:
            await recv_until(ws, lambda m: m["type"] == "bound")  # its session exists: it may step
            return key

    keys = [asyncio.run(real_visitor()) for _ in range(MAX_SESSIONS)]  # every place still goes to a real page
    assert set(keys) <= set(registry.sessions)
    drop_all(app)


def test_socketless_sessions_give_their_place_to_a_real_visitor(plain):
    """Sessions made by Gradio events of pages that never opened a socket (a script calling the page's events)
    fill the lab; once idle past the grace period they give their places to pages that open one."""
    url, app = plain
    registry, page = app.state.registry, Page(url)
    drop_all(app)
    bots = [fresh() for _ in range(MAX_SESSIONS)]
    for key in bots:
        page.event("view", key)  # any event but the page load makes the tab's session
    assert set(bots) == set(registry.sessions)
    ticket, message = page.hello(fresh())
    assert ticket is None and "full" in message  # just made and busy: the lab says it is full
    registry.socketless_grace_s = 0.5  # the fixture's grace period, short for the test (default 10 s)
    try:
        time.sleep(0.6)
        key = fresh()
        ticket, message = page.hello(key)
        assert ticket and not message

        async def visit():
            async with connect(ws_url(url) + f"/ws/lab?ticket={ticket}", proxy=None, max_size=None) as ws:
                await recv_until(ws, lambda m: m["type"] == "bound")

        asyncio.run(visit())
        assert key in registry.sessions and len(registry.sessions) == MAX_SESSIONS
    finally:
        registry.socketless_grace_s = 10.0
        drop_all(app)


def test_page_loads_are_limited_per_client_address(plain, proxied):
    for url, app in (plain, proxied):
        app.state.registry.page_loads = PageLoads(burst=5, per_minute=6)  # the limit under test, small
    # behind the known proxy: each forwarded address has its own budget
    url, app = proxied
    page = Page(url)
    forwarded = {"X-Forwarded-For": "203.0.113.50"}
    answers = [page.hello(fresh(), headers=forwarded) for _ in range(6)]
    assert all(t for t, _ in answers[:5])
    assert answers[5][0] is None and "too many page loads from your address" in answers[5][1]
    assert page.hello(fresh(), headers={"X-Forwarded-For": "203.0.113.51"})[0]  # another visitor: unaffected
    # no proxy configured: a forged X-Forwarded-For is ignored, every load counts against the peer's address
    url, app = plain
    page = Page(url)
    answers = [page.hello(fresh(), headers={"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(6)]
    assert all(t for t, _ in answers[:5]) and answers[5][0] is None and "try again in" in answers[5][1]
    for url, app in (plain, proxied):
        drop_all(app)


# ---- class 4: the presenter cannot be locked out ------------------------------------------------------------
def present(page, token, headers=None) -> str:
    """The page's Present button: the message line it shows."""
    out = page.event("present", fresh(), headers, values={page.elem["presenter_token"]: token})
    return json.loads(out[0])["html"]["html-message"]


async def socket_guesses(url, n, forged: bool) -> float:
    """`n` wrong tokens on /ws/present, three per socket (then it hangs up), all sockets at once; the seconds
    they took."""
    async def one_socket(first):
        headers = {"X-Forwarded-For": f"192.0.2.{first % 250 + 1}"} if forged else {}
        async with connect(ws_url(url) + "/ws/present", proxy=None, additional_headers=headers) as ws:
            for i in range(first, min(first + 3, n)):
                await ws.send(json.dumps({"op": "auth", "token": f"guess-{i}"}))
                reply = await recv(ws)
                assert reply["type"] == "error" and "wrong presenter token" in reply["error"]

    start = time.monotonic()
    await asyncio.gather(*(one_socket(first) for first in range(0, n, 3)))
    return time.monotonic() - start


async def script_auth(url, headers=None) -> dict:
    async with connect(ws_url(url) + "/ws/present", proxy=None, additional_headers=headers or {}) as ws:
        await ws.send(json.dumps({"op": "auth", "token": TOKEN}))
        return await recv(ws)


@pytest.mark.parametrize("which", ["plain", "proxied"])
def test_the_right_presenter_token_works_after_100_wrong_ones(which, request):
    url, app = request.getfixturevalue(which)
    page = Page(url)
    lecture = app.state.lecture
    # on the page path: 50 wrong from the same address, 50 with forged (rotating) X-Forwarded-For addresses
    start = time.monotonic()
    for i in range(100):
        headers = {"X-Forwarded-For": f"198.51.100.{i % 250 + 1}"} if i % 2 else None
        assert "Wrong presenter token" in present(page, f"wrong-{i}", headers)
    page_path_s = time.monotonic() - start
    assert "You are presenting" in present(page, TOKEN)  # no lockout: the same address, at once
    assert "You are presenting" in present(page, TOKEN, {"X-Forwarded-For": "198.51.100.7"})
    lecture.stop()
    # on /ws/present: 100 wrong, half from the same address, half forged, 34 sockets at once
    socket_same_s = asyncio.run(socket_guesses(url, 50, forged=False))
    asyncio.run(socket_guesses(url, 50, forged=True))
    assert asyncio.run(script_auth(url)) == {"type": "ok", "op": "auth"}
    assert asyncio.run(script_auth(url, {"X-Forwarded-For": "192.0.2.9"})) == {"type": "ok", "op": "auth"}
    # wrong answers are slowed: each waited DELAY_S at least, and one address's answers are spaced DELAY_S
    # apart however many sockets it opens at once
    assert page_path_s >= 100 * DELAY_S
    assert socket_same_s >= 50 * DELAY_S
    drop_all(app)


# ---- socket bugs --------------------------------------------------------------------------------------------
def test_a_binary_frame_is_answered_and_the_socket_stays(plain):
    url, app = plain
    page = Page(url)
    ticket, _ = page.hello(fresh())

    async def go():
        async with connect(ws_url(url) + f"/ws/lab?ticket={ticket}", proxy=None, max_size=None) as ws:
            await recv_until(ws, lambda m: m["type"] == "bound")
            await ws.send(b"\x00\x01binary")
            err = await recv_until(ws, lambda m: m["type"] == "error")
            await ws.send(json.dumps({"op": "view", "inputs": {"lang": "en", "visible": json.dumps({"ids": []})}}))
            after = await recv_until(ws, lambda m: m["type"] == "payload")  # the same socket still serves
        async with connect(ws_url(url) + "/ws/present", proxy=None) as ws:
            await ws.send(b"\xff")
            present_err = await recv(ws)
            await ws.send(json.dumps({"op": "auth", "token": TOKEN}))
            present_ok = await recv(ws)
        return err, after, present_err, present_ok

    err, after, present_err, present_ok = asyncio.run(go())
    assert "binary frames are not understood" in err["error"] and "payload" in after
    assert "binary frames are not understood" in present_err["error"] and present_ok["type"] == "ok"
    drop_all(app)


def test_the_scripted_lectures_blocks_leave_with_its_script(plain):
    url, app = plain
    registry, lecture = app.state.registry, app.state.lecture
    drop_all(app)
    stats = registry.room.engine.kv_stats
    before = stats().used

    async def script():
        async with connect(ws_url(url) + "/ws/present", proxy=None) as ws:
            for op in ({"op": "auth", "token": TOKEN},
                       {"op": "start", "prompt": "What is gravity?", "params": {"temperature": 0.0,
                                                                                "max_tokens": 64}},
                       {"op": "step", "count": 3}):
                await ws.send(json.dumps(op))
                assert (await recv(ws))["type"] == "ok"
            return stats().used

    during = asyncio.run(script())
    assert during > before  # the script's sequence held blocks while it drove
    deadline = time.monotonic() + 10
    while stats().used != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats().used == before and lecture.scripted is None and lecture.hub.presenter is None
