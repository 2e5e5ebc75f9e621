"""The tab socket's "view" op and the room's pushes to idle tabs, over real sockets: uvicorn serving the app, the
real engine, `websockets` clients standing in for pages (tests/test_e2e_room.py drives Chromium)."""
import asyncio
import json

import pytest
from websockets.asyncio.client import connect

from app.delivery import RoomPusher
from e2e_util import running_server
from test_live import recv_json, recv_until

STEP_INPUTS = {"prompt": "What is gravity?", "chat": True, "system": "", "temperature": "0", "top_k": "0",
               "top_p": "1", "min_p": "0", "rep": "1", "freq": "0", "pres": "0", "seed": "1", "max_tokens": "24",
               "stop": "", "lang": "en", "layer": "0", "head": "0", "word": "", "npos": "-1"}
VIEW = {k: STEP_INPUTS[k] for k in ("lang", "layer", "head", "word", "npos")}
ROOM = ["chart-room-batch", "chart-room-pool", "chart-room-throughput", "chart-room-size"]


@pytest.fixture(scope="module")
def server(base_engine):
    with running_server(base_engine) as (url, app):
        yield url.replace("http://", "ws://"), app


async def open_tab(ws_url, app, key):
    """A page's socket for session `key`, its session made (as its page-load event makes it) and bound."""
    ws = await connect(ws_url + "/ws/lab?ticket=" + app.state.registry.ticket(key), proxy=None, max_size=None)
    for _ in range(100):
        if app.state.hub.has_tab(key):
            break
        await asyncio.sleep(0.02)
    app.state.registry.get(key)
    await recv_until(ws, lambda m: m["type"] == "bound", timeout=10)
    return ws


def view_op(ids, near=(), **inputs):
    return json.dumps({"op": "view", "inputs": {**VIEW, **inputs,
                                                "visible": json.dumps({"ids": list(ids), "near": list(near)})}})


async def send_view(ws, ids, near=(), **inputs):
    """Send a view op and take its answer: the charts on screen, then (with `near`) those just off it."""
    await ws.send(view_op(ids, near, **inputs))
    last = near[0] if near else None
    await recv_until(ws, lambda m: is_payload(m) and (last is None or last in m["payload"]["figs"]
                                                       or last in m["payload"].get("same", [])))


def step_op(ids=("chart-logits",), **inputs):
    return json.dumps({"op": "step", "inputs": {**STEP_INPUTS, **inputs, "visible": json.dumps({"ids": list(ids)})}})


def is_payload(m):
    return m["type"] == "payload"


def batch_steps(fig) -> list[int]:
    """The steps the batch strip shows (x of its "batch" trace), each once."""
    trace = next(t for t in fig["data"] if t.get("name") == "batch")
    return sorted(set(trace["x"]))


def test_the_view_op_answers_with_the_charts_in_view_and_refuses_bad_input(server):
    ws_url, app = server
    key = "view-op-tab"
    tab_views = app.state.pusher.delivery.views

    async def go():
        ws = await open_tab(ws_url, app, key)
        try:
            await ws.send(step_op())
            await recv_until(ws, lambda m: is_payload(m) and m["payload"].get("op") == "step")
            s = app.state.registry.sessions[key]
            steps = len(s.events)
            # charts on screen first, the one just off screen in a second payload; chart-logits was sent with the
            # step and has not changed: named "same", not sent again
            await ws.send(view_op(["chart-bytes", "chart-logits"], ["chart-timeline"]))
            got = await recv_until(ws, lambda m: is_payload(m) and "chart-timeline" in m["payload"]["figs"])
            first = next(m["payload"] for m in got if is_payload(m))
            recorded = tab_views.peek(key).view
            answers = {}
            for name, text in (
                    ("long", json.dumps({"op": "view", "inputs": {**VIEW, "visible": "x" * 9000}})),
                    ("type", json.dumps({"op": "view", "inputs": {**VIEW, "visible": ["chart-bytes"]}})),
                    ("layer", view_op(["chart-bytes"], layer="deep")),
                    ("json", '{"op": "view", "inputs": '),
                    ("op", json.dumps({"op": "scroll", "inputs": VIEW}))):
                await ws.send(text)
                answers[name] = (await recv_until(ws, is_payload))[-1]["payload"]
            await ws.send("y" * 70_000)
            answers["size"] = (await recv_until(ws, lambda m: m["type"] == "error"))[-1]
            return s, steps, first, got, recorded, answers
        finally:
            await ws.close()

    s, steps, first, got, recorded, answers = asyncio.run(go())
    assert "chart-bytes" in first["figs"] and "chart-logits" in first["same"]
    assert "chart-logits" not in first["figs"] and "chart-timeline" not in first["stale"]
    assert "chart-attention" in first["stale"] and "html-message" not in first["html"]  # a view keeps the message
    # the bytes chart is this session's: one bar per token of its sequence (the latest ones), with its id
    shown = sorted((x, c[0]) for t in first["figs"]["chart-bytes"]["data"] for x, c in zip(t["x"], t["customdata"]))
    ids = s.seq_token_ids(s.focus)
    assert shown and [i for _, i in shown] == list(ids[shown[0][0]:]) and shown[-1][0] == len(ids) - 1
    assert "chart-timeline" in got[-1]["payload"]["figs"]
    assert recorded.visible == {"chart-bytes", "chart-logits"} and recorded.near == {"chart-timeline"}
    message = {k: v.get("html", {}).get("html-message", v.get("error", "")) for k, v in answers.items()}
    assert "view state" in message["long"] and "8192" in message["long"] and answers["long"]["op"] == "view"
    assert "must be text" in message["type"]
    assert "layer must be a number" in message["layer"]
    assert "is one of" in message["json"] and "unknown op" in message["op"]
    assert "message too long" in message["size"]
    for text in message.values():
        assert "Traceback" not in text and "\n" not in text
    assert len(s.events) == steps  # nothing ran
    assert tab_views.peek(key).view == recorded  # a refused view does not replace the page's last one


