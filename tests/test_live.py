"""Lecture mode and the tab websocket, over real sockets: uvicorn serving the app, `websockets` clients."""
import asyncio
import contextlib
import json
from types import SimpleNamespace

import pytest
from websockets.asyncio.client import connect

from app.live import merge_payloads
from app.handlers import LabHandlers
from e2e_util import running_server

TOKEN = "test-presenter-token"


@pytest.fixture(scope="module")
def server(base_engine):
    with running_server(base_engine, presenter_token=TOKEN) as (url, app):
        yield url.replace("http://", "ws://"), app


async def recv_json(ws, timeout=60):
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def recv_until(ws, pred, timeout=60):
    """Messages up to and including the first that satisfies pred."""
    out = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        msg = await recv_json(ws, max(0.1, deadline - loop.time()))
        out.append(msg)
        if pred(msg):
            return out


async def present(ws_url, ops):
    """Run presenter ops in order; return the replies."""
    replies = []
    async with connect(ws_url + "/ws/present", proxy=None, max_size=None) as ws:
        for op in ops:
            await ws.send(json.dumps(op))
            replies.append(await recv_json(ws, 120))
    return replies


@contextlib.asynccontextmanager
async def presenting(ws_url, ops):
    """Run presenter ops in order on a socket that stays open inside the block (the scripted lecture's session
    lives as long as its script's socket); yields the replies."""
    async with connect(ws_url + "/ws/present", proxy=None, max_size=None) as ws:
        replies = []
        for op in ops:
            await ws.send(json.dumps(op))
            replies.append(await recv_json(ws, 120))
        yield replies


def start_op(prompt="Что такое гравитация?"):
    return {"op": "start", "prompt": prompt, "chat": True, "params": {"temperature": 0.0, "max_tokens": 40}}


def test_token_is_required_and_viewers_cannot_drive(server):
    ws_url, app = server

    async def go():
        bad = await present(ws_url, [{"op": "auth", "token": "guess"}, {"op": "step"}])
        assert bad[0]["type"] == "error" and "token" in bad[0]["error"]
        assert bad[1]["type"] == "error" and "authenticate" in bad[1]["error"]
        async with connect(ws_url + "/ws/follow", proxy=None, max_size=None) as viewer:
            hello = await recv_json(viewer)
            assert hello["type"] == "hello" and TOKEN not in json.dumps(hello)
            before = app.state.registry.base.step_index, {k: len(s.events) for k, s in
                                                          app.state.registry.sessions.items()}
            for attempt in ({"op": "step"}, {"op": "auth", "token": TOKEN}, {"op": "start", "prompt": "x"}):
                await viewer.send(json.dumps(attempt))
                reply = await recv_until(viewer, lambda m: m["type"] == "error")
                assert "read-only" in reply[-1]["error"]
            after = app.state.registry.base.step_index, {k: len(s.events) for k, s in
                                                         app.state.registry.sessions.items()}
            assert after == before

    asyncio.run(go())


def test_viewer_receives_every_step_event_and_frames_match_the_session(server):
    ws_url, app = server
    n = 6

    async def go():
        async with connect(ws_url + "/ws/follow", proxy=None, max_size=None) as viewer:
            await recv_json(viewer)  # hello (and maybe the previous lecture's frame)
            async with presenting(ws_url, [{"op": "auth", "token": TOKEN}, {"op": "reset"}, start_op(),
                                           *[{"op": "step"}] * n]) as replies:
                assert all(r["type"] == "ok" for r in replies), replies
                stepped = [r["steps"][0] for r in replies[3:]]
                msgs = await recv_until(viewer, lambda m: m["type"] == "event" and
                                        m["event"].get("step") == stepped[-1])
                got = [m["event"]["step"] for m in msgs if m["type"] == "event" and "step" in m["event"]]
                assert got[-n:] == stepped  # every step event, in order, none skipped
                # the frame after the last step carries the session's own numbers
                frame = None
                while frame is None or "chart-timeline" not in frame["payload"]["figs"]:
                    frame = (await recv_until(viewer, lambda m: m["type"] == "frame"))[-1]
                await asyncio.sleep(0.3)
                # read while the script is connected: its session is freed when it leaves
                return frame, [e.timing.step_ms for e in app.state.lecture.session.events]

    frame, step_ms = asyncio.run(go())
    bars = [y for tr in frame["payload"]["figs"]["chart-timeline"]["data"] if tr.get("name") == "steps"
            for y in tr["y"]]
    assert len(bars) == len(step_ms)
    assert sorted(round(b, 3) for b in bars) == sorted(round(ms, 3) for ms in step_ms)
    assert "html-stream" in frame["payload"]["html"]


