"""Speculative decoding: drafters, one-pass verification, the rejection sampler and its bookkeeping.

A speculative round replaces one decode step of a sequence:

1. a *drafter* proposes up to k next tokens x_1..x_k, each drawn from a distribution q_i it reports:
   - "ngram" (prompt lookup): the longest suffix n-gram found earlier in the context proposes the tokens that
     followed it there; a point mass, so q_i is one-hot;
   - "early_exit": the target's own first L layers + final norm + head. Its K/V for layers < L at every
     computed position are exactly the target's (same weights, same inputs), so it reads the target's pool
     and writes its draft rows into the slots the verification overwrites anyway;
   - "draft": a separate model with the same tokenizer, with a KV pool of its own.
2. the target scores the pending token plus the k drafts in ONE forward (k + 1 logits rows);
3. `verify` walks the drafts: x_i is kept when u ≤ p_i(x_i) / q_i(x_i); at the first rejection a token is
   drawn from norm(max(p_i − q_i, 0)); when every draft is kept, a bonus token is drawn from p_{k+1}. p and q
   are both the distributions after the full sampling chain (penalties see the drafts before them), so the
   emitted tokens are distributed exactly as plain sampling from the target (Leviathan et al. 2023,
   Chen et al. 2023). At temperature 0 both are one-hot: a draft is kept while it equals the target argmax.
   Under a grammar (engine/grammar.py) p_i is the masked chain's distribution after drafts 1..i-1: a draft the
   grammar forbids has p = 0 and never passes, and the residual and the bonus are drawn from masked p, so the
   output stays exact and in the grammar. Drafters draft without the mask (q is whatever they sampled from).
4. the engine rolls the KV back: slots reserved for drafts that were not kept go back to the pool (see
   `BlockManager.rollback`), and only kept tokens are ever hashed for the prefix cache.

Everything random goes through the request's own generator, so a seeded request reproduces.
"""
from __future__ import annotations

import copy
import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import metrics
from .checks import as_bool, as_int, as_text, short_repr, type_error, value_error
from .kv_cache import BlockManager, kv_block_preserver
from .model import KVStorage, Model, SeqInput
from .records import Record
from .tokenizer import DetokStep
from .sampling import SamplingParams, sampling_probs

METHODS = ("ngram", "early_exit", "draft")
MAX_NGRAM = 32  # the longest n-gram prompt lookup may search for
MAX_SOURCE_CHARS = 4096  # a model source is a name or a path
MAX_NUM_TOKENS = 32  # beyond this the verify forward stops being "one cheap pass" on any machine we target
TOP_N = 8  # tokens per position kept in traced events for the p-vs-q bars
ADAPTIVE_WINDOW = 8  # rounds of recent acceptance the adaptive k looks at


# ----------------------------------------------------------------------------------------------
# Configuration


