"""The sampling chain: [grammar mask ->] [bias ->] penalties -> temperature -> min_p -> top_k -> top_p -> draw.

Every stage works on a float32 1-D tensor of vocabulary logits. A removed token gets logit -inf and
the survivors are renormalised (softmax over them) after each cut.

There is ONE implementation of the chain (`_run_chain`). The per-step fast path runs it without
recording anything; the traced path runs the same code and records each stage's state, so the two
can never disagree about the token drawn for the same uniform number u. `sampling_probs` returns
exactly the distribution the draw uses.

Representation: between stages the chain keeps a `_State`, either the full vocabulary (`idx is None`,
removed tokens are -inf) or, once a stage has cut, only the survivors (`idx` = their ids in ascending
order, `vals` = their logits). Working on survivors makes top_k/top_p/draw cheap after a cut, and
ascending ids let a stable sort break probability ties by the lower id, as the draw order requires.

A grammar (SamplingParams.grammar, engine/grammar.py) reaches the chain as a `mask` of the tokens it allows,
which the caller (the engine, from the sequence's matcher) computes; the chain only applies it. It comes first,
right after the raw logits, as in vLLM: min_p, top_k and top_p are cuts *relative to the distribution they see*,
so masking after them could leave no token (top_k keeps 5 tokens the grammar forbids) or keep a tail the user
never asked for; masked first, every cut picks among tokens the grammar allows. Penalties commute with the mask
(they never lift a -inf logit), so putting the mask before them changes nothing but the picture. The "grammar"
stage is recorded only for a masked chain: traces of unconstrained requests keep the stages they always had.

The "bias" stage (vLLM's request extras: logit_bias, allowed_token_ids, bad_words, min_tokens) comes next, where
vLLM's logits processors run (before the penalties): `token_bias` turns a request's params and output into one
vector that is added to the logits, -inf for a banned token. Like the grammar stage it is recorded only when
there is something to apply.
"""
from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from . import native
from .checks import as_int, check_unicode, type_error, value_error
from .grammar import Grammar, GrammarStep
from .records import build

STAGE_NAMES = ("logits", "penalties", "temperature", "min_p", "top_k", "top_p")
GRAMMAR_STAGE = "grammar"  # recorded after "logits" when the chain is masked
BIAS_STAGE = "bias"  # recorded after the grammar (or the logits) when the chain is given a bias (`token_bias`)
GRAMMAR_EXTRA_TRACKED = 5  # a masked trace also follows the grammar's own top tokens (the top N may all be cut)

_NEG_INF = float("-inf")
_F32_MAX = float(torch.finfo(torch.float32).max)
# torch.Generator.manual_seed accepts exactly this range; checking it here gives a clear message.
_SEED_MIN = -(2**63)
_SEED_MAX = 2**64 - 1

_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
_INT_FIELDS = ("max_tokens", "top_k")


def _is_int(v) -> bool:
    # bool is an int subclass, but True as a count is always a mistake. numpy ints count as ints.
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


# Temperatures below this are greedy (vLLM uses the same epsilon): 1/t of a smaller one is beyond float32's
# range (1e-300 becomes 0 in float32 and the chain divides by zero), and the distribution is one-hot anyway.
GREEDY_TEMPERATURE = 1e-5
# The largest temperature accepted: far past "uniform over the vocabulary" already, and far from float32's limit.
MAX_TEMPERATURE = 1e3
# Penalty bounds: much wider than any useful setting (vLLM allows [-2, 2] for frequency/presence), narrow enough
# that the chain's float32 arithmetic stays meaningful.
MAX_PENALTY = 1e4
MIN_REPETITION_PENALTY = 1e-4
MAX_STOP_STRINGS = 16  # each stop string is searched for after every token: the count and length are capped
MAX_STOP_CHARS = 256
MAX_TOP_N = 1000  # tokens a trace follows through every stage; more is unreadable and costs per stage
# The bias stage's inputs (vLLM's request extras): each is looked at for every sampled token, so each is capped.
MAX_LOGIT_BIAS = 1024  # entries of logit_bias (OpenAI documents no count; its values are in [-100, 100])
MAX_BIAS = 100.0
MAX_STOP_TOKEN_IDS = 64
MAX_ALLOWED_TOKEN_IDS = 65_536
MAX_BAD_WORDS = 64
MAX_BAD_WORD_CHARS = 256
MAX_PROMPT_LOGPROBS = 20  # alternatives per prompt position (OpenAI's and vLLM's top-logprobs limit)

