"""Websocket hub: each tab's own payloads, and lecture mode (one presenter, any number of read-only viewers).

Two kinds of channels live here, both served on the app's one port (a Space exposes only one):

* tab channels (`/ws/lab?ticket=T`): the page's charts travel here instead of through a Gradio component,
  which cost ~250 ms per step for a large payload. Payloads are incremental (only charts in view, only changed
  HTML), so a backlog is merged, never dropped. The ticket is a secret the server made for the tab's session
  and gave to that page over its own Gradio event (SessionRegistry.ticket): a socket is tied to a session by
  the server's word only, never by an id the client names. The page sends Step (and Focus, from the sequence
  selector, and View, when the charts in view change) here too: Gradio's own round trip and its busy
  indicators cost about as much as the engine step itself on a 2-core machine. A tab that watches the room
  panel without stepping gets the room's steps here as well (app/delivery.py RoomPusher).
* viewer channels (`/ws/follow`): the presenter's step events (small, in order) and chart frames (large,
  latest wins). A slow viewer only ever holds one pending frame, so it cannot slow the presenter or anyone else.

Every message is spelled by app/protocol.py (types, ops, one encoder); what a message asks of a session is a
command (app/commands.py), the same one a Gradio button or the tour would apply.

Handlers run in Gradio's worker threads; every hand-over to a websocket goes through the event loop with
`call_soon_threadsafe`. A sender task writes, a receive loop beside it notices a viewer leaving (a handler that
only sends would not) and answers anything a viewer sends with "read-only".
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import threading
import time
from collections import deque

from . import commands as cmd
from . import protocol
from .i18n import Refusal
from .ops_api import Proxies, client_address
from .protocol import BOUND, ERROR, EVENT, FRAME, HELLO, LOAD, OK, PAYLOAD, RESYNC

log = logging.getLogger("inferlab")

MAX_PENDING_EVENTS = 256  # a viewer this far behind gets a resync (the latest frame) instead of the backlog
MAX_OPEN_SOCKETS = 1000  # lecture viewers and presenter sockets together: a lecture hall, not a flood
MAX_MESSAGE_CHARS = 64 * 1024  # what a client may send in one websocket message (a Step's inputs are ~2 KB)
SCRIPTED = object()  # the presenter key of a lecture driven over /ws/present: equal to no tab's key


class TokenGuard:
    """Presenter tokens: the right one is accepted at once, always; a wrong one is answered only after a delay.

    No count of wrong tokens ever refuses the right one: a lockout (5 wrong per address, 50 overall, for a
    minute) let anyone shut the presenter out, their script on /ws/present included, with 50 guesses. Instead a
    guess costs time: the wrong answers to one client address are spaced `delay_s` apart however many
    connections it opens, so it learns at most one wrong token per `delay_s`. A correct token is judged before
    any of that and never waits. The token has 96 bits, so guessing is hopeless anyway; the delay keeps a script
    from trying at line rate. The address is the peer's, or behind a known proxy the one it vouches for
    (app/ops_api.py client_address): a forged X-Forwarded-For only ever names a new bucket behind a proxy the
    server was told to trust, and there it is the proxy's word."""

    MAX_ADDRESSES = 10000

    def __init__(self, delay_s: float = 1.0, max_wait_s: float = 30.0):
        self.delay_s, self.max_wait_s = delay_s, max_wait_s
        self.next_free: dict[str, float] = {}  # address -> when its next wrong answer may go out (monotonic)
        self._lock = threading.Lock()

    def judge(self, token, secret: str, address: str | None) -> float | None:
        """None when `token` is the secret; else the seconds to wait before saying it is wrong (this address's
        wrong answers queue `delay_s` apart, at most `max_wait_s` ahead)."""
        ok = isinstance(token, str) and bool(token) and hmac.compare_digest(token.encode(), secret.encode())
        if ok:
            return None
        address = address or "?"
        now = time.monotonic()
        with self._lock:
            due = min(max(now, self.next_free.get(address, 0.0)) + self.delay_s, now + self.max_wait_s)
            self.next_free[address] = due
            if len(self.next_free) > self.MAX_ADDRESSES:  # bounded: addresses with nothing pending go first
                for a in [a for a, t in self.next_free.items() if t <= now][:self.MAX_ADDRESSES // 2]:
                    del self.next_free[a]
        return max(0.0, due - now)

    def check(self, token, secret: str, address: str | None) -> None:
        """For a worker thread: return if `token` is right, else wait and raise Refusal("wrong_token"). On the
        event loop's thread (an async route should call check_async) it answers without the wait."""
        wait = self.judge(token, secret, address)
        if wait is not None:
            try:
                asyncio.get_running_loop()  # called from a coroutine: sleeping here would stall every socket
            except RuntimeError:
                time.sleep(wait)
            raise Refusal("wrong_token")

    async def check_async(self, token, secret: str, address: str | None) -> None:
        """For the event loop: the same, waiting without holding the loop."""
        wait = self.judge(token, secret, address)
        if wait is not None:
            await asyncio.sleep(wait)
            raise Refusal("wrong_token")


def request_address(headers, peer: str | None, proxies: Proxies) -> str | None:
    """Whose request or socket this is: app/ops_api.py's one rule (X-Forwarded-For only from a known proxy)."""
    if not peer:
        return None
    if hasattr(headers, "getlist"):
        forwarded = headers.getlist("x-forwarded-for")
    else:
        value = headers.get("x-forwarded-for") if hasattr(headers, "get") else None
        forwarded = [value] if value else []
    return client_address(forwarded, peer, proxies)


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...]) -> bool:
    """A browser's websocket from another site is refused (a page elsewhere could otherwise drive the lab
    with its visitor's connection). No Origin header: not a browser (a script), which carries no one's
    credentials. Same host as the page, or listed in `allowed` (e.g. a Space's https://NAME.hf.space)."""
    if origin is None:
        return True
    origin = origin.strip().rstrip("/").lower()
    if origin in {a.strip().rstrip("/").lower() for a in allowed}:
        return True
    netloc = origin.split("://", 1)[-1]
    return bool(host) and netloc == host.strip().lower()


