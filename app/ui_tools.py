"""The page's tools around the lab: trace export/replay, chart export, the whiteboard calculators, the tour.

Each handler goes through LabHandlers (app/handlers.py) for the tab's session and its Delivery
(app/delivery.py) for payloads, so its charts reach the page the same way a step's do; errors become a message
on the page, never a traceback.
"""
from __future__ import annotations

import html
import threading
import time
from pathlib import Path

import gradio as gr

from engine import SpeculativeConfig
from engine.speculative import compare_with_plain

from . import calculators as calc
from . import render
from .commands import sampling_params
from .delivery import View
from .export import chart_file
from .i18n import Refusal, lang_of, t
from .tour import load_tour, run_action
from .trace import ReplaySession, TraceError, export_trace, load_trace, save_trace
from .session import request_key as _key

MAX_TRACE_BYTES = 64 * 1024 * 1024  # an uploaded trace file (app/trace.py also caps what it unpacks to)
# "Measure speedup" runs two generations on the one compute thread that every tab's steps share: one at a
# time in the whole server, and short, so no visitor's measurement holds everyone else's steps for long.
MEASURE_TOKENS = 32
_measuring = threading.Lock()
PROGRESS_EVERY_S = 0.5  # a long action's status line is redrawn this often


class _Watched:
    """The engine a speed comparison runs on, seen from outside: compare_with_plain starts each of its runs
    (plain, then speculative) as a fresh session of the engine, recorded here so the page can say how far it is."""

    def __init__(self, engine):
        self.engine = engine
        self.runs = []

    def session(self, **overrides):
        run = self.engine.session(**overrides)
        self.runs.append(run)
        return run

    def progress(self) -> tuple[int, int]:
        """(runs started, tokens the current run has generated)."""
        if not self.runs:
            return 0, 0
        run = self.runs[-1]
        made = [len(run.seq_view(sid).output_ids) for sid in run.seq_ids()]
        return len(self.runs), max(made, default=0)


def _last(items):
    """The last item a long action's generator yields: its result."""
    out = None
    for out in items:
        pass
    return out


def _in_background(work, done) -> threading.Thread:
    """`work()` on a thread of its own, its result or exception in dict `done`."""
    def go():
        try:
            done["value"] = work()
        except Exception as exc:  # noqa: BLE001 - handed to the handler, which shows it as a message
            done["error"] = exc

    th = threading.Thread(target=go, daemon=True, name="inferlab-long-action")
    th.start()
    return th