def test_fifty_viewers_all_receive_the_events_and_leavers_are_freed(server):
    ws_url, app = server
    hub = app.state.hub

    async def go():
        viewers = [await connect(ws_url + "/ws/follow", proxy=None, max_size=None) for _ in range(50)]
        try:
            for v in viewers:
                assert (await recv_json(v))["type"] == "hello"
            assert hub.viewer_count >= 50
            replies = await present(ws_url, [{"op": "auth", "token": TOKEN}, {"op": "reset"}, start_op(),
                                             {"op": "step"}, {"op": "step"}, {"op": "step"}])
            last = replies[-1]["steps"][0]
            wanted = [r["steps"][0] for r in replies[3:]]
            results = await asyncio.gather(*[recv_until(
                v, lambda m: m["type"] == "event" and m["event"].get("step") == last) for v in viewers])
            for msgs in results:
                got = [m["event"]["step"] for m in msgs if m["type"] == "event" and "step" in m["event"]]
                assert got[-3:] == wanted
            # every viewer also gets a chart frame of the final state (latest wins: maybe not every frame)
            frames = await asyncio.gather(*[recv_until(v, lambda m: m["type"] == "frame") for v in viewers])
            assert all(f[-1]["payload"]["figs"] for f in frames)
        finally:
            for v in viewers[:25]:
                await v.close()
        for _ in range(100):  # the server notices the closed sockets and frees them
            if hub.viewer_count <= 25:
                break
            await asyncio.sleep(0.05)
        assert hub.viewer_count == 25
        for v in viewers[25:]:
            await v.close()
        for _ in range(100):
            if hub.viewer_count == 0:
                break
            await asyncio.sleep(0.05)
        assert hub.viewer_count == 0

    asyncio.run(go())


def test_late_joiner_sees_the_current_state_at_once(server):
    ws_url, app = server

    async def go():
        async with presenting(ws_url, [{"op": "auth", "token": TOKEN}, {"op": "reset"},
                                       start_op("What is gravity?"), {"op": "step"}, {"op": "step"}]):
            async with connect(ws_url + "/ws/follow", proxy=None, max_size=None) as early:  # makes frames happen
                await recv_until(early, lambda m: m["type"] == "frame")
            await asyncio.sleep(0.5)
            async with connect(ws_url + "/ws/follow", proxy=None, max_size=None) as late:
                msgs = await recv_until(late, lambda m: m["type"] == "frame", timeout=5)
            assert msgs[0]["type"] == "hello" and msgs[0]["presenting"]
            stream = msgs[-1]["payload"]["html"]["html-stream"]
            s = app.state.lecture.session
            text = s.events[-1].seq(s.focus).new_token_text.strip()
            assert text and text in stream

    asyncio.run(go())


def _tab_url(ws_url, app, key):
    """The socket URL a page gets for session `key`: its ticket is the server's (SessionRegistry.ticket)."""
    return ws_url + "/ws/lab?ticket=" + app.state.registry.ticket(key)


async def _wait_tab(app, key):
    for _ in range(100):
        if app.state.hub.has_tab(key):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"tab socket for {key} never registered")