_RANGES = {  # name: (low, high, low inclusive, rule)
    "temperature": (0.0, MAX_TEMPERATURE, True, f"in [0, {MAX_TEMPERATURE:g}] (below {GREEDY_TEMPERATURE:g}: greedy)"),
    "top_p": (0.0, 1.0, False, "in (0, 1]"),
    "min_p": (0.0, 1.0, True, "in [0, 1]"),
    "repetition_penalty": (MIN_REPETITION_PENALTY, MAX_PENALTY, True,
                           f"in [{MIN_REPETITION_PENALTY:g}, {MAX_PENALTY:g}] (1 = off)"),
    "frequency_penalty": (-MAX_PENALTY, MAX_PENALTY, True, f"in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]"),
    "presence_penalty": (-MAX_PENALTY, MAX_PENALTY, True, f"in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]"),
}


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0  # 0 (or anything below GREEDY_TEMPERATURE) means greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # in (0, 1]
    min_p: float = 0.0  # in [0, 1]
    repetition_penalty: float = 1.0  # > 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    grammar: Grammar | None = None  # the output must match it (engine/grammar.py); None = unconstrained
    # vLLM's request extras. The bias stage (`token_bias`, between the grammar and the penalties, where vLLM's
    # logits processors run) applies logit_bias, allowed_token_ids, bad_words and min_tokens.
    min_tokens: int = 0  # EOS and stop_token_ids are banned (and stop strings not looked for) until this many
    stop_token_ids: tuple[int, ...] = ()  # generating one of these ends the sequence (reason "stop")
    include_stop_str_in_output: bool = False  # the stop string or stop token's text stays in the text
    skip_special_tokens: bool = True  # special tokens' text (<|im_end|>) left out of the detokenized text
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit, in [-100, 100]
    allowed_token_ids: tuple[int, ...] | None = None  # only these may be sampled (None: every token)
    bad_words: tuple[str, ...] = ()  # never generated: a word's last token is banned where its others precede
    prompt_logprobs: int | None = None  # each prompt token's log-probability and this many alternatives

    def __post_init__(self) -> None:
        # Normalise the types people naturally pass (numpy scalars, ints for floats, a single stop
        # string, a list of stops) so that to_dict() is plain JSON. Anything odd is left as it is
        # and validate() rejects it with a message naming the field.
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if _is_int(v):
                setattr(self, name, int(v))
        for name in _FLOAT_FIELDS:
            v = getattr(self, name)
            if _is_real(v):
                setattr(self, name, float(v))
        if _is_int(self.seed):
            self.seed = int(self.seed)
        if isinstance(self.ignore_eos, np.bool_):
            self.ignore_eos = bool(self.ignore_eos)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        elif isinstance(self.stop, (list, tuple)) and len(self.stop) <= MAX_STOP_STRINGS:
            self.stop = tuple(self.stop)
        if isinstance(self.grammar, dict):  # from_dict / JSON: {"kind": ..., "source": ...}
            self.grammar = Grammar.from_dict(self.grammar)
        for name in ("stop_token_ids", "allowed_token_ids", "bad_words"):
            v = getattr(self, name)
            if isinstance(v, list):
                setattr(self, name, tuple(v))
        if isinstance(self.bad_words, str):
            self.bad_words = (self.bad_words,)
        if isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_LOGIT_BIAS:
            # JSON object keys are strings ("50256": -100, as OpenAI sends them)
            self.logit_bias = {(int(k) if isinstance(k, str) and k.strip().lstrip("-").isdigit() else k):
                               (float(v) if _is_real(v) else v) for k, v in self.logit_bias.items()}
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def validate(self) -> None:
        """Raise ValueError (a bad value) or ArgumentTypeError (a bad type, also a ValueError) whose message
        starts with the field name, if any field is out of range."""
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if not _is_int(v):
                raise type_error(name, "an integer", v)
        for name in _FLOAT_FIELDS:
            v = getattr(self, name)
            if not _is_real(v):
                raise type_error(name, "a number", v)
            if not math.isfinite(v):
                raise value_error(name, "finite", v)
        if self.max_tokens < 1:
            raise value_error("max_tokens", ">= 1", self.max_tokens)
        if self.top_k < 0:
            raise value_error("top_k", ">= 0 (0 = off)", self.top_k)
        for name, (lo, hi, lo_in, rule) in _RANGES.items():
            v = getattr(self, name)
            if not ((lo <= v if lo_in else lo < v) and v <= hi):
                raise value_error(name, rule, v)
        if self.seed is not None:
            if not _is_int(self.seed):
                raise type_error("seed", "an integer or None", self.seed)
            if not _SEED_MIN <= self.seed <= _SEED_MAX:
                raise value_error("seed", f"in [{_SEED_MIN}, {_SEED_MAX}]", self.seed)
        self._validate_stop()
        if not isinstance(self.ignore_eos, bool):
            raise type_error("ignore_eos", "a bool", self.ignore_eos)
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise type_error("grammar", "a Grammar (Grammar.json_schema/.regex/.ebnf/.choice) or None", self.grammar)
        self._validate_extras()

    def _validate_extras(self) -> None:
        """vLLM's extras. Token ids are checked against the vocabulary by the engine (it knows the model)."""
        if not _is_int(self.min_tokens):
            raise type_error("min_tokens", "an integer", self.min_tokens)
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise value_error("min_tokens", f"in [0, max_tokens = {self.max_tokens}]", self.min_tokens)
        _check_ids("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS)
        if self.allowed_token_ids is not None:
            _check_ids("allowed_token_ids", self.allowed_token_ids, MAX_ALLOWED_TOKEN_IDS)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty (None: every token)")
        for name in ("include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise type_error(name, "a bool", getattr(self, name))
        if not isinstance(self.logit_bias, dict):
            raise type_error("logit_bias", "a dict of token id -> bias", self.logit_bias)
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise value_error("logit_bias", f"at most {MAX_LOGIT_BIAS} entries", len(self.logit_bias))
        for k, v in self.logit_bias.items():
            if not _is_int(k) or k < 0:
                raise type_error("logit_bias", "token ids (non-negative integers) as keys", k)
            if not _is_real(v) or not -MAX_BIAS <= v <= MAX_BIAS:
                raise value_error("logit_bias", f"biases in [-{MAX_BIAS:g}, {MAX_BIAS:g}]", v)
        if not isinstance(self.bad_words, tuple) or len(self.bad_words) > MAX_BAD_WORDS:
            raise type_error("bad_words", f"a list of at most {MAX_BAD_WORDS} strings", self.bad_words)
        for w in self.bad_words:
            if not isinstance(w, str) or not w.strip() or len(w) > MAX_BAD_WORD_CHARS:
                raise value_error("bad_words", f"non-blank strings of at most {MAX_BAD_WORD_CHARS} characters", w)
            check_unicode("bad_words", w)
        if self.prompt_logprobs is not None:
            if not _is_int(self.prompt_logprobs):
                raise type_error("prompt_logprobs", "an integer or None", self.prompt_logprobs)
            if not 0 <= self.prompt_logprobs <= MAX_PROMPT_LOGPROBS:
                raise value_error("prompt_logprobs", f"in [0, {MAX_PROMPT_LOGPROBS}]", self.prompt_logprobs)

    @property
    def biased(self) -> bool:
        """Whether the bias stage has anything to do (min_tokens counts only while it holds EOS back)."""
        return bool(self.logit_bias or self.allowed_token_ids is not None or self.bad_words or self.min_tokens)

    def _validate_stop(self) -> None:
        # the forms __post_init__ accepts are accepted here too (for a field set after construction)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        elif isinstance(self.stop, list) and len(self.stop) <= MAX_STOP_STRINGS:
            self.stop = tuple(self.stop)
        if not isinstance(self.stop, tuple):
            if isinstance(self.stop, list) and len(self.stop) > MAX_STOP_STRINGS:
                raise value_error("stop", f"at most {MAX_STOP_STRINGS} strings", self.stop)
            raise type_error("stop", "a string or a list of strings", self.stop)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise value_error("stop", f"at most {MAX_STOP_STRINGS} strings", self.stop)
        for s in self.stop:
            if not isinstance(s, str):
                raise type_error("stop", "a list of strings only", s)
            if s == "":
                raise ValueError("stop must not contain empty strings")
            if len(s) > MAX_STOP_CHARS:
                raise value_error("stop", f"strings of at most {MAX_STOP_CHARS} characters each", s)
            check_unicode("stop", s)

    def to_dict(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "seed": self.seed,
            "stop": list(self.stop),
            "ignore_eos": self.ignore_eos,
            "grammar": None if self.grammar is None else self.grammar.to_dict(),
            "min_tokens": self.min_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "logit_bias": {str(k): v for k, v in self.logit_bias.items()},
            "allowed_token_ids": None if self.allowed_token_ids is None else list(self.allowed_token_ids),
            "bad_words": list(self.bad_words),
            "prompt_logprobs": self.prompt_logprobs,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        """Build from a (JSON) dict; unknown keys are an error so a typo is not silently ignored."""
        if not isinstance(data, dict):
            raise type_error("data", "a dict of sampling parameters", data)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(map(str, unknown))}")
        return cls(**data)


def _check_ids(name: str, ids, cap: int) -> None:
    if not isinstance(ids, tuple) or len(ids) > cap:
        raise type_error(name, f"a list of at most {cap} token ids", ids)
    for t in ids:
        if not _is_int(t) or t < 0:
            raise type_error(name, "token ids (non-negative integers)", t)


def make_generator(seed: int | None = None) -> torch.Generator:
    """A CPU generator for one request: seeded when a seed is given, otherwise from OS entropy."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


# ----------------------------------------------------------------------------------------------
# Trace data


def _json_float(v: float) -> float | None:
    # JSON has no -inf/NaN; a removed token's logit is reported as None.
    return float(v) if math.isfinite(v) else None


@dataclass
class StageSnapshot:
    name: str
    logits: list[float | None]  # tracked tokens after this stage; None = removed (-inf)
    probs: list[float]  # renormalised probabilities after this stage, tracked tokens
    kept: list[bool]
    num_kept: int  # survivors over the whole vocabulary
    mass_removed: float  # probability mass this stage removed, relative to its input distribution
    active: bool  # whether the stage does anything with these params

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "logits": [None if v is None else _json_float(v) for v in self.logits],
            "probs": [_json_float(v) or 0.0 for v in self.probs],
            "kept": [bool(k) for k in self.kept],
            "num_kept": int(self.num_kept),
            "mass_removed": _json_float(self.mass_removed) or 0.0,
            "active": bool(self.active),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "StageSnapshot":
        return build(cls, data)


@dataclass
class SamplingTrace:
    token_ids: list[int]  # tracked: top_n by penalised logit (+ chosen), penalised logit desc
    token_texts: list[str]  # left empty here; the engine fills it
    stages: list[StageSnapshot]
    u: float
    chosen: int
    chosen_prob: float  # final probability of the chosen token
    chosen_rank: int  # rank of the chosen token in the raw logits, 0 = top
    greedy: bool
    params: dict
    cdf: list[tuple[int, float]]  # (token_id, cumulative prob) in draw order, tracked survivors
    vocab_size: int = 0
    grammar: GrammarStep | None = None  # a masked chain: what the grammar allowed and the mask's cost (the engine fills it)

    def to_dict(self) -> dict:
        return {
            "token_ids": [int(t) for t in self.token_ids],
            "token_texts": list(self.token_texts),
            "stages": [s.to_dict() for s in self.stages],
            "u": float(self.u),
            "chosen": int(self.chosen),
            "chosen_prob": _json_float(self.chosen_prob) or 0.0,
            "chosen_rank": int(self.chosen_rank),
            "greedy": bool(self.greedy),
            "params": dict(self.params),
            "cdf": [[int(t), _json_float(c) or 0.0] for t, c in self.cdf],
            "vocab_size": int(self.vocab_size),
            "grammar": None if self.grammar is None else self.grammar.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingTrace":
        """The inverse of to_dict() (replayed traces): stages become StageSnapshots, cdf rows tuples."""
        return build(cls, data, {"cdf": lambda rows: [(int(t), float(c)) for t, c in rows]})


# ----------------------------------------------------------------------------------------------
# The chain


class _State:
    """Logits after some stage: full vocabulary (idx None) or the survivors only."""

    __slots__ = ("idx", "vals", "sorted", "exact")

    def __init__(self, idx: torch.Tensor | None, vals: torch.Tensor, sorted_: bool = False, exact: bool = False):
        self.idx = idx
        self.vals = vals
        # True when vals are already in draw order (logit desc, ties by ascending id).
        self.sorted = sorted_
        # A masked chain normalises in float64 (`_softmax`).
        self.exact = exact

    def select(self, mask: torch.Tensor) -> "_State":
        if self.idx is None:
            idx = mask.nonzero().squeeze(1)
        else:
            idx = self.idx[mask]
        return _State(idx, self.vals[mask], self.sorted, self.exact)

    def softmax(self) -> torch.Tensor:
        """The renormalised probabilities of the state's tokens (float32).

        torch's float32 softmax sums ~49k exponentials in float32 and its results drift by up to ~1e-5 relative
        (measured on SmolLM2's logits). A masked chain's distribution must equal the unmasked one restricted and
        renormalised to 1e-6, so it sums in float64; the unmasked chain keeps torch's softmax, bit for bit as it
        always drew."""
        if not self.exact:
            return torch.softmax(self.vals, 0)
        e = torch.exp((self.vals - self.vals.max()).double())
        return (e / e.sum()).float()

    def ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions if self.idx is None else self.idx[positions]


# A full stable sort of 49152 logits costs ~8 ms, and even finding the top 1024 ~1 ms against ~0.2 ms for the
# top 64; the draw and top_p nearly always end within the most probable few dozen tokens, so they sort the
# leading 64 candidates first (plus ties), then 1024, then everything, and stop as soon as the candidates
# hold what they need. Every order is an exact prefix of the full one, so the result never depends on where
# they stop.
_PREFIXES = (64, 1024)


def _desc_order(vals: torch.Tensor, m: int) -> tuple[torch.Tensor, bool]:
    """Leading positions of the stable descending order of `vals` (logit desc, ties by position).

    Returns at least min(m, n) positions, extended to every tie at the cut, so the result is an exact
    prefix of the full order; the bool says whether it is the whole order.
    """
    n = vals.numel()
    if m >= n:
        return torch.argsort(vals, descending=True, stable=True), True
    top = torch.topk(vals, m + 1)  # one pass over the vocabulary; its order among ties is unspecified
    thr = top.values[m - 1]
    if top.values[m] < thr:
        # no tie at the cut: the m largest are exactly the tokens >= thr (the usual case, no second scan)
        cand = torch.sort(top.indices[:m]).values
    else:
        cand = (vals >= thr).nonzero().squeeze(1)  # every tie at the cut, in ascending positions
    order = cand[torch.argsort(vals[cand], descending=True, stable=True)]  # stable: ties by ascending id
    return order, order.numel() == n


def _as_logits(logits) -> torch.Tensor:
    x = logits if isinstance(logits, torch.Tensor) else torch.as_tensor(logits)
    if x.dim() != 1 or x.numel() == 0:
        raise ValueError(f"logits must be a non-empty 1-D tensor (got shape {tuple(x.shape)})")
    x = x.detach().to(device="cpu", dtype=torch.float32)
    # inf and NaN propagate through a sum: a finite sum proves every logit finite in one cheap pass (an
    # overflowing sum of finite logits only sends us to the exact check)
    if not math.isfinite(float(x.sum())) and not bool(torch.isfinite(x).all()):
        if bool(torch.isnan(x).any()):
            raise ValueError("logits contain NaN")
        # +inf would turn every softmax into NaN; the largest float keeps it the clear winner.
        x = x.clamp(max=_F32_MAX)
    return x


def _as_ids(ids, vocab: int, what: str) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise type_error(what, "token ids (integers)", ids)
        out = ids.reshape(-1).tolist()
    elif isinstance(ids, (str, bytes, dict, set)):
        raise type_error(what, "a list of token ids (ints)", ids)
    else:
        # plain ints pass as they are; anything else must be an integer type (numpy ints yes, 1.0 or True no)
        out = [t if type(t) is int else as_int(what, t) for t in ids]
    if out and (min(out) < 0 or max(out) >= vocab):
        raise ValueError(f"{what} contains a token id outside [0, {vocab})")
    return out


def _penalties_active(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _penalise(x: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    rp = params.repetition_penalty
    fp = params.frequency_penalty
    pp = params.presence_penalty
    use_rp = rp != 1.0 and (prompt or output)
    use_counts = (fp != 0.0 or pp != 0.0) and output
    if not (use_rp or use_counts):
        return x  # nothing to do: no copy on the hot path
    x = x.clone()  # never modify the caller's logits (the UI re-runs the chain on cached ones)
    if use_rp:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        v = x[seen]
        # Dividing a negative logit would raise it; multiplying pushes it further down instead.
        x[seen] = torch.where(v > 0, v / rp, v * rp)
    if use_counts:
        counts = Counter(output)
        ids = torch.tensor(list(counts.keys()), dtype=torch.long)
        if fp != 0.0:
            c = torch.tensor(list(counts.values()), dtype=torch.float32)
            x[ids] = x[ids] - c * fp
        if pp != 0.0:
            x[ids] = x[ids] - pp
    if not bool(torch.isfinite(x).all()):
        # Extreme penalties can overflow; keep -inf as "removed", never NaN or +inf.
        x = torch.nan_to_num(x, nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    return x


def _scale(x: torch.Tensor, t: float) -> torch.Tensor:
    y = x / t
    if t >= 1.0:
        return y
    lo, hi = y.aminmax()  # no infinity in y: nothing overflowed (the exact check below is a slower scan)
    if (math.isinf(float(lo)) or math.isinf(float(hi))) and bool((torch.isinf(y) & torch.isfinite(x)).any()):
        # A tiny temperature overflowed; softmax is shift-invariant, so subtract the max first.
        y = (x - x.max()) / t
    return y


def _run_chain(x: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int], record=None,
               mask: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> _State:
    """Apply the chain to raw logits `x`, first the grammar's `mask` (allowed tokens) and the `bias` (added to
    every logit, -inf bans: `token_bias`) when given; if `record` is a list, append (name, state, active)."""
    vocab = x.numel()

    def rec(name: str, st: _State, active: bool) -> None:
        if record is not None:
            record.append((name, st, active))

    st = _State(None, x)
    rec("logits", st, True)

    exact = mask is not None or bias is not None
    if mask is not None:
        x = x.masked_fill(~mask, _NEG_INF)
        if not bool((x > _NEG_INF).any()):
            raise ValueError("the grammar allows no token with a finite logit here")
        st = _State(None, x, exact=True)
        rec(GRAMMAR_STAGE, st, True)
    if bias is not None:
        x = x + bias
        if not bool((x > _NEG_INF).any()):
            raise ValueError("logit_bias, allowed_token_ids, bad_words and min_tokens leave no token to sample "
                             "here" + (" within the grammar" if mask is not None else ""))
        st = _State(None, x, exact=True)
        rec(BIAS_STAGE, st, True)

    x_pen = _penalise(x, params, prompt, output)
    if float(x_pen.max()) == _NEG_INF:  # no NaN gets here: the max is -inf only when every logit is
        raise ValueError("no token has a finite logit")
    # Unchanged logits keep the same state object, so the trace reuses its softmax.
    x = x_pen
    st = st if x_pen is st.vals else _State(None, x_pen, exact=exact)
    rec("penalties", st, _penalties_active(params))

    t = params.temperature
    if params.greedy:
        # Greedy: one-hot at the argmax of the penalised logits; the later cuts cannot change it.
        a = int(torch.argmax(x))
        st = _State(torch.tensor([a], dtype=torch.long), x[a : a + 1].clone(), True, exact)
        rec("temperature", st, True)
        for name in ("min_p", "top_k", "top_p"):
            rec(name, st, False)
        return st
    if t != 1.0:
        st = _State(None, _scale(x, t), exact=exact)
    if exact and st.idx is None:
        # a masked chain goes on with the allowed tokens only: the cuts and the draw never see the masked ones
        # (they would tie at -inf in every sort), and the draw order holds no zero-probability slices
        st = st.select(st.vals > _NEG_INF)
    rec("temperature", st, t != 1.0)

    if params.min_p > 0:
        # p_i >= min_p * max(p)  <=>  logit_i >= max logit + log(min_p); the log form cannot
        # underflow the way tiny probabilities do.
        thr = float(st.vals.max()) + math.log(params.min_p)
        mask = st.vals >= thr
        if not bool(mask.all()):
            st = st.select(mask)
    rec("min_p", st, params.min_p > 0)

    k = params.top_k
    top_k_on = 0 < k < vocab
    if top_k_on and k < st.vals.numel():
        kth = float(torch.topk(st.vals, k, sorted=False).values.min())
        # Fewer than k survivors leaves kth at -inf: keep the survivors, not the removed.
        mask = st.vals > _NEG_INF if kth == _NEG_INF else st.vals >= kth
        if not bool(mask.all()):
            st = st.select(mask)
    rec("top_k", st, top_k_on)

    if params.top_p < 1.0:
        # Sorting by logit is sorting by probability (softmax is monotonic) without the ties that
        # rounding tiny probabilities would create; stable + ascending ids = ties by lower id.
        probs = st.softmax()
        for m in (*_PREFIXES, st.vals.numel()):
            order, complete = _desc_order(st.vals, m)
            cum = torch.cumsum(probs[order].double(), 0)  # float64: 49152 float32 adds would drift
            if complete or float(cum[-1]) >= params.top_p:
                break  # else the candidates hold less than top_p: the cut lies further down
        before = torch.cat((cum.new_zeros(1), cum[:-1]))  # mass strictly before each token
        sv = st.vals[order]
        keep = (before < params.top_p) & (sv > _NEG_INF)
        # `before` is non-decreasing, so the kept tokens are a prefix; once the candidates hold
        # >= top_p, every token after them has before >= top_p and is cut as well.
        n = int(keep.sum())
        st = _State(st.ids(order[:n]), sv[:n], True, exact)
    rec("top_p", st, params.top_p < 1.0)
    return st


@dataclass
class _Draw:
    chosen: int
    probs: torch.Tensor  # softmax over the final state's vals (state order)
    sorted_ids: torch.Tensor  # token ids in draw order (possibly only the leading ones)
    cdf: torch.Tensor  # float64 cumulative probs in draw order
    complete: bool  # whether sorted_ids covers every token of the final state


def _draw(st: _State, u: float) -> _Draw:
    probs = st.softmax()
    u_t = torch.tensor([u], dtype=torch.float64)
    sizes = (probs.numel(),) if st.sorted else (*_PREFIXES, probs.numel())
    for m in sizes:
        order, complete = (torch.arange(m), True) if st.sorted else _desc_order(st.vals, m)
        sp = probs[order]
        # CPU cumsum is a sequential running sum, so a prefix's values equal the full order's.
        cdf = torch.cumsum(sp.double(), 0)
        pos = int(torch.searchsorted(cdf, u_t, right=True))
        if pos < cdf.numel() or complete:
            break  # else u lies beyond the candidates: take more
    if pos >= cdf.numel():
        # Round-off left the total just under u: take the last token that can be drawn at all.
        pos = int((sp > 0).nonzero()[-1])
    sorted_ids = st.ids(order)
    return _Draw(int(sorted_ids[pos]), probs, sorted_ids, cdf, complete)


def _check_params(params) -> None:
    if not isinstance(params, SamplingParams):
        raise type_error("params", "a SamplingParams", params)
    params.validate()  # cheap, and catches fields changed after construction


def _prepare(logits, params, prompt_ids, output_ids, mask=None, bias=None):
    """The checked logits and id lists (params: `_check_params` first, once)."""
    x = _as_logits(logits)
    prompt = _as_ids(prompt_ids, x.numel(), "prompt_ids")
    output = _as_ids(output_ids, x.numel(), "output_ids")
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
                                 and mask.shape == x.shape):
        raise type_error("mask", f"a bool tensor of the vocabulary's size ({x.numel()}) or None", mask)
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.dtype == torch.float32
                                 and bias.shape == x.shape and not bool(torch.isnan(bias).any())
                                 and not bool(torch.isposinf(bias).any())):
        raise type_error("bias", f"a float32 tensor of the vocabulary's size ({x.numel()}) without NaN or +inf, "
                                 "or None", bias)
    return x, prompt, output


def token_bias(params: SamplingParams, output_ids: list[int], vocab_size: int, stop_ids: set[int] | frozenset,
               bad_words_ids: tuple[tuple[int, ...], ...] = ()) -> torch.Tensor | None:
    """The bias stage's vector for the next token of a sequence whose output so far is `output_ids` (None: the
    stage has nothing to do). As vLLM's logits processors: logit_bias adds, and -inf bans every token outside
    allowed_token_ids, the last token of each bad word whose other tokens end the output (`bad_words_ids`, the
    words as token ids: the engine tokenizes them), and, while the output is shorter than min_tokens, the
    `stop_ids` (EOS and stop_token_ids). A pure function of its arguments: what_if and the speculative verify
    recompute it for any output."""
    holding = len(output_ids) < params.min_tokens and bool(stop_ids)
    if not (params.logit_bias or params.allowed_token_ids is not None or bad_words_ids or holding):
        return None
    if params.allowed_token_ids is not None:
        bias = torch.full((vocab_size,), _NEG_INF, dtype=torch.float32)
        bias[torch.tensor(params.allowed_token_ids, dtype=torch.long)] = 0.0
    else:
        bias = torch.zeros(vocab_size, dtype=torch.float32)
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        bias[ids] = bias[ids] + torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)
    banned = [word[-1] for word in bad_words_ids
              if len(word) == 1 or tuple(output_ids[len(output_ids) - len(word) + 1:]) == word[:-1]]
    if holding:
        banned += [t for t in stop_ids if t < vocab_size]
    if banned:
        bias[torch.tensor(banned, dtype=torch.long)] = _NEG_INF
    return bias


# ----------------------------------------------------------------------------------------------
# Public API


def sampling_probs(logits, params: SamplingParams, prompt_ids=(), output_ids=(), mask=None,
                   bias=None) -> torch.Tensor:
    """The exact final distribution the draw uses: float32 over the vocabulary, sums to 1. `mask`: the tokens a
    grammar allows (a bool tensor over the vocabulary; None: unconstrained); `bias`: `token_bias`'s vector."""
    _check_params(params)
    x, prompt, output = _prepare(logits, params, prompt_ids, output_ids, mask, bias)
    st = _run_chain(x, params, prompt, output, mask=mask, bias=bias)
    probs = st.softmax()
    if st.idx is None:
        return probs
    out = torch.zeros(x.numel(), dtype=torch.float32)
    out[st.idx] = probs
    return out


def sample(
    logits,
    params: SamplingParams,
    prompt_ids,
    output_ids,
    generator: torch.Generator | None,
    *,
    trace: bool = False,
    top_n: int = 20,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    checked: bool = False,
) -> tuple[int, SamplingTrace | None]:
    """Draw one token. Consumes exactly one uniform number from `generator` (also when greedy), so a
    seeded request reproduces whatever its params are. `mask`, `bias`: as in sampling_probs. checked=True: the caller
    vouches that params are valid and the ids in range (the engine's own copies), and they are not checked
    again (~0.05 ms of a ~4 ms step)."""
    if trace:
        top_n = _check_top_n(top_n)  # before the generator is touched: a bad call must not consume u
    if not checked:
        _check_params(params)
    if not trace and mask is None and bias is None and params.greedy and not _penalties_active(params):
        fast = _greedy_fast(logits, prompt_ids, output_ids, generator, checked)
        if fast is not None:
            return fast, None
    x, prompt, output = _prepare(logits, params, prompt_ids, output_ids, mask, bias)
    record = [] if trace else None
    st = _run_chain(x, params, prompt, output, record, mask, bias)
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    d = _draw(st, u)
    if not trace:
        return d.chosen, None
    return d.chosen, _build_trace(record, d, params, u, top_n, prompt, output)


def _greedy_fast(logits, prompt_ids, output_ids, generator, checked: bool = False) -> int | None:
    """The chain's answer for greedy params without penalties (the caller checked them), without its stages: the
    first position of the largest logit (the lowest id among ties, as the chain's argmax), after the same checks;
    one uniform drawn, as always. None where the chain must run (logits not a float32 CPU vector, or a largest
    logit that is not finite: NaN, +inf, or none finite, which the chain refuses or clamps). Why: a decode step
    samples on caches its forward has just flushed, where each torch op costs tens of microseconds; the chain and
    the draw took ~0.3-0.6 ms of a ~6 ms q4 step, this one max ~0.1 ms."""
    if not (isinstance(logits, torch.Tensor) and logits.dtype == torch.float32 and logits.device.type == "cpu"
            and logits.dim() == 1 and logits.numel() > 0):
        return None
    if not checked:
        _as_ids(prompt_ids, logits.numel(), "prompt_ids")
        _as_ids(output_ids, logits.numel(), "output_ids")
    if native.available():  # the lab's argmax: ~10 us where torch's max took ~0.1 ms
        chosen, top = torch.ops.inferlab_native.first_max(logits.detach())
    else:
        top, chosen = torch.max(logits.detach(), 0)  # a NaN anywhere makes the max NaN (torch propagates it)
    if not math.isfinite(float(top)):
        return None
    torch.rand((), generator=generator, dtype=torch.float64)
    return int(chosen)


def trace_chain(logits, params: SamplingParams, prompt_ids, output_ids, u: float, top_n: int = 20,
                mask: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> SamplingTrace:
    """Recompute the whole chain from cached logits with a given u ("what-if" for the UI); `mask` as the step's,
    `bias` as `token_bias` gives it for these params."""
    if not _is_real(u):
        raise type_error("u", "a number in [0, 1)", u)
    if not 0.0 <= float(u) < 1.0:
        raise value_error("u", "in [0, 1)", u)
    top_n = _check_top_n(top_n)
    _check_params(params)
    x, prompt, output = _prepare(logits, params, prompt_ids, output_ids, mask, bias)
    record: list = []
    st = _run_chain(x, params, prompt, output, record, mask, bias)
    d = _draw(st, float(u))
    return _build_trace(record, d, params, float(u), top_n, prompt, output)


def _full(st: _State, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-vocabulary logits (-inf = removed) and renormalised probs of a state."""
    probs = st.softmax()  # the same computation as the draw: bitwise-equal final probs
    if st.idx is None:
        return st.vals, probs
    fv = torch.full((vocab,), _NEG_INF, dtype=torch.float32)
    fv[st.idx] = st.vals
    fp = torch.zeros(vocab, dtype=torch.float32)
    fp[st.idx] = probs
    return fv, fp


def _check_top_n(top_n) -> int:
    return as_int("top_n", top_n, 0, MAX_TOP_N)


def _tracked(record, d: _Draw, params: SamplingParams, top_n: int, prompt: list[int], output: list[int]) -> list[int]:
    """The tokens a trace follows: the top_n by penalised logit, then the chosen one. A masked chain ranks by
    the penalised logits *without* the mask (the point is to see which of the model's favourites the grammar
    cut) and adds the grammar's own top few, so the later stages still have bars to show."""
    stage = {name: st for name, st, _ in record}
    pen = stage["penalties"].vals
    masked = GRAMMAR_STAGE in stage or BIAS_STAGE in stage  # the bias bans tokens as a mask does
    ranked = _penalise(stage["logits"].vals, params, prompt, output) if masked else pen
    tracked = _desc_order(ranked, top_n)[0][:top_n].tolist() if top_n else []
    if masked and top_n:
        seen = set(tracked)
        # no more than the grammar allows: a cut at -inf would tie (and sort) the whole vocabulary
        extra = min(GRAMMAR_EXTRA_TRACKED, top_n, int((pen > _NEG_INF).sum()))
        tracked += [t for t in _desc_order(pen, extra)[0][:extra].tolist() if t not in seen]
    if d.chosen not in tracked:
        tracked.append(d.chosen)
    return tracked


def _build_trace(record, d: _Draw, params: SamplingParams, u: float, top_n: int, prompt: list[int],
                 output: list[int]) -> SamplingTrace:
    raw = record[0][1].vals
    vocab = raw.numel()

    tracked = _tracked(record, d, params, top_n, prompt, output)
    tt = torch.tensor(tracked, dtype=torch.long)

    stages: list[StageSnapshot] = []
    prev = None  # the previous distinct state: (state, full logits, probs, alive mask or None, kept count)
    for name, st, active in record:
        removed = 0.0
        if prev is None or st is not prev[0]:
            fv, fp = _full(st, vocab)
            # a full state without -inf keeps every token: no mask to build or count (the usual state before
            # the cuts; each mask is a pass over the whole vocabulary)
            alive = None if st.idx is None and float(st.vals.min()) > _NEG_INF else fv > _NEG_INF
            if prev is not None and alive is not None:  # (alive None: every token still alive, none removed)
                gone = ~alive if prev[3] is None else prev[3] & ~alive
                removed = float(prev[2][gone].double().sum())
            prev = (st, fv, fp, alive, vocab if alive is None else int(alive.sum()))
        _, fv, fp, alive, num_kept = prev
        sub_v = fv[tt].tolist()
        stages.append(
            StageSnapshot(
                name=name,
                logits=[v if math.isfinite(v) else None for v in sub_v],
                probs=fp[tt].tolist(),
                kept=[True] * len(tracked) if alive is None else alive[tt].tolist(),
                num_kept=num_kept,
                mass_removed=min(1.0, max(0.0, removed)),
                active=bool(active),
            )
        )

    c = d.chosen
    chosen_rank = int((raw > raw[c]).sum()) + int((raw[:c] == raw[c]).sum())
    final_probs = prev[2]

    sorted_ids, cum = d.sorted_ids, d.cdf
    survivors = int(stages[-1].kept.count(True))
    if not d.complete and int(torch.isin(sorted_ids, tt).sum()) < survivors:
        # A huge top_n tracks tokens beyond the draw's candidates: order the whole state for display.
        st = record[-1][1]
        order, _ = _desc_order(st.vals, st.vals.numel())
        sorted_ids, cum = st.ids(order), torch.cumsum(d.probs[order].double(), 0)
    pos = torch.isin(sorted_ids, tt).nonzero().squeeze(1)
    cdf = list(zip(sorted_ids[pos].tolist(), cum[pos].tolist()))

    return SamplingTrace(
        token_ids=tracked,
        token_texts=[],
        stages=stages,
        u=u,
        chosen=c,
        chosen_prob=float(final_probs[c]),
        chosen_rank=chosen_rank,
        greedy=params.greedy,
        params=params.to_dict(),
        cdf=cdf,
        vocab_size=vocab,
    )


__all__ = [
    "STAGE_NAMES",
    "GRAMMAR_STAGE",
    "BIAS_STAGE",
    "GREEDY_TEMPERATURE",
    "MAX_TEMPERATURE",
    "MAX_PENALTY",
    "MIN_REPETITION_PENALTY",
    "MAX_STOP_STRINGS",
    "MAX_STOP_CHARS",
    "MAX_TOP_N",
    "SamplingParams",
    "SamplingTrace",
    "StageSnapshot",
    "make_generator",
    "sample",
    "sampling_probs",
    "trace_chain",
    "token_bias",
]
