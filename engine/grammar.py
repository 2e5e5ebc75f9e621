"""Constrained decoding: a grammar as a value, and each sequence's place in it as a mask over the vocabulary.

    SamplingParams(grammar=Grammar.json_schema({...}))   # or .regex(r"\\d{4}-\\d{2}-\\d{2}"), .ebnf(text), .choice([...])

One mechanism: llguidance (Microsoft's grammar engine, the one vLLM and SGLang ship besides xgrammar; a Rust
wheel without dependencies) compiles the grammar against the model's tokenizer, and a `GrammarMatcher` per
sequence answers "which tokens may come next" as a bool mask over the vocabulary. The sampling chain applies
that mask to the logits before its other stages (engine/sampling.py); the engine keeps the matcher at the end
of the sequence's output (`sync`), whatever changed the output: a sampled or forced token, a speculative round,
`rewind`, `branch`, or a failed step that was undone. Why llguidance and not xgrammar: docs/performance.md,
"Constrained decoding" (measured on this tokenizer).

A `Grammar` is checked when it is made (its size, then llguidance's own validation, which needs no tokenizer),
so a bad grammar is refused with a message naming the problem before any request exists; compiling it for the
tokenizer (add_request) can still refuse what only the vocabulary reveals.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .checks import check_unicode, short_repr, type_error
from .records import Record

KINDS = ("json_schema", "regex", "ebnf", "choice")
MAX_GRAMMAR_CHARS = 16_384  # a grammar's text (a schema as JSON text): compiling is linear in it, and it travels in every trace
MAX_SCHEMA_DEPTH = 32  # nesting of a JSON schema: deeper ones are recursive-descent bombs, never real answers
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 256
# JSON output in one fixed layout: ", " and ": " between items and keys, no other whitespace. Without it the
# model may pad with newlines for as long as max_tokens lets it (llguidance's default allows any whitespace).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_COMPILED_CACHE = 64  # compiled grammars kept per process (a new sequence copies one instead of compiling)


def _llg():
    import llguidance  # imported on first use: a process that never constrains never loads the Rust library

    return llguidance


@dataclass(frozen=True)
class Grammar:
    """What a sequence's output must match. `kind` is one of KINDS; `source` the grammar as text: a JSON schema
    as compact JSON (its key order is kept: the output follows it), a regex, an EBNF grammar (Lark syntax as
    llguidance reads it, or GBNF with `::=`), or for `choice` the JSON list of its options. Frozen and hashable:
    a compiled grammar is cached per (grammar, tokenizer)."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise type_error("grammar kind", "one of " + ", ".join(KINDS), self.kind)
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)} (got {short_repr(self.kind)})")
        if not isinstance(self.source, str):
            raise type_error(f"grammar ({self.kind})", "a str", self.source)
        _check_size(self.kind, self.source)
        error = _llg().LLMatcher.validate_grammar(self.llguidance_grammar())
        if error:
            raise ValueError(f"grammar ({self.kind}) is invalid: {_first_lines(error)}")

    # ---- the four ways to make one ------------------------------------------------------------------
    @classmethod
    def json_schema(cls, schema: dict | str) -> "Grammar":
        """A JSON Schema, as a dict or as JSON text."""
        if isinstance(schema, str):
            _check_size("json_schema", schema)
            try:
                schema = json.loads(schema)
            except RecursionError:
                raise ValueError(f"grammar (json_schema) nests deeper than {MAX_SCHEMA_DEPTH} levels") from None
            except ValueError as exc:
                raise ValueError(f"grammar (json_schema) is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise type_error("grammar (json_schema)", "a JSON object (dict) or its JSON text", schema)
        _check_depth(schema)
        try:
            text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"grammar (json_schema) is not plain JSON: {exc}") from None
        return cls("json_schema", text)

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        """The whole output must match `pattern` (Rust regex syntax; anchored at both ends)."""
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, text: str) -> "Grammar":
        """An EBNF grammar: Lark syntax (`start: ...`) as llguidance reads it, or GBNF (`root ::= ...`)."""
        return cls("ebnf", text)

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Grammar":
        """The output is exactly one of `options`."""
        if isinstance(options, str) or not isinstance(options, (list, tuple)):
            raise type_error("grammar (choice)", "a list of strings", options)
        if not 1 <= len(options) <= MAX_CHOICES:
            raise ValueError(f"grammar (choice) needs 1 to {MAX_CHOICES} options (got {len(options)})")
        for o in options:
            if not isinstance(o, str):
                raise type_error("grammar (choice) options", "strings", o)
            if not o or len(o) > MAX_CHOICE_CHARS:
                raise ValueError(f"grammar (choice) options must have 1 to {MAX_CHOICE_CHARS} characters "
                                 f"(got {short_repr(o)})")
        return cls("choice", json.dumps(list(options), ensure_ascii=False))

    # ---- what it is ---------------------------------------------------------------------------------
    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own form."""
        M = _llg().LLMatcher
        if self.kind == "json_schema":
            return M.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return M.grammar_from_regex(self.source)
        if self.kind == "ebnf":
            from llguidance.gbnf_to_lark import any_to_lark

            try:
                return M.grammar_from_lark(any_to_lark(self.source))
            except Exception as exc:  # noqa: BLE001 - the GBNF converter raises plain exceptions of its own
                raise ValueError(f"grammar (ebnf) is invalid: {_first_lines(str(exc))}") from None
        # a Lark rule of string literals; JSON string syntax is Lark's, escapes included
        return M.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in json.loads(self.source)))

    def describe(self, max_chars: int = 60) -> str:
        """A one-line label: the kind and the start of the source."""
        src = " ".join(self.source.split())
        if len(src) > max_chars:
            src = src[: max_chars - 1] + "…"
        return f"{self.kind}: {src}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source}

    @classmethod
    def from_dict(cls, data: Any) -> "Grammar":
        """The inverse of to_dict(); a Grammar passes through."""
        if isinstance(data, Grammar):
            return data
        if not isinstance(data, dict) or set(data) != {"kind", "source"}:
            raise type_error("grammar", 'a Grammar or a dict {"kind": ..., "source": ...}', data)
        if data["kind"] == "json_schema":  # re-parsed, so a hand-written schema gets the same checks
            return cls.json_schema(data["source"])
        return cls(data["kind"], data["source"])


def _check_size(kind: str, text: str) -> None:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"grammar ({kind}) is {len(text)} characters, more than the limit of {MAX_GRAMMAR_CHARS}")
    if not text.strip():
        raise ValueError(f"grammar ({kind}) must not be empty")
    check_unicode(f"grammar ({kind})", text)


def _check_depth(value: Any, depth: int = 0) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"grammar (json_schema) nests deeper than {MAX_SCHEMA_DEPTH} levels")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for v in children:
        _check_depth(v, depth + 1)


def _first_lines(error: str) -> str:
    """llguidance's message in one line: its first line and its "error: ..." lines (the rest draws the source)."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    picked = [lines[0]] + [ln for ln in lines[1:] if ln.lower().startswith("error")]
    return " ".join(picked)[:400]


