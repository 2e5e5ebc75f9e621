"""Trace export and offline replay: a lab session as one versioned JSON document, and a model-free session
that steps through it.

A trace holds every StepEvent the session kept, the small per-step view state the panels need (focus, each
sequence's token ids), and everything else the renderer would ask the model or tokenizer for: token texts and
byte info, nearest-neighbour lists, BPE merge traces. `load_trace` turns it into a ReplaySession, which
implements the same read-only LabView protocol as a live LabSession, so `render.build_payload(replay, ...)`
draws the same charts with no model loaded (a lecture without compute, or a Space that is asleep).

Size: the lab captures attention for every layer and head, which is ~90% of a trace. By default attention
probabilities are stored in 2 bytes as round(sqrt(p) * 65535) ("p16"): the square root spends the 16 bits
where entropy needs them (a linear uint16 zeroes every p < 7.6e-6, and ~80 such keys shift a row's entropy
by ~2e-3 bits); the absolute error of p is <= 1.6e-5 and of an entropy ~1e-5 bits. Every other array is exact
float32 and every other number keeps full precision, so replayed charts equal live ones exactly except the
three attention charts, which agree within ATTENTION_TOLERANCE (attention="f32" makes them exact too, at
about twice the size). Arrays travel as {"__ndarray__": "p16"|"f32"|"i32"|"i64", "shape": [...],
"data": base64 of the little-endian values}.
"""
from __future__ import annotations

import base64
import functools
import gzip
import json
import math
import os
import re
import threading
import time
import zlib
import types
import typing
from collections import deque
from dataclasses import asdict, fields, is_dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.events import EVENT_VERSION, CaptureData, SeqEvent, StepEvent
from engine.records import dumps
from engine.sampling import SamplingTrace
from engine.tokenizer import token_info

from .i18n import Phrase, Refusal
from .render import _default_word, prompt_words
from . import session as _session
from .session import LabSession, RequestInfo, last_seq_event

FORMAT = "inferlab-trace"
VERSION = 2  # 2: a step's KV blocks as packed columns (_pack_blocks); version 1 traces still load
NEIGHBOURS_K = 10  # what the neighbours chart shows
MAX_BPE_WORDS = 200  # BPE traces recorded per trace (every word of every prompt, up to this many)
# Limits on what a visitor can upload (a public Space): bytes once unpacked, JSON values, nesting. Measured on
# a real 400-step lab session (MAX_EVENTS; one sequence; the lab's capture budgets, whose 64 MiB a tab left
# attention on the newest 140 steps, of which the export writes 108): 42 MiB of JSON (32 MiB of it attention,
# 23 MiB gzipped), 637,000 values, 60 MB as Python objects after json.loads (149 MB at its peak), and
# load_trace held 161 MB (202 MB at its peak).
MAX_TRACE_BYTES = 64 << 20  # the decompressed document; a gzip bomb stops here, not at the end of memory
# json.loads builds a Python object for every value and key: a document of tiny objects ("[{},{},...]") costs
# ~24x its size. The count of ',' ':' '[' '{' bytes bounds the values and keys, and is counted before parsing;
# 2 million is 3x the real session above, and at most ~150 MB of the tiniest objects.
MAX_TRACE_VALUES = 2_000_000
MAX_TRACE_DEPTH = 32  # the exporter's documents nest 10 deep; the loader's own walks recurse this deep
# The exporter keeps the newest steps' attention within this many bytes of base64 (older steps' attention is
# written as dropped, and the replay says so), and leaves out the oldest frames if the document would still
# pass the limits above (_fit): every trace the lab writes loads.
MAX_EXPORT_ATTENTION_BYTES = 32 << 20
MAX_POSITION = 1 << 24  # positions, lengths and counts in a trace (no model here has contexts near it)
MAX_ARRAY_DIMS = 4
# What a trace may describe is bounded by what the engine that wrote it could have had, checked before the bulk is
# decoded. Its "engine" record (written since issue 36) names the pool, the batch and the context; a trace without
# one is held to the absolute caps. A 2,000,000-block trace (45 MB, a 4 MB gzip upload, under the byte and value
# limits) took 11 s to load, kept +750 MB in its tab and drew 92 MB payloads per step before these bounds.
MAX_TRACE_POOL_BLOCKS = 1 << 15  # KV blocks in one step's pool: 512k tokens at 16 per block (the lab's is ~700)
MAX_TRACE_SEQS = 1024  # sequences in one step's batch (engine.MAX_NUM_SEQS)
MAX_TRACE_BLOCK_SIZE = 1024  # tokens per block (engine.MAX_BLOCK_SIZE)
# Claims of packed blocks in the text, found before json.loads (and while gunzipping): the exporter's spelling.
# A JSON string cannot hold an unescaped quote, so a match is a key (or an over-count: only a refusal, never a pass);
# a key spelled with escapes is still caught after parsing, before any block is decoded.
_BLOCKS_CLAIM = re.compile(rb'"__blocks__"\s*:\s*(\d{1,12})')
_BLOCKS_CLAIM_TEXT = re.compile(_BLOCKS_CLAIM.pattern.decode())
P16_SCALE = 65535
# Largest difference between a replayed and a live attention chart value (weights and entropy bits): the p16
# error plus one unit of the charts' 4-digit rounding (a value near a rounding boundary can land either side).
ATTENTION_TOLERANCE = 1e-4 + 2e-5
ATTENTION_ENCODINGS = ("p16", "f32")

_REQUIRED = ("model", "requests", "frames", "vocab", "neighbours", "bpe")


class TraceError(ValueError):
    """A trace that cannot be loaded; the message is one line meant for the user."""


# ---- export -------------------------------------------------------------------------------------------

