"""The guided tour: lecture steps (assets/tour.json) that drive a LabSession and name the panel to highlight.

A step's action puts the live engine in the state its text talks about — start the house example, take a
few steps, queue a second request that shares the system prompt, run to the end — so the highlighted
panel shows real data from the running model, not a recording.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from engine import SamplingParams, SpeculativeConfig

from .commands import Add, Request, Reset, Step, apply
from .i18n import Phrase
from .session import LabSession

TOUR_PATH = Path(__file__).resolve().parent.parent / "assets" / "tour.json"
LANGS = ("en", "ru")
# Panels that are not in render.PANEL_CHARTS because they have no live-event charts of their own there
# (speculative: its own panel; calculators: app.calculators).
EXTRA_PANELS = ("speculative", "calculators")
ACTIONS = ("none", "start", "step", "add_request", "run_until_done", "speculate")
SPEC_K = 4  # drafts per round in the tour's speculative step
# Short answers keep the tour brisk on a CPU; the story needs ~11 tokens before the second request arrives.
TOUR_MAX_TOKENS = 16
MAX_STEPS_PER_ACTION = 64
RUN_UNTIL_DONE_LIMIT = 2048  # a safety net: every request has max_tokens, so the loop ends long before this


@dataclass(frozen=True)
class TourStep:
    id: str
    panel: str
    title: dict  # {"en": ..., "ru": ...}
    text: dict
    action: dict  # {"type": one of ACTIONS, ...}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def known_panels() -> set[str]:
    from .render import PANEL_CHARTS  # late: render pulls in every chart module

    return set(PANEL_CHARTS) | set(EXTRA_PANELS)


def load_tour(path: str | Path | None = None) -> list[TourStep]:
    """The tour's steps, validated; ValueError names the step and the field that is wrong."""
    path = Path(path) if path else TOUR_PATH
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"tour file {path} is missing") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    steps = raw.get("steps") if isinstance(raw, dict) else None
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{path}: expected an object with a non-empty 'steps' list")
    panels = known_panels()
    out, seen, started = [], set(), False
    for i, s in enumerate(steps):
        where = f"{path}: step {i + 1}"
        if not isinstance(s, dict):
            raise ValueError(f"{where} must be an object")
        sid = s.get("id")
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"{where}: 'id' must be a non-empty string")
        where = f"{path}: step {i + 1} ({sid!r})"
        if sid in seen:
            raise ValueError(f"{where}: the id is used twice")
        seen.add(sid)
        if s.get("panel") not in panels:
            raise ValueError(f"{where}: unknown panel {s.get('panel')!r}; known: {', '.join(sorted(panels))}")
        for key in ("title", "text"):
            v = s.get(key)
            if not isinstance(v, dict) or any(not isinstance(v.get(lang), str) or not v[lang].strip()
                                               for lang in LANGS):
                raise ValueError(f"{where}: {key!r} needs non-empty 'en' and 'ru' strings")
        action = _check_action(where, s.get("action"))
        if action["type"] == "start":
            started = True
        elif action["type"] != "none" and not started:
            # Acting before the tour's own "start" would step whatever the visitor had typed.
            raise ValueError(f"{where}: a {action['type']!r} action needs an earlier 'start' step")
        out.append(TourStep(sid, s["panel"], dict(s["title"]), dict(s["text"]), action))
    return out


def _check_action(where: str, a) -> dict:
    if not isinstance(a, dict) or a.get("type") not in ACTIONS:
        raise ValueError(f"{where}: 'action' must be an object whose 'type' is one of {', '.join(ACTIONS)}")
    t = a["type"]
    allowed = {"none": {"type"}, "start": {"type", "prompt", "chat", "system", "max_tokens"},
               "step": {"type", "count"}, "add_request": {"type", "prompt", "chat", "system", "max_tokens"},
               "run_until_done": {"type"},
               "speculate": {"type", "prompt", "chat", "system", "max_tokens", "count"}}[t]
    extra = set(a) - allowed
    if extra:
        raise ValueError(f"{where}: unexpected field(s) {sorted(extra)} in a {t!r} action")
    if t in ("start", "add_request", "speculate"):
        if not isinstance(a.get("prompt"), str) or not a["prompt"].strip():
            raise ValueError(f"{where}: a {t!r} action needs a non-empty 'prompt'")
        if not isinstance(a.get("chat", True), bool):
            raise ValueError(f"{where}: 'chat' must be true or false")
        if a.get("system") is not None and not isinstance(a["system"], str):
            raise ValueError(f"{where}: 'system' must be a string")
        mt = a.get("max_tokens", TOUR_MAX_TOKENS)
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise ValueError(f"{where}: 'max_tokens' must be a positive integer")
    if t in ("step", "speculate"):
        n = a.get("count")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_STEPS_PER_ACTION:
            raise ValueError(f"{where}: 'count' must be an integer from 1 to {MAX_STEPS_PER_ACTION}")
    return dict(a)


