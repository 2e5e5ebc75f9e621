"""Typed records of one engine step: the only thing the UI reads.

Every field is filled by the engine from what it actually did (scheduling decisions, the sampled token with
its sampling trace, the bytes the detokenizer released, the block tables after the step, measured timings).
`to_dict()` gives plain JSON (no NaN/inf, tensors become nested lists) for export, replay and websockets, and
`from_dict()` builds the typed records back (engine/records.py). The parts live beside the code that fills
them: SamplingTrace (engine/sampling.py), DetokStep (engine/tokenizer.py), SpecRound (engine/speculative.py),
KVStats (engine/kv_cache.py), StepTiming and StepCost (engine/metrics.py); LogitStats is here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .kv_cache import KVStats
from .metrics import StepCost, StepTiming
from .records import Record, build
from .sampling import SamplingTrace
from .speculative import SpecRound
from .tokenizer import DetokStep

EVENT_VERSION = 1


def _int_keys(d: dict) -> dict:
    # to_dict() writes int keys (layers, sequence ids) as JSON strings
    return {int(k): v for k, v in d.items()}


def _floats(x: Any) -> torch.Tensor:
    # float32 tensors like the live capture: charts compute in the same precision, and to_dict() still works
    if isinstance(x, torch.Tensor):
        return x.float()
    try:
        return torch.from_numpy(np.array(x, dtype=np.float32))
    except TypeError:  # to_dict() wrote a non-finite value as None: the slow path puts NaN back
        return torch.from_numpy(np.array(_none_to_nan(x), dtype=np.float32))


def _none_to_nan(x: Any) -> Any:
    if isinstance(x, list):
        return [_none_to_nan(v) for v in x]
    return np.nan if x is None else x


def _ints(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.long()
    return torch.from_numpy(np.array(x, dtype=np.int64))


# The parts of a capture SeqEvent.drop_capture() can free, and the CaptureData fields each one empties.
CAPTURE_PARTS = {"attention": ("attention",), "lens": ("lens_ids", "lens_tokens", "lens_probs"),
                 "residual_norms": ("residual_norms",), "embeddings": ("embeddings",)}


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"expected an integer, got {type(x).__name__}")
    return x


def _int_list(x: Any) -> list[int]:
    if not isinstance(x, list):
        raise ValueError(f"expected a list, got {type(x).__name__}")
    return [_int(v) for v in x]


def _parts(x: Any) -> list[str]:
    if not isinstance(x, list) or not all(isinstance(p, str) and p in CAPTURE_PARTS for p in x):
        raise ValueError(f"expected a list of {', '.join(CAPTURE_PARTS)}")
    return list(x)


@dataclass
class CaptureData(Record):
    """Instrumentation of one sequence in one step (present only when the engine was asked for it)."""

    JSON_DIGITS = 5  # attention, lens and norms: five digits are finer than any chart shows

    positions: list[int]  # absolute positions of the rows processed this step
    attention: dict[int, Any] = field(default_factory=dict)  # layer -> [heads, rows, context] probabilities
    attention_heads: list[int] | None = None  # which heads the attention rows belong to (None: all)
    lens_positions: list[int] = field(default_factory=list)
    lens_ids: Any = None  # [layers, lens positions, k] token ids of the logit lens
    lens_tokens: list | None = None  # the same as text pieces
    lens_probs: Any = None  # [layers, lens positions, k]
    residual_norms: Any = None  # [layers + 1, rows]
    embeddings: Any = None  # [rows, hidden]
    # Capture budget (engine.model.Capture.max_attention_bytes): the absolute positions whose attention rows
    # were kept, in the order of the rows of `attention` (None: every position, as before budgets), and the
    # budget in force (None: unlimited).
    attention_positions: list[int] | None = None
    attention_budget: int | None = None
    # Parts freed after the step to save memory (CAPTURE_PARTS keys): charts say "not kept" for them.
    dropped: list[str] = field(default_factory=list)

    @property
    def attention_rows(self) -> list[int]:
        """Absolute positions of the rows in `attention` (the kept rows under a budget)."""
        if "attention" in self.dropped:
            return []
        return list(self.positions if self.attention_positions is None else self.attention_positions)

    def nbytes(self) -> int:
        """Bytes held by this capture's arrays (attention, lens, norms, embeddings), each storage once."""
        seen, total = set(), 0
        arrays = list((self.attention or {}).values()) + [self.lens_ids, self.lens_probs, self.residual_norms,
                                                           self.embeddings]
        for a in arrays:
            if isinstance(a, torch.Tensor):
                store = a.untyped_storage()
                key, size = store.data_ptr(), store.nbytes()
            elif isinstance(a, np.ndarray):
                base = a if a.base is None else a.base
                key, size = id(base), getattr(base, "nbytes", a.nbytes)
            else:
                continue
            if key not in seen:
                seen.add(key)
                total += size
        return total

    def drop(self, parts: tuple[str, ...] = ("attention",)) -> int:
        """Free `parts` (CAPTURE_PARTS keys) and remember that they were dropped; returns the bytes freed."""
        unknown = [p for p in parts if p not in CAPTURE_PARTS]
        if unknown:
            raise ValueError(f"unknown capture part(s): {', '.join(unknown)} (known: {', '.join(CAPTURE_PARTS)})")
        before = self.nbytes()
        for part in parts:
            for name in CAPTURE_PARTS[part]:
                setattr(self, name, {} if name == "attention" else None)
            if part not in self.dropped:
                self.dropped.append(part)
        return before - self.nbytes()

    @classmethod
    def from_dict(cls, d: dict) -> "CaptureData":
        """The inverse of to_dict(): nested lists come back as float32/int64 tensors, as the engine made them."""
        return build(cls, d, {
            "attention": lambda a: {k: _floats(v) for k, v in _int_keys(a).items()},
            "lens_ids": _ints, "lens_probs": _floats, "residual_norms": _floats, "embeddings": _floats,
            "attention_positions": _int_list, "attention_budget": _int, "dropped": _parts,
        })


