"""The first screen before any step (issue 13, item 11): the prompt box's template and tokens, from the tokenizer
alone, capped like every text a visitor sends; and the long actions' progress lines."""
import json

import pytest

from app import render
from app.commands import Preview, apply
from app.i18n import Refusal
from app.session import MAX_PREVIEW_CHARS, MAX_PROMPT_CHARS, LabSession
from engine.tokenizer import render_prompt


@pytest.fixture(scope="module")
def tab(base_engine):
    s = LabSession.create(base_engine, kv_memory=8 * 1024 * 1024)
    yield s
    s.close()


def test_the_preview_is_the_prompt_the_first_step_will_read(tab, base_engine):
    apply(tab, Preview("What is gravity?", True, ""))
    want = render_prompt(base_engine.tokenizer, "What is gravity?", chat=True, system=None)
    assert list(tab.preview.token_ids) == list(want.token_ids) and tab.preview.text == want.text
    p = render.build_payload(tab, "en")
    assert "What is gravity?" in p["html"]["html-template"] and "il-special" in p["html"]["html-template"]
    assert p["html"]["html-tokens"].count('class="il-chip ') == len(want.token_ids)
    bars = [tr for tr in p["figs"]["chart-bytes"]["data"] if tr.get("type") == "bar"]
    assert sum(len(tr["x"]) for tr in bars) == len(want.token_ids)
    assert "gravity" in json.dumps(p["figs"]["chart-neighbours"])  # the visitor's own longest word
    note = p["figs"]["chart-logits"]["layout"]["annotations"][0]["text"]
    assert f"{len(want.token_ids)}" in note and "Press Step" in note
    assert tab.events == [] and not tab.has_unfinished()  # nothing ran
    ru = render.build_payload(tab, "ru")
    assert "Нажмите «Шаг»" in ru["figs"]["chart-logits"]["layout"]["annotations"][0]["text"]


def test_a_cyrillic_prompt_says_what_this_model_does_with_russian(tab):
    apply(tab, Preview("Что такое гравитация?", True, ""))
    html = render.build_payload(tab, "en")["html"]["html-template"]
    assert "trained on English" in html and "гравитация" in html


def test_the_preview_is_capped_before_any_tokenizer_work(tab):
    apply(tab, Preview("x" * (MAX_PREVIEW_CHARS + 1), True, ""))
    assert tab.preview.too_long and not tab.preview.token_ids
    assert f"longer than {MAX_PREVIEW_CHARS}" in render.build_payload(tab, "en")["html"]["html-template"]
    with pytest.raises(Refusal):
        apply(tab, Preview("x" * (MAX_PROMPT_CHARS + 1), True, ""))
    with pytest.raises(Refusal):
        apply(tab, Preview(["not", "text"], True, ""))
    apply(tab, Preview("   ", True, ""))
    assert tab.preview is None  # an empty box: the plain idle screen


def test_a_running_sequence_keeps_the_panels(tab):
    from engine import SamplingParams

    tab.add_request("Name a fruit.", SamplingParams(max_tokens=2, temperature=0.0), True, None)
    out = apply(tab, Preview("What is gravity?", True, ""))
    assert not out.changed  # the page is not redrawn: the panels show the sequence
    assert "Name a fruit." in render.build_payload(tab, "en")["html"]["html-template"]


def test_the_handlers_answer_junk_with_a_message(base_engine):
    """The preview and the demo as Gradio calls them, with what a hostile client may send: a message, never a
    traceback; the demo's own engine goes with the tab."""
    from types import SimpleNamespace

    from app.handlers import LabHandlers
    from app.server import ModelHolder
    from app.session import SessionRegistry

    registry = SessionRegistry(base_engine, kv_memory=16 * 1024 * 1024)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec,
                         machine={"bandwidth": 20e9, "peak_flops": 100e9})
    h = LabHandlers(registry, holder)
    r = SimpleNamespace(session_hash="junk", headers={}, client=SimpleNamespace(host="203.0.113.7"))
    for prompt, chat, system in ((None, None, None), (["x"], "yes", 3), ("x" * (MAX_PROMPT_CHARS + 1), True, ""),
                                 ("ok", True, "y" * 10_000), ("<script>alert(1)</script>", True, "")):
        out = h.preview(prompt, chat, system, "ru", "junk", None, "", None, "{bad json", request=r)
        text = out if isinstance(out, str) else ""
        assert "Traceback" not in text and "<script>" not in text
    out, temperature, max_tokens = h.preemption_demo("xx", -5, 999, "", None, "", request=r)
    assert "il-msg" in out and temperature["value"] == 0.0 and max_tokens["value"] == 40
    s = registry.sessions["junk"]
    assert s.own_room and len(s.seq_ids()) == 2
    room = s.room
    h.reset("en", "", request=r)  # Reset: back to the shared room, the demo's engine closed
    assert not registry.sessions["junk"].own_room and room._closed
    registry.drop("junk")