def export_trace(lab: "LabSession | ReplaySession", *, attention: str = "p16", words: tuple[str, ...] = ()) -> dict:
    """The session as a trace document (plain JSON types; `engine.records.dumps` writes it).

    attention: "p16" (compact, see the module docstring) or "f32" (exact, about twice the size).
    words: extra words whose BPE merge trace the replay should be able to show, besides the prompts' words.
    The last frame's view is the session as it is now, so focus changes, rewinds or queued requests made
    after the last step replay as they were seen. A ReplaySession exports the document it was loaded from.
    """
    if isinstance(lab, ReplaySession):
        return lab.doc
    if attention not in ATTENTION_ENCODINGS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_ENCODINGS)} (got {attention!r})")
    with lab.lock:
        eng = lab.engine
        now_view = lab.view_state()
        frames = []
        written = _attention_written(lab.events, attention)
        for i, ev in enumerate(lab.events):
            last = i == len(lab.events) - 1
            view = dict(now_view if last else lab.views.get(ev.step, now_view))
            if last:
                view["what_if"] = lab.what_if
            ev = ev if i in written else _without_attention(ev)
            frames.append({"event": _encode(ev, attention), "view": _encode(view, attention)})
        requests = []
        for sid in sorted(lab.requests):
            req = lab.requests[sid]
            seq = eng.sequences.get(sid)
            requests.append({**_encode(asdict(req), attention),
                             "params": seq.params.to_dict() if seq is not None else None,
                             "parent_id": seq.parent_id if seq is not None else None})
        ids = sorted({int(t) for f in frames for s in f["view"]["seqs"].values() for t in s["token_ids"]}
                     | {int(t) for s in now_view["seqs"].values() for t in s["token_ids"]})
        vocab = {str(info["id"]): info for info in token_info(eng.tokenizer, ids)}
        neighbours = {str(i): [[int(j), text, float(c)] for j, text, c in lab.nearest(i, NEIGHBOURS_K)]
                      for i in ids}
        bpe = {}
        candidates = [_default_word(r.prompt) for r in lab.requests.values()]
        candidates += [w for r in lab.requests.values() for w in prompt_words(r.prompt)]
        candidates += [w.strip() for w in words if w and w.strip()]
        for word in candidates:
            if word in bpe or len(bpe) >= MAX_BPE_WORDS:
                continue
            try:
                bpe[word] = lab.bpe(word)
            except (ValueError, NotImplementedError) as exc:  # shown as the same message on replay
                bpe[word] = {"error": str(exc)}
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "event_version": EVENT_VERSION,
            "attention_encoding": attention,
            "model": {"id": eng.model_id, "device": eng.device, "spec": _encode(asdict(eng.spec), attention)},
            "engine": _engine_record(eng),
            "requests": requests,
            "frames": frames,
            "vocab": vocab,
            "neighbours": neighbours,
            "bpe": _encode(bpe, attention),
        }
        return _fit(doc)


def _engine_record(eng) -> dict:
    """What the engine could hold, which bounds what a trace of it may describe (checked by _trace_bounds)."""
    return {"num_blocks": int(eng.blocks.num_blocks), "block_size": int(eng.block_size),
            "max_num_seqs": int(eng.scheduler.max_num_seqs),
            "max_num_batched_tokens": int(eng.scheduler.max_num_batched_tokens),
            "max_model_len": int(eng.max_model_len)}


def _size(v: Any) -> tuple[int, int]:
    """(UTF-8 bytes, JSON values as _count_values counts them) of a value as the trace's text."""
    text = dumps(v)
    return len(text.encode("utf-8")), sum(text.count(c) for c in (",", ":", "[", "{"))


def _fit(doc: dict) -> dict:
    """The document within the loader's limits, so that every trace the lab writes loads: the newest frames
    that fit in 95% of MAX_TRACE_BYTES and MAX_TRACE_VALUES (a 400-step session of one sequence uses two thirds
    of the bytes and a third of the values; many sequences at once can pass them). "frames_dropped" says how
    many of the oldest were left out."""
    frames = doc["frames"]
    used_bytes, used_values = _size({**doc, "frames": []})
    room_bytes, room_values = 0.95 * MAX_TRACE_BYTES - used_bytes, 0.95 * MAX_TRACE_VALUES - used_values
    keep = len(frames)
    for i in range(len(frames) - 1, -1, -1):
        b, n = _size(frames[i])
        room_bytes, room_values = room_bytes - b - 1, room_values - n - 1
        if room_bytes < 0 or room_values < 0:
            keep = len(frames) - 1 - i
            break
    if keep < len(frames):
        doc = {**doc, "frames": frames[len(frames) - keep:], "frames_dropped": len(frames) - keep}
    return doc


def _attention_written(events: list, attention: str) -> set[int]:
    """Indices of the events whose attention the trace holds: the newest whose base64 fits
    MAX_EXPORT_ATTENTION_BYTES (a long session's decode rows alone would pass MAX_TRACE_BYTES)."""
    per = 2 if attention == "p16" else 4
    total, out = 0, set()
    for i in range(len(events) - 1, -1, -1):
        numel = sum(int(np.prod(a.shape)) for s in events[i].seqs if s.capture is not None
                    for a in (s.capture.attention or {}).values())
        total += (numel * per + 2) // 3 * 4
        if total > MAX_EXPORT_ATTENTION_BYTES:
            break
        out.add(i)
    return out


def _without_attention(ev: StepEvent) -> StepEvent:
    """A copy of the event whose captures' attention is dropped (the live event is left as it is)."""
    def strip(cap: CaptureData | None) -> CaptureData | None:
        if cap is None or not cap.attention:
            return cap
        return replace(cap, attention={}, dropped=sorted(set(cap.dropped) | {"attention"}))
    return replace(ev, seqs=[replace(s, capture=strip(s.capture)) for s in ev.seqs])


def trace_bytes(doc: dict, compress: bool = True) -> bytes:
    """The trace as a file's bytes (strict JSON, see engine.records.dumps); gzip (mtime 0, so equal traces give
    equal files) shrinks it ~3-4x."""
    data = dumps(doc).encode("utf-8")
    return gzip.compress(data, compresslevel=6, mtime=0) if compress else data


