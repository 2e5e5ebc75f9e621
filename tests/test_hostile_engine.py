"""The engine in front of strangers: bad arguments are refused up front with a message naming them, and a step
that fails is undone completely (issue 11, classes 4, 5 and the BPE cost bound of 7)."""
import hashlib
import statistics
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import (MAX_BPE_CHARS, MAX_PROMPT_CHARS, ArgumentTypeError, SamplingParams, SpeculativeConfig,
                    StepFailed, sampling_probs)
from engine import engine as engine_mod
from engine.sampling import trace_chain
from engine.tokenizer import bpe_merges, pre_tokens, render_prompt, token_info

REF_PROMPT = "The capital of France is"
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.data_too_large])


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0)


@pytest.fixture(scope="module")
def reference_ids(base_engine):
    return base_engine.session().generate(REF_PROMPT, greedy(5), chat=False).token_ids


def assert_healthy(eng, reference_ids):
    """Nothing was left behind by refused calls, and the engine still answers exactly as a fresh one."""
    assert not eng.has_unfinished()
    assert eng.generate(REF_PROMPT, greedy(5), chat=False).token_ids == reference_ids
    assert eng.blocks.stats()["used"] == 0
    eng.blocks.check_invariants()


def refused(call, name):
    """`call` must raise ValueError or TypeError (nothing else) whose message names the argument."""
    with pytest.raises((ValueError, TypeError)) as ei:
        call()
    assert name in str(ei.value), f"{name!r} not named in: {ei.value}"
    return ei.value


# ---- strategies of bad values ------------------------------------------------------------------------------

NOT_INT = st.one_of(
    st.booleans(), st.just(np.bool_(True)), st.floats(allow_nan=True, allow_infinity=True),
    st.builds(np.float64, st.floats(-1e6, 1e6)), st.builds(np.float32, st.floats(-1e3, 1e3, width=32)),
    st.text(max_size=4), st.binary(max_size=3), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1), st.just(1 + 2j), st.just(object()),
)
NOT_BOOL = st.one_of(st.integers(), st.floats(), st.just("no"), st.just("False"), st.text(max_size=3), st.none(),
                     st.lists(st.booleans(), max_size=2))
NOT_STR = st.one_of(st.integers(), st.floats(), st.booleans(), st.binary(max_size=4),
                    st.lists(st.text(max_size=2), max_size=2), st.dictionaries(st.text(max_size=2), st.text(max_size=2),
                                                                            max_size=1))
NOT_REAL = st.one_of(st.booleans(), st.text(max_size=3), st.none(), st.lists(st.floats(), max_size=1),
                     st.just(1 + 1j), st.just(np.bool_(False)))
SURROGATE_TEXT = st.builds(lambda a, c, b: a + chr(c) + b, st.text(max_size=5), st.integers(0xD800, 0xDFFF),
                           st.text(max_size=5))
HUGE_TEXT = st.builds(lambda n: "y" * n, st.integers(MAX_PROMPT_CHARS + 1, MAX_PROMPT_CHARS + 2_000_000))
NOT_PARAMS = st.one_of(st.dictionaries(st.sampled_from(["max_tokens", "temperature", "seed"]), st.integers(0, 5),
                                       max_size=2), st.text(max_size=5), st.integers(), st.floats(),
                       st.lists(st.integers(), max_size=2), st.just(SpeculativeConfig("ngram")))


def bad_int(lo, hi=None):
    parts = [NOT_INT, st.integers(max_value=lo - 1), st.just(-10**30)]
    if hi is not None:
        parts += [st.integers(min_value=hi + 1), st.just(10**30)]
    return st.one_of(*parts)


def bad_real(lo, hi, lo_open=False):
    parts = [NOT_REAL, st.just(float("nan")), st.just(float("inf")), st.just(float("-inf")),
             st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False),
             st.floats(min_value=hi, exclude_min=True, allow_nan=False)]
    return st.one_of(*parts)


