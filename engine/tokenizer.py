"""Tokenizer views for InferLab: token bytes, chat prompt rendering, a BPE merge trace and streaming
detokenization with stop strings.

Two vocabulary styles are understood:

* byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen): every vocab string is written in the GPT-2
  "bytes to unicode" alphabet (a space is "Ġ", a newline "Ċ"), one character per byte;
* SentencePiece-style (Llama 2, TinyLlama, Mistral): "▁" stands for a space and characters missing
  from the vocabulary fall back to byte tokens "<0xE2>".

Everything here works on a transformers tokenizer (`tok`); tables derived from it are built once per
tokenizer object and cached, because `token_bytes` and the detokenizer run on every generated token.
"""
from __future__ import annotations

import codecs
import json
import re
import weakref
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

from .checks import as_bool, as_int, as_text, type_error
from .records import build

__all__ = [
    "MAX_PROMPT_CHARS",
    "MAX_SYSTEM_CHARS",
    "MAX_BPE_CHARS",
    "token_bytes",
    "is_byte_fallback",
    "token_info",
    "ChatPrompt",
    "render_prompt",
    "pre_tokens",
    "bpe_merges",
    "DetokStep",
    "IncrementalDetokenizer",
]

_BYTE_FALLBACK_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_REPLACEMENT = "\ufffd"
# How many prompt ids seed the detokenizer window (vLLM uses 5 too): enough context for a decoder
# that treats the first token of a sequence specially (SentencePiece strips its leading space), and
# small enough to keep every push O(window).
_SEED_IDS = 5
# How far back past those the seed may reach to start on a character's first byte (a character is at
# most 4 bytes, so 4 non-empty tokens always suffice; a little slack for empty ones).
_SEED_BACK = 8
# The window buffer is compacted once this many ids lie before the prefix offset.
_COMPACT_AT = 64
# Text limits checked before any tokenizer work (a prompt this long is far beyond every model's context anyway;
# tokenizing a multi-megabyte string only to refuse it would cost seconds of a shared server).
MAX_PROMPT_CHARS = 200_000
MAX_SYSTEM_CHARS = 200_000
# The BPE merge trace is a teaching view of one word; its cost grows quadratically with the word's length
# (every step records every symbol), so words are capped at this many characters.
MAX_BPE_CHARS = 64
# token_info accepts ids past the tokenizer's table (models pad their embeddings; such ids decode to nothing),
# but not absurd ones.
MAX_TOKEN_ID = 2**31 - 1


# --------------------------------------------------------------------------------------------------
# Per-tokenizer tables
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other
    68 bytes are shifted to U+0100.. so every byte has a visible, non-space character."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    visible += list(range(ord("®"), ord("ÿ") + 1))
    mapping: dict[str, int] = {chr(b): b for b in visible}
    n = 0
    for b in range(256):
        if b not in mapping.values():
            mapping[chr(256 + n)] = b
            n += 1
    return mapping


def _walk_types(node: Any) -> list[str]:
    """All "type" names in a (possibly nested Sequence) tokenizer-JSON component."""
    if isinstance(node, dict):
        out = [node["type"]] if isinstance(node.get("type"), str) else []
        for key in ("decoders", "pretokenizers", "normalizers", "processors"):
            for child in node.get(key) or []:
                out += _walk_types(child)
        # Replace("▁", " ") is the decoder that marks SentencePiece-style vocabularies.
        pattern = node.get("pattern")
        if node.get("type") == "Replace" and isinstance(pattern, dict) and pattern.get("String") == "▁":
            out.append("Replace▁")
        return out
    return []