@dataclass
class SpeculativeConfig:
    """How a request speculates. `num_tokens` is k, the drafts per round (the upper bound when adaptive)."""

    method: str
    num_tokens: int = 4
    exit_layer: int | None = None  # "early_exit": layers the drafter runs (default: a third of the model)
    draft_model: Any = None  # "draft": a model source ("bundled", a directory, a hub id) or an Engine to reuse
    # "draft": the weight format the draft model runs in (engine/kernels.py). The target's own source in "q4"
    # is the seeds' "one artifact, two serving profiles": its 4-bit kernels draft for its float32 self.
    draft_weights: str = "fp32"
    adaptive: bool = False  # choose k each round from recent acceptance and the measured draft cost
    ngram_min: int = 1  # "ngram": shortest suffix to look up
    ngram_max: int = 4  # "ngram": longest suffix to look up (tried first)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError (ArgumentTypeError for a wrong type) for settings that cannot work whatever the model
        (model-dependent checks: add_request). Normalises numpy integers to int."""
        if not isinstance(self.method, str):
            raise type_error("method", f"one of {', '.join(METHODS)}", self.method)
        if self.method not in METHODS:
            raise ValueError(f"unknown speculative method {short_repr(self.method)}; choose one of {', '.join(METHODS)}")
        self.num_tokens = as_int("num_tokens (k)", self.num_tokens, 1, MAX_NUM_TOKENS)
        if self.exit_layer is not None:
            if self.method != "early_exit":
                raise ValueError("exit_layer applies to method 'early_exit' only")
            self.exit_layer = as_int("exit_layer", self.exit_layer, 1)
        src = self.draft_model
        if self.method == "draft" and src is None:
            raise ValueError("method 'draft' needs draft_model: a model source or an Engine")
        if self.method != "draft" and src is not None:
            raise ValueError("draft_model applies to method 'draft' only")
        from .kernels import FORMATS

        if self.draft_weights not in FORMATS:
            raise (type_error if not isinstance(self.draft_weights, str) else value_error)(
                "draft_weights", "one of " + ", ".join(map(repr, FORMATS)), self.draft_weights)
        if self.method != "draft" and self.draft_weights != "fp32":
            raise ValueError("draft_weights applies to method 'draft' only")
        if self.draft_weights != "fp32" and src is not None and not isinstance(src, str):
            raise ValueError("draft_weights needs draft_model as a model source: an Engine runs its own weights")
        if isinstance(src, str):
            as_text("draft_model", src, MAX_SOURCE_CHARS)
            if not src.strip():
                raise ValueError("draft_model must not be empty")
        elif src is not None and not (hasattr(src, "loaded") and hasattr(src, "model")):
            raise type_error("draft_model", "a model source (str) or an Engine", src)
        self.adaptive = as_bool("adaptive", self.adaptive)
        # prompt lookup compares every window of each length from ngram_max down: the lengths are capped
        self.ngram_min = as_int("ngram_min", self.ngram_min, 1, MAX_NGRAM)
        self.ngram_max = as_int("ngram_max", self.ngram_max, 1, MAX_NGRAM)
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")

    def draft_source_name(self) -> str | None:
        src = self.draft_model
        if src is None:
            return None
        return src if isinstance(src, str) else str(getattr(src, "model_id", type(src).__name__))

    def to_dict(self) -> dict:
        return {"method": self.method, "num_tokens": self.num_tokens, "exit_layer": self.exit_layer,
                "draft_model": self.draft_source_name(), "draft_weights": self.draft_weights,
                "adaptive": self.adaptive,
                "ngram_min": self.ngram_min, "ngram_max": self.ngram_max}


# ----------------------------------------------------------------------------------------------
# Draws and the rejection sampler (pure functions of distributions and a generator)


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative-probability interval (in id order) contains u · total."""
    cdf = torch.cumsum(probs.double(), 0)
    x = torch.tensor([u * float(cdf[-1])], dtype=torch.float64)
    i = int(torch.searchsorted(cdf, x, right=True))
    if i >= probs.numel():  # round-off put u · total at the very end: the last token that can be drawn
        i = int((probs > 0).nonzero()[-1])
    return i


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> tuple[int, float]:
    """One token from `probs` with one uniform number from `generator`; returns (token, u)."""
    u = uniform(generator)
    return inverse_cdf(probs, u), u


def acceptance_rule(p_x: float, q_x: float, u: float) -> bool:
    """Keep a draft with probability min(1, p(x)/q(x)); a token the target cannot emit (p = 0) never passes."""
    return p_x > 0.0 and u * q_x <= p_x


AcceptRule = Callable[[float, float, float], bool]


@dataclass
class DraftCheck:
    """The test of one draft: its probabilities under both models, the uniform number and the verdict."""

    token: int
    q: float
    p: float
    u: float
    accepted: bool

    @property
    def ratio(self) -> float:
        return self.p / self.q if self.q > 0 else math.inf


@dataclass
class Verification:
    checks: list[DraftCheck]  # drafts tested, in order; the walk stops at the first rejection
    num_accepted: int
    final_token: int  # the resampled token (after a rejection) or the bonus token (all kept)
    final_kind: str  # "resampled" or "bonus"
    final_prob: float  # probability of final_token in the distribution it was drawn from
    final_u: float
    residual: torch.Tensor | None  # norm(max(p − q, 0)) at the rejected position
    residual_mass: float  # sum of max(p − q, 0) before normalising (the rejection probability there)
    p_rows: list[torch.Tensor]  # target distributions computed (positions 0..num_accepted)

    @property
    def tokens(self) -> list[int]:
        """What the round emits: the kept drafts, then the resampled or bonus token."""
        return [c.token for c in self.checks[: self.num_accepted]] + [self.final_token]


