"""App-level tests of the page's tools: speculative settings and the speedup measurement, trace export and
model-free replay through the handlers, chart export, the calculators and the tour handlers."""
import json
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from app import calculators as calc
from app.server import ModelHolder
from app.session import SessionRegistry
from app.trace import ReplaySession
from app.handlers import LabHandlers
from app.ui_tools import ToolHandlers

SAMPLING = [0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 24, ""]  # temperature ... stop
VIEW = ["en", 0, 0, "", None, ""]


def req(name="tools-tab"):
    return SimpleNamespace(session_hash=name)


@pytest.fixture
def tools(base_engine):
    registry = SessionRegistry(base_engine, kv_memory=32 * 1024 * 1024)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec,
                         machine={"bandwidth": 20e9, "peak_flops": 100e9})
    lab = LabHandlers(registry, holder)
    return ToolHandlers(lab), lab, registry


def step(lab, prompt="Что такое гравитация?", name="tools-tab"):
    return lab.step(prompt, True, "", *SAMPLING, *VIEW, request=req(name))


def test_speculative_settings_apply_to_new_requests_and_speedup_is_measured(tools):
    t, lab, registry = tools
    assert t.spec_settings(True, "ngram", 3, 10, False, "en", request=req()) is not None
    s = registry.sessions["tools-tab"]
    assert s.speculative.method == "ngram" and s.speculative.num_tokens == 3
    step(lab, "Repeat exactly: one two three, one two three, one two three.")
    for _ in range(3):
        step(lab)
    specs = [se.spec for ev in s.events for se in ev.seqs if se.spec is not None]
    assert specs and all(sp.method == "ngram" for sp in specs)
    out = json.loads(t.spec_measure(*VIEW, request=req()))
    cmp = s.spec_comparison
    assert cmp["same_tokens"] and cmp["plain"]["tok_s"] > 0 and cmp["speculative"]["tok_s"] > 0
    fig = out["figs"]["chart-spec-speedup"]
    ys = sorted(y for tr in fig["data"] for y in (tr.get("y") or []) if isinstance(y, (int, float)))
    assert any(abs(y - cmp["plain"]["tok_s"]) < 1e-6 for y in ys)
    assert any(abs(y - cmp["speculative"]["tok_s"]) < 1e-6 for y in ys)
    # an impossible setting is a message, and speculation can be turned off again
    bad = json.loads(t.spec_settings(True, "early_exit", 3, 0, False, "en", request=req()))
    assert "il-msg-error" in bad["html"]["html-message"] and "exit_layer" in bad["html"]["html-message"]
    t.spec_settings(False, "ngram", 3, 10, False, "en", request=req())
    assert s.speculative is None


def test_trace_export_then_replay_without_a_model(tools, tmp_path):
    t, lab, registry = tools
    empty = t.export_trace("en", request=req())
    assert empty[0] is None and "press Step" in json.loads(empty[1])["html"]["html-message"]
    for _ in range(3):
        step(lab)
    live = registry.sessions["tools-tab"]
    path, _ = t.export_trace("en", request=req())
    assert Path(path).exists() and Path(path).stat().st_size > 1000

    # a server whose model never loaded can still replay the trace
    cold = SessionRegistry()
    cold_holder = ModelHolder(source="/no/such/model")
    cold_holder.error = "Could not load model"
    cold_tools = ToolHandlers(LabHandlers(cold, cold_holder))
    out = json.loads(cold_tools.load_trace(path, *VIEW, request=req("viewer")))
    assert "Replaying a recorded trace (3 steps" in out["html"]["html-message"]
    replay = cold.sessions["viewer"]
    assert isinstance(replay, ReplaySession) and replay.position == 0
    cold_lab = cold_tools.lab
    for _ in range(3):
        out = json.loads(cold_lab.step("ignored", True, "", *SAMPLING, *VIEW, request=req("viewer")))
    assert replay.position == 3
    # what each page shows (figures and HTML pieces travel only when they change) is the same
    replay_page, live_page = cold_lab.delivery.views.of("viewer"), lab.delivery.views.of("tools-tab")
    assert replay_page.sent_figs["chart-timeline"] == live_page.sent_figs["chart-timeline"]
    assert "chart-timeline" in out["figs"]  # the replayed step redrew it
    for key in ("html-stream", "html-tokens"):
        assert replay_page.sent_html[key] == live_page.sent_html[key]
    # the controls that would change the past say why they cannot
    msg = json.loads(cold_lab.force(5, *VIEW, request=req("viewer")))["html"]["html-message"]
    assert "replayed trace" in msg
    assert cold_lab.what_if(*SAMPLING, "en", request=req("viewer")) == gr.skip()  # recorded sampling stays
    # a file that is not a trace is one clear line
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    msg = json.loads(cold_tools.load_trace(str(bad), *VIEW, request=req("viewer")))["html"]["html-message"]
    assert "not a usable InferLab trace" in msg and "Traceback" not in msg
    assert live.events  # the live session was never touched