def save_trace(doc: dict, directory: str | os.PathLike, compress: bool = True) -> Path:
    """Write the trace into `directory` (for a download button) and return the file's path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = Path(directory) / f"inferlab-trace-{stamp}.json{'.gz' if compress else ''}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(trace_bytes(doc, compress))
    return path


def _encode(v: Any, attention: str) -> Any:
    """JSON-safe value: exact floats (non-finite -> None), packed arrays, int dict keys as strings.

    Generic over dataclass fields, so fields the engine adds to its events travel without changes here.
    """
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        v = (v.float() if v.is_floating_point() else v).numpy()
    if isinstance(v, np.ndarray):
        return _pack(v)
    if isinstance(v, CaptureData):
        out = {f.name: _encode(getattr(v, f.name), attention) for f in fields(v)}
        out["attention"] = {str(k): _pack(_as_numpy(a), attention) for k, a in (v.attention or {}).items()}
        return out
    if isinstance(v, StepEvent):
        out = {f.name: _encode(getattr(v, f.name), attention) for f in fields(v)}
        out["blocks"] = _pack_blocks(v.blocks) or out["blocks"]
        return out
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _encode(getattr(v, f.name), attention) for f in fields(v)}
    if isinstance(v, dict):
        return {str(k): _encode(x, attention) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode(x, attention) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if hasattr(v, "to_dict") and not isinstance(v, type):
        return _encode(v.to_dict(), attention)
    return v


def _as_numpy(a: Any) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().float().numpy()
    return np.asarray(a, dtype=np.float32)


def _pack(a: np.ndarray, kind: str | None = None) -> dict:
    """One array as base64. kind "p16": probabilities in [0, 1] as round(sqrt(p) * 65535) (falls back to
    f32 when the values are not all finite and within [0, 1])."""
    a = np.asarray(a)
    if a.dtype.kind == "b":
        a = a.astype(np.int32)
    if a.dtype.kind in "iu":
        small = a.size == 0 or (a.min() >= -2**31 and a.max() < 2**31)
        code, raw = ("i32", a.astype("<i4")) if small else ("i64", a.astype("<i8"))
    else:
        a = a.astype(np.float32)
        if kind == "p16" and np.isfinite(a).all() and (a.size == 0 or (a.min() >= 0.0 and a.max() <= 1.0)):
            code, raw = "p16", np.rint(np.sqrt(a.astype(np.float64)) * P16_SCALE).astype("<u2")
        else:
            code, raw = "f32", a.astype("<f4")
    return {"__ndarray__": code, "shape": list(a.shape), "data": base64.b64encode(raw.tobytes()).decode("ascii")}


_DTYPES = {"p16": "<u2", "f32": "<f4", "i32": "<i4", "i64": "<i8"}


_P16_TABLE = np.square(np.arange(1 << 16, dtype=np.float64) / P16_SCALE).astype(np.float32)  # P16_SCALE = 2^16-1


def _unpack(d: dict) -> np.ndarray:
    """The array of a packed record. Its shape must match its data's length before anything is allocated:
    base64 of n bytes is 4 * ceil(n / 3) characters, so a shape that claims more than the data holds is
    refused from the string's length alone."""
    code, shape, data = d.get("__ndarray__"), d.get("shape"), d.get("data", "")
    if not isinstance(code, str) or code not in _DTYPES:
        raise ValueError(f"unknown array encoding {str(code)[:20]!r}")
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS or \
            not all(type(n) is int and 0 <= n <= MAX_TRACE_BYTES for n in shape):
        raise ValueError("an array has a malformed shape")
    if not isinstance(data, str):
        raise ValueError("an array's data is not base64")
    dtype = np.dtype(_DTYPES[code])
    need = dtype.itemsize * math.prod(shape)
    if len(data) != (need + 2) // 3 * 4:
        raise ValueError(f"an array's data ({len(data)} base64 characters) does not fit its shape {shape}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (TypeError, ValueError):
        raise ValueError("an array's data is not base64") from None
    if len(raw) != need:
        raise ValueError(f"an array holds {len(raw)} bytes, its shape {shape} needs {need}")
    a = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if code == "p16":  # a table instead of float64 arithmetic: the same values, no 8-byte temporary
        return _P16_TABLE[a]
    return a.astype(np.float32 if code == "f32" else np.int64)  # a writeable copy in native byte order


BLOCK_STATES = {"u": "used", "c": "cached", "f": "free"}
_BLOCK_KEYS = ("id", "refcount", "state", "hashed", "owners")


def _pack_blocks(blocks: Any) -> dict | None:
    """A step's BlockManager.block_states() as packed columns instead of a JSON object per block: a 400-step
    session over the lab's 364-block pool wrote 1.7 million JSON values for them, most of a trace's values.
    None when the blocks have another shape (they then travel as they are)."""
    codes = {name: code for code, name in BLOCK_STATES.items()}
    if not isinstance(blocks, list) or not blocks or not all(
            isinstance(b, dict) and tuple(b) == _BLOCK_KEYS and b["state"] in codes and isinstance(b["hashed"], bool)
            and type(b["id"]) is int and type(b["refcount"]) is int and isinstance(b["owners"], list)
            and all(type(o) is int for o in b["owners"]) for b in blocks):
        return None
    ints = lambda xs: _pack(np.array(xs, dtype=np.int64))  # noqa: E731
    return {"__blocks__": len(blocks), "id": ints([b["id"] for b in blocks]),
            "refcount": ints([b["refcount"] for b in blocks]), "state": "".join(codes[b["state"]] for b in blocks),
            "hashed": ints([int(b["hashed"]) for b in blocks]),
            "owners": ints([o for b in blocks for o in b["owners"]]),
            "owner_counts": ints([len(b["owners"]) for b in blocks])}


def _unpack_blocks(d: dict, max_blocks: int = MAX_TRACE_POOL_BLOCKS) -> list[dict]:
    return _block_dicts(*_block_columns(d, max_blocks))


def _block_columns(d: dict, max_blocks: int = MAX_TRACE_POOL_BLOCKS) -> tuple[dict, str]:
    """A packed step's columns, checked, without a dict per block (a replay builds those only for the frame it
    shows). The claimed count is checked against `max_blocks` before any column is decoded."""
    n = d.get("__blocks__")
    if _is_int(n, 0, MAX_POSITION) and n > max_blocks:
        raise ValueError(f"a step holds {n:,} KV blocks; the trace's engine had at most {max_blocks:,}")
    cols = {k: _unpack(d[k]) if isinstance(d.get(k), dict) else None
            for k in ("id", "refcount", "hashed", "owners", "owner_counts")}
    state = d.get("state")
    if not _is_int(n, 0, MAX_POSITION) or not isinstance(state, str) or len(state) != n or \
            any(c is None or c.ndim != 1 or not np.issubdtype(c.dtype, np.integer) for c in cols.values()) or \
            any(len(cols[k]) != n for k in ("id", "refcount", "hashed", "owner_counts")) or \
            (cols["owner_counts"] < 0).any() or int(cols["owner_counts"].sum()) != len(cols["owners"]) or \
            not set(state) <= set(BLOCK_STATES):
        raise ValueError("a step's KV blocks are damaged")
    return cols, state


def _block_dicts(cols: dict, state: str) -> list[dict]:
    owners = cols["owners"].tolist()
    ends = np.cumsum(cols["owner_counts"]).tolist()
    return [{"id": i, "refcount": rc, "state": BLOCK_STATES[st], "hashed": bool(h), "owners": owners[e - c:e]}
            for i, rc, st, h, c, e in zip(cols["id"].tolist(), cols["refcount"].tolist(), state,
                                          cols["hashed"].tolist(), cols["owner_counts"].tolist(), ends)]


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if "__ndarray__" in v:
            return _unpack(v)
        if "__blocks__" in v:
            return _unpack_blocks(v)
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


# ---- load ---------------------------------------------------------------------------------------------

def load_trace(data: str | bytes | bytearray | os.PathLike) -> "ReplaySession":
    """A ReplaySession from trace text, file bytes (plain or gzip) or a file path (os.PathLike).

    Raises TraceError with a one-line message for anything that is not a loadable trace.
    """
    return ReplaySession(parse_trace(data))


def parse_trace(data: str | bytes | bytearray | os.PathLike) -> dict:
    """The trace document from text/bytes/path, with its format and version checked.

    Before json.loads: the size (MAX_TRACE_BYTES, after gunzip) and the number of values (MAX_TRACE_VALUES);
    json.loads itself refuses NaN/Infinity and non-finite numbers; after it, the nesting (MAX_TRACE_DEPTH)."""
    if isinstance(data, os.PathLike):
        try:
            with open(data, "rb") as fh:
                data = fh.read(MAX_TRACE_BYTES + 1)
        except OSError as exc:
            raise TraceError(f"cannot read the trace file: {exc.strerror or exc}") from None
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data)
        if data[:2] == b"\x1f\x8b":
            data = _gunzip(data)  # claims of blocks are checked chunk by chunk as they come out
        if len(data) > MAX_TRACE_BYTES:
            raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES >> 20} MiB")
        _count_values(data)
        _check_block_claims(data)
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise TraceError("not an InferLab trace: the file is neither JSON text nor gzip") from None
    if not isinstance(data, str):
        raise TraceError(f"not an InferLab trace: expected text, bytes or a path, got {type(data).__name__}")
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES >> 20} MiB")
    _count_values(data)
    _check_block_claims(data)
    try:
        doc = json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not an InferLab trace: the file is not JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise TraceError("not an InferLab trace: the JSON is nested too deeply") from None
    except TraceError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise TraceError(f"not an InferLab trace: {_first_line(exc)}") from None
    _check_depth(doc)
    return check_trace(doc)