def merge_payloads(old: dict, new: dict) -> dict:
    """One payload equivalent to applying `old` then `new` (lab.js marks stale first, then draws figures)."""
    stale_new = set(new.get("stale", []))
    figs = {k: v for k, v in old.get("figs", {}).items() if k not in stale_new}
    figs.update(new.get("figs", {}))
    html = {**old.get("html", {}), **new.get("html", {})}
    stale = (set(old.get("stale", [])) - set(new.get("figs", {}))) | stale_new
    out = {**old, **new, "figs": figs, "html": html}
    same = (set(old.get("same", [])) | set(new.get("same", []))) - stale_new
    if same:
        out["same"] = sorted(same)
    if old.get("op") and not new.get("op"):
        out["op"] = old["op"]  # a step merged with a later refresh is still that step's payload
    if old.get("kind") != new.get("kind"):
        out.pop("kind", None)  # a merged lab + calculators payload is a lab render
    if stale or "stale" in old or "stale" in new:
        out["stale"] = sorted(stale - set(figs))
    return out


class Channel:
    """One websocket: ordered small messages, plus at most one pending payload/frame."""

    def __init__(self, ws, role: str, key: str = ""):
        self.ws, self.role, self.key = ws, role, key
        self.messages: deque[str] = deque()
        self.frame = None  # str (viewer frame, latest wins) or dict (tab payload, merged)
        self.session_key: str | None = None  # a tab's Gradio session, once a Gradio event tied them (bind_tab)
        self.wake = asyncio.Event()
        self.alive = True
        self.frames_sent = 0
        self.frames_skipped = 0
        self.address: str | None = None  # the client's IP address (wrong presenter tokens are limited per address)
        self.wrong_tokens = 0
        self.load_ticket: str | None = None  # a follower's ticket for the latest room-load round (app/room_load.py)

    def send_message(self, text: str) -> None:
        if len(self.messages) >= MAX_PENDING_EVENTS:
            # far behind: drop the backlog; the pending frame (the current state) still arrives
            self.messages.clear()
            self.messages.append(protocol.encode(RESYNC))
        self.messages.append(text)
        self.wake.set()

    def offer_frame(self, frame) -> None:
        if self.frame is not None:
            if isinstance(frame, dict) and isinstance(self.frame, dict):
                frame = merge_payloads(self.frame, frame)
            else:
                self.frames_skipped += 1
        self.frame = frame
        self.wake.set()

    async def sender(self) -> None:
        try:
            while self.alive:
                await self.wake.wait()
                self.wake.clear()
                while self.messages and self.alive:
                    await self.ws.send_text(self.messages.popleft())
                if self.frame is not None and self.alive:
                    frame, self.frame = self.frame, None
                    text = frame if isinstance(frame, str) else protocol.encode(PAYLOAD, payload=frame)
                    await self.ws.send_text(text)
                    self.frames_sent += 1
        except Exception:  # noqa: BLE001 - the socket closed under us: the receive loop cleans up
            self.alive = False