def verify(draft_ids: Sequence[int], q: torch.Tensor | None, p, generator: torch.Generator | None,
           accept_rule: AcceptRule | None = None) -> Verification:
    """The rejection sampler of one round.

    draft_ids: the k drafted tokens. q: [k, vocab] the distributions they were drawn from, or None for a point-mass
    drafter (q_i one-hot at x_i). p: the target's distributions, a [k + 1, vocab] tensor or a function i -> row
    (the engine computes rows lazily: a greedy round that fails at draft 1 needs two rows, not k + 1).
    Uniform numbers come from `generator` in a fixed order: one per tested draft, then one for the final draw.
    `accept_rule` exists for tests that must show a broken rule is caught; the engine never passes it.
    """
    rule = acceptance_rule if accept_rule is None else accept_rule
    row = (lambda i: p[i]) if isinstance(p, torch.Tensor) else p
    checks: list[DraftCheck] = []
    rows: list[torch.Tensor] = []
    for i, x in enumerate(draft_ids):
        p_i = row(i)
        rows.append(p_i)
        p_x = float(p_i[x])
        q_x = 1.0 if q is None else float(q[i, x])
        u = uniform(generator)
        ok = bool(rule(p_x, q_x, u))
        checks.append(DraftCheck(int(x), q_x, p_x, u, ok))
        if not ok:
            if q is None:
                residual = p_i.clone()
                residual[x] = 0.0  # max(p − onehot(x), 0): p without x
            else:
                residual = (p_i - q[i]).clamp_min(0.0)
            mass = float(residual.double().sum())
            # mass 0 means p ≤ q everywhere, i.e. p == q: the rejection then had probability 0 and only round-off
            # (or a broken rule) got here; p itself is the right distribution to draw from.
            dist = residual / mass if mass > 0 else p_i
            tok, u_final = draw(dist, generator)
            return Verification(checks, i, tok, "resampled", float(dist[tok]), u_final, dist, mass, rows)
    p_bonus = row(len(draft_ids))
    rows.append(p_bonus)
    tok, u_final = draw(p_bonus, generator)
    return Verification(checks, len(draft_ids), tok, "bonus", float(p_bonus[tok]), u_final, None, 0.0, rows)


# ----------------------------------------------------------------------------------------------
# A round as a step event shows it (SeqEvent.spec); the engine fills these from the Verification


@dataclass
class RoundDraft(Record):
    """One drafted token and its test; "unchecked" drafts came after the first rejection."""

    position: int  # 1-based within the round
    token: int
    text: str
    q: float  # its probability under the drafter (1 for a point-mass drafter)
    p: float | None  # under the target (None: not checked)
    ratio: float | None  # p / q (None: not checked, or q = 0)
    u: float | None
    verdict: str  # "accepted", "rejected" or "unchecked"


@dataclass
class RoundFinal(Record):
    """The token the round ends with: resampled after a rejection or the bonus after all were kept; a round
    without drafts ends with the token sampled (or forced) as usual."""

    position: int
    token: int
    text: str
    kind: str  # "resampled", "bonus", "sampled" or "forced"
    prob: float | None  # in the distribution it was drawn from (None: not traced)
    u: float | None
    kept: bool  # False when a stop string, EOS or max_tokens ended the round before it


@dataclass
class RoundResidual(Record):
    """norm(max(p − q, 0)) at the rejected position, over the tokens worth showing (top_union)."""

    position: int
    token_ids: list[int]
    texts: list[str]
    p: list[float]
    q: list[float]
    residual: list[float]
    mass: float  # sum of max(p − q, 0) before normalising: the probability of the rejection there
    drawn: int


@dataclass
class RoundDist(Record):
    """The target's p and the drafter's q at one position of a traced round, over the tokens worth showing."""

    position: int
    draft: int | None  # the drafted token (None: the bonus position)
    token_ids: list[int]
    texts: list[str]
    p: list[float]
    q: list[float] | None


@dataclass
class RoundRollback(Record):
    """KV given back after verification: the slots of drafts that were not kept, and the blocks freed."""

    reserved_slots: int
    slots: int
    blocks: list[int]


@dataclass
class AdaptiveK(Record):
    """The adaptive k's inputs after this round and the k it chose for the next one."""

    alpha_recent: float
    cost_ratio: float | None  # measured draft cost per draft ÷ verify cost (None: not measured yet)
    k_next: int


@dataclass
class SpecRound(Record):
    """One speculative round of one sequence (a decode step): drafts and their checks, the final token, the
    KV rollback, timings, and the sequence's cumulative statistics after it."""

    method: str
    k: int  # drafts asked for this round
    k_config: int
    num_drafted: int
    num_accepted: int
    num_emitted: int
    emitted_ids: list[int]
    emitted_texts: list[str]
    truncated: bool  # a stop string, EOS or max_tokens cut the round short
    draft: list[RoundDraft]
    final: RoundFinal
    residual: RoundResidual | None  # after a rejection
    dists: list[RoundDist] | None  # traced rounds with drafts
    rollback: RoundRollback
    draft_ms: float
    verify_ms: float
    drafter: dict  # the drafter's description and this draft's facts (n-gram match, exit layer, ...)
    adaptive: AdaptiveK | None  # adaptive k only
    stats: dict  # SpecState.stats(): the same dict as GenerationResult.speculative
    # the detokenizer's step for each emitted token, in order (SeqEvent.detok holds only the last one's)
    detok: list[DetokStep] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# Drafters