def bad_ids(vocab, max_len):
    """Lists of token ids with one bad element somewhere, and containers that are not lists of ids."""
    bad_elem = st.one_of(st.floats(), st.booleans(), st.text(max_size=3), st.none(), st.integers(max_value=-1),
                         st.integers(min_value=vocab), st.builds(np.float64, st.floats(0, 10)),
                         st.lists(st.integers(0, 5), max_size=2))
    with_bad = st.builds(lambda good, i, b: good[:i] + [b] + good[i:], st.lists(st.integers(0, vocab - 1), max_size=6),
                         st.integers(0, 6), bad_elem)
    return st.one_of(
        with_bad, st.just([]), st.just([0] * (max_len + 1)), st.text(min_size=1, max_size=5),
        st.dictionaries(st.integers(0, 5), st.integers(0, 5), min_size=1, max_size=2), st.sets(st.integers(0, 5), min_size=1),
        st.integers(), st.floats(), st.builds(lambda: np.array([1.0, 2.0])), st.builds(lambda: np.zeros((2, 2), int)),
        st.builds(lambda: torch.tensor([1.5])), st.builds(lambda: torch.tensor([True])),
    )


# ---- (a) hypothesis: many bad inputs, each refused with a named argument ---------------------------------------

def test_add_request_refuses_bad_arguments(base_engine, reference_ids):
    eng = base_engine.session()
    vocab = eng.spec.vocab_size
    case = st.one_of(
        st.tuples(st.just("prompt"), st.one_of(NOT_STR, SURROGATE_TEXT, HUGE_TEXT, st.just("   "), st.none())
                  .map(lambda v: dict(prompt=v))),
        st.tuples(st.just("params"), NOT_PARAMS.map(lambda v: dict(prompt="Hi", params=v))),
        st.tuples(st.just("chat"), NOT_BOOL.map(lambda v: dict(prompt="Hi", chat=v))),
        st.tuples(st.just("system"), st.one_of(NOT_STR, SURROGATE_TEXT, HUGE_TEXT)
                  .map(lambda v: dict(prompt="Hi", system=v))),
        st.tuples(st.just("prompt_ids"), bad_ids(vocab, eng.max_model_len).map(lambda v: dict(prompt_ids=v))),
        st.tuples(st.just("speculative"), st.one_of(st.just("ngram"), NOT_PARAMS.filter(
            lambda v: not isinstance(v, SpeculativeConfig)), st.just(SamplingParams()))
                  .map(lambda v: dict(prompt="Hi", speculative=v))),
    )

    @settings(FUZZ, max_examples=70)
    @given(case, st.sampled_from(["add_request", "generate", "stream"]))
    def run(c, method):
        name, kwargs = c
        if method != "add_request" and "prompt_ids" in kwargs:
            method = "add_request"  # generate/stream take text prompts only
        refused(lambda: getattr(eng, method)(**kwargs), name)

    run()
    assert_healthy(eng, reference_ids)


FIELD_BAD = {
    "max_tokens": bad_int(1),
    "temperature": bad_real(0.0, 1e3),
    "top_k": bad_int(0),
    "top_p": bad_real(0.0, 1.0, lo_open=True),
    "min_p": bad_real(0.0, 1.0),
    "repetition_penalty": bad_real(1e-4, 1e4),
    "frequency_penalty": bad_real(-1e4, 1e4),
    "presence_penalty": bad_real(-1e4, 1e4),
    "seed": st.one_of(NOT_INT.filter(lambda v: v is not None), st.just(2**64), st.just(-(2**63) - 1)),
    "stop": st.one_of(st.lists(st.text(min_size=1, max_size=3), min_size=17, max_size=20), st.just([""]),
                      st.builds(lambda n: ["z" * n], st.integers(257, 10_000)), SURROGATE_TEXT,
                      st.lists(st.integers(), min_size=1, max_size=2), st.integers(), st.just({"a": 1})),
    "ignore_eos": NOT_BOOL,
}


def test_sampling_params_refuse_bad_fields(base_engine, reference_ids):
    eng = base_engine.session()
    case = st.one_of(*[st.tuples(st.just(f), s) for f, s in FIELD_BAD.items()])

    @settings(FUZZ, max_examples=70)
    @given(case)
    def run(c):
        field, value = c
        err = refused(lambda: SamplingParams(**{field: value}), field)
        assert str(err).startswith(field)
        # a field broken after construction is caught where the params are used, before anything changes
        p = SamplingParams(max_tokens=3)
        setattr(p, field, value)
        refused(lambda: eng.add_request("Hi", p), field)

    run()
    assert_healthy(eng, reference_ids)