class Hub:
    """All open channels, and lecture mode's state (who presents, the latest frame for late joiners)."""

    def __init__(self, token: str | None = None, allowed_origins: tuple[str, ...] = (), tab_key=None,
                 proxies: Proxies | None = None, wrong_token_delay_s: float = 1.0):
        self.token = token or secrets.token_urlsafe(12)
        self.guard = TokenGuard(delay_s=wrong_token_delay_s)
        self.proxies = proxies or Proxies()  # whose X-Forwarded-For names the client (app/ops_api.py)
        # the tab's socket opened and its page load made no session: make it now (set by the server; returns a
        # payload to show, e.g. that the lab is full, or None)
        self.open_tab_session = lambda key: None
        self.allowed_origins = tuple(allowed_origins)
        self.tab_key = tab_key or (lambda ticket: None)  # ticket -> session key (SessionRegistry.key_for_ticket)
        self.tab_has_session = lambda key: False  # set by the server (SessionRegistry.peek)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tabs: dict[str, Channel] = {}  # session key -> that tab's open channel
        self.viewers: set[Channel] = set()
        self.open_sockets = 0  # viewer and presenter sockets (each holds a task and a frame buffer)
        self.presenter: str | None = None  # session key of the presenting session
        self.latest_frame: str | None = None
        self.frame_count = 0
        self.on_join = None  # called (in the event loop) when a viewer arrives: the lecture builds a frame
        self._lock = threading.Lock()

    # ---- called from any thread -------------------------------------------------------------------
    def check_token(self, token: str | None, address: str | None) -> None:
        """Raise ValueError unless `token` is the presenter token; a wrong one only after a wait (TokenGuard).
        Blocks: for worker threads (a Gradio handler)."""
        self.guard.check(token.strip() if isinstance(token, str) else "", self.token, address)

    async def check_token_async(self, token: str | None, address: str | None) -> None:
        """check_token for the event loop (the presenter socket): the wait holds no thread."""
        await self.guard.check_async(token.strip() if isinstance(token, str) else "", self.token, address)

    def client_of(self, request) -> str | None:
        """A Gradio request's client address, by the same rule as the sockets' (request_address)."""
        peer = getattr(getattr(request, "client", None), "host", None)
        return request_address(getattr(request, "headers", None) or {}, peer, self.proxies)

    def has_tab(self, key: str | None) -> bool:
        ch = self.tabs.get(key or "")
        return ch is not None and ch.alive

    def push_tab(self, key: str | None, payload: dict) -> bool:
        """Send a payload to the page of the tab whose session is `key`; False if it has no open channel."""
        ch = self.tabs.get(key or "")
        if ch is None or not ch.alive or self.loop is None:
            return False
        self.loop.call_soon_threadsafe(ch.offer_frame, payload)
        return True

    def tab_ready(self, key: str) -> None:
        """The tab's session now exists (made by a Gradio event): its page may send commands over the socket."""
        self.send_tab(key, BOUND)

    def send_tab(self, key: str, type_: str, **fields) -> bool:
        """A small ordered message to one tab (not a payload), e.g. that its session exists."""
        ch = self.tabs.get(key)
        if ch is None or not ch.alive or self.loop is None:
            return False
        self.loop.call_soon_threadsafe(ch.send_message, protocol.encode(type_, **fields))
        return True

    def broadcast(self, events: list[dict], frame: dict | None) -> None:
        """The presenter's new step events (each delivered) and its chart frame (latest wins)."""
        texts = [protocol.encode(EVENT, event=e) for e in events]
        frame_text = None
        if frame is not None:
            frame = {**frame, "t": time.time()}  # lab.js skips a payload whose "t" it has already drawn
            with self._lock:
                self.frame_count += 1
                frame_text = protocol.encode(FRAME, n=self.frame_count, t=time.time(), payload=frame)
                self.latest_frame = frame_text
        if self.loop is None:
            return

        def fan_out():
            for ch in list(self.viewers):
                for t in texts:
                    ch.send_message(t)
                if frame_text is not None:
                    ch.offer_frame(frame_text)

        self.loop.call_soon_threadsafe(fan_out)

    @property
    def viewer_count(self) -> int:
        return sum(1 for ch in self.viewers if ch.alive)

    # ---- websocket endpoints (event loop) ---------------------------------------------------------
    async def serve(self, ws, role: str, ticket: str = "", on_message=None, on_close=None) -> None:
        """Run one channel until the client leaves. `on_message(channel, data)` handles what a client sends.

        role: "tab" (a lab page's own payloads; `ticket` names its session), "viewer" (lecture follower) or
        anything else (a control channel such as the presenter socket, which only gets replies). `on_close(channel)`
        (a coroutine function) runs when the client has left."""
        headers = getattr(ws, "headers", {}) or {}
        # behind a proxy the page's host may arrive as X-Forwarded-Host (the Host header naming the container)
        host = headers.get("x-forwarded-host") or headers.get("host")
        if not origin_allowed(headers.get("origin"), host, self.allowed_origins):
            log.warning("websocket from a foreign origin refused: %s", str(headers.get("origin"))[:80])
            await ws.close(code=1008)  # before accept: the browser sees a refused handshake (HTTP 403)
            return
        if role != "tab" and self.open_sockets >= MAX_OPEN_SOCKETS:  # tabs are bounded by the session cap
            await ws.accept()
            await ws.send_text(protocol.encode(ERROR, error="too many connections: try again later"))
            await ws.close(code=1013)
            return
        key = self.tab_key(ticket) if role == "tab" else None
        if role == "tab" and key is None:
            await ws.accept()  # accepted only to say why: a closed code alone would leave the page guessing
            await ws.send_text(protocol.encode(ERROR, error="unknown or expired ticket: reload the page"))
            await ws.close(code=4401)
            return
        await ws.accept()
        self.loop = asyncio.get_running_loop()
        ch = Channel(ws, role, key or "")
        ch.address = request_address(headers, getattr(getattr(ws, "client", None), "host", None), self.proxies)
        if role == "tab":
            old = self.tabs.get(key)
            if old is not None:  # the same page reconnecting (or a second socket with its ticket): one at a time
                old.alive = False
                old.wake.set()
            self.tabs[key] = ch
            ch.session_key = key
            self.on_tab_opened(key)
            if self.tab_has_session(key):
                ch.send_message(protocol.encode(BOUND))
            else:  # the page load made none: its socket's first use does (tab_ready then says BOUND)
                try:
                    refusal = await asyncio.to_thread(self.open_tab_session, key)
                except Exception:  # noqa: BLE001 - no session (the model is loading): the page steps via Gradio
                    log.exception("a tab's session could not be made on its socket")
                    refusal = None
                if refusal is not None:  # e.g. the lab is full: the page shows it like any message
                    ch.offer_frame(refusal)
        elif role == "viewer":
            self.viewers.add(ch)
            ch.send_message(protocol.encode(HELLO, role=role, presenting=self.presenter is not None,
                                            viewers=self.viewer_count))
            if self.latest_frame is not None:  # a late joiner sees the current state at once
                ch.offer_frame(self.latest_frame)
            elif self.on_join is not None:  # no frame is current (nobody watched the last steps): build one
                self.on_join()
        sender = asyncio.create_task(ch.sender())
        self.open_sockets += role != "tab"
        try:
            while ch.alive:
                message = await ws.receive()
                if message.get("type") == "websocket.disconnect":
                    break
                data = message.get("text")
                if data is None:  # a binary frame: every message here is JSON text; say so and carry on
                    ch.send_message(protocol.encode(ERROR, error="binary frames are not understood here: send "
                                                                 "JSON text messages"))
                    continue
                if len(data) > MAX_MESSAGE_CHARS:
                    ch.send_message(protocol.encode(ERROR, error=f"message too long ({len(data)} characters; "
                                                                 f"at most {MAX_MESSAGE_CHARS})"))
                    continue
                if on_message is not None:
                    await on_message(ch, data)
        except Exception:  # noqa: BLE001 - WebSocketDisconnect or a broken socket: either way the client left
            pass
        finally:
            ch.alive = False
            ch.wake.set()
            sender.cancel()
            self.open_sockets -= role != "tab"
            if role == "tab":
                if self.tabs.get(key) is ch:
                    del self.tabs[key]
                    self.on_tab_closed(key)
            self.viewers.discard(ch)
            if on_close is not None:
                try:
                    await on_close(ch)
                except Exception:  # noqa: BLE001 - cleanup must not raise into the server
                    log.exception("closing a socket's state failed")

    def on_tab_closed(self, key: str) -> None:
        """Hook (set by the server): a tab's socket closed; its session's idle clock now runs socket-less."""

    def on_tab_opened(self, key: str) -> None:
        """Hook (set by the server): a tab's socket opened; payloads sent to an old one may never have arrived."""


