"""What each tab's page shows, and how a payload reaches it.

The engine side of a tab is its session (app/session.py: a LabSession, or a ReplaySession for a loaded
trace). The page side is here: a `TabView` per tab records what its page was already sent (so a payload
carries only what changed) and where it stands in the guided tour; `Delivery` builds a payload for a view
of a session and sends it over the tab's websocket (app/live.py), or hands it back as the hidden Gradio
component's value when the tab has no socket; `RoomPusher` brings the room's steps to tabs that watch the room
panel without stepping themselves.
"""
from __future__ import annotations

import html
import json
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field

import gradio as gr

from engine import StepFailed
from engine.records import dumps

from . import render
from .charts.room import owners_shown
from .i18n import UI, Phrase, Refusal, lang_of, t
from .protocol import IDS
from .session import MAX_VIEW_CHARS, MAX_WORD_CHARS, LabFull, LabSession, cap_text
from .trace import ReplaySession

log = logging.getLogger("inferlab")

ROOM_CHARTS = frozenset(render.PANEL_CHARTS["room"])
# A tab that watches the room without stepping gets at most one room update this often: a step takes ~50 ms,
# and a room that ran twenty steps a second would otherwise cost every watcher twenty redraws a second.
ROOM_PUSH_INTERVAL_S = 1.0


@dataclass
class TabView:
    """One tab's page as the server last left it."""

    sent_html: dict = field(default_factory=dict)  # HTML piece id -> what the page shows
    sent_figs: dict = field(default_factory=dict)  # chart id -> the figure the page last got
    tour_pos: int = -1  # index of the tour step shown (-1: the tour was not started)
    tour_note: Phrase | None = None  # what that step ran, redrawn in the page's language when it changes
    view: View | None = None  # how the page last asked to be drawn (which charts are in view): RoomPusher reads it
    room_version: tuple | None = None  # Room.version() when RoomPusher last brought this page up to date

    def forget_sent(self) -> None:
        """A new session (Reset, a loaded trace), or a new socket that may have missed payloads sent to the old
        one: the next payload sends everything again."""
        self.sent_html.clear()
        self.sent_figs.clear()
        self.room_version = None

    def new_html(self, pieces: dict) -> dict:
        """The HTML pieces that differ from what the page shows (the template, BPE trace and panel texts
        rarely change, and a step's latency grows with its payload). The message line always goes: error and
        what-if payloads change it without passing through here, so the record of it would be wrong."""
        out = {k: v for k, v in pieces.items() if k == "html-message" or self.sent_html.get(k) != v}
        self.sent_html.update(out)
        return out

    def drop_unchanged(self, p: dict) -> dict:
        """Keep in payload `p` only the figures that differ from what this tab last got; the ids of the equal
        ones go to p["same"], where the page clears their stale mark (lab.js).

        Plotly.react redraws a whole chart for every new figure object, even an equal one (20-40 ms for a
        chart here): a chart that did not change (the speculative panel while speculation is off, the
        neighbours of a pinned token position) is not resent. Figures are plain JSON-ready values, never
        mutated once built, so comparing them with == is exact and cheaper than encoding them."""
        figs, same = {}, []
        for cid, fig in p.get("figs", {}).items():
            if self.sent_figs.get(cid) == fig:
                same.append(cid)
            else:
                figs[cid] = self.sent_figs[cid] = fig
        p["figs"], p["same"] = figs, same
        return p


class TabViews:
    """Session key -> TabView. A view lives while the registry holds its tab's session; one whose session has
    gone is forgotten when the next view is made (tabs come and go at page-load pace, so that is soon)."""

    def __init__(self, registry):
        self.registry = registry
        self.views: dict[str, TabView] = {}
        self._lock = threading.Lock()

    def of(self, key: str | None) -> TabView:
        if key is None:  # a session outside the registry (a test's): nothing to remember between payloads
            return TabView()
        with self._lock:
            view = self.views.get(key)
            if view is None:
                live = self.registry.sessions
                self.views = {k: v for k, v in self.views.items() if k in live}
                view = self.views[key] = TabView()
            return view

    def peek(self, key: str) -> TabView | None:
        """The tab's view if a payload was ever built for it; never makes one."""
        return self.views.get(key)


@dataclass(frozen=True)
class View:
    """How the page wants the lab drawn: language, layer and head, BPE word, neighbour position, and the
    charts in view (None: all of them) with those just outside it (sent in a second payload)."""

    lang: str = "en"
    layer: int = 0
    head: int = 0
    word: str = ""
    npos: int | None = None
    visible: frozenset | None = None
    near: frozenset = frozenset()

    @classmethod
    def parse(cls, lang, layer, head, word, npos, visible="") -> "View":
        """From the page's controls; the word box is capped before any work."""
        word = cap_text("word", word, MAX_WORD_CHARS)
        npos = None if npos in (None, "") or int(npos) < 0 else int(npos)
        state = _view_state(visible)
        ids = state.get("ids") if isinstance(state, dict) else state
        near = state.get("near") if isinstance(state, dict) else None
        return cls(lang_of(lang), int(layer or 0), int(head or 0), word or "", npos,
                   frozenset(i for i in ids if i in render.CHART_IDS) if isinstance(ids, list) else None,
                   frozenset(i for i in near if i in render.CHART_IDS) if isinstance(near, list) else frozenset())

    @property
    def args(self) -> tuple:
        """(lang, layer, head, word, neighbour position): what render.build_payload and lecture frames take."""
        return self.lang, self.layer, self.head, self.word, self.npos


