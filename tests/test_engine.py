"""Engine-level behaviour: continuous batching, preemption, the public API, events."""
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Capture, SamplingParams, compute

QUESTIONS = [
    "Hi!",
    "Что такое гравитация?",
    "Name three planets.",
    "Write a haiku about the sea, please, in English.",
    "What is 2 + 2?",
    "Explain photosynthesis in simple words for a child who is seven years old and likes plants.",
    "日本の首都はどこですか？",
    "def add(a, b):",
]


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0)


def check_pool(eng):
    """Refcount of every block == number of table entries pointing at it; nothing leaked."""
    counts = {}
    for table in eng.blocks.block_tables.values():
        for b in table:
            counts[b] = counts.get(b, 0) + 1
    for b in range(eng.blocks.num_blocks):
        assert eng.blocks.refcount(b) == counts.get(b, 0), f"block {b}"
    s = eng.blocks.stats()
    assert s["used"] + s["cached"] + s["free"] == eng.blocks.num_blocks
    live = {s.seq_id for s in eng.scheduler.running}
    assert set(eng.blocks.block_tables) == live


@pytest.fixture(scope="module")
def sequential_outputs(base_engine):
    eng = base_engine.session()
    lengths = [12, 30, 20, 40, 8, 24, 16, 36]
    return lengths, [eng.generate(q, greedy(n)).token_ids for q, n in zip(QUESTIONS, lengths)]


def run_concurrent(eng, lengths):
    ids = [eng.add_request(q, greedy(n)) for q, n in zip(QUESTIONS, lengths)]
    events = []
    while eng.has_unfinished():
        events.append(eng.step(trace=False))
        check_pool(eng)
    return [eng.result(i).token_ids for i in ids], events


def test_eight_concurrent_requests_match_one_at_a_time(base_engine, sequential_outputs):
    lengths, expected = sequential_outputs
    eng = base_engine.session()
    outputs, events = run_concurrent(eng, lengths)
    assert outputs == expected
    assert max(len(e.seqs) for e in events) == 8  # really batched
    # continuous batching: short requests left while long ones were still decoding
    assert any(e.finished and e.running for e in events)
    assert eng.blocks.stats()["used"] == 0


def test_preemption_under_a_tiny_pool_keeps_outputs(base_engine, sequential_outputs):
    lengths, expected = sequential_outputs
    # 12 blocks of 16 tokens: the eight prompts (~30-50 tokens each with the template) cannot all fit
    eng = base_engine.session(kv_memory=12 * 16 * base_engine.kv_bytes_per_token)
    outputs, events = run_concurrent(eng, lengths)
    assert sum(len(e.preempted) for e in events) > 0
    assert outputs == expected
    assert eng.blocks.stats()["used"] == 0


def test_stream_equals_generate_text(engine):
    p = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=7)
    text = engine.generate("Что такое гравитация?", p).text
    assert "".join(engine.stream("Что такое гравитация?", p)) == text
    assert "\ufffd" not in text


def test_seeded_sampling_reproduces(engine):
    p = SamplingParams(max_tokens=24, temperature=1.0, top_k=50, seed=123)
    a = engine.generate("Tell me a story.", p).token_ids
    b = engine.generate("Tell me a story.", p).token_ids
    c = engine.generate("Tell me a story.", SamplingParams(max_tokens=24, temperature=1.0, top_k=50, seed=124)).token_ids
    assert a == b and a != c


def test_stop_string_cuts_text(engine):
    full = engine.generate("Count from 1 to 10, separated by commas.", greedy(40)).text
    assert "4" in full
    cut = full.index("4")
    res = engine.generate("Count from 1 to 10, separated by commas.",
                          SamplingParams(max_tokens=40, temperature=0.0, stop=("4",)))
    assert res.finish_reason == "stop"
    assert res.text == full[:cut]


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(temperature=math.nan), "temperature"), (dict(max_tokens=0), "max_tokens"),
])
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_requests_raise_and_engine_stays_usable(engine):
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request("   ", greedy(4))
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request(prompt_ids=list(range(100)) * 100, params=greedy(4))  # beyond the 8192 context
    tiny = engine.session(kv_memory=4 * 16 * engine.kv_bytes_per_token)
    with pytest.raises(ValueError, match="kv_memory"):
        tiny.add_request("Hello there", greedy(200))
    assert not engine.has_unfinished()
    assert engine.generate("Hi", greedy(3)).token_ids


