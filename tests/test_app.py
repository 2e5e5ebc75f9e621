"""App-level tests of the Gradio handlers: the payload the page draws must be the engine's own data."""
import json
from types import SimpleNamespace

import pytest

from app import render
from app.render import CHART_IDS
from engine.records import dumps
from app.server import ModelHolder
from app.session import SessionRegistry
from app.handlers import LabHandlers
from engine import SpeculativeConfig

DEFAULTS = dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, rep=1.0, freq=0.0, pres=0.0, seed=1,
                max_tokens=24, stop="")
VIEW = ["en", 3, 2, "", None, ""]


def args(prompt="Что такое гравитация?", chat=True, system="", **over):
    p = {**DEFAULTS, **over}
    return [prompt, chat, system, p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["rep"], p["freq"],
            p["pres"], p["seed"], p["max_tokens"], p["stop"], *VIEW]


@pytest.fixture
def lab(base_engine):
    registry = SessionRegistry(base_engine, kv_memory=32 * 1024 * 1024)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec,
                         machine={"bandwidth": 20e9, "peak_flops": 100e9})
    return LabHandlers(registry, holder), registry


def req(name="tab-a"):
    return SimpleNamespace(session_hash=name)


def test_step_payload_matches_engine_event(lab):
    h, registry = lab
    first = json.loads(h.step(*args(), request=req()))
    second = json.loads(h.step(*args(), request=req()))
    s = registry.sessions["tab-a"]
    assert len(s.events) == 2
    # every chart is built; one whose figure equals what the tab already has is named in "same", not resent
    # (the speculative panel's placeholders do not change without a speculative request)
    assert set(CHART_IDS) == set(second["figs"]) | set(second["same"])
    assert not set(second["figs"]) & set(second["same"])
    assert {c for c in CHART_IDS if c.startswith("chart-spec")} <= set(second["same"])
    now = render.build_payload(s, "en", 3, 2, "", None, h.holder.machine)["figs"]
    assert all(first["figs"][c] == json.loads(dumps(now[c])) for c in second["same"])
    ev = s.events[-1].seq(s.focus)
    # the sampling chart's last stage bars are the trace's final probabilities
    fig = second["figs"]["chart-sampling"]
    final = ev.sampling.stages[-1].probs
    # horizontal bars: one row per tracked token, the probability on x
    xs = [x for tr in fig["data"] if tr.get("type") == "bar" for x in (tr.get("x") or []) if isinstance(x, (int, float))]
    assert all(any(abs(p - x) < 1e-6 for x in xs) for p in final if p > 0)
    # the timeline has one bar per step with the measured step time
    tl = second["figs"]["chart-timeline"]["data"]
    bars = [y for tr in tl if tr.get("name") == "steps" for y in tr["y"]]
    assert sorted(round(b, 6) for b in bars) == sorted(round(e.timing.step_ms, 6) for e in s.events)
    assert ev.new_token_text.strip()[:1] in second["html"]["html-tokens"] or ev.new_token is not None
    assert "il-msg-error" not in (first["html"].get("html-message", "") + second["html"].get("html-message", ""))
    # HTML pieces travel only when they change: the template stays, the token chips grow
    assert "html-template" in first["html"] and "html-template" not in second["html"]
    assert "html-tokens" in second["html"]


def test_a_good_step_clears_the_message_an_error_left(lab):
    h, registry = lab
    h.step(*args(), request=req())
    bad = json.loads(h.step(*args(top_p=0.0), request=req()))
    assert "top_p must be in (0, 1]" in bad["html"]["html-message"]
    good = json.loads(h.step(*args(), request=req()))
    assert "il-msg-error" not in good["html"]["html-message"]  # sent, and no longer the error


