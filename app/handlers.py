"""The page's callbacks: each turns the controls' values into a command (app/commands.py), applies it to the
tab's session and delivers the payload (app/delivery.py). Gradio events and the tab's websocket
(`tab_message`) arrive here; every failure becomes a message on the page, never a traceback.

Every Gradio callback lists its parameters explicitly (no *args): Gradio injects `request` only into
signatures it can read.
"""
from __future__ import annotations

import html
import json
import threading

import gradio as gr

from . import commands as cmd
from . import grammar_examples, protocol, render
from .delivery import Delivery, View, status_line
from .i18n import Refusal, lang_of, t
from .live import Hub, Lecture, ask_followers_from_thread
from .panels.room_load import summary_html
from .session import DEMO_PARAMS, SessionRegistry, request_key as _key

class LabHandlers:
    """Gradio callbacks. Every one returns a payload; errors become a message, never a traceback."""

    def __init__(self, registry: SessionRegistry, holder, hub: Hub | None = None, lecture: Lecture | None = None):
        self.registry = registry
        self.holder = holder  # model loading status: .ready, .progress, .message, .error, .machine
        self.hub = hub  # websocket channels: this tab's payloads, lecture viewers
        self.lecture = lecture
        self.delivery = Delivery(registry, holder, hub, lecture)
        self._socket_runs: set[str] = set()  # tabs whose socket Run is going (_socket_run)
        self._runs_lock = threading.Lock()

    def _session(self, request):
        return self.registry.get(_key(request))

    def _client(self, request) -> str | None:
        """The visitor's address for per-client limits: the hub's rule (X-Forwarded-For only from a known
        proxy, app/ops_api.py client_address), else the peer."""
        if self.hub is not None:
            return self.hub.client_of(request)
        return getattr(getattr(request, "client", None), "host", None)

    def _context(self, lang, request=None) -> cmd.Context:
        return cmd.Context(lang, self.registry, _key(request) if request is not None else None, self.lecture)

    params = staticmethod(cmd.sampling_params)

    # ---- the engine's controls ------------------------------------------------------------------------
    def step(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
             lang, layer, head, word, npos, visible, grammar="", request: gr.Request = None):
        try:
            view = View.parse(lang, layer, head, word, npos, visible)  # capped before any engine work
            s = self._session(request)
            request_ = cmd.request(prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed,
                                   max_tokens, stop, grammar)
            with s.lock:  # the step and the render that shows it, with nothing in between
                out = cmd.apply(s, cmd.Step(request_), self._context(lang, request))
                return self.delivery.payload(s, view, *_line(s, view.lang, out.message), op="step")
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message on the page
            return self.delivery.error(exc, lang, op="step")

    def run(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
            lang, layer, head, word, npos, visible, grammar="", request: gr.Request = None):
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self._session(request)
            request_ = cmd.request(prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed,
                                   max_tokens, stop, grammar)
            out = cmd.apply(s, cmd.Run(request_), self._context(lang, request))
            for _ in out.steps:
                yield self.delivery.payload(s, view, *_line(s, view.lang, out.message))
        except Exception as exc:  # noqa: BLE001
            yield self.delivery.error(exc, lang)

    def pause(self, lang="en", layer=0, head=0, word="", npos=None, visible="", request: gr.Request = None):
        """Pause: the Run ends after the step in flight, and the page is drawn where the engine stopped (a Run's
        frames are paced while the engine steps on, and a Run through Gradio is cancelled before its last)."""
        try:
            s = self._session(request)
            cmd.apply(s, cmd.Pause())
            view = View.parse(lang, layer, head, word, npos, visible)
            with s.lock:
                return self.delivery.payload(s, view, *status_line(s, view.lang))
        except Exception:  # noqa: BLE001 - pausing a session that is still loading is a no-op
            return gr.skip()

    def add(self, prompt, chat, system, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
            lang, layer, head, word, npos, visible, grammar="", request: gr.Request = None):
        return self._apply(lambda: cmd.Add(cmd.request(prompt, chat, system, temperature, top_k, top_p, min_p, rep,
                                                       freq, pres, seed, max_tokens, stop, grammar)),
                           lang, layer, head, word, npos, visible, request)

    def schema_pair(self, shuffled, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang,
                    layer, head, word, npos, visible, request: gr.Request = None):
        """The prefix-cache pitfall pair (cmd.SchemaPair): the sliders' chain under the pair's own schema."""
        from .grammar_examples import PAIR_SCHEMA

        def build():
            schema = "json: " + json.dumps(PAIR_SCHEMA)
            params = cmd.sampling_params(temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                                         schema)
            return cmd.SchemaPair(params, bool(shuffled))
        return self._apply(build, lang, layer, head, word, npos, visible, request)

    # two explicit handlers (not functools.partial): Gradio injects `request` only into signatures it reads
    def pair_stable(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, layer,
                    head, word, npos, visible, request: gr.Request = None):
        return self.schema_pair(False, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                                lang, layer, head, word, npos, visible, request)

    def pair_shuffled(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, layer,
                      head, word, npos, visible, request: gr.Request = None):
        return self.schema_pair(True, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                                lang, layer, head, word, npos, visible, request)

    # ---- examples: the prompt box filled in one click --------------------------------------------------
    def grammar_example(self, name, lang, request: gr.Request = None):
        """A grammar example: its prompt (in the page's language) and its grammar into the boxes."""
        lang = lang_of(lang)
        return (t(f"grammar.prompt.{name}", lang), grammar_examples.EXAMPLES[name],
                self._example_picked(lang, request))

    def prompt_example(self, sample, grammar, lang, request: gr.Request = None):
        """A prompt example (the list under the prompt box): its prompt, and no grammar an earlier example set
        (it was that example's, not this question's; a grammar the user wrote stays)."""
        prompt = sample[0] if isinstance(sample, (list, tuple)) and sample else str(sample or "")
        return prompt, grammar_examples.after_prompt_example(grammar), self._example_picked(lang_of(lang), request)

    def _example_picked(self, lang: str, request):
        """An example is a new question: the tab's Run pauses and its next Step or Run starts the example as a
        new request (LabSession.example_next); the message line says so when something unfinished will stop."""
        try:
            s = self.registry.peek(_key(request))
            if s is None or not hasattr(s, "example_next"):  # no session yet, or a replay: nothing runs
                return gr.skip()
            s.pause()  # a Run over the tab's socket then sends its last frame itself
            with s.lock:
                s.example_next = True
                ids = s.unfinished()
            if not ids:
                return gr.skip()
            return self.delivery.message(t("example.new_request", lang).format(ids=", #".join(map(str, ids))))
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def reset(self, lang, visible="", request: gr.Request = None):
        try:
            # the tab's session need not exist yet: Reset makes a fresh one either way
            out = cmd.apply(self.registry.peek(_key(request)), cmd.Reset(), self._context(lang, request))
            self.delivery.views.of(out.session.tab_key).forget_sent()  # a new session: its page redraws all
            return self.delivery.payload(out.session, View.parse(lang, 0, 0, "", None, visible), "")
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def preview(self, prompt, chat, system, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """The page loaded or the prompt box changed: panel 1 draws the prompt's template and tokens before any
        step (nothing is redrawn while a sequence fills the panels)."""
        try:
            if not self.holder.ready:
                return gr.skip()  # the model's status poll previews again once it is ready
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self._session(request)
            out = cmd.apply(s, cmd.Preview(prompt, chat, system), self._context(lang, request))
            if not out.changed:
                return gr.skip()
            with s.lock:
                return self.delivery.payload(s, view, message=None)
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def preemption_demo(self, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """One click to watch preemption: a small engine of the tab's own, a short and a long request queued;
        the temperature and max-tokens controls show the demo's (greedy, so it plays the same every time)."""
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            out = cmd.apply(self.registry.peek(_key(request)), cmd.PreemptionDemo(), self._context(lang, request))
            self.delivery.views.of(out.session.tab_key).forget_sent()  # a new session: its page redraws all
            params = DEMO_PARAMS
            return (self.delivery.payload(out.session, view, out.message), gr.update(value=params.temperature),
                    gr.update(value=params.max_tokens))
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang), gr.skip(), gr.skip()

    def what_if(self, temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop, lang, visible="",
                grammar="", request: gr.Request = None):
        try:
            s = self._session(request)
            params = cmd.sampling_params(temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                                         grammar)
            out = cmd.apply(s, cmd.WhatIf(params), self._context(lang, request))
            if not out.changed:
                return gr.skip()
            lang = lang_of(lang)
            if out.value is None:  # the sliders are back at what the last step sampled with: its real chain
                return self.delivery.partial(s, render.chain_payload(s, lang, *status_line(s, lang)))
            return self.delivery.partial(s, render.what_if_payload(s, out.value, lang))
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def focus(self, seq_label, lang, layer, head, word, npos, visible, request: gr.Request = None):
        def build():
            sid = cmd.seq_id(seq_label)
            return None if sid is None else cmd.Focus(sid)

        return self._apply(build, lang, layer, head, word, npos, visible, request)

    def force(self, token_id, lang, layer, head, word, npos, visible, request: gr.Request = None):
        return self._apply(lambda: cmd.Force(cmd.token_id(token_id)), lang, layer, head, word, npos, visible,
                           request)

    def rewind(self, n, branch, lang, layer, head, word, npos, visible, request: gr.Request = None):
        def build():
            kept = cmd.kept_tokens(n)
            return cmd.Branch(kept) if branch else cmd.Rewind(kept)

        return self._apply(build, lang, layer, head, word, npos, visible, request)

    def view(self, lang, layer, head, word, npos, visible, request: gr.Request = None):
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self._session(request)
            with s.lock:  # renders of one tab may run beside its steps: read its events whole
                return self.delivery.payload(s, view, message=None)
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def language(self, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """The page in another language: every panel and the message line, which says where the session stands
        (a message from before the switch answered a past click, in the other language: it goes)."""
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self._session(request)
            with s.lock:
                return self.delivery.payload(s, view, *status_line(s, view.lang))
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def _apply(self, build, lang, layer, head, word, npos, visible, request):
        """The session's command `build()` (None: nothing to do), then the page's view of the session."""
        try:
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self._session(request)
            command = build()
            message = cmd.apply(s, command, self._context(lang, request)).message if command is not None else ""
            return self.delivery.payload(s, view, message)
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    # ---- the tab's own websocket ------------------------------------------------------------------------
    def hello(self, lang, request: gr.Request = None):
        """On page load: the tab's socket ticket (lab.js opens /ws/lab with it). No session yet: the socket's
        first use makes it (SessionRegistry.page_load), so page loads that never open one hold no place; a full
        lab still says so at once. Page loads are limited per client address."""
        key = _key(request)
        try:
            return self.registry.page_load(key, self._client(request)), gr.skip()
        except Exception as exc:  # noqa: BLE001 - the lab is full, too many page loads, or the tab was closed
            return gr.skip(), self.delivery.error(exc, lang)

    def tab_message(self, key: str, data: str) -> None:
        """A message from a tab's websocket (app/live.py), whose session `key` the server tied to it by ticket:
        {"op": "step", "inputs": {...}} runs exactly the Gradio Step handler on that session, {"op": "focus",
        "seq": id, "inputs": {...}} the sequence selector's, {"op": "view", "inputs": {...}} (the charts in view
        changed, or the socket came back) the view handler's, which also records the view for the room's pushes
        (RoomPusher). The payload comes back on the same socket. A socket never creates a session (a Step queued
        behind the tab's close must not bring it back)."""
        lang, op = "en", "step"
        try:
            msg = protocol.decode(data, protocol.TAB_OPS)
            op = msg["op"]
            inputs = msg.get("inputs") if isinstance(msg.get("inputs"), dict) else {}
            args = cmd.socket_inputs(inputs) if op in ("step", "run") else cmd.view_inputs(inputs)
            lang = args["lang"]
            if self.registry.peek(key) is None:
                raise Refusal("no_session")
        except Exception as exc:  # noqa: BLE001 - a malformed message is answered, never raised into the socket
            refusal = exc if isinstance(exc, Refusal) else ValueError(str(exc))
            self.hub.push_tab(key, json.loads(self.delivery.error(refusal, lang, op=op)))
            if self.registry.peek(key) is None:
                self.hub.send_tab(key, protocol.UNBOUND)  # the page's next Step goes through Gradio
            return
        request = _TabRequest(key)
        if op == "run":
            self._socket_run(key, args, request)
            return
        if op == "step":
            out = self.step(**args, request=request)
        elif op == "focus":
            out = self.focus(msg.get("seq"), **args, request=request)
        else:
            out = self.view(**args, request=request)
        if isinstance(out, str):  # an error payload (or no channel to push on): send it on this socket
            self.hub.push_tab(key, json.loads(out))

    def _socket_run(self, key: str, args: dict, request) -> None:
        """A Run sent over the tab's socket: exactly the Gradio Run handler, in a thread of its own (the tab's
        later messages, a view change or a focus, must not wait for the Run to end), then RUN_END. One Run per
        tab at a time: a second press while one runs changes nothing. Pause (a Gradio event) ends it."""
        with self._runs_lock:
            if key in self._socket_runs:
                return
            self._socket_runs.add(key)

        def run():
            try:
                for out in self.run(**args, request=request):
                    if isinstance(out, str):  # an error payload (or no channel to push on)
                        self.hub.push_tab(key, json.loads(out))
            finally:
                with self._runs_lock:
                    self._socket_runs.discard(key)
                self.hub.send_tab(key, protocol.RUN_END)
        threading.Thread(target=run, daemon=True, name="tab-run").start()

    # ---- lecture mode -------------------------------------------------------------------------------------
    def present(self, token, lang, layer, head, word, npos, visible, request: gr.Request = None):
        """Claim lecture mode with the presenter token: viewers at /follow then see this tab's session."""
        try:
            if self.hub is None or self.lecture is None:
                raise Refusal("no_lecture")
            try:
                self.hub.check_token(token, self._client(request))
            except Refusal as exc:  # a wrong token (answered after a wait): the page says where to find it
                raise (Refusal("bad_token") if exc.phrase.key == "wrong_token" else exc) from None
            view = View.parse(lang, layer, head, word, npos, visible)
            s = self._session(request)
            self.lecture.start(_key(request), s, view.args)
            return self.delivery.payload(s, view, t("presenting", lang))
        except Exception as exc:  # noqa: BLE001
            return self.delivery.error(exc, lang)

    def stop_presenting(self, lang, request: gr.Request = None):
        key = _key(request)
        if self.lecture is not None and self.lecture.is_presenter(key):
            self.lecture.stop()
        return self.delivery.message(t("not_presenting", lang))

    def lecture_status(self, lang, request: gr.Request = None):
        """Who presents and how many follow, for the lecture box (polled by the page's timer)."""
        return self._lecture_html(lang, _key(request))

    def _lecture_html(self, lang, key, note: str = "") -> str:
        if self.hub is None:
            return ""
        me = self.lecture is not None and self.lecture.is_presenter(key)
        state = t("you_present", lang) if me else (t("other_presents", lang) if self.hub.presenter else
                                                   t("nobody_presents", lang))
        load = ""
        if me and self.lecture.load is not None:  # the presenter sees the room load's summary
            load = summary_html(self.lecture.load.summary(), lang_of(lang), note)
        return (f'<div class="il-lecture-status">{html.escape(state)} · '
                f'{html.escape(t("viewers", lang))}: <b id="viewer-count">{self.hub.viewer_count}</b> · '
                f'<a href="/follow?lang={lang_of(lang)}" target="_blank">/follow</a>{load}</div>')

    def room_load(self, prompt, max_tokens, temperature, lang, request: gr.Request = None):
        """Every follower's page sends one request now (the presenting tab only); the lecture box follows it."""
        key = _key(request)
        try:
            if self.lecture is None or self.lecture.load is None:
                raise Refusal("no_lecture")
            if not self.lecture.is_presenter(key):
                raise Refusal("load_not_presenter")
            out = ask_followers_from_thread(self.hub, self.lecture.load, self.lecture.load_request(), prompt,
                                            max_tokens, temperature)
            note = t("load_sent", lang).format(round=out["round"], n=out["asked"])
        except Refusal as exc:
            note = exc.text(lang)
        if not self.lecture or not self.lecture.is_presenter(key):
            return f'<div class="il-lecture-status">{html.escape(note)}</div>'
        return self._lecture_html(lang, key, note)

    # ---- the page's frame -----------------------------------------------------------------------------
    def status(self, lang):
        """Model loading progress while it loads; then the model's name (and the sliders' true ranges)."""
        h = self.holder
        if h.error:
            return (f'<div class="il-msg il-msg-error">{html.escape(h.error)}</div>', gr.Timer(active=False),
                    gr.update(), gr.update())
        if not h.ready:
            pct = int(100 * h.progress)
            # the loader reports its stages in English: a Russian page shows the bar and the percentage
            detail = h.message if lang_of(lang) == "en" else f"{pct} %"
            return (f'<div class="il-loading"><progress max="100" value="{pct}"></progress> '
                    f'{html.escape(t("loading", lang))} {html.escape(detail)}</div>', gr.Timer(active=True),
                    gr.update(), gr.update())
        # the model's name; its id's note on where the weights came from ("(Q4_1 GGUF, dequantised)") is English
        # and goes to the hover title
        name = h.model_id.split(" ")[0]
        return (f'<div class="il-ready" title="{html.escape(h.model_id)}">✓ {html.escape(t("ready", lang))}: '
                f'{html.escape(name)} · {html.escape(h.device.upper())}</div>', gr.Timer(active=False),
                gr.update(maximum=h.spec.num_layers - 1), gr.update(maximum=h.spec.num_heads - 1))


def _line(s, lang: str, message: str) -> tuple[str, str]:
    """The message line after a step: the command's own (an example started afresh), then where it stands."""
    text, kind = status_line(s, lang)
    return (f"{message} {text}".strip(), kind) if message else (text, kind)


class _TabRequest:
    """What the handlers read from a gr.Request, for a command that came over the tab's websocket."""

    def __init__(self, session_hash: str):
        self.session_hash = session_hash
