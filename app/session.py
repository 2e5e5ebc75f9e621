"""One browser tab's lab session: its own engine (own KV pool, shared weights), its requests and events.

The UI never touches engine internals directly: handlers call a LabSession method and render the events it
keeps. A registry maps Gradio's session_hash to sessions so a closed tab frees its KV at once (demo.unload),
and idle sessions are swept after a timeout as a safety net.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from engine import Capture, Engine, SamplingParams, StepEvent
from engine.scheduler import Status
from engine.tokenizer import bpe_merges, render_prompt, token_info

MAX_EVENTS = 400  # enough for a lecture; older events are dropped (their charts scroll away anyway)
MAX_PROMPT_CHARS = 20000


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
    what_if: dict | None  # a hypothetical sampling chain to show instead of the focused one's last

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
    engine: Engine
    events: list[StepEvent] = field(default_factory=list)
    requests: dict[int, RequestInfo] = field(default_factory=dict)
    focus: int | None = None  # the sequence the per-sequence panels show
    last_used: float = field(default_factory=time.time)
    lock: threading.RLock = field(default_factory=threading.RLock)
    running: bool = False  # a Run loop is active (Pause clears it)
    what_if: dict | None = None  # the focused sequence's chain recomputed for new slider values, until a step
    sent_html: dict = field(default_factory=dict)  # the HTML pieces the page already shows (sent only on change)
    sent_figs: dict = field(default_factory=dict)  # chart id -> the figure the page last got (ui._drop_unchanged)
    speculative: object = None  # engine.SpeculativeConfig for the requests this tab starts next (None: plain)
    spec_comparison: dict | None = None  # the last measured speculative-vs-plain run (engine.speculative)
    tour: dict | None = None  # the guided tour's current step {"panel", "index", "at"} (shown to lecture viewers)
    # step number -> the small view state right after that step (focus, each sequence's token ids): what a
    # replayed trace needs to draw the same panels without a tokenizer or KV state (app/trace.py)
    views: dict[int, dict] = field(default_factory=dict)

    @classmethod
    def create(cls, base: Engine, kv_memory: int | None = None) -> "LabSession":
        overrides = {} if kv_memory is None else {"kv_memory": kv_memory}
        eng = base.session(**overrides)
        # The lab shows everything: attention of every layer and head, a 5-deep logit lens, norms, embeddings.
        eng.instrument = Capture(lens_top_k=5, lens_max_positions=16)
        return cls(eng)

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt: str, params: SamplingParams, chat: bool, system: str | None) -> int:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must not be empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt is {len(prompt)} characters; the lab accepts up to {MAX_PROMPT_CHARS}")
        system = system if (chat and system and system.strip()) else None
        rendered = render_prompt(self.engine.tokenizer, prompt, chat=chat, system=system)
        with self.lock:
            rid = self.engine.add_request(prompt_ids=rendered.token_ids, prompt=rendered.text, params=params,
                                          speculative=self.speculative)
            self.requests[rid] = RequestInfo(rid, prompt, chat, system, rendered.text, rendered.spans,
                                             list(rendered.token_ids))
            if self.focus is None or self.engine.sequences[self.focus].status is Status.FINISHED:
                self.focus = rid
            return rid

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> StepEvent | None:
        """One engine step; None when there is nothing to do."""
        with self.lock:
            self.last_used = time.time()
            if not self.engine.has_unfinished():
                return None
            event = self.engine.step(trace=True)
            self.what_if = None  # the new step used the sliders' values: nothing is hypothetical any more
            self.events.append(event)
            del self.events[:-MAX_EVENTS]
            self.views[event.step] = self.view_state()
            if len(self.views) > len(self.events):
                keep = {e.step for e in self.events}
                self.views = {k: v for k, v in self.views.items() if k in keep}
            return event

    def reset(self) -> None:
        with self.lock:
            for sid, seq in list(self.engine.sequences.items()):
                if seq.status is not Status.FINISHED:
                    self.engine.abort(sid)
            self.events.clear()
            self.views.clear()
            self.requests.clear()
            self.focus = None
            self.running = False
            self.what_if = None

    def close(self) -> None:
        self.reset()

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
        return seq_id in self.engine.sequences

    def seq_token_ids(self, seq_id: int) -> list[int]:
        return list(self.engine.sequences[seq_id].token_ids)

    def prompt_len(self, seq_id: int) -> int:
        return len(self.engine.sequences[seq_id].prompt_ids)

    def seq_status(self, seq_id: int) -> str:
        """The finish reason of a finished sequence, else its scheduler status ("waiting", "running", ...)."""
        seq = self.engine.sequences[seq_id]
        return seq.finish_reason or seq.status.value

    def token_texts(self, seq_id: int) -> list[str]:
        seq = self.engine.sequences[seq_id]
        return [self.engine.token_text(t) for t in seq.token_ids]

    def token_infos(self, seq_id: int) -> list[dict]:
        return token_info(self.engine.tokenizer, self.engine.sequences[seq_id].token_ids)

    def bpe(self, word: str) -> list[dict]:
        return bpe_merges(self.engine.tokenizer, word)

    def nearest(self, token_id: int, k: int = 10) -> list[tuple[int, str, float]]:
        return self.engine.nearest_tokens(int(token_id), k)

    def view_state(self) -> dict:
        """The small state replay needs to redraw the panels as they are now (see `views`)."""
        with self.lock:
            seqs = {}
            for sid in self.requests:
                seq = self.engine.sequences.get(sid)
                if seq is not None:
                    seqs[sid] = {"token_ids": list(seq.token_ids), "prompt_len": len(seq.prompt_ids),
                                 "status": seq.finish_reason or seq.status.value}
            return {"focus": self.focus, "seqs": seqs}

    def last_seq_event(self, seq_id: int, with_sampling: bool = True):
        return last_seq_event(self.events, seq_id, with_sampling)

    def updated_params(self, params: SamplingParams) -> None:
        """New slider values apply to the focused sequence from its next step on."""
        if self.focus is not None and self.focus in self.engine.sequences:
            seq = self.engine.sequences[self.focus]
            if seq.status is not Status.FINISHED:
                seq.params = params


class SessionRegistry:
    """session_hash -> LabSession, sharing one loaded base engine."""

    def __init__(self, base: Engine | None = None, idle_timeout_s: float = 1800.0, kv_memory: int | None = None):
        self.base = base
        self.sessions: dict[str, LabSession] = {}
        self.idle_timeout_s = idle_timeout_s
        self.kv_memory = kv_memory
        self._lock = threading.Lock()

    def get(self, key: str) -> LabSession:
        with self._lock:
            self._sweep()
            if key not in self.sessions:
                if self.base is None:  # a replayed trace (put) works without a model; a live session does not
                    raise RuntimeError("the model is still loading")
                self.sessions[key] = LabSession.create(self.base, self.kv_memory)
            return self.sessions[key]

    def put(self, key: str, session) -> None:
        """Replace a tab's session (e.g. with a ReplaySession); the old one is freed."""
        with self._lock:
            old = self.sessions.pop(key, None)
            self.sessions[key] = session
        if old is not None and old is not session:
            old.close()

    def drop(self, key: str) -> None:
        with self._lock:
            session = self.sessions.pop(key, None)
        if session is not None:
            session.close()

    def _sweep(self) -> None:
        now = time.time()
        for key, s in list(self.sessions.items()):
            if now - s.last_used > self.idle_timeout_s:
                self.sessions.pop(key).close()