def test_speculative_config_refuses_bad_fields(base_engine, reference_ids):
    eng = base_engine.session()
    case = st.one_of(
        st.tuples(st.just("method"), st.one_of(NOT_STR, st.text(max_size=8).filter(
            lambda m: m not in ("ngram", "early_exit", "draft")))).map(lambda c: (c[0], dict(method=c[1]))),
        st.tuples(st.just("num_tokens"), bad_int(1, 32)).map(lambda c: (c[0], dict(method="ngram", num_tokens=c[1]))),
        st.tuples(st.just("exit_layer"), bad_int(1)).map(lambda c: (c[0], dict(method="early_exit",
                                                                                exit_layer=c[1]))),
        st.tuples(st.just("adaptive"), NOT_BOOL.filter(lambda v: v is not None))
        .map(lambda c: (c[0], dict(method="ngram", adaptive=c[1]))),
        st.tuples(st.sampled_from(["ngram_min", "ngram_max"]), bad_int(1, 32))
        .map(lambda c: (c[0], dict(method="ngram", **{c[0]: c[1]}))),
        st.tuples(st.just("draft_model"), st.one_of(st.integers(), st.just({"a": 1}), st.just("  "), SURROGATE_TEXT,
                                                     st.builds(lambda n: "m" * n, st.integers(4097, 10_000))))
        .map(lambda c: (c[0], dict(method="draft", draft_model=c[1]))),
    )

    @settings(FUZZ, max_examples=40)
    @given(case)
    def run(c):
        name, kwargs = c
        refused(lambda: SpeculativeConfig(**kwargs), name)

    run()
    assert_healthy(eng, reference_ids)


def test_engine_settings_refuse_bad_values(base_engine, reference_ids):
    mem = engine_mod._device_memory(torch.device("cpu"))
    case = st.one_of(
        st.tuples(st.just("kv_memory"), st.one_of(bad_int(1), st.integers(min_value=mem + 1),
                                                  st.integers(1, 16 * base_engine.kv_bytes_per_token - 1))),
        st.tuples(st.just("block_size"), bad_int(1, 1024)),
        st.tuples(st.just("max_num_batched_tokens"), bad_int(1)),
        st.tuples(st.just("max_num_seqs"), bad_int(1, 1024)),
        st.tuples(st.just("enable_prefix_caching"), NOT_BOOL),
        st.tuples(st.sampled_from(["kv_mem", "blocksize", "device"]), st.integers()),
    )

    @settings(FUZZ, max_examples=40)
    @given(case)
    def run(c):
        name, value = c
        refused(lambda: base_engine.session(**{name: value}), name)

    run()
    assert_healthy(base_engine.session(), reference_ids)


def test_sequence_operations_refuse_bad_arguments(base_engine, reference_ids):
    eng = base_engine.session()
    sid = eng.add_request(REF_PROMPT, greedy(4), chat=False)
    eng.run_until_done(trace=True)  # traced: what_if has a chain to recompute
    n_out = len(eng.result(sid).token_ids)
    vocab = eng.spec.vocab_size
    unknown_id = st.one_of(NOT_INT, st.integers(min_value=sid + 1), st.integers(max_value=-1))
    case = st.one_of(
        st.tuples(st.just("seq_id"), st.sampled_from(["abort", "result"]), unknown_id.map(lambda v: (v,))),
        st.tuples(st.just("seq_id"), st.just("force_token"), unknown_id.map(lambda v: (v, 1))),
        st.tuples(st.just("token_id"), st.just("force_token"), bad_int(0, vocab - 1).map(lambda v: (sid, v))),
        st.tuples(st.just("num_output_tokens"), st.sampled_from(["rewind", "branch"]),
                  bad_int(0, n_out).map(lambda v: (sid, v))),
        st.tuples(st.just("params"), st.just("branch"), NOT_PARAMS.filter(lambda v: v is not None)
                  .map(lambda v: (sid, 1, v))),
        st.tuples(st.just("params"), st.just("what_if"), st.one_of(NOT_PARAMS, st.none()).map(lambda v: (sid, v))),
        st.tuples(st.just("top_n"), st.just("what_if"), bad_int(0, 1000).map(lambda v: (sid, SamplingParams(), v))),
        st.tuples(st.just("token_id"), st.sampled_from(["nearest_tokens", "token_text"]),
                  bad_int(0, vocab - 1).map(lambda v: (v,))),
        st.tuples(st.just("k"), st.just("nearest_tokens"), bad_int(1, 1000).map(lambda v: (5, v))),
        st.tuples(st.just("prompt"), st.just("encode"), st.one_of(NOT_STR, SURROGATE_TEXT, HUGE_TEXT)
                  .map(lambda v: (v,))),
        st.tuples(st.just("chat"), st.just("encode"), NOT_BOOL.map(lambda v: ("Hi", v))),
        st.tuples(st.just("system"), st.just("encode"), st.one_of(NOT_STR, SURROGATE_TEXT).map(lambda v: ("Hi", True, v))),
        st.tuples(st.just("trace"), st.sampled_from(["step", "run_until_done"]), NOT_BOOL.map(lambda v: (v,))),
    )

    @settings(FUZZ, max_examples=80)
    @given(case)
    def run(c):
        name, method, args = c
        refused(lambda: getattr(eng, method)(*args), name)

    run()
    assert eng.result(sid).token_ids == reference_ids[:n_out]  # the finished sequence was not touched
    assert_healthy(eng, reference_ids)