class ToolHandlers:
    def __init__(self, lab):
        self.lab = lab  # LabHandlers: sessions, the model holder
        self.out = lab.delivery  # payloads to the tab's page
        self.tour = load_tour()

    @staticmethod
    def _key(request) -> str:
        return _key(request)

    # ---- trace export / replay --------------------------------------------------------------------
    # Long actions are generators for the page (the status line says what runs, then the result comes); the plain
    # methods return the result alone (scripts, tests)
    def export_trace(self, lang, request: gr.Request = None):
        return _last(self.export_trace_live(lang, request))

    def export_chart(self, chart_id, fmt, lang, layer, head, word, npos, request: gr.Request = None):
        return _last(self.export_chart_live(chart_id, fmt, lang, layer, head, word, npos, request))

    def spec_measure(self, lang, layer, head, word, npos, visible, request: gr.Request = None):
        return _last(self.spec_measure_live(lang, layer, head, word, npos, visible, request))

    def export_trace_live(self, lang, request: gr.Request = None):
        """The status line says what is being written, then the download appears."""
        try:
            s = self.lab._session(request)
            if not s.events:
                raise Refusal("trace_empty")
            yield gr.skip(), self.out.message(t("progress.trace", lang).format(n=len(s.events)))
            with s.lock:
                doc = export_trace(s)
            directory = self.lab.registry.downloads(self._key(request)).folder()
            yield str(save_trace(doc, directory)), self.out.message(t("trace_saved", lang))
        except Exception as exc:  # noqa: BLE001
            yield None, self.out.error(exc, lang)

    def load_trace(self, file, lang, layer, head, word, npos, visible, request: gr.Request = None):
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            path = getattr(file, "name", file)
            if not path:
                raise Refusal("trace_none")
            if Path(path).stat().st_size > MAX_TRACE_BYTES:  # Gradio's max_file_size refuses most before this
                raise Refusal("trace_too_big", n=MAX_TRACE_BYTES // 2**20)
            replay = load_trace(Path(path))
            key = self._key(request)
            self.lab.registry.put(key, replay)
            if self.lab.lecture is not None and self.lab.lecture.is_presenter(key):
                self.lab.lecture.session = replay  # a lecture can run from a recorded trace
            msg = t("trace_loaded", lang).format(n=replay.num_frames, model=replay.model_id)
            self.out.views.of(key).forget_sent()  # a new session: its page redraws everything
            return self.out.payload(replay, view, msg)
        except TraceError as exc:
            return self.out.error(Refusal("trace_bad", detail=exc), lang)
        except Exception as exc:  # noqa: BLE001
            return self.out.error(exc, lang)

    def export_chart_live(self, chart_id, fmt, lang, layer, head, word, npos, request: gr.Request = None):
        """A PNG takes seconds (kaleido starts a Chromium to draw it), so the status line says so
        and counts the seconds until the download appears."""
        try:
            if chart_id not in render.CHART_IDS:
                raise Refusal("export_pick")
            if fmt not in ("png", "html"):
                raise Refusal("bad_format")
            s = self.lab._session(request)
            view = View.parse(lang, layer, head, word, npos)
            with s.lock:
                p = render.build_payload(s, *view.args, self.lab.holder.machine, None, None, only={chart_id})
            folder = self.lab.registry.downloads(self._key(request)).folder()
            name = t(f"chart_name.{chart_id}", lang)
            done, start = {}, time.monotonic()
            worker = _in_background(lambda: chart_file(p["figs"], chart_id, fmt, folder), done)
            while worker.is_alive():
                line = t(f"progress.export_{fmt}", lang).format(name=name, s=int(time.monotonic() - start))
                yield gr.skip(), self.out.message(line)
                worker.join(PROGRESS_EVERY_S)
            if "error" in done:
                raise done["error"]
            path = done["value"]
            yield str(path), self.out.message(t("export_done", lang).format(name=path.name))
        except Exception as exc:  # noqa: BLE001
            yield None, self.out.error(exc, lang)

    # ---- speculative decoding ---------------------------------------------------------------------
    def spec_settings(self, on, method, k, exit_layer, adaptive, lang, request: gr.Request = None):
        """The drafter for the requests this tab starts next (a running request keeps its own)."""
        try:
            s = self.lab._session(request)
            if isinstance(s, ReplaySession):
                return gr.skip()
            if not on:
                s.speculative = None
                return gr.skip()
            method = method or "ngram"
            s.speculative = SpeculativeConfig(
                method, num_tokens=int(k), adaptive=bool(adaptive),
                exit_layer=int(exit_layer) if method == "early_exit" else None,
                draft_model=self.lab.holder.source if method == "draft" else None)
            return gr.skip()
        except Exception as exc:  # noqa: BLE001
            return self.out.error(exc, lang)

    def spec_measure_live(self, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """Run the focused request's prompt plain and with the chosen drafter in fresh sessions; tok/s of each.

        The two runs take seconds (~30 s on a busy 2-core machine), so the status line says which
        run is going and how many of its tokens are done, every PROGRESS_EVERY_S, until the result."""
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self.lab._session(request)
            if isinstance(s, ReplaySession):
                raise Refusal("tour_replay")
            if s.speculative is None:
                raise Refusal("spec_first")
            if s.focus_view() is None:
                raise Refusal("spec_no_prompt")
            req = s.requests[s.focus]
            params = s.focus_view().params
            if not _measuring.acquire(blocking=False):
                raise Refusal("spec_busy")
            n = min(MEASURE_TOKENS, params.max_tokens)
            watched, cfg, done, start = _Watched(s.engine), s.speculative, {}, time.monotonic()

            def measure():
                try:  # released here, not by the handler: a page closed mid-way must not free it early
                    return compare_with_plain(watched, req.token_ids, params, cfg, max_tokens=n)
                finally:
                    _measuring.release()

            worker = _in_background(measure, done)
            while worker.is_alive():
                run, made = watched.progress()
                line = t("progress.spec_spec" if run > 1 else "progress.spec_plain", lang)
                yield self.out.message(line.format(k=min(made, n), n=n, method=t(f"spec_method.{cfg.method}", lang),
                                                   s=int(time.monotonic() - start)))
                worker.join(PROGRESS_EVERY_S)
            if "error" in done:
                raise done["error"]
            cmp = done["value"]
            s.spec_comparison = cmp
            msg = t("spec_measured", lang).format(spec=cmp["speculative"]["tok_s"] or 0,
                                                  plain=cmp["plain"]["tok_s"] or 0, x=cmp["speedup"] or 0,
                                                  same=cmp["same_tokens"])
            yield self.out.payload(s, view, msg)
        except Exception as exc:  # noqa: BLE001
            yield self.out.error(exc, lang)

    # ---- calculators ------------------------------------------------------------------------------
    def live_preset(self):
        base = self.lab.registry.base
        return calc.live_model_preset_from_engine(base) if base is not None else None

    def calculators(self, model, dtype, context, batch, gpu, alpha, k, draft_cost, lang, visible,
                    request: gr.Request = None):
        try:
            p = calc.calculator_payload(model, dtype, context, batch, gpu, alpha, k, draft_cost, lang,
                                        self.live_preset(), self.lab.holder.machine or None)
            p["kind"] = "calc"  # lab.js counts these apart from the lab's own renders (tests wait on those)
            return self.out.deliver(p, self._key(request))
        except Exception as exc:  # noqa: BLE001
            return self.out.error(exc, lang)

    def calc_choices(self, lang, model, gpu):
        """Dropdown choices in the chosen language, with the loaded model and this machine once known."""
        c = calc.choices(lang, self.live_preset(), self.lab.holder.machine or None)
        return (gr.update(choices=c["model"], value=model), gr.update(choices=c["dtype"]),
                gr.update(choices=c["gpu"], value=gpu))

    def calc_ready(self, model, dtype, context, batch, gpu, alpha, k, draft_cost, lang, visible,
                   request: gr.Request = None):
        """Polled until the model is loaded and this machine measured: then the loaded model and this machine
        join the dropdowns, the charts are drawn once and the poll stops."""
        h = self.lab.holder
        if h.error:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        if not h.ready:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=True)
        m, d, g = self.calc_choices(lang, model, gpu)
        return m, d, g, self.calculators(model, dtype, context, batch, gpu, alpha, k, draft_cost, lang, visible,
                                        request), \
            gr.Timer(active=False)

    # ---- guided tour ------------------------------------------------------------------------------
    # three explicit handlers (not functools.partial): Gradio injects `request` only into signatures it reads
    def tour_start(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, layer,
                   head, word, npos, visible, grammar="", request: gr.Request = None):
        return self.tour_step(0, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang,
                              layer, head, word, npos, visible, grammar, request)

    def tour_next(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, layer,
                  head, word, npos, visible, grammar="", request: gr.Request = None):
        return self.tour_step(1, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang,
                              layer, head, word, npos, visible, grammar, request)

    def tour_back(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, layer,
                  head, word, npos, visible, grammar="", request: gr.Request = None):
        return self.tour_step(-1, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang,
                              layer, head, word, npos, visible, grammar, request)

    def tour_step(self, delta, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                  lang, layer, head, word, npos, visible, grammar="", request: gr.Request = None):
        """delta +1: perform the next step's action and show it; -1: show the previous step again (no undo);
        0: restart the tour."""
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self.lab._session(request)
            if isinstance(s, ReplaySession):
                raise Refusal("tour_replay")
            tab = self.out.views.of(s.tab_key)
            new = 0 if delta == 0 else max(0, min(len(self.tour) - 1, tab.tour_pos + delta))
            step = self.tour[new]
            note = None
            if delta >= 0 and (delta == 0 or new != tab.tour_pos):
                params = sampling_params(temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                                         grammar)
                note = run_action(step, s, params)
            tab.tour_pos, tab.tour_note = new, note
            # lab.js scrolls to the panel and outlines it (once per click: "at"); lecture viewers follow along
            s.tour = {"panel": step.panel, "index": new, "at": time.time()}
            out = self.out.build(s, view, note.text(view.lang) if note else "")
            out["tour"] = s.tour
            return self.out.deliver(out, s.tab_key), self._tour_card(new, note, view.lang)
        except Exception as exc:  # noqa: BLE001
            return self.out.error(exc, lang), gr.skip()

    def tour_box(self, lang, request: gr.Request = None):
        """The tour card in the page's new language: the step it shows, with the note on what that step ran."""
        key = self._key(request)
        tab = self.out.views.of(key) if self.lab.registry.peek(key) is not None else None
        if tab is None or tab.tour_pos < 0:
            return f'<p class="il-tour-intro">{html.escape(t("tour_intro", lang))}</p>'
        return self._tour_card(tab.tour_pos, tab.tour_note, lang)

    def _tour_card(self, pos: int, note, lang: str) -> str:
        step, lang = self.tour[pos], lang_of(lang)
        return (f'<div class="il-tour-step"><div class="il-tour-count">{pos + 1} / {len(self.tour)}</div>'
                f'<h4>{html.escape(step.title[lang])}</h4><p>{html.escape(step.text[lang])}</p>'
                f'<p class="il-tour-note">{html.escape(note.text(lang) if note else "")}</p></div>')