def room_pushes(msgs) -> list[dict]:
    """The payloads among `msgs` that the room pusher sent (no op: not the answer to anything the tab sent)."""
    out = []
    for m in msgs:
        p = m["payload"] if is_payload(m) else {}
        figs, html = set(p.get("figs", {})), set(p.get("html", {}))
        if p and not p.get("op") and "stale" not in p and figs | html and figs <= set(ROOM) and \
                html <= {"html-room-log"}:
            out.append(p)
    return out


def test_an_idle_tab_watching_the_room_sees_its_steps_once_a_second_at_most(server):
    """Tab A has the room panel in view and presses nothing; tab B steps. A's socket brings it the room charts
    it has in view and the event log, as the room recorded them, at most once a second, and only what changed."""
    ws_url, app = server
    room = app.state.registry.room

    async def go():
        a = await open_tab(ws_url, app, "room-watcher")
        b = await open_tab(ws_url, app, "room-stepper")
        try:
            await send_view(a, ["chart-room-batch", "chart-room-size"], ["chart-room-pool"])
            steps_before = room.version()[0]
            for _ in range(6):  # B's own steps (its page shows only its logits)
                await b.send(step_op())
                await recv_until(b, lambda m: is_payload(m) and m["payload"].get("op") == "step")
            last = room.records()[-1]["step"]
            got = []  # what A receives until its batch strip shows B's last step
            while True:
                got.append(await recv_json(a, 30))
                figs = [p["figs"]["chart-room-batch"] for p in room_pushes(got) if "chart-room-batch" in p["figs"]]
                if figs and batch_steps(figs[-1])[-1] == last:
                    break
            await asyncio.sleep(1.5)  # nothing changes now: no more pushes
            quiet = []
            try:
                while True:
                    quiet.append(await recv_json(a, 0.5))
            except asyncio.TimeoutError:
                pass
            return steps_before, last, got, quiet
        finally:
            await a.close()
            await b.close()

    steps_before, last, got, quiet = asyncio.run(go())
    pushes = room_pushes(got)
    assert pushes and len(pushes) == len([m for m in got if is_payload(m)])  # A got room updates, nothing else
    records = {r["step"]: r for r in app.state.registry.room.records()}
    strip = [p["figs"]["chart-room-batch"] for p in pushes if "chart-room-batch" in p["figs"]][-1]
    b_owner = app.state.registry.sessions["room-stepper"].owner
    trace = next(t for t in strip["data"] if t["name"] == "batch")
    for step, shown in zip(trace["x"], trace["customdata"]):  # each segment is a sequence the room batched
        assert (shown[0], shown[1]) in {(b["owner"], b["seq_id"]) for b in records[step]["batch"]}
    assert any(shown[0] == b_owner for shown in trace["customdata"])  # B's label, as A's page names it
    assert not any(shown[0].endswith("(you)") for shown in trace["customdata"])  # A took no part
    assert any(step > steps_before for step in trace["x"])
    sizes = [p["figs"]["chart-room-size"] for p in pushes if "chart-room-size" in p["figs"]][-1]
    bars = next(t for t in sizes["data"] if t["meta"] == "batch")
    assert bars["x"][-1] == last and bars["y"][-1] == len(records[last]["batch"])
    assert any("html-room-log" in p["html"] for p in pushes)  # the log: B's admission
    times = [p["t"] for p in pushes]
    assert all(b - a >= 0.8 for a, b in zip(times, times[1:])), times  # once a second at most
    assert not room_pushes(quiet)  # a room that has not changed sends nothing


