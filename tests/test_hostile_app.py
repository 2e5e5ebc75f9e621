"""A hostile visitor against the app: the Gradio handlers and every websocket, as a public Space sees them.

Each class of issue 11 has a test that failed on the code before the fix; the hypothesis tests throw generated
bad inputs at every handler and socket. For each input: a clear message (never a traceback), and afterwards
the session still gives the same greedy ids and holds no KV block.
"""
import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from app import downloads
from app import session as session_mod
from app.live import SCRIPTED, TokenGuard, origin_allowed
from app.server import ModelHolder
from app.session import LabSession, SessionRegistry
from app.handlers import LabHandlers
from app.ui_tools import ToolHandlers
from e2e_util import running_server
from engine import SamplingParams

TOKEN = "hostile-presenter-token"
GREEDY_PROMPT = "Hello"
HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
DEFAULTS = dict(prompt="Hi", chat=True, system="", temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, rep=1.0,
                freq=0.0, pres=0.0, seed=1, max_tokens=4, stop="", lang="en", layer=0, head=0, word="", npos=None,
                visible="")
ORDER = list(DEFAULTS)


def req(name):
    return SimpleNamespace(session_hash=name, headers={}, client=SimpleNamespace(host="203.0.113.7"))


def step_args(**over):
    values = {**DEFAULTS, **over}
    return [values[k] for k in ORDER]


@pytest.fixture(scope="module")
def lab(base_engine):
    registry = SessionRegistry(base_engine, kv_memory=16 * 1024 * 1024)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec,
                         machine={"bandwidth": 20e9, "peak_flops": 100e9})
    h = LabHandlers(registry, holder)
    return h, ToolHandlers(h), registry


@pytest.fixture(scope="module")
def greedy_ids(base_engine):
    return base_engine.session().generate(GREEDY_PROMPT, SamplingParams(temperature=0.0, max_tokens=8)).token_ids


def message_of(out) -> str:
    """The message line of a handler's payload ('' when the handler sent nothing or no message)."""
    if not isinstance(out, str):
        return ""
    return json.loads(out).get("html", {}).get("html-message", "")


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text and 'File "' not in text, text


def assert_session_intact(registry, key, greedy_ids):
    """After the bad inputs: Reset releases the tab's sequences (and so their blocks), and the engine gives the
    reference ids. The engine is the room's, shared with the test server's other tabs, whose blocks come and go
    (a generation may preempt them): only this tab's share is checked."""
    s = registry.sessions.get(key)
    if s is None or not isinstance(s, LabSession):
        return
    s.reset()
    assert s.engine.seq_ids(s.owner) == [] and not s.requests
    assert s.engine.generate(GREEDY_PROMPT, SamplingParams(temperature=0.0, max_tokens=8)).token_ids == greedy_ids
    assert s.engine.seq_ids(s.owner) == []


def tab_blocks(s) -> int:
    """KV blocks the tab's own sequences hold (the room's pool is shared with the other tabs)."""
    return sum(s.seq_view(sid).num_blocks for sid in s.requests)


# ---- strategies: what a hostile page or client can put where a value goes ------------------------------
junk = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                 st.sampled_from(["", " ", "nan", "inf", "-1", "1e309", "0x10", "\ud800", "../../etc/passwd",
                                  "<script>alert(1)</script>", "Что", "1" * 40]),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
huge_text = st.sampled_from(["x" * 30_000, "я" * 25_000, "a," * 5_000, "\ud800" * 10, " " * 50_000])


@HYPO
@given(field=st.sampled_from(ORDER), value=st.one_of(junk, huge_text))
def test_bad_step_inputs_get_a_message_and_break_nothing(lab, greedy_ids, field, value):
    h, _, registry = lab
    out = h.step(*step_args(**{field: value}), request=req("hostile-step"))
    assert_no_traceback(message_of(out))
    if message_of(out):
        assert "il-msg-" in message_of(out)
    s = registry.sessions["hostile-step"]
    if s.has_unfinished() and len(s.events) > 6:
        s.reset()  # accepted inputs run real steps: keep the session short so the test stays fast