def test_step_event_contents_and_json(engine):
    engine.instrument = Capture(lens_top_k=3)
    rid = engine.add_request("Что такое гравитация?", SamplingParams(max_tokens=3, temperature=0.7, seed=1))
    prefill = engine.step()
    decode = engine.step()
    for ev in (prefill, decode):
        json.dumps(ev.to_dict(), allow_nan=False)
    p, d = prefill.seq(rid), decode.seq(rid)
    seq = engine.sequences[rid]
    assert p.phase == "prefill" and p.num_processed == len(seq.prompt_ids) and prefill.admitted == [rid]
    assert d.phase == "decode" and d.num_processed == 1 and d.chunk_start == len(seq.prompt_ids)
    assert [p.new_token, d.new_token] == seq.output_ids[:2]
    assert p.sampling.chosen == p.new_token and d.sampling.chosen == d.new_token
    spec = engine.spec
    att = d.capture.attention
    assert set(att) == set(range(spec.num_layers))
    assert att[0].shape == (spec.num_heads, 1, len(seq.prompt_ids) + 1)
    assert torch.allclose(att[5].sum(-1), torch.ones(spec.num_heads, 1), atol=1e-4)
    pa = p.capture.attention[3]
    assert pa.shape == (spec.num_heads, len(seq.prompt_ids), len(seq.prompt_ids))
    assert torch.all(pa.triu(1) == 0)  # causal
    assert d.capture.lens_ids.shape == (spec.num_layers, 1, 3)
    # the last layer's lens is the model's own next-token distribution: its top-1 is greedy's pick
    logits = seq.last_sampling[0]
    assert int(d.capture.lens_ids[-1, 0, 0]) == int(logits.argmax())
    assert d.capture.residual_norms.shape == (spec.num_layers + 1, 1)
    assert p.capture.embeddings.shape == (len(seq.prompt_ids), spec.hidden_size)
    assert prefill.kv.used == len(p.block_table) == -(-len(seq.prompt_ids) // engine.block_size)
    assert prefill.cost.tokens == len(seq.prompt_ids) and prefill.cost.flops > 0
    assert d.ttft_s is None and p.ttft_s > 0 and d.itl_s > 0


def test_what_if_recomputes_from_cached_logits(engine):
    rid = engine.add_request("Name a colour.", SamplingParams(max_tokens=2, temperature=1.0, seed=3))
    ev = engine.step()
    base = ev.seq(rid).sampling
    same = engine.what_if(rid, SamplingParams(max_tokens=2, temperature=1.0, seed=3))
    assert same.chosen == base.chosen and same.u == base.u
    cold = engine.what_if(rid, SamplingParams(max_tokens=2, temperature=0.0))
    assert cold.chosen == int(engine.sequences[rid].last_sampling[0].argmax())


def test_force_rewind_branch(engine):
    rid = engine.add_request("What is gravity?", greedy(12))
    for _ in range(6):
        engine.step()
    seq = engine.sequences[rid]
    forced = engine.tokenizer.encode(" Banana", add_special_tokens=False)[0]
    engine.force_token(rid, forced)
    ev = engine.step()
    assert ev.seq(rid).forced and seq.output_ids[-1] == forced
    check_pool(engine)
    n_before = len(seq.output_ids)
    engine.rewind(rid, 2)
    assert len(seq.output_ids) == 2
    check_pool(engine)
    child = engine.branch(rid, 1)
    check_pool(engine)
    while engine.has_unfinished():
        engine.step()
        check_pool(engine)
    # after rewinding to 2 tokens, greedy continues exactly as a fresh greedy run would
    fresh = engine.generate("What is gravity?", greedy(12)).token_ids
    assert seq.output_ids == fresh
    assert engine.sequences[child].output_ids == fresh
    assert n_before == 7
    assert engine.blocks.stats()["used"] == 0


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(["add", "step", "step", "step", "abort", "rewind", "branch"]),
                          st.integers(0, 7), st.integers(1, 6)), min_size=4, max_size=24))
def test_random_operations_never_leak_blocks(base_engine, ops):
    eng = base_engine.session(kv_memory=10 * 16 * base_engine.kv_bytes_per_token)
    for op, i, n in ops:
        live = sorted(eng.sequences)
        if op == "add":
            eng.add_request(QUESTIONS[i % 4], SamplingParams(max_tokens=n * 3, temperature=0.0))
        elif op == "step":
            eng.step(trace=False)
        elif live:
            sid = live[i % len(live)]
            seq = eng.sequences[sid]
            if op == "abort":
                eng.abort(sid)
            elif op == "rewind":
                eng.rewind(sid, min(n, len(seq.output_ids)))
            elif op == "branch" and len(eng.sequences) < 6:
                eng.branch(sid, min(n, len(seq.output_ids)))
        check_pool(eng)
    while eng.has_unfinished():
        eng.step(trace=False)
        check_pool(eng)
    assert eng.blocks.stats()["used"] == 0