def _count_values(data: str | bytes) -> None:
    """Refuse a document with more than MAX_TRACE_VALUES JSON values and keys, before parsing it: every value
    but the first follows a ',', ':' or '[', and every key a '{' or ','. Bytes inside strings count too, so
    this over-counts a little (token texts; base64 has none of the four)."""
    marks = (",", ":", "[", "{") if isinstance(data, str) else (b",", b":", b"[", b"{")
    count = 0
    for m in marks:
        count += data.count(m)
        if count > MAX_TRACE_VALUES:
            raise TraceError(f"the trace has more than {MAX_TRACE_VALUES:,} JSON values (an InferLab trace has "
                             "far fewer)")


def _check_block_claims(data: str | bytes, start: int = 0) -> None:
    """Refuse a step's packed KV blocks past MAX_TRACE_POOL_BLOCKS from the text, before anything is parsed (a
    regex scan: ~30 ms for 45 MB, no allocation beyond the matches). Matches ending before `start` were seen
    already (the overlap _gunzip keeps between chunks)."""
    pattern = _BLOCKS_CLAIM if isinstance(data, bytes) else _BLOCKS_CLAIM_TEXT
    for m in pattern.finditer(data):
        if m.end() > start and int(m.group(1)) > MAX_TRACE_POOL_BLOCKS:
            raise TraceError(f"a step of the trace holds {int(m.group(1)):,} KV blocks; no engine InferLab runs "
                             f"has more than {MAX_TRACE_POOL_BLOCKS:,}")


def _no_constant(name: str):
    raise TraceError(f"not an InferLab trace: {name} is not a number a trace holds")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise TraceError(f"not an InferLab trace: the number {text[:20]} is out of range")
    return x


def _check_depth(doc: Any) -> None:
    """Refuse nesting deeper than MAX_TRACE_DEPTH (the loader's own walks are recursive): a loop, no recursion."""
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_TRACE_DEPTH:
            raise TraceError(f"the trace is nested more than {MAX_TRACE_DEPTH} levels deep")
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        stack.extend((x, depth + 1) for x in children if isinstance(x, (dict, list)))


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def check_trace(doc: Any) -> dict:
    """The document itself if its format, version and top-level fields are right; TraceError otherwise."""
    if not isinstance(doc, dict) or "format" not in doc:
        raise TraceError("not an InferLab trace: it has no \"format\" field")
    if doc["format"] != FORMAT:
        raise TraceError(f"not an InferLab trace: format is {doc['format']!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceError(f"the trace's version must be a positive integer (got {version!r})")
    if version > VERSION:
        raise TraceError(f"this trace is version {version}, newer than this InferLab reads ({VERSION}): "
                         "update InferLab to replay it")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise TraceError(f"the trace is missing {', '.join(repr(k) for k in missing)}")
    return doc


def _gunzip(data: bytes) -> bytes:
    """The unpacked bytes, 1 MiB at a time: a bomb is refused once MAX_TRACE_BYTES are out, having held no more
    than that (one call with a max_length grows its buffer to twice the limit first)."""
    out = zlib.decompressobj(16 + zlib.MAX_WBITS)
    chunks, size, tail, seen = [], 0, data, b""
    try:
        while tail and not out.eof:
            chunk = out.decompress(tail, 1 << 20)
            tail = out.unconsumed_tail
            size += len(chunk)
            if size > MAX_TRACE_BYTES:
                raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES >> 20} MiB once unpacked")
            # a packed-block bomb stops at its first oversized step, before the rest is even unpacked; the last
            # bytes of the previous chunk go along, so a claim cut between two chunks is still read whole
            _check_block_claims(seen + chunk, len(seen))
            seen = chunk[-48:]
            chunks.append(chunk)
    except zlib.error:
        raise TraceError("the trace's gzip data is damaged") from None
    if not out.eof:
        raise TraceError("the trace's gzip data is damaged or cut short")
    return b"".join(chunks)


