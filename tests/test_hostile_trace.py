"""Traces uploaded by strangers (issue 11): limits on bytes, values and nesting, and one TraceError line for
every malformed document, never another exception and never an allocation the data does not justify.

The bad traces are mutations of one real small exported trace (a lab session, the lab's capture budget).
"""
import base64
import gzip
import json
import tracemalloc
import typing

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app import render
from app import session as S
from app import trace as T
from app.session import LabSession
from app.trace import TraceError, export_trace, load_trace
from engine import Capture, SamplingParams
from engine.events import CaptureData, SeqEvent, StepEvent
from engine.model import ATTENTION_BUDGET
from engine.records import dumps

FUZZ = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MACHINE = {"bandwidth": 20e9, "peak_flops": 100e9}


@pytest.fixture(scope="module")
def good(base_engine):
    """A real exported trace: a chat prompt, 5 steps, the lab's capture; (doc, its JSON text)."""
    lab = LabSession.create(base_engine, kv_memory=8 * 2**20)
    lab.engine.instrument = Capture(lens_top_k=5, lens_max_positions=16, max_attention_bytes=ATTENTION_BUDGET)
    lab.add_request("Что такое гравитация?", SamplingParams(max_tokens=8, temperature=0.7, seed=3), True, None)
    for _ in range(5):
        lab.step()
    doc = export_trace(lab)
    return doc, dumps(doc)


def fresh(good):
    return json.loads(good[1])


def refused(data) -> str:
    with pytest.raises(TraceError) as err:
        load_trace(data)
    msg = str(err.value)
    assert msg and "\n" not in msg and len(msg) < 400, msg
    return msg


def still_loads(good):
    replay = load_trace(good[1])
    replay.seek(replay.num_frames)
    assert render.build_payload(replay, "en", 3, 2, "", None, MACHINE)["figs"]


# ---- where a wrong value must be refused ---------------------------------------------------------------

def kind(v) -> str:
    return {type(None): "null", bool: "bool", int: "int", float: "float", str: "str", list: "list",
            dict: "dict"}[type(v)]