# ----------------------------------------------------------------------------------------------
# Compiling for a tokenizer


_lock = threading.Lock()
_tokenizers: dict[tuple, tuple] = {}  # (id(hf tokenizer), vocab, eos) -> (hf tokenizer, LLTokenizer)
_compiled: OrderedDict = OrderedDict()  # (Grammar, tokenizer key) -> a fresh LLMatcher to copy


def _ll_tokenizer(tokenizer, vocab_size: int, eos_ids: Sequence[int]):
    """llguidance's view of a Hugging Face tokenizer (building one reads the whole vocabulary: ~0.5 s, cached)."""
    key = (id(tokenizer), vocab_size, tuple(sorted(eos_ids)))
    with _lock:
        hit = _tokenizers.get(key)
    if hit is not None:
        return key, hit[1]
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids) or None)
    with _lock:
        _tokenizers[key] = (tokenizer, ll)  # the tokenizer itself is kept so its id is never reused
    return key, ll


def compile_grammar(grammar: Grammar, tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> "GrammarMatcher":
    """A matcher at the start of `grammar` for this tokenizer; ValueError if the grammar cannot work with it."""
    if not isinstance(grammar, Grammar):
        raise type_error("grammar", "a Grammar", grammar)
    tkey, ll = _ll_tokenizer(tokenizer, vocab_size, eos_ids)
    key = (grammar, tkey)
    with _lock:
        fresh = _compiled.get(key)
        if fresh is not None:
            _compiled.move_to_end(key)
    if fresh is None:
        fresh = _llg().LLMatcher(ll, grammar.llguidance_grammar(), log_level=0)
        if fresh.is_error():
            raise ValueError(f"grammar ({grammar.kind}) cannot be used with this tokenizer: "
                             f"{_first_lines(fresh.get_error())}")
        _check_start(grammar, fresh, vocab_size, eos_ids)
        with _lock:
            _compiled[key] = fresh
            while len(_compiled) > _COMPILED_CACHE:
                _compiled.popitem(last=False)
    return GrammarMatcher(grammar, fresh, vocab_size)


def _check_start(grammar: Grammar, fresh, vocab_size: int, eos_ids: Sequence[int]) -> None:
    """Refuse a grammar that validates but cannot start an output (once, at compile: compiled ones are cached).

    Validation reads the grammar alone; that it matches nothing shows only at the first mask. `start: x`,
    `x: x` (a rule that never ends), `[^\\x00-\\x{10FFFF}]` (an empty class), a schema that is only `{"$ref": "#"}`:
    the matcher allows no token at the start and goes into an error state, and every later step of the sequence
    failed with "refused tokens it had validated". `(a{1000}){1000}` allows its first token but overflows
    llguidance's lexer limits when consuming it ("too many expressions constructed"), so one allowed token is
    consumed on a copy too. Both cost a mask (~ms; ~1 s for that regex, bounded by llguidance's lexer fuel)."""
    probe = fresh.deep_copy()  # the cached start state is never consumed into
    words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    probe.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    label = f"grammar ({grammar.kind}) {grammar.describe(40).split(': ', 1)[-1]!r}"
    if probe.is_error():
        raise ValueError(f"{label} matches no text: no token can start it")  # llguidance says only NoExtensionBias
    allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size])
    eos = {int(t) for t in eos_ids}
    first = next((int(t) for t in allowed if int(t) not in eos), None)
    if first is None:
        if probe.is_accepting():
            return  # only the empty output matches: the sequence ends at once, which is no fault
        raise ValueError(f"{label} matches no text: no token can start it")
    if not probe.consume_tokens([first]) or probe.is_error():
        why = (probe.get_error().strip().splitlines() or ["its limits"])[0][:200]
        raise ValueError(f"{label} is too large for the grammar engine to follow ({why})")


