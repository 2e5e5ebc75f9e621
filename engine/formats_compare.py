"""The same prompt under several weight formats: how much faster each decodes, and how far it drifts from fp32.

`compare_formats` runs one prompt greedily on one engine per format (engine/kernels.py: fp32, bf16, int8, q4;
engines of the same model):

  speed   each format generates freely (untraced steps, as a user would run it); its decode steps' measured
          step_ms (median) against the bytes the step reads (StepCost.bytes: weights in the format + K/V).
  drift   each format is teacher-forced along fp32's greedy tokens (force_token before every step, traced), so
          both see the same context at every position: per step KL(p_fp32 || p_format) over the whole
          vocabulary (Engine.last_logits), whether its own greedy choice is fp32's token (top-1 agreement),
          and the logit and log-probability it gives fp32's token.
  text    the free-running tokens against fp32's: the first position where they differ, and the text.

fp32 goes through the same forced run as the others: its KL is 0 and its agreement 100 % by construction, which
checks the forcing loop itself (a step off by one would show at once).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import kernels
from .checks import as_bool, as_int, as_text, type_error, value_error
from .records import Record
from .sampling import SamplingParams
from .tokenizer import MAX_PROMPT_CHARS, MAX_SYSTEM_CHARS, token_bytes

REFERENCE = "fp32"
MAX_COMPARE_TOKENS = 32  # each format runs the prompt twice: bounded, as the app's other measurements are
MIN_KV_MEMORY = 4 << 20

Progress = Callable[[str, str, int, int], None]  # (format, "free" | "forced", tokens done, tokens in all)


@dataclass
class FormatRun(Record):
    """One weight format's run of the prompt."""

    weights: str  # "fp32", "bf16", "int8", "q4"
    kernels: dict  # Model.kernels(): which kernel runs each projection, decode and prefill
    weight_bytes_per_step: int  # weights one decode step reads, in this format
    params_per_step: int  # weights one decode step reads, counted as numbers
    bytes_per_weight: float  # weight_bytes_per_step / params_per_step (q4: 0.625 per projection weight)
    step_bytes: float  # median StepCost.bytes of its decode steps: weights + K/V read and written
    step_flops: float  # median StepCost.flops of the same steps
    step_ms: float | None  # median measured step_ms of its decode steps (None: the run had no decode step)
    step_ms_all: list[float]  # every decode step's step_ms, in order
    token_ids: list[int]  # its own greedy tokens
    text: str
    common_text: str  # the text of its tokens before first_divergence (all of them when it never diverges)
    first_divergence: int | None  # first output position where its tokens differ from fp32's (None: never)
    kl: list[float]  # per forced step: KL(p_fp32 || p_format), nats
    top1: list[bool]  # per forced step: its greedy choice is fp32's token
    own_top: list[int]  # per forced step: its greedy choice
    chosen_logit: list[float]  # per forced step: its raw logit of fp32's token
    chosen_logprob: list[float]  # per forced step: its log-probability of fp32's token

    @property
    def agreement(self) -> float:
        return sum(self.top1) / len(self.top1) if self.top1 else float("nan")

    @property
    def mean_kl(self) -> float:
        return sum(self.kl) / len(self.kl) if self.kl else float("nan")


@dataclass
class FormatsComparison(Record):
    """Every format's run of one prompt, fp32 first (the reference)."""

    prompt: str
    prompt_tokens: int
    max_tokens: int
    reference_ids: list[int]  # fp32's greedy tokens: what every format was forced along
    reference_texts: list[str]  # each of them as text
    runs: list[FormatRun] = field(default_factory=list)

    def run(self, weights: str) -> FormatRun:
        for r in self.runs:
            if r.weights == weights:
                return r
        raise KeyError(weights)

    @property
    def reference(self) -> FormatRun:
        return self.run(REFERENCE)


def compare_formats(engines: dict, prompt: str, max_tokens: int = 16, chat: bool = True,
                    system: str | None = None, progress: Progress | None = None) -> FormatsComparison:
    """Run `prompt` greedily on each engine of `engines` ({format: Engine}, "fp32" among them; each engine's
    model.weights is its key) for at most `max_tokens` tokens (<= MAX_COMPARE_TOKENS). Each run takes a fresh
    session of its engine (its own small KV pool), so the engines' own requests are untouched."""
    engines = _check_engines(engines)
    prompt = as_text("prompt", prompt, MAX_PROMPT_CHARS)
    max_tokens = as_int("max_tokens", max_tokens, 1, MAX_COMPARE_TOKENS)
    chat = as_bool("chat", chat)
    system = as_text("system", system, MAX_SYSTEM_CHARS, optional=True)
    if progress is not None and not callable(progress):
        raise type_error("progress", "a callable or None", progress)
    ref_engine = engines[REFERENCE]
    prompt_tokens = len(ref_engine.encode(prompt, chat=chat, system=system).token_ids)

    def session(eng):
        need = (prompt_tokens + max_tokens + 2 * eng.block_size) * eng.kv_bytes_per_token
        return eng.session(kv_memory=max(MIN_KV_MEMORY, need))

    request = dict(chat=chat, system=system)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ref_free = _free_run(session(ref_engine), prompt, greedy, request, _reporter(progress, REFERENCE, max_tokens))
    ref_ids = ref_free["token_ids"]
    # forced along its own tokens: fp32's distributions at every position, the baseline of every KL
    ref_forced = _forced_run(session(ref_engine), prompt, ref_ids, request,
                             _reporter(progress, REFERENCE, len(ref_ids), "forced"))
    ref_logp = [torch.log_softmax(row.double(), -1) for row in ref_forced["logits"]]
    out = FormatsComparison(prompt=prompt, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                            reference_ids=list(ref_ids),
                            reference_texts=[ref_engine.token_text(t) for t in ref_ids])
    for fmt in [REFERENCE] + [f for f in kernels.FORMATS if f in engines and f != REFERENCE]:
        eng = engines[fmt]
        free = ref_free if fmt == REFERENCE else \
            _free_run(session(eng), prompt, greedy, request, _reporter(progress, fmt, max_tokens))
        forced = ref_forced if fmt == REFERENCE else \
            _forced_run(session(eng), prompt, ref_ids, request, _reporter(progress, fmt, len(ref_ids), "forced"))
        out.runs.append(_format_run(fmt, eng, free, forced, ref_ids, ref_logp))
    return out


