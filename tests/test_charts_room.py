"""The room panel (app/charts/room.py): one shared engine, every tab's sequences batched together.

Two sources of records in the documented shape: records written by hand (every field chosen, so each number
a chart draws is known), and records converted from a REAL engine run with two owners whose requests share
a system prompt — each StepEvent becomes a record with `to_record`, the way app/room.py makes them.
"""
from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace

import pytest

from app import render
from app.charts import room
from app.charts.common import axis_title
from app.i18n import t
from engine import SamplingParams

ME = "tab 2"
SYSTEM = ("You are a patient physics teacher. Answer in two short sentences, with one everyday example, "
          "and never use formulas or lists in the answer.")


# ---- records -----------------------------------------------------------------------------------------------

def rec(step, t_, batch=(), admitted=(), preempted=(), finished=(), waiting=(), held=0, pool=None, step_ms=100.0):
    """A record in the documented shape; batch items are (seq_id, owner, phase, processed, emitted)."""
    return {"step": step, "t": t_, "step_ms": step_ms,
            "batch": [{"seq_id": s, "owner": o, "phase": p, "num_processed": n, "num_emitted": e}
                      for s, o, p, n, e in batch],
            "admitted": [{"seq_id": s, "owner": o} for s, o in admitted],
            "preempted": [{"seq_id": s, "owner": o} for s, o in preempted],
            "finished": [{"seq_id": s, "owner": o, "reason": r} for s, o, r in finished],
            "waiting": [{"seq_id": s, "owner": o} for s, o in waiting], "held": held,
            "pool": pool or {"num_blocks": 16, "used": 0, "cached": 0, "free": 16, "shared": 0, "hit_tokens": 0,
                             "prompt_tokens": 0, "hit_rate": None}}


@pytest.fixture(scope="module")
def hand():
    """Ten steps one second apart: tab 1 alone, then tab 2 (this tab) and the lecture join; tab 3 waits,
    is admitted, preempted and readmitted; tab 2 speculates (verify)."""
    recs = [
        rec(0, 100.0, [(1, "tab 1", "prefill", 30, 1)], admitted=[(1, "tab 1")], step_ms=1000.0),
        rec(1, 101.0, [(1, "tab 1", "decode", 1, 1), (2, ME, "prefill", 40, 1)], admitted=[(2, ME)],
            waiting=[(3, "tab 3")]),
        rec(2, 102.0, [(2, ME, "decode", 1, 1), (1, "tab 1", "decode", 1, 1), (4, "lecture", "prefill", 25, 1)],
            admitted=[(4, "lecture")], waiting=[(3, "tab 3")]),
        rec(3, 103.0, [(1, "tab 1", "decode", 1, 1), (2, ME, "verify", 5, 4)], held=1, waiting=[(3, "tab 3")]),
        rec(4, 104.0, [(4, "lecture", "decode", 1, 1), (3, "tab 3", "prefill", 12, 1), (2, ME, "verify", 5, 2)],
            admitted=[(3, "tab 3")], held=1),
        rec(5, 105.0, [(1, "tab 1", "decode", 1, 1), (2, ME, "decode", 1, 1)], preempted=[(3, "tab 3")],
            waiting=[(3, "tab 3")], held=1),
        rec(6, 106.0, [(1, "tab 1", "decode", 1, 0), (4, "lecture", "decode", 1, 1)],
            finished=[(1, "tab 1", "eos")], held=1, waiting=[(3, "tab 3")]),
        rec(7, 107.0, [(3, "tab 3", "prefill", 13, 1), (2, ME, "decode", 1, 1)], admitted=[(3, "tab 3")], held=1),
        rec(8, 108.0, [(3, "tab 3", "decode", 1, 1), (2, ME, "decode", 1, 1), (4, "lecture", "decode", 1, 1)],
            finished=[(2, ME, "length")]),
        rec(9, 109.0, [(3, "tab 3", "decode", 1, 1), (4, "lecture", "decode", 1, 1)],
            finished=[(4, "lecture", "stop"), (3, "tab 3", "abort")],
            pool={"num_blocks": 40, "used": 9, "cached": 6, "free": 25, "shared": 3, "hit_tokens": 900,
                  "prompt_tokens": 1400, "hit_rate": 0.64}),
    ]
    blocks = (["shared"] * 3 + ["tab 1"] * 2 + [ME] * 4 + ["lecture"] + ["tab 3"] * 2 + ["cached"] * 6
              + [""] * 22)
    return recs, blocks