def test_after_bad_step_inputs_the_session_is_intact(lab, greedy_ids):
    _, _, registry = lab
    assert_session_intact(registry, "hostile-step", greedy_ids)


HANDLERS = ["force", "rewind", "focus", "view", "what_if", "export_chart", "spec_settings", "present", "tour"]


@HYPO
@given(which=st.sampled_from(HANDLERS), a=junk, b=junk, c=st.one_of(junk, huge_text))
def test_bad_inputs_to_every_other_handler_get_a_message(lab, which, a, b, c):
    h, tools, registry = lab
    r = req("hostile-other")
    if not registry.sessions.get("hostile-other") or not registry.sessions["hostile-other"].requests:
        h.step(*step_args(max_tokens=6), request=r)  # something to force, rewind and what-if against
    calls = {
        "force": lambda: h.force(a, "en", 0, 0, "", None, "", request=r),
        "rewind": lambda: h.rewind(a, b, "en", 0, 0, "", None, "", request=r),
        "focus": lambda: h.focus(a, "ru", b, 0, "", None, c, request=r),
        "view": lambda: h.view("en", a, b, c, a, c, request=r),
        "what_if": lambda: h.what_if(a, b, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 4, c, "en", "", request=r),
        "export_chart": lambda: tools.export_chart(a, b, "en", 0, 0, c, None, request=r)[1],
        "spec_settings": lambda: tools.spec_settings(True, a, b, c, False, "en", request=r),
        "present": lambda: h.present(c, "en", 0, 0, "", None, "", request=r),
        "tour": lambda: tools.tour_step(1, a, 0, 1.0, 0.0, 1.0, 0.0, 0.0, b, 4, c, "en", 0, 0, "", None, "",
                                        request=r)[0],
    }
    out = calls[which]()
    assert_no_traceback(message_of(out))
    s = registry.sessions["hostile-other"]
    if s.has_unfinished() and len(s.events) > 6:
        s.reset()


def test_after_bad_handler_inputs_the_session_is_intact(lab, greedy_ids):
    _, _, registry = lab
    registry.sessions["hostile-other"].speculative = None
    assert_session_intact(registry, "hostile-other", greedy_ids)


# ---- class 7: every text is capped before any work ----------------------------------------------------
def test_text_inputs_are_refused_before_any_tokenizing(lab, monkeypatch):
    h, _, registry = lab

    def must_not_run(*a, **k):
        raise AssertionError("tokenizer work ran for an input over its cap")

    monkeypatch.setattr(session_mod, "render_prompt", must_not_run)
    monkeypatch.setattr(session_mod, "bpe_merges", must_not_run)
    r = req("hostile-caps")
    cases = [("prompt", {"prompt": "x" * 10_000_000}), ("system prompt", {"system": "y" * 8_000_000}),
             ("stop strings", {"stop": "z," * 500_000}), ("word", {"word": "a" * 1000})]
    for name, over in cases:
        msg = message_of(h.step(*step_args(**over), request=r))
        assert name in msg and "accepts up to" in msg, (name, msg)
    msg = message_of(h.view("en", 0, 0, "б" * 1000, None, "", request=r))
    assert "word is 1000 characters" in msg


def test_the_bpe_trace_is_computed_once_per_word(lab, monkeypatch):
    h, _, registry = lab
    r = req("hostile-bpe")
    h.step(*step_args(word="gravity"), request=r)
    calls = []
    real = session_mod.bpe_merges
    monkeypatch.setattr(session_mod, "bpe_merges", lambda tok, w: calls.append(w) or real(tok, w))
    for _ in range(3):
        h.view("en", 0, 0, "gravity", None, "", request=r)
    assert calls == []  # cached by the step's render
    h.view("en", 0, 0, "tokens", None, "", request=r)
    h.view("en", 0, 0, "tokens", None, "", request=r)
    assert calls == ["tokens"]