def tour_params(params: SamplingParams | None, max_tokens: int = TOUR_MAX_TOKENS) -> SamplingParams:
    """The visitor's sampling settings with max_tokens capped, so a tour step never waits on a long answer.

    Without settings: temperature 0.7 (the page's default) and a fixed seed, so the tour replays the same.
    """
    if params is None:
        return SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=0)
    return dataclasses.replace(params, max_tokens=min(params.max_tokens, max_tokens))


def apply_action(step: TourStep, session: LabSession, params: SamplingParams | None = None,
                 lang: str = "en") -> str:
    """Perform the step's action on the session and return a one-line note in `lang`."""
    return run_action(step, session, params).text(lang)


def run_action(step: TourStep, session: LabSession, params: SamplingParams | None = None) -> Phrase:
    """Perform the step's action on the session (as commands, app/commands.py); a note on what it ran, in any
    language (the tour card is redrawn in the other one when the page's language changes)."""
    a = step.action
    t = a["type"]
    with session.lock:  # the whole action at once, even if a Run loop or another click races it
        if t == "none":
            return Phrase("tour_note.none")
        if t in ("start", "add_request"):
            p = tour_params(params, a.get("max_tokens", TOUR_MAX_TOKENS))
            chat = a.get("chat", True)
            if t == "start":
                apply(session, Reset())  # no registry in the context: this session, reset in place
            sid = apply(session, Add(Request(a["prompt"], chat, a.get("system"), p), focus=t == "start")).value
            mode = Phrase("tour_note.chat" if chat else "tour_note.plain")
            if t == "start":
                return Phrase("tour_note.start", {"p": a["prompt"], "mode": mode, "n": p.max_tokens})
            return Phrase("tour_note.add", {"sid": sid, "p": a["prompt"], "mode": mode})
        if t == "step":
            want = a["count"]
            done = len(apply(session, Step(count=want)).value)
            if done == 0:
                return Phrase("tour_note.nothing")
            return Phrase("tour_note.step", {"done": done}) if done == want else \
                Phrase("tour_note.step_short", {"done": done, "want": want})
        if t == "run_until_done":
            done = len(apply(session, Step(count=RUN_UNTIL_DONE_LIMIT)).value)
            return Phrase("tour_note.run", {"done": done}) if done else Phrase("tour_note.nothing")
        if t == "speculate":
            return _speculate(a, session, params)
    raise ValueError(f"unknown tour action {t!r}")  # load_tour rejects these; a hand-made TourStep may not


def _speculate(a: dict, session: LabSession, params: SamplingParams | None) -> Phrase:
    """A request that drafts with the model's own first layers but one (early exit), stepped `count` times, so
    the speculative panel shows real rounds when the tour talks about them. Greedy: the drafter and the model
    then agree often, not always, and the rounds show both accepted and rejected drafts. The tab's own
    speculative setting (its checkbox) is put back afterwards."""
    layer = session.num_layers - 1
    p = dataclasses.replace(tour_params(params, a.get("max_tokens", TOUR_MAX_TOKENS)), temperature=0.0)
    saved = session.speculative
    session.speculative = SpeculativeConfig("early_exit", num_tokens=SPEC_K, exit_layer=layer)
    try:
        apply(session, Add(Request(a["prompt"], a.get("chat", True), a.get("system"), p), focus=True))
    finally:
        session.speculative = saved
    done = len(apply(session, Step(count=a["count"])).value)
    return Phrase("tour_note.speculate", {"p": a["prompt"], "layer": layer, "k": SPEC_K, "done": done})
