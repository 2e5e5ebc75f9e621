"""The guided tour: every step is complete in both languages and names a real panel, and walking the whole tour
on a real LabSession performs each action, advances the engine where the text says it does, and leaves the
highlighted panel with data drawn from the live engine."""
from __future__ import annotations

import json

import pytest

from app import calculators as calc
from app import render
from app.session import LabSession
from app.tour import (ACTIONS, EXTRA_PANELS, TOUR_MAX_TOKENS, TOUR_PATH, TourStep, apply_action, known_panels,
                      load_tour, tour_params)
from engine import SamplingParams
from engine.metrics import measure_bandwidth, measure_peak_flops
from engine.scheduler import Status


@pytest.fixture(scope="module")
def tour():
    return load_tour()


NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()


def test_the_docs_count_the_tours_steps(tour):
    """README and the guide say how many steps the tour has: the count of assets/tour.json (the README said
    thirteen of fourteen)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for doc in ("README.md", "docs/guide.md"):
        text = " ".join((root / doc).read_text(encoding="utf-8").split())
        said = re.findall(r"\b(\w+) steps in English and Russian", text)
        assert said, f"{doc} no longer says how many steps the tour has"
        assert all(NUMBER_WORDS.index(w.lower()) == len(tour) for w in said), (doc, said, len(tour))


def test_steps_are_bilingual_and_name_known_panels(tour):
    panels = known_panels()
    assert {"template", "embeddings", "layers", "logits", "sampling", "detok", "kv", "timeline", "room",
            "speculative", "calculators"} <= panels
    assert 10 <= len(tour) <= 14
    assert len({s.id for s in tour}) == len(tour)
    for s in tour:
        assert s.panel in panels
        for lang in ("en", "ru"):
            assert s.title[lang].strip() and len(s.text[lang]) > 80
        # the Russian text is Russian (mostly Cyrillic letters), the English one is not
        letters = [c for c in s.text["ru"] if c.isalpha()]
        assert sum("а" <= c.lower() <= "я" or c in "ёЁ" for c in letters) / len(letters) > 0.6, s.id
        assert s.action["type"] in ACTIONS
    # the story's order: template first, every stage panel in the order of the page, calculators last
    order = [s.panel for s in tour]
    stages = [p for p in render.PANEL_CHARTS if p not in EXTRA_PANELS]
    first_seen = [p for i, p in enumerate(order) if p not in order[:i]]
    assert [p for p in first_seen if p in stages] == stages
    assert first_seen[-2:] == ["speculative", "calculators"]
    # the house example in chat mode starts it; a later request with the same system prompt shows prefix sharing
    start = tour[0].action
    assert start == {"type": "start", "prompt": "Что такое гравитация?", "chat": True}
    adds = [s.action for s in tour if s.action["type"] == "add_request"]
    assert adds and all(a.get("chat", True) and a.get("system") == start.get("system") for a in adds)


@pytest.mark.parametrize("mutate, match", [
    (lambda st: st[1].update(panel="nowhere"), "unknown panel 'nowhere'"),
    (lambda st: st[2]["text"].pop("ru"), "'text' needs non-empty 'en' and 'ru'"),
    (lambda st: st[3].update(id=st[0]["id"]), "used twice"),
    (lambda st: st[2].update(action={"type": "step", "count": 0}), "'count'"),
    (lambda st: st[2].update(action={"type": "jump"}), "'type' is one of"),
    (lambda st: st[2].update(action={"type": "step", "count": 1, "speed": 2}), "unexpected field"),
    (lambda st: st.insert(0, dict(st[2], id="early", action={"type": "step", "count": 1})), "earlier 'start'"),
    (lambda st: st[0]["action"].update(prompt=" "), "non-empty 'prompt'"),
])
def test_bad_tour_files_are_rejected(tmp_path, mutate, match):
    raw = json.loads(TOUR_PATH.read_text(encoding="utf-8"))
    mutate(raw["steps"])
    path = tmp_path / "tour.json"
    path.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        load_tour(path)


def test_tour_params_cap_max_tokens():
    assert tour_params(None).max_tokens == TOUR_MAX_TOKENS and tour_params(None).seed == 0
    p = tour_params(SamplingParams(max_tokens=500, temperature=0.3, top_p=0.9))
    assert (p.max_tokens, p.temperature, p.top_p) == (TOUR_MAX_TOKENS, 0.3, 0.9)
    assert tour_params(SamplingParams(max_tokens=5)).max_tokens == 5


def _has_data(fig: dict) -> bool:
    """A drawn chart, not the empty() placeholder with a message."""
    return bool(fig.get("data"))


def test_walk_the_whole_tour_on_a_live_session(tour, base_engine):
    s = LabSession.create(base_engine)
    machine = {"bandwidth": measure_bandwidth("cpu", mbytes=64, repeats=3),
               "peak_flops": measure_peak_flops("cpu", n=256, repeats=3)}
    # 12 tokens: the first answer is still running when the second request arrives (11 tokens in), and the
    # walk stays short on a busy CPU; the tour's own cap (16) applies to larger settings
    params = SamplingParams(max_tokens=12, temperature=0.7, seed=3)
    live = calc.live_model_preset_from_engine(base_engine)
    first_sid = second_sid = None
    for i, step in enumerate(tour):
        lang = "ru" if i % 2 else "en"
        n_events, n_requests = len(s.events), len(s.requests)
        note = apply_action(step, s, params, lang)
        assert note.strip(), step.id
        kind = step.action["type"]
        if kind == "start":
            assert len(s.requests) == 1 and not s.events and s.focus in s.requests
            first_sid = s.focus
            req = s.requests[first_sid]
            assert req.prompt == step.action["prompt"] and req.chat
            assert s.engine.sequences[first_sid].params.max_tokens == min(12, TOUR_MAX_TOKENS)
        elif kind == "add_request":
            assert len(s.requests) == n_requests + 1
            second_sid = max(s.requests)
            assert s.engine.sequences[second_sid].status is Status.WAITING
        elif kind == "step":
            assert len(s.events) == n_events + step.action["count"], step.id  # the answer is still going
            assert len(s.engine.sequences[s.focus].output_ids) >= 1  # the focused sequence has tokens
        elif kind == "run_until_done":
            assert not s.engine.has_unfinished() and len(s.events) > n_events
        elif kind == "speculate":
            # a speculative request of its own, stepped: its rounds are in the events the panel draws
            assert len(s.requests) == n_requests + 1 and len(s.events) > n_events
            rounds = [sev.spec for ev in s.events[n_events:] for sev in ev.seqs if sev.spec is not None]
            assert rounds and any(r.num_drafted for r in rounds), step.id
        else:
            assert len(s.events) == n_events and len(s.requests) == n_requests
        if step.id == "kv-prefix":
            # the second request found the shared system-prompt blocks in the pool: a prefix-cache hit
            hits = [sev.num_cached_tokens for ev in s.events[n_events:] for sev in ev.seqs if sev.seq_id == second_sid]
            assert hits and hits[0] >= s.engine.block_size
            if s.engine.sequences[first_sid].status is not Status.FINISHED:
                assert s.events[-1].kv.shared >= 1  # refcount > 1 while both sequences hold the blocks
        # the highlighted panel shows live data after the action
        if step.panel == "speculative" and kind != "speculate":
            pass  # a step that only talks about the panel; the one that runs rounds is checked below
        elif step.panel == "calculators":
            figs = calc.calculator_payload(lang=lang, live=live, machine=machine)["figs"]
            assert all(_has_data(f) for f in figs.values())
        elif step.panel in render.PANEL_CHARTS:
            ids = render.PANEL_CHARTS[step.panel]
            payload = render.build_payload(s, lang, machine=machine, only=set(ids))
            for cid in ids:
                if cid == "chart-spec-speedup":
                    continue  # drawn by the "Measure speedup" button, not by stepping
                assert _has_data(payload["figs"][cid]), (step.id, cid)
            for hid in render.PANEL_HTML.get(step.panel, []):
                assert payload["html"].get(hid), (step.id, hid)
        else:
            raise AssertionError(f"{step.id}: no way to check panel {step.panel!r}")
    # both answers ran to the end and the timeline saw prefill, decode and the mixed step that batched them
    kinds = {tuple(sorted({sev.phase for sev in ev.seqs})) for ev in s.events}
    assert ("prefill",) in kinds and ("decode",) in kinds and ("decode", "prefill") in kinds
    assert all(s.engine.sequences[sid].status is Status.FINISHED for sid in (first_sid, second_sid))


def test_notes_and_a_hand_made_step(base_engine):
    s = LabSession.create(base_engine)
    look = TourStep("x", "logits", {"en": "t", "ru": "т"}, {"en": "t", "ru": "т"}, {"type": "none"})
    assert apply_action(look, s, lang="ru") == "Запускать нечего: смотрите на подсвеченную панель."
    step = TourStep("y", "logits", look.title, look.text, {"type": "step", "count": 2})
    assert "Nothing left" in apply_action(step, s)  # nothing was started: nothing to step
    start = TourStep("z", "template", look.title, look.text,
                     {"type": "start", "prompt": "Hi", "chat": False, "max_tokens": 1})
    assert apply_action(start, s) == "Started «Hi» (plain text); max new tokens: 1."
    assert apply_action(step, s) == "Ran 1 of 2 engine steps: every sequence has finished."
    with pytest.raises(ValueError, match="unknown tour action"):
        apply_action(TourStep("w", "logits", look.title, look.text, {"type": "fly"}), s)