def _check_engines(engines) -> dict:
    if not isinstance(engines, dict):
        raise type_error("engines", "a dict {format: Engine}", engines)
    for fmt, eng in engines.items():
        if fmt not in kernels.FORMATS:
            raise value_error("engines", "keys among " + ", ".join(map(repr, kernels.FORMATS)), fmt)
        if getattr(getattr(eng, "model", None), "weights", None) != fmt:
            raise ValueError(f"engines[{fmt!r}] must be an Engine whose weights are {fmt!r}")
    if REFERENCE not in engines:
        raise ValueError(f"engines must include {REFERENCE!r}: every format is compared with it")
    if len({(e.model_id, e.spec.vocab_size) for e in engines.values()}) != 1:
        raise ValueError("engines must all run the same model (in different weight formats)")
    return engines


def _reporter(progress: Progress | None, fmt: str, total: int, stage: str = "free"):
    return (lambda done: progress(fmt, stage, done, total)) if progress else (lambda done: None)


def _free_run(eng, prompt: str, params: SamplingParams, request: dict, report) -> dict:
    """Greedy generation through untraced steps (as fast as the format runs); each decode step's time and cost."""
    sid = eng.add_request(prompt, params, **request)
    step_ms, step_bytes, step_flops = [], [], []
    report(0)
    while eng.has_unfinished():
        event = eng.step(trace=False)
        ev = event.seq(sid)
        if ev is None:
            continue
        if ev.phase == "decode":
            step_ms.append(float(event.timing.step_ms))
            step_bytes.append(float(event.cost.bytes))
            step_flops.append(float(event.cost.flops))
        if ev.new_token is not None:
            report(len(eng.seq_view(sid).output_ids))
    res = eng.result(sid)
    eng.release([sid])
    return {"token_ids": list(res.token_ids), "text": res.text, "step_ms": step_ms, "step_bytes": step_bytes,
            "step_flops": step_flops}


def _forced_run(eng, prompt: str, token_ids: list[int], request: dict, report) -> dict:
    """Fed `token_ids` one step at a time (each forced before its step, traced): at every position the raw
    logits the format computed and its own greedy choice there."""
    params = SamplingParams(max_tokens=max(1, len(token_ids)), temperature=0.0, ignore_eos=True)
    sid = eng.add_request(prompt, params, **request)
    logits, own = [], []
    report(0)
    for i, tok in enumerate(token_ids):
        eng.force_token(sid, tok)
        while True:
            ev = eng.step(trace=True).seq(sid)
            if ev is not None and ev.new_token is not None:
                break
        logits.append(eng.last_logits(sid))
        own.append(int(ev.sampling.chosen))
        report(i + 1)
    eng.release([sid])
    return {"logits": logits, "own": own}


def _format_run(fmt: str, eng, free: dict, forced: dict, ref_ids: list[int], ref_logp: list) -> FormatRun:
    kl, logit, logp = [], [], []
    for tok, row, ref in zip(ref_ids, forced["logits"], ref_logp):
        mine = torch.log_softmax(row.double(), -1)
        # KL(p || q) = sum p (log p - log q); tokens fp32 gives probability 0 add nothing
        kl.append(max(0.0, float((ref.exp() * (ref - mine)).sum())))
        logit.append(float(row[tok]))
        logp.append(float(mine[tok]))
    m = eng.model
    div = first_divergence(ref_ids, free["token_ids"])
    split = len(free["token_ids"]) if div is None else div
    return FormatRun(
        weights=fmt, kernels=m.kernels(), weight_bytes_per_step=int(m.weight_bytes_per_step),
        params_per_step=int(m.params_per_step), bytes_per_weight=m.weight_bytes_per_step / m.params_per_step,
        step_bytes=_median(free["step_bytes"]) or float(m.weight_bytes_per_step),
        step_flops=_median(free["step_flops"]) or 0.0, step_ms=_median(free["step_ms"]),
        step_ms_all=list(free["step_ms"]), token_ids=list(free["token_ids"]), text=free["text"],
        common_text=b"".join(token_bytes(eng.tokenizer, t) for t in free["token_ids"][:split]).decode(
            "utf-8", errors="replace"),
        first_divergence=div, kl=kl,
        top1=[o == t for o, t in zip(forced["own"], ref_ids)], own_top=list(forced["own"]),
        chosen_logit=logit, chosen_logprob=logp)


def first_divergence(reference: list[int], tokens: list[int]) -> int | None:
    """The first output position where two greedy runs differ (a run that stops early differs where it
    stopped); None when they are the same."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.median(xs) if xs else None


__all__ = ["compare_formats", "FormatsComparison", "FormatRun", "first_divergence", "MAX_COMPARE_TOKENS",
           "REFERENCE"]
