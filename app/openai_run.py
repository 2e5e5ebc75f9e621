"""One API request as an owner in the room's shared engine: its sequences batch with every tab's and show in the
room view under the request's own label ("api 3").

`RoomRun.start` joins the room as a new owner, adds one sequence per choice (all or none: a refused choice
releases the ones already added) and grants them steps until they finish, as a tab's Run does. A pump thread
waits on the owner's events (Room.wait blocks) and turns each sampled token into a `Delta`: its text as the
engine's streaming detokenizer released it (stop strings held back and cut), and its log-probabilities from
the distribution the token was drawn from (the sampling chain's last stage). The asyncio side reads deltas
from a queue. `close` leaves the room: every sequence is released at once, finished or not, so a client that
disconnects mid-stream gives its KV blocks back at once.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass

from engine.tokenizer import token_bytes

from .i18n import Refusal
from .metrics_api import RequestClock
from .openai_schema import FINISH, ApiError, Job

log = logging.getLogger("inferlab")

WAIT_S = 1.0  # the pump's longest wait on the room before it checks whether the run was closed
ROOM_FULL = {"cap_room"}  # refusals that say "busy, try later" (429), not "this request is wrong" (400)


# The room's refusals speak to a tab ("press Reset"); an API client is told what to change in its request.
API_REFUSALS = {
    "cap_blocks": "this request may need {need} KV blocks (each choice's prompt + max_tokens); one request may "
                  "reserve {max} of the shared pool; lower max_tokens or n",
    "cap_prompt": "this request's prompts would hold {n} tokens over its choices; one request may hold {max}; lower n "
                  "or shorten the prompt",
    "cap_seqs": "one request may run {max} sequences at once",
}


def _refusal_text(exc: Refusal) -> str:
    text = API_REFUSALS.get(exc.phrase.key)
    return text.format(**exc.phrase.fields) if text else str(exc)


@dataclass(frozen=True)
class TokenInfo:
    token_id: int
    text: str  # the token's bytes as text (an incomplete UTF-8 character reads U+FFFD)
    bytes: list[int]
    logprob: float


@dataclass(frozen=True)
class Delta:
    """One sampled token of one choice."""

    index: int  # the choice
    text: str  # what the detokenizer released with this token ("" while it holds bytes or a stop prefix)
    token: TokenInfo | None  # with its log-probability when the job asked for logprobs
    top: tuple[TokenInfo, ...]  # the most probable alternatives (job.logprobs of them)
    finish_reason: str | None
    token_id: int = -1  # the sampled token (vLLM's return_token_ids)
    prompt: tuple = ()  # the prompt positions' log-probabilities that arrived with it (PromptLogprob records)


class RoomRun:
    def __init__(self, room, job: Job, metrics, kind: str = "api"):
        self.room, self.job, self.metrics = room, job, metrics
        self.kind = kind  # the owner's label in the room: "api 3", or "follower 2" for a room load's request
        self.engine = room.engine
        self.owner: str | None = None
        self.choice_of: dict[int, int] = {}  # seq id -> choice index
        self.arrival = time.monotonic()
        self.clock = RequestClock(self.arrival)  # its queue, prefill and decode times, for /metrics
        self.tokens = [0] * (len(job.prompts) * job.n)
        self.finish: dict[int, str] = {}  # choice index -> finish reason
        self._prompt_lp: dict[int, list] = {}  # choice index -> prompt log-probabilities not yet handed on
        self._last: dict[int, float] = {}  # choice index -> when its last token came
        self._closed = threading.Event()
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.job.prompts)

    # ---- start and stop ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Join, add every choice's sequence and grant them steps (blocking: the engine's lock may be held by
        a running step). Raises ApiError when the room refuses; nothing is left behind then."""
        owner = self.room.join(self.kind)
        try:
            for index, p, params in self.job.choices():
                prompt = self.job.prompts[p]
                sid = self.room.add_request(owner, list(prompt.token_ids), prompt.text or "", params)
                self.choice_of[sid] = index
        except Refusal as exc:
            self.room.leave(owner)
            busy = exc.phrase.key in ROOM_FULL
            raise ApiError(_refusal_text(exc), None, "server_busy" if busy else "request_too_large",
                           429 if busy else 400, "rate_limit_exceeded" if busy else "invalid_request_error") from None
        except ValueError as exc:  # the engine's own checks (context, pool size)
            self.room.leave(owner)
            raise ApiError(str(exc)) from None
        except BaseException:
            self.room.leave(owner)
            raise
        self.owner = owner
        self.metrics.request_started(self.prompt_tokens)
        self.room.run(owner)

    async def begin(self) -> None:
        """start() off the event loop, then the pump thread."""
        self._loop, self._queue = asyncio.get_running_loop(), asyncio.Queue()
        await asyncio.to_thread(self.start)
        threading.Thread(target=self._pump, daemon=True, name=f"api-pump {self.owner}").start()

    def close(self) -> None:
        """Leave the room (idempotent, never blocks the caller): unfinished sequences are aborted and every
        block is given back now."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self.owner is None:
            return
        if len(self.finish) < len(self.tokens):
            self.metrics.request_finished("abort", sum(self.tokens), time.monotonic() - self.arrival, self)
        threading.Thread(target=self.room.leave, args=(self.owner,), daemon=True, name="api-leave").start()

    async def next(self, timeout: float | None = None) -> list[Delta] | None:
        """The next tokens (several choices' at once, in engine order); None when every choice has finished.
        Raises TimeoutError after `timeout` seconds without any, and ApiError when the engine failed."""
        item = await asyncio.wait_for(self._queue.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    # ---- the pump thread ----------------------------------------------------------------------------------
    def _put(self, item) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _pump(self) -> None:
        try:
            while not self._closed.is_set() and len(self.finish) < len(self.tokens):
                events = self.room.wait(self.owner, timeout=WAIT_S)
                if events:
                    deltas = self._deltas(events)
                    if deltas:
                        self._put(deltas)
                elif not self.room.running(self.owner) and len(self.finish) < len(self.tokens):
                    raise ApiError("the engine stopped this request before it finished", code="aborted",
                                   status=500, kind="server_error")
            if len(self.finish) == len(self.tokens):
                self.metrics.request_finished(self._reason(), sum(self.tokens), time.monotonic() - self.arrival,
                                              self)
        except ApiError as exc:
            self._put(exc)
        except Exception as exc:  # noqa: BLE001 - a failed step (StepFailed) or a room that was left
            if not self._closed.is_set():
                log.warning("api run %s failed: %s", self.owner, exc)
                self._put(ApiError(f"the engine failed: {exc}", code="engine_error", status=500, kind="server_error"))
        finally:
            self._put(None)

    def _reason(self) -> str:
        reasons = set(self.finish.values())
        return reasons.pop() if len(reasons) == 1 else "mixed"

    def _deltas(self, events) -> list[Delta]:
        out = []
        now = time.monotonic()
        for event in events:
            self.clock.saw(event, self.room)
            for ev in event.seqs:
                index = self.choice_of.get(ev.seq_id)
                if index is None:
                    continue
                if ev.prompt_logprobs:  # a prefill chunk's prompt positions: handed on with the first token
                    self._prompt_lp.setdefault(index, []).extend(ev.prompt_logprobs)
                if ev.new_token is None:
                    continue  # a prefill chunk that sampled nothing
                self._time(index, now)
                self.tokens[index] += 1
                reason = FINISH.get(ev.finish_reason, "stop") if ev.finished else None
                if reason is not None:
                    self.finish[index] = reason
                token, top = self._logprobs(ev) if self.job.logprobs is not None else (None, ())
                out.append(Delta(index, ev.emitted, token, top, reason, ev.new_token,
                                 tuple(self._prompt_lp.pop(index, ()))))
        return out

    def _time(self, index: int, now: float) -> None:
        last = self._last.get(index)
        if last is None:
            self.metrics.first_token(now - self.arrival)
        else:
            self.metrics.token_gap(now - last)
        self._last[index] = now

    def _logprobs(self, ev) -> tuple[TokenInfo | None, tuple[TokenInfo, ...]]:
        """The token's log-probability and the most probable alternatives in the distribution the token was
        drawn from: the sampling chain's last stage (after penalties, temperature, min-p, top-k and top-p;
        tokens a cut removed have probability 0 and are left out). Greedy decoding takes the argmax of the
        penalised logits, so there the distribution is their softmax (a one-hot would say nothing). The
        trace follows the 20 most likely tokens, which covers OpenAI's largest top_logprobs."""
        trace = ev.sampling
        if trace is None:
            return None, ()
        # by name: a constrained or biased chain records its grammar and bias stages before the penalties
        stage = next(s for s in trace.stages if s.name == "penalties") if trace.greedy else trace.stages[-1]
        probs = dict(zip(trace.token_ids, stage.probs))
        kept = sorted(((p, t) for t, p in probs.items() if p > 0), key=lambda x: -x[0])
        top = tuple(self._info(t, p) for p, t in kept[: self.job.logprobs])
        return self._info(ev.new_token, probs.get(ev.new_token, trace.chosen_prob)), top

    def _info(self, token_id: int, prob: float) -> TokenInfo:
        return self.info(token_id, math.log(prob) if prob > 0 else -9999.0)

    def info(self, token_id: int, logprob: float | None) -> TokenInfo:
        data = token_bytes(self.engine.tokenizer, token_id)
        return TokenInfo(token_id, data.decode("utf-8", errors="replace"), list(data), logprob)