class _Table:
    """What we need to know about one tokenizer, computed once."""

    def __init__(self, tok: Any) -> None:
        backend = getattr(tok, "backend_tokenizer", None)
        self.backend = backend
        self.model_json: dict = {}
        decoder_types: list[str] = []
        if backend is not None:
            spec = json.loads(backend.to_str())
            self.model_json = spec.get("model") or {}
            decoder_types = _walk_types(spec.get("decoder")) + _walk_types(spec.get("pre_tokenizer"))
            vocab = backend.get_vocab(with_added_tokens=True)
            added = backend.get_added_tokens_decoder()
            self.added: dict[int, str] = {i: t.content for i, t in added.items()}
            # The backend's own notion of "special" is what decode(skip_special_tokens=True) skips.
            self.skip_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        else:  # a slow (pure Python) tokenizer
            vocab = dict(tok.get_vocab())
            added = getattr(tok, "added_tokens_decoder", {}) or {}
            self.added = {i: str(getattr(t, "content", t)) for i, t in added.items()}
            self.skip_ids = frozenset(getattr(tok, "all_special_ids", ()) or ())
        self.special_ids: frozenset[int] = self.skip_ids | frozenset(getattr(tok, "all_special_ids", ()) or ())

        if "ByteLevel" in decoder_types:
            self.kind = "byte_level"
        elif {"Metaspace", "ByteFallback", "Replace▁"} & set(decoder_types) or self.model_json.get("byte_fallback"):
            self.kind = "sentencepiece"
        else:  # no tokenizer JSON: guess from how the vocabulary marks spaces
            g = sum(1 for p in vocab if p.startswith("Ġ"))
            s = sum(1 for p in vocab if p.startswith("▁"))
            self.kind = "byte_level" if g > s and g > 0 else ("sentencepiece" if s > 0 else "other")

        size = max(vocab.values()) + 1 if vocab else 0
        self.pieces: list[str | None] = [None] * size
        for piece, i in vocab.items():
            self.pieces[i] = piece
        for i, content in self.added.items():
            if i < size:
                self.pieces[i] = content
        self.vocab = vocab
        u2b = _unicode_to_byte()
        self.bytes: list[bytes] = []
        self.fallback: set[int] = set()
        for i, piece in enumerate(self.pieces):
            if piece is None:
                self.bytes.append(b"")
            elif i in self.added:
                # Added tokens are stored as plain text, not in the byte-level alphabet.
                self.bytes.append(piece.encode("utf-8"))
            elif self.kind == "byte_level":
                # The ByteLevel decoder maps a token through the byte alphabet only when every
                # character is in it, and otherwise uses the token's UTF-8 as is; do the same.
                if all(c in u2b for c in piece):
                    self.bytes.append(bytes(u2b[c] for c in piece))
                else:
                    self.bytes.append(piece.encode("utf-8"))
            elif self.kind == "sentencepiece":
                m = _BYTE_FALLBACK_RE.match(piece)
                if m:
                    self.fallback.add(i)
                    self.bytes.append(bytes([int(m.group(1), 16)]))
                else:
                    self.bytes.append(piece.replace("▁", " ").encode("utf-8"))
            else:
                self.bytes.append(piece.encode("utf-8"))
        self._ranks: dict[tuple[str, str], int] | None = None
        self.decode = _plain_decode(tok, backend)

    def ranks(self) -> dict[tuple[str, str], int]:
        # Built on first use only: bpe_merges is a teaching view, not on the per-token path.
        if self._ranks is None:
            ranks: dict[tuple[str, str], int] = {}
            for rank, entry in enumerate(self.model_json.get("merges") or []):
                pair = tuple(entry.split(" ", 1)) if isinstance(entry, str) else tuple(entry)
                if len(pair) == 2 and pair not in ranks:
                    ranks[pair] = rank  # type: ignore[index]
            self._ranks = ranks
        return self._ranks

    def token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise IndexError(f"negative token id {token_id}")
        # An id past the vocabulary (models pad their embedding, e.g. Qwen2) decodes to nothing.
        return self.bytes[token_id] if token_id < len(self.bytes) else b""

    def piece(self, token_id: int) -> str | None:
        return self.pieces[token_id] if 0 <= token_id < len(self.pieces) else None