def test_tokenizer_views_refuse_bad_arguments(base_engine, reference_ids):
    tok = base_engine.tokenizer
    case = st.one_of(
        st.tuples(st.just("prompt"), st.just(render_prompt), st.one_of(NOT_STR, SURROGATE_TEXT, HUGE_TEXT)
                  .map(lambda v: (v,))),
        st.tuples(st.just("system"), st.just(render_prompt), st.one_of(NOT_STR, SURROGATE_TEXT, HUGE_TEXT)
                  .map(lambda v: ("Hi", True, v))),
        st.tuples(st.just("chat"), st.just(render_prompt), NOT_BOOL.map(lambda v: ("Hi", v))),
        st.tuples(st.just("word"), st.just(bpe_merges), st.one_of(
            NOT_STR, SURROGATE_TEXT, st.builds(lambda n: "q" * n, st.integers(MAX_BPE_CHARS + 1, 100_000))
        ).map(lambda v: (v,))),
        st.tuples(st.just("text"), st.just(pre_tokens), st.one_of(NOT_STR, SURROGATE_TEXT).map(lambda v: (v,))),
        st.tuples(st.just("ids"), st.just(token_info), st.one_of(
            st.text(max_size=3), st.integers(), st.dictionaries(st.integers(), st.integers(), max_size=1),
            st.lists(st.one_of(st.floats(), st.booleans(), st.integers(max_value=-1), st.text(max_size=2)),
                     min_size=1, max_size=3)).map(lambda v: (v,))),
    )

    @settings(FUZZ, max_examples=40)
    @given(case)
    def run(c):
        name, fn, args = c
        refused(lambda: fn(tok, *args), name)

    run()
    assert_healthy(base_engine.session(), reference_ids)


# ---- (b) the atomic step ------------------------------------------------------------------------------------

