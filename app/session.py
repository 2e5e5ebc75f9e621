"""One browser tab's lab session: an owner in the room's shared engine (app/room.py), its requests and events.

The UI never touches engine internals directly: handlers call a LabSession method and render the events it
keeps (its share of each engine step it took part in). A registry maps Gradio's session_hash to sessions so a
closed tab frees its sequences' KV at once (demo.unload), and idle sessions are swept after a timeout as a
safety net.
"""
from __future__ import annotations

import ctypes
import gc
import math
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Protocol

from engine import Capture, Engine, SamplingParams, StepEvent
from engine.model import ATTENTION_BUDGET
from engine.sampling import SamplingTrace
from engine.tokenizer import bpe_merges, render_prompt, token_info

from .downloads import TabDownloads
from .i18n import Phrase, Refusal
from .room import Room, RoomLimits

log = logging.getLogger("inferlab")

MAX_EVENTS = 400  # enough for a lecture; older events are dropped (their charts scroll away anyway)
# Every text a visitor sends is capped before any work (tokenizing a 10 MB prompt took 23 s before the
# engine refused it; an 8 MB system prompt 12 s):
MAX_PROMPT_CHARS = 20000
MAX_SYSTEM_CHARS = 4000
MAX_STOP_CHARS = 400  # the stop box, all strings together
MAX_WORD_CHARS = 64  # the BPE word box: the merge trace grows quadratically with the word
MAX_VIEW_CHARS = 8192  # the view state lab.js writes (chart ids in view)
# What one tab may keep of the captured tensors (attention, lens, norms) over all its kept events; older
# events lose their captures first (their charts say so). Twenty tabs hold at most twenty times this.
SESSION_CAPTURE_BYTES = 64 * 1024 * 1024
MAX_BPE_CACHE = 64
# The first screen draws the prompt box's template and tokens before any step (LabSession.set_preview), again
# whenever the box changes: a prompt up to this long is previewed (tokenizing it takes a few ms; a longer one
# is drawn by its first Step, as before)
MAX_PREVIEW_CHARS = 4000
# Socket tickets held at once: a page load gets one even before (or without) a session, e.g. when the lab is
# full; a client calling the page-load event in a loop must not grow the table without end.
MAX_TICKETS = 4096
# Page loads (the "hello" event) one client address may make: a burst, then a steady rate. A page load makes no
# session (the tab's socket, or its first other event, does), so this bounds the churn of tickets and events a
# script can cause, not what it holds. The burst covers a workshop behind one NAT address opening the lab at
# once, and a local lab's twenty test tabs.
PAGE_LOAD_BURST = 40
PAGE_LOADS_PER_MINUTE = 30
MAX_PAGE_LOAD_ADDRESSES = 10000  # addresses remembered; a full bucket carries nothing worth keeping
# When the lab is full, a session whose page has no open websocket and that has had no event for this long gives
# its place to the newcomer (it is freed, not closed: its tab's next event gets a fresh session if there is room).
# A real page opens its socket within a second of loading, so this only ever takes places from clients that
# never opened one (a script calling the page's events) or tabs that have gone.
SOCKETLESS_GRACE_S = 10.0