def _plain_decode(tok: Any, backend: Any) -> Callable[..., str]:
    """tok.decode, or the backend's own decode where that is all tok.decode does: a fast tokenizer whose class
    keeps transformers' decode and _decode, with the clean-up of spaces off. The wrapper's Python layers cost
    ~30 us a call on the caches a decode step's weights have just flushed, and the detokenizer calls it twice
    a token."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:  # transformers' layout changed: keep its decode
        return tok.decode
    cls = type(tok)
    same = (backend is not None and isinstance(tok, PreTrainedTokenizerFast)
            and cls.decode is PreTrainedTokenizerBase.decode and cls._decode is PreTrainedTokenizerFast._decode
            and getattr(tok, "clean_up_tokenization_spaces", True) is False)
    return backend.decode if same else tok.decode


_TABLES: "weakref.WeakKeyDictionary[Any, _Table]" = weakref.WeakKeyDictionary()
_TABLES_BY_ID: dict[int, tuple[Any, _Table]] = {}  # for tokenizer objects that refuse weak references


def _table(tok: Any) -> _Table:
    try:
        table = _TABLES.get(tok)
        if table is None:
            table = _TABLES[tok] = _Table(tok)
        return table
    except TypeError:  # not weak-referenceable (or unhashable): keep it alive with the table
        hit = _TABLES_BY_ID.get(id(tok))
        if hit is None or hit[0] is not tok:
            hit = _TABLES_BY_ID[id(tok)] = (tok, _Table(tok))
        return hit[1]


# --------------------------------------------------------------------------------------------------
# Single tokens
# --------------------------------------------------------------------------------------------------


def token_bytes(tok: Any, token_id: int) -> bytes:
    """The UTF-8 bytes token `token_id` contributes to decoded text (context-free: a SentencePiece
    "▁Hello" gives b" Hello" even though decode strips the space of a sequence's first token)."""
    if type(token_id) is not int or token_id < 0:  # the per-token hot path skips the full check
        token_id = as_int("token_id", token_id, 0, MAX_TOKEN_ID)
    return _table(tok).token_bytes(token_id)


def is_byte_fallback(tok: Any, token_id: int) -> bool:
    """True for a SentencePiece byte-fallback token such as "<0xE2>"."""
    return int(token_id) in _table(tok).fallback


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02x}" for b in data)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def token_info(tok: Any, ids: Sequence[int]) -> list[dict]:
    """One display record per id: id, piece, text, bytes_hex, special, byte_fallback, partial_utf8."""
    if isinstance(ids, (str, bytes, dict, set)) or not hasattr(ids, "__iter__"):
        raise type_error("ids", "a list of token ids (ints)", ids)
    table = _table(tok)
    out = []
    for n, raw in enumerate(ids):
        i = raw if type(raw) is int and raw >= 0 else as_int(f"ids[{n}]", raw, 0, MAX_TOKEN_ID)
        data = table.token_bytes(i)
        out.append(
            {
                "id": i,
                "piece": table.piece(i),
                "text": data.decode("utf-8", errors="replace"),
                "bytes_hex": _hex(data),
                "special": i in table.special_ids,
                "byte_fallback": i in table.fallback,
                "partial_utf8": not _is_utf8(data),
            }
        )
    return out


# --------------------------------------------------------------------------------------------------
# Prompt rendering
# --------------------------------------------------------------------------------------------------


@dataclass
class ChatPrompt:
    text: str  # what the model reads, template included
    token_ids: list[int]
    # A contiguous segmentation of `text`: {start, end, kind: "special"|"text", token_start, token_end}.
    # A special token the tokenizer adds without text (a post-processor BOS) is a zero-width span.
    spans: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _encode_with_offsets(tok: Any, text: str, add_special_tokens: bool) -> tuple[list[int], list | None]:
    try:
        enc = tok(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError, KeyError):  # slow tokenizers have no offsets
        return list(tok(text, add_special_tokens=add_special_tokens)["input_ids"]), None


def _spans(tok: Any, text: str, ids: list[int], offsets: list | None) -> list[dict]:
    table = _table(tok)
    spans: list[dict] = []
    char, tok_i = 0, 0  # start of the text run not yet covered by a span

    def flush_text(end_char: int, end_tok: int) -> None:
        if end_char > char or end_tok > tok_i:
            spans.append({"start": char, "end": end_char, "kind": "text", "token_start": tok_i, "token_end": end_tok})

    for i, token_id in enumerate(ids):
        if token_id not in table.special_ids:
            continue
        content = table.piece(token_id) or ""
        if offsets is not None:
            start, end = offsets[i]
            # Trimmed or missing offsets (e.g. a post-processor BOS at (0, 0)) must not go backwards.
            start, end = max(start, char), max(end, start, char)
        else:
            found = text.find(content, char)
            start, end = (found, found + len(content)) if found >= 0 else (char, char)
        flush_text(start, i)
        spans.append({"start": start, "end": end, "kind": "special", "token_start": i, "token_end": i + 1})
        char, tok_i = end, i + 1
    flush_text(len(text), len(ids))
    return spans