def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def _live_kv(eng) -> str:
    """A digest of every KV row somebody relies on: each sequence's computed positions and each cached block."""
    bm, bs = eng.blocks, eng.block_size
    slots = set()
    for sid, table in bm.block_tables.items():
        for pos in range(eng.sequences[sid].num_computed):
            slots.add(table[pos // bs] * bs + pos % bs)
    for b, h in enumerate(bm._block_hash):
        if h is not None:
            slots.update(range(b * bs, (b + 1) * bs))
    idx = torch.tensor(sorted(slots), dtype=torch.long)
    return _digest(eng.kv.k[:, idx]) + _digest(eng.kv.v[:, idx])


def full_state(eng) -> dict:
    """Everything a step may change, in comparable form."""
    bm, sch = eng.blocks, eng.scheduler
    seqs = {}
    for sid, s in eng.sequences.items():
        ls = s.last_sampling
        seqs[sid] = dict(
            output_ids=list(s.output_ids), status=s.status, num_computed=s.num_computed,
            num_cached=s.num_cached_tokens, finish=s.finish_reason, forced=s.forced_token,
            gen=_digest(s.generator.get_state()), detok=s.detok.snapshot()[:1] + s.detok.snapshot()[2:],
            detok_text=s.detok.text, first=s.first_token_time, last=s.last_token_time, times=list(s.token_times),
            preemptions=s.preemptions, spec_k=s.spec_k, spec=None if s.spec is None else s.spec.snapshot(),
            last_sampling=None if ls is None else (_digest(ls[0]), list(ls[1]), list(ls[2]), ls[3]))
    return dict(
        tables={k: list(v) for k, v in bm.block_tables.items()}, seq_lens=dict(bm.seq_lens),
        refcounts=list(bm._refcounts), free=list(bm._free), evictable=list(bm._evictable),
        hashes=dict(bm._hash_to_block), block_hash=list(bm._block_hash),
        seq_hashes={k: list(v) for k, v in bm._seq_hashes.items()}, stats=bm.stats(),
        waiting=[s.seq_id for s in sch.waiting], running=[s.seq_id for s in sch.running],
        preemptions=sch.num_preemptions, seqs=seqs, step=eng.step_index, clock=eng.clock, kv=_live_kv(eng))


def fail_once(monkeypatch, eng, attr, at_call=1):
    """Make eng.<attr> raise on its `at_call`-th call from now (after the forward when attr is _sample)."""
    real = getattr(eng, attr)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(eng, attr, wrapper)


def run_all(eng) -> None:
    while eng.has_unfinished():
        eng.step(trace=True)


PROMPTS = ["The capital of France is", "Write a long poem about the sea and the sky, with rhymes,"]


def test_failed_step_is_undone_exactly_and_the_run_continues(base_engine, monkeypatch):
    ref, eng = base_engine.session(), base_engine.session()
    for e in (ref, eng):  # sampled and seeded, so the generators' state matters; stop strings hold text back
        for i, p in enumerate(PROMPTS):
            e.add_request(p, SamplingParams(max_tokens=5, temperature=0.9, seed=i, stop=["zzz"]), chat=False)
        e.step()
        e.step()
    before = full_state(eng)
    fail_once(monkeypatch, eng, "_sample", at_call=2)  # the first sequence has sampled when the second fails
    with pytest.raises(StepFailed, match=r"^step 2 failed and was undone \(nothing changed\): RuntimeError: "
                                         r"injected failure") as ei:
        eng.step()
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert full_state(eng) == before
    monkeypatch.undo()
    assert eng.step().to_dict()["seqs"][0]["new_token"] == ref.step().to_dict()["seqs"][0]["new_token"]
    run_all(ref)
    run_all(eng)
    for sid in ref.sequences:
        assert eng.result(sid).token_ids == ref.result(sid).token_ids
        assert eng.result(sid).text == ref.result(sid).text
    assert eng.blocks.stats()["used"] == 0
    eng.blocks.check_invariants()


def test_failure_after_prefix_registration_is_undone(base_engine, monkeypatch):
    eng = base_engine.session()
    eng.add_request(PROMPTS[1] * 3, greedy(3), chat=False)  # several full blocks, registered in the prefill step
    before = full_state(eng)
    fail_once(monkeypatch, eng, "_event")  # the very end of the step: blocks registered, token emitted
    with pytest.raises(StepFailed, match="undone"):
        eng.step()
    assert full_state(eng) == before and not eng.blocks._hash_to_block
    monkeypatch.undo()
    run_all(eng)
    assert eng.result(0).token_ids == base_engine.session().generate(PROMPTS[1] * 3, greedy(3), chat=False).token_ids


def _small_pool(base_engine, blocks):
    return base_engine.session(kv_memory=blocks * 16 * base_engine.kv_bytes_per_token)


def test_failure_in_a_preempting_step_restores_the_victims_kv(base_engine, monkeypatch):
    """The victim's freed block is taken and written in the same step: the undo must bring its data back."""
    ids = base_engine.encode(PROMPTS[1] * 4, chat=False).token_ids
    prompts = [ids[:32], ids[-32:]]  # two full blocks each fill the 4-block pool; the first decode needs a fifth
    ref, eng = _small_pool(base_engine, 4), _small_pool(base_engine, 4)
    for e in (ref, eng):
        for p in prompts:
            e.add_request(prompt_ids=p, params=greedy(3))
        e.step()  # both prefilled
    before = full_state(eng)
    fail_once(monkeypatch, eng, "_sample")
    with pytest.raises(StepFailed):
        eng.step()
    assert eng.scheduler.num_preemptions == 0
    assert full_state(eng) == before  # includes the victim's computed KV rows
    monkeypatch.undo()
    assert ref.step().preempted == eng.step().preempted == [1]
    run_all(ref)
    run_all(eng)
    assert [eng.result(s).token_ids for s in (0, 1)] == [ref.result(s).token_ids for s in (0, 1)]


def test_failure_in_an_evicting_step_restores_the_cached_prefix(base_engine, monkeypatch):
    long_a, long_b = PROMPTS[1] * 3, "Count the stars: one, two, three, four, five, six, seven, eight, nine, ten."
    ref, eng = _small_pool(base_engine, 6), _small_pool(base_engine, 6)
    for e in (ref, eng):
        e.generate(long_a, greedy(2), chat=False)  # leaves its full blocks cached
        e.add_request(long_b * 2, greedy(2), chat=False)  # needs blocks: evicts some of them at admission
    assert eng.blocks.stats()["cached"] > 0
    before = full_state(eng)
    fail_once(monkeypatch, eng, "_sample")
    with pytest.raises(StepFailed):
        eng.step()
    after = full_state(eng)
    assert after == before  # cached blocks, their hashes and their KV rows are back
    monkeypatch.undo()
    for e in (ref, eng):
        run_all(e)
    again = [e.generate(long_a, greedy(4), chat=False) for e in (ref, eng)]
    assert again[1].token_ids == again[0].token_ids and again[1].num_cached_tokens == again[0].num_cached_tokens


def test_checkpoint_is_cheap(base_engine):
    eng = base_engine.session()
    for i in range(8):
        eng.add_request(f"Story {i}: once upon a time", SamplingParams(max_tokens=50, seed=i), chat=False)
    eng.step(trace=False)
    times = []
    for _ in range(200):
        t = time.perf_counter()
        eng._checkpoint()
        eng._commit()
        times.append(time.perf_counter() - t)
    assert statistics.median(times) < 1e-3  # ~30 us measured; generous for a busy machine


# ---- (b) temperatures that underflow float32 are greedy -----------------------------------------------------

@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-46, 9e-6])
def test_tiny_temperature_is_greedy_in_the_chain(temperature):
    p = SamplingParams(max_tokens=5, temperature=temperature, seed=3)
    assert p.greedy
    logits = torch.tensor([1.0, 3.0, 2.0, -1e30, 3.4e38])
    assert torch.equal(sampling_probs(logits[:4], p), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert trace_chain(logits, p, [], [], 0.7).chosen == 4
    assert trace_chain(logits, p, [], [], 0.7).greedy


def test_tiny_temperature_is_greedy_in_the_engine(base_engine, reference_ids):
    eng = base_engine.session()
    p = SamplingParams(max_tokens=5, temperature=1e-300, seed=3)
    assert eng.generate(REF_PROMPT, p, chat=False).token_ids == reference_ids  # IndexError mid-step before
    sid = eng.add_request(REF_PROMPT, SamplingParams(max_tokens=1, temperature=0.8, seed=1), chat=False)
    run_all(eng)
    assert eng.what_if(sid, p).chosen == reference_ids[0]
    spec = eng.generate(REF_PROMPT, p, chat=False, speculative=SpeculativeConfig("ngram", 3))  # verify's chain
    assert spec.token_ids == reference_ids


def test_extreme_accepted_values_never_break_the_chain(base_engine):
    """Real logits through the chain with every bound at its extreme: a token always comes out."""
    eng = base_engine.session()
    sid = eng.add_request(PROMPTS[1], SamplingParams(max_tokens=1, seed=0), chat=False)
    run_all(eng)
    logits, prompt, output, _ = eng.sequences[sid].last_sampling
    output = output + eng.result(sid).token_ids * 3
    for kw in (dict(temperature=1e3), dict(temperature=1e3, repetition_penalty=1e4),
               dict(repetition_penalty=1e-4), dict(frequency_penalty=1e4), dict(frequency_penalty=-1e4),
               dict(presence_penalty=-1e4, temperature=1e-5), dict(presence_penalty=1e4, repetition_penalty=1e-4),
               dict(min_p=1.0, top_p=1e-9, top_k=1), dict(temperature=1e-5, min_p=1e-300, top_p=1.0)):
        p = SamplingParams(**kw)
        for u in (0.0, 0.5, 0.999999):
            tr = trace_chain(logits, p, prompt, output, u)
            assert 0 <= tr.chosen < logits.numel(), kw
        probs = sampling_probs(logits, p, prompt, output)
        assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1) < 1e-4, kw
    for kw in (dict(temperature=1e3 * 1.01), dict(repetition_penalty=1e-5), dict(presence_penalty=1e5)):
        refused(lambda: SamplingParams(**kw), next(iter(kw)))