def cap_text(name: str, value, limit: int) -> str:
    """`value` as a str of at most `limit` characters, or a Refusal naming the box (i18n "name.<name>"), checked
    before any work."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Refusal("text_type", name=Phrase(f"name.{name}"))
    if len(value) > limit:
        raise Refusal("text_long", name=Phrase(f"name.{name}"), n=len(value), limit=limit)
    return value


@dataclass(frozen=True)
class PromptPreview:
    """The prompt box as the model would read it, before any step: the template applied and the token ids
    (what panel 1 draws on the first screen). `too_long`: the box held more than MAX_PREVIEW_CHARS."""

    prompt: str
    chat: bool
    system: str | None
    text: str = ""
    spans: tuple = ()
    token_ids: tuple = ()
    too_long: bool = False


@dataclass
class RequestInfo:
    seq_id: int
    prompt: str
    chat: bool
    system: str | None
    text: str  # the rendered prompt (template applied)
    spans: list[dict]
    token_ids: list[int]


def last_seq_event(events: list[StepEvent], seq_id: int, with_sampling: bool = True):
    """The newest (StepEvent, SeqEvent) of a sequence (with a sampling trace, unless told otherwise)."""
    for ev in reversed(events):
        s = ev.seq(seq_id)
        if s is not None and (not with_sampling or s.sampling is not None):
            return ev, s
    return None, None


class LabView(Protocol):
    """What app/render.py reads to draw the page: a live LabSession and a replayed trace both provide it.

    Everything is read-only and model-free from the renderer's side (a replay has no engine or tokenizer).
    """

    events: list[StepEvent]  # the steps shown so far, oldest first
    requests: dict[int, RequestInfo]  # the sequences that exist now
    focus: int | None  # the sequence the per-sequence panels show
    what_if: SamplingTrace | None  # a hypothetical sampling chain to show instead of the focused one's last

    @property
    def model_id(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    def seq_ids(self) -> list[int]: ...
    def has_seq(self, seq_id: int) -> bool: ...
    def seq_token_ids(self, seq_id: int) -> list[int]: ...
    def prompt_len(self, seq_id: int) -> int: ...
    def seq_status(self, seq_id: int) -> str: ...
    def token_texts(self, seq_id: int) -> list[str]: ...
    def token_infos(self, seq_id: int) -> list[dict]: ...
    def bpe(self, word: str) -> list[dict]: ...
    def nearest(self, token_id: int, k: int = 10) -> list[tuple[int, str, float]]: ...
    def last_seq_event(self, seq_id: int, with_sampling: bool = True): ...


@dataclass
class LabSession:
    room: Room
    owner: str  # this tab's public label in the room ("tab 3")
    events: list[StepEvent] = field(default_factory=list)
    requests: dict[int, RequestInfo] = field(default_factory=dict)
    focus: int | None = None  # the sequence the per-sequence panels show
    last_used: float = field(default_factory=time.time)
    lock: threading.RLock = field(default_factory=threading.RLock)
    running: bool = False  # a Run loop is active (Pause clears it)
    # an example filled the prompt box: the next Step or Run starts it as a new request (and stops this tab's
    # unfinished ones) instead of continuing them with the example's sliders and grammar
    example_next: bool = False
    what_if: SamplingTrace | None = None  # the focused sequence's chain recomputed for new slider values, until a step
    sent_html: dict = field(default_factory=dict)  # the HTML pieces the page already shows (sent only on change)
    sent_figs: dict = field(default_factory=dict)  # chart id -> the figure the page last got (ui._drop_unchanged)
    speculative: object = None  # engine.SpeculativeConfig for the requests this tab starts next (None: plain)
    spec_comparison: dict | None = None  # the last measured speculative-vs-plain run (engine.speculative)
    tour: dict | None = None  # the guided tour's current step {"panel", "index", "at"} (shown to lecture viewers)
    # step number -> the small view state right after that step (focus, each sequence's token ids): what a
    # replayed trace needs to draw the same panels without a tokenizer or KV state (app/trace.py)
    views: dict[int, dict] = field(default_factory=dict)
    bpe_cache: dict[str, list] = field(default_factory=dict)  # word -> its merge trace
    capture_bytes: int = 0  # bytes the kept events' captures hold (SESSION_CAPTURE_BYTES)
    captured: deque = field(default_factory=deque)  # kept events that may still hold attention, oldest first
    tab_key: str | None = None  # the registry key of the tab this session belongs to (its socket's name)
    # The focused sequence is captured (attention, lens, embeddings) whether or not its charts are on screen: a
    # chart scrolled into view later, and a lecture's followers, show the steps taken before. Capturing costs
    # ~15-50 ms per sequence and step, so the room captures at most a few sequences a step for pages that show
    # none of those charts (app/room.py ROOM_BACKGROUND_CAPTURES); these two put this tab's first:
    shows_captures: bool = False  # its page shows such a chart now (the delivery layer sets it from the view)
    presented: bool = False  # a lecture presents this session: its followers' pages show every chart
    # seq id -> ((room steps, this tab's edits), SeqView): a page build asks for the same view several times,
    # and each engine read waits for a running step; a view only changes with a step or this tab's own command
    views_cache: dict = field(default_factory=dict)
    edits: int = 0
    preview: PromptPreview | None = None  # the prompt box before any step (the first screen's panel 1)
    own_room: bool = False  # this tab runs in a room of its own (the preemption demo); closed with the session

    @classmethod
    def create(cls, base: "Engine | Room", kv_memory: int | None = None, kind: str = "tab") -> "LabSession":
        """A session in `base` when it is a Room; given an Engine, a room of its own (a new KV pool of
        `kv_memory` bytes sharing the engine's weights: tests, exports and the speculative comparison)."""
        room = base if isinstance(base, Room) else new_room(base, kv_memory)
        s = cls(room, "")
        s.owner = room.join(kind, capture=s._captured_seqs, shown=lambda: s.shows_captures or s.presented)
        return s

    @property
    def engine(self) -> Engine:
        return self.room.engine

    def _captured_seqs(self) -> set[int]:
        """What the room instruments for this tab: its focused sequence (capturing every sequence of every tab
        cost a twenty-tab room 40 % of its throughput; the room bounds even this, app/room.py)."""
        if self.focus is None or self.focus not in self.requests:
            return set()
        return {self.focus}

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt: str, params: SamplingParams, chat: bool, system: str | None) -> int:
        prompt = cap_text("prompt", prompt, MAX_PROMPT_CHARS)
        system = cap_text("system", system, MAX_SYSTEM_CHARS)
        if not prompt.strip():
            raise Refusal("empty_prompt")
        system = system if (chat and system and system.strip()) else None
        rendered = render_prompt(self.engine.tokenizer, prompt, chat=chat, system=system)
        with self.lock:
            rid = self.room.add_request(self.owner, list(rendered.token_ids), rendered.text, params,
                                        self.speculative)
            self.requests[rid] = RequestInfo(rid, prompt, chat, system, rendered.text, rendered.spans,
                                             list(rendered.token_ids))
            focused = self.focus_view()
            if focused is None or focused.finished:
                self.focus = rid
            return rid

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished(self.owner)

    def unfinished(self) -> list[int]:
        """This tab's sequences that have not finished, oldest first."""
        return [sid for sid in self.seq_ids() if not self.seq_view(sid).finished]

    def stop_unfinished(self) -> list[int]:
        """Abort this tab's unfinished sequences (they stay in the selector, finished "abort"); returns them."""
        with self.lock:
            ids = self.unfinished()
            for sid in ids:
                self.room.check_owner(self.owner, sid)
                self.engine.abort(sid)
            if ids:
                self._edited()
                self.room.pool_changed()
            return ids

    def step(self) -> StepEvent | None:
        """One engine step for this tab's sequences (batched with whatever the room runs); None when there is
        nothing to do."""
        with self.lock:
            self.last_used = time.time()
            if not self.has_unfinished():
                return None
            return self._keep(self.room.step(self.owner))

    def _keep(self, events: list[StepEvent]) -> StepEvent | None:
        """Keep this tab's share of the steps it took part in; returns the newest."""
        for event in events:
            self._keep_one(event)
        return events[-1] if events else None

    def _keep_one(self, event: StepEvent) -> None:
        with self.lock:
            self.what_if = None  # the new step used the sliders' values: nothing is hypothetical any more
            self.events.append(event)
            for old in self.events[:-MAX_EVENTS]:  # the oldest leave: so do their captures' bytes
                self.capture_bytes -= old.capture_nbytes()
                if self.captured and self.captured[0] is old:
                    self.captured.popleft()
            del self.events[:-MAX_EVENTS]
            self._keep_capture_budget(event)
            self.views[event.step] = self.view_state()
            if len(self.views) > len(self.events):
                keep = {e.step for e in self.events}
                self.views = {k: v for k, v in self.views.items() if k in keep}

    def _keep_capture_budget(self, event: StepEvent) -> None:
        """Drop the attention of the oldest events until this tab's captures fit SESSION_CAPTURE_BYTES.

        A running total and a queue of the events that still hold attention: summing every kept event's
        tensors on each step cost ~8 ms at 300 events (a decode step is ~60 ms)."""
        held = event.capture_nbytes()
        self.capture_bytes += held
        if held:
            self.captured.append(event)
        # the newest step keeps its capture: the page is about to draw it
        while self.capture_bytes > SESSION_CAPTURE_BYTES and len(self.captured) > 1:
            self.capture_bytes -= self.captured.popleft().drop_captures()  # attention: ~all of a capture

    def reset(self) -> None:
        with self.lock:
            self.running = False
            self.room.release(self.owner)  # aborted and forgotten: the blocks go back to the pool now
            self.events.clear()
            self.captured.clear()
            self.capture_bytes = 0
            self.views.clear()
            self.requests.clear()
            self.views_cache.clear()
            self.focus = None
            self.running = False
            self.what_if = None
            self.example_next = False

    def close(self) -> None:
        self.reset()
        self.room.leave(self.owner)
        if self.own_room:  # nobody else is in it: its loop thread and KV pool go now
            self.room.close()
        self.bpe_cache.clear()
        self.sent_figs.clear()
        self.sent_html.clear()

    # ---- views (the LabView protocol) ---------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def num_layers(self) -> int:
        return self.engine.spec.num_layers

    @property
    def num_heads(self) -> int:
        return self.engine.spec.num_heads

    def seq_ids(self) -> list[int]:
        return sorted(self.requests)

    def has_seq(self, seq_id: int) -> bool:
        return seq_id in self.requests

    def seq_token_ids(self, seq_id: int) -> list[int]:
        return list(self.seq_view(seq_id).token_ids)

    def prompt_len(self, seq_id: int) -> int:
        return len(self.seq_view(seq_id).prompt_ids)

    def seq_status(self, seq_id: int) -> str:
        """The finish reason of a finished sequence, else its scheduler status ("waiting", "running", ...)."""
        v = self.seq_view(seq_id)
        return v.finish_reason or v.status

    def token_texts(self, seq_id: int) -> list[str]:
        return [self.engine.token_text(t) for t in self.seq_view(seq_id).token_ids]

    def token_infos(self, seq_id: int) -> list[dict]:
        return token_info(self.engine.tokenizer, list(self.seq_view(seq_id).token_ids))

    def bpe(self, word: str) -> list[dict]:
        # drawn on every render of the tokens panel: computed once per word (bounded by MAX_WORD_CHARS)
        word = cap_text("word", word, MAX_WORD_CHARS)
        hit = self.bpe_cache.get(word)
        if hit is None:
            if len(self.bpe_cache) >= MAX_BPE_CACHE:
                self.bpe_cache.clear()
            hit = self.bpe_cache[word] = bpe_merges(self.engine.tokenizer, word)
        return hit

    def nearest(self, token_id: int, k: int = 10) -> list[tuple[int, str, float]]:
        return self.engine.nearest_tokens(int(token_id), k)

    def view_state(self) -> dict:
        """The small state replay needs to redraw the panels as they are now (see `views`)."""
        with self.lock:
            seqs = {}
            for sid in self.requests:
                v = self.seq_view(sid)
                seqs[sid] = {"token_ids": list(v.token_ids), "prompt_len": len(v.prompt_ids),
                             "status": v.finish_reason or v.status}
            return {"focus": self.focus, "seqs": seqs}

    def last_seq_event(self, seq_id: int, with_sampling: bool = True):
        return last_seq_event(self.events, seq_id, with_sampling)

    # ---- commands (app/commands.py calls these; they check that the sequence is this tab's) --------------
    def seq_view(self, seq_id: int):
        """engine.SeqView of one of this tab's sequences."""
        if seq_id not in self.requests:
            raise Refusal("not_this_tab", sid=seq_id)
        key = (self.room.steps, self.edits)
        hit = self.views_cache.get(seq_id)
        if hit is not None and hit[0] == key:
            return hit[1]
        self.room.check_owner(self.owner, seq_id)
        view = self.engine.seq_view(seq_id)
        self.views_cache[seq_id] = (key, view)
        return view

    def _edited(self) -> None:
        """This tab changed one of its sequences outside a step: cached views are stale."""
        self.edits += 1

    def focus_view(self):
        """SeqView of the focused sequence, or None."""
        return None if self.focus is None or self.focus not in self.requests else self.seq_view(self.focus)

    def _own_focus(self) -> int:
        """The focused sequence, checked to be this tab's."""
        if self.focus is None:
            raise Refusal("no_focus")
        self.room.check_owner(self.owner, self.focus)
        return self.focus

    def force(self, token_id: int) -> str:
        """Force the focused sequence's next token; returns the token's text."""
        with self.lock:
            self.engine.force_token(self._own_focus(), token_id)
            self._edited()
            return self.engine.token_text(token_id)

    def rewind(self, n: int) -> None:
        with self.lock:
            self.engine.rewind(self._own_focus(), n)
            self._edited()
            self.room.pool_changed()

    def branch(self, n: int) -> int:
        """A branch of the focused sequence keeping n generated tokens; it becomes the focus."""
        with self.lock:
            parent = self.requests[self._own_focus()]
            rid = self.room.branch(self.owner, self.focus, n)
            self.requests[rid] = RequestInfo(rid, parent.prompt, parent.chat, parent.system, parent.text,
                                             parent.spans, parent.token_ids)
            self.focus = rid
            return rid

    def what_if_trace(self, params: SamplingParams) -> SamplingTrace:
        return self.engine.what_if(self._own_focus(), params)

    def run_steps(self):
        """Run: the room steps this tab's sequences until Pause (a standing grant, batched with the room) while
        the page draws; yields whenever steps arrived. A page that draws slower than the engine steps gets
        several steps at once and draws the newest; after Pause it gets one last frame with the steps that ran
        since the frame before (frames are paced, the engine is not: without it the page showed 130 tokens, the
        engine held 132, and the next Step seemed to add 3)."""
        self.running = True
        self.room.run(self.owner)
        late = []
        try:
            while self.running:
                events = self.room.wait(self.owner)
                if events:
                    self.last_used = time.time()
                    self._keep(events)
                    drawn = time.monotonic()
                    yield
                    self._pace(drawn)
                elif not self.room.running(self.owner):
                    break  # every sequence finished (or a Reset ended the grant)
        finally:
            self.running = False
            self.room.pause(self.owner)
            late = self.room.wait(self.owner, timeout=0)  # steps that ran before the pause took hold
            self._keep(late)
        if late:  # not when the consumer closed the run (GeneratorExit): nobody would draw it
            yield

    def pause(self) -> None:
        self.running = False
        self.room.pause(self.owner)

    def settle(self) -> None:
        """Keep the events of steps that ran for this tab and were not kept yet (a Run's last steps, after
        Pause): what the page is drawn from next is what the engine did."""
        with self.lock:
            self._keep(self.room.wait(self.owner, timeout=0))

    def _pace(self, since: float) -> None:
        """Let the engine run on before the next frame of a Run: building a frame is Python work that holds
        the interpreter lock the engine's thread needs between its tensor operations, so twenty tabs redrawing
        after every step would slow the very steps they draw. The engine keeps stepping meanwhile; the next
        frame shows every step that ran (the room sets the pace from how many owners run)."""
        until = since + self.room.frame_interval()
        while self.running and time.monotonic() < until:
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))

    def page_turn(self) -> None:
        """Wait, briefly, while the room's engine runs Python (Room.page_turn); render.py calls it per chart."""
        self.room.page_turn()

    # ---- the first screen: the prompt box before any step ------------------------------------------------
    def set_preview(self, prompt, chat: bool, system) -> PromptPreview:
        """Keep the prompt box's template and tokens for the panels to draw before any step. Capped before any
        tokenizer work; the box is whatever a visitor typed."""
        prompt = cap_text("prompt", prompt, MAX_PROMPT_CHARS)
        system = cap_text("system", system, MAX_SYSTEM_CHARS)
        chat = bool(chat)
        system = system if (chat and system and system.strip()) else None
        if len(prompt) + len(system or "") > MAX_PREVIEW_CHARS:
            self.preview = PromptPreview(prompt[:80], chat, None, too_long=True)
        elif not prompt.strip():
            self.preview = None
        else:
            r = render_prompt(self.engine.tokenizer, prompt, chat=chat, system=system)
            self.preview = PromptPreview(prompt, chat, system, r.text, tuple(r.spans), tuple(r.token_ids))
        return self.preview

    def preview_infos(self) -> list[dict]:
        """The previewed prompt's tokens as the token panels read them (bytes, text, special)."""
        p = self.preview
        return token_info(self.engine.tokenizer, list(p.token_ids)) if p is not None else []

    def queue_states(self) -> dict[int, dict]:
        """Each unfinished sequence of this tab: {"state": "running" | "waiting" | "preempted", "ahead": requests
        admitted before it (waiting ones), "preemptions": how often its KV was taken back}."""
        out = {}
        for sid in self.seq_ids():
            v = self.seq_view(sid)
            if v.finished:
                continue
            if v.status != "waiting":
                out[sid] = {"state": "running", "ahead": 0, "preemptions": v.preemptions}
            else:
                out[sid] = {"state": "preempted" if v.preemptions else "waiting",
                            "ahead": self.engine.queue_position(sid) or 0, "preemptions": v.preemptions}
        return out

    # ---- the room view (app/charts/room.py) -----------------------------------------------------------
    @property
    def room_records(self) -> list[dict]:
        return self.room.records()

    @property
    def room_blocks(self) -> list[str]:
        return self.room.block_owners()

    @property
    def room_me(self) -> str:
        return self.owner

    def wait_info(self) -> dict | None:
        """Why the focused sequence did not move, for the page's status line: {"state": "waiting", "ahead": n}
        (queued behind n requests), {"state": "preempted"} (its KV was taken back; it will be recomputed), or
        None (it runs, or has finished)."""
        v = self.focus_view()
        if v is None or v.status != "waiting":
            return None
        if v.preemptions:
            return {"state": "preempted"}
        return {"state": "waiting", "ahead": self.engine.queue_position(v.seq_id) or 0}

    def updated_params(self, params: SamplingParams) -> None:
        """New slider values apply to the focused sequence from its next step on."""
        v = self.focus_view()
        if v is not None and not v.finished:
            self.engine.set_params(v.seq_id, params)
            self._edited()