def _view_state(visible):
    """lab.js writes {"ids": chart ids in view, "near": those just outside} (a bare list in older pages)."""
    if not visible or not isinstance(visible, str) or len(visible) > MAX_VIEW_CHARS:
        return None  # a view state this long is not lab.js's: build everything, as before its first report
    try:
        return json.loads(visible)
    except ValueError:
        return None


class Delivery:
    """Builds a tab's payloads from its session and sends them to its page."""

    def __init__(self, registry, holder, hub=None, lecture=None):
        self.registry, self.holder, self.hub, self.lecture = registry, holder, hub, lecture
        self.views = TabViews(registry)

    def payload(self, s, view: View, message="", kind="info", what_if=None, op=None):
        """Build and deliver. `op` tags the payload with what caused it (lab.js counts "step" payloads: tests
        wait for the one their click caused, since a view refresh is a render too)."""
        p = self.build(s, view, message, kind, what_if)
        if op:
            p["op"] = op
        if view.near and self.hub is not None and self.hub.has_tab(s.tab_key):
            # charts just outside the screen follow in a second payload: the screen is updated first
            p["stale"] = [c for c in p.get("stale", []) if c not in view.near]
            out = self.deliver(p, s.tab_key)
            rest = render.build_payload(s, *view.args, self.holder.machine, what_if, only=set(view.near))
            self.deliver(self.views.of(s.tab_key).drop_unchanged({"figs": rest["figs"]}), s.tab_key)
            return out
        return self.deliver(p, s.tab_key)

    def build(self, s, view: View, message="", kind="info", what_if=None) -> dict:
        """The payload dict for `view` of session `s`: only what this tab's page does not show yet."""
        # every tab's focused sequence is captured; one whose page shows a chart drawn from captures goes first
        # when the room is busy (app/room.py ROOM_BACKGROUND_CAPTURES)
        s.shows_captures = view.visible is None or bool((view.visible | view.near) & render.CAPTURE_CHARTS)
        p = render.build_payload(s, *view.args, self.holder.machine, what_if, message, kind,
                                 only=None if view.visible is None else set(view.visible))
        p["html"][IDS["focus"]] = focus_html(s, view.lang)
        tab = self.views.of(s.tab_key)
        tab.view = view
        p["html"] = tab.new_html(p["html"])
        tab.drop_unchanged(p)
        if self.lecture is not None:
            self.lecture.changed(s, view.args)
        return p

    def partial(self, s, p: dict):
        """A payload of a few charts (a what-if), minus what the page has."""
        return self.deliver(self.views.of(s.tab_key).drop_unchanged(p), s.tab_key)

    def deliver(self, p: dict, key: str | None):
        """Over the websocket of the tab whose session is `key` when it has one (fast), else as the payload
        component's new value. The tab is the server's own record, never a name the client sent."""
        p["t"] = time.time()
        if key and self.hub is not None and self.hub.push_tab(key, p):
            return gr.skip()
        return dumps(p)

    @staticmethod
    def message(text: str, kind: str = "info") -> str:
        """A payload that only changes the message line."""
        return dumps({"figs": {}, "html": {"html-message": render.message_html(text, kind)},
                      "t": time.time()})

    def error(self, exc: Exception, lang: str, op: str | None = None) -> str:
        """Any failure as a message payload: the page shows one line, never a traceback."""
        lang = lang_of(lang)  # the failure may be the language value itself
        if isinstance(exc, Refusal):
            text, kind = exc.text(lang), "warn" if isinstance(exc, LabFull) else "error"
        elif isinstance(exc, ValueError):  # from below the app (the engine's argument checks): English detail
            text, kind = t("refused_detail", lang).format(detail=exc), "error"
        elif isinstance(exc, RuntimeError) and "loading" in str(exc):
            # no live session: either the model is still loading or it failed to (then say why; a trace works)
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
        return dumps(p)


@dataclass(frozen=True)
class RoomSnapshot:
    """The room as one push round read it, under the names render.room_payload reads off a session."""

    room_records: list
    room_blocks: list
    room_me: str = ""