# ---- replay -------------------------------------------------------------------------------------------



class ReplaySession:
    """A read-only lab session over a trace's frames; implements the LabView protocol (app/session.py).

    The cursor is the number of frames shown: 0 (reset) shows nothing, num_frames shows the whole trace.
    `focus` may be set to any sequence that exists at the cursor; it sticks while that sequence exists.
    """

    # A replay draws a document a stranger may have written: render.py draws each of its charts on its own
    # (one that fails on a value no check here foresaw says so and the others still draw).
    untrusted = True

    def __init__(self, doc: dict):
        doc = check_trace(doc)
        _check_depth(doc)  # a document handed in directly did not pass parse_trace
        self.doc = doc
        try:
            self._load(doc)
        except TraceError:
            raise
        except Exception as exc:  # a hole in the checks below: still one line, and still a TraceError
            raise TraceError(f"the trace is damaged ({type(exc).__name__}: {_first_line(exc)})") from None
        # the attributes a UI handler touches on a live session
        # SessionRegistry.renew carries these page settings from a tab's session to its fresh one (Reset, the
        # preemption demo): Reset after a replay read `speculative` of a ReplaySession, which had none
        self.speculative = None  # a replay starts no requests: no drafter
        self.preview = None  # the prompt box's preview: a replay shows its own prompts
        self.lock = threading.RLock()
        self.sent_html: dict = {}
        self.sent_figs: dict = {}
        self.running = False
        self.last_used = time.time()
        self._chosen: int | None = None
        # the room panel's data (app/charts/room.py): a recording holds one tab's view only, so none
        self.room_records: list[dict] = []
        self.room_blocks: list[str] = []
        self.room_me = ""
        self.seek(0)

    def _load(self, doc: dict) -> None:
        created = doc.get("created")
        self.created = created if isinstance(created, str) else None
        model = doc["model"]
        spec = model.get("spec") if isinstance(model, dict) else None
        if not isinstance(model, dict) or not isinstance(spec, dict) or \
                not all(_is_int(spec.get(k), 1, 4096) for k in ("num_layers", "num_heads")):
            raise TraceError("the trace's model record is damaged (it needs id and spec.num_layers/num_heads)")
        self.model = {"id": str(model.get("id"))[:200], "device": model.get("device"), "spec": dict(spec)}
        self._num_layers, self._num_heads = spec["num_layers"], spec["num_heads"]
        self._vocab = _check_vocab(_obj(doc["vocab"], "vocab"))
        self._neighbours = _check_neighbours(_obj(doc["neighbours"], "neighbours"))
        self._bpe = _check_bpe(_obj(doc["bpe"], "bpe"))
        self._requests, self.request_params = {}, {}
        for i, r in enumerate(_list(doc["requests"], "requests")):
            info = _check_request(r, f"request {i}")
            self._requests[info.seq_id] = info
            self.request_params[info.seq_id] = r.get("params") if isinstance(r.get("params"), dict) else None
        self.bounds = bounds = _trace_bounds(doc, spec)
        frames = _list(doc["frames"], "frames")
        if len(frames) > _session.MAX_EVENTS:  # a live tab keeps this many steps, and the export writes no more
            raise TraceError(f"the trace has {len(frames):,} frames; a lab session keeps at most "
                             f"{_session.MAX_EVENTS:,} steps")
        self._events: list[StepEvent] = []
        self._views: list[dict] = []
        # Each step's KV blocks stay as the document holds them (packed columns, or v1's list) and become dicts
        # only for the frame shown (the KV charts read the newest event's blocks alone): 400 steps of a 700-block
        # pool are 280,000 dicts (~100 MB) otherwise. _blocks_shown is the event that holds them now.
        self._raw_blocks: list[Any] = []
        self._blocks_shown: StepEvent | None = None
        captured: deque[StepEvent] = deque()  # the events that still hold attention, oldest first
        capture_bytes = 0
        for i, frame in enumerate(frames):
            where = f"frame {i} of the trace"
            if not isinstance(frame, dict) or not isinstance(frame.get("event"), dict) or \
                    not isinstance(frame.get("view"), dict):
                raise TraceError(f"{where} is damaged (it needs an event and a view object)")
            try:
                raw = frame["event"]
                _check_step_bounds(raw, bounds)  # counts only: nothing decoded yet
                event = _decode({k: v for k, v in raw.items() if k != "blocks"})
                event["blocks"] = []
                _check_record(event, StepEvent, "event")
                _check_step_sizes(event, bounds)
                for j, s in enumerate(event.get("seqs") or []):
                    if s.get("capture") is not None:
                        _check_capture(s["capture"], f"event.seqs[{j}].capture", self._num_layers, self._num_heads)
                self._raw_blocks.append(_check_blocks(raw.get("blocks"), bounds["num_blocks"]))
                ev = StepEvent.from_dict(event)
                self._events.append(ev)
                self._views.append(self._check_view(_decode(frame["view"])))
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                raise TraceError(f"{where} is damaged ({_why(exc)})") from None
            # a live tab's capture budget (LabSession._keep_capture_budget): the oldest steps lose their attention
            held = ev.capture_nbytes()
            capture_bytes += held
            if held:
                captured.append(ev)
            while capture_bytes > _session.SESSION_CAPTURE_BYTES and len(captured) > 1:
                capture_bytes -= captured.popleft().drop_captures()
        self.capture_bytes = capture_bytes

    def _check_view(self, view: dict) -> dict:
        seqs = {}
        if not isinstance(view.get("seqs"), dict):
            raise ValueError("view.seqs must be an object")
        for sid, s in view["seqs"].items():
            if not isinstance(s, dict) or not _int_key(sid):
                raise ValueError("view.seqs must map sequence ids to objects")
            ids = s.get("token_ids")
            if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                raise ValueError("view.seqs[].token_ids must be a list of integers")
            missing = [t for t in ids if str(t) not in self._vocab]
            if missing:
                raise ValueError(f"token {missing[0]} is not in the trace's vocab")
            if not _is_int(s.get("prompt_len"), 0, len(ids)) or not isinstance(s.get("status"), str):
                raise ValueError("view.seqs[] needs prompt_len (0..len(token_ids)) and status")
            seqs[int(sid)] = {"token_ids": ids, "prompt_len": s["prompt_len"], "status": s["status"]}
        focus, what_if = view.get("focus"), view.get("what_if")
        if focus is not None and not _is_int(focus, 0, MAX_POSITION):
            raise ValueError("view.focus must be a sequence id or null")
        if what_if is not None:
            _check_record(what_if, SamplingTrace, "view.what_if")
            what_if = SamplingTrace.from_dict(what_if)
        return {"focus": focus, "seqs": seqs, "what_if": what_if}

    # ---- the cursor -------------------------------------------------------------------------------
    @property
    def num_frames(self) -> int:
        return len(self._events)

    @property
    def position(self) -> int:
        """Frames shown so far (0 .. num_frames)."""
        return self._pos

    @property
    def at_end(self) -> bool:
        return self._pos >= len(self._events)

    def step(self) -> StepEvent | None:
        """Show the next frame and return its event; None at the end."""
        with self.lock:
            self.last_used = time.time()
            if self.at_end:
                return None
            self._apply(self._pos + 1)
            return self._events[self._pos - 1]

    def seek(self, position: int) -> None:
        """Show the first `position` frames (clamped to 0 .. num_frames)."""
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
            raise ValueError(f"position must be a whole number of frames (got {position!r})")
        with self.lock:
            self.last_used = time.time()
            self._apply(max(0, min(int(position), len(self._events))))

    def reset(self) -> None:
        """Back to before the first frame; forgets a chosen focus."""
        with self.lock:
            self._chosen = None
            self.seek(0)

    def has_unfinished(self) -> bool:
        return not self.at_end

    def run_steps(self):
        """Run on a replay: its recorded frames one by one, until `pause()` or the end (there is no engine to
        run ahead: each item shows the next frame)."""
        self.running = True
        try:
            while self.running and self.step() is not None:
                yield
        finally:
            self.running = False

    def pause(self) -> None:
        self.running = False

    def wait_info(self) -> None:
        """A replay shows what was recorded: no live queue to wait in."""
        return None

    def close(self) -> None:
        pass

    def _apply(self, pos: int) -> None:
        self._show_blocks(pos - 1)
        self._pos = pos
        view = self._views[pos - 1] if pos > 0 else {"focus": None, "seqs": {}, "what_if": None}
        self._seqs = view["seqs"]
        self.events = self._events[:pos]
        self.what_if = view["what_if"]
        self._focus = self._chosen if self._chosen in self._seqs else view["focus"]

    def _show_blocks(self, index: int) -> None:
        """The KV blocks of frame `index` as dicts on its event (the KV charts read the newest shown event's);
        the event that held them before gives them back."""
        ev = self._events[index] if 0 <= index < len(self._events) else None
        if ev is self._blocks_shown:
            return
        if self._blocks_shown is not None:
            self._blocks_shown.blocks = []
        if ev is not None:
            raw = self._raw_blocks[index]
            ev.blocks = _block_dicts(*raw) if isinstance(raw, tuple) else [dict(b) for b in raw]
        self._blocks_shown = ev

    # ---- the LabView protocol -----------------------------------------------------------------------
    @property
    def focus(self) -> int | None:
        return self._focus

    @focus.setter
    def focus(self, seq_id: int | None) -> None:
        if seq_id is not None and seq_id not in self._seqs:
            raise Refusal("replay_no_seq", sid=seq_id)
        self._chosen = self._focus = seq_id

    @property
    def requests(self) -> dict[int, RequestInfo]:
        return {sid: r for sid, r in self._requests.items() if sid in self._seqs}

    @property
    def model_id(self) -> str:
        return self.model["id"]

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def num_heads(self) -> int:
        return self._num_heads

    def seq_ids(self) -> list[int]:
        return sorted(self.requests)

    def has_seq(self, seq_id: int) -> bool:
        return seq_id in self._seqs and seq_id in self._requests

    def _seq(self, seq_id: int) -> dict:
        if seq_id not in self._seqs:
            raise Refusal("replay_no_seq", sid=seq_id)
        return self._seqs[seq_id]

    def seq_token_ids(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id)["token_ids"])

    def prompt_len(self, seq_id: int) -> int:
        return self._seq(seq_id)["prompt_len"]

    def seq_status(self, seq_id: int) -> str:
        return self._seq(seq_id)["status"]

    def token_texts(self, seq_id: int) -> list[str]:
        return [self._vocab[str(t)]["text"] for t in self._seq(seq_id)["token_ids"]]

    def token_infos(self, seq_id: int) -> list[dict]:
        return [dict(self._vocab[str(t)]) for t in self._seq(seq_id)["token_ids"]]

    def bpe(self, word: str) -> list[dict]:
        entry = self._bpe.get(word)
        if entry is None:
            known = ", ".join(f"«{w}»" for w in list(self._bpe)[:12])
            raise Refusal("replay_no_word", word=word, known=known or Phrase("replay_no_words"))
        if isinstance(entry, dict):
            raise ValueError(str(entry.get("error", "no BPE trace for this word")))
        return entry

    def nearest(self, token_id: int, k: int = 10) -> list[tuple[int, str, float]]:
        """The neighbours recorded at export (NEIGHBOURS_K of them); [] for an id the trace never saw."""
        rows = self._neighbours.get(str(int(token_id))) or []
        return [(int(i), str(text), float(c)) for i, text, c in rows[:k]]

    def last_seq_event(self, seq_id: int, with_sampling: bool = True):
        return last_seq_event(self.events, seq_id, with_sampling)

    def info(self) -> dict:
        """A summary for the page: model, creation time, frames, and the requests with their parameters."""
        dropped = self.doc.get("frames_dropped")
        return {"model_id": self.model_id, "created": self.created, "num_frames": self.num_frames,
                "position": self._pos, "frames_dropped": dropped if _is_int(dropped, 0, _MAX_INT) else 0,
                "requests": [{"seq_id": sid, "prompt": r.prompt, "params": self.request_params.get(sid)}
                             for sid, r in sorted(self._requests.items())]}

    # ---- what a replay cannot do --------------------------------------------------------------------
    @property
    def engine(self):
        raise _read_only("action")

    def add_request(self, *args, **kwargs):
        raise _read_only("request")

    def updated_params(self, *args, **kwargs):
        raise _read_only("params")

    def compute_what_if(self, *args, **kwargs):
        raise _read_only("what_if")

    def force_token(self, *args, **kwargs):
        raise _read_only("force")

    def rewind(self, *args, **kwargs):
        raise _read_only("rewind")

    def branch(self, *args, **kwargs):
        raise _read_only("branch")