class Lecture:
    """Builds the presenter's frames off the request path: a step returns at once; a worker thread builds the
    full payload (every chart, not just those in the presenter's view) for the viewers, latest state wins."""

    def __init__(self, hub: Hub, build_frame):
        self.hub = hub
        self.build_frame = build_frame  # (session, view) -> payload dict
        self._session = None
        self.scripted = None  # the session a script drives over /ws/present when no tab presents (no tab's)
        self.view: tuple = ("en", 0, 0, "", None)
        self.sent_step = -1  # the last step whose event went out
        self.load = None  # app/room_load.RoomLoad: every follower's page sends one request (set by the server)
        self.load_request = lambda: {}  # where those pages send it: {"url", "model"}
        self._dirty = threading.Event()
        self._idle = threading.Event()  # set when every change so far has gone out to the viewers
        self._idle.set()
        self._thread: threading.Thread | None = None
        hub.on_join = self.refresh

    @property
    def session(self):
        """The presented session (a tab's, a script's, a replay): its followers' pages show every chart."""
        return self._session

    @session.setter
    def session(self, s) -> None:
        # a presented session is captured at every step, whatever its presenter's page shows (app/room.py)
        if self._session is not None and self._session is not s and hasattr(self._session, "presented"):
            self._session.presented = False
        if s is not None and hasattr(s, "presented"):
            s.presented = True
        self._session = s

    def refresh(self) -> None:
        if self.session is not None:
            self.changed(self.session)

    def start(self, key: str, session, view) -> None:
        self.hub.presenter, self.session, self.view = key, session, view
        self.sent_step = -1
        self.changed(session, view)

    def stop(self) -> None:
        self.hub.presenter, self.session = None, None

    def is_presenter(self, key) -> bool:
        return self.hub.presenter is not None and self.hub.presenter == key

    def scripted_session(self, make):
        """The session a presenter script drives: the presenting tab's, else the lecture's own (made once by
        `make()`, held here and never in the tabs' registry, so no visitor's session key can name it)."""
        if self.hub.presenter is not None and self.hub.presenter is not SCRIPTED and self.session is not None:
            return self.session
        if self.scripted is None:
            self.scripted = make()
        if not self.is_presenter(SCRIPTED) or self.session is not self.scripted:
            self.start(SCRIPTED, self.scripted, self.view)
        return self.scripted

    def release_scripted(self) -> None:
        """The last presenter script left: its session's sequences and KV blocks go back to the room now (they
        stayed for good before), and the lecture stops if that session was presenting. A later script starts a
        fresh one."""
        s = self.scripted
        if s is None:
            return
        # a script that steps and leaves at once: its last steps still reach the viewers before the session goes
        self._idle.wait(5.0)
        self.scripted = None
        if self.is_presenter(SCRIPTED) and self.session is s:
            self.stop()
        s.close()

    def changed(self, session, view=None) -> None:
        """The presenter's session changed (a step, a reset, a new request, a new view)."""
        if session is not self.session:
            return
        if view is not None:
            self.view = view
        self._idle.clear()
        self._dirty.set()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, daemon=True, name="lecture-frames")
            self._thread.start()

    def _work(self) -> None:
        # one long-lived daemon thread: exiting when idle would race with changed() starting a new one
        while True:
            self._dirty.wait()
            self._dirty.clear()
            s = self.session
            if s is None:
                if not self._dirty.is_set():
                    self._idle.set()
                continue
            try:
                with s.lock:
                    events = [e for e in s.events if e.step > self.sent_step]
                    if s.events and s.events[-1].step < self.sent_step:  # a reset or a new replay
                        events = list(s.events)
                    summaries = [event_summary(e) for e in events]
                    if s.events:
                        self.sent_step = s.events[-1].step
                    elif self.sent_step != -1:
                        self.sent_step = -1
                        summaries = [{"reset": True}]
                    frame = None
                    if self.hub.viewers:
                        try:
                            frame = self.build_frame(s, self.view)
                            frame["step"] = s.events[-1].step if s.events else None
                        except Exception:  # noqa: BLE001 - the events still go out; the console keeps the cause
                            log.exception("lecture frame failed")
                if frame is None:
                    self.hub.latest_frame = None  # out of date now: the next viewer to join asks for a new one
                self.hub.broadcast(summaries, frame)
            except Exception:  # noqa: BLE001 - nothing may stop the lecture thread
                log.exception("lecture broadcast failed")
            if not self._dirty.is_set():
                self._idle.set()


