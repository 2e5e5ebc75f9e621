"""One engine for the whole room: every tab, the lecture and API clients own sequences in one shared engine.

A workshop is the best demonstration of continuous batching there is, if the room's own requests are batched.
So there is one scheduler and one KV pool per process, and each party is an *owner* (a public label such as
"tab 3"; the secret that names a tab's session never reaches the engine). An owner's Step grants its sequences
one engine step; Run grants steps until Pause. One loop thread steps the engine whenever any owner holds a
grant, and every granted owner's sequences go into the same step (chunked prefill and decode mixed); the
others are held, keeping their KV blocks (engine.Engine.step(owners=...)). Each owner then receives its share
of the step's event (StepEvent.for_owner): its own sequences in full, of everyone else only who was there.

Bounded for strangers: an owner may hold at most `max_seqs_per_owner` unfinished sequences, reserve at most
`max_blocks_per_owner` KV blocks (its requests' worst case: prompt plus max_tokens) and
`max_prompt_tokens_per_owner` prompt tokens; the room holds at most `max_seqs` unfinished sequences. A request
past a cap is refused with a message before it reaches the engine; everyone else proceeds.

`history` keeps one small record per step for the room view (app/charts/room.py): the batch in brief, who was
admitted, preempted or finished, the queue and the pool. Records hold labels and counts, never tokens or text.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from engine import Engine, SamplingParams, StepEvent, StepFailed

from . import engine_turn
from .i18n import Refusal

log = logging.getLogger("inferlab")

HISTORY = 600  # room records kept (a lecture's worth of steps)
INBOX = 400  # events an owner may have waiting to be read (a Run whose page renders slower than the engine)
FRAME_MIN_S, FRAME_PER_RUNNER_S, FRAME_MAX_S = 0.2, 0.025, 0.5  # a Run's frame pace (Room.frame_interval)
PAGE_WAIT_S = 0.1  # the longest a page build waits for its turn (Room.page_turn)
STEP_WALLS = 2048  # steps whose wall-clock start and end are kept (Room.step_wall): more than an owner's INBOX
# Capturing a sequence's insides (attention, logit lens, norms, embeddings) costs ~15-50 ms per sequence and
# step. An owner whose page shows a chart drawn from captures (or whose session a lecture presents) has its
# viewed sequences captured at every step; everyone else's are captured too, whether or not their page shows
# those charts, but at most this many sequences a step, least recently captured first (Room._capture_for): a
# lone tab is captured at every step, and twenty tabs watching the sampling chain do not pay twenty captures.
ROOM_BACKGROUND_CAPTURES = 2


@dataclass(frozen=True)
class RoomLimits:
    max_seqs_per_owner: int = 8
    max_blocks_per_owner: int | None = None  # None: half the pool
    max_prompt_tokens_per_owner: int = 16384
    max_seqs: int = 256  # unfinished sequences in the whole room


@dataclass
class Owner:
    label: str
    capture: Callable[[], set[int]]  # the sequences whose insides this owner views (attention, lens, ...)
    shown: Callable[[], bool] = lambda: False  # its page shows a chart drawn from captures now (captured first)
    grant: float = 0  # engine steps granted and not yet run (math.inf: Run)
    served: int = 0  # steps run while this owner held a grant
    inbox: deque = field(default_factory=lambda: deque(maxlen=INBOX))
    error: Exception | None = None  # a failed step, raised to the owner's waiting call
    seq_ids: set[int] = field(default_factory=set)
    tokens: int = 0  # tokens generated for this owner, all time


class Room:
    def __init__(self, engine: Engine, limits: RoomLimits | None = None):
        self.engine = engine
        self.limits = limits or RoomLimits()
        pool = engine.kv_stats().num_blocks
        self.max_blocks_per_owner = self.limits.max_blocks_per_owner or max(1, pool // 2)
        self.history: deque[dict] = deque(maxlen=HISTORY)
        self._owners: dict[str, Owner] = {}
        self._counters: Counter = Counter()  # owner kind -> labels handed out
        self._cond = threading.Condition()
        self._closed = False
        self._stepping: set[str] = set()  # owners in the step running now
        self._pool_changes = 0  # bumped whenever block tables may have changed outside a step (pool_changed)
        self._pool_view: tuple = ((), [])  # (version it was drawn at, block_owners())
        # Turns on Python's GIL (app/engine_turn.py). The engine's Python phases (a step's inputs, sampling
        # each sequence with its trace, the event) give the GIL up at each of their ~1,000 small tensor calls
        # and had to win it back from the threads building pages: a twenty-tab step took ~3x its time alone.
        # Its forward needs no GIL (engine/scripted.py), so pages are built during the forward and between
        # steps, and wait for their turn (at most PAGE_WAIT_S, at each chart) while the engine runs Python;
        # the server's event loop waits for it too, before each poll.
        self._pages_turn = threading.Event()
        self._pages_turn.set()
        engine_turn.register(self._pages_turn)
        engine.forward_hook = self._forward_turn
        self.steps = 0
        self.tokens = 0
        self._captured_at: dict[int, int] = {}  # seq id -> the room step that last captured it (_capture_for)
        self.batch_sizes: Counter = Counter()  # sequences per step -> steps
        # tokens per step (prompt tokens prefilled + tokens sampled) -> steps: /metrics' iteration_tokens_total
        self.step_tokens: Counter = Counter()
        # step -> (time.monotonic() at its start, at its end): an API request's queue, prefill and decode times
        # are read from when its steps really ran, not from when its thread got to read their events
        self._walls: OrderedDict = OrderedDict()
        # where the loop's wall time goes (ms, cumulative): the engine's phases, and the rest of the loop
        # (waiting for grants, delivering events): what bench/room.py reads to say what limits a busy room
        self.time_ms: Counter = Counter()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="room-engine-loop")
        self._thread.start()

    # ---- owners -----------------------------------------------------------------------------------------
    def join(self, kind: str = "tab", capture: Callable[[], set[int]] | None = None,
             shown: Callable[[], bool] | None = None) -> str:
        """A new owner; returns its public label ("tab 3", "lecture 1", "api 2"). `capture`: the sequences whose
        insides it views; `shown`: whether its page shows them now (ROOM_BACKGROUND_CAPTURES)."""
        with self._cond:
            self._counters[kind] += 1
            label = f"{kind} {self._counters[kind]}"
            self._owners[label] = Owner(label, capture or set, shown or (lambda: False))
            return label

    def leave(self, owner: str) -> None:
        """The owner is gone (its tab closed): its sequences are released and their blocks freed at once."""
        self.release(owner)
        with self._cond:
            o = self._owners.pop(owner, None)
            if o is not None:
                o.grant = 0
            self._cond.notify_all()

    def release(self, owner: str) -> None:
        """Abort and forget every sequence of this owner (Reset)."""
        with self._cond:
            o = self._owner(owner)
            ids, o.seq_ids = list(o.seq_ids), set()
            o.inbox.clear()
            o.grant = 0
            self._cond.notify_all()
        self.engine.release(ids)
        self.pool_changed()

    def pool_changed(self) -> None:
        """Block tables changed outside a step (a release, a rewind, a branch): the room view redraws the pool."""
        with self._cond:
            self._pool_changes += 1

    def _owner(self, owner: str) -> Owner:
        o = self._owners.get(owner)
        if o is None:
            raise Refusal("left_room")
        return o

    def check_owner(self, owner: str, seq_id: int) -> None:
        """Owners act on their own sequences only (the engine's ids are small integers anyone can guess)."""
        if seq_id not in self._owner(owner).seq_ids:
            raise Refusal("not_yours", sid=seq_id)

    # ---- requests, within the caps ------------------------------------------------------------------------
    def add_request(self, owner: str, prompt_ids: list[int], text: str, params: SamplingParams,
                    speculative=None) -> int:
        self._check_caps(owner, len(prompt_ids), params)
        sid = self.engine.add_request(prompt_ids=prompt_ids, prompt=text, params=params, speculative=speculative,
                                      owner=owner)
        with self._cond:
            self._owner(owner).seq_ids.add(sid)
        return sid

    def branch(self, owner: str, seq_id: int, num_output_tokens: int) -> int:
        self.check_owner(owner, seq_id)
        v = self.engine.seq_view(seq_id)
        self._check_caps(owner, len(v.prompt_ids), v.params)
        sid = self.engine.branch(seq_id, num_output_tokens)
        with self._cond:
            self._owner(owner).seq_ids.add(sid)
        self.pool_changed()
        return sid

    def _check_caps(self, owner: str, prompt_len: int, params: SamplingParams) -> None:
        lim = self.limits
        o = self._owner(owner)
        live = [v for v in (self._view(s) for s in list(o.seq_ids)) if v is not None and not v.finished]
        if len(live) >= lim.max_seqs_per_owner:
            raise Refusal("cap_seqs", n=len(live), max=lim.max_seqs_per_owner)
        prompt_tokens = sum(len(v.prompt_ids) for v in live) + prompt_len
        if prompt_tokens > lim.max_prompt_tokens_per_owner:
            raise Refusal("cap_prompt", n=prompt_tokens, max=lim.max_prompt_tokens_per_owner)
        blocks = sum(self._worst_blocks(len(v.prompt_ids), v.params) for v in live)
        need = self._worst_blocks(prompt_len, params)
        if blocks + need > self.max_blocks_per_owner:
            raise Refusal("cap_blocks", need=need, have=blocks, max=self.max_blocks_per_owner)
        with self._cond:
            total = sum(len(x.seq_ids) for x in self._owners.values())
        if total >= lim.max_seqs:
            raise Refusal("cap_room", n=total)

    def _worst_blocks(self, prompt_len: int, params: SamplingParams) -> int:
        tokens = min(prompt_len + params.max_tokens, self.engine.max_model_len)
        return math.ceil(tokens / self.engine.block_size)

    def _view(self, seq_id: int):
        try:
            return self.engine.seq_view(seq_id)
        except ValueError:  # released meanwhile
            return None

    # ---- grants -----------------------------------------------------------------------------------------
    def step(self, owner: str) -> list[StepEvent]:
        """Grant this owner's sequences one engine step and wait for it; returns the owner's new events (its
        share of every step run for it since it last asked; empty when it has nothing to run)."""
        with self._cond:
            o = self._owner(owner)
            if not self.engine.has_unfinished(owner):
                return self._take(o)
            target = o.served + 1
            if o.grant != math.inf:
                o.grant += 1
            self._cond.notify_all()
            while o.served < target and owner in self._owners and not self._closed:
                self._cond.wait(1.0)
            return self._take(o)

    def run(self, owner: str) -> None:
        """Grant steps until `pause` (or until the owner's sequences have all finished)."""
        with self._cond:
            self._owner(owner).grant = math.inf
            self._cond.notify_all()

    def pause(self, owner: str) -> None:
        """End a Run; returns once a step already running for this owner has finished (its event is then in the
        owner's inbox: what the page shows after Pause is what the engine did)."""
        with self._cond:
            o = self._owners.get(owner)
            if o is not None and o.grant == math.inf:
                o.grant = 0
            self._cond.notify_all()
            while owner in self._stepping and not self._closed:
                self._cond.wait(1.0)

    def wait(self, owner: str, timeout: float = 30.0) -> list[StepEvent]:
        """A running owner's next events: returns as soon as there are some, or when its grant has ended."""
        deadline = time.monotonic() + timeout
        with self._cond:
            o = self._owner(owner)
            while not o.inbox and o.error is None and o.grant > 0 and owner in self._owners:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            return self._take(o)

    def frame_interval(self) -> float:
        """Seconds between a running page's frames: 0.2 s alone, 25 ms more per running owner, at most 0.5 s
        (twenty running tabs then build forty frames a second in all: measured with bench/room.py, a 1 s pace
        kept p95 frame gaps near 2 s, 0.5 s brought them under 1.5 s with no loss of room throughput)."""
        with self._cond:
            runners = sum(1 for o in self._owners.values() if o.grant == math.inf)
        return min(FRAME_MAX_S, max(FRAME_MIN_S, FRAME_PER_RUNNER_S * runners))

    def running(self, owner: str) -> bool:
        o = self._owners.get(owner)
        return o is not None and o.grant == math.inf

    def _take(self, o: Owner) -> list[StepEvent]:
        if o.error is not None:
            exc, o.error = o.error, None
            raise exc
        events = list(o.inbox)
        o.inbox.clear()
        return events

    # ---- the engine loop --------------------------------------------------------------------------------
    def _granted(self) -> list[Owner]:
        """Owners holding a grant and having work; a grant with nothing left to run ends here."""
        out = []
        for o in self._owners.values():
            if o.grant > 0:
                if self.engine.has_unfinished(o.label):
                    out.append(o)
                else:
                    o.grant, o.served = 0, o.served + 1
                    self._cond.notify_all()
        return out

    def _loop(self) -> None:
        while True:
            with self._cond:
                granted = self._granted()
                while not granted and not self._closed:
                    self._cond.wait(1.0)
                    granted = self._granted()
                if self._closed:
                    return
                capture = self._capture_for(granted)
                self._stepping = {o.label for o in granted}
            self.engine.capture_seq_ids = capture  # only what the granted owners view is instrumented
            self._pages_turn.clear()
            started = time.monotonic()
            t0 = time.perf_counter()
            try:
                event = self.engine.step(trace=True, owners=[o.label for o in granted])
            except StepFailed as exc:
                self._failed(granted, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - the loop must outlive anything; owners get the error
                log.exception("room step failed")
                self._failed(granted, exc)
                continue
            else:
                self._deliver(granted, event, (time.perf_counter() - t0) * 1e3, started)
            finally:
                self._pages_turn.set()  # until the next step: its pages may be built now

    def _capture_for(self, granted: list[Owner]) -> set[int]:
        """The sequences this step captures: every viewed sequence of an owner whose page shows a capture chart,
        and of the rest at most ROOM_BACKGROUND_CAPTURES, those captured longest ago first (in turn)."""
        shown: set[int] = set()
        rest: list[int] = []
        for o in granted:
            wanted = o.capture() & o.seq_ids
            if o.shown():
                shown |= wanted
            else:
                rest += sorted(wanted)
        rest.sort(key=lambda sid: self._captured_at.get(sid, -1))
        chosen = shown | set(rest[:ROOM_BACKGROUND_CAPTURES])
        for sid in chosen:
            self._captured_at[sid] = self.steps
        if len(self._captured_at) > 4 * self.limits.max_seqs:  # finished sequences' entries: forgotten
            live = {sid for o in self._owners.values() for sid in o.seq_ids}
            self._captured_at = {k: v for k, v in self._captured_at.items() if k in live}
        return chosen

    def _forward_turn(self, inside: bool) -> None:
        (self._pages_turn.set if inside else self._pages_turn.clear)()

    def page_turn(self) -> None:
        """Called by a page build before each chart: returns at once unless the engine is in a Python phase of
        a step, then when that phase ends (bounded: a page never waits long for a stuck engine)."""
        self._pages_turn.wait(PAGE_WAIT_S)

    def _failed(self, granted: list[Owner], exc: Exception) -> None:
        with self._cond:
            for o in granted:
                o.error, o.grant, o.served = exc, 0, o.served + 1
            self._stepping = set()
            self._cond.notify_all()

    def _deliver(self, granted: list[Owner], event: StepEvent, call_ms: float,
                 started: float | None = None) -> None:
        ended = time.monotonic()
        record = self._record(event)
        t = event.timing
        with self._cond:
            # before the owners are woken: a request's thread reading this event finds its step's times
            self._walls[event.step] = (ended if started is None else started, ended)
            while len(self._walls) > STEP_WALLS:
                self._walls.popitem(last=False)
            if event.batch:
                self.step_tokens[sum((b["num_processed"] if b["phase"] == "prefill" else 0) + b["num_emitted"]
                                     for b in event.batch)] += 1
            for o in granted:
                if o.grant != math.inf:
                    o.grant = max(0, o.grant - 1)  # a Pause during the step already ended the grant
                o.served += 1
                if o.label in self._owners:
                    o.inbox.append(event.for_owner(o.label))
            for b in event.batch:
                x = self._owners.get(b["owner"])
                if x is not None:
                    x.tokens += b["num_emitted"]
            self.history.append(record)
            self.steps += 1
            self.tokens += sum(b["num_emitted"] for b in event.batch)
            self.batch_sizes[len(event.batch)] += 1
            self.time_ms.update({"step_call": call_ms, "step": t.step_ms, "forward": t.forward_ms,
                                 "sample": t.sample_ms, "draft": t.draft_ms, "schedule": t.schedule_ms})
            self._stepping = set()
            self._cond.notify_all()

    def _record(self, event: StepEvent) -> dict:
        """The step in brief for the room view (labels and counts only)."""
        owner = event.owners.get
        reasons = {s.seq_id: s.finish_reason for s in event.seqs}
        kv = event.kv
        queried = kv.prefix_query_tokens
        return {
            "step": event.step, "t": time.time(), "step_ms": event.timing.step_ms,
            "batch": [{**b, "phase": "verify" if b.get("num_drafted") else b["phase"]} for b in event.batch],
            "admitted": [{"seq_id": s, "owner": owner(s, "")} for s in event.admitted],
            "preempted": [{"seq_id": s, "owner": owner(s, "")} for s in event.preempted],
            "finished": [{"seq_id": s, "owner": owner(s, ""), "reason": reasons.get(s)} for s in event.finished],
            "waiting": [{"seq_id": s, "owner": owner(s, "")} for s in event.waiting],
            "held": len(set(event.running) - {b["seq_id"] for b in event.batch}),
            "pool": {"num_blocks": kv.num_blocks, "used": kv.used, "cached": kv.cached, "free": kv.free,
                     "shared": kv.shared, "hit_tokens": kv.prefix_hit_tokens, "prompt_tokens": queried,
                     "hit_rate": kv.prefix_hit_tokens / queried if queried else None},
        }

    # ---- what the room view and /healthz read ------------------------------------------------------------
    def records(self) -> list[dict]:
        with self._cond:
            return list(self.history)

    def version(self) -> tuple[int, int]:
        """What the room view draws has changed when this has: steps run, and pool changes outside a step."""
        with self._cond:
            return self.steps, self._pool_changes

    def block_owners(self) -> list[str]:
        """Each block of the shared pool: "" free, "cached", "shared" (held by several owners), or its owner.

        Drawn once per pool change, not once per page: twenty tabs viewing the room would otherwise each walk
        the whole pool, waiting for the engine's lock through every running step."""
        with self._cond:
            version = (self.steps, self._pool_changes)
            if self._pool_view[0] == version:
                return self._pool_view[1]
        out = self._block_owners()
        with self._cond:
            self._pool_view = (version, out)
        return out

    def _block_owners(self) -> list[str]:
        states = self.engine.kv_block_states()
        owner_of = self.engine.seq_owners()
        out = []
        for b in states:
            owners = {owner_of.get(s, "") for s in b["owners"]}
            if not owners:
                out.append("cached" if b["state"] == "cached" else "")
            else:
                out.append(owners.pop() if len(owners) == 1 else "shared")
        return out

    def step_wall(self, step: int) -> tuple[float, float] | None:
        """(start, end) of a recent step on time.monotonic()'s clock; None once it is STEP_WALLS steps old."""
        with self._cond:
            return self._walls.get(step)

    def step_token_counts(self) -> dict[int, int]:
        """Tokens per step (prompt tokens prefilled + tokens sampled) -> how many steps had that many."""
        with self._cond:
            return dict(self.step_tokens)

    def alive(self) -> bool:
        """The engine loop still runs (what /health reports)."""
        return self._thread.is_alive() and not self._closed

    def stats(self) -> dict:
        with self._cond:
            return {"owners": len(self._owners), "steps": self.steps, "tokens": self.tokens,
                    "batch_hist": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                    "max_batch": max(self.batch_sizes, default=0),
                    "time_ms": {k: round(v, 1) for k, v in self.time_ms.items()},
                    "running": sum(1 for o in self._owners.values() if o.grant == math.inf)}

    def close(self) -> None:
        engine_turn.unregister(self._pages_turn)
        self._pages_turn.set()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