def _read_only(what: str) -> Refusal:
    """What a replay cannot do: it has no model (i18n "replay_what.<what>" names the action)."""
    return Refusal("replay_read_only", what=Phrase(f"replay_what.{what}"))


def _list(v: Any, name: str) -> list:
    if not isinstance(v, list):
        raise TraceError(f"the trace's {name!r} must be a list")
    return v


def _obj(v: Any, name: str) -> dict:
    if not isinstance(v, dict):
        raise TraceError(f"the trace's {name!r} must be an object")
    return v


def _why(exc: Exception) -> str:
    return f"missing {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:200]


# ---- checks of a loaded document ----------------------------------------------------------------------
# What the replay and its charts read is checked once at load, so that a trace a stranger wrote gives one
# TraceError line instead of an exception later (render.py still draws a replay's charts one by one).

_MAX_INT = 1 << 53  # integers a JSON number holds exactly
_VOCAB_FIELDS = {"id": int, "piece": str, "text": str, "bytes_hex": str, "special": bool, "byte_fallback": bool,
                 "partial_utf8": bool}
# SeqEvent counts that index positions: the charts build ranges from them
_COUNTS = ("chunk_start", "num_processed", "num_cached_tokens", "prompt_len", "num_tokens")


def _is_int(v: Any, lo: int = -_MAX_INT, hi: int = _MAX_INT) -> bool:
    return type(v) is int and lo <= v <= hi