@dataclass
class Draft:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), vocab]; None for a point mass
    info: dict = field(default_factory=dict)  # drafter-specific facts for the event (n-gram match, exit layer)
    fed: int = 0  # drafts the drafter ran through its own model (their drafter-side K/V exist)
    seconds: float = 0.0


@dataclass
class DraftRequest:
    """What a drafter may use for one sequence's round."""

    token_ids: list[int]  # prompt + output so far; the last one is pending (no K/V in the target yet)
    prompt_len: int
    params: SamplingParams
    generator: torch.Generator | None
    k: int
    target_slots: torch.Tensor  # physical slots of the target covering len(token_ids) + k positions
    seq_id: int


def prompt_lookup(tokens: Sequence[int], k: int, n_min: int = 1, n_max: int = 4) -> tuple[list[int], int, int]:
    """Prompt-lookup drafting: find the longest suffix n-gram (n_max down to n_min) earlier in `tokens`.

    Returns (up to k tokens that followed its latest earlier occurrence, n, where that occurrence starts);
    ([], 0, -1) without a match. The latest occurrence is preferred: recent context predicts best.
    """
    arr = np.asarray(tokens, dtype=np.int64)
    T = arr.size
    for n in range(min(n_max, T - 1), n_min - 1, -1):
        if n < 1:
            break
        # windows of arr[:-1] end at T − 2 at the latest: every match has a following token, and the suffix
        # itself (which ends at T − 1) is excluded
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[T - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1])
            return [int(t) for t in arr[start + n: start + n + k]], n, start
    return [], 0, -1


class NgramDrafter:
    point_mass = True

    def __init__(self, cfg: SpeculativeConfig):
        self.n_min, self.n_max = cfg.ngram_min, cfg.ngram_max

    def describe(self) -> dict:
        return {"ngram_min": self.n_min, "ngram_max": self.n_max}

    def propose_many(self, reqs: list[DraftRequest]) -> list[Draft]:
        drafts = []
        for req in reqs:
            tokens, n, start = prompt_lookup(req.token_ids, req.k, self.n_min, self.n_max)
            drafts.append(Draft(tokens, None, {"ngram_n": n, "match_start": start,
                                               "match_end": start + n if n else -1}))
        return drafts

    def after_round(self, seq_id: int, num_tokens_before: int, num_kept_drafts: int, draft: Draft) -> None:
        pass

    def forget(self, seq_id: int, keep_tokens: int | None = None) -> None:
        pass

    def checkpoint(self) -> None:  # stateless: nothing to undo after a failed step
        return None

    def restore(self, state: None) -> None:
        pass

    def commit(self) -> None:
        pass


def _draft_token(logits: torch.Tensor, req: DraftRequest, drafted: list[int]) -> tuple[int, torch.Tensor]:
    """Draw the next draft from the drafter's distribution after the SAME sampling chain as the target's.

    q is exactly the distribution the token is drawn from (transformers #47932), and a sampling target gets a
    sampling draft, never a greedy one (transformers #32867); at temperature 0 both are one-hot.
    """
    prompt, output = req.token_ids[: req.prompt_len], req.token_ids[req.prompt_len:] + drafted
    q = sampling_probs(logits, req.params, prompt, output)
    tok, _ = draw(q, req.generator)
    return tok, q


class _ModelDrafter:
    """Autoregressive drafting with a model, every speculating sequence of a step in one forward per position."""

    point_mass = False
    kv: KVStorage
    exit_layer: int | None = None

    def _start(self, req: DraftRequest) -> tuple[list[int], int, torch.Tensor] | None:
        """(tokens to feed first, their start position, slots) for one request, or None to skip drafting."""
        raise NotImplementedError

    def _info(self) -> dict:
        raise NotImplementedError

    def propose_many(self, reqs: list[DraftRequest]) -> list[Draft]:
        starts = [self._start(r) for r in reqs]
        feed = {j: (st_[0], st_[1]) for j, st_ in enumerate(starts) if st_ is not None}  # next input, position
        drafted: list[list[int]] = [[] for _ in reqs]
        qs: list[list[torch.Tensor]] = [[] for _ in reqs]
        for i in range(max((r.k for r in reqs), default=0)):
            active = [j for j in feed if reqs[j].k > i]
            if not active:
                break
            inputs = [SeqInput(feed[j][0], feed[j][1], starts[j][2][: feed[j][1] + len(feed[j][0])], 1)
                      for j in active]
            logits, _ = self.model.forward(inputs, self.kv, exit_layer=self.exit_layer)
            for row, j in enumerate(active):
                tok, q = _draft_token(logits[row], reqs[j], drafted[j])
                drafted[j].append(tok)
                qs[j].append(q)
                ids, pos = feed[j]
                feed[j] = ([tok], pos + len(ids))
        out = []
        for j, r in enumerate(reqs):
            if starts[j] is None:
                out.append(Draft([], None, {**self._info(), "skipped": "draft KV pool full"}))
            else:
                out.append(Draft(drafted[j], torch.stack(qs[j]), self._info(), fed=max(0, r.k - 1)))
        return out