# ---- class 6: a ceiling on sessions, and nothing outlives its tab -------------------------------------
def test_the_lab_has_a_session_cap_and_says_so(base_engine):
    registry = SessionRegistry(base_engine, kv_memory=8 * 1024 * 1024, max_sessions=2)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec, machine={})
    h = LabHandlers(registry, holder)
    for name in ("cap-a", "cap-b"):
        h.view("en", 0, 0, "", None, "", request=req(name))
    full = message_of(h.view("ru", 0, 0, "", None, "", request=req("cap-c")))
    assert "заполнена" in full and "cap-c" not in registry.sessions
    assert "lab is full" in message_of(h.hello("en", request=req("cap-d"))[1])
    registry.drop("cap-a")  # a tab closes: its place is free at once
    h.view("en", 0, 0, "", None, "", request=req("cap-c"))
    assert set(registry.sessions) == {"cap-b", "cap-c"}


def test_idle_socketless_sessions_are_freed_and_closed_tabs_stay_closed(base_engine):
    registry = SessionRegistry(base_engine, kv_memory=8 * 1024 * 1024, socketless_timeout_s=0.05)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec, machine={})
    h = LabHandlers(registry, holder)
    h.step(*step_args(), request=req("api-client"))
    registry.has_socket = lambda key: key == "with-socket"
    h.step(*step_args(), request=req("with-socket"))
    import time
    time.sleep(0.1)
    registry.sweep()
    assert "api-client" not in registry.sessions  # no socket, no event for longer than the socket-less limit
    assert "with-socket" in registry.sessions  # an open page keeps its session (30 minutes by default)
    registry.drop("with-socket")  # the tab's unload
    # a Step queued behind the unload cannot bring the session back
    msg = message_of(h.step(*step_args(), request=req("with-socket")))
    assert "closed" in msg and "with-socket" not in registry.sessions


# ---- class 2: downloads go where the server says ------------------------------------------------------
@pytest.mark.parametrize("hostile_hash", ["../../../../tmp/inferlab-escape", "/etc", "..", "static/../.."])
def test_exports_go_to_server_named_folders_and_leave_with_the_tab(lab, hostile_hash):
    h, tools, registry = lab
    r = req(hostile_hash)
    h.step(*step_args(max_tokens=2), request=r)
    paths = [Path(tools.export_chart("chart-logits", "html", "en", 0, 0, "", None, request=r)[0])
             for _ in range(downloads.MAX_FILES_PER_TAB + 2)]
    trace_path = Path(tools.export_trace("en", request=r)[0])
    for p in paths + [trace_path]:
        assert p.resolve().parent.parent == downloads.ROOT.resolve()
        assert re.fullmatch(r"[0-9a-f]{32}", p.parent.name)
    folder = trace_path.parent
    assert len(list(folder.iterdir())) <= downloads.MAX_FILES_PER_TAB  # older files make room
    assert not Path("/tmp/inferlab-escape").exists()
    registry.drop(hostile_hash)
    assert not folder.exists()


# ---- class 1 and 3: sessions and sockets only by the server's word ------------------------------------
@pytest.fixture(scope="module")
def server(base_engine):
    with running_server(base_engine, presenter_token=TOKEN) as (url, app):
        yield url.replace("http://", "ws://"), app


async def _recv(ws, timeout=60):
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