# The room's shared KV pool when none is given: ~11,600 tokens of this model, e.g. twenty tabs' chats of a few
# hundred tokens each with room to spare (one tab may reserve half of it, RoomLimits).
ROOM_KV_MEMORY = 512 * 1024 * 1024
ROOM_MAX_BATCH = 32  # sequences in one engine step: a room of twenty tabs steps together


def new_room(base: Engine, kv_memory: int | None = None, limits: RoomLimits | None = None,
             max_batched_tokens: int | None = None) -> Room:
    """A room: a new engine on `base`'s weights with a KV pool of its own, instrumented the way the lab shows.

    The lab shows everything: attention of every layer and head, a 5-deep logit lens, norms, embeddings, for
    the sequences their owners focus on. Attention is kept within a per-step budget (the last query rows that
    fit; the charts say so): a long prompt's prefill would otherwise keep 30 layers x 9 heads x T x T floats
    (+1.6 GB at 1,400 tokens)."""
    extra = {} if max_batched_tokens is None else {"max_num_batched_tokens": max_batched_tokens}
    eng = base.session(kv_memory=kv_memory or ROOM_KV_MEMORY, max_num_seqs=ROOM_MAX_BATCH, **extra)
    eng.instrument = Capture(lens_top_k=5, lens_max_positions=16, max_attention_bytes=ATTENTION_BUDGET)
    eng.capture_seq_ids = set()
    return Room(eng, limits)