class EarlyExitDrafter(_ModelDrafter):
    """The target's first `exit_layer` layers, its final norm and head.

    Layers < L of the target at every computed position are what these layers compute, so the drafter attends
    over the target's own pool; its draft rows go into slots the verify pass rewrites with all layers.
    """

    def __init__(self, model: Model, kv: KVStorage, exit_layer: int):
        self.model, self.kv, self.exit_layer = model, kv, exit_layer

    def describe(self) -> dict:
        return {"exit_layer": self.exit_layer, "num_layers": self.model.spec.num_layers}

    def _info(self) -> dict:
        return {"exit_layer": self.exit_layer}

    def _start(self, req: DraftRequest):
        T = len(req.token_ids)
        return [req.token_ids[-1]], T - 1, req.target_slots

    def after_round(self, seq_id: int, num_tokens_before: int, num_kept_drafts: int, draft: Draft) -> None:
        pass  # its K/V are the target's: the verify pass has already written the real ones

    def forget(self, seq_id: int, keep_tokens: int | None = None) -> None:
        pass

    # stateless: the rows it writes lie in the target's slots reserved for drafts, which the engine's own
    # checkpoint of the target pool covers
    def checkpoint(self) -> None:
        return None

    def restore(self, state: None) -> None:
        pass

    def commit(self) -> None:
        pass


class DraftModelDrafter(_ModelDrafter):
    """A separate (smaller) model with the target's tokenizer and a paged KV pool of its own.

    Per sequence it remembers how many leading tokens have their K/V in its pool; each round first catches up
    on the tokens the target emitted since (the resampled/bonus token, or the whole prompt the first time).
    """

    def __init__(self, model: Model, model_id: str, num_blocks: int, block_size: int):
        self.model, self.model_id = model, model_id
        self.kv = KVStorage(model.spec, num_blocks, block_size, model.dtype, model.device)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False,
                                   preserve_block=kv_block_preserver(self.kv))
        self.block_size = block_size
        self.computed: dict[int, int] = {}  # seq_id -> tokens whose draft K/V are valid

    def describe(self) -> dict:
        return {"draft_model": self.model_id, "num_layers": self.model.spec.num_layers}

    def _info(self) -> dict:
        return {"draft_model": self.model_id}

    def _start(self, req: DraftRequest):
        sid, T = req.seq_id, len(req.token_ids)
        need = T + req.k - 1  # the pending token and k − 1 drafts go through the draft model
        if sid not in self.blocks.block_tables:
            if not self.blocks.num_free_blocks:
                return None
            self.blocks.allocate(sid, req.token_ids[:1])  # a one-token table, grown below
            self.computed[sid] = 0
        target = max(need, self.blocks.seq_lens[sid])
        if not self.blocks.can_append(sid, target):
            return None  # the round falls back to a plain decode step
        self.blocks.append(sid, target)
        table = torch.tensor(self.blocks.block_tables[sid], dtype=torch.long)
        slots = (table.unsqueeze(1) * self.block_size + torch.arange(self.block_size)).view(-1)[:target]
        done = min(self.computed[sid], T - 1)
        self.computed[sid] = T  # the pending token goes in now; drafts are confirmed in after_round
        return list(req.token_ids[done:]), done, slots

    def checkpoint(self) -> tuple:
        """Its pool and per-sequence progress, for `restore` after a failed engine step."""
        return self.blocks.checkpoint(), dict(self.computed)

    def restore(self, state: tuple) -> None:
        self.blocks.restore(state[0])
        self.computed = dict(state[1])

    def commit(self) -> None:
        self.blocks.commit()

    def after_round(self, seq_id: int, num_tokens_before: int, num_kept_drafts: int, draft: Draft) -> None:
        if seq_id not in self.computed:
            return
        # kept drafts that went through the draft model keep their K/V; the rest are overwritten next round
        valid = num_tokens_before + min(num_kept_drafts, draft.fed)
        self.computed[seq_id] = valid
        self.blocks.truncate(seq_id, max(valid, 1))

    def forget(self, seq_id: int, keep_tokens: int | None = None) -> None:
        """Drop the draft K/V of a sequence (finished, preempted) or keep only its first `keep_tokens`."""
        if seq_id not in self.blocks.block_tables:
            self.computed.pop(seq_id, None)
            return
        if keep_tokens is None or keep_tokens <= 0:
            self.blocks.free(seq_id)
            self.computed.pop(seq_id, None)
            return
        valid = min(self.computed.get(seq_id, 0), keep_tokens)
        self.computed[seq_id] = valid
        self.blocks.truncate(seq_id, max(min(valid, self.blocks.seq_lens[seq_id]), 1))