def test_what_if_recomputes_without_stepping(lab):
    h, registry = lab
    h.step(*args(), request=req())
    s = registry.sessions["tab-a"]
    n = len(s.events)
    base = s.events[-1].seq(s.focus).sampling
    out = json.loads(h.what_if(0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 24, "", "en", request=req()))
    assert len(s.events) == n
    assert set(out["figs"]) == {"chart-sampling", "chart-cdf"}
    assert "what-if" in out["html"].get("html-message", "").lower()
    trace = s.engine.what_if(s.focus, h.params(0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 24, ""))
    assert trace.u == base.u and trace.greedy
    # back to the values the step sampled with (or a Step already applied them before this event arrived):
    # the real chain again, no what-if banner left behind
    d = DEFAULTS
    back = json.loads(h.what_if(d["temperature"], d["top_k"], d["top_p"], d["min_p"], d["rep"], d["freq"], d["pres"],
                                d["seed"], d["max_tokens"], d["stop"], "en", request=req()))
    assert s.what_if is None and len(s.events) == n
    assert "what-if" not in back["html"]["html-message"].lower()
    real = render.build_payload(s, "en", 3, 2, "", None, h.holder.machine)["figs"]["chart-sampling"]
    assert back["figs"]["chart-sampling"] == json.loads(dumps(real))
    # the page now shows the real chain: a view refresh names it unchanged instead of sending it again
    assert "chart-sampling" in json.loads(h.view(*VIEW, request=req()))["same"]
    assert "what-if" not in back["figs"]["chart-sampling"]["layout"]["title"]["text"].lower()


def test_force_rewind_branch_reset(lab):
    h, registry = lab
    for _ in range(3):
        h.step(*args(temperature=0.0), request=req())
    s = registry.sessions["tab-a"]
    sid = s.focus
    forced = s.engine.tokenizer.encode(" Zebra", add_special_tokens=False)[0]
    h.force(forced, *VIEW, request=req())
    h.step(*args(temperature=0.0), request=req())
    assert s.engine.sequences[sid].output_ids[-1] == forced
    assert s.events[-1].seq(sid).forced
    h.rewind(1, False, *VIEW, request=req())
    assert len(s.engine.sequences[sid].output_ids) == 1
    out = json.loads(h.rewind(1, True, *VIEW, request=req()))
    assert s.focus != sid and s.engine.sequences[s.focus].parent_id == sid
    assert "il-msg-error" not in out["html"].get("html-message", "")
    s.speculative = SpeculativeConfig(method="ngram")  # as the speculative panel's checkbox sets it
    h.reset("en", request=req())
    assert registry.sessions["tab-a"].events == []
    # the checkbox stays ticked on the page, so the fresh session keeps the setting (issue 13, item 1)
    assert registry.sessions["tab-a"] is not s and registry.sessions["tab-a"].speculative == s.speculative


def test_second_request_joins_the_batch(lab):
    h, registry = lab
    h.step(*args(), request=req())
    h.add(*args(prompt="What is gravity?"), request=req())
    h.step(*args(), request=req())
    s = registry.sessions["tab-a"]
    ev = s.events[-1]
    assert len(ev.seqs) == 2 and {x.phase for x in ev.seqs} == {"prefill", "decode"}


def test_run_streams_until_done_and_bad_input_is_a_message(lab):
    h, registry = lab
    outs = list(h.run(*args(max_tokens=5, temperature=0.0), request=req()))
    s = registry.sessions["tab-a"]
    # one payload whenever steps arrived: a page drawing slower than the room steps gets several at once
    assert 1 <= len(outs) <= len(s.events) == 5
    assert not s.engine.has_unfinished()
    for bad, field in [(dict(prompt="  "), "prompt"), (dict(top_p=0.0), "top_p"), (dict(max_tokens=0), "max_tokens"),
                       (dict(prompt="x" * 30000), "prompt")]:
        over = {k: v for k, v in bad.items() if k != "prompt"}
        out = json.loads(h.step(*args(prompt=bad.get("prompt", "Hi"), **over), request=req("tab-b")))
        msg = out["html"].get("html-message", "")
        assert "il-msg-error" in msg and field in msg and "Traceback" not in msg
    # and the session still works afterwards
    out = json.loads(h.step(*args(prompt="Hi"), request=req("tab-b")))
    assert "il-msg-error" not in out["html"].get("html-message", "")