def _int_key(k: Any) -> bool:
    """A JSON object key that to_dict() wrote from an int (sequence ids, layers)."""
    return isinstance(k, str) and 0 < len(k) <= 16 and k.lstrip("-").isdigit()


def _check_vocab(vocab: dict) -> dict:
    for key, info in vocab.items():
        if not _int_key(key) or not isinstance(info, dict) or \
                not all(isinstance(info.get(f), t) and (t is not int or _is_int(info[f]))
                        for f, t in _VOCAB_FIELDS.items()):
            raise TraceError(f"the trace's vocab entry {str(key)[:20]!r} is damaged (it needs "
                             f"{', '.join(_VOCAB_FIELDS)})")
    return vocab


def _check_neighbours(neighbours: dict) -> dict:
    for key, rows in neighbours.items():
        if not _int_key(key) or not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 3 and _is_int(r[0]) and isinstance(r[1], str)
                and isinstance(r[2], (int, float)) and not isinstance(r[2], bool) for r in rows):
            raise TraceError(f"the trace's neighbours of token {str(key)[:20]!r} are damaged "
                             "(each must be [id, text, cosine])")
    return neighbours


def _check_bpe(bpe: dict) -> dict:
    for word, entry in bpe.items():
        ok = (isinstance(entry, list) and all(isinstance(x, dict) for x in entry)) or \
            (isinstance(entry, dict) and isinstance(entry.get("error"), str))
        if not ok:
            raise TraceError(f"the trace's BPE record of {str(word)[:40]!r} is damaged")
    return bpe


def _check_request(r: Any, where: str) -> RequestInfo:
    def bad(what: str) -> TraceError:
        return TraceError(f"{where} of the trace is damaged ({what})")
    if not isinstance(r, dict):
        raise bad("not an object")
    for key, kind in (("seq_id", int), ("prompt", str), ("chat", bool), ("text", str), ("spans", list),
                      ("token_ids", list)):
        if not isinstance(r.get(key), kind) or (kind is int and not _is_int(r[key], 0, MAX_POSITION)):
            raise bad(f"{key} must be {kind.__name__}" if key in r else f"missing {key!r}")
    if r.get("system") is not None and not isinstance(r["system"], str):
        raise bad("system must be text or null")
    if not all(_is_int(t, 0, _MAX_INT) for t in r["token_ids"]):
        raise bad("token_ids must be token ids")
    if not all(isinstance(sp, dict) and _is_int(sp.get("start"), 0, _MAX_INT) and _is_int(sp.get("end"), 0, _MAX_INT)
               for sp in r["spans"]):
        raise bad("spans must be objects with integer start and end")
    return RequestInfo(r["seq_id"], r["prompt"], r["chat"], r.get("system"), r["text"], list(r["spans"]),
                       list(r["token_ids"]))


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _check_record(d: Any, cls: type, path: str) -> None:
    """Every field of `d` that dataclass `cls` declares has the declared type (missing ones are reported by
    from_dict); nested records (SeqEvent, CaptureData, SamplingTrace, SpecRound, ...) are checked the same way."""
    if not isinstance(d, dict):
        raise ValueError(f"{path} must be an object")
    hints = _hints(cls)
    for f in fields(cls):
        if f.name in d:
            _check_value(d[f.name], hints[f.name], f"{path}.{f.name}")
    if cls is SeqEvent:
        for name in _COUNTS:
            if name in d and not _is_int(d[name], 0, MAX_POSITION):
                raise ValueError(f"{path}.{name} must be 0..{MAX_POSITION}")