# ----------------------------------------------------------------------------------------------
# Draft models: resolving a source, checking the tokenizer


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map the same strings to the same ids (draft and target must agree on ids)."""
    if a is b:
        return True
    return a.get_vocab() == b.get_vocab() and getattr(a, "eos_token_id", None) == getattr(b, "eos_token_id", None)


def _same_source(engine, source: str) -> bool:
    from .loader import BUNDLED, BUNDLED_ID

    if source.strip() == BUNDLED:
        return engine.loaded.model_id == BUNDLED_ID
    path = Path(source).expanduser()
    try:
        return path.exists() and path.resolve() == Path(engine.loaded.source_dir).resolve()
    except OSError:
        return False


def resolve_draft_model(engine, source, weights: str = "fp32") -> tuple[Any, Model]:
    """(LoadedModel, Model) of a draft source in a weight format; the target's own model is reused when the
    source is the target and the format its own. Loaded models are cached in the registry shared by an engine
    and its sessions."""
    if hasattr(source, "loaded") and hasattr(source, "model"):  # an Engine: reuse its weights as they are
        loaded, model = source.loaded, source.model
    elif isinstance(source, str) and source.strip():
        key = source if weights == "fp32" else (source, weights)
        if _same_source(engine, source) and weights == engine.model.weights:
            loaded, model = engine.loaded, engine.model
        elif key in engine._draft_models:
            loaded, model = engine._draft_models[key]
        else:
            from .loader import load

            loaded = load(source)
            model = Model.from_loaded(loaded, device=engine.model.device, dtype=engine.model.dtype, weights=weights)
            loaded.state_dict = {}
            engine._draft_models[key] = (loaded, model)
    else:
        raise ValueError(f"draft_model must be a model source (str) or an Engine (got {type(source).__name__})")
    if not same_tokenizer(loaded.tokenizer, engine.tokenizer):
        raise ValueError(f"draft model {getattr(loaded, 'model_id', source)!r} has a different tokenizer than the "
                         f"target {engine.model_id!r}; speculative decoding needs both to share token ids")
    if model.spec.vocab_size != engine.spec.vocab_size:
        raise ValueError(f"draft model vocabulary ({model.spec.vocab_size}) differs from the target's "
                         f"({engine.spec.vocab_size})")
    if model.device != engine.model.device:
        raise ValueError(f"draft model is on {model.device}, the target on {engine.model.device}")
    return loaded, model


def make_drafter(engine, cfg: SpeculativeConfig):
    """The drafter of `cfg` for `engine`, validated against the model (clear ValueError otherwise)."""
    if cfg.method == "ngram":
        return NgramDrafter(cfg)
    if cfg.method == "early_exit":
        L = engine.spec.num_layers
        exit_layer = cfg.exit_layer if cfg.exit_layer is not None else max(1, L // 3)
        if not 1 <= exit_layer < L:
            raise ValueError(f"exit_layer must be between 1 and {L - 1} for this {L}-layer model "
                             f"(got {exit_layer})")
        # one instance per exit layer, so requests exiting at the same layer draft in one batched forward
        return engine._drafters.setdefault(("early_exit", exit_layer),
                                           EarlyExitDrafter(engine.model, engine.kv, exit_layer))
    loaded, model = resolve_draft_model(engine, cfg.draft_model, cfg.draft_weights)
    key = ("draft", id(model))
    drafter = engine._drafters.get(key)
    if drafter is None:  # one draft KV pool per engine session and draft model, shared by its requests
        blocks = engine.blocks.num_blocks + 2 * engine.scheduler.max_num_seqs
        name = loaded.model_id if model.weights == "fp32" else f"{loaded.model_id} [{model.weights}]"
        drafter = DraftModelDrafter(model, name, blocks, engine.block_size)
        engine._drafters[key] = drafter
    return drafter


# ----------------------------------------------------------------------------------------------
# Per-sequence state and statistics


@dataclass
class SpecState:
    config: SpeculativeConfig
    drafter: Any
    k: int  # drafts to ask for in the next round
    proposed: int = 0  # drafts sent to verification
    reached: int = 0  # drafts actually tested (up to and including the first rejection)
    accepted: int = 0
    rounds: int = 0  # decode steps (verify passes), with or without drafts
    target_passes: int = 0  # target forwards that produced tokens for this sequence (prefill included)
    round_tokens: int = 0  # tokens emitted by rounds
    draft_s: float = 0.0
    verify_s: float = 0.0
    k_hist: Counter = field(default_factory=Counter)  # drafts per round -> rounds
    pos_proposed: list[int] = field(default_factory=list)
    pos_reached: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    recent: deque = field(default_factory=lambda: deque(maxlen=ADAPTIVE_WINDOW))  # (tested, accepted) per round
    cost_ratio: float | None = None  # draft seconds per draft ÷ verify seconds per round (EMA)

    def record(self, draft: Draft, v: Verification | None, emitted: int, verify_s: float) -> None:
        n = len(draft.tokens)
        self.rounds += 1
        self.round_tokens += emitted
        self.k_hist[n] += 1
        self.draft_s += draft.seconds
        self.verify_s += verify_s
        if not n or v is None:
            return
        for lst in (self.pos_proposed, self.pos_reached, self.pos_accepted):
            lst.extend([0] * (n - len(lst)))
        for i in range(n):
            self.pos_proposed[i] += 1
        for i, c in enumerate(v.checks):
            self.pos_reached[i] += 1
            self.pos_accepted[i] += int(c.accepted)
        self.proposed += n
        self.reached += len(v.checks)
        self.accepted += v.num_accepted
        self.recent.append((len(v.checks), v.num_accepted))
        if verify_s > 0:
            r = (draft.seconds / n) / verify_s
            self.cost_ratio = r if self.cost_ratio is None else 0.7 * self.cost_ratio + 0.3 * r

    def snapshot(self) -> dict:
        """Every statistic a round may change, for `restore` (config and drafter are not round state)."""
        return {f.name: copy.copy(getattr(self, f.name)) for f in fields(self) if f.name not in ("config", "drafter")}

    def restore(self, snap: dict) -> None:
        for name, value in snap.items():
            setattr(self, name, copy.copy(value))

    def recent_alpha(self) -> float:
        tested = sum(t for t, _ in self.recent)
        acc = sum(a for _, a in self.recent)
        return (acc + 1) / (tested + 2)  # Laplace: two rounds must not pin α to 0 or 1

    def next_k(self) -> int:
        """Adaptive k: the k ≤ num_tokens with the most expected tokens per unit of round cost.

        A round costs one verify pass plus k drafts at the measured relative cost r, and yields
        (1 − α^(k+1)) / (1 − α) tokens on average, α being the recent acceptance rate.
        """
        if not self.config.adaptive:
            return self.config.num_tokens
        alpha, r = self.recent_alpha(), self.cost_ratio or 0.0
        best = max(range(1, self.config.num_tokens + 1),
                   key=lambda k: (metrics.expected_tokens_per_pass(alpha, k) / (1 + r * k), -k))
        return best

    def stats(self, num_output_tokens: int) -> dict:
        alpha = self.accepted / self.reached if self.reached else 0.0
        expected = (sum(c * metrics.expected_tokens_per_pass(alpha, k) for k, c in self.k_hist.items()) / self.rounds
                    if self.rounds else None)
        return {
            "method": self.config.method,
            "num_tokens": self.config.num_tokens,
            "adaptive": self.config.adaptive,
            "proposed": self.proposed,
            "reached": self.reached,
            "accepted": self.accepted,
            "rounds": self.rounds,
            "target_passes": self.target_passes,
            "tokens": num_output_tokens,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "alpha": alpha,
            "mean_k": self.proposed / self.rounds if self.rounds else 0.0,
            "tokens_per_pass": num_output_tokens / self.target_passes if self.target_passes else 0.0,
            "tokens_per_round": self.round_tokens / self.rounds if self.rounds else 0.0,
            "expected_tokens_per_round": expected,
            "k_hist": {int(k): int(c) for k, c in sorted(self.k_hist.items())},
            "by_position": {
                "proposed": list(self.pos_proposed), "reached": list(self.pos_reached),
                "accepted": list(self.pos_accepted),
                "alpha": [a / r if r else None for a, r in zip(self.pos_accepted, self.pos_reached)],
            },
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }


def one_hot_rows(tokens: Sequence[int], vocab: int) -> torch.Tensor:
    q = torch.zeros(len(tokens), vocab)
    q[torch.arange(len(tokens)), torch.tensor(list(tokens), dtype=torch.long)] = 1.0
    return q


def top_union(rows: Sequence[torch.Tensor | None], extra: Sequence[int], n: int = TOP_N) -> list[int]:
    """Token ids worth showing: the top n of each distribution plus `extra`, by the first row's probability."""
    ids: list[int] = []
    for r in rows:
        if r is not None:
            ids += r.topk(min(n, r.numel())).indices.tolist()
    ids += [int(t) for t in extra]
    ids = list(dict.fromkeys(ids))
    first = next((r for r in rows if r is not None), None)
    if first is not None:
        ids.sort(key=lambda t: -float(first[t]))
    return ids