# ---- the preemption demo (one click: app/commands.py PreemptionDemo) -------------------------------------------
# The shared pool is sized for a room (~11,600 tokens): one tab never fills it. The demo gives the tab an engine
# of its own whose pool holds the two prompts and nothing more, a short request and a long one, greedy so it plays
# the same every time. The short one is older; as the two answers grow, the first block either needs is taken
# from the newest, the long one: its blocks are freed, it waits at the head of the queue, and it is recomputed
# when the short one has finished. A step's budget of DEMO_BUDGET tokens prefills the long prompt in chunks
# beside the short one's decodes (mixed steps).
DEMO_BUDGET = 64
DEMO_PARAMS = SamplingParams(max_tokens=40, temperature=0.0, seed=0)  # the short request (the page's sliders too)
DEMO_LONG_MAX_TOKENS = 48


def demo_pool_blocks(short_len: int, long_len: int, block_size: int) -> int:
    """The demo's pool: exactly both prompts' blocks, and at least what each request alone may grow to (so
    each can always finish once the other has; the engine refuses a request that could never fit)."""
    def blocks(n):
        return math.ceil(n / block_size)

    return max(blocks(short_len) + blocks(long_len), blocks(short_len + DEMO_PARAMS.max_tokens),
               blocks(long_len + DEMO_LONG_MAX_TOKENS))