# ---- (b) each validation hole found -----------------------------------------------------------------------------

@pytest.mark.parametrize("value, kind", [(0, ValueError), (-1, ValueError), ("16", TypeError), (16.0, TypeError),
                                         (True, TypeError), (10**6, ValueError)])
def test_max_num_seqs_is_checked(base_engine, value, kind):
    err = refused(lambda: base_engine.session(max_num_seqs=value), "max_num_seqs")
    assert isinstance(err, kind) and repr(value) in str(err)


def test_settings_are_checked_before_loading(monkeypatch):
    from engine import Engine

    monkeypatch.setattr(engine_mod, "load", lambda *a, **k: pytest.fail("loaded before checking the settings"))
    refused(lambda: Engine.from_pretrained("bundled", max_num_seqs=0), "max_num_seqs")
    refused(lambda: Engine.from_pretrained("bundled", kv_memory=10**18), "kv_memory")
    refused(lambda: Engine.from_pretrained("bundled", enable_prefix_caching="no"), "enable_prefix_caching")
    refused(lambda: Engine.from_pretrained("bundled", kv_mem=1), "kv_mem")
    refused(lambda: Engine.from_pretrained("bundled", dtype="float32"), "dtype")
    refused(lambda: Engine.from_pretrained(["bundled"]), "source")
    refused(lambda: Engine.from_pretrained("bundled", device={"cpu": 1}), "device")