# ----------------------------------------------------------------------------------------------
# One sequence's matcher


class GrammarMatcher:
    """Where one sequence's output stands in its grammar.

    The matcher does not advance by itself: `sync(output_ids)` brings it to the end of the given tokens, rolling
    back to their common prefix with what it consumed before and consuming the rest. So every change of the
    output (a token, a round, rewind, branch, a step undone) is followed by the same call, and the matcher can
    never drift from the sequence.
    """

    def __init__(self, grammar: Grammar, fresh, vocab_size: int):
        self.grammar = grammar
        self._fresh = fresh  # the compiled start state, shared (never consumed into): copies are cheap
        self._m = fresh.deep_copy()
        self.vocab_size = vocab_size
        self.consumed: list[int] = []
        self.mask_seconds = 0.0  # the last allowed() call's time

    def fork(self) -> "GrammarMatcher":
        """An independent matcher at the same place (a branch)."""
        other = GrammarMatcher.__new__(GrammarMatcher)
        other.grammar, other._fresh, other.vocab_size = self.grammar, self._fresh, self.vocab_size
        other._m, other.consumed, other.mask_seconds = self._m.deep_copy(), list(self.consumed), 0.0
        return other

    def sync(self, tokens: Sequence[int]) -> None:
        """Move to the end of `tokens` (a sequence's output so far). ValueError, with the matcher unchanged,
        if the grammar does not allow them."""
        done = self.consumed
        n = len(done)
        if len(tokens) >= n and list(tokens[:n]) == done:
            common = n
        else:
            common = next((i for i, (a, b) in enumerate(zip(done, tokens)) if a != b), min(n, len(tokens)))
        rest = [int(t) for t in tokens[common:]]
        if common == n and not rest:
            return
        if common < n:
            self._back_to(common)
        if rest:
            fits = self._m.validate_tokens(rest)
            if fits < len(rest):
                raise ValueError(f"token {rest[fits]} at output position {common + fits} does not fit the grammar "
                                 f"({self.grammar.describe(40)})")
            if not self._m.consume_tokens(rest):  # validated above: only an llguidance fault gets here
                err = _first_lines(self._m.get_error())
                self._back_to(common)
                raise ValueError(f"the grammar matcher refused tokens it had validated: {err}")
            self.consumed.extend(rest)

    def _back_to(self, n: int) -> None:
        if not self._m.rollback(len(self.consumed) - n) or self._m.is_error():
            # a matcher in an error state cannot roll back: start again from the compiled state
            self._m = self._fresh.deep_copy()
            if n and not self._m.consume_tokens(self.consumed[:n]):
                raise ValueError("the grammar matcher could not replay the output it had accepted")
        del self.consumed[n:]

    def allowed(self) -> torch.Tensor:
        """The tokens the grammar allows next: a bool tensor over the vocabulary (EOS only when it accepts)."""
        t = time.perf_counter()
        words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self._m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        mask = torch.from_numpy(np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size].view(bool))
        self.mask_seconds = time.perf_counter() - t
        return mask

    def allows(self, token: int) -> bool:
        return self._m.validate_tokens([int(token)]) == 1

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (EOS would be allowed)."""
        return self._m.is_accepting()

    @property
    def done(self) -> bool:
        """Complete, and the grammar allows no continuation: the sequence ends here."""
        return self._m.is_stopped()


@dataclass
class GrammarStep(Record):
    """The grammar's part of one sampled step (SamplingTrace.grammar): what it allowed and what that cost."""

    kind: str
    description: str  # Grammar.describe()
    allowed: int  # tokens of the vocabulary the mask let through
    mask_ms: float  # building the mask (the grammar engine's time; applying it is part of the chain)
    accepting: bool  # the output before this token was already a complete match


__all__ = ["KINDS", "MAX_GRAMMAR_CHARS", "MAX_SCHEMA_DEPTH", "MAX_CHOICES", "MAX_CHOICE_CHARS", "Grammar",
           "GrammarMatcher", "GrammarStep", "compile_grammar"]
