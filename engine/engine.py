"""Engine: requests in, one scheduler step at a time, a StepEvent out.

    eng = Engine.from_pretrained("bundled")
    rid = eng.add_request("Что такое гравитация?", SamplingParams(max_tokens=32), chat=True)
    event = eng.step()          # one prefill or decode step of every scheduled sequence

`generate` and `stream` are loops over `step()` without instrumentation. The engine owns one KV pool; several
engines can share one loaded model through `Engine.session()`.

Owners: a request may name who asked for it (`owner=`: a browser tab, the lecture, an API client), so one engine
can serve a room. `step(owners={...})` then runs only those owners' sequences, batched together; everyone
else's are held (they keep their KV blocks, unless the pool runs short and preemption takes them, and their
place in the queue). `seq_view` is the read-only face of a
sequence that callers get; they never need the Sequence objects themselves.

A request may speculate (`speculative=SpeculativeConfig(...)`): its decode steps become rounds in which a drafter
proposes k tokens and the target verifies them in the same forward as the other sequences' steps (see
engine/speculative.py).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import math
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from . import compute, governor, kernels, metrics
from . import grammar as grammar_mod
from . import speculative as spec_mod
from .checks import StepFailed, as_bool, as_instance, as_int, as_text, as_token_ids, type_error, value_error
from .events import CaptureData, LogitStats, PromptLogprob, SeqEvent, StepEvent
from .kv_cache import BlockManager, KVFormula, KVStats, kv_block_preserver, kv_bytes_per_token, num_blocks_for_budget
from .loader import LoadedModel, load
from .model import Capture, KVStorage, Model, SeqInput
from .sampling import MAX_TOP_N, SamplingParams, SamplingTrace, sample, sampling_probs, token_bias, trace_chain
from .scheduler import ScheduledSeq, Scheduler, Sequence, Status
from .speculative import (AdaptiveK, Draft, DraftRequest, RoundDist, RoundDraft, RoundFinal, RoundResidual,
                          RoundRollback, SpecRound, SpeculativeConfig, SpecState, Verification)
from .tokenizer import MAX_PROMPT_CHARS, MAX_SYSTEM_CHARS, IncrementalDetokenizer, render_prompt, token_bytes

DEFAULT_KV_MEMORY = 256 * 1024 * 1024
MAX_BLOCK_SIZE = 1024  # tokens per KV block; real engines use 16-256
MAX_NUM_SEQS = 1024  # a draft model's KV pool is sized by it, so it must stay a sane number
MAX_NEAREST_K = 1000  # nearest_tokens answers are cached; k bounds what one answer may hold
MAX_SOURCE_CHARS = 4096  # a model source is a name or a path
MAX_BAD_WORDS_CACHE = 256  # tokenized bad-word lists kept per engine
DRIVE_SLICE_S = 0.02  # generate and stream: steps per hand-over to the compute thread, by time (Engine._steps_for)
_SETTINGS = ("kv_memory", "block_size", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching")


@dataclass(frozen=True)
class SeqView:
    """A sequence as callers see it: a frozen copy of its public state (taking one costs a list copy)."""

    seq_id: int
    owner: str
    status: str  # "waiting", "running" or "finished"
    finish_reason: str | None
    params: SamplingParams
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    prompt_text: str
    num_computed: int  # tokens whose K/V are in the pool
    num_blocks: int  # KV blocks its table holds now
    preemptions: int
    parent_id: int | None
    speculative: bool
    has_sampled: bool  # a traced step sampled its last token: what_if can recompute that chain
    forced_token: int | None

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.output_ids


@dataclass
class GenerationResult:
    seq_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    num_cached_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    events: list[StepEvent] = field(default_factory=list)
    speculative: dict | None = None  # SpecState.stats(): proposed, accepted, target_passes, α, ... (None: plain)


@dataclass
class _StepWork:
    """One step's working state, handed from phase to phase of Engine._step (lists index like `plan`)."""

    trace: bool
    capture: Capture | None
    t0: float  # perf_counter at the step's start; the other t_* are taken between phases
    plan: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    drafts: dict[int, Draft] = field(default_factory=dict)  # plan index -> this step's drafts
    inputs: list[SeqInput] = field(default_factory=list)
    seq_events: list[SeqEvent] = field(default_factory=list)
    logits: torch.Tensor | None = None  # every sampled row of the batch, in plan order (None: idle step)
    caps: dict = field(default_factory=dict)  # plan index -> the model's capture of that sequence
    reasons: dict[int, str | None] = field(default_factory=dict)  # plan index -> finish reason (None: goes on)
    counts: dict[int, int] = field(default_factory=dict)  # plan index -> tokens emitted (a round emits several)
    finished: list[int] = field(default_factory=list)  # seq ids
    t_sched: float = 0.0
    t_draft: float = 0.0
    t_forward: float = 0.0
    t_sample: float = 0.0
    t_end: float = 0.0


