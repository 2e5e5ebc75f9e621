"""The Gradio page: controls on the left, the eight stage panels on the right.

Charts are not Gradio components: each handler returns one JSON payload (app/render.py) into a hidden
textbox, and a client-side listener draws it with Plotly.react into persistent divs, so user zoom survives
every step (gr.Plot would rebuild the figure and lose it).
"""
from __future__ import annotations

import html
import json
import logging
import time
import traceback

import gradio as gr

from engine import SamplingParams, StepFailed
from engine.scheduler import Status

from . import calculators as calc
from . import render
from .i18n import EXAMPLES, PANELS, UI, t
from .live import Hub, Lecture
from .session import (MAX_STOP_CHARS, MAX_VIEW_CHARS, MAX_WORD_CHARS, LabFull, SessionRegistry, cap_text,
                      request_key as _key)
from .trace import ReplaySession
from .ui_tools import ToolHandlers

log = logging.getLogger("inferlab")

RENDER_JS = "(payload) => { if (window.inferlab) { window.inferlab.render(payload); } return []; }"
SLIDERS = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
           "presence_penalty"]


def calc_header_html(lang: str) -> str:
    text = calc.CALC_TEXT
    return (f'<h3 id="html-title-calculators">{html.escape(text["title"][lang])}</h3>'
            f'<p class="il-explain">{html.escape(text["text"][lang])}</p>')


def calc_charts_html() -> str:
    divs = "".join(f'<div id="{hid}" class="il-html {hid}"></div>' for hid in calc.HTML_IDS)
    charts = "".join(f'<div id="{cid}" class="il-chart {cid}"></div>' for cid in calc.CHART_IDS)
    return f'{divs}<div class="il-charts il-calc-charts">{charts}</div>'


def panels_html() -> str:
    """The static skeleton: one section per stage with its chart containers (filled by lab.js)."""
    parts = ['<div id="html-pipeline" class="il-pipeline"></div>', '<div id="html-message"></div>',
             '<div class="il-panels">']
    for key, title, text in PANELS:
        wide = "" if key in ("logits", "sampling") else " il-wide"
        parts.append(f'<section class="il-panel{wide}" id="panel-{key}">')
        parts.append(f'<h3 id="html-title-{key}">{html.escape(title["en"])}</h3>')
        parts.append(f'<p class="il-explain" id="html-text-{key}">{html.escape(text["en"])}</p>')
        for hid in render.PANEL_HTML.get(key, []):
            parts.append(f'<div id="{hid}" class="il-html {hid}"></div>')
        parts.append('<div class="il-charts">')
        for cid in render.PANEL_CHARTS[key]:
            parts.append(f'<div id="{cid}" class="il-chart {cid}"></div>')
        parts.append("</div></section>")
    parts.append("</div>")
    return "".join(parts)