def test_tensor_work_runs_on_one_thread_whoever_calls(engine):
    """engine/compute.py: steps, what-if and rewinds asked for from different threads all run on the one
    compute thread (a second calling thread would start a second OpenMP team; two teams slow each other)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    seen = []
    forward = engine.model.forward

    def recording_forward(*args, **kwargs):
        seen.append(threading.get_ident())
        return forward(*args, **kwargs)

    engine.model.forward = recording_forward
    try:
        rid = engine.add_request("Что такое гравитация?", greedy(12))
        engine.step()
        with ThreadPoolExecutor(3) as pool:  # other threads, at once: no deadlock, one thread does the work
            futures = [pool.submit(engine.step) for _ in range(3)]
            futures.append(pool.submit(engine.rewind, rid, 1))
            futures += [pool.submit(engine.step) for _ in range(2)]
            for f in futures:
                f.result(timeout=120)
        assert engine.what_if(rid, SamplingParams(temperature=1.3)).token_ids
    finally:
        engine.model.forward = forward
    assert len(seen) >= 5 and set(seen) == {compute.run(threading.get_ident)}
    assert not compute.on_compute_thread()  # the test itself runs elsewhere


def test_torch_on_other_threads_starts_no_openmp_team():
    """engine/compute.py: a parallel kernel on a thread that is not the compute thread runs on that thread
    alone; a worker team of its own would make every team sleep between regions (slower steps for all)."""
    import os
    import threading

    def os_threads():
        return len(os.listdir("/proc/self/task"))

    big = torch.randn(3000, 3000)  # well above torch's grain size: this kernel would go parallel
    rows = torch.randint(0, 3000, (3000,))
    seen = {}

    def ui_work():
        seen["torch_threads"] = torch.get_num_threads()
        seen["before"] = os_threads()
        (big[rows] * 2 + 1).sum()  # an index kernel, then elementwise ones
        seen["after"] = os_threads()

    t = threading.Thread(target=ui_work)
    t.start()
    t.join()
    assert seen["torch_threads"] == 1 and seen["after"] == seen["before"]
    assert compute.run(torch.get_num_threads) == compute.THREADS >= 1


def check_nearest_tokens(engine, tid: int, k: int = 8) -> None:
    """Engine.nearest_tokens against an independent cosine over the whole embedding table."""
    emb = engine.model.embed.float()
    cos = torch.nn.functional.cosine_similarity(emb, emb[tid][None], dim=-1)
    cos[tid] = -2.0  # the token itself is not its own neighbour
    top = cos.topk(k)
    got = engine.nearest_tokens(tid, k)
    assert [i for i, _, _ in got] == top.indices.tolist()
    assert [c for _, _, c in got] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert all(text == engine.token_text(i) for i, text, _ in got)


def test_nearest_tokens_are_the_cosine_top_k(engine):
    for tid in (354, engine.tokenizer.encode(" gravity", add_special_tokens=False)[0]):
        check_nearest_tokens(engine, tid)


def test_the_lens_shares_the_heads_pass_without_changing_the_logits(engine):
    """model.forward computes the logit lens and the real logits in one LM-head pass: the logits a step
    samples from are bitwise the ones of the same step without the lens, in prefill and in decode. (Capture
    stays on in both: captured attention is computed another way, so it is not bitwise an uncaptured step.)"""
    runs = []
    for instrument in (Capture(lens_top_k=3), Capture(logit_lens=False)):
        eng = engine.session()
        eng.instrument = instrument
        rid = eng.add_request("Что такое гравитация?", greedy(4))
        logits = []
        for _ in range(4):
            ev = eng.step()
            logits.append(eng.sequences[rid].last_sampling[0].clone())
        runs.append((logits, ev))
    (with_lens, ev), (plain, _) = runs
    assert all(torch.equal(a, b) for a, b in zip(with_lens, plain))
    lens_ids = ev.seqs[0].capture.lens_ids
    assert lens_ids.shape == (engine.spec.num_layers, 1, 3) and int(lens_ids[-1, 0, 0]) == int(plain[-1].argmax())


def test_a_dropped_engine_is_freed_without_the_cycle_collector():
    """Engine.from_pretrained freezes the interpreter's objects after a load (gc.freeze: full collections no longer
    walk them), so an engine must be freed by reference counting alone: one that needed the cycle collector would
    never be freed once frozen. Checked with the collector off, after a request ran through it."""
    import gc
    import weakref

    from engine import Engine

    eng = Engine.from_pretrained("bundled", weights="q4", kv_memory=16 << 20)
    session = eng.session()
    session.generate("Hi", SamplingParams(max_tokens=3, temperature=0.0))
    refs = [weakref.ref(eng), weakref.ref(eng.model), weakref.ref(session)]
    gc.disable()
    try:
        del eng, session
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()