# ----------------------------------------------------------------------------------------------
# Measured speed-up against plain decoding


def _timed_run(engine, prompt_ids: list[int], params: SamplingParams, cfg: SpeculativeConfig | None) -> dict:
    eng = engine.session()
    rid = eng.add_request(prompt_ids=prompt_ids, params=params, speculative=cfg)
    eng.run_until_done()
    seq = eng.sequences[rid]
    res = eng.result(rid)
    n = len(res.token_ids)
    # Decode speed: tokens after the first over the engine time between the first and the last token. The
    # prefill is the same work in both runs, so leaving it out shows what speculation changes.
    decode_s = (seq.last_token_time - seq.first_token_time) if n > 1 else 0.0
    out = {"tokens": n, "token_ids": list(res.token_ids), "ttft_s": res.ttft_s, "decode_s": decode_s,
           "total_s": eng.clock, "tok_s": (n - 1) / decode_s if decode_s > 0 else None,
           "finish_reason": res.finish_reason}
    if res.speculative is not None:
        out["stats"] = res.speculative
    return out


def compare_with_plain(engine, prompt_ids: Sequence[int], params: SamplingParams, cfg: SpeculativeConfig,
                       max_tokens: int | None = None, repeats: int = 1) -> dict:
    """Run the prompt with plain decoding and with `cfg`, each in fresh sessions of `engine`; tok/s of each.

    Runs alternate (plain, speculative, plain, ...) so machine noise hits both alike; medians over `repeats`.
    Returns {"plain": run, "speculative": run, "speedup": spec tok/s ÷ plain tok/s, "same_tokens": bool, ...},
    a run being {"tokens", "token_ids", "ttft_s", "decode_s", "total_s", "tok_s", "finish_reason"} and the
    speculative one also "stats" (as GenerationResult.speculative).
    """
    if not isinstance(cfg, SpeculativeConfig):
        raise ValueError("cfg must be a SpeculativeConfig")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer (got {repeats!r})")
    if max_tokens is not None:
        params = replace(params, max_tokens=max_tokens)
    prompt_ids = [int(t) for t in prompt_ids]
    plain, spec = [], []
    for _ in range(repeats):
        plain.append(_timed_run(engine, prompt_ids, params, None))
        spec.append(_timed_run(engine, prompt_ids, params, cfg))

    def median_run(runs: list[dict]) -> dict:
        speeds = [r["tok_s"] for r in runs if r["tok_s"]]
        best = dict(runs[-1])
        if speeds:
            best["tok_s"] = statistics.median(speeds)
        best["tok_s_runs"] = [r["tok_s"] for r in runs]
        return best

    p, s = median_run(plain), median_run(spec)
    speedup = s["tok_s"] / p["tok_s"] if p["tok_s"] and s["tok_s"] else None
    return {"method": cfg.method, "num_tokens": cfg.num_tokens, "config": cfg.to_dict(),
            "prompt_tokens": len(prompt_ids), "params": params.to_dict(), "repeats": repeats,
            "plain": p, "speculative": s, "speedup": speedup,
            "same_tokens": p["token_ids"] == s["token_ids"]}


__all__ = ["METHODS", "SpeculativeConfig", "Verification", "DraftCheck", "verify", "acceptance_rule", "draw",
           "inverse_cdf", "prompt_lookup", "compare_with_plain", "same_tokenizer", "SpecState",
           "NgramDrafter", "EarlyExitDrafter", "DraftModelDrafter", "make_drafter"]