def start_preemption_demo(registry: "SessionRegistry", key: str, short: str, long: str) -> tuple[LabSession, int]:
    """The tab's fresh session in a small room of its own, with the short and the long request queued (the
    short one in focus). Returns the session and the pool's size in blocks."""
    base = registry.base
    if base is None:
        raise RuntimeError("the model is still loading")
    lens = [len(render_prompt(base.tokenizer, p).token_ids) for p in (short, long)]
    pool = demo_pool_blocks(*lens, base.block_size)
    s = registry.renew_alone(key, pool, DEMO_BUDGET)
    first = s.add_request(short, DEMO_PARAMS, True, None)
    s.add_request(long, replace(DEMO_PARAMS, max_tokens=DEMO_LONG_MAX_TOKENS), True, None)
    s.focus = first
    return s, pool


def request_key(request) -> str:
    """A tab's registry key: Gradio's session hash (random per page load, never shown to anyone else). Special
    sessions (the scripted lecture) live outside the registry, so no hash a client picks can reach them."""
    return str(getattr(request, "session_hash", None) or "default")[:128]


class LabFull(Refusal):
    """The global session cap is reached: the visitor gets a "try again in a minute" message, not a session."""

    def __init__(self, max_sessions: int):
        super().__init__("lab_full", n=max_sessions)