def render_prompt(tok: Any, prompt: str, chat: bool = True, system: str | None = None) -> ChatPrompt:
    """The text and ids the model will read for `prompt`.

    chat=True applies the tokenizer's chat template to [system?, user] with a generation prompt;
    system=None keeps the template's default (SmolLM inserts its own system line), "" sends an
    explicit empty system message. The rendered text is tokenized with add_special_tokens=False,
    as apply_chat_template(tokenize=True) does, because templates write their own BOS.
    chat=False tokenizes `prompt` as a plain completion prompt (the tokenizer adds BOS if it
    normally does; SmolLM adds none). Prompts longer than MAX_PROMPT_CHARS (system prompts: MAX_SYSTEM_CHARS)
    are refused before any tokenizer work."""
    prompt = as_text("prompt", prompt, MAX_PROMPT_CHARS)
    system = as_text("system", system, MAX_SYSTEM_CHARS, optional=True)
    chat = as_bool("chat", chat)
    if chat:
        messages = [] if system is None else [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": prompt})
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids, offsets = _encode_with_offsets(tok, text, add_special_tokens=False)
    else:
        text = prompt
        ids, offsets = _encode_with_offsets(tok, text, add_special_tokens=True)
    return ChatPrompt(text=text, token_ids=ids, spans=_spans(tok, text, ids, offsets))


# --------------------------------------------------------------------------------------------------
# BPE merge trace
# --------------------------------------------------------------------------------------------------


def pre_tokens(tok: Any, text: str) -> list[str]:
    """How the tokenizer's normalizer + pre-tokenizer split `text` before BPE (in vocab alphabet)."""
    text = as_text("text", text, MAX_PROMPT_CHARS)
    backend = _table(tok).backend
    if backend is None:
        raise NotImplementedError("pre-tokenization needs a fast (tokenizers) tokenizer")
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    if backend.pre_tokenizer is None:
        return [text] if text else []
    return [piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text)]


def _display(table: _Table, symbol: str) -> str:
    """A symbol as readable text; bytes that are not a whole character show as <0xNN>."""
    if symbol in table.vocab and table.vocab[symbol] in table.added:
        return symbol
    if table.kind == "byte_level":
        u2b = _unicode_to_byte()
        if not all(c in u2b for c in symbol):
            return symbol
        data = bytes(u2b[c] for c in symbol)
    elif table.kind == "sentencepiece":
        if _BYTE_FALLBACK_RE.match(symbol):
            return symbol
        data = symbol.replace("▁", " ").encode("utf-8")
    else:
        return symbol
    # surrogateescape turns each undecodable byte into one lone surrogate we can spot and rewrite.
    text = data.decode("utf-8", errors="surrogateescape")
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def bpe_merges(tok: Any, word: str) -> list[dict]:
    """The steps of BPE turning one pre-token `word` (e.g. " gravity") into tokens.

    Step 0 holds the initial symbols (one per byte for byte-level BPE, one per character for
    SentencePiece-style BPE, with byte-fallback tokens for characters outside the vocabulary). Each
    later step applies the lowest-rank merge present, to all its non-overlapping occurrences from left
    to right (GPT-2's order; the tokenizers crate merges one occurrence at a time but ends in the same
    place). Each step: {step, merge: [left, right] | None, rank, symbols (display text), pieces (vocab
    strings), ids}. Raises ValueError when `word` is more than one pre-token or longer than MAX_BPE_CHARS
    characters (refused before any work: the trace's cost grows quadratically with the length)."""
    if isinstance(word, str) and len(word) > MAX_BPE_CHARS:
        raise ValueError(f"word is {len(word)} characters; the BPE merge trace shows words of at most "
                         f"{MAX_BPE_CHARS} characters (got {word[:20]!r}...)")
    word = as_text("word", word, MAX_BPE_CHARS)
    table = _table(tok)
    if table.model_json.get("type", "BPE") != "BPE" or table.backend is None:
        raise NotImplementedError("bpe_merges needs a fast tokenizer with a BPE model")
    pieces = pre_tokens(tok, word)
    if len(pieces) != 1:
        raise ValueError(f"{word!r} is {len(pieces)} pre-tokens {pieces!r}; pass one of them at a time")
    piece = pieces[0]
    vocab, model = table.vocab, table.model_json
    unk = model.get("unk_token")

    def record(step: int, merge: list[str] | None, rank: int | None, symbols: list[str]) -> dict:
        return {
            "step": step,
            "merge": merge,
            "rank": rank,
            "symbols": [_display(table, s) for s in symbols],
            "pieces": list(symbols),
            "ids": [vocab.get(s) for s in symbols],
        }

    if model.get("ignore_merges") and piece in vocab:
        # Llama-3-style tokenizers take a whole pre-token from the vocabulary without merging.
        return [record(0, None, None, list(piece)), record(1, None, None, [piece])]

    symbols: list[str] = []
    for ch in piece:
        if ch in vocab:
            symbols.append(ch)
        elif model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in ch.encode("utf-8")):
            symbols += [f"<0x{b:02X}>" for b in ch.encode("utf-8")]
        elif unk is not None:
            # fuse_unk joins neighbouring unknowns into one <unk>.
            if not (model.get("fuse_unk") and symbols and symbols[-1] == unk):
                symbols.append(unk)
        else:
            symbols.append(ch)
    steps = [record(0, None, None, symbols)]
    ranks = table.ranks()
    while len(symbols) > 1:
        best = min(
            ((ranks[p], p) for p in zip(symbols, symbols[1:]) if p in ranks),
            default=None,
        )
        if best is None:
            break
        rank, (left, right) = best
        merged: list[str] = []
        i = 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                merged.append(left + right)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
        steps.append(record(len(steps), [left, right], rank, symbols))
    return steps