@contextlib.asynccontextmanager
async def _tab_socket(ws_url, app, key):
    """Tab `key`'s socket, open and registered with the hub."""
    async with connect(_tab_url(ws_url, app, key), proxy=None, max_size=None) as ws:
        await _wait_tab(app, key)
        yield ws


async def _bind(ws, app, key, handlers, chart):
    """A Gradio event (here: the handler, as Gradio calls it) makes tab `key`'s session, showing `chart`; the
    socket hears of it (bound). Returns the session."""
    await asyncio.to_thread(handlers.view, "en", 0, 0, "", None, json.dumps({"ids": [chart]}),
                            SimpleNamespace(session_hash=key))
    await recv_until(ws, lambda m: m["type"] == "bound")
    return app.state.registry.sessions[key]


def test_tab_payloads_travel_over_the_tab_socket(server):
    ws_url, app = server
    h = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)
    # lab.js no longer names a client: whatever a page writes there, the server routes by its own record
    visible = json.dumps({"client": "someone-else", "ids": ["chart-logits", "chart-bytes"]})

    async def go():
        async with connect(_tab_url(ws_url, app, "tab-socket-test"), proxy=None, max_size=None) as ws:
            await _wait_tab(app, "tab-socket-test")
            out = await asyncio.to_thread(
                h.step, "Что такое гравитация?", True, "", 0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 16, "", "en", 0, 0,
                "", None, visible, "", SimpleNamespace(session_hash="tab-socket-test"))  # grammar box empty
            msgs = await recv_until(ws, lambda m: m["type"] == "payload")
            return out, msgs

    out, msgs = asyncio.run(go())
    assert not isinstance(out, str)  # nothing went through the Gradio component
    assert {"type": "bound"} in msgs  # the session came into being: the page may step over the socket
    payload = msgs[-1]["payload"]
    assert set(payload["figs"]) == {"chart-logits", "chart-bytes"}
    s = app.state.registry.sessions["tab-socket-test"]
    ev = s.events[-1].seq(s.focus)
    bars = [x for tr in payload["figs"]["chart-logits"]["data"] for x in (tr.get("customdata") or [])]
    assert ev.new_token in [b[0] if isinstance(b, list) else b for b in bars]
    assert "chart-attention" in payload["stale"]


STEP_INPUTS = {"prompt": "Что такое гравитация?", "chat": True, "system": "", "temperature": "0", "top_k": "0",
               "top_p": "1", "min_p": "0", "rep": "1", "freq": "0", "pres": "0", "seed": "1", "max_tokens": "16",
               "stop": "", "lang": "en", "layer": "0", "head": "0", "word": "", "npos": "-1"}


def test_a_tab_steps_over_its_own_socket(server):
    """The page's Step over /ws/lab runs the same handler on the tab's own session; the charts on screen come
    first, those just off screen in a second payload. The page load made no session: the socket's opening does
    (issue 36: page loads that never open one hold no place)."""
    ws_url, app = server
    key = "tab-step-session"
    handlers = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)

    async def go():
        async with _tab_socket(ws_url, app, key) as ws:
            await recv_until(ws, lambda m: m["type"] == "bound", timeout=10)  # made by the socket, no event
            s = app.state.registry.sessions[key]
            await asyncio.to_thread(handlers.view, "en", 0, 0, "", None, json.dumps({"ids": ["chart-bytes"]}),
                                    SimpleNamespace(session_hash=key))
            before = len(s.events)
            view = json.dumps({"ids": ["chart-logits"], "near": ["chart-sampling"]})
            await ws.send(json.dumps({"op": "step", "inputs": {**STEP_INPUTS, "visible": view}}))
            got = await recv_until(ws, lambda m: m["type"] == "payload" and "chart-sampling" in m["payload"]["figs"])
            bad = {**STEP_INPUTS, "temperature": "hot"}
            await ws.send(json.dumps({"op": "step", "inputs": bad}))
            err = (await recv_until(ws, lambda m: m["type"] == "payload"))[-1]["payload"]
            return s, before, got, err

    s, before, got, err = asyncio.run(go())
    assert len(s.events) == before + 1  # exactly one engine step, on this tab's session
    payloads = [m["payload"] for m in got if m["type"] == "payload"]
    first = next(p for p in payloads if p.get("op") == "step")
    # a new sequence: the step's own payload carries the sequence selector (no second round trip)
    assert f'value="{s.focus}" selected' in first["html"]["html-focus"]
    # on screen: built and sent first; the near chart follows (merged into the same message when the socket's
    # sender had not yet written the first), and is never reported stale
    assert "chart-logits" in first["figs"] and set(first["figs"]) <= {"chart-logits", "chart-sampling"}
    assert "chart-sampling" not in first["stale"]
    assert "chart-sampling" in payloads[-1]["figs"]
    ev = s.events[-1].seq(s.focus)
    bars = [x for tr in first["figs"]["chart-logits"]["data"] for x in (tr.get("customdata") or [])]
    assert ev.new_token in [b[0] for b in bars]
    assert s.requests[s.focus].prompt == "Что такое гравитация?"
    assert "temperature must be a number" in err["html"]["html-message"]
    assert len(s.events) == before + 1  # the bad message ran nothing


