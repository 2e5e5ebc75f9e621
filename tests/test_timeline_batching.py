"""The timeline shows batching (issue 13, item 7): who was in each step, prefill chunk or decode, the tokens each
processed, the waiting queue and preemptions, checked against the engine's own StepEvents. The events come from
the one-click preemption demo (app/session.py start_preemption_demo) run on the real model: a short and a long
request in a KV pool that holds just their prompts, so the long one is preempted and later recomputed."""
from __future__ import annotations

import re

import pytest

from app import render
from app.charts import timeline
from app.charts.common import seq_color
from app.i18n import t
from app.panels.queue import queue_html
from app.session import DEMO_BUDGET, DEMO_PARAMS, SessionRegistry, demo_pool_blocks, start_preemption_demo
from engine import SamplingParams


@pytest.fixture(scope="module")
def demo(base_engine):
    """The demo's session stepped until the preempted request has been recomputed and has decoded again."""
    registry = SessionRegistry(base=base_engine)
    s, pool = start_preemption_demo(registry, "tab", t("demo.short", "en"), t("demo.long", "en"))
    short, long = s.seq_ids()
    states = {}  # step -> the tab's queue states right after it
    preempted_at = None
    for _ in range(200):
        event = s.step()
        states[event.step] = s.queue_states()
        if event.preempted and preempted_at is None:
            preempted_at = event.step
        if preempted_at is not None and any(b["seq_id"] == long and b["phase"] == "decode" for b in event.batch):
            break
    yield s, pool, short, long, states
    registry.drop("tab")


def _by_step(trace):
    out = {}
    for i, x in enumerate(trace["x"]):
        out.setdefault(x, []).append(i)
    return out


def test_the_demo_preempts_the_long_request_and_recomputes_it(demo):
    s, pool, short, long, states = demo
    lens = [s.prompt_len(short), s.prompt_len(long)]
    assert pool == demo_pool_blocks(*lens, s.engine.block_size) == s.engine.kv_stats().num_blocks
    events = s.events
    # the long prompt is prefilled in chunks of the step's budget, beside the short one's prefill and decodes
    first = events[0]
    assert {b["seq_id"]: b["phase"] for b in first.batch} == {short: "prefill", long: "prefill"}
    assert sum(b["num_processed"] for b in first.batch) == DEMO_BUDGET
    mixed = [e for e in events if {b["phase"] for b in e.batch} == {"prefill", "decode"}]
    assert mixed and all(b["seq_id"] == long for e in mixed for b in e.batch if b["phase"] == "prefill")
    # the pool runs out: the newest request is preempted and waits at the head of the queue
    hit = next(e for e in events if e.preempted)
    assert hit.preempted == [long] and hit.waiting == [long] and [b["seq_id"] for b in hit.batch] == [short]
    assert states[hit.step][long] == {"state": "preempted", "ahead": 0, "preemptions": 1}
    # recomputed once the short one has finished: a prefill again, from the start (minus cached blocks)
    done = next(e for e in events if short in e.finished)
    again = next(e for e in events if e.step > hit.step and any(b["seq_id"] == long for b in e.batch))
    assert again.step >= done.step
    assert next(b for b in again.batch if b["seq_id"] == long)["phase"] == "prefill"
    assert states[events[-1].step][long] == {"state": "running", "ahead": 0, "preemptions": 1}
    assert len(s.seq_token_ids(short)) - lens[0] <= DEMO_PARAMS.max_tokens


def test_batch_segments_are_the_steps_batches(demo):
    s, _, short, long, _ = demo
    fig = timeline.timeline_chart(s.events, "en", s.owner)
    # a replayed trace knows no owner of its own (""): the events say whose share they are
    assert timeline.timeline_chart(s.events, "en", "") == timeline.timeline_chart(s.events, "en") == fig
    by = {tr["name"]: tr for tr in fig["data"]}
    batch = by["batch"]
    where = _by_step(batch)
    for e in s.events:
        idx = where.get(e.step, [])
        assert len(idx) == len(e.batch)  # one segment per sequence in the step: the bar's height is the batch
        assert [batch["base"][i] for i in idx] == list(range(len(e.batch)))
        segs = sorted(e.batch, key=lambda b: b["seq_id"])
        assert [batch["text"][i] for i in idx] == [str(b["num_processed"]) for b in segs]  # tokens each
        assert [batch["marker"]["color"][i] for i in idx] == [seq_color(b["seq_id"]) for b in segs]
        assert [batch["marker"]["pattern"]["shape"][i] for i in idx] == \
            ["/" if b["phase"] == "prefill" else "" for b in segs]  # a prefill chunk is hatched
        for i, b in zip(idx, segs):
            hover = batch["customdata"][i]
            assert f"seq #{b['seq_id']}" in hover and f"{b['num_processed']} tok" in hover
            assert ("prefill chunk" if b["phase"] == "prefill" else "decode") in hover
    # the step times are still there, below: one bar per step
    assert by["steps"]["x"] == [e.step for e in s.events]
    assert by["steps"]["y"] == [e.timing.step_ms for e in s.events]