def to_record(ev, t_):
    """A StepEvent (with owners) as one room record: the documented shape, and no token text."""
    who = lambda sid: ev.owners.get(sid, "")  # noqa: E731
    reasons = {s.seq_id: s.finish_reason for s in ev.seqs if s.finished}
    in_step = {b["seq_id"] for b in ev.batch}
    kv = ev.kv
    return {"step": ev.step, "t": t_, "step_ms": ev.timing.step_ms,
            "batch": [{"seq_id": b["seq_id"], "owner": b["owner"],
                       "phase": "verify" if b.get("num_drafted") else b["phase"],
                       "num_processed": b["num_processed"], "num_emitted": b["num_emitted"],
                       "grammar": b["grammar"]} for b in ev.batch],
            "admitted": [{"seq_id": s, "owner": who(s)} for s in ev.admitted],
            "preempted": [{"seq_id": s, "owner": who(s)} for s in ev.preempted],
            "finished": [{"seq_id": s, "owner": who(s), "reason": reasons.get(s) or "abort"} for s in ev.finished],
            "waiting": [{"seq_id": s, "owner": who(s)} for s in ev.waiting],
            "held": len(set(ev.running) - in_step),
            "pool": {"num_blocks": kv.num_blocks, "used": kv.used, "cached": kv.cached, "free": kv.free,
                     "shared": kv.shared, "hit_tokens": kv.prefix_hit_tokens, "prompt_tokens": kv.prefix_query_tokens,
                     "hit_rate": kv.hit_rate if kv.prefix_query_tokens else None}}


def to_blocks(ev):
    """The pool now: "" free, "cached", "shared" (held by sequences of several owners) or the one owner."""
    out = []
    for b in ev.blocks:
        owners = {ev.owners.get(s, "") for s in b["owners"]}
        out.append("" if b["state"] == "free" else "cached" if b["state"] == "cached" else
                   "shared" if len(owners) > 1 else owners.pop())
    return out


@pytest.fixture(scope="module")
def live(base_engine):
    """tab 1 starts alone (tab 2 waits), then both run together, but for one step of tab 2 alone (tab 1 held);
    both requests share SYSTEM."""
    eng = base_engine.session(max_num_batched_tokens=256)
    eng.add_request("What is gravity?", SamplingParams(max_tokens=6, temperature=0.0), system=SYSTEM, owner="tab 1")
    eng.add_request("Why is the sky blue?", SamplingParams(max_tokens=10, temperature=0.0), system=SYSTEM, owner=ME)
    events, records, clock = [], [], 1000.0
    for i in range(14):
        ev = eng.step(owners={"tab 1"} if i < 2 else {ME} if i == 4 else {"tab 1", ME})
        clock += ev.timing.step_ms / 1e3
        events.append(ev)
        records.append(to_record(ev, clock))
        if i == 3:
            mid_blocks = to_blocks(ev)
        if not eng.has_unfinished():
            break
    return events, records, mid_blocks, to_blocks(events[-1])


# ---- helpers over figures ----------------------------------------------------------------------------------

def _title(fig):
    return fig["layout"]["title"]["text"].replace("<br>", " ")  # titles wrap (common.TITLE_CHARS)


def _note(fig):
    return " ".join(a["text"].replace("<br>", " ") for a in fig["layout"].get("annotations") or [])