def allowed(hint) -> set[str]:
    """The JSON kinds a dataclass field of type `hint` accepts (an array field: only a packed array)."""
    if hint is typing.Any:
        return {"dict"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return {"null"} | allowed(rest[0])
    base = origin or hint
    if base is float:
        return {"int", "float"}
    if hasattr(base, "__dataclass_fields__"):
        return {"dict"}
    return {{int: "int", str: "str", bool: "bool", list: "list", dict: "dict"}[base]}


def slots(doc) -> list[tuple[list, set[str]]]:
    """(path, kinds that are right there) for every place the loader reads; any other kind must be refused."""
    out = [(["format"], set()), (["version"], set()), (["model"], {"dict"}), (["model", "spec"], {"dict"}),
           (["model", "spec", "num_layers"], set()), (["requests"], {"list"}), (["frames"], {"list"}),
           (["vocab"], {"dict"}), (["neighbours"], {"dict"}), (["bpe"], {"dict"})]
    for i, r in enumerate(doc["requests"]):
        out += [(["requests", i, k], {kind(r[k])}) for k in ("seq_id", "prompt", "chat", "text", "spans", "token_ids")]
        out.append((["requests", i, "system"], {"null", "str"}))
    tok = next(iter(doc["vocab"]))
    out += [(["vocab", tok, k], {kind(v)}) for k, v in doc["vocab"][tok].items()]
    out += [(["neighbours", next(iter(doc["neighbours"]))], {"list"})]
    hints = {c: typing.get_type_hints(c) for c in (StepEvent, SeqEvent, CaptureData)}
    for i, frame in enumerate(doc["frames"]):
        ev = frame["event"]
        out += [(["frames", i, "event", k], allowed(hints[StepEvent][k])) for k in ev if k in hints[StepEvent]]
        out += [(["frames", i, "view", "seqs"], {"dict"}), (["frames", i, "view", "focus"], {"null", "int"})]
        for j, s in enumerate(ev["seqs"]):
            base = ["frames", i, "event", "seqs", j]
            out += [(base + [k], allowed(hints[SeqEvent][k])) for k in s if k in hints[SeqEvent]]
            if s.get("capture"):
                out += [(base + ["capture", k], allowed(hints[CaptureData][k]) | ({"null"} if k in (
                    "residual_norms", "embeddings") else set())) for k in s["capture"]]
    return out


def put(doc, path, value):
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


class TestMutations:
    @settings(FUZZ, max_examples=60)
    @given(data=st.data())
    def test_a_wrong_kind_of_value_where_the_loader_reads_is_refused(self, good, data):
        doc = fresh(good)
        table = slots(doc)
        path, ok = data.draw(st.sampled_from(table))
        value = data.draw(json_values)
        assume(kind(value) not in ok or path[-1] in ("format", "version", "num_layers"))
        if path[-1] == "format":
            assume(value != T.FORMAT)
        if path[-1] in ("version", "num_layers"):
            assume(not (type(value) is int and 1 <= value <= (T.VERSION if path[-1] == "version" else 4096)))
        put(doc, path, value)
        refused(dumps(doc))

    @settings(FUZZ, max_examples=30)
    @given(data=st.data())
    def test_a_dropped_field_is_refused(self, good, data):
        doc = fresh(good)
        frame = data.draw(st.integers(0, len(doc["frames"]) - 1))
        required = {"": T._REQUIRED + ("format",),
                    "event": [f for f in ("step", "seqs", "admitted", "preempted", "finished", "waiting", "running",
                                          "kv", "blocks", "block_tables", "timing", "cost")],
                    "seq": ["seq_id", "phase", "chunk_start", "num_processed", "processed_ids", "num_cached_tokens",
                            "prompt_len", "num_tokens"],
                    "capture": ["positions"], "view": ["seqs"]}
        where = data.draw(st.sampled_from(sorted(required)))
        key = data.draw(st.sampled_from(required[where]))
        node = {"": doc, "event": doc["frames"][frame]["event"], "seq": doc["frames"][frame]["event"]["seqs"][0],
                "capture": doc["frames"][frame]["event"]["seqs"][0]["capture"],
                "view": doc["frames"][frame]["view"]}[where]
        del node[key]
        refused(dumps(doc))

    @settings(FUZZ, max_examples=50)
    @given(data=st.data())
    def test_a_damaged_array_is_refused(self, good, data):
        doc = fresh(good)
        arrays = []

        def walk(v):
            if isinstance(v, dict):
                if "__ndarray__" in v:
                    arrays.append(v)
                else:
                    for x in v.values():
                        walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)
        walk(doc["frames"])
        a = data.draw(st.sampled_from(arrays))
        how = data.draw(st.sampled_from(["base64", "cut", "shape+1", "extra dim", "negative", "float dim", "huge",
                                         "huge float", "code", "swap int/float", "no data", "data not text"]))
        shape = a["shape"]
        if how == "base64":
            a["data"] = "!!" + a["data"][2:]
        elif how == "cut":
            a["data"] = a["data"][: len(a["data"]) // 2]
        elif how == "shape+1":
            a["shape"] = shape[:-1] + [shape[-1] + 1] if shape else [1]
        elif how == "extra dim":
            a["shape"] = shape + [2]
        elif how == "negative":
            a["shape"] = [-1] + shape[1:]
        elif how == "float dim":
            a["shape"] = [float(n) + 0.5 for n in shape] or [0.5]
        elif how == "huge":
            a["shape"] = [10**9, 10**9]
        elif how == "huge float":
            a["shape"] = [1e12]
        elif how == "code":
            a["__ndarray__"] = data.draw(st.sampled_from(["f16", "", "P16", "object"]))
        elif how == "swap int/float":  # same item size, a well-formed array of the wrong kind
            assume(a["__ndarray__"] in ("f32", "i32"))
            a["__ndarray__"] = "i32" if a["__ndarray__"] == "f32" else "f32"
        elif how == "no data":
            del a["data"]
            assume(shape and np.prod(shape) > 0)
        else:
            a["data"] = [1, 2, 3]
        refused(dumps(doc))

    @settings(FUZZ, max_examples=30)
    @given(data=st.data())
    def test_any_value_anywhere_is_refused_or_drawn(self, good, data):
        """A random value at a random place: either a TraceError line, or the replay loads and every chart
        and HTML piece of its page is built (a value no load check covers costs one chart, not the page)."""
        doc = fresh(good)
        node, path = doc, []
        for _ in range(data.draw(st.integers(1, 7))):
            keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
            keys = [k for k in keys if isinstance(node[k], (dict, list)) or len(path) > 0]
            if not keys:
                break
            key = data.draw(st.sampled_from(keys))
            path.append(key)
            if not isinstance(node[key], (dict, list)):
                break
            node = node[key]
        assume(path)
        put(doc, path, data.draw(json_values))
        try:
            replay = load_trace(dumps(doc))
        except TraceError as exc:
            assert str(exc) and "\n" not in str(exc)
            return
        for pos in (1, replay.num_frames):
            replay.seek(pos)
            for lang in ("en", "ru"):
                out = render.build_payload(replay, lang, 3, 2, "", None, MACHINE)
                assert set(out["figs"]) == set(render.CHART_IDS)


def test_text_level_damage(good):
    text = good[1]
    step = '"step":0'
    assert step in text
    for bad in (text.replace(step, '"step":NaN', 1), text.replace(step, '"step":Infinity', 1),
                text.replace(step, '"step":1e999', 1), text.replace(step, '"step":' + "9" * 5000, 1),
                text[: len(text) // 2], "", "null", "[]", '{"format":"inferlab-trace"}', text.encode("utf-16"),
                b"\x1f\x8b" + b"not gzip at all", gzip.compress(text.encode())[:-20]):
        refused(bad)
    still_loads(good)


def test_wrong_versions(good):
    for version in (T.VERSION + 1, 0, -1, "1", 1.0, True, None, [1]):
        doc = fresh(good)
        doc["version"] = version
        assert "version" in refused(dumps(doc))
    doc = fresh(good)
    doc["frames"][0]["event"]["version"] = 99
    assert "newer" in refused(dumps(doc))


def test_a_version_1_trace_still_loads(good):
    """Before the capture budget and the packed KV blocks: blocks as objects, no budget fields."""
    old = fresh(good)
    old["version"] = 1
    for frame in old["frames"]:
        frame["event"]["blocks"] = T._unpack_blocks(frame["event"]["blocks"])
        for s in frame["event"]["seqs"]:
            for key in ("attention_positions", "attention_budget", "dropped"):
                s["capture"].pop(key)
    assert isinstance(old["frames"][0]["event"]["blocks"][0], dict)
    new, then = load_trace(good[1]), load_trace(dumps(old))
    for pos in range(1, new.num_frames + 1):  # a replay builds the shown frame's block dicts only
        new.seek(pos), then.seek(pos)
        assert new.events[-1].to_dict()["blocks"] == then.events[-1].to_dict()["blocks"] != []
    assert json.dumps(render.build_payload(new, "ru", 3, 2, "", None, MACHINE)) == \
        json.dumps(render.build_payload(then, "ru", 3, 2, "", None, MACHINE))


# ---- one test per limit (each fails on the code before the limits) -------------------------------------

def test_a_gzip_bomb_stops_at_the_limit(good):
    pad = b" " * (100 << 20)  # 100 MiB once unpacked, ~100 KB packed
    bomb = gzip.compress(b'{"format":"inferlab-trace","version":1,"pad":"' + pad + b'"}', 9)
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        msg = refused(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"larger than {T.MAX_TRACE_BYTES >> 20} MiB once unpacked" in msg and T.MAX_TRACE_BYTES == 64 << 20
    assert peak < T.MAX_TRACE_BYTES + (8 << 20)
    still_loads(good)


def test_many_tiny_objects_are_refused_before_parsing(good, monkeypatch):
    tiny = "[" + ",".join(["{}"] * 2_000_000) + "]"  # 6 MB of text, ~130 MB as Python dicts
    assert len(tiny) < T.MAX_TRACE_BYTES

    def no_parse(*args, **kwargs):
        raise AssertionError("json.loads ran on a document over MAX_TRACE_VALUES")

    monkeypatch.setattr(T.json, "loads", no_parse)
    assert "JSON values" in refused(tiny)
    assert "JSON values" in refused(gzip.compress(tiny.encode()))
    monkeypatch.undo()
    still_loads(good)


def test_deep_nesting_is_refused(good):
    for depth in (40, 900, 100_000):  # past MAX_TRACE_DEPTH; under json.loads' own limit; past it
        doc = fresh(good)
        doc["frames"][0]["event"]["kv"]["deep"] = "DEEP"
        text = dumps(doc).replace('"DEEP"', "[" * depth + "]" * depth)
        assert "nested" in refused(text)
    still_loads(good)


def test_a_huge_shape_claim_allocates_nothing():
    data = base64.b64encode(b"\0" * (24 << 20)).decode()  # 32 MB of text that claims 10^12 floats
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="does not fit its shape"):
            T._unpack({"__ndarray__": "f32", "shape": [10**6, 10**6], "data": data})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the claim is refused from the string's length: nothing decoded


def test_unpacking_allocates_what_the_array_needs():
    n = 4 << 20  # 4 Mi attention weights as p16: 8 MB of data, 16 MB as float32
    packed = T._pack(np.random.default_rng(0).random(n, dtype=np.float32), "p16")
    tracemalloc.start()
    try:
        out = T._unpack(packed)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.dtype == np.float32 and out.shape == (n,)
    assert peak < 2 * n + 4 * n + (1 << 20)  # the raw bytes and the result, no float64 temporaries


def test_the_limits_hold_a_real_long_session(good):
    """The limits leave room for real traces. A 400-step session (app/trace.py's comment) measured 42 MiB and
    637,000 values; here the small trace's decode frames, scaled to 400 steps, stay well inside the limits."""
    doc = fresh(good)
    rest_bytes, rest_values = T._size({**doc, "frames": []})
    per = [T._size(f) for f in doc["frames"][1:]]  # decode steps
    steps = 400
    assert rest_values + steps * max(n for _, n in per) < T.MAX_TRACE_VALUES / 2
    # the attention written is bounded by the exporter; the rest of a decode step is a few KB
    assert rest_bytes + steps * max(b for b, _ in per) < T.MAX_TRACE_BYTES - T.MAX_EXPORT_ATTENTION_BYTES


def test_the_export_keeps_the_newest_attention_within_its_bound(good, base_engine, monkeypatch):
    doc = fresh(good)
    sizes = [sum(len(a["data"]) for s in f["event"]["seqs"] if s.get("capture")
                 for a in s["capture"]["attention"].values()) for f in doc["frames"]]
    assert all(sizes)
    replay = load_trace(good[1])
    monkeypatch.setattr(T, "MAX_EXPORT_ATTENTION_BYTES", sum(sizes[-2:]))
    lab = LabSession.create(base_engine, kv_memory=8 * 2**20)
    lab.events = list(replay._events)  # the same events as a live session's: export what the bound allows
    lab.views = {}
    small = T._attention_written(lab.events, "p16")
    assert small == {len(sizes) - 2, len(sizes) - 1}
    stripped = T._without_attention(lab.events[0])
    assert stripped.seqs[0].capture.attention == {} and stripped.seqs[0].capture.dropped == ["attention"]
    assert lab.events[0].seqs[0].capture.attention  # the live event keeps its attention
    again = load_trace(dumps({**doc, "frames": [
        {"event": T._encode(ev if i in small else T._without_attention(ev), "p16"), "view": f["view"]}
        for i, (ev, f) in enumerate(zip(lab.events, doc["frames"]))]}))
    again.seek(again.num_frames)
    figs = render.build_payload(again, "en", 3, 2, "", None, MACHINE)["figs"]
    assert "freed later (capture budget)" in figs["chart-attention"]["layout"]["title"]["text"].replace("<br>", " ")


def test_the_export_leaves_out_the_oldest_frames_past_the_limits(good, monkeypatch):
    doc = fresh(good)
    rest = T._size({**doc, "frames": []})[0]
    newest = sum(T._size(f)[0] + 1 for f in doc["frames"][-2:])
    monkeypatch.setattr(T, "MAX_TRACE_BYTES", int((rest + newest + 64) / 0.95))  # room for "frames_dropped"
    fitted = T._fit(doc)
    assert fitted["frames"] == doc["frames"][-2:] and fitted["frames_dropped"] == len(doc["frames"]) - 2
    assert T._fit(fitted)["frames"] == fitted["frames"]  # what fits stays
    replay = load_trace(dumps(fitted))  # under the same limits
    assert replay.num_frames == 2 and replay.info()["frames_dropped"] == len(doc["frames"]) - 2
    replay.seek(2)
    assert set(render.build_payload(replay, "en", 3, 2, "", None, MACHINE)["figs"]) == set(render.CHART_IDS)


# ---- what a trace may describe, and what a replay may hold (issue 36) --------------------------------------------

def packed_blocks(n: int, pool: int = 364) -> dict:
    """A step's packed KV blocks as the exporter writes them (_pack_blocks), built from columns: n blocks, one
    owner each."""
    ids = np.arange(n, dtype=np.int64) % pool
    return {"__blocks__": n, "id": T._pack(ids), "refcount": T._pack(np.ones(n, np.int64)), "state": "u" * n,
            "hashed": T._pack(np.zeros(n, np.int64)), "owners": T._pack(np.zeros(n, np.int64)),
            "owner_counts": T._pack(np.ones(n, np.int64))}


def measured(data):
    """refused(data) with its time and its tracemalloc peak."""
    import time
    tracemalloc.start()
    t = time.perf_counter()
    try:
        msg = refused(data)
        seconds, peak = time.perf_counter() - t, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return msg, seconds, peak


def test_the_trace_records_its_engine(good):
    eng = good[0]["engine"]
    assert eng["num_blocks"] == len(T._unpack_blocks(good[0]["frames"][0]["event"]["blocks"]))
    assert 1 <= eng["max_num_seqs"] <= T.MAX_TRACE_SEQS and eng["max_num_batched_tokens"] >= 1
    assert eng["block_size"] >= 1 and eng["max_model_len"] >= 1
    assert load_trace(good[1]).bounds == eng


def test_a_packed_block_bomb_is_refused_before_decoding(good):
    """The issue's trace: 2,000,000 packed KV blocks, 45 MB (a 4 MB gzip upload), under the byte and value limits.
    It loaded in 11 s and kept +750 MB; now it is refused from the text, while gunzipping, in well under a
    second and without building anything of it."""
    doc = fresh(good)
    doc["frames"][0]["event"]["blocks"] = packed_blocks(2_000_000)
    text = dumps(doc)
    packed = gzip.compress(text.encode(), 6)
    assert 40 << 20 < len(text) < T.MAX_TRACE_BYTES and len(packed) < 6 << 20
    assert sum(text.count(c) for c in ",:[{") < T.MAX_TRACE_VALUES
    for data in (packed, text):
        msg, seconds, peak = measured(data)
        assert "2,000,000 KV blocks" in msg and f"{T.MAX_TRACE_POOL_BLOCKS:,}" in msg
        assert seconds < 1.0 and peak < 50 << 20, (seconds, peak)
    # spelled with an escape, the claim passes the text scan; the parsed count is still refused before its
    # columns are decoded (what decoding would allocate: 2,000,000 dicts, ~750 MB)
    escaped = text.replace('"__blocks__"', '"\\u005f_blocks__"', 1)
    msg, seconds, peak = measured(escaped)
    assert "2,000,000 KV blocks" in msg and peak < 3 * len(escaped), peak
    still_loads(good)


def test_a_step_past_its_own_engine_is_refused(good):
    """Within the absolute caps, but more than the engine the trace names could have had."""
    pool = good[0]["engine"]["num_blocks"]
    doc = fresh(good)
    doc["frames"][1]["event"]["blocks"] = packed_blocks(pool + 1, pool)
    assert f"{pool + 1:,} KV blocks; the trace's engine had at most {pool:,}" in refused(dumps(doc))
    doc = fresh(good)
    seqs = doc["frames"][1]["event"]["seqs"]
    doc["frames"][1]["event"]["seqs"] = seqs * (doc["engine"]["max_num_seqs"] + 1)
    assert "sequences" in refused(dumps(doc))
    doc = fresh(good)
    doc["frames"][1]["event"]["seqs"][0]["num_tokens"] = doc["engine"]["max_model_len"] + 1
    assert "past the model's context" in refused(dumps(doc))
    for bad in ({**doc["engine"], "num_blocks": T.MAX_TRACE_POOL_BLOCKS + 1}, {"num_blocks": 8}, [1], 7):
        doc = fresh(good)
        doc["engine"] = bad
        assert "engine record" in refused(dumps(doc))
    doc = fresh(good)  # a trace written before the engine record: held to the absolute caps
    del doc["engine"]
    assert load_trace(dumps(doc)).bounds["num_blocks"] == T.MAX_TRACE_POOL_BLOCKS
    doc["frames"][0]["event"]["blocks"] = packed_blocks(T.MAX_TRACE_POOL_BLOCKS + 1)
    assert "KV blocks" in refused(dumps(doc))


def test_a_replay_holds_what_a_live_tab_holds(good, monkeypatch):
    """Block dicts for the shown frame only (the KV charts read the newest shown event's), at most MAX_EVENTS
    frames, and a live tab's capture budget: the oldest frames lose their attention first."""
    replay = load_trace(good[1])
    frames = good[0]["frames"]
    for pos in (1, 3, replay.num_frames, 2):
        replay.seek(pos)
        holding = [i for i, e in enumerate(replay._events) if e.blocks]
        assert holding == [pos - 1]
        assert replay.events[-1].blocks == T._unpack_blocks(frames[pos - 1]["event"]["blocks"])
    replay.seek(replay.num_frames)
    assert set(render.build_payload(replay, "en", 3, 2, "", None, MACHINE)["figs"]) == set(render.CHART_IDS)

    # room for the newest two frames' attention (a capture's other parts, the lens and norms, are never dropped)
    events = load_trace(good[1])._events
    held = sum(e.capture_nbytes() for e in events)
    monkeypatch.setattr(S, "SESSION_CAPTURE_BYTES", held - sum(e.drop_captures() for e in events[:-2]))
    small = load_trace(good[1])
    kept = [bool(s.capture.attention) for e in small._events for s in e.seqs if s.capture is not None]
    assert kept == [False] * (len(kept) - 2) + [True, True]
    assert small.capture_bytes <= S.SESSION_CAPTURE_BYTES
    small.seek(small.num_frames)
    title = render.build_payload(small, "en", 3, 2, "", None, MACHINE)["figs"]["chart-attention"]["layout"]["title"]
    assert "freed later (capture budget)" in title["text"].replace("<br>", " ")

    monkeypatch.setattr(S, "MAX_EVENTS", len(frames) - 1)
    assert f"has {len(frames)} frames; a lab session keeps at most {len(frames) - 1}" in refused(good[1])
