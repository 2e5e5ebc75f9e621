"""Typed records of one engine step: the only thing the UI reads.

Every field is filled by the engine from what it actually did (scheduling decisions, the sampled token with
its sampling trace, the bytes the detokenizer released, the block tables after the step, measured timings).
`to_dict()` gives plain JSON (no NaN/inf, tensors become nested lists) for export, replay and websockets.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import torch

EVENT_VERSION = 1


def jsonable(value: Any, digits: int = 6) -> Any:
    """Convert tensors/dataclasses/floats into JSON-safe values (non-finite floats become None)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.is_floating_point():
            return jsonable(value.float().tolist(), digits)
        return value.tolist()
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value), digits)
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, digits) for v in value]
    return value


@dataclass
class CaptureData:
    """Instrumentation of one sequence in one step (present only when the engine was asked for it)."""

    positions: list[int]  # absolute positions of the rows processed this step
    attention: dict[int, Any] = field(default_factory=dict)  # layer -> [heads, rows, context] probabilities
    attention_heads: list[int] | None = None  # which heads the attention rows belong to (None: all)
    lens_positions: list[int] = field(default_factory=list)
    lens_ids: Any = None  # [layers, lens positions, k] token ids of the logit lens
    lens_tokens: list | None = None  # the same as text pieces
    lens_probs: Any = None  # [layers, lens positions, k]
    residual_norms: Any = None  # [layers + 1, rows]
    embeddings: Any = None  # [rows, hidden]

    def to_dict(self) -> dict:
        return jsonable({k: v for k, v in self.__dict__.items()}, digits=5)


@dataclass
class SeqEvent:
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
    sampling: dict | None = None  # engine.sampling.SamplingTrace.to_dict()
    logit_stats: dict | None = None  # entropy of the raw softmax, max logit, the kept token's logprob and rank
    detok: dict | None = None  # engine.tokenizer.DetokStep.to_dict()
    emitted: str = ""
    finished: bool = False
    finish_reason: str | None = None
    block_table: list[int] = field(default_factory=list)
    ttft_s: float | None = None  # engine time from arrival to first token (set on that step)
    itl_s: float | None = None  # engine time since this sequence's previous token
    capture: CaptureData | None = None

    def to_dict(self) -> dict:
        return jsonable(self.__dict__)


@dataclass
class StepEvent:
    step: int
    seqs: list[SeqEvent]
    admitted: list[int]
    preempted: list[int]
    finished: list[int]
    waiting: list[int]
    running: list[int]
    kv: dict  # BlockManager.stats() plus bytes and the naive allocator's waste
    blocks: list[dict]  # BlockManager.block_states()
    block_tables: dict[int, list[int]]
    timing: dict  # forward_ms, sample_ms, step_ms, engine_clock_s
    cost: dict  # metrics.step_cost(): bytes moved, FLOPs, intensity, tokens
    model: dict = field(default_factory=dict)  # model id and spec, filled on every event for replay
    version: int = EVENT_VERSION

    @property
    def idle(self) -> bool:
        return not self.seqs

    def seq(self, seq_id: int) -> SeqEvent | None:
        return next((s for s in self.seqs if s.seq_id == seq_id), None)

    def to_dict(self) -> dict:
        return jsonable(self.__dict__)
