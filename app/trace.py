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
import gzip
import json
import math
import os
import threading
import time
import zlib
from dataclasses import asdict, fields, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.events import EVENT_VERSION, CaptureData, StepEvent
from engine.tokenizer import token_info

from .render import _default_word, prompt_words
from .session import LabSession, RequestInfo, last_seq_event

FORMAT = "inferlab-trace"
VERSION = 1
NEIGHBOURS_K = 10  # what the neighbours chart shows
MAX_BPE_WORDS = 200  # BPE traces recorded per trace (every word of every prompt, up to this many)
MAX_TRACE_BYTES = 1 << 30  # refuse larger documents (a gzip bomb would otherwise fill memory)
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
    """The session as a trace document (plain JSON types; `dumps_trace` writes it).

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
        for i, ev in enumerate(lab.events):
            last = i == len(lab.events) - 1
            view = dict(now_view if last else lab.views.get(ev.step, now_view))
            if last:
                view["what_if"] = lab.what_if
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
        return {
            "format": FORMAT,
            "version": VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "event_version": EVENT_VERSION,
            "attention_encoding": attention,
            "model": {"id": eng.model_id, "device": eng.device, "spec": _encode(asdict(eng.spec), attention)},
            "requests": requests,
            "frames": frames,
            "vocab": vocab,
            "neighbours": neighbours,
            "bpe": _encode(bpe, attention),
        }


def dumps_trace(doc: dict) -> str:
    """Strict JSON (no NaN/Infinity), UTF-8 text kept readable (Russian prompts stay Russian)."""
    return json.dumps(doc, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def trace_bytes(doc: dict, compress: bool = True) -> bytes:
    """The trace as a file's bytes; gzip (mtime 0, so equal traces give equal files) shrinks it ~3-4x."""
    data = dumps_trace(doc).encode("utf-8")
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


def _unpack(d: dict) -> np.ndarray:
    code, shape = d.get("__ndarray__"), d.get("shape")
    if code not in _DTYPES:
        raise ValueError(f"unknown array encoding {code!r}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError("an array has a malformed shape")
    try:
        raw = base64.b64decode(d.get("data", ""), validate=True)
    except (TypeError, ValueError):
        raise ValueError("an array's data is not base64") from None
    dtype = np.dtype(_DTYPES[code])
    if len(raw) != dtype.itemsize * math.prod(shape):
        need = dtype.itemsize * math.prod(shape)
        raise ValueError(f"an array holds {len(raw)} bytes, its shape {shape} needs {need}")
    a = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if code == "p16":
        return np.square(a.astype(np.float64) / P16_SCALE).astype(np.float32)
    return a.astype(np.float32 if code == "f32" else np.int64)  # a writeable copy in native byte order


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if "__ndarray__" in v:
            return _unpack(v)
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
    """The trace document from text/bytes/path, with its format and version checked."""
    if isinstance(data, os.PathLike):
        try:
            with open(data, "rb") as fh:
                data = fh.read(MAX_TRACE_BYTES + 1)
        except OSError as exc:
            raise TraceError(f"cannot read the trace file: {exc.strerror or exc}") from None
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data)
        if data[:2] == b"\x1f\x8b":
            data = _gunzip(data)
        if len(data) > MAX_TRACE_BYTES:
            raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES >> 20} MiB")
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise TraceError("not an InferLab trace: the file is neither JSON text nor gzip") from None
    if not isinstance(data, str):
        raise TraceError(f"not an InferLab trace: expected text, bytes or a path, got {type(data).__name__}")
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES >> 20} MiB")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not an InferLab trace: the file is not JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise TraceError("not an InferLab trace: the JSON is nested too deeply") from None
    return check_trace(doc)


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
    out = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        text = out.decompress(data, MAX_TRACE_BYTES + 1)
    except zlib.error:
        raise TraceError("the trace's gzip data is damaged") from None
    if len(text) > MAX_TRACE_BYTES or out.unconsumed_tail:
        raise TraceError(f"the trace is larger than {MAX_TRACE_BYTES >> 20} MiB once unpacked")
    if not out.eof:
        raise TraceError("the trace's gzip data is damaged or cut short")
    return text


# ---- replay -------------------------------------------------------------------------------------------

_READ_ONLY = "this is a replayed trace (no model loaded): {what} needs a live session"