@pytest.mark.parametrize("ids, where", [([1.0, 2.0], "prompt_ids[0]"), ([5, "6"], "prompt_ids[1]"),
                                        ([5, True], "prompt_ids[1]"), ([5, 6, np.float64(7)], "prompt_ids[2]"),
                                        ("123", "prompt_ids"), (np.array([1.5]), "prompt_ids")])
def test_prompt_ids_are_not_coerced(engine, ids, where):
    err = refused(lambda: engine.add_request(prompt_ids=ids, params=greedy(2)), where)
    assert isinstance(err, TypeError) and isinstance(err, ArgumentTypeError)
    assert not engine.has_unfinished()


def test_prompt_ids_too_long_refused_before_conversion(engine):
    class Huge(list):
        def __iter__(self):
            pytest.fail("converted element by element before the length check")

    refused(lambda: engine.add_request(prompt_ids=Huge([1] * 10_000), params=greedy(2)), "prompt_ids")


def test_numpy_integers_are_accepted(engine, reference_ids):
    ids = engine.encode(REF_PROMPT, chat=False).token_ids
    for form in (np.array(ids, dtype=np.int64), [np.int32(t) for t in ids], torch.tensor(ids), tuple(ids)):
        sid = engine.add_request(prompt_ids=form, params=SamplingParams(max_tokens=np.int64(3), temperature=0.0))
        assert engine.sequences[sid].prompt_ids == ids and all(type(t) is int for t in engine.sequences[sid].prompt_ids)
        engine.abort(np.int64(sid))
    sid = engine.add_request(prompt_ids=np.array(ids), params=greedy(3))
    run_all(engine)
    assert engine.result(np.int64(sid)).token_ids == reference_ids[:3]
    engine.rewind(sid, np.int64(1))
    engine.force_token(np.int16(sid), np.int64(reference_ids[1]))
    child = engine.branch(sid, np.uint8(1))
    assert engine.sequences[child].output_ids == reference_ids[:1]
    engine.abort(child)
    run_all(engine)
    assert engine.result(sid).token_ids == reference_ids[:3]
    assert len(engine.nearest_tokens(np.int64(5), np.int32(3))) == 3
    assert engine.token_text(np.int64(reference_ids[0])) == engine.token_text(reference_ids[0])


def test_a_dict_is_not_sampling_params(engine):
    sid = engine.add_request(REF_PROMPT, greedy(2), chat=False)
    engine.run_until_done(trace=True)
    d = {"max_tokens": 3, "temperature": 0.0}
    for call in (lambda: engine.add_request("Hi", d), lambda: engine.generate("Hi", d), lambda: engine.stream("Hi", d),
                 lambda: engine.branch(sid, 1, d), lambda: engine.what_if(sid, d)):
        err = refused(call, "params")
        assert isinstance(err, TypeError) and "dict" in str(err)
    assert len(engine.sequences) == 1


def test_enable_prefix_caching_must_be_a_bool(base_engine):
    for v in ("no", "False", 0, 1, None):
        refused(lambda: base_engine.session(enable_prefix_caching=v), "enable_prefix_caching")
    assert base_engine.session(enable_prefix_caching=np.bool_(False)).blocks.enable_prefix_caching is False