def event_summary(ev) -> dict:
    """The small, ordered part of a step event that every viewer receives (no captures, no block lists)."""
    return {"step": ev.step, "admitted": list(ev.admitted), "finished": list(ev.finished),
            "timing": {"step_ms": ev.timing.step_ms, "forward_ms": ev.timing.forward_ms,
                       "sample_ms": ev.timing.sample_ms},
            "seqs": [{"seq_id": s.seq_id, "phase": s.phase, "num_processed": s.num_processed,
                      "new_token": s.new_token, "new_token_text": s.new_token_text, "emitted": s.emitted,
                      "num_tokens": s.num_tokens, "finished": s.finished} for s in ev.seqs]}


# ---- load from the room: every follower's page sends one request at the same moment (app/room_load.py) ------
async def ask_followers(hub: Hub, load, request: dict, prompt, max_tokens, temperature) -> dict:
    """Start a round and hand each follower's page its own ticket (in the event loop, where the viewers live).
    `request` is the same for every page: where to send ("url") and the model's name. Returns what the
    presenter is told: the round's number and how many pages were asked."""
    viewers = [ch for ch in hub.viewers if ch.alive]
    rnd, tickets = load.start(prompt, max_tokens, temperature, len(viewers))
    common = {"round": rnd.number, "of": len(tickets), "prompt": rnd.prompt, "max_tokens": rnd.max_tokens,
              "temperature": rnd.temperature, **request}
    for i, ch in enumerate(viewers):
        ch.load_ticket = tickets[i] if i < len(tickets) else None
        if ch.load_ticket is None:
            ch.send_message(protocol.encode(LOAD, round=rnd.number, skipped=True))
        else:
            ch.send_message(protocol.encode(LOAD, ticket=ch.load_ticket, follower=i + 1, **common))
    log.info("room load %d: %d followers asked", rnd.number, len(tickets))
    return {"round": rnd.number, "asked": len(tickets), "followers": len(viewers)}


