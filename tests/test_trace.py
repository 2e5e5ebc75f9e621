"""Trace export and offline replay: a replayed trace draws the same page as the live session it came from."""
import gzip
import json
import math

import pytest
import torch

from app import render
from app.session import LabSession
from app.trace import (ATTENTION_TOLERANCE, FORMAT, VERSION, ReplaySession, TraceError, export_trace, load_trace,
                       save_trace, trace_bytes)
from engine import SamplingParams
from engine.events import StepEvent, event_from_dict
from engine.records import dumps

MACHINE = {"bandwidth": 20e9, "peak_flops": 100e9}
# the charts built from attention probabilities; a compact trace stores those in 16 bits (app/trace.py)
ATTENTION_CHARTS = {"chart-attention", "chart-heads", "chart-entropy"}
RU = "Что такое гравитация?"
EN = "What is gravity?"


def payload(s, lang="ru", layer=3, head=2, word="", npos=None, only=None):
    """The page's payload without the room panel: a trace records one tab's view, not the room's (the replay
    says so there; tests/test_charts_room.py checks that note)."""
    p = render.build_payload(s, lang, layer, head, word, npos, MACHINE, only=only)
    room = set(render.PANEL_CHARTS["room"]) | set(render.PANEL_HTML["room"])
    for part in ("figs", "html"):
        p[part] = {k: v for k, v in p[part].items() if k not in room}
    return p


@pytest.fixture(scope="module")
def live(base_engine):
    """A real lab session: a Russian chat prompt, a second request joining at step 4, 8 steps in all.

    The live payloads are taken as the session goes (a live session cannot go back to step 4)."""
    lab = LabSession.create(base_engine, kv_memory=32 * 1024 * 1024)
    lab.add_request(RU, SamplingParams(max_tokens=24, temperature=0.7, seed=1), True, None)
    for _ in range(3):
        lab.step()
    second = lab.add_request(EN, SamplingParams(max_tokens=24, temperature=0.9, top_k=40, seed=2), True,
                             "Answer in one sentence.")
    lab.step()
    at4 = payload(lab, "en", layer=0, head=0)
    for _ in range(4):
        lab.step()
    at8 = payload(lab)
    lab.focus = second  # the page's focus dropdown after the last step
    at8_second = payload(lab, "en", layer=29, head=8, word="gravity", npos=5)
    return dict(lab=lab, second=second, at4=at4, at8=at8, at8_second=at8_second)