def test_no_session_a_visitor_names_belongs_to_the_lecture(server):
    ws_url, app = server
    lecture = app.state.lecture
    h = LabHandlers(app.state.registry, app.state.holder, app.state.hub, lecture)

    def visitors():
        for name in ("__lecture__", "default", "lecture", ""):
            h.step(*step_args(), request=req(name))  # a visitor naming the old special keys gets a session of its own
            h.reset("en", "", request=req(name))
            app.state.registry.drop(name)  # its heartbeat ends: the lecture must not stop

    async def drive():
        # the script's socket stays open meanwhile: its session lives as long as a script drives it
        async with connect(ws_url + "/ws/present", proxy=None, max_size=None) as ws:
            for op in ({"op": "auth", "token": TOKEN}, {"op": "reset"},
                       {"op": "start", "prompt": "What is gravity?", "params": {"temperature": 0.0}},
                       {"op": "step"}):
                await ws.send(json.dumps(op))
                assert (await _recv(ws))["type"] == "ok"
            scripted = lecture.session
            steps = len(scripted.events)
            await asyncio.to_thread(visitors)
            assert lecture.session is scripted and lecture.is_presenter(SCRIPTED)
            assert len(scripted.events) == steps and scripted.requests
            assert all(s is not scripted for s in app.state.registry.sessions.values())

    asyncio.run(drive())


def test_sockets_need_the_servers_ticket_and_a_friendly_origin(server):
    ws_url, app = server
    registry, hub = app.state.registry, app.state.hub
    h = LabHandlers(registry, app.state.holder, hub, app.state.lecture)
    h.step(*step_args(), request=req("victim"))
    h.step(*step_args(), request=req("intruder"))

    async def go():
        for query in ("client=victim", "ticket=victim", "ticket=" + "A" * 32, ""):
            async with connect(ws_url + "/ws/lab?" + query, proxy=None, max_size=None) as ws:
                msg = await _recv(ws, 10)
                assert msg["type"] == "error" and "ticket" in msg["error"]
        for path in ("/ws/lab?ticket=" + registry.ticket("victim"), "/ws/follow", "/ws/present"):
            with pytest.raises(InvalidStatus) as err:
                async with connect(ws_url + path, proxy=None, origin="http://evil.example"):
                    pass
            assert err.value.response.status_code == 403
        # the victim's page with its own ticket: bound; a payload the intruder builds naming the victim's old
        # client id in its view state goes to the intruder's own channel only
        host_origin = "http://" + ws_url.split("//", 1)[1]
        async with connect(ws_url + "/ws/lab?ticket=" + registry.ticket("victim"), proxy=None, max_size=None,
                           origin=host_origin) as victim:
            assert (await _recv(victim, 10))["type"] == "bound"
            out = await asyncio.to_thread(h.view, "en", 0, 0, "", None,
                                          json.dumps({"client": "victim", "ids": ["chart-logits"]}),
                                          req("intruder"))
            assert isinstance(out, str)  # the intruder has no socket: its payload came back to it
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(victim.recv(), 1.0)

    asyncio.run(go())


def test_wrong_presenter_tokens_are_slowed_never_locked_out(server):
    """Issue 36 class 4: wrong tokens wait for their answer; the right one is never refused (the full story,
    with forged addresses and the page path against a live server, is tests/test_hostile_sessions.py)."""
    ws_url, app = server
    h = LabHandlers(app.state.registry, app.state.holder, app.state.hub, app.state.lecture)
    r = req("guesser")
    r.client.host = "198.51.100.9"
    msgs = [message_of(h.present(f"guess-{i}", "en", 0, 0, "", None, "", request=r)) for i in range(5)]
    assert all("Wrong presenter token" in m for m in msgs)
    msg = message_of(h.present(TOKEN, "en", 0, 0, "", None, "", request=r))  # the right one works at once
    assert "Wrong" not in msg and app.state.lecture.is_presenter("guesser")
    app.state.lecture.stop()

    async def socket_guesses():
        async with connect(ws_url + "/ws/present", proxy=None) as ws:
            replies = []
            for i in range(3):
                await ws.send(json.dumps({"op": "auth", "token": f"nope-{i}"}))
                replies.append(await _recv(ws, 10))
            await asyncio.wait_for(ws.wait_closed(), 10)  # the socket hangs up after the third
            return replies

    replies = asyncio.run(socket_guesses())
    assert all(r["type"] == "error" and "wrong presenter token" in r["error"] for r in replies)