def test_waiting_queue_and_preemptions_are_drawn(demo):
    s, _, short, long, _ = demo
    fig = timeline.timeline_chart(s.events, "en")
    by = {tr["name"]: tr for tr in fig["data"]}
    waiting, preempted = by["waiting"], by["preempted"]
    where = _by_step(waiting)
    for e in s.events:
        idx = where.get(e.step, [])
        assert len(idx) == len(e.waiting)  # how many waited after this step
        assert [waiting["base"][i] for i in idx] == [len(e.batch) + j for j in range(len(e.waiting))]
        for j, i in enumerate(idx):
            assert f"seq #{e.waiting[j]}" in waiting["customdata"][i]
            assert f"{j} ahead" in waiting["customdata"][i]
    hits = [e for e in s.events if e.preempted]
    assert preempted["x"] == [e.step for e in hits]
    assert all(f"#{long}" in text for text in preempted["text"])
    assert all("KV pool was full" in h for h in preempted["customdata"])
    # the key names the sequences, the phases, the queue and the preemption
    key = next(a["text"] for a in fig["layout"]["annotations"] if a.get("name") == "legend-key")
    for word in (f"seq #{short}", f"seq #{long}", "prefill chunk", "decode", "waiting", "preempted"):
        assert word in key


def test_the_queue_line_says_who_waits_and_why(demo):
    s, pool, short, long, states = demo
    hit = next(e for e in s.events if e.preempted)
    line = queue_html(states[hit.step], "en", pool)
    assert f"#{short}: running" in line and f"#{long}: preempted" in line and "will be recomputed" in line
    assert f"KV pool of {pool} blocks" in line
    assert re.search(rf'data-seq="{long}" data-state="preempted"', line)
    ru = queue_html(states[hit.step], "ru", pool)
    assert "вытеснена" in ru and "preempted" not in ru.replace('data-state="preempted"', "")
    assert f"#{long}: waiting, 2 requests ahead" in queue_html({long: {"state": "waiting", "ahead": 2,
                                                                        "preemptions": 0}}, "en")
    assert queue_html(None, "en") == ""  # a replay: no live queue
    assert "none unfinished" in queue_html({}, "en")  # the panel still says where things stand
    # the page's payload carries it in the timeline panel
    p = render.build_payload(s, "en", only={"chart-timeline"})
    assert "html-queue" in render.PANEL_HTML["timeline"]
    assert f"#{long}: running again, recomputed after 1 preemption" in p["html"]["html-queue"]


def test_other_tabs_sequences_are_grey_and_unnamed(base_engine):
    """In the room a step batches every tab's sequences; a tab's share names only its own."""
    eng = base_engine.session()
    mine = eng.add_request("What is gravity?", SamplingParams(max_tokens=2, temperature=0.0), owner="tab 1")
    other = eng.add_request("Name a fruit.", SamplingParams(max_tokens=2, temperature=0.0), owner="tab 2")
    events = [eng.step().for_owner("tab 1") for _ in range(2)]
    fig = timeline.timeline_chart(events, "en")  # "me" read off the events: tab 1's own sequence
    batch = next(tr for tr in fig["data"] if tr["name"] == "batch")
    assert len(batch["x"]) == 4 and batch["x"] == [0, 0, 1, 1]
    colors = dict(zip(zip(batch["x"], batch["base"]), batch["marker"]["color"]))
    assert colors[(0, 0)] == seq_color(mine) and colors[(0, 1)] == timeline.OTHER_COLOR
    hovers = [h for h in batch["customdata"] if "another tab" in h]
    assert len(hovers) == 2 and all(f"#{other}" not in h for h in hovers)
    key = next(a["text"] for a in fig["layout"]["annotations"] if a.get("name") == "legend-key")
    assert "other tabs" in key and f"seq #{other}" not in key


def test_the_chart_in_russian(demo):
    s, *_ = demo
    fig = timeline.timeline_chart(s.events, "ru")
    text = fig["layout"]["title"]["text"] + str(fig["layout"]["annotations"]) + str(fig["data"][1]["customdata"])
    assert "кусок префилла" in text and "вытесн" in text and "ждут" in text
    for word in ("prefill chunk", "waiting", "preempted", "sequences in the step"):
        assert word not in text