class LabHandlers:
    """Gradio callbacks. Every one returns a payload; errors become a message, never a traceback."""

    def __init__(self, registry: SessionRegistry, holder, hub: Hub | None = None, lecture: Lecture | None = None):
        self.registry = registry
        self.holder = holder  # model loading status: .ready, .progress, .message, .error, .machine
        self.hub = hub  # websocket channels: this tab's payloads, lecture viewers
        self.lecture = lecture

    # ---- helpers ----------------------------------------------------------------------------------
    def _session(self, request: gr.Request):
        return self.registry.get(_key(request))

    def _payload(self, s, view, message="", kind="info", what_if=None, op=None):
        """Build and deliver. `op` tags the payload with what caused it (lab.js counts "step" payloads: tests wait
        for the one their click caused, since a view refresh is a render too)."""
        p = self._payload_dict(s, view, message, kind, what_if)
        if op:
            p["op"] = op
        near = _near_set(view[-1])
        if near and self.hub is not None and self.hub.has_tab(s.tab_key):
            # charts just outside the screen follow in a second payload: the screen is updated first
            p["stale"] = [c for c in p.get("stale", []) if c not in near]
            out = self._deliver(p, s.tab_key)
            rest = render.build_payload(s, *_view_args(view), self.holder.machine, what_if, only=near)
            self._deliver(_drop_unchanged(s, {"figs": rest["figs"]}), s.tab_key)
            return out
        return self._deliver(p, s.tab_key)

    def _payload_dict(self, s, view, message="", kind="info", what_if=None) -> dict:
        lang, layer, head, word, npos = _view_args(view)
        p = render.build_payload(s, lang, layer, head, word, npos, self.holder.machine, what_if, message, kind,
                                 only=_visible_set(view[-1]))
        # the template, BPE trace and panel texts rarely change: send an HTML piece only when it differs from
        # what this tab already shows (a step's latency grows with its payload). The message line is always
        # sent: error and what-if payloads change it without passing through here, so the record of what the
        # page shows would be wrong for it (an error banner stayed after the next good step).
        p["html"] = {k: v for k, v in p["html"].items() if k == "html-message" or s.sent_html.get(k) != v}
        s.sent_html.update(p["html"])
        _drop_unchanged(s, p)
        if self.lecture is not None:
            self.lecture.changed(s, (lang, layer, head, word, npos))
        return p

    def _deliver(self, p: dict, key: str | None):
        """Over the websocket of the tab whose session is `key` when it has one (fast), else as the payload
        component's new value. The tab is the server's own record, never a name the client sent."""
        p["t"] = time.time()
        if key and self.hub is not None and self.hub.push_tab(key, p):
            return gr.skip()
        return render.dumps(p)

    def _error(self, exc: Exception, lang: str, op: str | None = None) -> str:
        lang = "ru" if lang == "ru" else "en"  # the failure may be the language value itself
        if isinstance(exc, LabFull):
            text, kind = t("lab_full", lang).format(n=self.registry.max_sessions), "warn"
        elif isinstance(exc, ValueError):
            text, kind = str(exc), "error"
        elif isinstance(exc, RuntimeError) and "loading" in str(exc):
            # no live session: either the model is still loading or it failed to (then say why; a trace still works)
            text, kind = (f"{self.holder.error}. {t('trace_hint', lang)}", "error") if self.holder.error else \
                (t("loading", lang), "warn")
        elif isinstance(exc, StepFailed):  # the engine undid the step: the session is as before, truly
            log.warning("step failed and was undone: %s", exc.__cause__ or exc)
            cause = exc.__cause__ or exc
            text, kind = t("step_failed", lang).format(cause=f"{type(cause).__name__}: {cause}"[:300]), "error"
        else:
            log.error("handler failed:\n%s", traceback.format_exc())
            text, kind = t("failed", lang).format(cause=f"{type(exc).__name__}: {exc}"[:300]), "error"
        p = {"figs": {}, "html": {"html-message": render.message_html(text, kind)}, "t": time.time()}
        if op:
            p["op"] = op
        return render.dumps(p)

    @staticmethod
    def params(temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop) -> SamplingParams:
        stop = cap_text("stop strings", stop, MAX_STOP_CHARS)
        stops = tuple(x for x in (stop or "").split(",") if x.strip()) if stop else ()
        stops = tuple(x.replace("\\n", "\n") for x in stops)
        seed = None if seed in (None, "") else int(seed)
        top_k = int(top_k) if top_k is not None and float(top_k).is_integer() else top_k
        max_tokens = int(max_tokens) if max_tokens is not None and float(max_tokens).is_integer() else max_tokens
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                              min_p=min_p, repetition_penalty=rep, frequency_penalty=freq,
                              presence_penalty=pres, seed=seed, stop=stops)

    def _start_or_update(self, s, prompt, chat, system, sampling_args) -> None:
        """Nothing running: the prompt box starts a new request. Otherwise the sliders apply from this step."""
        if isinstance(s, ReplaySession):
            return  # a replay's Step shows the next recorded frame; the controls cannot change the past
        params = self.params(*sampling_args)
        if not s.engine.has_unfinished():
            s.add_request(prompt, params, chat, system)
        else:
            s.updated_params(params)

    # ---- callbacks --------------------------------------------------------------------------------
    def step(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
             lang, layer, head, word, npos, visible, request: gr.Request = None):
        # explicit parameters (no *args): Gradio injects `request` only into signatures it can read
        sampling_args = (temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop)
        view = (lang, layer, head, word, npos, visible)
        try:
            _view_args(view)  # the view's inputs (the word box) are capped before any engine work
            s = self._session(request)
            with s.lock:
                self._start_or_update(s, prompt, chat, system, sampling_args)
                s.step()
                return self._payload(s, view, *self._status(s, lang), op="step")
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message on the page
            return self._error(exc, lang, op="step")

    def step_with_choices(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed,
                          max_tokens, stop, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """Step, plus the sequence dropdown's update (gr.skip when unchanged) in the same Gradio event."""
        out = self.step(prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens,
                        stop, lang, layer, head, word, npos, visible, request=request)
        return out, self.seq_choices(request)

    # ---- Step over the tab's own websocket ----------------------------------------------------------
    STEP_FIELDS = ("prompt", "chat", "system", "temperature", "top_k", "top_p", "min_p", "rep", "freq", "pres",
                   "seed", "max_tokens", "stop", "lang", "layer", "head", "word", "npos", "visible")

    def hello(self, lang, request: gr.Request = None):
        """On page load: the tab's socket ticket (lab.js opens /ws/lab with it), and its session when the model
        is ready, so a full lab says so at once instead of on the first Step."""
        key = _key(request)
        try:
            ticket = self.registry.ticket(key)
            if self.holder.ready:
                self.registry.get(key)
            return ticket, gr.skip()
        except Exception as exc:  # noqa: BLE001 - the lab is full, or the tab was closed
            return gr.skip(), self._error(exc, lang)

    def tab_message(self, key: str, data: str) -> None:
        """A message from a tab's websocket (app/live.py), whose session `key` the server tied to it by ticket.
        {"op": "step", "inputs": {STEP_FIELDS...}} runs exactly the Gradio Step handler on that session; the
        payload comes back on the same socket. A socket never creates a session (a Step queued behind the
        tab's close must not bring it back)."""
        lang = "en"
        try:
            msg = json.loads(data)
            if not isinstance(msg, dict) or msg.get("op") != "step":
                raise ValueError("this socket only takes {\"op\": \"step\", \"inputs\": {...}}")
            inputs = msg.get("inputs") if isinstance(msg.get("inputs"), dict) else {}
            args = _step_inputs(inputs)
            lang = args["lang"]
            if self.registry.peek(key) is None:
                raise ValueError(t("no_session", lang))
        except Exception as exc:  # noqa: BLE001 - a malformed message is answered, never raised into the socket
            self.hub.push_tab(key, json.loads(self._error(ValueError(str(exc)), lang, op="step")))
            if self.registry.peek(key) is None:
                self.hub.send_tab(key, {"type": "unbound"})  # the page's next Step goes through Gradio
            return
        out = self.step(**args, request=_TabRequest(key))
        if isinstance(out, str):  # an error payload (or no channel to push on): send it on this socket
            self.hub.push_tab(key, json.loads(out))
        s = self.registry.peek(key)
        if s is not None and s.sent_html.get("_focus_choices") != self._choices(s):
            # the list of sequences changed: the dropdown is a Gradio control, updated by a Gradio event
            self.hub.send_tab(key, {"type": "sync", "what": "choices"})

    def add(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
             lang, layer, head, word, npos, visible, request: gr.Request = None):
        # explicit parameters (no *args): Gradio injects `request` only into signatures it can read
        sampling_args = (temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop)
        view = (lang, layer, head, word, npos, visible)
        try:
            _view_args(view)  # the view's inputs (the word box) are capped before any engine work
            s = self._session(request)
            rid = s.add_request(prompt, self.params(*sampling_args), chat, system)
            msg = {"en": f"Request #{rid} queued: press Step to watch it join the batch.",
                   "ru": f"Запрос №{rid} в очереди: нажмите «Шаг», чтобы он вошёл в батч."}[lang]
            return self._payload(s, view, msg)
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def run(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
             lang, layer, head, word, npos, visible, request: gr.Request = None):
        # explicit parameters (no *args): Gradio injects `request` only into signatures it can read
        sampling_args = (temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop)
        view = (lang, layer, head, word, npos, visible)
        try:
            _view_args(view)  # the view's inputs (the word box) are capped before any engine work
            s = self._session(request)
            with s.lock:
                self._start_or_update(s, prompt, chat, system, sampling_args)
            s.running = True
            while s.running and s.has_unfinished():
                with s.lock:
                    s.step()
                yield self._payload(s, view, *self._status(s, lang))
            s.running = False
        except Exception as exc:  # noqa: BLE001
            yield self._error(exc, lang)

    def pause(self, request: gr.Request = None):
        try:
            self._session(request).running = False
        except Exception:  # noqa: BLE001 - pausing a session that is still loading is a no-op
            pass

    def reset(self, lang, visible="", request: gr.Request = None):
        try:
            key = _key(request)
            s = self.registry.renew(key)
            if self.lecture is not None and self.lecture.is_presenter(key):
                self.lecture.session = s  # the viewers follow the fresh session
            return self._payload(s, (lang, 0, 0, "", None, visible), "")
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def what_if(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, visible="",
                request: gr.Request = None):
        sampling_args = (temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop)
        try:
            s = self._session(request)
            if isinstance(s, ReplaySession):
                return gr.skip()  # a recorded trace keeps its recorded sampling
            if s.focus is None or s.engine.sequences[s.focus].last_sampling is None:
                return gr.skip()  # nothing sampled yet: the sliders simply apply to the first step
            params = self.params(*sampling_args)
            if _same_chain(params, s.engine.sequences[s.focus].params):
                # the sliders equal what the last step sampled with: a Step (over the websocket, faster than
                # this event) already applied them, or the user moved a slider back. That is no what-if.
                s.what_if = None
                return self._deliver(_drop_unchanged(s, render.chain_payload(s, lang, *self._status(s, lang))),
                                     s.tab_key)
            trace = s.engine.what_if(s.focus, params)
            s.what_if = trace
            return self._deliver(_drop_unchanged(s, render.what_if_payload(s, trace, lang)), s.tab_key)
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def view(self, lang, layer, head, word, npos, visible, request: gr.Request = None):
        try:
            s = self._session(request)
            with s.lock:  # renders of one tab may now run beside its steps: read its events whole
                return self._payload(s, (lang, layer, head, word, npos, visible), message=None)
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def focus(self, seq_label, lang, layer, head, word, npos, visible, request: gr.Request = None):
        try:
            s = self._session(request)
            if seq_label:
                sid = int(str(seq_label).split()[0].lstrip("#"))
                if sid in s.requests and sid != s.focus:
                    s.focus, s.what_if = sid, None  # a what-if belongs to the sequence it was made for
            return self._payload(s, (lang, layer, head, word, npos, visible))
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def force(self, token_id, lang, layer, head, word, npos, visible, request: gr.Request = None):
        view = (lang, layer, head, word, npos, visible)
        try:
            s = self._session(request)
            if s.focus is None:
                raise ValueError("start a sequence first (press Step)")
            if token_id in (None, ""):
                raise ValueError("token_id: enter a vocabulary id (click a bar in the logits chart)")
            s.engine.force_token(s.focus, int(token_id))
            text = s.engine.token_text(int(token_id))
            msg = {"en": f"Token {int(token_id)} ({text!r}) will be forced at the next step.",
                   "ru": f"Токен {int(token_id)} ({text!r}) будет навязан на следующем шаге."}[lang]
            return self._payload(s, view, msg)
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def rewind(self, n, branch, lang, layer, head, word, npos, visible, request: gr.Request = None):
        view = (lang, layer, head, word, npos, visible)
        try:
            s = self._session(request)
            if s.focus is None:
                raise ValueError("start a sequence first (press Step)")
            if n in (None, ""):
                raise ValueError("position: enter how many generated tokens to keep")
            n = int(n)
            if branch:
                parent = s.requests[s.focus]
                rid = s.engine.branch(s.focus, n)
                s.requests[rid] = type(parent)(rid, parent.prompt, parent.chat, parent.system, parent.text,
                                               parent.spans, parent.token_ids)
                s.focus = rid
                msg = f"Branch #{rid} keeps {n} generated tokens and shares their KV blocks."
            else:
                s.engine.rewind(s.focus, n)
                msg = f"Rewound #{s.focus} to {n} generated tokens; later KV slots were released."
            return self._payload(s, view, msg)
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def present(self, token, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """Claim lecture mode with the presenter token: viewers at /follow then see this tab's session."""
        try:
            if self.hub is None or self.lecture is None:
                raise ValueError("lecture mode is not available in this server")
            try:
                self.hub.check_token(token, _address(request))
            except ValueError as exc:  # a wrong token, or too many of them from this address
                raise ValueError(t("bad_token", lang) if str(exc) == "wrong presenter token" else str(exc)) from None
            key = _key(request)
            s = self._session(request)
            view = (lang, layer, head, word, npos, visible)
            self.lecture.start(key, s, _view_args(view))
            return self._payload(s, view, t("presenting", lang))
        except Exception as exc:  # noqa: BLE001
            return self._error(exc, lang)

    def stop_presenting(self, lang, request: gr.Request = None):
        key = _key(request)
        if self.lecture is not None and self.lecture.is_presenter(key):
            self.lecture.stop()
        return render.dumps({"figs": {}, "html": {"html-message": render.message_html(t("not_presenting", lang))},
                             "t": time.time()})

    def lecture_status(self, lang, request: gr.Request = None):
        """Who presents and how many follow, for the lecture box (polled by the page's timer)."""
        if self.hub is None:
            return ""
        key = _key(request)
        me = self.lecture is not None and self.lecture.is_presenter(key)
        state = t("you_present", lang) if me else (t("other_presents", lang) if self.hub.presenter else
                                                   t("nobody_presents", lang))
        return (f'<div class="il-lecture-status">{html.escape(state)} · '
                f'{html.escape(t("viewers", lang))}: <b id="viewer-count">{self.hub.viewer_count}</b> · '
                f'<a href="/follow" target="_blank">/follow</a></div>')

    def status(self, lang):
        """Model loading progress while it loads; then the model's name (and the sliders' true ranges)."""
        h = self.holder
        if h.error:
            return (f'<div class="il-msg il-msg-error">{html.escape(h.error)}</div>', gr.Timer(active=False),
                    gr.update(), gr.update())
        if not h.ready:
            pct = int(100 * h.progress)
            return (f'<div class="il-loading"><progress max="100" value="{pct}"></progress> '
                    f'{html.escape(t("loading", lang))} {html.escape(h.message)}</div>', gr.Timer(active=True),
                    gr.update(), gr.update())
        return (f'<div class="il-ready">✓ {html.escape(t("ready", lang))}: {html.escape(h.model_id)} · '
                f'{html.escape(h.device)}</div>', gr.Timer(active=False),
                gr.update(maximum=h.spec.num_layers - 1), gr.update(maximum=h.spec.num_heads - 1))

    @staticmethod
    def _choices(s) -> tuple[list[str], str | None]:
        """The sequence dropdown's choices and value; the page shows s.sent_html["_focus_choices"]."""
        labels = [f"#{sid} · {s.seq_status(sid)}" for sid in s.seq_ids() if s.has_seq(sid)]
        value = next((x for x in labels if s.focus is not None and x.startswith(f"#{s.focus} ")), None)
        return labels, value

    def seq_choices(self, request: gr.Request = None):
        """The sequence dropdown; untouched (gr.skip) unless a sequence appeared, finished or the focus moved."""
        try:
            s = self._session(request)
        except Exception:  # noqa: BLE001
            return gr.skip()
        labels, value = self._choices(s)
        if s.sent_html.get("_focus_choices") == (labels, value):
            return gr.skip()
        s.sent_html["_focus_choices"] = (labels, value)
        return gr.update(choices=labels, value=value)

    def _status(self, s, lang):
        if isinstance(s, ReplaySession):
            return t("replay_pos", lang).format(pos=s.position, n=s.num_frames), "info"
        if s.has_unfinished():
            return "", "info"
        if s.focus is not None and s.engine.sequences[s.focus].status is Status.FINISHED:
            return t("finished", lang), "info"
        return "", "info"

    def relabel(self, lang):
        """Labels of every control in the chosen language."""
        keys = ["prompt", "chat", "system", *SLIDERS, "seed", "max_tokens", "stop", "focus", "layer", "head",
                "force", "rewind", "word", "neighbour"]
        buttons = ["step", "run", "pause", "reset", "add", "force_btn", "rewind_btn"]
        return ([gr.update(label=t(k, lang)) for k in keys] + [gr.update(value=t(b, lang)) for b in buttons]
                + [gr.update(label=t("branch_btn", lang)), gr.update(samples=[[e] for e in EXAMPLES[lang]])]
                + [gr.update(label=t("lecture", lang)), gr.update(label=t("token", lang)),
                   gr.update(value=t("present", lang)), gr.update(value=t("unpresent", lang))])


def _drop_unchanged(s, p: dict) -> dict:
    """Keep in payload `p` only the figures that differ from what this tab last got (recorded in s.sent_figs);
    the ids of the equal ones go to p["same"], where the page clears their stale mark (lab.js).

    Plotly.react redraws a whole chart for every new figure object, even an equal one (20-40 ms for a chart
    here): a chart that did not change (the speculative panel while speculation is off, the neighbours of a
    pinned token position, a what-if equal to the one shown) is not resent. Figures are plain JSON-ready
    values, never mutated once built, so comparing them with == is exact and cheaper than encoding them."""
    figs, same = {}, []
    for cid, fig in p.get("figs", {}).items():
        if s.sent_figs.get(cid) == fig:
            same.append(cid)
        else:
            figs[cid] = s.sent_figs[cid] = fig
    p["figs"], p["same"] = figs, same
    return p


def _view_args(view) -> tuple:
    """(lang, layer, head, word, neighbour position) from a handler's view inputs, typed for build_payload."""
    lang, layer, head, word, npos, _ = view
    word = cap_text("word", word, MAX_WORD_CHARS)
    npos = None if npos in (None, "") or int(npos) < 0 else int(npos)
    return lang, int(layer or 0), int(head or 0), word or "", npos


def _view_state(visible):
    """lab.js writes {"client": its websocket id, "ids": chart ids in view} (a bare list in older pages)."""
    if not visible or not isinstance(visible, str) or len(visible) > MAX_VIEW_CHARS:
        return None  # a view state this long is not lab.js's: build everything, as before its first report
    try:
        return json.loads(visible)
    except ValueError:
        return None


CHAIN_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                "presence_penalty")


def _same_chain(a: SamplingParams, b: SamplingParams) -> bool:
    """Whether two parameter sets run the same sampling chain on the same logits (seed, max tokens and stop
    strings do not change a step's chain)."""
    return all(getattr(a, f) == getattr(b, f) for f in CHAIN_FIELDS)


class _TabRequest:
    """What the handlers read from a gr.Request, for a Step that came over the tab's websocket."""

    def __init__(self, session_hash: str):
        self.session_hash = session_hash


def _number(name: str, value, integer: bool = False, optional: bool = False):
    if value in (None, "") and optional:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {str(value)[:20]!r}") from None
    if integer:
        if not x.is_integer():
            raise ValueError(f"{name} must be a whole number, not {value}")
        return int(x)
    return x


def _step_inputs(inputs: dict) -> dict:
    """The Step handler's arguments from the values lab.js read off the page's controls, typed as Gradio
    would pass them (numbers as numbers, an empty number box as None)."""
    get = inputs.get
    lang = get("lang") if get("lang") in ("en", "ru") else "en"
    return {"prompt": str(get("prompt") or ""), "chat": get("chat", True) in (True, "true", "True", 1, "1"), "system": str(get("system") or ""),
            "temperature": _number("temperature", get("temperature")), "top_k": _number("top_k", get("top_k")),
            "top_p": _number("top_p", get("top_p")), "min_p": _number("min_p", get("min_p")),
            "rep": _number("repetition penalty", get("rep")), "freq": _number("frequency penalty", get("freq")),
            "pres": _number("presence penalty", get("pres")),
            "seed": _number("seed", get("seed"), integer=True, optional=True),
            "max_tokens": _number("max tokens", get("max_tokens"), integer=True, optional=True),
            "stop": str(get("stop") or ""), "lang": lang,
            "layer": _number("layer", get("layer") or 0, integer=True),
            "head": _number("head", get("head") or 0, integer=True), "word": str(get("word") or ""),
            "npos": _number("position", get("npos"), integer=True, optional=True),
            "visible": str(get("visible") or "")}


def _visible_set(visible) -> set[str] | None:
    """The chart ids lab.js reported in view; None (build everything) when it has not reported yet."""
    state = _view_state(visible)
    ids = state.get("ids") if isinstance(state, dict) else state
    return {i for i in ids if i in render.CHART_IDS} if isinstance(ids, list) else None


def _near_set(visible) -> set[str]:
    """Chart ids lab.js reported just outside the screen (sent after those on it); only Step reports them."""
    state = _view_state(visible)
    near = state.get("near") if isinstance(state, dict) else None
    return {i for i in near if i in render.CHART_IDS} if isinstance(near, list) else set()


def _address(request) -> str | None:
    """The visitor's address for rate limits: the first X-Forwarded-For hop behind a proxy (a Space), else the
    peer. A forged header only changes which bucket a guess lands in; TokenGuard's overall limit still holds."""
    headers = getattr(request, "headers", None) or {}
    forwarded = headers.get("x-forwarded-for") if hasattr(headers, "get") else None
    if forwarded:
        return forwarded.split(",")[0].strip()[:64]
    return getattr(getattr(request, "client", None), "host", None)


def build_demo(registry: SessionRegistry, holder, hub: Hub | None = None, lecture: Lecture | None = None) -> gr.Blocks:
    h = LabHandlers(registry, holder, hub, lecture)
    # delete_cache: Gradio keeps a copy of every download and upload in its cache; files older than 15 min go
    # (checked every 5 min), so a room's exports and uploaded traces cannot fill the disk
    with gr.Blocks(title="InferLab", delete_cache=(300, 900)) as demo:
        with gr.Row(elem_classes="il-header"):
            gr.HTML(f'<h1 class="il-title">{html.escape(UI["title"]["en"])}</h1>'
                    f'<p class="il-sub">{html.escape(UI["subtitle"]["en"])}</p>', elem_id="il-title")
            lang = gr.Radio(["en", "ru"], value="en", label=t("language", "en"), elem_id="lang", scale=0,
                            min_width=140)
        status = gr.HTML(elem_id="model-status")
        timer = gr.Timer(0.5)
        with gr.Row():
            with gr.Column(scale=1, min_width=300, elem_classes="il-controls"):
                with gr.Accordion(t("tour", "en"), open=False, elem_id="tour") as tour_acc:
                    tour_box = gr.HTML(f'<p class="il-tour-intro">{html.escape(t("tour_intro", "en"))}</p>',
                                       elem_id="tour-box")
                    with gr.Row():
                        tour_start = gr.Button(t("tour_start", "en"), elem_id="tour_start", size="sm")
                        tour_back = gr.Button(t("tour_back", "en"), elem_id="tour_back", size="sm")
                        tour_next = gr.Button(t("tour_next", "en"), elem_id="tour_next", size="sm",
                                              variant="primary")
                prompt = gr.Textbox(value="Что такое гравитация?", label=t("prompt", "en"), lines=3,
                                    elem_id="prompt")
                examples = gr.Dataset(components=[prompt], samples=[[e] for e in EXAMPLES["en"] + EXAMPLES["ru"][:2]],
                                      label=t("examples", "en"), elem_id="examples")
                chat = gr.Checkbox(value=True, label=t("chat", "en"), elem_id="chat")
                system = gr.Textbox(value="", label=t("system", "en"), lines=1, elem_id="system")
                with gr.Row():
                    step_btn = gr.Button(t("step", "en"), variant="primary", elem_id="step")
                    run_btn = gr.Button(t("run", "en"), elem_id="run")
                    pause_btn = gr.Button(t("pause", "en"), elem_id="pause")
                    reset_btn = gr.Button(t("reset", "en"), variant="stop", elem_id="reset")
                add_btn = gr.Button(t("add", "en"), elem_id="add_request", size="sm")
                with gr.Accordion(t("spec_box", "en"), open=False, elem_id="speculative") as spec_acc:
                    spec_on = gr.Checkbox(value=False, label=t("spec_on", "en"), elem_id="spec_on")
                    spec_method = gr.Radio(["ngram", "early_exit", "draft"], value="ngram",
                                           label=t("spec_method", "en"), elem_id="spec_method")
                    with gr.Row():
                        spec_k = gr.Slider(1, 8, value=4, step=1, label=t("spec_k", "en"), elem_id="spec_k")
                        # SmolLM2 was not trained for early exit: only its last layers agree with the full model
                        spec_exit = gr.Slider(1, 29, value=29, step=1, label=t("spec_exit", "en"),
                                              elem_id="spec_exit")
                    spec_adaptive = gr.Checkbox(value=False, label=t("spec_adaptive", "en"), elem_id="spec_adaptive")
                    spec_measure = gr.Button(t("spec_measure", "en"), elem_id="spec_measure", size="sm")
                temperature = gr.Slider(0, 2, value=0.7, step=0.05, label=t("temperature", "en"), elem_id="temperature")
                top_k = gr.Slider(0, 200, value=0, step=1, label=t("top_k", "en"), elem_id="top_k")
                top_p = gr.Slider(0.01, 1, value=1.0, step=0.01, label=t("top_p", "en"), elem_id="top_p")
                min_p = gr.Slider(0, 1, value=0.0, step=0.01, label=t("min_p", "en"), elem_id="min_p")
                rep = gr.Slider(0.5, 2, value=1.0, step=0.05, label=t("repetition_penalty", "en"),
                                elem_id="repetition_penalty")
                freq = gr.Slider(-2, 2, value=0.0, step=0.1, label=t("frequency_penalty", "en"),
                                 elem_id="frequency_penalty")
                pres = gr.Slider(-2, 2, value=0.0, step=0.1, label=t("presence_penalty", "en"),
                                 elem_id="presence_penalty")
                with gr.Row():
                    seed = gr.Number(value=0, precision=0, label=t("seed", "en"), elem_id="seed")
                    max_tokens = gr.Number(value=64, precision=0, label=t("max_tokens", "en"), elem_id="max_tokens")
                stop = gr.Textbox(value="", label=t("stop", "en"), elem_id="stop")
                focus = gr.Dropdown(choices=[], label=t("focus", "en"), elem_id="focus", allow_custom_value=True)
                with gr.Row():
                    layer = gr.Slider(0, 29, value=0, step=1, label=t("layer", "en"), elem_id="layer")
                    head = gr.Slider(0, 8, value=0, step=1, label=t("head", "en"), elem_id="head")
                with gr.Row():
                    force_id = gr.Number(value=None, precision=0, label=t("force", "en"), elem_id="force_id")
                    force_btn = gr.Button(t("force_btn", "en"), elem_id="force", size="sm")
                with gr.Row():
                    rewind_n = gr.Number(value=None, precision=0, label=t("rewind", "en"), elem_id="rewind_n")
                    branch = gr.Checkbox(value=False, label=t("branch_btn", "en"), elem_id="branch")
                    rewind_btn = gr.Button(t("rewind_btn", "en"), elem_id="rewind", size="sm")
                word = gr.Textbox(value="", label=t("word", "en"), elem_id="bpe_word")
                npos = gr.Number(value=-1, precision=0, label=t("neighbour", "en"), elem_id="neighbour_pos")
                with gr.Accordion(t("lecture", "en"), open=False, elem_id="lecture") as lecture_box:
                    lecture_info = gr.HTML(elem_id="lecture-status")
                    token = gr.Textbox(value="", type="password", label=t("token", "en"), elem_id="presenter_token")
                    with gr.Row():
                        present_btn = gr.Button(t("present", "en"), elem_id="present", size="sm")
                        unpresent_btn = gr.Button(t("unpresent", "en"), elem_id="unpresent", size="sm")
                with gr.Accordion(t("trace_box", "en"), open=False, elem_id="trace") as trace_acc:
                    with gr.Row():
                        trace_export = gr.Button(t("trace_export", "en"), elem_id="trace_export", size="sm")
                        trace_load = gr.UploadButton(t("trace_load", "en"), file_types=[".json", ".gz"],
                                                     elem_id="trace_load", size="sm")
                    with gr.Row():
                        export_chart = gr.Dropdown(render.CHART_IDS, value="chart-logits", label=t("chart", "en"),
                                                   elem_id="export_chart")
                        export_fmt = gr.Radio(["png", "html"], value="png", label=t("format", "en"),
                                              elem_id="export_fmt")
                    export_btn = gr.Button(t("export_btn", "en"), elem_id="export_btn", size="sm")
                    download = gr.File(label=t("download", "en"), elem_id="download", interactive=False)
            with gr.Column(scale=3, elem_classes="il-main"):
                gr.HTML(panels_html(), elem_id="panels")
                # the whiteboard calculators: their own inputs, charts drawn by lab.js like every panel's
                with gr.Group(elem_id="panel-calculators", elem_classes="il-calc"):
                    calc_head = gr.HTML(calc_header_html("en"), elem_id="calc-head")
                    cc = calc.choices("en", None, None)
                    d = calc.DEFAULTS
                    L = calc.CALC_TEXT["labels"]
                    with gr.Row():
                        c_model = gr.Dropdown(cc["model"], value=d["model"], label=L["model"]["en"],
                                              elem_id="calc_model", allow_custom_value=True)
                        c_dtype = gr.Dropdown(cc["dtype"], value=d["dtype"], label=L["dtype"]["en"],
                                              elem_id="calc_dtype")
                        c_gpu = gr.Dropdown(cc["gpu"], value=d["gpu"], label=L["gpu"]["en"], elem_id="calc_gpu",
                                            allow_custom_value=True)
                    with gr.Row():
                        c_context = gr.Number(value=d["context"], precision=0, label=L["context"]["en"],
                                              elem_id="calc_context")
                        c_batch = gr.Number(value=d["batch"], precision=0, label=L["batch"]["en"],
                                            elem_id="calc_batch")
                    with gr.Row():
                        c_alpha = gr.Slider(0, 1, value=d["alpha"], step=0.01, label=L["alpha"]["en"],
                                            elem_id="calc_alpha")
                        c_k = gr.Slider(1, 16, value=d["k"], step=1, label=L["k"]["en"], elem_id="calc_k")
                        c_cost = gr.Slider(0, 1, value=d["draft_cost"], step=0.01, label=L["draft_cost"]["en"],
                                           elem_id="calc_draft_cost")
                    gr.HTML(calc_charts_html(), elem_id="calc-charts")
        payload = gr.Textbox(visible=False, elem_id="payload")
        # set by lab.js: the chart containers in view (only those are built and sent); rendered but hidden
        # with CSS because Gradio drops invisible components from the DOM, where the script writes to them
        visible = gr.Textbox(value="", elem_id="visible", elem_classes="il-hidden", container=False)
        refresh = gr.Button("refresh", elem_id="refresh", elem_classes="il-hidden")
        # a Step that came over the websocket cannot update a Gradio control: lab.js clicks this when the list
        # of sequences changed
        sync_choices = gr.Button("sync", elem_id="sync_choices", elem_classes="il-hidden")
        # the tab's socket ticket (a server-made secret, see SessionRegistry.ticket), handed to lab.js
        ticket = gr.Textbox(value="", elem_id="tab_ticket", elem_classes="il-hidden", container=False)

        sampling_inputs = [temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop]
        view_inputs = [lang, layer, head, word, npos, visible]
        full = [prompt, chat, system, *sampling_inputs, *view_inputs]

        payload.change(None, [payload], None, js=RENDER_JS)
        # every click is one step: the payload arrives over the websocket before Gradio finishes the event and
        # its .then(), so the default trigger_mode ("once") would drop a quick second click
        # the sequence list rides on the step's own event: a chained .then() would be a second round trip that
        # competes with the browser drawing the step's charts
        step_btn.click(h.step_with_choices, full, [payload, focus], concurrency_limit=None, show_progress="hidden",
                       trigger_mode="multiple")
        # no per-listener limit on Run: with Gradio's default of 1, one visitor's Run held every other visitor's
        # Run in the queue until it finished; the engine's steps interleave on the compute thread anyway
        run_ev = run_btn.click(h.run, full, payload, show_progress="hidden", concurrency_limit=None)
        run_ev.then(h.seq_choices, None, focus, show_progress="hidden")
        pause_btn.click(h.pause, None, None, cancels=[run_ev], queue=False)
        add_btn.click(h.add, full, payload, show_progress="hidden").then(h.seq_choices, None, focus)
        reset_btn.click(h.reset, [lang, visible], payload, cancels=[run_ev]).then(h.seq_choices, None, focus)
        for slider in (temperature, top_k, top_p, min_p, rep, freq, pres):
            slider.change(h.what_if, [*sampling_inputs, lang, visible], payload, trigger_mode="always_last",
                          show_progress="hidden")
        for ctl in (layer, head):
            ctl.release(h.view, view_inputs, payload, show_progress="hidden", trigger_mode="always_last")
        word.submit(h.view, view_inputs, payload, show_progress="hidden")
        refresh.click(h.view, view_inputs, payload, show_progress="hidden", trigger_mode="always_last")
        sync_choices.click(h.seq_choices, None, focus, show_progress="hidden", trigger_mode="always_last")
        npos.submit(h.view, view_inputs, payload, show_progress="hidden")
        focus.input(h.focus, [focus, *view_inputs], payload, show_progress="hidden")
        force_btn.click(h.force, [force_id, *view_inputs], payload, show_progress="hidden")
        rewind_btn.click(h.rewind, [rewind_n, branch, *view_inputs], payload, show_progress="hidden").then(
            h.seq_choices, None, focus)
        present_btn.click(h.present, [token, *view_inputs], payload, show_progress="hidden").then(
            h.lecture_status, lang, lecture_info)
        unpresent_btn.click(h.stop_presenting, lang, payload, show_progress="hidden").then(
            h.lecture_status, lang, lecture_info)
        # polled only while the lecture box is open: an idle page should not cost the engine CPU time
        lecture_timer = gr.Timer(3.0, active=False)
        lecture_timer.tick(h.lecture_status, lang, lecture_info, show_progress="hidden")
        lecture_box.expand(lambda: gr.Timer(active=True), None, lecture_timer, show_progress="hidden").then(
            h.lecture_status, lang, lecture_info, show_progress="hidden")
        lecture_box.collapse(lambda: gr.Timer(active=False), None, lecture_timer, show_progress="hidden")
        tools = ToolHandlers(h)
        tour_inputs = [*sampling_inputs, *view_inputs]
        for btn, fn in ((tour_start, tools.tour_start), (tour_next, tools.tour_next), (tour_back, tools.tour_back)):
            btn.click(fn, tour_inputs, [payload, tour_box], show_progress="hidden").then(
                h.seq_choices, None, focus, show_progress="hidden")
        trace_export.click(tools.export_trace, lang, [download, payload])
        trace_load.upload(tools.load_trace, [trace_load, *view_inputs], payload).then(
            h.seq_choices, None, focus, show_progress="hidden")
        export_btn.click(tools.export_chart, [export_chart, export_fmt, lang, layer, head, word, npos],
                         [download, payload])
        spec_inputs = [spec_on, spec_method, spec_k, spec_exit, spec_adaptive, lang]
        for ctl in (spec_on, spec_method, spec_adaptive, spec_k, spec_exit):
            ctl.change(tools.spec_settings, spec_inputs, payload, show_progress="hidden",
                       trigger_mode="always_last")
        spec_measure.click(tools.spec_measure, view_inputs, payload)
        calc_inputs = [c_model, c_dtype, c_context, c_batch, c_gpu, c_alpha, c_k, c_cost, lang, visible]
        for ctl in (c_model, c_dtype, c_gpu):
            ctl.input(tools.calculators, calc_inputs, payload, show_progress="hidden")
        for ctl in (c_context, c_batch):
            ctl.submit(tools.calculators, calc_inputs, payload, show_progress="hidden")
        for ctl in (c_alpha, c_k, c_cost):
            ctl.release(tools.calculators, calc_inputs, payload, show_progress="hidden")
        lang.change(lambda lg: calc_header_html(lg), lang, calc_head)
        lang.change(tools.calc_choices, [lang, c_model, c_gpu], [c_model, c_dtype, c_gpu]).then(
            tools.calculators, calc_inputs, payload, show_progress="hidden")
        lang.change(lambda lg: [gr.update(label=calc.CALC_TEXT["labels"][k][lg]) for k in
                                ("model", "dtype", "gpu", "context", "batch", "alpha", "k", "draft_cost")] +
                    [gr.update(label=t("spec_box", lg)), gr.update(label=t("spec_on", lg)),
                     gr.update(label=t("spec_method", lg)), gr.update(label=t("spec_k", lg)),
                     gr.update(label=t("spec_exit", lg)), gr.update(label=t("spec_adaptive", lg)),
                     gr.update(value=t("spec_measure", lg)),
                     gr.update(label=t("tour", lg)), gr.update(value=t("tour_start", lg)),
                     gr.update(value=t("tour_back", lg)), gr.update(value=t("tour_next", lg)),
                     gr.update(label=t("trace_box", lg)), gr.update(value=t("trace_export", lg)),
                     gr.update(label=t("trace_load", lg)), gr.update(label=t("chart", lg)),
                     gr.update(label=t("format", lg)), gr.update(value=t("export_btn", lg)),
                     gr.update(label=t("download", lg))],
                    lang, [c_model, c_dtype, c_gpu, c_context, c_batch, c_alpha, c_k, c_cost, spec_acc, spec_on,
                           spec_method, spec_k, spec_exit, spec_adaptive, spec_measure, tour_acc, tour_start,
                           tour_back, tour_next, trace_acc, trace_export, trace_load, export_chart, export_fmt,
                           export_btn, download])
        examples.click(lambda x: x[0], examples, prompt)
        relabeled = [prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens,
                     stop, focus, layer, head, force_id, rewind_n, word, npos, step_btn, run_btn, pause_btn,
                     reset_btn, add_btn, force_btn, rewind_btn, branch, examples, lecture_box, token, present_btn,
                     unpresent_btn]
        lang.change(h.relabel, lang, relabeled).then(h.view, view_inputs, payload)
        timer.tick(h.status, lang, [status, timer, layer, head], show_progress="hidden")
        demo.load(h.status, lang, [status, timer, layer, head])
        demo.load(h.hello, lang, [ticket, payload], show_progress="hidden", api_name="hello").then(
            None, ticket, None, js="(t) => { if (window.inferlab && t) window.inferlab.connect(t); return []; }")
        # the calculators once the model and this machine's numbers are known (the loaded model joins the list)
        calc_timer = gr.Timer(1.0)
        calc_outputs = [c_model, c_dtype, c_gpu, payload, calc_timer]
        calc_timer.tick(tools.calc_ready, [*calc_inputs], calc_outputs, show_progress="hidden")

        def free_session(request: gr.Request):
            registry.drop(_key(request))  # also stops the lecture if this tab presented (registry.on_drop)

        demo.unload(free_session)
    # other events: several visitors' renders at once (Gradio's default is one per listener for the whole
    # server, so one slow render queued everyone's); tensor work still runs one call at a time (engine/compute.py)
    demo.queue(default_concurrency_limit=8)
    demo.lab_handlers = h  # the server routes the tabs' websocket Steps to the same handlers
    return demo