def test_tabs_share_one_engine_own_their_sequences_and_free_them_on_close(lab):
    h, registry = lab
    h.step(*args(prompt="What is gravity?"), request=req("a"))
    h.step(*args(prompt="Что такое гравитация?"), request=req("b"))
    a, b = registry.sessions["a"], registry.sessions["b"]
    eng = a.engine
    assert eng is b.engine and a.owner != b.owner  # one engine for the room, one owner per tab
    mine = eng.seq_ids(a.owner)
    assert mine == [a.focus] and eng.seq_view(a.focus).num_blocks > 0
    with pytest.raises(ValueError, match="not one of"):
        b.seq_view(a.focus)  # a tab never reads another's sequence
    b_blocks = eng.seq_view(b.focus).num_blocks
    registry.drop("a")
    assert "a" not in registry.sessions and eng.seq_ids(a.owner) == []
    assert eng.kv_stats().used == b_blocks  # a's blocks went back to the pool at once


def test_concurrent_sessions_do_not_disturb_each_other(lab):
    """Two tabs stepping at the same time share the weights but never each other's KV or results."""
    import threading

    h, registry = lab
    prompts = {"t1": "What is gravity?", "t2": "Что такое гравитация?"}
    expected = {k: registry.base.session().generate(p, h.params(0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 12, "")).token_ids
                for k, p in prompts.items()}
    errors = []

    def drive(key):
        try:
            for _ in range(12):
                h.step(*args(prompt=prompts[key], temperature=0.0, max_tokens=12), request=req(key))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for key in prompts:
        s = registry.sessions[key]
        assert s.engine.sequences[s.focus].output_ids == expected[key]


def test_unknown_model_and_loading_state_are_messages():
    registry = SessionRegistry()
    holder = ModelHolder(source="/no/such/model/dir")
    h = LabHandlers(registry, holder)
    # while nothing is loaded, a Step is a polite message, not an error page
    out = json.loads(h.step(*args(), request=req()))
    assert "Loading the model" in out["html"]["html-message"]
    holder.load(registry)
    assert not holder.ready and "No model directory" in holder.error
    # once loading has failed, a Step says why instead of "loading"
    out = json.loads(h.step(*args(), request=req()))
    assert "No model directory" in out["html"]["html-message"] and "Load a trace" in out["html"]["html-message"]
    status_html = h.status("en")[0]
    assert "No model directory" in status_html and "Traceback" not in status_html


def test_sequence_selector_rides_in_the_payload_and_says_why_a_sequence_waits(lab):
    h, registry = lab
    first = json.loads(h.add(*args(prompt="What is gravity?"), request=req("sel")))
    s = registry.sessions["sel"]
    a = s.focus
    # not stepped yet: the focused request waits in the queue, and the page says so (EN and RU)
    assert f'value="{a}" selected' in first["html"]["html-focus"] and "waiting: 0 requests ahead" in \
        first["html"]["html-focus"]
    b = json.loads(h.add(*args(prompt="Hi"), request=req("sel")))
    assert "html-focus" in b["html"] and f"#{max(s.requests)} · waiting" in b["html"]["html-focus"]
    out = json.loads(h.focus(str(max(s.requests)), "ru", 3, 2, "", None, "", request=req("sel")))
    assert s.focus == max(s.requests) != a
    assert f'value="{s.focus}" selected' in out["html"]["html-focus"] and "ожидание" in out["html"]["html-focus"]
    stepped = json.loads(h.step(*args(), request=req("sel")))
    assert "waiting" not in stepped["html"]["html-focus"] and "running" in stepped["html"]["html-focus"]
    # the commands' messages are translated too
    msg = json.loads(h.rewind(None, False, "ru", 3, 2, "", None, "", request=req("sel")))["html"]["html-message"]
    assert "Позиция" in msg