def _same_shown_number(a, b) -> bool:
    """Two table cells showing one number to its last printed digit: to_dict's rounding of a timing (6 digits)
    can move a value that sits on a .x5 boundary by one unit of the displayed last digit ('361.5' vs '361.4')."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    digits = len(a.partition(".")[2])
    return len(b.partition(".")[2]) == digits and abs(x - y) <= 1.01 * 10 ** -digits


def compare(a, b, path="", tol=0.0, loose=(), where=None):
    """Differences between two payload parts: numbers beyond `tol` (beyond ATTENTION_TOLERANCE inside the
    attention charts), anything else unequal. `loose`: chart ids whose strings may differ."""
    where = where or path
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [(path, "keys", sorted(set(a) ^ set(b)))]
        for k in a:
            sub = f"{path}/{k}"
            out += compare(a[k], b[k], sub, tol, loose, k if path == "/figs" else where)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(path, "length", (len(a), len(b)))]
        for i, (x, y) in enumerate(zip(a, b)):
            out += compare(x, y, f"{path}[{i}]", tol, loose, where)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        limit = max(tol, ATTENTION_TOLERANCE if where in ATTENTION_CHARTS else 0.0)
        if not math.isclose(a, b, rel_tol=tol, abs_tol=limit):
            out.append((path, a, b))
    elif a != b and not (isinstance(a, str) and where in loose) and not _same_shown_number(a, b):
        out.append((path, str(a)[:80], str(b)[:80]))
    return out


def past(p: dict) -> dict:
    """A payload without the timeline's queue line: it says where the tab's sequences stand *now* (a live
    session's present), which a replay does not have."""
    return {**p, "html": {k: v for k, v in p["html"].items() if k != "html-queue"}}


def test_replay_reproduces_the_live_session(live):
    lab = live["lab"]
    doc = export_trace(lab)
    replay = load_trace(trace_bytes(doc))  # through the file form: JSON, gzip, load
    assert replay.num_frames == len(lab.events) == 8
    replay.seek(8)
    assert replay.focus == live["second"]  # the last frame records the focus as it was at export
    # every chart and HTML piece of the page; only the attention charts may differ, by ATTENTION_TOLERANCE
    rep = payload(replay, "en", layer=29, head=8, word="gravity", npos=5)
    assert set(rep["figs"]) == set(render.CHART_IDS) - set(render.PANEL_CHARTS["room"])
    assert compare(past(live["at8_second"]), past(rep)) == []
    # the Russian request, focused by hand as on the page
    replay.focus = 0
    assert compare(past(live["at8"]), past(payload(replay))) == []
    assert "гравитация" in replay.requests[0].prompt and "html-bpe" in payload(replay)["html"]
    # an earlier frame: the second request had just joined, the first was focused
    replay.reset()
    replay.seek(4)
    assert replay.focus == 0 and sorted(replay.requests) == [0, live["second"]]
    assert compare(past(live["at4"]), past(payload(replay, "en", layer=0, head=0))) == []
    # attention="f32" stores attention exactly: then every chart is exactly equal
    exact = load_trace(dumps(export_trace(lab, attention="f32")))
    exact.seek(8)
    exact.focus = 0
    at8 = payload(exact)
    assert [d for d in compare(past(live["at8"]), past(at8)) if d[0].split("/")[2] in ATTENTION_CHARTS] == []
    assert json.dumps(past(live["at8"])) == json.dumps(past(at8))
    # the compact trace's attention charts do differ a little (else the tolerance would be untested)
    replay.focus = 0  # chosen by hand at frame 4 ...
    replay.seek(8)
    assert replay.focus == 0  # ... it sticks while its sequence exists (frame 8 recorded the other one)
    compact = payload(replay)
    assert compact["figs"]["chart-entropy"] != live["at8"]["figs"]["chart-entropy"]
    diffs = compare(live["at8"]["figs"]["chart-entropy"], compact["figs"]["chart-entropy"], tol=0)
    assert all(abs(a - b) <= ATTENTION_TOLERANCE for _, a, b in diffs)


def test_trace_document(live, tmp_path):
    lab = live["lab"]
    doc = export_trace(lab, words=("притяжение",))
    text = dumps(doc)
    # strict JSON: no NaN/Infinity anywhere, readable UTF-8
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert RU in text
    assert doc["format"] == FORMAT and doc["version"] == VERSION
    assert doc["model"]["id"] == lab.engine.model_id and doc["model"]["spec"]["num_layers"] == 30
    reqs = {r["seq_id"]: r for r in doc["requests"]}
    assert reqs[0]["prompt"] == RU and reqs[0]["chat"] and reqs[0]["token_ids"] == lab.requests[0].token_ids
    assert reqs[live["second"]]["system"] == "Answer in one sentence."
    assert reqs[live["second"]]["params"]["top_k"] == 40 and reqs[0]["params"]["seed"] == 1
    assert [f["event"]["step"] for f in doc["frames"]] == [e.step for e in lab.events]
    ids = set(lab.seq_token_ids(0)) | set(lab.seq_token_ids(live["second"]))
    assert {str(i) for i in ids} <= set(doc["vocab"]) and set(doc["vocab"]) == set(doc["neighbours"])
    assert doc["neighbours"][str(lab.seq_token_ids(0)[-1])][0][2] <= 1.0
    assert {"гравитация", "gravity", "притяжение"} <= set(doc["bpe"])
    # the compact encoding is what keeps a trace small (every layer and head of attention is in it)
    assert len(text) < 0.7 * len(dumps(export_trace(lab, attention="f32")))
    path = save_trace(doc, tmp_path)
    assert path.name.endswith(".json.gz") and load_trace(path).num_frames == len(lab.events)
    assert export_trace(load_trace(path)) == json.loads(text)  # a replay downloads the trace it came from
    plain = save_trace(doc, tmp_path / "plain", compress=False)
    assert load_trace(plain.read_text(encoding="utf-8")).num_frames == len(lab.events)


def test_replay_cursor_is_read_only_and_model_free(live):
    lab = live["lab"]
    replay = load_trace(dumps(export_trace(lab)))
    assert "engine" not in vars(replay)  # nothing to run: no engine, tokenizer or weights
    replay.reset()
    assert replay.events == [] and replay.focus is None and replay.position == 0
    idle = payload(replay)
    assert set(idle["figs"]) == set(render.CHART_IDS) - set(render.PANEL_CHARTS["room"])
    assert idle["html"]["html-tokens"] == ""
    steps = []
    while (ev := replay.step()) is not None:
        steps.append(ev.step)
        p = payload(replay, only={"chart-attention", "chart-timeline"})
        assert set(p["figs"]) == {"chart-attention", "chart-timeline"}
        assert set(p["stale"]) == set(render.CHART_IDS) - set(p["figs"])
    assert steps == [e.step for e in lab.events] and replay.at_end and not replay.has_unfinished()
    replay.seek(-5)
    assert replay.position == 0
    replay.seek(10**6)
    assert replay.position == replay.num_frames
    with pytest.raises(ValueError, match="whole number"):
        replay.seek("3")
    with pytest.raises(ValueError, match="does not exist"):
        replay.focus = 99
    for action in (lambda: replay.engine, lambda: replay.add_request("hi", None, True, None),
                   lambda: replay.compute_what_if(), lambda: replay.force_token(0, 1), lambda: replay.rewind(0, 1)):
        with pytest.raises(ValueError, match="replayed trace"):
            action()
    # a word the trace did not record is a message in the BPE panel (in the page's language), not an error
    bpe = payload(replay, word="Zebra")["html"]["html-bpe"]
    assert "il-msg-warn" in bpe and "не сохранено" in bpe
    # a neighbour position picks from the recorded lists, like the live page
    nb = payload(replay, npos=3)["figs"]["chart-neighbours"]["data"][0]
    picked = replay.seq_token_ids(replay.focus)[3]
    assert len(nb["x"]) == 10 and nb["customdata"] == [r[0] for r in replay.nearest(picked)]


def test_events_round_trip_through_to_dict(live):
    lab = live["lab"]
    events = lab.events
    dicts = [e.to_dict() for e in events]  # to_dict() is the slow part (python-level rounding): once
    for ev, d in zip(events, dicts):
        back = StepEvent.from_dict(json.loads(json.dumps(d)))
        assert back.to_dict() == d  # nothing lost or added beyond to_dict's own rounding
        assert event_from_dict(d).step == ev.step
        assert all(isinstance(k, int) for k in back.block_tables)
        cap = back.seqs[0].capture
        assert all(isinstance(k, int) for k in cap.attention) and cap.attention[0].dtype == torch.float32
        assert cap.lens_ids.dtype == torch.int64
    # charts drawn from to_dict() events match within its rounding (6 digits; captures 5 digits, which moves
    # an attention entropy by up to ~3e-3 bits and the lens hovers' 3-digit text)
    try:
        lab.events = [StepEvent.from_dict(d) for d in dicts]
        lab.focus = 0
        again = payload(lab)
    finally:
        lab.events = events
    assert compare(live["at8"], again, tol=5e-3, loose={"chart-lens"}) == []
    # a newer event or a broken one is a clear error
    with pytest.raises(ValueError, match="newer"):
        StepEvent.from_dict({**dicts[0], "version": 99})
    with pytest.raises(ValueError, match="missing seq_id"):
        StepEvent.from_dict({**dicts[0], "seqs": [{"phase": "decode"}]})
    # a field this engine does not know (a newer engine's) is ignored
    assert StepEvent.from_dict({**dicts[0], "future_field": 1}).step == events[0].step


def test_bad_traces_are_one_line_errors(live):
    good = export_trace(live["lab"])
    frame = json.loads(json.dumps(good["frames"][0]))
    frame["event"]["seqs"][0]["capture"]["attention"]["0"]["data"] = "!!"
    cases = {
        "not JSON": b"<html>nope</html>",
        "format": json.dumps({"format": "something-else", "version": 1}),
        "no \"format\"": json.dumps([1, 2, 3]),
        "newer than this InferLab": json.dumps({**good, "version": VERSION + 1}),
        "missing 'frames'": json.dumps({k: v for k, v in good.items() if k != "frames"}),
        "frame 0": json.dumps({**good, "frames": [frame]}),
        "frame 1": json.dumps({**good, "frames": [good["frames"][0], {"view": {}}]}),
        "gzip": gzip.compress(b'{"format": "inferlab-trace"}')[:20],
        "neither JSON text nor gzip": b"\xff\xfe\x00\x01",
        "model record": json.dumps({**good, "model": {"id": "x"}}),
    }
    for expected, data in cases.items():
        with pytest.raises(TraceError) as info:
            load_trace(data)
        msg = str(info.value)
        assert expected in msg and "\n" not in msg and "Traceback" not in msg, msg
        assert isinstance(info.value, ValueError)
    with pytest.raises(TraceError, match="version must be"):
        ReplaySession({**good, "version": "1"})


def test_reset_after_a_replay_returns_to_a_live_session(live, base_engine):
    """Reset on a tab showing a loaded trace read the live session's `speculative` setting off the ReplaySession
    ("AttributeError: 'ReplaySession' object has no attribute 'speculative'"). It gives the tab a fresh live
    session, as Reset does after a live one, through the same command the Reset button runs."""
    from app import commands as cmd
    from app.session import SessionRegistry

    registry = SessionRegistry(base_engine, kv_memory=8 * 1024 * 1024)
    key = "tab-with-a-trace"
    registry.get(key)
    replay = load_trace(dumps(export_trace(live["lab"])))
    replay.seek(replay.num_frames)
    registry.put(key, replay)
    out = cmd.apply(registry.peek(key), cmd.Reset(), cmd.Context(registry=registry, key=key))
    fresh = out.session
    assert isinstance(fresh, LabSession) and registry.peek(key) is fresh and fresh.events == []
    assert fresh.speculative is None and fresh.tab_key == key
    rid = fresh.add_request(EN, SamplingParams(max_tokens=2, temperature=0.0), True, None)
    assert fresh.step() is not None and rid in fresh.requests  # the tab runs again
    # a replay that is no tab's (the presenter's script) resets in place, back to before its first frame
    assert cmd.apply(replay, cmd.Reset()).session is replay and replay.position == 0
    registry.drop(key)