@dataclass
class LogitStats(Record):
    """The model's raw next-token distribution at a sampled position, and where the kept token sits in it
    (perplexity and surprise charts)."""

    entropy: float  # of the softmax of the raw logits, in nats
    max_logit: float
    logsumexp: float
    token_logprob: float  # log-probability of the token kept (sampled, forced or the round's last)
    token_rank: int  # tokens with a higher raw logit (0: the argmax)


@dataclass
class PromptLogprob(Record):
    """One prompt token's log-probability under the model's raw logits at the position before it (a request
    with SamplingParams.prompt_logprobs). Position 0 has none."""

    position: int
    token_id: int
    logprob: float | None
    rank: int | None  # 1: the model's most likely token there
    top_ids: list[int] = field(default_factory=list)  # the prompt_logprobs most likely tokens, most likely first
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SeqEvent(Record):
    """What happened to one sequence in one step."""

    seq_id: int
    phase: str  # "prefill" or "decode"
    chunk_start: int  # position of the first token processed this step
    num_processed: int  # tokens whose K/V this step computed
    processed_ids: list[int]
    num_cached_tokens: int  # prefix-cache hit at admission (this step only; 0 otherwise)
    prompt_len: int
    num_tokens: int  # prompt + output after the step
    new_token: int | None = None
    new_token_text: str = ""
    forced: bool = False
    sampling: SamplingTrace | None = None  # the sampling chain stage by stage (traced steps only)
    logit_stats: LogitStats | None = None  # traced steps only
    detok: DetokStep | None = None  # what the detokenizer released or held back for the new token
    emitted: str = ""
    finished: bool = False
    finish_reason: str | None = None
    block_table: list[int] = field(default_factory=list)
    ttft_s: float | None = None  # engine time from arrival to first token (set on that step)
    itl_s: float | None = None  # engine time since this sequence's previous token
    capture: CaptureData | None = None
    spec: SpecRound | None = None  # a speculative round: drafts and their checks, final token, rollback, stats
    prompt_logprobs: list[PromptLogprob] = field(default_factory=list)  # prompt positions this chunk predicted

    def drop_capture(self, parts: tuple[str, ...] = ("attention",)) -> int:
        """Free `parts` of this step's capture (the attention by default: ~all of its bytes) to save memory;
        the charts then say those rows were not kept. Returns the bytes freed (0 without a capture)."""
        return self.capture.drop(parts) if self.capture is not None else 0


@dataclass
class StepEvent(Record):
    step: int
    seqs: list[SeqEvent]
    admitted: list[int]
    preempted: list[int]
    finished: list[int]
    waiting: list[int]
    running: list[int]
    kv: KVStats  # the pool after the step: blocks, bytes, prefix hits, the naive allocator's waste
    blocks: list[dict]  # BlockManager.block_states()
    block_tables: dict[int, list[int]]
    timing: StepTiming  # measured: schedule, draft, forward, sample, the whole step; the engine clock
    cost: StepCost  # estimated by metrics.step_cost(): bytes moved, FLOPs, intensity, tokens
    model: dict = field(default_factory=dict)  # model id and spec, filled on every event for replay
    version: int = EVENT_VERSION
    # An engine serving several owners: the owner of every sequence this event names (seq id -> owner), and
    # the whole batch in brief (seq_id, owner, phase, num_processed, num_drafted, num_emitted, grammar), which stays
    # whole in an owner's share (`for_owner`) so a tab sees who else was in its step without their contents.
    owners: dict[int, str] = field(default_factory=dict)
    batch: list[dict] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not self.seqs

    def seq(self, seq_id: int) -> SeqEvent | None:
        return next((s for s in self.seqs if s.seq_id == seq_id), None)

    def capture_nbytes(self) -> int:
        """Bytes held by the captures of all its sequences (CaptureData.nbytes)."""
        return sum(s.capture.nbytes() for s in self.seqs if s.capture is not None)

    def drop_captures(self, parts: tuple[str, ...] = ("attention",)) -> int:
        """SeqEvent.drop_capture on every sequence; returns the bytes freed."""
        return sum(s.drop_capture(parts) for s in self.seqs)

    def for_owner(self, owner: str) -> "StepEvent":
        """This step as one owner may see it: its own sequences' records and block tables in full; of everyone
        else only ids, owners, the batch in brief and the pool's block states (no tokens, no text)."""
        mine = {sid for sid, o in self.owners.items() if o == owner}
        return replace(self, seqs=[s for s in self.seqs if s.seq_id in mine],
                       block_tables={k: v for k, v in self.block_tables.items() if k in mine})

    @classmethod
    def from_dict(cls, d: dict) -> "StepEvent":
        """The inverse of to_dict(); raises ValueError for a malformed record or a newer event version."""
        if isinstance(d, dict) and isinstance(d.get("version"), int) and d["version"] > EVENT_VERSION:
            raise ValueError(f"event version {d['version']} is newer than this app reads ({EVENT_VERSION})")
        return build(cls, d, {
            "block_tables": lambda t: {k: list(v) for k, v in _int_keys(t).items()},
            "owners": lambda o: {k: str(v) for k, v in _int_keys(o).items()},
        })


def event_from_dict(d: dict) -> StepEvent:
    """A StepEvent from its to_dict() form (replayed traces, websocket followers)."""
    return StepEvent.from_dict(d)