def test_a_tab_runs_over_its_own_socket(server):
    """Run over /ws/lab: the Run handler on the tab's own session, its frames as payloads, then run_end; a second
    Run while one goes changes nothing; the sequence runs to its end, exactly max_tokens tokens."""
    ws_url, app = server
    key = "tab-run-session"
    handlers = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)

    async def go():
        async with _tab_socket(ws_url, app, key) as ws:
            s = await _bind(ws, app, key, handlers, "chart-logits")
            inputs = {**STEP_INPUTS, "max_tokens": "6", "visible": json.dumps({"ids": ["chart-logits"]})}
            await ws.send(json.dumps({"op": "run", "inputs": inputs}))
            await ws.send(json.dumps({"op": "run", "inputs": inputs}))  # pressed twice: one Run
            msgs = await recv_until(ws, lambda m: m["type"] == "run_end", timeout=120)
            return s, msgs

    s, msgs = asyncio.run(go())
    frames = [m["payload"] for m in msgs if m["type"] == "payload" and "chart-logits" in m["payload"].get("figs", {})]
    assert frames  # the run's frames came over the socket
    v = s.focus_view()
    assert v.finished and len(v.output_ids) == 6
    assert len(s.requests) == 1  # the second press started nothing
    assert s.requests[s.focus].prompt == "Что такое гравитация?"


def test_merged_payloads_equal_applying_both():
    a = {"figs": {"x": 1, "y": 1}, "html": {"h": "a", "k": "a"}, "stale": ["z"], "t": 1}
    b = {"figs": {"z": 2}, "html": {"h": "b"}, "stale": ["y"], "t": 2}
    m = merge_payloads(a, b)
    assert m["figs"] == {"x": 1, "z": 2} and m["html"] == {"h": "b", "k": "a"}
    assert m["stale"] == ["y"] and m["t"] == 2
    # "same": built and equal to what the page has, so not resent; a later stale mark wins over it
    c = {"figs": {}, "same": ["x", "w"], "stale": [], "t": 3}
    d = {"figs": {}, "same": ["v"], "stale": ["w"], "t": 4}
    m2 = merge_payloads(merge_payloads(m, c), d)
    assert m2["same"] == ["v", "x"] and set(m2["stale"]) == {"w", "y"} and m2["figs"] == {"x": 1, "z": 2}