def ask_followers_from_thread(hub: Hub, load, request: dict, prompt, max_tokens, temperature) -> dict:
    """ask_followers from a worker thread (a Gradio handler): run in the event loop, waited for here."""
    if hub.loop is None:  # no socket has ever opened: nobody follows
        raise Refusal("load_nobody")
    coro = ask_followers(hub, load, request, prompt, max_tokens, temperature)
    return asyncio.run_coroutine_threadsafe(coro, hub.loop).result(timeout=30)


def follower_message(load):
    """A viewer socket's handler: a follower page may report how its room-load request went; anything else is
    answered "read-only". The report counts for the ticket this socket was handed, never one the page names."""
    async def handle(ch: Channel, data: str) -> None:
        try:
            msg = protocol.decode(data, protocol.VIEWER_OPS)
        except ValueError:
            ch.send_message(protocol.encode(ERROR, error="viewers are read-only: only the presenter drives the "
                                                         "engine"))
            return
        try:
            if load is None:
                raise ValueError("this server has no room load")
            load.report(ch.load_ticket, msg.get("round"), msg)
            ch.send_message(protocol.encode(OK, op="load_report"))
        except ValueError as exc:
            ch.send_message(protocol.encode(ERROR, error=str(exc)))
    return handle


class PresenterSocket:
    """`/ws/present`: a script (or a second screen) drives the lecture session over a websocket.

    The first message must be {"op": "auth", "token": ...}; then {"op": "start", "prompt": ..., "chat": true,
    "params": {...SamplingParams fields}}, {"op": "step", "count": n}, {"op": "reset"}, {"op": "load", "prompt",
    "max_tokens", "temperature"} (every follower's page sends one request now), {"op": "load_summary"}. Each
    reply is {"type": "ok", ...} or {"type": "error", "error": ...}; steps reach the viewers like a presenting
    tab's.
    """

    MAX_WRONG_TOKENS = 3  # per socket, then it hangs up; each wrong answer waits (the hub's TokenGuard)

    def __init__(self, hub: Hub, lecture: Lecture, make_session, load=None, load_request=None):
        self.hub, self.lecture, self.make_session = hub, lecture, make_session
        self.load, self.load_request = load, load_request  # RoomLoad; () -> {"url", "model"} for the pages
        self.scripts: set[Channel] = set()  # authenticated presenter sockets now open
        self._lock = asyncio.Lock()  # a script's command and the last script's cleanup never overlap

    async def closed(self, ch: Channel) -> None:
        """A presenter socket left (Hub.serve's on_close): when it was the last authenticated one, the
        scripted lecture's session is freed (its blocks would otherwise stay until the server stops)."""
        if ch not in self.scripts:
            return
        self.scripts.discard(ch)
        if not self.scripts and self.lecture is not None:
            async with self._lock:
                if not self.scripts:
                    await asyncio.to_thread(self.lecture.release_scripted)

    async def handle(self, ch: Channel, data: str) -> None:
        try:
            msg = protocol.decode(data, protocol.PRESENTER_OPS)
            op = msg["op"]
            if op == "auth":
                try:
                    await self.hub.check_token_async(msg.get("token"), ch.address)
                except ValueError:
                    ch.wrong_tokens += 1
                    raise
                ch.role = "presenter"
                self.scripts.add(ch)
                reply = protocol.encode(OK, op="auth")
            elif ch.role != "presenter":
                raise ValueError("authenticate first: {\"op\": \"auth\", \"token\": ...}")
            elif op in ("load", "load_summary") and self.load is None:
                raise ValueError("this server has no room load")
            elif op == "load":
                reply = protocol.encode(OK, op=op, **await ask_followers(
                    self.hub, self.load, self.load_request(), msg.get("prompt"), msg.get("max_tokens", 32),
                    msg.get("temperature", 0)))
            elif op == "load_summary":
                reply = protocol.encode(OK, op=op, summary=self.load.summary())
            elif self.lecture is None:
                raise ValueError("this server runs no engine to drive (attach mode): use load and load_summary")
            else:
                command = self.command(msg)
                async with self._lock:
                    reply = protocol.encode(OK, op=op, **await asyncio.to_thread(self._run, command))
        except Exception as exc:  # noqa: BLE001 - every failure is a reply, never a dropped socket
            reply = protocol.encode(ERROR, error=str(exc) if isinstance(exc, ValueError) else
                                    f"{type(exc).__name__}: {exc}")
        ch.send_message(reply)
        if ch.wrong_tokens >= self.MAX_WRONG_TOKENS:
            await asyncio.sleep(0.1)  # let the reply go out, then hang up: the receive loop ends
            await ch.ws.close(code=1008)

    @staticmethod
    def command(msg: dict):
        """The command a script's message asks for (its values checked here, before any work)."""
        op = msg["op"]
        if op == "start":
            from engine import SamplingParams

            raw = msg.get("params") or {}
            if not isinstance(raw, dict):
                raise ValueError("params must be an object of SamplingParams fields")
            return cmd.Add(cmd.Request(msg.get("prompt", ""), bool(msg.get("chat", True)), msg.get("system"),
                                       SamplingParams(**raw)))
        if op == "step":
            count = msg.get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000:
                raise ValueError("count must be between 1 and 1000")
            return cmd.Step(count=count)
        return cmd.Reset()  # the lecture's own session, reset in place (it is no tab's)

    def _run(self, command) -> dict:
        """Apply `command` to the lecture's session; the reply's fields."""
        s = self.lecture.scripted_session(self.make_session)
        out = cmd.apply(s, command)
        self.lecture.changed(s)
        if isinstance(command, cmd.Add):
            return {"seq_id": out.value}
        return {"steps": out.value} if isinstance(command, cmd.Step) else {}