def test_huge_kv_memory_is_refused_by_name(base_engine, monkeypatch):
    err = refused(lambda: base_engine.session(kv_memory=10**15), "kv_memory")
    assert "memory" in str(err) and not isinstance(err, TypeError)

    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(engine_mod, "KVStorage", no_memory)  # within MemTotal, but the allocation fails
    err = refused(lambda: base_engine.session(kv_memory=2**30), "kv_memory")
    assert "could not be allocated" in str(err) and isinstance(err.__cause__, RuntimeError)


def test_lone_surrogates_are_refused_by_name(engine):
    bad = "Hello \udc80 world"
    refused(lambda: engine.add_request(bad, greedy(2)), "prompt")
    refused(lambda: engine.add_request("Hi", greedy(2), system=bad), "system")
    refused(lambda: engine.encode(bad), "prompt")
    refused(lambda: SamplingParams(stop=[bad]), "stop")
    refused(lambda: bpe_merges(engine.tokenizer, "\ud800"), "word")
    assert not engine.has_unfinished()


def test_overlong_text_is_refused_before_tokenizing(engine, monkeypatch):
    monkeypatch.setattr(engine.tokenizer, "apply_chat_template",
                        lambda *a, **k: pytest.fail("tokenizer reached with an overlong prompt"))
    t = time.perf_counter()
    refused(lambda: engine.add_request("x" * 10_000_000, greedy(2)), "prompt")
    refused(lambda: engine.add_request("Hi", greedy(2), system="s" * (MAX_PROMPT_CHARS + 1)), "system")
    assert time.perf_counter() - t < 1.0


def test_stop_strings_are_capped():
    SamplingParams(stop=["a"] * 16)
    SamplingParams(stop=["a" * 256])
    refused(lambda: SamplingParams(stop=["a"] * 17), "stop")
    refused(lambda: SamplingParams(stop=["a" * 257]), "stop")


def test_nearest_tokens_k_and_token_text_ranges(engine):
    vocab = engine.spec.vocab_size
    for k in (0, -1, vocab, 10**9, 2.0, True, "3"):
        refused(lambda: engine.nearest_tokens(5, k), "k")
    for t in (-1, vocab, 10**9, 1.0, True, None, "5"):
        refused(lambda: engine.token_text(t), "token_id")
        refused(lambda: engine.nearest_tokens(t), "token_id")
    assert engine.token_text(vocab - 1) == engine.token_text(vocab - 1)


def test_sequence_ids_are_not_coerced(engine):
    sid = engine.add_request("Hi", greedy(1))
    run_all(engine)
    for bad in (float(sid), True if sid == 1 else False, str(sid)):
        refused(lambda: engine.result(bad), "seq_id")
    refused(lambda: engine.rewind(sid, 1.0), "num_output_tokens")
    refused(lambda: engine.rewind(sid, True), "num_output_tokens")
    refused(lambda: engine.force_token(sid, 1.0), "token_id")


def test_stream_checks_its_arguments_at_the_call(engine):
    refused(lambda: engine.stream(None), "prompt")  # no next() needed
    gen = engine.stream("Hi", greedy(2))
    assert not engine.has_unfinished()  # a stream never iterated leaves no request behind
    assert "".join(gen)


def test_bpe_trace_is_bounded(base_engine):
    tok = base_engine.tokenizer
    t = time.perf_counter()
    err = refused(lambda: bpe_merges(tok, "abcdefghij" * 100), "word")
    assert time.perf_counter() - t < 0.05 and str(MAX_BPE_CHARS) in str(err)
    bpe_merges(tok, "warm")  # the merge table is built on first use
    rng = np.random.default_rng(0)
    worst = 0.0
    for word in ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), MAX_BPE_CHARS)) for _ in range(3)] + [
            "ab" * (MAX_BPE_CHARS // 2), "é" * MAX_BPE_CHARS]:
        t = time.perf_counter()
        steps = bpe_merges(tok, word)
        worst = max(worst, time.perf_counter() - t)
        assert steps[-1]["ids"] == tok.encode(word, add_special_tokens=False)
    assert worst < 0.5  # measured ~10 ms


def test_a_branch_the_pool_cannot_hold_is_refused(base_engine):
    eng = _small_pool(base_engine, 3)
    sid = eng.add_request("Hi", greedy(2), chat=False)
    run_all(eng)
    refused(lambda: eng.branch(sid, 1, greedy(1000)), "kv_memory")
    assert len(eng.sequences) == 1 and not eng.has_unfinished()