def test_token_guard_and_origin_rules():
    g = TokenGuard(delay_s=0.2, max_wait_s=0.5)
    assert g.judge("secret", "secret", "a") is None  # right: no wait
    waits = [g.judge("x", "secret", "a") for _ in range(3)]
    assert waits[0] == pytest.approx(0.2, abs=0.05) and waits[1] == pytest.approx(0.4, abs=0.05)
    assert waits[2] == pytest.approx(0.5, abs=0.05)  # queued one address's answers apart, up to max_wait_s
    assert g.judge("secret", "secret", "a") is None  # still right at once, whatever came before
    assert g.judge("y", "secret", "b") == pytest.approx(0.2, abs=0.05)  # another address has its own queue
    with pytest.raises(ValueError, match="wrong"):
        g.check("z", "secret", "c")
    assert origin_allowed(None, "h:1", ())  # a script, not a browser
    assert origin_allowed("http://h:1", "h:1", ())
    assert not origin_allowed("http://evil", "h:1", ())
    assert origin_allowed("https://me.hf.space/", "inside:7860", ("https://me.hf.space",))


# ---- every websocket under generated garbage ----------------------------------------------------------
socket_messages = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["", "null", "[]", "{}", "1e999", '{"op": null}', '"step"', "{" * 5000, "[" * 100_000]),
    st.builds(json.dumps, st.dictionaries(st.sampled_from(["op", "inputs", "token", "count", "prompt", "params",
                                                           "chat", "system"]),
                                          st.one_of(junk, st.sampled_from(["step", "auth", "start", "reset"])),
                                          max_size=4)),
    st.builds(lambda inputs: json.dumps({"op": "step", "inputs": inputs}),
              st.dictionaries(st.sampled_from(ORDER), junk, max_size=5)),
    st.just("x" * 70_000))


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(path=st.sampled_from(["lab", "follow", "present"]), message=socket_messages)
def test_every_socket_answers_garbage_with_a_message(server, path, message):
    ws_url, app = server
    registry = app.state.registry
    url = ws_url + {"lab": "/ws/lab?ticket=" + registry.ticket("socket-garbage"), "follow": "/ws/follow",
                    "present": "/ws/present"}[path]

    async def go():
        async with connect(url, proxy=None, max_size=None) as ws:
            if path == "lab":
                registry.get("socket-garbage")  # the tab's session exists (its page loaded)
            await ws.send(message)
            while True:  # skip hello/bound/frames: the reply to this message is an error or a payload
                msg = await _recv(ws, 60)
                if msg["type"] in ("error", "ok"):
                    return msg.get("error", "")
                if msg["type"] == "payload" and msg["payload"].get("op") == "step":
                    return msg["payload"]["html"].get("html-message", "")

    text = asyncio.run(go())
    assert_no_traceback(text)
    s = registry.sessions.get("socket-garbage")
    if s is not None and s.has_unfinished() and len(s.events) > 6:
        s.reset()


def test_after_socket_garbage_the_session_is_intact(server, greedy_ids):
    ws_url, app = server
    assert_session_intact(app.state.registry, "socket-garbage", greedy_ids)


