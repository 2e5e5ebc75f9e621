"""One browser tab's lab session: its own engine (own KV pool, shared weights), its requests and events.

The UI never touches engine internals directly: handlers call a LabSession method and render the events it
keeps. A registry maps Gradio's session_hash to sessions so a closed tab frees its KV at once (demo.unload),
and idle sessions are swept after a timeout as a safety net.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from engine import Capture, Engine, SamplingParams, StepEvent
from engine.scheduler import Status
from engine.tokenizer import render_prompt, token_info

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
            rid = self.engine.add_request(prompt_ids=rendered.token_ids, prompt=rendered.text, params=params)
            self.requests[rid] = RequestInfo(rid, prompt, chat, system, rendered.text, rendered.spans,
                                             list(rendered.token_ids))
            if self.focus is None or self.engine.sequences[self.focus].status is Status.FINISHED:
                self.focus = rid
            return rid

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
            return event

    def reset(self) -> None:
        with self.lock:
            for sid, seq in list(self.engine.sequences.items()):
                if seq.status is not Status.FINISHED:
                    self.engine.abort(sid)
            self.events.clear()
            self.requests.clear()
            self.focus = None
            self.running = False
            self.what_if = None

    def close(self) -> None:
        self.reset()

    # ---- views ------------------------------------------------------------------------------------
    def seq_ids(self) -> list[int]:
        return sorted(self.requests)

    def token_texts(self, seq_id: int) -> list[str]:
        seq = self.engine.sequences[seq_id]
        return [self.engine.token_text(t) for t in seq.token_ids]

    def token_infos(self, seq_id: int) -> list[dict]:
        return token_info(self.engine.tokenizer, self.engine.sequences[seq_id].token_ids)

    def last_seq_event(self, seq_id: int, with_sampling: bool = True):
        for ev in reversed(self.events):
            s = ev.seq(seq_id)
            if s is not None and (not with_sampling or s.sampling is not None):
                return ev, s
        return None, None

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
        if self.base is None:
            raise RuntimeError("the model is still loading")
        with self._lock:
            self._sweep()
            if key not in self.sessions:
                self.sessions[key] = LabSession.create(self.base, self.kv_memory)
            return self.sessions[key]

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