def test_a_socket_opened_after_the_session_is_bound_at_once(server):
    """A page's first Gradio event can come before its websocket connects: the socket is bound on arrival."""
    ws_url, app = server
    key = "tab-late-session"
    handlers = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)
    assert not app.state.hub.has_tab(key)
    handlers.view("en", 0, 0, "", None, json.dumps({"ids": ["chart-bytes"]}), SimpleNamespace(session_hash=key))

    async def go():
        async with connect(_tab_url(ws_url, app, key), proxy=None, max_size=None) as ws:
            await recv_until(ws, lambda m: m["type"] == "bound", timeout=10)  # at once, without another event
            await ws.send(json.dumps({"op": "step", "inputs": STEP_INPUTS}))
            return (await recv_until(ws, lambda m: m["type"] == "payload"))[-1]["payload"]

    before = len(app.state.registry.sessions[key].events)
    payload = asyncio.run(go())
    assert payload["op"] == "step" and "no session" not in payload["html"].get("html-message", "")
    assert len(app.state.registry.sessions[key].events) == before + 1


def test_the_sequence_selector_sends_focus_over_the_socket(server):
    """Choosing a sequence in the server-drawn selector is a Focus command on the tab's socket: the answer is
    the payload for the new focus, with the selector showing it."""
    ws_url, app = server
    key = "tab-focus-socket"
    handlers = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)
    for prompt in ("What is gravity?", "Hi"):
        handlers.add(prompt, True, "", 0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 8, "", "en", 0, 0, "", None, "", "",
                     SimpleNamespace(session_hash=key))  # the last "" before the request: the grammar box
    s = app.state.registry.sessions[key]
    first, second = sorted(s.requests)
    assert s.focus == first
    view = {k: STEP_INPUTS[k] for k in ("lang", "layer", "head", "word", "npos")}

    async def go():
        async with connect(_tab_url(ws_url, app, key), proxy=None, max_size=None) as ws:
            await recv_until(ws, lambda m: m["type"] == "bound", timeout=10)
            await ws.send(json.dumps({"op": "focus", "seq": second, "inputs": view}))
            return (await recv_until(ws, lambda m: m["type"] == "payload" and "html-focus" in m["payload"]["html"]))

    msgs = asyncio.run(go())
    assert s.focus == second
    assert f'value="{second}" selected' in msgs[-1]["payload"]["html"]["html-focus"]


def test_both_pages_get_the_constants_in_their_head(server):
    """window.INFERLAB (app/protocol.py) comes once, in the head, before lab.js: on the lab page and on /follow."""
    import httpx

    http = server[0].replace("ws://", "http://")
    for path in ("/", "/follow"):
        page = httpx.get(http + path, timeout=30).text
        assert page.count("window.INFERLAB =") == 1, path
        assert page.index("window.INFERLAB =") < page.index("/lab-static/lab.js") < page.index("</head>"), path


def test_followers_see_the_presenters_tab_marked_as_the_presenters(server):
    """A follower's frame is the presenter's session drawn for the room: the room charts named the presenting
    tab "(you)", which on a follower's screen is not the follower's tab (issue 37)."""
    _, app = server
    h = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)
    request = SimpleNamespace(session_hash="tab-presenter-mark")
    own = json.loads(h.step("What is gravity?", True, "", 0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 8, "", "en", 0, 0, "",
                            None, "", "", request))
    s = app.state.registry.sessions["tab-presenter-mark"]
    frame = app.state.lecture.build_frame(s, ("en", 0, 0, "", None))

    def names(payload):  # who each segment of the room's batch strip is, as its hover names it
        return {c[0] for tr in payload["figs"]["chart-room-batch"]["data"] for c in tr.get("customdata") or []}

    label = s.owner  # "tab 3": the charts name it so in English
    assert f"{label} (you)" in names(own)  # the tab's own page: its own tab
    assert f"{label} (presenter)" in names(frame) and not any("(you)" in n for n in names(frame))
    assert "(you)" not in frame["html"]["html-room-log"] and f"{label} (presenter)" in frame["html"]["html-room-log"]
    ru = app.state.lecture.build_frame(s, ("ru", 0, 0, "", None))
    assert any("(ведущий)" in n for n in names(ru))
    app.state.registry.drop("tab-presenter-mark")