class PageLoadsLimited(ValueError):
    """Too many page loads from one client address: the page says how long to wait (English; the page shows it
    as the refusal's detail)."""

    def __init__(self, wait_s: float):
        super().__init__(f"too many page loads from your address: try again in {max(1, math.ceil(wait_s))} s")


class PageLoads:
    """Per client address, a token bucket of page loads (PAGE_LOAD_BURST, refilled at PAGE_LOADS_PER_MINUTE)."""

    def __init__(self, burst: int = PAGE_LOAD_BURST, per_minute: float = PAGE_LOADS_PER_MINUTE):
        self.burst, self.rate = burst, per_minute / 60.0
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, address: str | None) -> None:
        """Count one page load from `address`; PageLoadsLimited when its bucket is empty."""
        if not address:
            return
        now = time.monotonic()
        with self._lock:
            tokens, when = self._buckets.get(address, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            if tokens < 1.0:
                self._buckets[address] = (tokens, now)
                raise PageLoadsLimited((1.0 - tokens) / self.rate if self.rate > 0 else 60.0)
            self._buckets[address] = (tokens - 1.0, now)
            if len(self._buckets) > MAX_PAGE_LOAD_ADDRESSES:  # forget the addresses whose buckets are full again
                full = [a for a, (n, w) in self._buckets.items() if n + (now - w) * self.rate >= self.burst]
                for a in full[:MAX_PAGE_LOAD_ADDRESSES // 2] or list(self._buckets)[:MAX_PAGE_LOAD_ADDRESSES // 2]:
                    del self._buckets[a]


class SessionClosed(Refusal):
    """An event for a tab that has already been closed (a queued request after its unload)."""

    def __init__(self):
        super().__init__("tab_closed")


class SessionRegistry:
    """session_hash -> LabSession, sharing one loaded base engine, with a ceiling on what strangers can hold.

    * at most `max_sessions` live sessions (LabFull past it, after freeing idle ones);
    * a session whose tab has no open websocket is freed after `socketless_timeout_s` without an event (API
      clients that never heartbeat), any session after `idle_timeout_s`; a sweeper thread checks every few
      seconds, so memory comes back without waiting for the next visitor;
    * a page load makes no session, only a socket ticket (a script calling the page-load event in a loop held
      every place for minutes): the session is made when the page's socket opens with that ticket, or by the
      tab's first other Gradio event (a page whose socket cannot connect, an API client). Page loads are limited
      per client address (PageLoads). When the lab is full, a session with no open socket and no event for
      SOCKETLESS_GRACE_S gives its place to the newcomer;
    * a closed tab's key is remembered for a while, so a request queued before the close cannot bring its
      session back (its ticket is forgotten, so its socket cannot either; the sweeper never makes one);
    * each tab gets a socket ticket: a server-made secret that its page receives over its own Gradio event
      and presents when it opens /ws/lab (app/live.py). Tickets name sessions; clients never do.
    """

    def __init__(self, base: Engine | None = None, idle_timeout_s: float = 1800.0, kv_memory: int | None = None,
                 max_sessions: int = 24, socketless_timeout_s: float = 300.0, sweep_every_s: float = 10.0,
                 limits: RoomLimits | None = None, page_loads: PageLoads | None = None,
                 socketless_grace_s: float = SOCKETLESS_GRACE_S):
        self.base = base
        self.page_loads = page_loads or PageLoads()
        self.socketless_grace_s = socketless_grace_s
        self.limits = limits
        self._room: Room | None = None
        self.sessions: dict[str, LabSession] = {}
        self.idle_timeout_s = idle_timeout_s
        self.socketless_timeout_s = socketless_timeout_s
        self.max_sessions = max_sessions
        self.kv_memory = kv_memory
        self.has_socket = lambda key: False  # set by the server: whether a tab's websocket is open now
        self.on_drop = lambda key: None  # set by the server: a closed tab stops presenting
        self.on_create = lambda key: None  # set by the server: the tab's socket may now carry its Steps
        self._downloads: dict[str, TabDownloads] = {}  # key -> the tab's download folder
        self._tickets: dict[str, str] = {}  # session key -> its socket ticket
        self._by_ticket: dict[str, str] = {}
        self._closed: dict[str, float] = {}  # key -> when its tab closed
        self._lock = threading.Lock()
        self._freed = False  # a session was freed since the sweeper last handed memory back
        self._sweeper = threading.Thread(target=self._sweep_loop, args=(sweep_every_s,), daemon=True,
                                         name="session-sweeper")
        self._sweeper.start()

    @property
    def room(self) -> Room | None:
        """The one room every tab joins (made on first use, once the model has loaded)."""
        if self._room is None and self.base is not None:
            with self._lock:
                if self._room is None:
                    self._room = new_room(self.base, self.kv_memory, self.limits)
        return self._room

    def get(self, key: str) -> LabSession:
        """The tab's session, created on its first Gradio event (within the cap)."""
        with self._lock:
            s = self.sessions.get(key)
            if s is not None:
                s.last_used = time.time()
                return s
            if key in self._closed:
                raise SessionClosed()
            if self.base is None:  # a replayed trace (put) works without a model; a live session does not
                raise RuntimeError("the model is still loading")
        self.sweep()
        room = self.room
        with self._lock:
            if key in self.sessions:  # another event of the same tab made it meanwhile
                return self.sessions[key]
            evicted = self._make_room()
            if len(self.sessions) >= self.max_sessions:
                raise LabFull(self.max_sessions)
            s = self.sessions[key] = LabSession.create(room)
            s.tab_key = key
        self._free(evicted)
        self.on_create(key)
        return s

    def _make_room(self) -> list:
        """(under the lock) When the lab is full: take the place of the socket-less session idle longest, if it
        has been idle past the grace period. Returns what was taken out (closed by the caller, off the lock)."""
        if len(self.sessions) < self.max_sessions:
            return []
        now = time.time()
        idle = [(s.last_used, k) for k, s in self.sessions.items()
                if not self.has_socket(k) and not getattr(s, "running", False)
                and now - s.last_used > self.socketless_grace_s]
        if not idle:
            return []
        _, key = min(idle)
        log.info("the lab is full: a session without a socket, idle for %.0f s, gives its place",
                 now - self.sessions[key].last_used)
        return [(key, self.sessions.pop(key))]

    def _free(self, evicted) -> None:
        for key, s in evicted:
            self.on_drop(key)  # it may have been presenting
            s.close()
            self._freed = True

    def page_load(self, key: str, address: str | None) -> str:
        """The page-load event: counted against the client's address (PageLoadsLimited past its limit), then
        the tab's socket ticket. No session is made here; a full lab with no place to give raises LabFull, so
        the page says so at once."""
        self.page_loads.take(address)
        ticket = self.ticket(key)
        with self._lock:
            if key in self._closed:
                raise SessionClosed()
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                now = time.time()
                if not any(not self.has_socket(k) and not getattr(s, "running", False)
                           and now - s.last_used > self.socketless_grace_s for k, s in self.sessions.items()):
                    raise LabFull(self.max_sessions)
        return ticket

    def socket_opened(self, key: str) -> LabSession:
        """The tab's socket opened with its ticket: its session, made now if the page load did not (LabFull
        when there is no place)."""
        return self.get(key)

    def peek(self, key: str | None):
        """The tab's session if it exists; never creates one (sockets use this)."""
        s = self.sessions.get(key) if key else None
        if s is not None:
            s.last_used = time.time()
        return s

    def ticket(self, key: str) -> str:
        """The tab's socket ticket (made once per tab; a Reset keeps it)."""
        with self._lock:
            if key not in self._tickets:
                if len(self._tickets) >= MAX_TICKETS:  # page loads that never made a session: oldest first
                    self._forget_tickets([k for k in self._tickets if k not in self.sessions][:MAX_TICKETS // 4])
                tk = secrets.token_urlsafe(24)
                self._tickets[key], self._by_ticket[tk] = tk, key
            return self._tickets[key]

    def _forget_tickets(self, keys) -> None:
        for k in keys:
            self._by_ticket.pop(self._tickets.pop(k, None), None)

    def key_for_ticket(self, ticket: str | None) -> str | None:
        if not isinstance(ticket, str) or not ticket:
            return None
        with self._lock:
            return self._by_ticket.get(ticket)

    def put(self, key: str, session) -> None:
        """Replace a tab's session (e.g. with a ReplaySession); the old one is freed."""
        with self._lock:
            evicted = [] if key in self.sessions else self._make_room()
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                raise LabFull(self.max_sessions)
            old = self.sessions.pop(key, None)
            self.sessions[key] = session
            session.tab_key = key
        self._free(evicted)
        if old is not None and old is not session:
            old.close()

    def downloads(self, key: str) -> TabDownloads:
        """The tab's download folder (a server-chosen name; removed when the tab closes)."""
        with self._lock:
            if key not in self._downloads:
                self._downloads[key] = TabDownloads()
            return self._downloads[key]

    def renew(self, key: str) -> LabSession:
        """Reset: a fresh session for the same tab (same ticket, same socket). Its requests and steps go; the
        settings its page's controls still show stay (the speculative drafter: its checkbox stays ticked)."""
        with self._lock:
            old = self.sessions.pop(key, None)
        if old is not None:
            old.close()
            self._freed = True
        fresh = self.get(key)
        if old is not None:
            fresh.speculative = old.speculative
            fresh.preview = getattr(old, "preview", None)  # the prompt box did not change: the first screen again
        return fresh

    def renew_alone(self, key: str, kv_blocks: int, max_batched_tokens: int) -> LabSession:
        """A fresh session for the tab in a room of its own: an engine on the shared weights whose KV pool holds
        `kv_blocks` blocks and whose steps take at most `max_batched_tokens` tokens (the preemption demo: the
        shared pool is far too big to run out). Reset brings the tab back to the shared room."""
        if self.base is None:
            raise RuntimeError("the model is still loading")
        block_bytes = self.base.block_size * self.base.kv_bytes_per_token
        # the pool is the tab's alone and meant to run out: each of its sequences may reserve all of it
        limits = RoomLimits(max_blocks_per_owner=kv_blocks * RoomLimits.max_seqs_per_owner)
        room = new_room(self.base, kv_blocks * block_bytes, limits, max_batched_tokens)
        fresh = LabSession.create(room)
        fresh.own_room = True
        with self._lock:
            evicted = [] if key in self.sessions or key in self._closed else self._make_room()
            if key in self._closed or (key not in self.sessions and len(self.sessions) >= self.max_sessions):
                fresh.close()
                self._free(evicted)
                raise SessionClosed() if key in self._closed else LabFull(self.max_sessions)
            old = self.sessions.pop(key, None)
            self.sessions[key] = fresh
            fresh.tab_key = key
        self._free(evicted)
        if old is not None:
            fresh.speculative = old.speculative
            old.close()
            self._freed = True
        self.on_create(key)
        return fresh

    def drop(self, key: str) -> None:
        """The tab closed: free its session and ticket, and refuse late events for it."""
        with self._lock:
            session = self.sessions.pop(key, None)
            self._forget_tickets([key])
            downloads = self._downloads.pop(key, None)
            self._closed[key] = time.time()
            if len(self._closed) > 4096:  # the oldest go first; their late events are long over
                for old in sorted(self._closed, key=self._closed.get)[:1024]:
                    del self._closed[old]
        if downloads is not None:
            downloads.remove()
        self.on_drop(key)
        if session is not None:
            session.close()
            self._freed = True  # handed back to the OS by the sweeper, off the request path (release_memory)

    def kv_blocks_used(self) -> int:
        """KV blocks held by the room's sequences, all tabs and the lecture together (a replay holds none)."""
        room = self._room
        return 0 if room is None else room.engine.kv_stats().used

    def sweep(self) -> None:
        """Free sessions idle past their timeout (see the class docstring)."""
        now = time.time()
        for key, s in list(self.sessions.items()):
            limit = self.idle_timeout_s if self.has_socket(key) else self.socketless_timeout_s
            if now - s.last_used > limit and not getattr(s, "running", False):
                log.info("session idle for %.0f s: freed", now - s.last_used)
                self.drop(key)

    def _sweep_loop(self, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            try:
                self.sweep()
                if self._freed:
                    self._freed = False
                    release_memory()
            except Exception:  # noqa: BLE001 - the sweeper must survive anything
                log.exception("session sweep failed")


def release_memory() -> None:
    """Hand freed heap back to the OS: glibc keeps large freed arenas otherwise, and RSS would only grow.

    The collection holds the interpreter for its whole run (it took ~0.3 s in a twenty-tab room, a pause of
    every page and of the engine's Python work), so it runs on the sweeper's thread, at most once per sweep,
    never on a request's path; the objects made while loading (the model, the page) are frozen out of it."""
    start = time.perf_counter()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): the allocator decides
        pass
    log.info("freed sessions' memory handed back in %.0f ms", (time.perf_counter() - start) * 1e3)