class Engine:
    def __init__(self, loaded: LoadedModel, model: Model, *, kv_memory: int = DEFAULT_KV_MEMORY,
                 block_size: int = 16, max_num_batched_tokens: int = 512, max_num_seqs: int = 16,
                 enable_prefix_caching: bool = True):
        settings = _check_settings(dict(kv_memory=kv_memory, block_size=block_size,
                                        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                        enable_prefix_caching=enable_prefix_caching), model.device)
        kv_memory, block_size, max_num_batched_tokens, max_num_seqs, enable_prefix_caching = (
            settings[k] for k in _SETTINGS)
        self.loaded, self.model, self.spec = loaded, model, model.spec
        self.tokenizer = loaded.tokenizer
        self.model_id = loaded.model_id
        self.device = str(model.device)
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token(self.spec.num_layers, self.spec.num_kv_heads,
                                                     self.spec.head_dim, model.element_size)
        num_blocks = num_blocks_for_budget(kv_memory, block_size, self.kv_bytes_per_token)
        try:
            self.kv = KVStorage(self.spec, num_blocks, block_size, model.dtype, model.device)
        except (RuntimeError, MemoryError) as exc:  # the allocator's own message names no setting
            raise ValueError(f"kv_memory of {kv_memory} bytes could not be allocated on {model.device} "
                             f"({type(exc).__name__}: {str(exc)[:120]}); give the engine less kv_memory") from exc
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching, copy_block=self.kv.copy_block,
                                   preserve_block=kv_block_preserver(self.kv))
        self.scheduler = Scheduler(self.blocks, max_num_batched_tokens, max_num_seqs)
        self.max_model_len = model.max_model_len
        self.sequences: dict[int, Sequence] = {}
        self.instrument: Capture | None = None  # set to a Capture to record attention / lens / norms
        self.capture_seq_ids: set[int] | None = None  # None: every scheduled sequence
        # Called with True just before the part of a step's forward that runs without Python's GIL (the
        # scripted layers and the head of an uninstrumented forward, engine/scripted.py) and with False just
        # after it: a host with Python work of its own (the web app building pages) can do it then instead of
        # contending for the GIL with the step's Python phases.
        self.forward_hook: Callable[[bool], None] | None = None
        self.step_index = 0
        self.clock = 0.0  # engine time: the sum of step durations (idle time between manual steps excluded)
        self._next_id = 0
        self._lock = threading.RLock()
        # Public reads (seq_view, has_unfinished, ...) of the last committed state: key -> [value, build, read
        # since the last change]. A read that finds its key never waits for a running step. The web app builds
        # each page from several such reads while the room's engine steps back to back; each read waited for
        # the step in progress, and a frame took several steps to build.
        self._published: dict = {}
        self.eos_ids = self._eos_ids()
        self._embed_norms = None
        self._nearest_cache: dict[tuple[int, int], tuple] = {}  # (token id, k) -> nearest_tokens' answer
        self._draft_models: dict = {}  # draft source -> (LoadedModel, Model); shared with sessions
        self._drafters: dict = {}  # drafters shared by this engine's requests (a draft model's owns a KV pool)
        self._settings = settings
        # Constrained decoding (engine/grammar.py): each constrained sequence's matcher, kept at the end of its
        # output by `_grammar_at`; the mask of its last traced draw, for what_if (keyed by that draw's cache, so
        # an undone step's mask is never used); the masks' build time within the running step.
        self._grammars: dict[int, grammar_mod.GrammarMatcher] = {}
        self._last_masks: dict[int, tuple] = {}
        self._mask_s = 0.0
        self._bad_words: dict[tuple[str, ...], tuple[tuple[int, ...], ...]] = {}  # words -> their token ids

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    @compute.routed
    def from_pretrained(cls, source: str = "bundled", device: str = "cpu", dtype: torch.dtype | None = None,
                        progress: Callable[[float, str], None] | None = None, weights: str = "fp32",
                        **kwargs) -> "Engine":
        """weights: the format the projections run in (engine/kernels.py): "fp32" (the reference), "bf16",
        "int8" (per channel) or "q4" (the bundled GGUF's own 4-bit weights)."""
        # everything is checked before the (seconds-long) load
        source = as_text("source", source, MAX_SOURCE_CHARS)
        if weights not in kernels.FORMATS:
            raise (type_error if not isinstance(weights, str) else value_error)(
                "weights", "one of " + ", ".join(map(repr, kernels.FORMATS)), weights)
        device = _check_device(device)
        if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise (type_error if not isinstance(dtype, torch.dtype) else value_error)(
                "dtype", "None, torch.float32, torch.bfloat16 or torch.float16", dtype)
        if progress is not None and not callable(progress):
            raise type_error("progress", "a callable or None", progress)
        unknown = sorted(set(kwargs) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"from_pretrained() got unknown setting(s) {', '.join(map(repr, unknown))}; "
                            f"settings are {', '.join(_SETTINGS)}")
        _check_settings(kwargs, torch.device(device))
        if dtype is None:
            # fp32 on CPU: bf16/fp16 matmuls there are many times slower, not faster.
            dtype = torch.float32 if device == "cpu" else torch.bfloat16
        loaded = load(source, progress)
        if progress:
            progress(0.9, "Preparing weights for our forward pass")
        if weights in ("int8", "q4") and (device != "cpu" or dtype != torch.float32):
            raise ValueError(f"weights={weights!r} runs on the CPU with float32 activations (torch's CPU kernels)")
        model = Model.from_loaded(loaded, device=device, dtype=dtype, weights=weights)
        loaded.state_dict = {}  # the model keeps its own re-laid-out copies
        # What exists now (the libraries' modules, the tokenizer, the model's Python objects) mostly lives as long
        # as the process: freezing it keeps the interpreter's full collections from walking it again and again
        # (~345K objects: one full collection paused a generation for ~210 ms, about every 300 tokens, here). A
        # frozen object is still freed when its last reference goes, and an engine is freed that way (no cycles:
        # tests/test_engine.py checks it with the collector off), so a dropped engine does not linger.
        gc.freeze()
        if progress:
            progress(1.0, "Ready")
        return cls(loaded, model, **kwargs)

    @compute.routed
    def session(self, **overrides) -> "Engine":
        """A new engine with its own KV pool and requests, sharing this one's weights (and loaded draft models)."""
        unknown = sorted(set(overrides) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"session() got unknown setting(s) {', '.join(map(repr, unknown))}; "
                            f"settings are {', '.join(_SETTINGS)}")
        eng = Engine(self.loaded, self.model, **{**self._settings, **overrides})
        eng._draft_models = self._draft_models
        return eng

    def _eos_ids(self) -> set[int]:
        ids = set()
        for value in (getattr(self.loaded.config, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    # ---- requests -------------------------------------------------------------------------------
    def encode(self, prompt: str, chat: bool = True, system: str | None = None):
        """The prompt as the model sees it (template applied when chat), with special-token spans."""
        prompt = as_text("prompt", prompt, MAX_PROMPT_CHARS)
        if not prompt.strip():
            raise ValueError("prompt must not be empty")
        return render_prompt(self.tokenizer, prompt, chat=as_bool("chat", chat),
                             system=as_text("system", system, MAX_SYSTEM_CHARS, optional=True))

    def add_request(self, prompt: str | None = None, params: SamplingParams | None = None, chat: bool = True,
                    system: str | None = None, prompt_ids: list[int] | None = None,
                    speculative: SpeculativeConfig | None = None, owner: str = "") -> int:
        return self._add(self._prepare(prompt, params, chat, system, prompt_ids, speculative, owner))

    def _prepare(self, prompt, params, chat, system, prompt_ids, speculative, owner="") -> tuple:
        """Check a request's arguments (cheap checks first, then tokenizing, then a drafter that may load a
        model) and return what `_add` needs; nothing in the engine changes."""
        params = _own(as_instance("params", params, SamplingParams, optional=True) or SamplingParams())
        chat = as_bool("chat", chat)
        owner = as_text("owner", owner, 128)
        speculative = as_instance("speculative", speculative, SpeculativeConfig, optional=True)
        if speculative is not None:
            speculative.validate()
        if prompt_ids is None:
            rendered = self.encode(prompt, chat=chat, system=system)
            prompt_ids, text = list(rendered.token_ids), rendered.text
        else:
            text = as_text("prompt", prompt, MAX_PROMPT_CHARS, optional=True) or ""
            as_text("system", system, MAX_SYSTEM_CHARS, optional=True)  # unused with prompt_ids, still checked
            prompt_ids = as_token_ids("prompt_ids", prompt_ids, self.spec.vocab_size, self.max_model_len - 1)
        self._check_fits(len(prompt_ids), params)
        self._check_token_params(params)
        if params.grammar is not None:
            self._compile(params.grammar)  # refused now if it cannot work with this tokenizer (then cached)
        drafter = None
        if speculative is not None:
            drafter = spec_mod.make_drafter(self, speculative)  # model-dependent checks: exit layer, tokenizer
        return prompt_ids, text, params, speculative, drafter, owner

    def _add(self, prepared: tuple) -> int:
        prompt_ids, text, params, speculative, drafter, owner = prepared
        with self._writing():
            seq = Sequence(self._new_id(), prompt_ids, params, arrival=self.clock, prompt_text=text, owner=owner)
            if speculative is not None:
                seq.spec = SpecState(speculative, drafter, k=speculative.num_tokens)
                seq.spec_k = self._spec_k(seq)
            self._start(seq)
            self.scheduler.add(seq)
            return seq.seq_id

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> None:
        if prompt_len >= self.max_model_len:
            raise ValueError(f"prompt is {prompt_len} tokens, beyond the model's context of "
                             f"{self.max_model_len} tokens (one position must stay free to generate)")
        longest = min(prompt_len + params.max_tokens, self.max_model_len)
        need, have = self.blocks.blocks_needed(longest), self.blocks.num_blocks
        if need > have:
            raise ValueError(f"kv_memory: this request needs up to {need} KV blocks ({longest} tokens) but the "
                             f"pool holds {have}; lower max_tokens or give the engine more kv_memory")

    def _check_token_params(self, params: SamplingParams) -> None:
        """The params' token ids within this model's vocabulary; bad_words tokenized (cached)."""
        vocab = self.spec.vocab_size
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("allowed_token_ids", params.allowed_token_ids),
                          ("logit_bias", tuple(params.logit_bias))):
            bad = next((t for t in ids or () if t >= vocab), None)
            if bad is not None:
                raise ValueError(f"{name}: token id {bad} is outside this model's vocabulary [0, {vocab})")
        self._bad_words_ids(params.bad_words)

    def _bad_words_ids(self, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Each bad word as token ids, as vLLM forms them: the word, and with a leading space where that is a
        different token sequence of the same length (the word in the middle of a text)."""
        if not words:
            return ()
        hit = self._bad_words.get(words)
        if hit is not None:
            return hit
        out = []
        for word in words:
            plain = tuple(self.tokenizer.encode(word.lstrip(), add_special_tokens=False))
            spaced = tuple(self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
            out += [ids for ids in (plain, spaced if spaced and plain and spaced[0] != plain[0]
                                    and len(spaced) == len(plain) else ()) if ids]
        if len(self._bad_words) >= MAX_BAD_WORDS_CACHE:
            self._bad_words.clear()
        self._bad_words[words] = tuple(out)
        return self._bad_words[words]

    def _stop_ids(self, params: SamplingParams) -> frozenset:
        """Tokens that end a sequence: EOS (unless ignore_eos) and the request's stop_token_ids."""
        return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(self.eos_ids))

    def _bias(self, params: SamplingParams, output_ids: list[int]) -> torch.Tensor | None:
        """The sampling chain's bias stage for the next token after `output_ids` (None: nothing to apply)."""
        if not params.biased:
            return None
        return token_bias(params, output_ids, self.spec.vocab_size, self._stop_ids(params),
                          self._bad_words_ids(params.bad_words))

    def _detokenizer(self, seq: Sequence) -> IncrementalDetokenizer:
        """A fresh detokenizer for seq's params, fed the output it already has (a branch, a rewind)."""
        p = seq.params
        detok = IncrementalDetokenizer(self.tokenizer, seq.prompt_ids, stop=p.stop,
                                       skip_special_tokens=p.skip_special_tokens,
                                       include_stop=p.include_stop_str_in_output, min_tokens=p.min_tokens)
        for t in seq.output_ids:
            detok.push(t)
        return detok

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _start(self, seq: Sequence, matcher: grammar_mod.GrammarMatcher | None = None) -> None:
        seed = seq.params.seed if seq.params.seed is not None else random.randrange(2**63)
        seq.generator = torch.Generator().manual_seed(seed)
        seq.detok = self._detokenizer(seq)  # a branch replays the tokens it inherits
        if seq.params.grammar is not None:
            self._grammars[seq.seq_id] = matcher or self._compile(seq.params.grammar)
        self.sequences[seq.seq_id] = seq

    # ---- constrained decoding ---------------------------------------------------------------------
    def _compile(self, grammar) -> grammar_mod.GrammarMatcher:
        return grammar_mod.compile_grammar(grammar, self.tokenizer, self.spec.vocab_size, self.eos_ids)

    def _grammar_at(self, seq: Sequence, tokens: list[int] | None = None) -> grammar_mod.GrammarMatcher | None:
        """The sequence's matcher, moved to the end of `tokens` (default: its output); None if unconstrained."""
        gm = self._grammars.get(seq.seq_id)
        if gm is not None:
            gm.sync(seq.output_ids if tokens is None else tokens)
        return gm

    def _grammar_mask(self, gm: grammar_mod.GrammarMatcher) -> torch.Tensor:
        mask = gm.allowed()
        self._mask_s += gm.mask_seconds
        return mask

    @contextlib.contextmanager
    def _writing(self):
        """The engine's lock, for a change of state; the published reads are renewed before it is let go."""
        with self._lock:
            try:
                yield
            finally:
                self._republish()

    def _read(self, key: tuple, build: Callable):
        """A public read: the published value when there is one, else built under the lock and published."""
        entry = self._published.get(key)
        if entry is None:
            with self._lock:
                entry = self._published.get(key) or [build(), build, True]
                self._published[key] = entry
        entry[2] = True
        return entry[0]

    def _republish(self) -> None:
        """After a change: rebuild the reads asked for since the one before (the pages showing them will ask
        again, and the room's next step starts at once: built later, they would wait for all of it); drop
        the others, and any that no longer exists (a released sequence)."""
        fresh = {}
        for key, (_, build, used) in self._published.items():
            if used:
                try:
                    fresh[key] = [build(), build, False]
                except ValueError:
                    pass
        self._published = fresh

    def abort(self, seq_id: int) -> None:
        self._get(seq_id)  # checked before waiting for the lock
        with self._writing():
            seq = self._get(seq_id)
            if seq.status is not Status.FINISHED:
                self._finish(seq, "abort")

    def force_token(self, seq_id: int, token_id: int) -> None:
        """Make the next token sampled for this sequence `token_id` (its sampling chain is still shown)."""
        seq = self._get(seq_id)
        token_id = as_int("token_id", token_id, 0, self.spec.vocab_size - 1)
        with self._writing():  # a running step keeps its own draw; the token is forced from the next one
            if seq.status is Status.FINISHED:
                raise ValueError(f"sequence {seq_id} has finished; rewind or branch it first")
            gm = self._grammar_at(seq)
            if gm is not None and not gm.allows(token_id):
                raise ValueError(f"token {token_id} ({self.token_text(token_id)!r}) is not allowed by sequence "
                                 f"{seq_id}'s grammar ({gm.grammar.describe(40)}) at this point; force a token the "
                                 f"grammar allows")
            seq.forced_token = token_id

    @compute.routed
    def rewind(self, seq_id: int, num_output_tokens: int) -> None:
        """Drop generated tokens after the first `num_output_tokens`; their KV slots are released."""
        with self._writing():
            seq = self._get(seq_id)
            num_output_tokens = self._check_position(seq, num_output_tokens)
            seq.output_ids = seq.output_ids[:num_output_tokens]
            seq.forced_token = None
            seq.finish_reason = None
            seq.token_times = seq.token_times[:num_output_tokens]
            seq.detok = self._detokenizer(seq)
            if seq.status is Status.RUNNING:
                seq.num_computed = min(seq.num_computed, seq.num_tokens - 1)
                self.blocks.truncate(seq_id, seq.num_computed)
            elif seq.status is Status.FINISHED:
                seq.status, seq.num_computed = Status.WAITING, 0
                self.scheduler.add(seq)
            if seq.spec is not None:
                seq.spec.drafter.forget(seq_id, keep_tokens=seq.num_tokens - 1)
                seq.spec_k = self._spec_k(seq)
            self._grammar_at(seq)  # rolled back with the output

    @compute.routed
    def branch(self, seq_id: int, num_output_tokens: int, params: SamplingParams | None = None) -> int:
        """A new sequence that shares the first `num_output_tokens` outputs (and their KV blocks)."""
        with self._writing():
            parent = self._get(seq_id)
            num_output_tokens = self._check_position(parent, num_output_tokens)
            params = _own(as_instance("params", params, SamplingParams, optional=True) or parent.params)
            # as for add_request: a branch the pool can never hold would wait forever
            self._check_fits(len(parent.prompt_ids), params)
            matcher = self._branch_matcher(parent, params, num_output_tokens)
            child = Sequence(self._new_id(), list(parent.prompt_ids), params, arrival=self.clock,
                             output_ids=parent.output_ids[:num_output_tokens], prompt_text=parent.prompt_text,
                             parent_id=seq_id, owner=parent.owner)
            if parent.spec is not None:  # the branch speculates the same way, with statistics of its own
                cfg = parent.spec.config
                child.spec = SpecState(cfg, parent.spec.drafter, k=cfg.num_tokens)
                child.spec_k = self._spec_k(child)
            self._start(child, matcher)
            if parent.status is Status.RUNNING and parent.seq_id in self.blocks.block_tables:
                child.num_computed = min(parent.num_computed, child.num_tokens - 1)
                self.blocks.fork(parent.seq_id, child.seq_id, child.num_computed)
                child.status = Status.RUNNING
                self.scheduler.running.append(child)
            else:
                self.scheduler.add(child)
            return child.seq_id

    def _branch_matcher(self, parent: Sequence, params: SamplingParams, n: int) -> grammar_mod.GrammarMatcher | None:
        """The branch's matcher at the end of the n outputs it inherits: a copy of the parent's under the same
        grammar, a new one otherwise; ValueError (nothing changed) if its grammar does not allow those outputs."""
        if params.grammar is None:
            return None
        same = self._grammars.get(parent.seq_id)
        gm = same.fork() if same is not None and same.grammar == params.grammar else self._compile(params.grammar)
        gm.sync(parent.output_ids[:n])
        return gm

    def _check_position(self, seq: Sequence, n: int) -> int:
        """num_output_tokens: a position in the sequence's output, 0 (keep none) .. all of it."""
        return as_int("num_output_tokens", n, 0, len(seq.output_ids))

    def _get(self, seq_id: int) -> Sequence:
        seq_id = as_int("seq_id", seq_id)  # 1.0 or True would otherwise find sequence 1
        if seq_id not in self.sequences:
            raise ValueError(f"seq_id {seq_id!r} is not a sequence of this engine")
        return self.sequences[seq_id]

    def has_unfinished(self, owner: str | None = None) -> bool:
        """Whether any sequence (of `owner`, when given) still waits or runs."""
        if owner is None:
            return self.scheduler.has_work()
        return self._read(("unfinished", owner), lambda: any(
            s.owner == owner for s in (*self.scheduler.waiting, *self.scheduler.running)))

    # ---- the public face of sequences --------------------------------------------------------------------
    def seq_view(self, seq_id: int) -> SeqView:
        return self._read(("view", as_int("seq_id", seq_id)), lambda: self._view(seq_id))

    def _view(self, seq_id: int) -> SeqView:
        seq = self._get(seq_id)
        return SeqView(
            seq_id=seq.seq_id, owner=seq.owner, status=seq.status.value, finish_reason=seq.finish_reason,
            params=copy.copy(seq.params), prompt_ids=tuple(seq.prompt_ids), output_ids=tuple(seq.output_ids),
            prompt_text=seq.prompt_text, num_computed=seq.num_computed,
            num_blocks=len(self.blocks.block_tables.get(seq.seq_id, ())), preemptions=seq.preemptions,
            parent_id=seq.parent_id, speculative=seq.spec is not None, has_sampled=seq.last_sampling is not None,
            forced_token=seq.forced_token)

    def seq_ids(self, owner: str | None = None) -> list[int]:
        """Every sequence the engine keeps (of `owner`, when given), finished ones included, oldest first."""
        return list(self._read(("ids", owner), lambda: tuple(
            sid for sid, s in self.sequences.items() if owner is None or s.owner == owner)))

    def queue_position(self, seq_id: int) -> int | None:
        """How many waiting requests would be admitted before this one (None: it is not waiting)."""
        def position():
            seq = self._get(seq_id)
            order = self.scheduler.admission_order()
            return order.index(seq) if seq in order else None
        return self._read(("queue", as_int("seq_id", seq_id)), position)

    @compute.routed
    def set_params(self, seq_id: int, params: SamplingParams) -> None:
        """New sampling parameters for an unfinished sequence, from its next sampled token on: a new seed
        reseeds its generator, new stop strings are looked for in its whole output (as in `rewind`, the
        detokenizer replays it), and max_tokens must leave room for at least one more token."""
        params = _own(as_instance("params", params, SamplingParams))
        with self._writing():
            seq = self._get(seq_id)
            if seq.status is Status.FINISHED:
                raise ValueError(f"sequence {seq_id} has finished; its parameters can no longer change")
            if params.max_tokens <= len(seq.output_ids):
                raise ValueError(f"max_tokens must be above the {len(seq.output_ids)} tokens sequence {seq_id} has "
                                 f"already generated (got {params.max_tokens})")
            self._check_fits(len(seq.prompt_ids), params)
            self._check_token_params(params)
            matcher = None
            if params.grammar is not None and params.grammar != seq.params.grammar:
                matcher = self._compile(params.grammar)
                matcher.sync(seq.output_ids)  # the output so far must fit the new grammar
            old, seq.params = seq.params, params
            if params.grammar != old.grammar:
                self._grammars.pop(seq_id, None)
                if matcher is not None:
                    self._grammars[seq_id] = matcher
                if matcher is not None and seq.forced_token is not None and not matcher.allows(seq.forced_token):
                    seq.forced_token = None  # forced under the old grammar, forbidden by the new one
            if params.seed is not None and params.seed != old.seed:
                seq.generator.manual_seed(params.seed)
            text_rules = ("stop", "skip_special_tokens", "include_stop_str_in_output", "min_tokens")
            if any(getattr(params, k) != getattr(old, k) for k in text_rules):
                seq.detok = self._detokenizer(seq)
                if seq.detok.stop is not None:  # the new stop strings are looked for in the whole output
                    self._finish(seq, "stop")

    def release(self, seq_ids: Iterable[int]) -> None:
        """Abort these sequences if they still run and forget them: their blocks go back to the pool (prefix
        blocks stay cached) and nothing of them is kept. An engine serving a room calls this when a tab closes."""
        ids = [as_int("seq_id", sid) for sid in seq_ids]
        with self._writing():
            for sid in ids:
                seq = self.sequences.get(sid)
                if seq is None:
                    continue
                if seq.status is not Status.FINISHED:
                    self._finish(seq, "abort")
                del self.sequences[sid]
                self._grammars.pop(sid, None)
                self._last_masks.pop(sid, None)

    @compute.routed
    def what_if(self, seq_id: int, params: SamplingParams, top_n: int = 20) -> SamplingTrace:
        """Recompute the last step's sampling chain of `seq_id` with other parameters, no model rerun.

        Uses the logits and the random draw u of that step, so only the parameters differ.
        """
        as_instance("params", params, SamplingParams).validate()
        top_n = as_int("top_n", top_n, 0, MAX_TOP_N)
        seq = self._get(seq_id)
        cached = seq.last_sampling
        if cached is None and seq.spec is not None and seq.spec.proposed:
            raise ValueError(f"sequence {seq_id}'s last step was a speculative round: its tokens came from verifying "
                             "drafts, not from one sampling chain, so there is nothing to recompute")
        if cached is None:
            raise ValueError(f"sequence {seq_id} has not sampled a token in a traced step yet")
        logits, prompt_ids, output_ids, u = cached
        # the step's own mask: a slider changes the chain after it, never what the grammar allowed
        mask_of = self._last_masks.get(seq.seq_id)
        step = mask_of[2] if mask_of is not None and mask_of[0] is cached else None
        self._check_token_params(params)
        trace = trace_chain(logits, params, prompt_ids, output_ids, u, top_n=top_n,
                            mask=None if step is None else mask_of[1], bias=self._bias(params, output_ids))
        trace.token_texts = [self.token_text(t) for t in trace.token_ids]
        trace.grammar = step
        return trace

    def last_logits(self, seq_id: int) -> torch.Tensor:
        """A copy of the raw logits (before penalties and temperature) that `seq_id`'s last traced step sampled
        its token from: the whole next-token distribution, for comparisons of two models' distributions
        (engine/formats_compare.py). The sampling trace keeps only the top tokens."""
        seq = self._get(seq_id)
        cached = seq.last_sampling
        if cached is None:
            raise ValueError(f"sequence {seq_id}'s last step did not sample a token in a traced step")
        return cached[0].detach().float().clone()

    @compute.routed
    def nearest_tokens(self, token_id: int, k: int = 10) -> list[tuple[int, str, float]]:
        """The k vocabulary entries whose input embeddings are closest (cosine) to `token_id`'s."""
        token_id = as_int("token_id", token_id, 0, self.spec.vocab_size - 1)
        k = as_int("k", k, 1, min(MAX_NEAREST_K, self.spec.vocab_size - 1))
        # a pass over the whole vocabulary, asked for again on every step the lab shows the same token: cached
        # (the weights never change; the dict is bounded)
        hit = self._nearest_cache.get((token_id, k))
        if hit is not None:
            return list(hit)
        emb = self.model.embed
        if self._embed_norms is None:
            self._embed_norms = emb.float().norm(dim=-1).clamp_min(1e-12)
        head = self.model.head
        w = head.prefill.weight  # a oneDNN-packed weight has no storage to compare (q4's head prefill may be one)
        if w.layout == torch.strided and w.data_ptr() == emb.data_ptr():
            # tied float32 embeddings: the LM head's kernel computes these dot products (~2x faster on CPU
            # than a plain matrix-vector product; one runs after every step the lab shows)
            dots = head(emb[token_id][None], prefer_decode=True)[0].float()
        else:
            dots = emb.float() @ emb[token_id].float()
        cos = dots / (self._embed_norms * self._embed_norms[token_id])
        top = cos.topk(k + 1)
        out = [(int(i), self.token_text(int(i)), float(c)) for c, i in zip(top.values, top.indices)
               if int(i) != token_id][:k]
        if len(self._nearest_cache) >= 1024:
            self._nearest_cache.clear()
        self._nearest_cache[(token_id, k)] = tuple(out)
        return out

    def token_text(self, token_id: int) -> str:
        if type(token_id) is not int or not 0 <= token_id < self.spec.vocab_size:  # hot path: plain ints pass
            token_id = as_int("token_id", token_id, 0, self.spec.vocab_size - 1)
        return token_bytes(self.tokenizer, token_id).decode("utf-8", errors="replace")

    # ---- the step ---------------------------------------------------------------------------------
    def step(self, trace: bool = True, owners: Iterable[str] | None = None) -> StepEvent:
        """One scheduler step. `trace` keeps the sampling chain of every sampled token in the event.
        `owners`: only these owners' sequences take part (None: everyone's); the others are held.

        Atomic: if anything in it raises, the engine is put back exactly as before the step and StepFailed
        (chaining the cause) says so."""
        if owners is not None:
            owners = frozenset(as_text("owner", o, 128) for o in owners)
        return self._locked_step(as_bool("trace", trace), self.instrument, owners)

    @compute.routed
    def _locked_step(self, trace: bool, capture: Capture | None, owners: frozenset | None = None,
                     full: bool = True) -> StepEvent | list[SeqEvent]:
        # tensor work runs on the one compute thread (engine/compute.py), and the engine's lock is taken there
        # too: a caller holding it while waiting for the compute thread could deadlock with a routed rewind
        with self._writing():
            ck = self._checkpoint()
            try:
                event = self._step(trace=trace, capture=capture, owners=owners, full=full)
            except BaseException as exc:
                self._restore(ck)
                if not isinstance(exc, Exception):  # KeyboardInterrupt and the like: undone, and passed on as is
                    raise
                raise StepFailed(f"step {self.step_index} failed and was undone (nothing changed): "
                                 f"{type(exc).__name__}: {exc}") from exc
            self._commit()
            return event

    # A failed step must not leave a sequence half-advanced (its computed-token count moved past K/V that its
    # sampling never used, say): every later step would then fail too. So each step starts with a checkpoint
    # of all the state it can change and a failure restores it. Copies are cheap (tens of microseconds for a
    # few hundred blocks and sequences); KV data needs no copy except for blocks whose contents were live at
    # the checkpoint and are handed out again within the step (see BlockManager), and prefix hashes of the
    # step's blocks are registered near its end, inside the checkpoint as well.
    def _checkpoint(self) -> tuple:
        drafters = [(d, d.checkpoint()) for d in self._drafters.values()]
        return (self.blocks.checkpoint(), self.scheduler.checkpoint(), drafters, self.step_index, self.clock)

    def _restore(self, ck: tuple) -> None:
        blocks, sched, drafters, self.step_index, self.clock = ck
        self.blocks.restore(blocks)
        self.scheduler.restore(sched)
        for d, state in drafters:
            d.restore(state)

    def _commit(self) -> None:
        self.blocks.commit()
        for d in self._drafters.values():
            d.commit()

    # The step, phase by phase (nano-vllm's LLMEngine.step / ModelRunner.run): plan who runs, build the batch,
    # one forward, sample or verify, settle the blocks, describe the step. `_StepWork` carries what one phase
    # hands the next; the timestamps taken here between phases are the event's timing.
    def _step(self, trace: bool, capture: Capture | None, owners: frozenset | None = None,
              full: bool = True) -> StepEvent | list[SeqEvent]:
        w = _StepWork(trace=trace, capture=capture, t0=time.perf_counter())
        self._mask_s = 0.0
        self._schedule(w, owners)
        w.t_sched = time.perf_counter()
        # speculative sequences draft first: their drafts ride along in this step's one forward
        w.drafts = self._draft_all(w.plan)
        w.t_draft = time.perf_counter()
        self._build_inputs(w)
        w.t_forward = time.perf_counter()
        self._forward(w)
        w.t_sample = time.perf_counter()
        with governor.one_thread():  # small vector ops: waking a second thread costs more than it saves
            self._sample_or_verify(w)
        self._settle_blocks(w)
        w.t_end = time.perf_counter()
        return self._make_event(w, full)

    def _schedule(self, w: _StepWork, owners: frozenset | None) -> None:
        """The scheduler's plan (only `owners`' sequences, when given: the rest are held)."""
        out = self.scheduler.schedule(None if owners is None else (lambda seq: seq.owner in owners))
        w.plan, w.preempted = out.scheduled, out.preempted
        # a preempted sequence is recomputed from scratch later: its drafter's state for it is stale
        for sid in out.preempted:
            self._spec_forget(self.sequences[sid])

    def _build_inputs(self, w: _StepWork) -> None:
        """One SeqInput (tokens, positions, KV slots) and one SeqEvent per scheduled sequence."""
        for i, item in enumerate(w.plan):
            seq = item.seq
            start = seq.num_computed
            ids = seq.token_ids[start : start + item.num_new]
            extra = w.drafts[i].tokens if i in w.drafts else []
            table = self.blocks.block_tables[seq.seq_id]
            slots = _slots(table, self.block_size, start + item.num_new + len(extra))
            # verification needs the logits of every row: the pending token's and each draft's; a request for
            # prompt log-probabilities every row of a chunk that holds prompt positions not yet reported
            rows = 1 + len(extra) if item.samples else 0
            if self._wants_prompt_rows(seq, start):
                rows = item.num_new
            w.inputs.append(SeqInput(ids + extra, start, slots, logits_rows=rows))
            decode = item.num_new == 1 and bool(seq.output_ids) and start == seq.num_tokens - 1
            w.seq_events.append(SeqEvent(
                seq_id=seq.seq_id, phase="decode" if decode else "prefill", chunk_start=start,
                num_processed=item.num_new + len(extra), processed_ids=list(ids + extra),
                num_cached_tokens=seq.num_cached_tokens if item.admitted else 0,
                prompt_len=len(seq.prompt_ids), num_tokens=seq.num_tokens))

    @staticmethod
    def _wants_prompt_rows(seq: Sequence, start: int) -> bool:
        return (seq.params.prompt_logprobs is not None and seq.prompt_logprobs_done < len(seq.prompt_ids)
                and start < len(seq.prompt_ids))

    def _prompt_logprobs(self, seq: Sequence, start: int, logits: torch.Tensor) -> list[PromptLogprob]:
        """The prompt positions this chunk's rows predict (row r: position start + r + 1), not reported before:
        each prompt token's log-probability under the raw logits, its rank (1: the most likely) and the
        prompt_logprobs most likely tokens. Position 0 has no prediction (logprob None), as in vLLM."""
        k, n_prompt = seq.params.prompt_logprobs, len(seq.prompt_ids)
        out = []
        if start == 0 and seq.prompt_logprobs_done == 0:
            out.append(PromptLogprob(position=0, token_id=seq.prompt_ids[0], logprob=None, rank=None))
        first = max(start + 1, seq.prompt_logprobs_done, 1)
        last = min(start + logits.shape[0], n_prompt - 1)
        if first <= last:
            logp = torch.log_softmax(logits[first - 1 - start : last - start].float(), dim=-1)
            tokens = torch.tensor(seq.prompt_ids[first : last + 1], dtype=torch.long)
            own = logp.gather(1, tokens[:, None])[:, 0]
            ranks = (logp > own[:, None]).sum(1) + 1
            top = logp.topk(k, dim=-1) if k else None
            for j, p in enumerate(range(first, last + 1)):
                out.append(PromptLogprob(
                    position=p, token_id=seq.prompt_ids[p], logprob=float(own[j]), rank=int(ranks[j]),
                    top_ids=[] if top is None else top.indices[j].tolist(),
                    top_logprobs=[] if top is None else top.values[j].tolist()))
        seq.prompt_logprobs_done = max(seq.prompt_logprobs_done, last + 1, 1)
        return out

    def _forward(self, w: _StepWork) -> None:
        """The model's one forward over the whole batch (none for an idle step); captures only for the
        sequences in capture_seq_ids (None: all of them)."""
        if not w.inputs:
            return
        want = None
        if w.capture is not None and self.capture_seq_ids is not None:
            want = {i for i, item in enumerate(w.plan) if item.seq.seq_id in self.capture_seq_ids}
        w.logits, w.caps = self.model.forward(w.inputs, self.kv, w.capture, want, gil_free_hook=self.forward_hook)

    def _sample_or_verify(self, w: _StepWork) -> None:
        """Sample the next token of each sequence whose chunk reached its end, or verify its drafts. Finishing
        waits until the blocks are settled (`_settle_blocks`): a finished sequence's blocks are freed."""
        forward_s = w.t_sample - w.t_forward
        row = 0
        for i, (item, ev) in enumerate(zip(w.plan, w.seq_events)):
            seq = item.seq
            samples = item.samples  # decided before num_computed moves
            rows = w.inputs[i].logits_rows
            if samples and seq.spec is not None:
                seq.spec.target_passes += 1
            draft = w.drafts.get(i)
            if rows and self._wants_prompt_rows(seq, seq.num_computed):
                ev.prompt_logprobs = self._prompt_logprobs(seq, seq.num_computed, w.logits[row : row + rows])
            if draft is not None and draft.tokens:
                w.reasons[i], w.counts[i] = self._verify_round(seq, item, w.logits[row : row + rows], draft, ev,
                                                               w.trace, forward_s)
            else:
                seq.num_computed += item.num_new
                if samples:  # the chunk's last row (a chunk reporting prompt log-probabilities has one per token)
                    ts = time.perf_counter()
                    w.reasons[i], w.counts[i] = self._sample(seq, w.logits[row + rows - 1], ev, w.trace), 1
                    if seq.spec is not None and ev.phase == "decode":  # a round without drafts
                        self._record_round(seq, item, draft or Draft([], None), None, 1, ev, w.trace,
                                           forward_s + time.perf_counter() - ts)
            row += rows
            if i in w.caps:
                ev.capture = self._capture_data(w.caps[i], w.inputs[i], w.capture)

    def _settle_blocks(self, w: _StepWork) -> None:
        """Blocks after sampling: draft slots given back, computed blocks registered, finished sequences freed."""
        # 1. give back the slots reserved for drafts, in reverse order of taking: the free list ends up exactly
        #    as a plain run leaves it
        for i in sorted(w.drafts, reverse=True):
            seq = w.plan[i].seq
            released = self.blocks.rollback(seq.seq_id, seq.num_computed)
            if w.seq_events[i].spec is not None:
                w.seq_events[i].spec.rollback.blocks = released
        # 2. register computed blocks (kept tokens only), then finish. Whether a sequence sampled is read from
        #    w.reasons (filled by every sampling path), never from item.samples: that property compares
        #    num_computed with the length, and both moved in this step (a prefill that finished on its first
        #    token would read False and never be marked finished in its own SeqEvent).
        for i, (item, ev) in enumerate(zip(w.plan, w.seq_events)):
            seq = item.seq
            self.blocks.mark_computed(seq.seq_id, seq.token_ids[: seq.num_computed])
            if w.reasons.get(i) is not None:
                self._finish(seq, w.reasons[i])
                w.finished.append(seq.seq_id)
            if i in w.reasons:
                ev.finished, ev.finish_reason = seq.status is Status.FINISHED, seq.finish_reason
        # 3. the next round's k, within what max_tokens and the context now leave
        for seq in self.scheduler.running:
            if seq.spec is not None:
                seq.spec_k = self._spec_k(seq)

    def _make_event(self, w: _StepWork, full: bool = True) -> StepEvent | list[SeqEvent]:
        """Advance the engine clock by the step's duration, time-stamp the tokens emitted, build the event; with
        full=False only its sequences' events (generate and stream read nothing else: the pool's states, the
        cost model and the room's lists were ~0.1 ms of a ~4 ms q4 step)."""
        step_s = w.t_end - w.t0
        self.clock += step_s
        for i, ev in enumerate(w.seq_events):
            seq = self.sequences[ev.seq_id]
            if ev.new_token is not None:
                self._stamp_time(seq, ev, w.counts.get(i, 1))
            ev.block_table = list(self.blocks.block_tables.get(ev.seq_id, []))
            ev.num_tokens = seq.num_tokens
        if not full:
            self.step_index += 1
            return w.seq_events
        event = self._event(w.seq_events, w.plan, w.preempted, w.finished, w.inputs,
                            metrics.StepTiming(schedule_ms=(w.t_sched - w.t0) * 1e3,
                                               draft_ms=(w.t_draft - w.t_sched) * 1e3,
                                               forward_ms=(w.t_sample - w.t_forward) * 1e3,
                                               sample_ms=(w.t_end - w.t_sample) * 1e3,
                                               step_ms=step_s * 1e3, engine_clock_s=self.clock,
                                               grammar_ms=self._mask_s * 1e3))
        self.step_index += 1
        return event

    def _sample(self, seq: Sequence, logits: torch.Tensor, ev: SeqEvent, trace: bool) -> str | None:
        """Draw the next token through the sampling chain; returns the finish reason if this token ends it."""
        prompt_ids, output_ids = seq.prompt_ids, list(seq.output_ids)
        gm = self._grammar_at(seq)
        mask = None if gm is None else self._grammar_mask(gm)
        bias = self._bias(seq.params, output_ids)
        # checked: the sequence's params are the engine's own validated copy (`_own`), its ids the engine's
        token, tr = sample(logits, seq.params, prompt_ids, output_ids, seq.generator, trace=trace, mask=mask,
                           bias=bias, checked=True)
        if tr is not None:
            tr.token_texts = [self.token_text(t) for t in tr.token_ids]
            seq.last_sampling = (logits.clone(), prompt_ids, output_ids, tr.u)
            ev.sampling = tr
            if gm is not None:
                tr.grammar = grammar_mod.GrammarStep(
                    kind=gm.grammar.kind, description=gm.grammar.describe(), allowed=int(mask.sum()),
                    mask_ms=gm.mask_seconds * 1e3, accepting=gm.accepting)
                self._last_masks[seq.seq_id] = (seq.last_sampling, mask, tr.grammar)
        if seq.forced_token is not None:
            if mask is not None and not bool(mask[seq.forced_token]):  # force_token checked it; kept honest here
                raise ValueError(f"forced token {seq.forced_token} is not allowed by the grammar here")
            token, ev.forced, seq.forced_token = seq.forced_token, True, None
        ev.new_token, ev.new_token_text = token, self.token_text(token)
        if tr is not None:  # the model's own log-probability of the token kept (perplexity)
            ev.logit_stats = _logit_stats(logits, token)
        return self._emit(seq, token, ev)

    def _emit(self, seq: Sequence, token: int, ev: SeqEvent) -> str | None:
        """Append one generated token and feed the detokenizer; returns why the sequence ends here, if it does."""
        seq.output_ids.append(token)
        gm = self._grammar_at(seq)  # the token was drawn under the mask (or checked when forced): it fits
        p = seq.params
        # as vLLM: nothing stops a sequence before min_tokens; a stop token's text (EOS, stop_token_ids) is left
        # out unless include_stop_str_in_output
        # (no set built here: this runs for every token of every sequence)
        stop_token = len(seq.output_ids) >= p.min_tokens and (
            (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids)
        step = seq.detok.push(token, silent=stop_token and not p.include_stop_str_in_output)
        ev.detok = step
        ev.emitted += step.emitted
        if stop_token:
            ev.emitted += seq.detok.finish()
            return "stop" if token in p.stop_token_ids else "eos"
        if step.stop is not None:
            return "stop"
        if gm is not None and gm.done:  # a complete match that nothing may extend: no step for EOS
            ev.emitted += seq.detok.finish()
            return "grammar"
        if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            ev.emitted += seq.detok.finish()
            return "length"
        return None

    # ---- speculative rounds -------------------------------------------------------------------------
    def _spec_k(self, seq: Sequence) -> int:
        """Drafts the next round may verify: the drafter's k, within max_tokens and the model's context."""
        return max(0, min(seq.spec.k, seq.params.max_tokens - len(seq.output_ids) - 1,
                          self.max_model_len - seq.num_tokens - 1))

    def _spec_forget(self, seq: Sequence) -> None:
        if seq.spec is not None:
            seq.spec.drafter.forget(seq.seq_id)

    def _draft_all(self, plan: list[ScheduledSeq]) -> dict[int, Draft]:
        """Drafts of every speculating sequence; sequences sharing a drafter draft in one batched forward."""
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(plan):
            if item.num_lookahead:
                groups.setdefault(id(item.seq.spec.drafter), []).append(i)
        drafts = {}
        for idxs in groups.values():
            t = time.perf_counter()
            reqs = []
            for i in idxs:
                seq, k = plan[i].seq, plan[i].num_lookahead
                slots = _slots(self.blocks.block_tables[seq.seq_id], self.block_size, seq.num_tokens + k)
                reqs.append(DraftRequest(seq.token_ids, len(seq.prompt_ids), seq.params, seq.generator, k, slots,
                                         seq.seq_id))
            out = plan[idxs[0]].seq.spec.drafter.propose_many(reqs)
            seconds = time.perf_counter() - t  # each sequence waited for the whole batch
            for i, d in zip(idxs, out):
                d.seconds = seconds
                drafts[i] = d
        return drafts

    def _verify_round(self, seq: Sequence, item: ScheduledSeq, logits: torch.Tensor, draft: Draft, ev: SeqEvent,
                      trace: bool, forward_s: float) -> tuple[str | None, int]:
        """Accept/reject the drafts against the target's rows and emit what is kept; returns (finish reason, count)."""
        t = time.perf_counter()
        params, prompt, before = seq.params, seq.prompt_ids, list(seq.output_ids)
        num_before = seq.num_tokens

        def p_row(i: int) -> torch.Tensor:
            # the target's distribution at draft position i, penalised (and masked by the grammar) as if drafts
            # 1..i had been accepted: they were, or the walk would have stopped before asking for row i. A draft
            # the grammar forbids has p = 0 there and is rejected; the residual and the bonus are masked too.
            gm = self._grammar_at(seq, before + draft.tokens[:i])
            mask = None if gm is None else self._grammar_mask(gm)
            return sampling_probs(logits[i], params, prompt, before + draft.tokens[:i], mask=mask,
                                  bias=self._bias(params, before + draft.tokens[:i]))

        v = spec_mod.verify(draft.tokens, draft.q, p_row, seq.generator)
        reason, kept, detok = None, 0, []
        for token in v.tokens:  # a stop string, EOS or max_tokens inside the round cuts the round there
            kept += 1
            reason = self._emit(seq, token, ev)
            detok.append(ev.detok)  # _emit keeps only the latest in ev.detok
            if reason is not None:
                break
        # K/V stay valid for the pending token and the drafts kept; the other rows are rolled back
        seq.num_computed = num_before + kept - 1
        seq.last_sampling = None  # no single sampling chain produced these tokens: nothing to replay
        last = seq.output_ids[-1]
        ev.new_token, ev.new_token_text = last, self.token_text(last)
        if trace:
            ev.logit_stats = _logit_stats(logits[kept - 1], last)
        seq.spec.drafter.after_round(seq.seq_id, num_before, kept - 1, draft)
        self._record_round(seq, item, draft, v, kept, ev, trace, forward_s + time.perf_counter() - t, detok)
        return reason, kept

    def _record_round(self, seq: Sequence, item: ScheduledSeq, draft: Draft, v: Verification | None, kept: int,
                      ev: SeqEvent, trace: bool, verify_s: float, detok: list | None = None) -> None:
        """Update the sequence's statistics and adaptive k; describe the round in ev.spec. `detok`: each emitted
        token's detokenizer step (a round without drafts emitted one: ev.detok)."""
        st = seq.spec
        st.record(draft, v, kept, verify_s)
        entries = []
        for i, x in enumerate(draft.tokens):
            c = v.checks[i] if v is not None and i < len(v.checks) else None
            q_x = c.q if c is not None else (1.0 if draft.q is None else float(draft.q[i, x]))
            entries.append(RoundDraft(
                position=i + 1, token=x, text=self.token_text(x), q=q_x, p=None if c is None else c.p,
                ratio=None if c is None or not math.isfinite(c.ratio) else c.ratio, u=None if c is None else c.u,
                verdict="unchecked" if c is None else ("accepted" if c.accepted else "rejected")))
        emitted = seq.output_ids[len(seq.output_ids) - kept:]
        if v is not None:
            final = RoundFinal(position=v.num_accepted + 1, token=v.final_token, text=self.token_text(v.final_token),
                               kind=v.final_kind, prob=v.final_prob, u=v.final_u, kept=kept == v.num_accepted + 1)
        else:
            sampling = ev.sampling
            final = RoundFinal(position=1, token=ev.new_token, text=ev.new_token_text,
                               kind="forced" if ev.forced else "sampled",
                               prob=None if sampling is None else sampling.chosen_prob,
                               u=None if sampling is None else sampling.u, kept=True)
        residual = None
        if v is not None and v.residual is not None:
            j = v.num_accepted
            q_j = self._q_row(draft, j)
            p_j = v.p_rows[j]
            ids = spec_mod.top_union([v.residual, p_j, q_j], [draft.tokens[j], v.final_token])
            idx = torch.tensor(ids, dtype=torch.long)
            residual = RoundResidual(position=j + 1, token_ids=ids, texts=[self.token_text(t) for t in ids],
                                     p=p_j[idx].tolist(), q=q_j[idx].tolist(), residual=v.residual[idx].tolist(),
                                     mass=v.residual_mass, drawn=v.final_token)
        dists = None
        if trace and v is not None:
            dists = []
            for i, p_i in enumerate(v.p_rows):
                x = draft.tokens[i] if i < len(draft.tokens) else None
                q_i = None if x is None else self._q_row(draft, i)
                ids = spec_mod.top_union([p_i, q_i], [] if x is None else [x])
                idx = torch.tensor(ids, dtype=torch.long)
                dists.append(RoundDist(position=i + 1, draft=x, token_ids=ids, texts=[self.token_text(t) for t in ids],
                                       p=p_i[idx].tolist(), q=None if q_i is None else q_i[idx].tolist()))
        adaptive = None
        if st.config.adaptive:
            st.k = st.next_k()
            adaptive = AdaptiveK(alpha_recent=st.recent_alpha(), cost_ratio=st.cost_ratio, k_next=st.k)
        written = len(draft.tokens) + 1  # rows the verify pass wrote: the pending token and every draft
        ev.spec = SpecRound(
            method=st.config.method, k=item.num_lookahead, k_config=st.config.num_tokens,
            num_drafted=len(draft.tokens), num_accepted=0 if v is None else v.num_accepted,
            num_emitted=kept, emitted_ids=list(emitted), emitted_texts=[self.token_text(t) for t in emitted],
            truncated=v is not None and kept < len(v.tokens),
            draft=entries, final=final, residual=residual, dists=dists,
            rollback=RoundRollback(reserved_slots=item.num_lookahead, slots=written - kept, blocks=[]),
            draft_ms=draft.seconds * 1e3, verify_ms=verify_s * 1e3,
            drafter={**st.drafter.describe(), **draft.info}, adaptive=adaptive,
            stats=st.stats(len(seq.output_ids)), detok=list(detok) if detok is not None else [ev.detok])

    def _q_row(self, draft: Draft, i: int) -> torch.Tensor:
        """The draft distribution at position i (one-hot for a point-mass drafter)."""
        if draft.q is not None:
            return draft.q[i]
        return spec_mod.one_hot_rows([draft.tokens[i]], self.spec.vocab_size)[0]

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status, seq.finish_reason = Status.FINISHED, reason
        self.scheduler.remove(seq)
        self._spec_forget(seq)

    def _stamp_time(self, seq: Sequence, ev: SeqEvent, count: int = 1) -> None:
        """Time-stamp the `count` tokens this step emitted for seq (a speculative round emits several)."""
        now = self.clock
        if seq.first_token_time is None:
            seq.first_token_time = now
            ev.ttft_s = now - seq.arrival
        elif seq.last_token_time is not None:
            ev.itl_s = now - seq.last_token_time
        seq.last_token_time = now
        seq.token_times.extend([now] * count)

    def _capture_data(self, cap, inp: SeqInput, capture: Capture) -> CaptureData:
        lens_tokens = None
        if cap.lens_ids is not None:
            lens_tokens = [[[self.token_text(t) for t in pos] for pos in layer] for layer in cap.lens_ids.tolist()]
        return CaptureData(
            positions=list(range(inp.start_pos, inp.start_pos + len(inp.token_ids))),
            attention=cap.attention, attention_heads=capture.attention_heads,
            attention_positions=cap.attention_positions, attention_budget=capture.max_attention_bytes,
            lens_positions=cap.lens_positions, lens_ids=cap.lens_ids, lens_tokens=lens_tokens,
            lens_probs=cap.lens_probs, residual_norms=cap.residual_norms, embeddings=cap.embeddings)

    def _event(self, seq_events, plan, preempted, finished, inputs, timing) -> StepEvent:
        m = self.model
        cost = metrics.step_cost(
            m.weight_bytes_per_step if inputs else 0, m.params_per_token, m.head.numel, self.kv_bytes_per_token,
            [(s.start_pos, len(s.token_ids), s.logits_rows) for s in inputs],
            self.spec.num_layers, self.spec.num_heads, self.spec.head_dim)
        named = {*self.blocks.block_tables, *(s.seq_id for s in self.scheduler.waiting), *(e.seq_id for e in seq_events),
                 *preempted, *finished}
        owners = {sid: self.sequences[sid].owner for sid in sorted(named) if sid in self.sequences}
        # the kind of a sequence's grammar ("json_schema", ...; "" when unconstrained) is in the brief too: the
        # room view says which of an API client's sequences are structured outputs without showing their text
        batch = [{"seq_id": e.seq_id, "owner": owners.get(e.seq_id, ""), "phase": e.phase,
                  "num_processed": e.num_processed, "num_drafted": 0 if e.spec is None else e.spec.num_drafted,
                  "num_emitted": (1 if e.new_token is not None else 0) if e.spec is None else e.spec.num_emitted,
                  "grammar": self._grammar_kind(e.seq_id)}
                 for e in seq_events]
        return StepEvent(
            step=self.step_index, seqs=seq_events, owners=owners, batch=batch,
            admitted=[p.seq.seq_id for p in plan if p.admitted], preempted=list(preempted), finished=finished,
            waiting=[s.seq_id for s in self.scheduler.waiting], running=[s.seq_id for s in self.scheduler.running],
            kv=self.kv_stats(), blocks=self.blocks.block_states(),
            block_tables={k: list(v) for k, v in self.blocks.block_tables.items()},
            timing=timing, cost=cost, model={"id": self.model_id, "device": self.device})

    def _grammar_kind(self, seq_id: int) -> str:
        g = self.sequences[seq_id].params.grammar if seq_id in self.sequences else None
        return "" if g is None else g.kind

    def kv_block_states(self) -> list[dict]:
        """Every block of the pool: id, refcount, state (used/cached/free), hashed, the sequences holding it."""
        return self._read(("blocks",), self.blocks.block_states)  # shared by every reader: do not modify

    def seq_owners(self) -> dict[int, str]:
        """seq id -> owner, for every sequence the engine keeps."""
        return dict(self._read(("owners",), lambda: {sid: s.owner for sid, s in self.sequences.items()}))

    def kv_stats(self) -> KVStats:
        stats = self.blocks.stats()
        bpt = self.kv_bytes_per_token
        block_bytes = bpt * self.block_size
        live = [self.sequences[s.seq_id] for s in self.scheduler.running]
        held_tokens = sum(len(self.blocks.block_tables.get(s.seq_id, ())) for s in live) * self.block_size
        used_tokens = sum(s.num_tokens for s in live)
        naive_tokens = sum(min(s.max_len, self.max_model_len) for s in live)
        return KVStats(
            **stats, bytes_per_token=bpt, block_bytes=block_bytes, pool_bytes=self.kv.nbytes,
            used_bytes=stats["used"] * block_bytes, cached_bytes=stats["cached"] * block_bytes,
            free_bytes=stats["free"] * block_bytes,
            paged_waste_tokens=held_tokens - used_tokens, naive_reserved_tokens=naive_tokens,
            naive_waste_tokens=naive_tokens - used_tokens, preemptions=self.scheduler.num_preemptions,
            formula=KVFormula(layers=self.spec.num_layers, kv_heads=self.spec.num_kv_heads,
                              head_dim=self.spec.head_dim, bytes_per_elem=self.model.element_size))

    # ---- convenience loops ----------------------------------------------------------------------
    def generate(self, prompt: str, params: SamplingParams | None = None, chat: bool = True,
                 system: str | None = None, speculative: SpeculativeConfig | None = None) -> GenerationResult:
        rid = self.add_request(prompt, params, chat=chat, system=system, speculative=speculative)
        for _ in self._drive(rid):
            pass
        return self.result(rid)

    def stream(self, prompt: str, params: SamplingParams | None = None, chat: bool = True,
               system: str | None = None, speculative: SpeculativeConfig | None = None) -> Iterator[str]:
        # checked now, not at the first next(): a generator function would defer every refusal
        prepared = self._prepare(prompt, params, chat, system, None, speculative)
        return self._stream(prepared)

    def _stream(self, prepared: tuple) -> Iterator[str]:
        rid = self._add(prepared)  # at the first next(): a stream never iterated leaves no request behind
        for ev in self._drive(rid):
            if ev.emitted:
                yield ev.emitted

    def _drive(self, rid: int) -> Iterator[SeqEvent]:
        seq = self.sequences[rid]
        try:
            while seq.status is not Status.FINISHED:
                yield from self._steps_for(rid)
        finally:
            if seq.status is not Status.FINISHED:  # the caller stopped iterating: free the KV
                self.abort(rid)

    @compute.routed
    def _steps_for(self, rid: int, slice_s: float = DRIVE_SLICE_S) -> list[SeqEvent]:
        """Steps (each atomic, as `step`) until sequence `rid` finishes or `slice_s` has passed; its events. One
        hand-over to the compute thread per slice, not per step: a hand-over costs ~80 us here, 2 % of a q4 step,
        and a slice this short still lets other sessions' work in between and a stream's reader keep pace."""
        seq, events = self.sequences[rid], []
        end = time.perf_counter() + slice_s
        while seq.status is not Status.FINISHED:
            events += [ev for ev in self._locked_step(False, None, full=False) if ev.seq_id == rid]
            if time.perf_counter() >= end:
                break
        return events

    def result(self, seq_id: int) -> GenerationResult:
        seq = self._get(seq_id)
        n = len(seq.output_ids)
        tpot = None
        if n > 1 and seq.first_token_time is not None:
            tpot = (seq.last_token_time - seq.first_token_time) / (n - 1)
        return GenerationResult(
            seq_id=seq_id, prompt_token_ids=list(seq.prompt_ids), token_ids=list(seq.output_ids),
            text=seq.detok.text, finish_reason=seq.finish_reason, num_cached_tokens=seq.num_cached_tokens,
            ttft_s=None if seq.first_token_time is None else seq.first_token_time - seq.arrival, tpot_s=tpot,
            speculative=None if seq.spec is None else seq.spec.stats(n))

    def run_until_done(self, trace: bool = False) -> list[StepEvent]:
        trace = as_bool("trace", trace)
        events = []
        while self.has_unfinished():
            events.append(self._locked_step(trace, self.instrument))
        return events


def _own(params: SamplingParams) -> SamplingParams:
    """The engine's copy of a request's params, checked: a caller changing its object later changes nothing
    here (set_params is the way), so the engine need not check them again at every sampled token."""
    params.validate()
    own = copy.copy(params)
    own.logit_bias = dict(params.logit_bias)  # the one mutable field
    return own


def _logit_stats(logits: torch.Tensor, token: int) -> LogitStats:
    """The raw distribution's entropy and scale, and the kept token's log-probability and rank in it."""
    x = logits.float()
    logp = torch.log_softmax(x, dim=-1)
    # one fused pass per number (this runs for every sampled token of every sequence): sum p·log p as a dot
    # product, and logsumexp from the token's own logit and log-probability
    plogp = float(torch.dot(logp.exp(), logp))
    if math.isnan(plogp):  # a -inf logit: 0·(-inf) counts as 0
        plogp = float((logp.exp() * logp).nan_to_num().sum())
    tok = float(x[token])
    lse = tok - float(logp[token]) if math.isfinite(tok) else float(torch.logsumexp(x, -1))
    return LogitStats(entropy=-plogp, max_logit=float(x.max()), logsumexp=lse, token_logprob=float(logp[token]),
                      token_rank=int((x > tok).sum()))


def _slots(table: list[int], block_size: int, length: int) -> torch.Tensor:
    return _table_slots(tuple(table), block_size)[:length]


@functools.lru_cache(maxsize=256)
def _table_slots(table: tuple[int, ...], block_size: int) -> torch.Tensor:
    """Every slot of a block table (read only: the model slices it). Cached: a decode step's table is usually the
    last step's, and building it took four torch ops (~0.1 ms on the caches a step's weights have flushed)."""
    blocks = torch.tensor(table, dtype=torch.long)
    return (blocks.unsqueeze(1) * block_size + torch.arange(block_size)).view(-1)


def _check_settings(settings: dict, device: torch.device) -> dict:
    """The engine settings given, type- and range-checked, as plain Python values (missing ones untouched)."""
    out = dict(settings)
    if "kv_memory" in out:
        kv = as_int("kv_memory", out["kv_memory"], 1)
        total = _device_memory(device)
        if total is not None and kv > total:
            raise ValueError(f"kv_memory must be at most this machine's {device.type} memory of {total} bytes "
                             f"(got {kv})")
        out["kv_memory"] = kv
    if "block_size" in out:
        out["block_size"] = as_int("block_size", out["block_size"], 1, MAX_BLOCK_SIZE)
    if "max_num_batched_tokens" in out:
        out["max_num_batched_tokens"] = as_int("max_num_batched_tokens", out["max_num_batched_tokens"], 1)
    if "max_num_seqs" in out:
        out["max_num_seqs"] = as_int("max_num_seqs", out["max_num_seqs"], 1, MAX_NUM_SEQS)
    if "enable_prefix_caching" in out:
        out["enable_prefix_caching"] = as_bool("enable_prefix_caching", out["enable_prefix_caching"])
    return out


def _device_memory(device: torch.device) -> int | None:
    """Total memory of the device the KV pool goes to, in bytes (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def _check_device(device: str) -> str:
    if not isinstance(device, (str, torch.device)):
        raise type_error("device", "a str such as 'cpu' or 'cuda'", device)
    device = str(device)
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for but no CUDA GPU is available; use --device cpu")
        return device
    if device == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps' was asked for but Apple MPS is not available; use --device cpu")
        return device
    raise ValueError(f"device must be cpu, cuda or mps (got {device!r})")