def _trace(fig, name):
    return next(d for d in fig["data"] if d.get("name") == name or d.get("meta") == name)


def _code_colors(fig):
    scale = fig["data"][0]["colorscale"]
    return {i: scale[2 * i][1] for i in range(len(scale) // 2)}


def _grid_counts(fig):
    """Cells per colour of the pool grid."""
    colours = _code_colors(fig)
    return Counter(colours[z] for row in fig["data"][0]["z"] for z in row if z is not None)


# ---- 1 · batch strip -----------------------------------------------------------------------------------------

def test_batch_strip_segments_equal_each_steps_batch(hand):
    recs, _ = hand
    fig = room.batch_strip_chart(recs, ME, "en")
    bar = _trace(fig, "batch")
    per_step = Counter(bar["x"])
    assert per_step == Counter({r["step"]: len(r["batch"]) for r in recs if r["batch"]})
    assert bar["y"] == [1] * len(bar["x"])
    segs = list(zip(bar["x"], bar["base"], bar["customdata"], bar["marker"]["color"], bar["marker"]["opacity"],
                    bar["marker"]["pattern"]["shape"], bar["marker"]["line"]["width"]))
    for r in recs:
        mine = [s for s in segs if s[0] == r["step"]]
        assert sorted(s[1] for s in mine) == list(range(len(r["batch"])))  # stacked 0..n-1, no overlap
        got = {(c[1], c[2], c[3], c[4]) for _, _, c, *_ in mine}
        assert got == {(b["seq_id"], t(f"room_phase_{b['phase']}", "en"), b["num_processed"], b["num_emitted"])
                       for b in r["batch"]}
        if any(b["owner"] == ME for b in r["batch"]):  # this tab sits at the bottom of its steps
            assert next(c for _, base, c, *_ in mine if base == 0)[0] == "tab 2 (you)"
    # one colour per owner, the same in every step, different owners different colours
    by_owner: dict[str, set] = {}
    for _, _, c, colour, *_ in segs:
        by_owner.setdefault(c[0].replace(" (you)", ""), set()).add(colour)
    assert all(len(v) == 1 for v in by_owner.values())
    assert len({next(iter(v)) for v in by_owner.values()}) == len(by_owner) == 4
    assert all(next(iter(v)) == room.owner_color(o) for o, v in by_owner.items())
    # phases: prefill solid, decode faded, verify hatched; this tab's segments outlined
    for _, _, c, _, opacity, shape, width in segs:
        phase = {t(f"room_phase_{p}", "en"): p for p in room.PHASES}[c[2]]
        assert opacity == room.PHASE_OPACITY[phase] and shape == ("/" if phase == "verify" else "")
        assert width == (2 if c[0] == "tab 2 (you)" else 0.5)
    key = _note(fig)
    assert all(w in key for w in ("tab 1", "tab 2 (you)", "tab 3", "lecture", "prefill", "decode",
                                  "speculative verify"))
    assert "tok" in bar["hovertemplate"] or "tokens processed" in bar["hovertemplate"]


def test_batch_strip_shows_the_last_steps_only(hand):
    recs, _ = hand
    many = [dict(r, step=100 + i, t=200.0 + i) for i, r in enumerate(recs * 8)]  # 80 steps
    fig = room.batch_strip_chart(many, ME, "en")
    shown = set(_trace(fig, "batch")["x"])
    assert min(shown) == 100 + 80 - room.WINDOW_STEPS and max(shown) == 179
    assert fig["layout"]["xaxis"]["range"] == [100 + 80 - room.WINDOW_STEPS - 0.5, 179.5]


def test_owner_colours_are_a_function_of_the_label():
    assert room.owner_color("tab 1") != room.owner_color("tab 2") != room.owner_color("tab 3")
    assert [room.owner_color(f"tab {i}") for i in range(1, 10)] == room.OWNER_COLORS  # tabs take the palette in order
    assert room.owner_color("lecture") == room.LECTURE_COLOR not in room.OWNER_COLORS
    assert len({room.owner_color(o) for o in ("tab 1", "tab 2", "tab 3", "api 1", "api 2", "lecture")}) == 6
    assert room.owner_color("guest") == room.owner_color("guest") in room.OWNER_COLORS  # any label: a stable colour
    assert "#BAB0AC" not in room.OWNER_COLORS and room.SHARED_COLOR not in room.OWNER_COLORS
    assert sorted(["tab 10", "lecture", "tab 2", "api 1"], key=room.owner_order) == ["tab 2", "tab 10", "api 1",
                                                                                      "lecture"]


# ---- 2 · the shared pool -------------------------------------------------------------------------------------

def test_pool_grid_counts_equal_room_blocks(hand):
    recs, blocks = hand
    fig = room.pool_chart(blocks, recs, ME, "en")
    want = Counter(blocks)
    got = _grid_counts(fig)
    for owner in ("tab 1", ME, "lecture", "tab 3"):
        assert got[room.owner_color(owner)] == want[owner]
    assert got[room.SHARED_COLOR] == want["shared"] == 3
    assert got[room.GREY] == want["cached"] and got[room.FREE_COLOR] == want[""]
    # every block is one cell, in order; the hover says what holds it
    heat = fig["data"][0]
    cells = [cd for row in heat["customdata"] for cd in row if cd is not None]
    assert [c[0] for c in cells] == list(range(len(blocks)))
    words = {"": "free", "cached": "cached (free, prefix kept)", "shared": "shared by several tabs", ME: "tab 2 (you)"}
    assert [c[1] for c in cells] == [words.get(b, b) for b in blocks]
    assert sum(x == "•" for row in heat["text"] for x in row) == want[ME]  # this tab's blocks are dotted
    title = _title(fig)
    assert "12 of 40 blocks in use · 6 cached" in title
    assert "hit rate 64 %: 900 of 1400 prompt tokens served from cache" in title
    key = _note(fig)
    assert "tab 2 (you): 4" in key and "shared by several tabs: 3" in key and "free: 22" in key


def test_pool_without_lookups_and_without_blocks(hand):
    recs, blocks = hand
    assert "no prompt looked up yet" in _title(room.pool_chart(blocks, recs[:1], ME, "en"))
    assert "no prompt looked up yet" in _title(room.pool_chart(blocks, [], ME, "en"))
    assert t("room_no_pool", "en") in _note(room.pool_chart([], recs, ME, "en"))
    big = room.pool_chart(["tab 1"] * 700 + [""] * 28, recs, ME, "en")  # a big pool: wider rows
    assert len(big["data"][0]["z"][0]) == 2 * room.COLS and len(big["data"][0]["z"]) == 12


# ---- 3 · throughput ------------------------------------------------------------------------------------------

def test_throughput_is_emitted_tokens_over_a_rolling_window(hand):
    recs, _ = hand
    s = room.throughput_series(recs)
    assert s["t"] == [r["t"] for r in recs]
    start = recs[0]["t"] - recs[0]["step_ms"] / 1e3  # the first step began at 99.0
    for i, r in enumerate(recs):
        inside = [x for x in recs[: i + 1] if x["t"] > r["t"] - room.ROLL_S]
        span = min(room.ROLL_S, r["t"] - start)
        for owner, ys in s["owners"].items():
            want = sum(b["num_emitted"] for x in inside for b in x["batch"] if b["owner"] == owner) / span
            assert ys[i] == pytest.approx(want)
        assert s["all"][i] == pytest.approx(sum(b["num_emitted"] for x in inside for b in x["batch"]) / span)
    # by hand: the last step's window holds steps 5..9, five seconds
    assert s["all"][-1] == pytest.approx((2 + 1 + 2 + 3 + 2) / 5)
    assert s["owners"][ME][-1] == pytest.approx((1 + 0 + 1 + 1 + 0) / 5)
    fig = room.throughput_chart(recs, ME, "en")
    agg = _trace(fig, "room")
    assert agg["y"] == pytest.approx(s["all"]) and agg["x"][-1] == 0 and agg["x"][0] == pytest.approx(-9.0)
    mine = _trace(fig, ME)
    assert mine["name"] == "tab 2 (you)" and mine["line"]["width"] > _trace(fig, "tab 1")["line"]["width"]
    assert {d["meta"] for d in fig["data"]} == {"room", "tab 1", ME, "lecture", "tab 3"}
    assert all(d["line"]["color"] == room.owner_color(d["meta"]) for d in fig["data"][1:])


def test_throughput_aggregate_rises_while_each_owner_stays():
    """Tabs join one by one, each emitting one token per 0.125 s step: the room's rate grows with the number
    of tabs, every tab's own stays at 8 tok/s."""
    recs = []
    for i in range(150):
        tabs = [f"tab {k}" for k in range(1, 2 + i // 50)]
        recs.append(rec(i, (i + 1) * 0.125, [(k, o, "decode", 1, 1) for k, o in enumerate(tabs)], step_ms=125.0))
    s = room.throughput_series(recs)
    assert [s["all"][i] for i in (49, 99, 149)] == pytest.approx([8, 16, 24])
    assert [s["owners"]["tab 1"][i] for i in (49, 99, 149)] == pytest.approx([8, 8, 8])
    assert s["owners"]["tab 3"][149] == pytest.approx(8) and s["owners"]["tab 3"][99] == 0


def test_throughput_falls_to_zero_across_an_idle_room():
    """Two runs 20 s apart: after the first, the rate is 0 from the window's end until the next step, rather
    than a straight line drawn across the idle time."""
    recs = [rec(i, 100 + (i + 1) * 0.5, [(0, "tab 1", "decode", 1, 1)], step_ms=500.0) for i in range(6)]
    recs += [rec(6 + i, 123 + (i + 1) * 0.5, [(1, "tab 2", "decode", 1, 1)], step_ms=500.0) for i in range(4)]
    s = room.throughput_series(recs)
    gap_end = recs[5]["t"] + room.ROLL_S
    k = s["t"].index(gap_end)
    assert s["t"][k + 1] == recs[6]["t"] and s["t"][k + 2] == recs[6]["t"]  # 0 until the next step, then its rate
    assert s["all"][k] == s["all"][k + 1] == 0 and s["owners"]["tab 1"][k] == 0
    assert s["all"][k + 2] > 0 and s["owners"]["tab 2"][k + 2] > 0
    assert len(s["t"]) == len(recs) + 2  # every step's own point is still there, plus the two zeros


def test_throughput_axis_is_the_window_its_title_names():
    """A room that ran for 2,000 s: the chart spans the last SHOWN_S seconds its title names (issue 37: titled
    "last 5 s", it was drawn over -2000...0 s), and its lines enter at the window's left edge."""
    recs = [rec(i, 100 + (i + 1) * 0.5, [(0, "tab 1", "decode", 1, 1)], step_ms=500.0) for i in range(4000)]
    for lang, said in (("en", r"over the last (\d+) s"), ("ru", r"за последние (\d+) с")):
        fig = room.throughput_chart(recs, ME, lang)
        window = float(re.search(said, _title(fig).replace("<br>", " ")).group(1))
        assert window == room.SHOWN_S
        assert fig["layout"]["xaxis"]["range"] == [-window, 0] and fig["layout"]["xaxis"]["autorange"] is False
        xs = _trace(fig, "room")["x"]
        assert xs[-1] == 0 and xs[0] < -window <= xs[1]  # one point before the window, none further back
        assert _trace(fig, "room")["y"][-1] == pytest.approx(2.0)  # one token per 0.5 s step


# ---- 4 · batch size ------------------------------------------------------------------------------------------

def test_batch_size_held_and_waiting(hand):
    recs, _ = hand
    fig = room.batch_size_chart(recs, "en")
    assert _trace(fig, "batch")["y"] == [len(r["batch"]) for r in recs]
    assert _trace(fig, "held")["y"] == [r["held"] for r in recs]
    assert _trace(fig, "waiting")["y"] == [len(r["waiting"]) for r in recs]
    assert _trace(fig, "batch")["x"] == [r["step"] for r in recs]
    line = fig["layout"]["shapes"][0]
    assert line["y0"] == line["y1"] == 1 and "1 = no batching" in _note(fig)
    assert axis_title(fig, "yaxis") == "sequences"


# ---- 5 · event log -------------------------------------------------------------------------------------------

def test_event_log_lists_the_latest_events_newest_first(hand):
    recs, _ = hand
    events = room.room_events(recs)
    assert len(events) == 10 == sum(len(r[k]) for r in recs for k in ("admitted", "preempted", "finished"))
    twice = [dict(r, step=r["step"] + 10 * k) for k in range(2) for r in recs]
    assert [e["step"] for e in room.room_events(twice)] == [19, 19, 18, 17, 16, 15, 14, 12, 11, 10, 9, 9]
    assert [(e["step"], e["kind"], e["owner"]) for e in events[:4]] == [
        (9, "finished", "tab 3"), (9, "finished", "lecture"), (8, "finished", ME), (7, "admitted", "tab 3")]
    page = room.event_log_html(twice, ME, "en")
    items = re.findall(r"<li class=\"([^\"]+)\">(.*?)</li>", page)
    assert len(items) == room.LOG_EVENTS
    text = [re.sub(r"<[^>]+>", "", x) for _, x in items]
    assert text[0] == "step 19 tab 3 seq 3 · finished (cancelled)"
    assert text[2] == "step 18 tab 2 (you) seq 2 · finished (max tokens reached)"
    assert "step 15 tab 3 seq 3 · preempted: KV pool full, will recompute" in text
    assert "il-room-me" in items[2][0] and "il-room-me" not in items[0][0]
    assert room.owner_color("tab 3") in items[0][1]


def test_event_log_escapes_and_notes():
    odd = [rec(0, 1.0, [(1, "<b>x</b>", "prefill", 3, 1)], admitted=[(1, "<b>x</b>")])]
    page = room.event_log_html(odd, "", "en")
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    quiet = [rec(0, 1.0, [(1, "tab 1", "decode", 1, 1)])]
    assert t("room_no_events", "en") in room.event_log_html(quiet, "", "en")
    assert t("room_no_steps", "ru") in room.event_log_html([], "tab 1", "ru")
    assert t("room_replay", "en") in room.event_log_html([], "", "en", replay=True)


# ---- language and empty inputs -------------------------------------------------------------------------------

def _all(recs, blocks, lang, replay=False):
    return [room.batch_strip_chart(recs, ME, lang, replay), room.pool_chart(blocks, recs, ME, lang, replay),
            room.throughput_chart(recs, ME, lang, replay), room.batch_size_chart(recs, lang, replay)]


def test_russian_titles_and_words(hand):
    recs, blocks = hand
    batch, pool, tps, size = _all(recs, blocks, "ru")
    assert _title(batch) == t("room_batch_title", "ru").format(n=room.WINDOW_STEPS)
    assert _title(pool).startswith("Общий пул KV: занято 12 из 40 блоков") and "попадания 64 %" in _title(pool)
    assert _title(tps) == t("room_tps_title", "ru").format(w="5", span="60")
    assert _title(size) == t("room_size_title", "ru")
    assert "вкладка 2 (вы)" in _note(batch) and "префилл" in _note(batch) and "проверка черновика" in _note(batch)
    assert axis_title(batch, "xaxis") == "шаг" and axis_title(tps, "yaxis") == "ток/с"
    assert "1 — без батчинга" in _note(size)
    assert "вытеснена: пул KV заполнен" in room.event_log_html(recs, ME, "ru")
    for fig in (batch, pool, tps, size):
        assert not re.search(r"\b(step|blocks|sequences|seconds)\b", _title(fig) + _note(fig))


def test_empty_inputs_give_the_note():
    for lang in ("en", "ru"):
        for fig in _all([], [], lang):
            assert fig["data"] == [] and t("room_no_steps", lang)[:30] in _note(fig)
        for fig in _all([], [], lang, replay=True):
            assert fig["data"] == [] and t("room_replay", lang)[:30] in _note(fig)


# ---- the page: render.py ----------------------------------------------------------------------------------------

def _idle_view(**room_attrs):
    return SimpleNamespace(num_layers=2, num_heads=2, events=[], what_if=None, focus=None, requests={},
                           has_seq=lambda sid: False, **room_attrs)


def test_render_draws_the_room_panel(hand):
    recs, blocks = hand
    assert render.PANEL_CHARTS["room"] == ["chart-room-batch", "chart-room-pool", "chart-room-throughput",
                                           "chart-room-size"]
    assert set(render.PANEL_CHARTS["room"]) <= set(render.CHART_IDS) and render.PANEL_HTML["room"] == ["html-room-log"]
    p = render.build_payload(_idle_view(room_records=recs, room_blocks=blocks, room_me=ME), "ru")
    assert p["figs"]["chart-room-batch"] == room.batch_strip_chart(recs, ME, "ru")
    assert p["figs"]["chart-room-pool"] == room.pool_chart(blocks, recs, ME, "ru")
    assert p["html"]["html-room-log"] == room.event_log_html(recs, ME, "ru")
    assert p["html"]["html-title-room"].startswith("10 · Комната")
    only = render.build_payload(_idle_view(room_records=recs, room_blocks=blocks, room_me=ME), "en",
                                only={"chart-room-size"})
    assert set(only["figs"]) == {"chart-room-size"} and "chart-room-batch" in only["stale"]
    # a session without the room's attributes (before the shared engine) and a replay: the notes
    bare = render.build_payload(_idle_view(), "en")
    assert t("room_no_steps", "en") in bare["html"]["html-room-log"]
    assert t("room_no_steps", "en")[:30] in _note(bare["figs"]["chart-room-throughput"])
    replay = render.build_payload(_idle_view(untrusted=True, room_records=[], room_blocks=[], room_me=""), "en")
    assert t("room_replay", "en") in replay["html"]["html-room-log"]


# ---- a real engine run with two owners ----------------------------------------------------------------------

def test_live_run_batches_two_owners(live):
    events, records, mid_blocks, _ = live
    # tab 2 waited two steps, then both owners shared steps, but step 4 (tab 1 held, keeping its KV)
    assert all({b["owner"] for b in r["batch"]} == {"tab 1"} and [w["owner"] for w in r["waiting"]] == [ME]
               for r in records[:2])
    assert {b["owner"] for b in records[4]["batch"]} == {ME} and records[4]["held"] == 1
    assert any({b["owner"] for b in r["batch"]} == {"tab 1", ME} for r in records[2:])
    fig = room.batch_strip_chart(records, ME, "en")
    bar = _trace(fig, "batch")
    assert Counter(bar["x"]) == Counter({ev.step: len(ev.batch) for ev in events if ev.batch})
    colours = {(c[0], col) for c, col in zip(bar["customdata"], bar["marker"]["color"])}
    assert colours == {("tab 1", room.owner_color("tab 1")), ("tab 2 (you)", room.owner_color(ME))}
    size = room.batch_size_chart(records, "en")
    assert _trace(size, "batch")["y"] == [len(ev.batch) for ev in events] and max(_trace(size, "batch")["y"]) == 2
    # the shared system prompt: tab 2's prefill found tab 1's blocks, and both hold them
    assert records[-1]["pool"]["hit_tokens"] > 0
    assert Counter(mid_blocks)["shared"] >= 1
    pool = room.pool_chart(mid_blocks, records[:4], ME, "en")
    got, want = _grid_counts(pool), Counter(mid_blocks)
    assert got[room.SHARED_COLOR] == want["shared"] and got[room.owner_color(ME)] == want[ME]
    assert got[room.owner_color("tab 1")] == want["tab 1"]
    assert sum(got.values()) == len(mid_blocks) == events[3].kv.num_blocks
    assert "hit rate" in _title(pool)
    # throughput from the records' emitted tokens: every token the engine emitted is counted once
    s = room.throughput_series(records)
    emitted = {o: sum(b["num_emitted"] for r in records for b in r["batch"] if b["owner"] == o) for o in ("tab 1", ME)}
    produced = {o: sum(1 for ev in events for sv in ev.seqs if ev.owners[sv.seq_id] == o and sv.new_token is not None)
                for o in ("tab 1", ME)}
    assert emitted == produced and s["t"] == [r["t"] for r in records]
    log = room.room_events(records, limit=100)
    assert {(e["kind"], e["owner"]) for e in log} >= {("admitted", "tab 1"), ("admitted", ME), ("finished", "tab 1")}
    assert all(e["reason"] in ("length", "eos", "stop") for e in log if e["kind"] == "finished")


def test_a_live_tab_draws_its_room_and_its_replay_says_it_cannot(base_engine):
    """A LabSession in a room of its own: the room panel comes from the session's room attributes; the same
    session exported and replayed has none (a recording holds one tab's view only) and says so."""
    from app.session import LabSession
    from app.trace import export_trace, load_trace, trace_bytes

    lab = LabSession.create(base_engine, kv_memory=8 * 1024 * 1024)
    lab.add_request("What is gravity?", SamplingParams(max_tokens=3, temperature=0.0), True, None)
    for _ in range(3):
        lab.step()
    me = getattr(lab, "room_me", "")
    live_page = render.build_payload(lab, "en", only=set(render.PANEL_CHARTS["room"]))
    if me:  # the session joined a room (app/room.py): its steps are the room's records
        records = lab.room_records
        assert len(records) == 3 and Counter(_trace(live_page["figs"]["chart-room-batch"], "batch")["x"]) == \
            Counter({r["step"]: len(r["batch"]) for r in records if r["batch"]})
        assert f"{me} (you)" in live_page["html"]["html-room-log"]  # its admission, marked as this tab's
    replay = load_trace(trace_bytes(export_trace(lab)))
    replay.seek(replay.num_frames)
    assert (replay.room_records, replay.room_blocks, replay.room_me) == ([], [], "")
    page = render.build_payload(replay, "ru")
    assert t("room_replay", "ru") in page["html"]["html-room-log"]
    for cid in render.PANEL_CHARTS["room"]:
        assert page["figs"][cid]["data"] == [] and t("room_replay", "ru")[:30] in _note(page["figs"][cid])


def test_the_batch_strip_says_which_sequences_are_held_to_a_grammar(base_engine):
    from engine import Grammar

    eng = base_engine.session()
    eng.add_request("Is water wet?", SamplingParams(max_tokens=4, temperature=0.0,
                                                    grammar=Grammar.choice(["yes", "no"])), owner="api 1")
    eng.add_request("What is gravity?", SamplingParams(max_tokens=2, temperature=0.0), owner=ME)
    ev = eng.step()
    assert {b["owner"]: b["grammar"] for b in ev.batch} == {"api 1": "choice", ME: ""}
    fig = room.batch_strip_chart([to_record(ev, 1.0)], me=ME)
    lines = {cd[0]: cd[5] for cd in fig["data"][0]["customdata"]}
    assert lines["api 1"] == " · constrained: choice" and lines[room.owner_name(ME, ME, "en")] == ""
    ru = room.batch_strip_chart([to_record(ev, 1.0)], me=ME, lang="ru")
    assert " · с ограничением: choice" in [cd[5] for cd in ru["data"][0]["customdata"]]
