"""Requests and the step scheduler: continuous batching, chunked prefill, preemption by recompute.

Each step gets a token budget. Running sequences go first (a decode needs one token, an unfinished prefill
its next chunk); when the pool has no block for a running sequence, the newest running sequence is preempted:
its blocks are freed and it waits at the head of the queue to be recomputed later (its prefix blocks may still
be in the cache then). Waiting requests are admitted in arrival order while the budget and the pool allow;
a prompt longer than the remaining budget is prefilled in chunks over several steps. Sequences join and
leave between steps, which is all that "continuous batching" means.

Several owners (browser tabs, the lecture, API clients) may share one scheduler. A step may then be limited to
the sequences of some owners (`eligible`): the others are held, keeping their blocks and their place (when the
pool runs short, preemption may take a held sequence like any other: a paused tab must not sit on the pool). With more
than one owner in a step, admission takes the owners in turn (each one's queue stays in arrival order), a
prefill chunk gets at most an equal share of the step's token budget, and preemption takes the newest sequence
of the owner holding the most blocks, so one tab's long prompt cannot starve the room. With one owner all of
this is the plain FIFO policy above.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from .kv_cache import BlockManager
from .sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float  # engine clock at add_request
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose K/V are in the pool
    num_cached_tokens: int = 0  # prefix hit at the last admission
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    detok: object = None  # engine.tokenizer.IncrementalDetokenizer
    forced_token: int | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_text: str = ""
    preemptions: int = 0
    parent_id: int | None = None
    last_sampling: tuple | None = None  # (logits, prompt_ids, output_ids, u) of the last traced draw
    spec: object = None  # engine.speculative.SpecState when the request speculates
    spec_k: int = 0  # drafts the next decode step may verify (the engine keeps it within max_tokens/context)
    owner: str = ""  # who asked for it (a tab, the lecture, an API client); "" for a single-user engine
    prompt_logprobs_done: int = 0  # prompt positions whose log-probabilities a step has reported (prompt_logprobs)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_len(self) -> int:
        """What a naive allocator would reserve up front: the prompt plus every token it may generate."""
        return len(self.prompt_ids) + self.params.max_tokens

    def snapshot(self) -> tuple:
        """What one engine step may change, for `restore`. A step only appends to output_ids and token_times,
        so the list objects and their lengths stand for them (no copy of a long output on every step)."""
        return (self.output_ids, len(self.output_ids), self.token_times, len(self.token_times), self.status,
                self.num_computed, self.num_cached_tokens, self.finish_reason,
                None if self.generator is None else self.generator.get_state(),
                None if self.detok is None else self.detok.snapshot(),
                self.forced_token, self.first_token_time, self.last_token_time, self.preemptions,
                self.last_sampling, None if self.spec is None else self.spec.snapshot(), self.spec_k,
                self.prompt_logprobs_done)

    def restore(self, snap: tuple) -> None:
        (self.output_ids, n_out, self.token_times, n_times, self.status, self.num_computed, self.num_cached_tokens,
         self.finish_reason, gen_state, detok_state, self.forced_token, self.first_token_time, self.last_token_time,
         self.preemptions, self.last_sampling, spec_state, self.spec_k, self.prompt_logprobs_done) = snap
        del self.output_ids[n_out:]
        del self.token_times[n_times:]
        if gen_state is not None:
            self.generator.set_state(gen_state)
        if detok_state is not None:
            self.detok.restore(detok_state)
        if spec_state is not None:
            self.spec.restore(spec_state)


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new: int  # tokens processed this step, from seq.num_computed
    admitted: bool = False
    num_lookahead: int = 0  # extra slots reserved for speculative drafts after the pending token

    @property
    def samples(self) -> bool:
        """A token is sampled when this chunk reaches the end of the sequence."""
        return self.seq.num_computed + self.num_new == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[int]


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_batched_tokens: int = 512, max_num_seqs: int = 16):
        self.blocks = blocks
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._admitted: dict[str, int] = {}  # owner -> the admission count when it last had one (whose turn)
        self._admissions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def checkpoint(self) -> tuple:
        """The queues and every queued sequence's state (a step touches no other sequence)."""
        seqs = [(s, s.snapshot()) for s in (*self.waiting, *self.running)]
        return list(self.waiting), list(self.running), self.num_preemptions, seqs, dict(self._admitted), \
            self._admissions

    def restore(self, ck: tuple) -> None:
        waiting, running, self.num_preemptions, seqs, self._admitted, self._admissions = ck
        self.waiting, self.running = deque(waiting), list(running)
        for seq, snap in seqs:
            seq.restore(snap)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and free its blocks (finish or abort)."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq.seq_id in self.blocks.block_tables:
            self.blocks.free(seq.seq_id)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.seq_id)
        seq.status = Status.WAITING
        seq.num_computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _victim(self, scheduled: set[int]) -> Sequence:
        """Whom to preempt: among running sequences not yet given work this step, the newest one of the owner
        whose running sequences hold the most blocks (with one owner: simply the newest)."""
        candidates = [s for s in self.running if s.seq_id not in scheduled]
        held: dict[str, int] = {}
        for s in self.running:
            held[s.owner] = held.get(s.owner, 0) + len(self.blocks.block_tables.get(s.seq_id, ()))
        greediest = max(held[s.owner] for s in candidates)
        return [s for s in candidates if held[s.owner] == greediest][-1]

    def admission_order(self, eligible: Callable[[Sequence], bool] | None = None) -> list[Sequence]:
        """Eligible waiting sequences in the order they would be admitted: owners take turns, the one admitted
        least recently first (across steps: when one seat frees per step, owners still alternate), each
        owner's own queue in arrival order."""
        queues: dict[str, list[Sequence]] = {}
        for seq in self.waiting:
            if eligible is None or eligible(seq):
                queues.setdefault(seq.owner, []).append(seq)
        turn = sorted(queues, key=lambda o: self._admitted.get(o, -1))  # stable: ties keep queue order
        order, depth = [], 0
        while True:
            layer = [queues[o][depth] for o in turn if depth < len(queues[o])]
            if not layer:
                return order
            order.extend(layer)
            depth += 1

    def _take_turn(self, owner: str) -> None:
        self._admissions += 1
        self._admitted[owner] = self._admissions
        if len(self._admitted) > 4 * self.max_num_seqs + 64:  # owners long gone: keep those still queued
            queued = {s.owner for s in (*self.waiting, *self.running)}
            self._admitted = {o: n for o, n in self._admitted.items() if o in queued}

    def _prefill_share(self, active: list[Sequence], arriving: list[Sequence]) -> int:
        """The most tokens one prefill chunk may take this step. With one owner: the whole budget (the plain
        policy). With several: what the step's decodes leave, shared equally by the owners that prefill (at
        least a block, so every chunk makes progress), so a long prompt first in line cannot take the budget
        that another tab's decode or short prompt needs."""
        owners = {s.owner for s in active} | {s.owner for s in arriving}
        if len(owners) <= 1:
            return self.max_num_batched_tokens
        decodes = sum(1 for s in active if s.num_tokens - s.num_computed <= 1)
        prefilling = {s.owner for s in active if s.num_tokens - s.num_computed > 1} | {s.owner for s in arriving}
        return max(self.blocks.block_size, (self.max_num_batched_tokens - decodes) // max(1, len(prefilling)))

    def schedule(self, eligible: Callable[[Sequence], bool] | None = None) -> SchedulerOutput:
        """Plan one step. `eligible`: which sequences may take part (None: all); the others are held."""
        eligible = eligible or (lambda seq: True)
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[int] = []
        active = [s for s in self.running if eligible(s)]
        arriving = self.admission_order(eligible)
        share = self._prefill_share(active, arriving)

        # 1. running sequences, oldest first; make room by preempting (see _victim)
        for seq in active:
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:
                continue  # preempted to make room for an older one
            n = min(seq.num_tokens - seq.num_computed, budget, share)
            # the table may already cover more (a whole prompt is allocated at admission, then chunked)
            target = max(seq.num_computed + n, self.blocks.seq_lens[seq.seq_id])
            done = {item.seq.seq_id for item in scheduled}
            while not self.blocks.can_append(seq.seq_id, target):
                victim = self._victim(done)
                self._preempt(victim)
                preempted.append(victim.seq_id)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue  # it preempted itself
            self.blocks.append(seq.seq_id, target)
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n

        # 2. waiting requests (owners in turn), while budget, seats and blocks allow; held sequences keep
        #    their seats out of the count: seats bound a step's batch
        seats = self.max_num_seqs - sum(1 for s in self.running if eligible(s))
        for seq in arriving:
            if budget <= 0 or seats <= 0 or preempted:
                break
            # a request for prompt log-probabilities computes every prompt position: it reads no cached prefix
            read_cache = seq.params.prompt_logprobs is None
            if not self.blocks.can_allocate(seq.token_ids, read_cache):
                break
            self.waiting.remove(seq)
            self._take_turn(seq.owner)
            seq.num_cached_tokens = self.blocks.allocate(seq.seq_id, seq.token_ids, read_cache)
            seq.num_computed = seq.num_cached_tokens
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed, budget, share)
            scheduled.append(ScheduledSeq(seq, n, admitted=True))
            budget -= n
            seats -= 1

        # 3. speculative lookahead, from what the plain schedule left: leftover budget and truly free blocks
        #    (never evicting a cached prefix), so speculation cannot change whom this step serves or preempts
        for item in scheduled:
            seq = item.seq
            if seq.spec_k <= 0 or budget <= 0 or item.admitted or item.num_new != 1 or not item.samples \
                    or not seq.output_ids or seq.forced_token is not None:
                continue
            want = min(seq.spec_k, budget, seq.params.max_tokens - len(seq.output_ids) - 1)
            k = self.blocks.lookahead_capacity(seq.seq_id, want) if want > 0 else 0
            if k:
                self.blocks.append(seq.seq_id, self.blocks.seq_lens[seq.seq_id] + k)
                item.num_lookahead = k
                budget -= k
        return SchedulerOutput(scheduled, preempted)