# ---- class 4: a failed step changes nothing, and the page says so truthfully ---------------------------
def test_a_step_that_fails_is_undone_and_the_page_says_so(lab, greedy_ids, monkeypatch):
    h, _, registry = lab
    r = req("hostile-atomic")
    # an underflowing positive temperature means greedy (it used to raise IndexError inside the chain)
    for _ in range(3):
        assert "il-msg-error" not in message_of(h.step(*step_args(prompt=GREEDY_PROMPT, temperature=1e-300,
                                                                    max_tokens=8), request=r))
    s = registry.sessions["hostile-atomic"]
    assert s.engine.sequences[s.focus].output_ids == greedy_ids[:3]
    before = (len(s.events), list(s.engine.sequences[s.focus].output_ids), tab_blocks(s))
    import engine.engine as engine_mod
    real = engine_mod.Engine._sample
    monkeypatch.setattr(engine_mod.Engine, "_sample", lambda *a, **k: (_ for _ in ()).throw(IndexError("boom")))
    msg = message_of(h.step(*step_args(prompt=GREEDY_PROMPT, temperature=0.0, max_tokens=8), request=r))
    assert "failed and was undone" in msg and "IndexError" in msg and "still usable" not in msg
    after = (len(s.events), list(s.engine.sequences[s.focus].output_ids), tab_blocks(s))
    assert after == before
    monkeypatch.setattr(engine_mod.Engine, "_sample", real)
    while s.has_unfinished():  # the same sequence carries on, exactly as if nothing had happened
        assert "il-msg-error" not in message_of(h.step(*step_args(prompt=GREEDY_PROMPT, temperature=0.0,
                                                                    max_tokens=8), request=r))
    assert s.engine.sequences[s.focus].output_ids == greedy_ids
    s.reset()
    assert s.engine.seq_ids(s.owner) == []


# ---- class 6: what a tab keeps of its captures is bounded ---------------------------------------------
def test_a_tabs_captures_stay_within_its_budget(lab, monkeypatch):
    h, _, registry = lab
    r = req("hostile-capture")
    h.step(*step_args(prompt="Tell me a long story about the Moon and the tides.", max_tokens=12), request=r)
    s = registry.sessions["hostile-capture"]
    prefill = s.events[0].capture_nbytes()
    assert prefill > 0 and s.engine.instrument.max_attention_bytes == session_mod.ATTENTION_BUDGET
    monkeypatch.setattr(session_mod, "SESSION_CAPTURE_BYTES", prefill // 2)  # the prefill alone is too much
    for _ in range(4):
        h.step(*step_args(max_tokens=12), request=r)
    held = [ev.capture_nbytes() for ev in s.events]
    assert sum(held[:-1]) <= prefill // 2 and held[-1] > 0  # the newest keeps its capture; older ones gave theirs
    assert held[0] < prefill  # the prefill's attention went first
    out = h.view("en", 0, 0, "", None, json.dumps({"ids": ["chart-attention"]}), request=r)
    assert "il-msg-error" not in message_of(out)
    s.reset()


def test_viewer_and_presenter_sockets_are_capped(server, monkeypatch):
    ws_url, app = server
    import app.live as live
    monkeypatch.setattr(live, "MAX_OPEN_SOCKETS", app.state.hub.open_sockets + 2)

    async def go():
        async with connect(ws_url + "/ws/follow", proxy=None) as a, connect(ws_url + "/ws/present", proxy=None) as b:
            assert (await _recv(a, 10))["type"] == "hello"
            async with connect(ws_url + "/ws/follow", proxy=None) as c:
                refused = await _recv(c, 10)
            await b.send(json.dumps({"op": "step"}))
            still = await _recv(b, 10)
        return refused, still

    refused, still = asyncio.run(go())
    assert refused["type"] == "error" and "too many connections" in refused["error"]
    assert still["type"] == "error" and "authenticate" in still["error"]  # the open ones carry on


def test_page_loads_without_a_session_cannot_grow_the_ticket_table(lab, monkeypatch):
    _, _, registry = lab
    monkeypatch.setattr(session_mod, "MAX_TICKETS", 40)
    registry.get("ticket-owner")
    live_ticket = registry.ticket("ticket-owner")  # a tab with a session keeps its ticket
    for i in range(200):
        registry.ticket(f"page-load-{i}")
    assert len(registry._tickets) <= 40
    assert registry.key_for_ticket(live_ticket) == "ticket-owner"
    registry.drop("ticket-owner")