class RoomPusher:
    """The room panel on tabs that watch it without stepping: "everyone press Run now" on the host's screen.

    A tab's own Step and Run payloads carry the room charts it has in view; an idle tab would never see the
    room move. One thread for all tabs looks at the room every ROOM_PUSH_INTERVAL_S. When the room has
    changed (Room.version), each tab whose page reported room charts in view (TabView.view), whose socket is
    open, and which is not stepping or running itself (its own payloads draw the room) is sent those charts and
    the event log, minus what its page already shows (TabView.drop_unchanged). The figures are drawn once per
    round and language for every tab that took no part in the room's steps: the charts differ between tabs only
    where they mark "you" (charts.room.owners_shown), so only tabs that did take part are drawn on their own."""

    def __init__(self, delivery: Delivery, interval_s: float = ROOM_PUSH_INTERVAL_S):
        self.delivery = delivery
        self.interval_s = interval_s
        self.drawn = 0  # room payloads drawn (each shared by the tabs with the same language and "you")
        self.pushed = 0  # room payloads sent to tabs
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True, name="room-pusher").start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.push_round()
            except Exception:  # noqa: BLE001 - the pusher must outlive anything; the console keeps the cause
                log.exception("room push failed")

    def watchers(self) -> list[tuple[str, LabSession, TabView]]:
        """(session key, session, tab view) of every idle tab with room charts in view and an open socket."""
        d = self.delivery
        out = []
        for key, s in list(d.registry.sessions.items()):
            tab = d.views.peek(key)
            view = tab.view if tab is not None else None
            if (view is None or view.visible is None or not isinstance(s, LabSession) or s.running or s.own_room
                    or not (view.visible | view.near) & ROOM_CHARTS or not d.hub.has_tab(key)):
                # no view reported (None: an old page), a replay, a Run (its frames draw the room), a tab in a room
                # of its own (the preemption demo: its own payloads draw that room; the pushes are the shared one's)
                continue
            out.append((key, s, tab))
        return out

    def push_round(self) -> int:
        """Bring every watcher up to date with the room; returns how many were sent an update."""
        watchers = self.watchers()
        room = watchers[0][1].room if watchers else None
        version = room.version() if room is not None else None
        watchers = [w for w in watchers if w[2].room_version != version]
        if not watchers:
            return 0
        records, blocks = room.records(), room.block_owners()
        shown = owners_shown(records, blocks)
        drawn: dict[tuple[str, str], dict] = {}  # (language, "you") -> the room payload, drawn once this round
        sent = 0
        for key, s, tab in watchers:
            lang, me = tab.view.lang, s.owner if s.owner in shown else ""
            wanted = (tab.view.visible | tab.view.near) & ROOM_CHARTS
            have = drawn.setdefault((lang, me), {"figs": {}, "html": {}})
            missing = wanted - have["figs"].keys()
            if missing or not have["html"]:
                more = render.room_payload(RoomSnapshot(records, blocks, me), lang, missing)
                have["figs"].update(more["figs"])
                have["html"] = more["html"]
                self.drawn += 1
            # the tab's own payloads are built under its lock: a tab in a Step is skipped (its step's payload
            # draws the room), and what this push records as sent cannot interleave with what that one does
            if not s.lock.acquire(blocking=False):
                continue
            try:
                if s.running:  # a Run began since watchers() looked: its frames draw the room
                    continue
                p = {"figs": {c: have["figs"][c] for c in wanted}, "html": tab.new_html(dict(have["html"]))}
                tab.drop_unchanged(p)
                tab.room_version = version
                if p["figs"] or p["html"]:
                    self.delivery.deliver(p, key)
                    sent += 1
            finally:
                s.lock.release()
        self.pushed += sent
        return sent


def status_line(s, lang: str) -> tuple[str, str]:
    """The message line after a step: the replay's position, or that everything has finished."""
    if isinstance(s, ReplaySession):
        return t("replay_pos", lang).format(pos=s.position, n=s.num_frames), "info"
    if s.has_unfinished():
        return "", "info"
    v = s.focus_view()
    if v is not None and v.finished:
        return t("finished", lang), "info"
    return "", "info"


def focus_html(s, lang: str) -> str:
    """The sequence selector (lab.js sends a Focus command when it changes) and, under it, why the shown
    sequence is not moving: queued behind other visitors' requests, or preempted."""
    options = "".join(
        f'<option value="{sid}"{" selected" if sid == s.focus else ""}>#{sid} · '
        f'{html.escape(_status_text(s.seq_status(sid), lang))}</option>' for sid in s.seq_ids() if s.has_seq(sid))
    out = (f'<label class="il-focus"><span>{html.escape(t("focus", lang))}</span>'
           f'<select id="{IDS["focus_select"]}"{"" if options else " disabled"}>{options}</select></label>')
    wait = s.wait_info()  # None on a replay: it shows what was recorded
    if wait is not None:
        line = t("preempted", lang) if wait["state"] == "preempted" else t("waiting", lang).format(n=wait["ahead"])
        out += f'<div class="il-wait">{html.escape(line)}</div>'
    return out


def _status_text(status: str, lang: str) -> str:
    """A sequence's status or finish reason in the page's language (a replayed trace may hold one this version
    does not know: shown as recorded)."""
    key = f"seq_status.{status}"
    return t(key, lang) if key in UI else status