# --------------------------------------------------------------------------------------------------
# Streaming detokenization
# --------------------------------------------------------------------------------------------------


def _incomplete_tail(data: bytes) -> bytes:
    """The trailing bytes of `data` that start a UTF-8 character and could still be completed.

    An invalid byte is final as soon as it is seen (the lossy decoder turns it into U+FFFD whatever
    follows), so only a valid, unfinished prefix is worth waiting for."""
    if not data:
        return b""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    # A pending prefix is at most 3 bytes; starting mid-character only adds U+FFFDs before it.
    decoder.decode(data[-3:], final=False)
    return decoder.getstate()[0]


@dataclass
class DetokStep:
    token_id: int
    token_bytes: str  # hex, e.g. "d0 a7"
    emitted: str  # text released by this step
    held_text: str  # decoded text held back because it may start a stop string (== stop_partial)
    held_bytes: str  # hex of an incomplete UTF-8 character waiting for its next byte(s)
    stop: str | None  # the stop string that matched at this step; the detokenizer is then finished
    stop_partial: str  # the held tail that is a proper prefix of some stop string
    finished: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DetokStep":
        return build(cls, data)


class IncrementalDetokenizer:
    """Turns generated ids into text one token at a time.

    The vLLM-style scheme: keep a short window of ids with two offsets, `prefix` (start of the context
    decoded for comparison) and `read` (end of the text already released). Each push decodes
    ids[prefix:] and releases what extends past decode(ids[prefix:read]) once it no longer ends in an
    unfinished UTF-8 character; decoding a window rather than single tokens lets the tokenizer's
    decoder apply its context rules (SentencePiece spaces) exactly as a full decode would.

    Without stop strings, "".join(step.emitted) + finish() == tok.decode(output_ids,
    skip_special_tokens=...) when prompt_ids is empty, except for an unfinished last character (a
    max_tokens cut inside it): decode renders its bytes as U+FFFD, finish() leaves them out (`dropped`). With prompt_ids the prompt's last ids are
    decoding context, taken so that the window starts on a character's first byte: the text is then
    what decode(prompt + output) adds to decode(prompt), for byte-level BPE exactly decode(output), for
    SentencePiece the same except that the first token keeps its leading space. A prompt that ends
    inside a character gives no context: the output reads decode(output) (its leading orphaned bytes
    as U+FFFD). One known gap, SentencePiece only: its ByteFallback decoder turns a whole run of
    <0xNN> tokens into one U+FFFD per byte when the run is not valid UTF-8, so an invalid byte can
    retroactively spoil characters already streamed (vLLM streams them too); a run that is invalid
    from its start is matched, and valid output, and byte-level BPE in all cases, match exactly.

    Stop strings: the first stop to complete in the text ends the stream (ties go to the longer
    one); the text before it is released and nothing from the stop on ever is. The longest suffix
    that is a proper prefix of some stop is held until it completes or fails. include_stop: the stop string
    itself is released too (vLLM's include_stop_str_in_output). min_tokens: as vLLM, stop strings are looked for
    only in the text of the pushes after the first min_tokens (earlier text is released as it comes)."""

    def __init__(
        self,
        tok: Any,
        prompt_ids: Sequence[int] = (),
        stop: Sequence[str] | str | None = (),
        skip_special_tokens: bool = True,
        include_stop: bool = False,
        min_tokens: int = 0,
    ) -> None:
        if isinstance(stop, str):
            stop = [stop]
        stop = stop or ()
        self._table = _table(tok)
        self._skip = skip_special_tokens
        self._include_stop = include_stop
        self._min_tokens = min_tokens
        self._pushes = 0
        self._stops = [s for s in dict.fromkeys(stop) if s]
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._held = ""  # text held for a possible stop match
        self._parts: list[str] = []
        self._finished = False
        self.stop: str | None = None  # the stop string that ended the stream, if any
        self.dropped = b""  # the bytes of an unfinished last character, left out at finish()

        seed = self._seed([int(i) for i in prompt_ids if not self._skipped(int(i))])
        self._ids: list[int] = seed
        self._prefix = 0
        self._read = len(seed)
        self._prefix_text = self._decode(self._ids)

    # -- helpers ----------------------------------------------------------------------------------

    def _skipped(self, token_id: int) -> bool:
        return self._skip and token_id in self._table.skip_ids

    def _starts_inside_char(self, ids: Sequence[int]) -> bool:
        """True when the bytes of `ids` begin with a UTF-8 continuation byte (10xxxxxx), i.e. a window
        starting there would open in the middle of a character."""
        for i in ids:
            data = self._table.token_bytes(i)
            if data:
                return 0x80 <= data[0] <= 0xBF
        return False

    def _seed(self, ids: list[int]) -> list[int]:
        """The prompt ids that start the window: about the last _SEED_IDS, beginning on a character.

        A window that opens inside a character decodes its orphaned bytes as U+FFFD. For byte-level BPE
        that only shifts the comparison text, but SentencePiece's ByteFallback decoder turns a whole
        run of <0xNN> tokens into one U+FFFD per byte as soon as any byte of the run is invalid, so
        the orphans would spoil the output characters that continue the run (CJK, Burmese...)."""
        if not ids or _incomplete_tail(b"".join(self._table.token_bytes(i) for i in ids[-_SEED_IDS:])):
            # The prompt ends mid-character, so the character straddles prompt and output: no window
            # over the prompt decodes the output's share of it the way decode(output) does, so the
            # output is decoded alone (its leading orphaned bytes render as U+FFFD, as decode does).
            return []
        start = max(0, len(ids) - _SEED_IDS)
        # A character is at most 4 bytes and every token but an empty one carries at least one, so a
        # few steps back find its first byte; empty tokens could in theory defeat this, hence the
        # fallback of moving forward (less context, still a clean start).
        s = start
        while s > 0 and start - s < _SEED_BACK and self._starts_inside_char(ids[s:]):
            s -= 1
        if self._starts_inside_char(ids[s:]):
            s = start
            while s < len(ids) and self._starts_inside_char(ids[s:]):
                s += 1
        return ids[s:]

    def _keep_prefix(self, new_prefix: int, delta: str) -> bool:
        """Whether the window must keep its start rather than move it to `new_prefix`.

        ByteFallback decodes a run of <0xNN> tokens as a whole: once the run has gone invalid (U+FFFD in
        what it produced) every later byte of it is U+FFFD too, as a full decode renders it. A window
        opening inside such a run would see only the tail, possibly valid, and disagree; so it stays
        at its start until the run ends (bounded, so a long garbage run cannot make push O(n))."""
        if self._table.kind != "sentencepiece" or _REPLACEMENT not in delta or new_prefix <= 0:
            return False
        if new_prefix >= len(self._ids) or len(self._ids) - self._prefix > _COMPACT_AT:
            return False
        fallback = self._table.fallback
        return self._ids[new_prefix - 1] in fallback and self._ids[new_prefix] in fallback

    def _decode(self, ids: list[int]) -> str:
        return self._table.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def _pending_tail(self) -> bytes:
        return _incomplete_tail(b"".join(self._table.token_bytes(i) for i in self._ids[self._read :]))

    def _match_stop(self, buf: str) -> tuple[int, str] | None:
        """(start, stop) of the stop string that completes first in buf."""
        best: tuple[int, int, str] | None = None
        for s in self._stops:
            i = buf.find(s)
            if i >= 0:
                key = (i + len(s), -len(s), s)
                if best is None or key[:2] < best[:2]:
                    best = key
        return None if best is None else (best[0] + best[1], best[2])

    def _partial_len(self, buf: str) -> int:
        for k in range(min(len(buf), self._max_stop - 1), 0, -1):
            tail = buf[-k:]
            if any(len(s) > k and s.startswith(tail) for s in self._stops):
                return k
        return 0

    def _release(self, delta: str, final: bool) -> tuple[str, str | None]:
        """Pass freshly decoded text through the stop-string filter; returns (emitted, stop)."""
        buf = self._held + delta
        self._held = ""
        if not self._stops or self._pushes <= self._min_tokens:
            out, matched = buf, None
        else:
            hit = self._match_stop(buf)
            if hit is not None:
                out, matched = buf[: hit[0] + (len(hit[1]) if self._include_stop else 0)], hit[1]
                self._finished = True
                self.stop = matched
            else:
                keep = 0 if final else self._partial_len(buf)
                out, matched = buf[: len(buf) - keep], None
                self._held = buf[len(buf) - keep :]
        if out:
            self._parts.append(out)
        return out, matched

    # -- public -----------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        """The state a push or finish can change, for `restore` (the engine undoes a failed step with it).

        Cheap: emitted parts are only ever appended, so their count stands for them."""
        return (self._held, len(self._parts), self._finished, self.stop, list(self._ids), self._prefix,
                self._read, self._prefix_text, self._pushes, self.dropped)

    def restore(self, state: tuple) -> None:
        (held, n_parts, self._finished, self.stop, ids, self._prefix, self._read, self._prefix_text,
         self._pushes, self.dropped) = state
        self._held = held
        del self._parts[n_parts:]
        self._ids = list(ids)

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._parts)

    @property
    def finished(self) -> bool:
        return self._finished

    def push(self, token_id: int, silent: bool = False) -> DetokStep:
        """One generated token. silent=True: it adds no text, as a skipped special token (a stop token whose
        text is not wanted: the engine's EOS or stop_token_ids without include_stop_str_in_output)."""
        token_id = int(token_id)
        raw = self._table.token_bytes(token_id)
        self._pushes += 1
        if self._finished:
            # After a stop or finish() nothing more is released; the step only describes the token.
            return DetokStep(token_id, _hex(raw), "", "", "", None, "", True)
        delta = ""
        if silent or self._skipped(token_id):  # skipped specials would only widen the window
            tail = self._pending_tail()
        else:
            self._ids.append(token_id)
            new_text = self._decode(self._ids[self._prefix :])
            tail = self._pending_tail()
            # A trailing U+FFFD is held only when it stands for a character that may still complete;
            # an invalid byte is final (the lossy decode renders it the same whatever follows).
            if not (tail and new_text.endswith(_REPLACEMENT)) and len(new_text) > len(self._prefix_text):
                tail = b""
                delta = new_text[len(self._prefix_text) :]
                if not self._keep_prefix(self._read, delta):
                    self._prefix = self._read
                self._read = len(self._ids)
                if self._prefix >= _COMPACT_AT:  # keep the buffer (and push) O(window)
                    del self._ids[: self._prefix]
                    self._read -= self._prefix
                    self._prefix = 0
                self._prefix_text = self._decode(self._ids[self._prefix : self._read])
        emitted, matched = self._release(delta, final=False) if delta else ("", None)
        return DetokStep(
            token_id=token_id,
            token_bytes=_hex(raw),
            emitted=emitted,
            held_text=self._held,
            held_bytes="" if self._finished else _hex(tail),
            stop=matched,
            stop_partial=self._held,
            finished=self._finished,
        )

    def finish(self) -> str:
        """Release everything held (call at EOS or the length limit) and close the stream.

        A held stop prefix that never completed is released as text. An unfinished character at the very end
        (max_tokens cut it) is not: its bytes never made a character, and decode would render them as U+FFFD,
        which no answer should end in. They are kept in `dropped` instead (b"" when nothing was cut)."""
        if self._finished:
            return ""
        rest = ""
        if len(self._ids) > self._read:
            tail = self._pending_tail()
            rest = self._decode(self._ids[self._prefix :])[len(self._prefix_text) :]
            if tail:
                # the tail decodes to U+FFFD: one for a byte-level BPE's lossy decode, one per byte for
                # SentencePiece's ByteFallback; whatever complete text came before it is released
                cut = len(rest) - len(rest.rstrip(_REPLACEMENT))
                rest = rest[: len(rest) - min(cut, len(tail))]
                self.dropped = tail
            self._prefix, self._read = self._read, len(self._ids)
        out, _ = self._release(rest, final=True)
        self._finished = True
        return out