def _check_value(v: Any, hint: Any, path: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise ValueError(f"{path}: unsupported field type {hint}")
        return _check_value(v, rest[0], path)
    if is_dataclass(hint):
        return _check_record(v, hint, path)
    kind = origin or hint
    ok = {int: lambda: _is_int(v), float: lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda: isinstance(v, str), bool: lambda: isinstance(v, bool), list: lambda: isinstance(v, list),
          dict: lambda: isinstance(v, dict),
          # a fixed-length row such as a CDF entry (token id, cumulative probability): a JSON list
          tuple: lambda: isinstance(v, list) and len(v) == len(args)}.get(kind)
    if ok is None:
        raise ValueError(f"{path}: unsupported field type {hint}")
    if not ok():
        raise ValueError(f"{path} must be {_describe(hint)}")
    if kind is list and args:
        for i, x in enumerate(v):
            _check_value(x, args[0], f"{path}[{i}]")
    if kind is tuple:
        for i, (x, hint_i) in enumerate(zip(v, args)):
            _check_value(x, hint_i, f"{path}[{i}]")
    if kind is dict and args:
        for k, x in v.items():
            if args[0] is int and not _int_key(k):
                raise ValueError(f"{path} keys must be integers")
            _check_value(x, args[1], f"{path}[{k!r:.20}]")


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args:
        return f"a list of {_describe(args[0])}s"
    if origin is tuple:
        return f"a list of {len(args)} values"
    names = {int: "an integer", float: "a number", str: "text", bool: "true/false", list: "a list", dict: "an object"}
    return names.get(origin or hint, getattr(hint, "__name__", str(hint)))


def _check_capture(c: dict, path: str, num_layers: int, num_heads: int) -> None:
    """Shapes that agree with each other and with the positions: what the attention, lens and PCA charts index."""
    positions = c.get("positions", [])
    if not all(0 <= p < MAX_POSITION for p in positions):
        raise ValueError(f"{path}.positions must be 0..{MAX_POSITION}")
    for name in ("attention_positions", "lens_positions", "attention_heads"):
        if not all(0 <= p < MAX_POSITION for p in c.get(name) or ()):
            raise ValueError(f"{path}.{name} must be 0..{MAX_POSITION}")
    rows = c.get("attention_positions")
    rows = positions if rows is None else rows
    heads = c.get("attention_heads")
    if heads is not None and not all(h < num_heads for h in heads):
        raise ValueError(f"{path}.attention_heads must be heads of the model")
    width = None
    for key, a in (c.get("attention") or {}).items():
        where = f"{path}.attention[{key!r:.20}]"
        if not _int_key(key) or not 0 <= int(key) < num_layers:
            raise ValueError(f"{where}: layer keys must be layers of the model")
        _array(a, where, 3, np.floating)
        h, n, ctx = a.shape
        if width not in (None, h) or not 1 <= h <= num_heads or (heads is not None and h != len(heads)):
            raise ValueError(f"{where} has {h} heads")
        width = h
        if n != len(rows) or (rows and ctx < max(rows) + 1):
            raise ValueError(f"{where} has shape {list(a.shape)}; its rows are positions {rows[:1]}..{rows[-1:]}")
    lens = [c.get("lens_ids"), c.get("lens_probs")]
    if any(x is not None for x in lens):
        _array(lens[0], f"{path}.lens_ids", 3, np.integer)
        _array(lens[1], f"{path}.lens_probs", 3, np.floating)
        L, P, k = lens[1].shape
        tokens = c.get("lens_tokens")
        if lens[0].shape != lens[1].shape or P != len(c.get("lens_positions") or []) or (tokens is not None and (
                len(tokens) != L or not all(isinstance(r, list) and len(r) == P and all(
                    isinstance(t, list) and len(t) == k and all(isinstance(x, str) for x in t) for t in r)
                    for r in tokens))):
            raise ValueError(f"{path}: the logit lens's arrays, tokens and positions disagree")
    norms, emb = c.get("residual_norms"), c.get("embeddings")
    if norms is not None:
        _array(norms, f"{path}.residual_norms", 2, np.floating)
        if norms.shape[1] != len(positions):
            raise ValueError(f"{path}.residual_norms has shape {list(norms.shape)}")
    if emb is not None:
        _array(emb, f"{path}.embeddings", 2, np.floating)
        if emb.shape[0] != len(positions):
            raise ValueError(f"{path}.embeddings has shape {list(emb.shape)}")


def _trace_bounds(doc: dict, spec: dict) -> dict:
    """What the engine that wrote the trace could have had: its "engine" record (checked against the absolute
    caps), else the caps themselves and the model's context (traces written before the record)."""
    context = spec.get("max_position")
    context = context if _is_int(context, 1, MAX_POSITION) else MAX_POSITION
    caps = {"num_blocks": MAX_TRACE_POOL_BLOCKS, "block_size": MAX_TRACE_BLOCK_SIZE, "max_num_seqs": MAX_TRACE_SEQS,
            "max_num_batched_tokens": MAX_POSITION, "max_model_len": context}
    record = doc.get("engine")
    if record is None:
        return caps
    if not isinstance(record, dict):
        raise TraceError("the trace's engine record must be an object")
    out = {}
    for key, cap in caps.items():
        v = record.get(key)
        if not _is_int(v, 1, cap):
            raise TraceError(f"the trace's engine record is damaged ({key} must be 1..{cap:,}, got {str(v)[:20]})")
        out[key] = v
    return out


def _check_step_bounds(raw: dict, bounds: dict) -> None:
    """A frame's counts within what its engine could hold, from the undecoded event (a packed step's block count
    is read, not its columns)."""
    blocks = raw.get("blocks")
    n = blocks.get("__blocks__") if isinstance(blocks, dict) else len(blocks) if isinstance(blocks, list) else None
    if _is_int(n) and n > bounds["num_blocks"]:
        raise ValueError(f"the step holds {n:,} KV blocks; the trace's engine had at most {bounds['num_blocks']:,}")
    for name in ("seqs", "batch", "running"):
        v = raw.get(name)
        if isinstance(v, list) and len(v) > bounds["max_num_seqs"]:
            raise ValueError(f"the step runs {len(v):,} sequences ({name}); the trace's engine ran at most "
                             f"{bounds['max_num_seqs']:,}")


def _check_step_sizes(event: dict, bounds: dict) -> None:
    """Positions within the engine's context, and a step's tokens within what its batch could hold."""
    context = bounds["max_model_len"]
    for j, s in enumerate(event.get("seqs") or []):
        for name in ("prompt_len", "num_tokens"):
            if _is_int(s.get(name)) and s[name] > context:
                raise ValueError(f"event.seqs[{j}].{name} is {s[name]:,}, past the model's context of {context:,}")
    tokens = (event.get("cost") or {}).get("tokens")
    if _is_int(tokens) and tokens > bounds["max_num_seqs"] * context:
        raise ValueError(f"the step computed {tokens:,} tokens, more than its engine could batch")


def _check_blocks(raw: Any, max_blocks: int) -> Any:
    """A step's blocks checked as the document holds them: packed columns -> (columns, states), decoded without
    a dict per block; a version-1 list of block objects -> that list (already parsed)."""
    if isinstance(raw, dict) and "__blocks__" in raw:
        return _block_columns(raw, max_blocks)
    _check_value(raw, list[dict], "event.blocks")
    return raw


def _array(a: Any, where: str, ndim: int, kind: type) -> None:
    if not isinstance(a, np.ndarray) or a.ndim != ndim or not np.issubdtype(a.dtype, kind):
        raise ValueError(f"{where} must be a {ndim}-D packed array of {kind.__name__}s")