def test_a_push_round_draws_once_per_language_and_skips_busy_tabs(server):
    """The room figures are drawn once per round for every idle tab of a language that took no part in the
    room's steps; a tab that did take part gets its own ("you" marked); a running tab, a tab with the room
    out of view and a tab that never said what it views get nothing. Driven round by round: the server's own
    pusher is stopped for this test."""
    ws_url, app = server
    app.state.pusher.stop()
    pusher = RoomPusher(app.state.pusher.delivery)
    registry = app.state.registry

    async def go():
        keys = ["round-en-1", "round-en-2", "round-en-3", "round-ru", "round-runner", "round-stepped",
                "round-elsewhere", "round-silent"]
        tabs = {k: await open_tab(ws_url, app, k) for k in keys}
        try:
            for k in keys[:-1]:
                if k == "round-elsewhere":
                    await send_view(tabs[k], ["chart-logits"])
                else:
                    await send_view(tabs[k], ROOM[:2], ROOM[2:], lang="ru" if k == "round-ru" else "en")
            for k in ("round-runner", "round-stepped"):
                await tabs[k].send(step_op(ROOM))
                await recv_until(tabs[k], lambda m: is_payload(m) and m["payload"].get("op") == "step")
            runner = registry.sessions["round-runner"]
            run = runner.run_steps()  # a Run in progress: its own frames draw the room
            await asyncio.to_thread(next, run)
            await asyncio.to_thread(runner.room.pause, runner.owner)  # the room stands still; the Run's page draws
            watchers = sorted(k for k, _, _ in pusher.watchers())
            drawn = pusher.drawn
            sent = await asyncio.to_thread(pusher.push_round)
            drawn = pusher.drawn - drawn
            got = {k: [] for k in keys}
            for k in keys:
                try:
                    while True:
                        got[k].append(await recv_json(tabs[k], 1.0))
                except asyncio.TimeoutError:
                    pass
            again = await asyncio.to_thread(pusher.push_round)  # nothing changed since: nobody is sent anything
            await asyncio.to_thread(run.close)
            return watchers, sent, drawn, got, again
        finally:
            for ws in tabs.values():
                await ws.close()

    try:
        watchers, sent, drawn, got, again = asyncio.run(go())
    finally:
        app.state.pusher = RoomPusher(app.state.pusher.delivery)
        app.state.pusher.start()
    assert watchers == ["round-en-1", "round-en-2", "round-en-3", "round-ru", "round-stepped"]
    assert sent == 5 and again == 0
    assert drawn == 3  # English without "you", Russian without "you", and round-stepped's own
    pushes = {k: room_pushes(v) for k, v in got.items()}
    assert not pushes["round-runner"] and not pushes["round-elsewhere"] and not pushes["round-silent"]
    en = [pushes[k][-1]["figs"] for k in ("round-en-1", "round-en-2", "round-en-3")]
    assert en[0] == en[1] == en[2] and set(en[0]) == set(ROOM)
    assert en[0] != pushes["round-ru"][-1]["figs"]
    mine = pushes["round-stepped"][-1]["figs"]["chart-room-batch"]
    me = registry.sessions["round-stepped"].owner
    assert any(c[0] == f"{me} (you)" for t in mine["data"] for c in t.get("customdata") or [])


def test_a_tab_that_took_no_part_draws_like_nobody():
    """What lets a push round share one drawing: the room charts and log differ from the anonymous ones only for
    an owner that owners_shown names."""
    from app import render
    from app.charts.room import owners_shown
    from app.delivery import RoomSnapshot

    def rec(step, batch, admitted=(), finished=()):
        return {"step": step, "t": 100.0 + step, "step_ms": 40.0, "held": 0, "waiting": [],
                "batch": [{"seq_id": s, "owner": o, "phase": "decode", "num_processed": 1, "num_emitted": 1}
                          for o, s in batch],
                "admitted": [{"seq_id": s, "owner": o} for o, s in admitted], "preempted": [],
                "finished": [{"seq_id": s, "owner": o, "reason": "length"} for o, s in finished],
                "pool": {"num_blocks": 8, "used": 3, "cached": 0, "free": 5, "shared": 0, "hit_tokens": 0,
                         "prompt_tokens": 10, "hit_rate": 0.0}}

    records = [rec(0, [("tab 1", 0)], admitted=[("tab 1", 0)]), rec(1, [("tab 1", 0), ("api 1", 1)]),
               rec(2, [("api 1", 1)], finished=[("tab 1", 0)])]
    blocks = ["tab 1", "api 1", "lecture", "", "cached", "", "", ""]
    assert owners_shown(records, blocks) == {"tab 1", "api 1", "lecture", "", "cached"}
    for lang in ("en", "ru"):
        nobody = render.room_payload(RoomSnapshot(records, blocks, ""), lang, set(ROOM))
        assert set(nobody["figs"]) == set(ROOM) and "html-room-log" in nobody["html"]
        assert render.room_payload(RoomSnapshot(records, blocks, "tab 7"), lang, set(ROOM)) == nobody
        mine = render.room_payload(RoomSnapshot(records, blocks, "tab 1"), lang, set(ROOM))
        assert mine["figs"]["chart-room-batch"] != nobody["figs"]["chart-room-batch"]
        assert mine["html"] != nobody["html"]
        lecture = render.room_payload(RoomSnapshot(records, blocks, "lecture"), lang, set(ROOM))
        assert lecture["figs"]["chart-room-pool"] != nobody["figs"]["chart-room-pool"]  # its blocks carry a dot