class ReplaySession:
    """A read-only lab session over a trace's frames; implements the LabView protocol (app/session.py).

    The cursor is the number of frames shown: 0 (reset) shows nothing, num_frames shows the whole trace.
    `focus` may be set to any sequence that exists at the cursor; it sticks while that sequence exists.
    """

    def __init__(self, doc: dict):
        doc = check_trace(doc)
        self.doc = doc
        self.created = doc.get("created")
        try:
            model = doc["model"]
            self.model = {"id": str(model["id"]), "device": model.get("device"), "spec": dict(model["spec"])}
            self._num_layers = int(self.model["spec"]["num_layers"])
            self._num_heads = int(self.model["spec"]["num_heads"])
        except (KeyError, TypeError, ValueError):
            raise TraceError("the trace's model record is damaged "
                             "(it needs id and spec.num_layers/num_heads)") from None
        self._requests = {}
        for i, r in enumerate(_list(doc["requests"], "requests")):
            try:
                info = RequestInfo(int(r["seq_id"]), str(r["prompt"]), bool(r["chat"]), r.get("system"),
                                   str(r["text"]), list(r["spans"]), [int(t) for t in r["token_ids"]])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TraceError(f"request {i} of the trace is damaged ({_why(exc)})") from None
            self._requests[info.seq_id] = info
        self.request_params = {int(r["seq_id"]): r.get("params") for r in doc["requests"]}
        self._vocab = _obj(doc["vocab"], "vocab")
        self._neighbours = _obj(doc["neighbours"], "neighbours")
        self._bpe = _obj(doc["bpe"], "bpe")
        self._events: list[StepEvent] = []
        self._views: list[dict] = []
        for i, frame in enumerate(_list(doc["frames"], "frames")):
            try:
                self._events.append(StepEvent.from_dict(_decode(frame["event"])))
                self._views.append(self._check_view(_decode(frame["view"])))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TraceError(f"frame {i} of the trace is damaged ({_why(exc)})") from None
        # the attributes a UI handler touches on a live session
        self.lock = threading.RLock()
        self.sent_html: dict = {}
        self.sent_figs: dict = {}
        self.running = False
        self.last_used = time.time()
        self._chosen: int | None = None
        self.seek(0)

    def _check_view(self, view: dict) -> dict:
        seqs = {}
        for sid, s in view["seqs"].items():
            ids = [int(t) for t in s["token_ids"]]
            missing = [t for t in ids if str(t) not in self._vocab]
            if missing:
                raise ValueError(f"token {missing[0]} is not in the trace's vocab")
            seqs[int(sid)] = {"token_ids": ids, "prompt_len": int(s["prompt_len"]), "status": str(s["status"])}
        focus = view.get("focus")
        return {"focus": None if focus is None else int(focus), "seqs": seqs, "what_if": view.get("what_if")}

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

    def close(self) -> None:
        pass

    def _apply(self, pos: int) -> None:
        self._pos = pos
        view = self._views[pos - 1] if pos > 0 else {"focus": None, "seqs": {}, "what_if": None}
        self._seqs = view["seqs"]
        self.events = self._events[:pos]
        self.what_if = view["what_if"]
        self._focus = self._chosen if self._chosen in self._seqs else view["focus"]

    # ---- the LabView protocol -----------------------------------------------------------------------
    @property
    def focus(self) -> int | None:
        return self._focus

    @focus.setter
    def focus(self, seq_id: int | None) -> None:
        if seq_id is not None and seq_id not in self._seqs:
            raise ValueError(f"sequence #{seq_id} does not exist at this point of the trace")
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
            raise ValueError(f"sequence #{seq_id} does not exist at this point of the trace")
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
            raise ValueError(f"«{word}» was not recorded in this trace (a replay has no tokenizer); "
                             f"recorded words: {known or 'none'}")
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
        return {"model_id": self.model_id, "created": self.created, "num_frames": self.num_frames,
                "position": self._pos,
                "requests": [{"seq_id": sid, "prompt": r.prompt, "params": self.request_params.get(sid)}
                             for sid, r in sorted(self._requests.items())]}

    # ---- what a replay cannot do --------------------------------------------------------------------
    @property
    def engine(self):
        raise ValueError(_READ_ONLY.format(what="this action (what-if, force, rewind, a new request)"))

    def add_request(self, *args, **kwargs):
        raise ValueError(_READ_ONLY.format(what="a new request"))

    def updated_params(self, *args, **kwargs):
        raise ValueError(_READ_ONLY.format(what="changing sampling parameters"))

    def compute_what_if(self, *args, **kwargs):
        raise ValueError(_READ_ONLY.format(what="a what-if"))

    def force_token(self, *args, **kwargs):
        raise ValueError(_READ_ONLY.format(what="forcing a token"))

    def rewind(self, *args, **kwargs):
        raise ValueError(_READ_ONLY.format(what="rewinding"))

    def branch(self, *args, **kwargs):
        raise ValueError(_READ_ONLY.format(what="branching"))


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