def test_chart_export_png_and_html(tools):
    t, lab, registry = tools
    step(lab)
    path, msg = t.export_chart("chart-logits", "png", "en", 0, 0, "", None, request=req())
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path, msg = t.export_chart("chart-timeline", "html", "en", 0, 0, "", None, request=req())
    page = Path(path).read_text()
    assert "<script src" not in page and "Plotly" in page and len(page) > 1_000_000  # plotly.js inlined
    none, msg = t.export_chart("chart-nope", "png", "en", 0, 0, "", None, request=req())
    assert none is None and "Pick a chart" in json.loads(msg)["html"]["html-message"]


def test_calculators_handler_uses_the_live_model_and_this_machine(tools):
    t, lab, registry = tools
    out = json.loads(t.calculators("live", "fp32", 2048, 1, "this-machine", 0.8, 4, 0.05, "en", ""))
    live = calc.live_model_preset_from_engine(registry.base)
    want = calc.calculator_payload("live", "fp32", 2048, 1, "this-machine", 0.8, 4, 0.05, "en", live,
                                   lab.holder.machine)
    assert out["figs"] == json.loads(json.dumps(want["figs"]))
    assert "2 × 30 layers × 3 KV heads × 64" in out["html"]["html-calc-formulas"]
    bad = json.loads(t.calculators("live", "fp32", -5, 1, "this-machine", 0.8, 4, 0.05, "en", ""))
    assert "context" in bad["html"]["html-message"]
    ru = json.loads(t.calculators("llama-3-8b", "bf16", 4096, 1, "h100-sxm-80gb", 0.8, 4, 0.05, "ru", ""))
    assert "слоёв" in ru["html"]["html-calc-formulas"] or "слоя" in ru["html"]["html-calc-formulas"]


def test_tour_handlers_walk_and_point_at_panels(tools):
    t, lab, registry = tools
    out, box = t.tour_start(*SAMPLING, *VIEW, request=req())
    p = json.loads(out)
    assert (p["tour"]["panel"], p["tour"]["index"]) == (t.tour[0].panel, 0) and t.tour[0].title["en"] in box
    s = registry.sessions["tools-tab"]
    assert s.requests and not s.events
    out, box = t.tour_next(*SAMPLING, *VIEW, request=req())
    out, box = t.tour_next(*SAMPLING, *VIEW, request=req())
    assert json.loads(out)["tour"]["index"] == 2 and len(s.events) == 1  # "embeddings" ran one step
    out, box = t.tour_back(*SAMPLING, *VIEW, request=req())
    assert json.loads(out)["tour"]["index"] == 1 and len(s.events) == 1  # going back never reruns anything


def test_run_and_pause_on_a_replay(tools):
    t, lab, registry = tools
    for _ in range(3):
        step(lab)
    path, _ = t.export_trace("en", request=req())
    cold = SessionRegistry()
    cold_lab = LabHandlers(cold, ModelHolder(source="/no/such/model"))
    ToolHandlers(cold_lab).load_trace(path, *VIEW, request=req("replay-run"))
    replay = cold.sessions["replay-run"]
    outs = list(cold_lab.run("ignored", True, "", *SAMPLING, *VIEW, request=req("replay-run")))
    assert replay.at_end and len(outs) == replay.num_frames and not replay.running  # one payload a frame
    assert all("il-msg-error" not in json.loads(o)["html"].get("html-message", "") for o in outs)
    cold_lab.pause(request=req("replay-run"))  # nothing runs: a no-op, not an error
