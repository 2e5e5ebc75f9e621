"""Speculative decoding on the real model: greedy identity with plain decoding for every drafter, the rejection
sampler's output distribution (with a deliberately broken rule that the same test catches), KV rollback equal to
a plain run's pool at every length, event contents, adaptive k and the measured comparison with plain decoding.
"""
from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Capture, SamplingParams, SpeculativeConfig, sampling_probs
from engine import speculative as S
from engine.metrics import expected_tokens_per_pass
from engine.model import KVStorage, SeqInput

PROMPTS = [
    "Repeat the following text exactly: The quick brown fox jumps over the lazy dog, and the dog keeps sleeping.",
    "Что такое гравитация? Ответь коротко.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    "Name three planets.",
    "Write a haiku about the sea.",
    "日本の首都はどこですか？",
]
EXTRACTIVE = PROMPTS[0]
N_TOKENS = 14


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def check_pool(eng):
    """Every block's refcount equals the table entries pointing at it; the bookkeeping is consistent."""
    eng.blocks.check_invariants()
    counts = Counter(b for t in eng.blocks.block_tables.values() for b in t)
    assert all(eng.blocks.refcount(b) == counts.get(b, 0) for b in range(eng.blocks.num_blocks))
    assert set(eng.blocks.block_tables) == {s.seq_id for s in eng.scheduler.running}


def run_all(eng, prompts, params, cfg=None):
    ids = [eng.add_request(p, params, speculative=cfg) for p in prompts]
    events = []
    while eng.has_unfinished():
        events.append(eng.step(trace=False))
        check_pool(eng)
    assert eng.blocks.stats()["used"] == 0
    return [eng.result(i) for i in ids], events


# ---- tiny checkpoints: a same-tokenizer draft (low acceptance) and one with a foreign tokenizer ------------------

def _tiny_llama(vocab_size, seed=0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_draft_dir(tmp_path_factory, base_engine):
    d = tmp_path_factory.mktemp("tiny_draft")
    _tiny_llama(base_engine.spec.vocab_size).save_pretrained(str(d))
    base_engine.tokenizer.save_pretrained(str(d))
    return str(d)


@pytest.fixture(scope="module")
def foreign_tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("foreign_tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(d))
    _tiny_llama(len(fast)).save_pretrained(str(d))
    return str(d)


# ---- configuration errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(method="medusa"), "unknown speculative method"),
    (dict(method="ngram", num_tokens=0), "num_tokens"),
    (dict(method="ngram", num_tokens=2.0), "num_tokens"),
    (dict(method="early_exit", exit_layer=0), "exit_layer"),
    (dict(method="ngram", exit_layer=3), "exit_layer applies"),
    (dict(method="draft"), "needs draft_model"),
    (dict(method="ngram", ngram_min=3, ngram_max=2), "ngram_min"),
])
def test_bad_configs_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig(**kwargs)


def test_model_dependent_errors(engine, foreign_tokenizer_dir):
    with pytest.raises(ValueError, match="exit_layer must be between 1 and 29"):
        engine.add_request("Hi", greedy(4), speculative=SpeculativeConfig("early_exit", 2, exit_layer=30))
    with pytest.raises(ValueError, match="SpeculativeConfig"):
        engine.add_request("Hi", greedy(4), speculative="ngram")
    with pytest.raises(ValueError, match="different tokenizer"):
        engine.add_request("Hi", greedy(4),
                           speculative=SpeculativeConfig("draft", 2, draft_model=foreign_tokenizer_dir))
    assert not engine.has_unfinished()  # refused requests leave nothing behind


# ---- greedy: identical ids to plain decoding -----------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_outputs(base_engine):
    results, _ = run_all(base_engine.session(), PROMPTS, greedy(N_TOKENS))
    return [r.token_ids for r in results]


DRAFTERS = {
    "ngram": lambda eng, tiny: SpeculativeConfig("ngram", 4),
    "early_exit": lambda eng, tiny: SpeculativeConfig("early_exit", 3),
    # the bundled model drafting for itself: its weights are reused, not loaded again
    "draft_bundled": lambda eng, tiny: SpeculativeConfig("draft", 3, draft_model=eng),
    # a random 2-layer model with the same tokenizer: nearly every draft is rejected
    "draft_tiny": lambda eng, tiny: SpeculativeConfig("draft", 3, draft_model=tiny),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_is_identical_to_plain(base_engine, plain_outputs, tiny_draft_dir, name):
    eng = base_engine.session()
    cfg = DRAFTERS[name](base_engine, tiny_draft_dir)
    results, events = run_all(eng, PROMPTS, greedy(N_TOKENS), cfg)
    assert [r.token_ids for r in results] == plain_outputs
    rounds = [s.spec for e in events for s in e.seqs if s.spec is not None]
    assert sum(r.num_drafted for r in rounds) > 0
    total = {k: sum(r.speculative[k] for r in results)
             for k in ("proposed", "accepted", "reached", "target_passes", "rounds")}
    assert total["accepted"] <= total["reached"] <= total["proposed"] == sum(r.num_drafted for r in rounds)
    assert total["rounds"] == len(rounds)
    # a round emits its kept drafts and one more token unless EOS cut it; each prefill pass emits one token
    assert all(r.num_emitted == r.num_accepted + 1 for r in rounds if not r.truncated)
    tokens = sum(len(r.token_ids) for r in results)
    assert tokens == sum(r.num_emitted for r in rounds) + total["target_passes"] - total["rounds"]
    if name == "draft_bundled":  # the target drafting for itself agrees with itself
        assert total["accepted"] == total["proposed"]
    if name in ("early_exit", "draft_tiny"):
        assert total["reached"] > total["accepted"]  # rejections happened and were handled
    if name == "ngram":
        assert total["accepted"] >= 6  # the extractive prompt copies: prompt lookup pays off


def test_stop_string_and_eos_inside_a_round(engine):
    cfg = SpeculativeConfig("ngram", 6)
    plain = engine.generate(EXTRACTIVE, greedy(60))
    rid = engine.add_request(EXTRACTIVE, greedy(60), speculative=cfg)
    last = engine.run_until_done()[-1].seq(rid).spec
    spec = engine.result(rid)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason == "eos"
    # the prompt's own "<|im_end|>\n<|im_start|>assistant" was drafted after the copied text: EOS was accepted
    # as a draft and the round was cut right after it
    assert last.truncated and last.emitted_ids[-1] in engine.eos_ids and last.num_accepted >= 1
    word = " lazy"
    assert word in plain.text
    p_stop = engine.generate(EXTRACTIVE, greedy(60, stop=(word,)))
    rid = engine.add_request(EXTRACTIVE, greedy(60, stop=(word,)), speculative=cfg)
    events = engine.run_until_done()
    s_stop = engine.result(rid)
    assert s_stop.finish_reason == "stop" and s_stop.text == p_stop.text == plain.text[: plain.text.index(word)]
    assert s_stop.token_ids == p_stop.token_ids
    last = events[-1].seq(rid).spec
    assert last.truncated and last.num_emitted < last.num_accepted + 1  # the stop cut the round short
    assert engine.blocks.stats()["used"] == 0


def test_seeded_sampling_reproduces_and_streams(engine):
    cfg = SpeculativeConfig("early_exit", 2)
    p = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.95, seed=11)
    a = engine.generate("Tell me a story.", p, speculative=cfg)
    b = engine.generate("Tell me a story.", p, speculative=cfg)
    c = engine.generate("Tell me a story.", SamplingParams(max_tokens=10, temperature=0.8, top_p=0.95, seed=12),
                        speculative=cfg)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    assert "".join(engine.stream("Tell me a story.", p, speculative=cfg)) == a.text
    assert a.speculative["reached"] > 0


# ---- the rejection sampler's output distribution -------------------------------------------------------------

def _logits(model, contexts, exit_layer=None):
    """Next-token logits of each context in one forward over a scratch KV pool."""
    total = sum(len(c) for c in contexts)
    kv = KVStorage(model.spec, -(-total // 16), 16, model.dtype, model.device)
    inputs, off = [], 0
    for c in contexts:
        inputs.append(SeqInput(list(c), 0, torch.arange(off, off + len(c)), 1))
        off += len(c)
    return model.forward(inputs, kv, exit_layer=exit_layer)[0]


def _chi2(observed: Counter, probs: torch.Tensor, n: int) -> tuple[float, int]:
    """Pearson chi-square of counts against n · probs and its degrees of freedom; bins expecting < 5 are pooled.

    A token outside the support of `probs` cannot occur under the null: the statistic is then infinite.
    """
    if any(probs[t] <= 0 for t in observed):
        return math.inf, 1
    stat, dof, small_o, small_e = 0.0, -1, 0.0, 0.0
    for t in torch.nonzero(probs > 0).flatten().tolist():
        e = n * float(probs[t])
        if e < 5:
            small_o, small_e = small_o + observed.get(t, 0), small_e + e
        else:
            stat, dof = stat + (observed.get(t, 0) - e) ** 2 / e, dof + 1
    if small_e > 0:
        stat, dof = stat + (small_o - small_e) ** 2 / small_e, dof + 1
    return stat, dof


def _pvalue(tests: list[tuple[Counter, torch.Tensor]]) -> float:
    """P-value of the chi-squares of several independent samples summed (a conditional test pooled over contexts)."""
    stat, dof = 0.0, 0
    for observed, probs in tests:
        s, d = _chi2(observed, probs, sum(observed.values()))
        stat, dof = stat + s, dof + max(d, 0)
    if math.isinf(stat):
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def real_p_q(base_engine):
    """Real target (p) and early-exit (q) distributions after the sampling chain, at positions 1, 2 and 3.

    The context is "The ocean" into an answer, where the exit at layer 20 overlaps the target by about half.
    """
    eng, L = base_engine, 20
    params = SamplingParams(temperature=1.0, top_k=6, presence_penalty=0.3)
    prompt = eng.encode("Write one word that describes the ocean.").token_ids
    out = eng.session().generate("Write one word that describes the ocean.", greedy(2)).token_ids
    ctx = prompt + out

    def chain(rows, drafted):
        return [sampling_probs(r, params, prompt, out + list(d)) for r, d in zip(rows, drafted)]

    p1 = chain(_logits(eng.model, [ctx]), [()])[0]
    q1 = chain(_logits(eng.model, [ctx], L), [()])[0]
    ones = [(a,) for a in torch.nonzero(q1).flatten().tolist()]
    p2 = dict(zip([a for a, in ones], chain(_logits(eng.model, [ctx + list(a) for a in ones]), ones)))
    q2 = dict(zip([a for a, in ones], chain(_logits(eng.model, [ctx + list(a) for a in ones], L), ones)))
    pairs = [(a, b) for a in p2 for b in torch.nonzero(q2[a]).flatten().tolist()]
    p3 = dict(zip(pairs, chain(_logits(eng.model, [ctx + list(ab) for ab in pairs]), pairs)))
    return p1, q1, p2, q2, p3


def _simulate(real, n, rule=None, seed=0):
    """n two-draft rounds through the engine's drafter draw and its `verify`, as the engine runs them."""
    p1, q1, p2, q2, p3 = real
    g = torch.Generator().manual_seed(seed)
    first, second, bonus = Counter(), {}, {}
    for _ in range(n):
        d1, _ = S.draw(q1, g)
        d2, _ = S.draw(q2[d1], g)
        rows = [p1, p2.get(d1), p3.get((d1, d2))]
        v = S.verify([d1, d2], torch.stack([q1, q2[d1]]), lambda i: rows[i], g, accept_rule=rule)
        out = v.tokens
        first[out[0]] += 1
        if v.num_accepted >= 1:  # the second token of this round exists only when draft 1 was kept
            second.setdefault(d1, Counter())[out[1]] += 1
        if v.num_accepted == 2:
            bonus.setdefault((d1, d2), Counter())[out[2]] += 1
    return first, second, bonus


def _pvalues(real, first, second, bonus):
    """First emitted token against p1; the second given draft 1 = a against p2(·|a); the bonus given (a, b)."""
    p1, _, p2, _, p3 = real
    return (_pvalue([(first, p1)]), _pvalue([(c, p2[a]) for a, c in second.items()]),
            _pvalue([(c, p3[ab]) for ab, c in bonus.items()]))


def test_rejection_sampler_reproduces_the_target_distribution(real_p_q):
    p1, q1 = real_p_q[0], real_p_q[1]
    assert 0.05 < float(torch.minimum(p1, q1).sum()) < 0.95  # p and q overlap but differ: both paths are taken
    n = 3000
    first, second, bonus = _simulate(real_p_q, n)
    assert sum(sum(c.values()) for c in second.values()) > 500 and sum(sum(c.values()) for c in bonus.values()) > 100
    pf, ps, pb = _pvalues(real_p_q, first, second, bonus)
    assert pf > 0.01 and ps > 0.01 and pb > 0.01, (pf, ps, pb)
    # the same test against broken rules must fail. Keeping every draft emits q's tokens (some impossible under p);
    # forgetting to divide by q keeps too few drafts, so the residual's tokens are over-represented.
    for broken in (lambda p_x, q_x, u: True, lambda p_x, q_x, u: p_x > 0 and u <= p_x):
        first, second, bonus = _simulate(real_p_q, n, rule=broken)
        pf, ps, _ = _pvalues(real_p_q, first, second, bonus)
        assert pf < 1e-6 and ps < 1e-6, (pf, ps)


def test_greedy_verification_accepts_while_the_draft_is_the_argmax():
    p = torch.zeros(4, 10)
    p[0, 3] = p[1, 5] = p[2, 7] = p[3, 1] = 1.0
    v = S.verify([3, 5, 2], None, p, torch.Generator().manual_seed(0))
    assert v.num_accepted == 2 and v.final_kind == "resampled" and v.tokens == [3, 5, 7]
    v = S.verify([3, 5, 7], None, p, torch.Generator().manual_seed(0))
    assert v.final_kind == "bonus" and v.tokens == [3, 5, 7, 1]


# ---- KV rollback --------------------------------------------------------------------------------------------

def _pool_by_length(eng, params, cfg=None):
    """(block table, states of every block in the pool, round) after every step, keyed by the sequence's length."""
    rid = eng.add_request(EXTRACTIVE, params, speculative=cfg)
    states = {}
    while eng.has_unfinished():
        ev = eng.step(trace=False)
        check_pool(eng)
        if rid in eng.blocks.block_tables:
            states[eng.sequences[rid].num_tokens] = (list(eng.blocks.block_tables[rid]), eng.blocks.block_states(),
                                                     ev.seq(rid).spec)
    return states


ROLLBACK_PARAMS = greedy(24)


@pytest.fixture(scope="module")
def plain_pool(base_engine):
    # a small block size puts block boundaries inside rounds, so rolled-back drafts free whole blocks
    return _pool_by_length(base_engine.session(block_size=4), ROLLBACK_PARAMS)


@pytest.mark.parametrize("method", ["ngram", "early_exit"])
def test_rollback_leaves_the_pool_as_a_plain_run_at_the_same_length(base_engine, plain_pool, method):
    plain = plain_pool
    cfg = SpeculativeConfig(method, 5 if method == "ngram" else 3)
    spec = _pool_by_length(base_engine.session(block_size=4), ROLLBACK_PARAMS, cfg)
    assert spec and set(spec) <= set(plain)
    released = 0
    for length, (table, states, round_) in spec.items():
        assert table == plain[length][0], length
        assert states == plain[length][1], length  # refcounts, hashes, cached/free: the whole pool
        released += len(round_.rollback.blocks) if round_ else 0
        if round_ and round_.num_drafted:
            assert round_.rollback.slots == round_.num_drafted + 1 - round_.num_emitted
    assert released > 0  # some rounds really did give blocks back


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["ngram", "early_exit"]), k=st.integers(1, 6), prompt=st.integers(0, 5),
       max_tokens=st.integers(1, 10), stop=st.sampled_from([(), (" the",), ("\n",)]),
       temperature=st.sampled_from([0.0, 0.9]), pool=st.sampled_from([6, 40]))
def test_random_speculative_runs_never_leak(base_engine, method, k, prompt, max_tokens, stop, temperature, pool):
    eng = base_engine.session(kv_memory=pool * 16 * base_engine.kv_bytes_per_token)
    cfg = SpeculativeConfig(method, k, exit_layer=4 if method == "early_exit" else None)  # cheap drafts
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop, seed=prompt)
    a = eng.add_request(PROMPTS[prompt], params, speculative=cfg)
    b = eng.add_request(PROMPTS[(prompt + 1) % 6], greedy(6))  # a plain neighbour competing for blocks
    while eng.has_unfinished():
        ev = eng.step(trace=False)
        check_pool(eng)
        s = ev.seq(a)
        if s is not None and s.spec is not None:
            assert s.spec.emitted_ids == eng.sequences[a].output_ids[-s.spec.num_emitted:]
    assert eng.blocks.stats()["used"] == 0
    res = eng.result(a)
    assert len(res.token_ids) <= max_tokens and eng.result(b).finish_reason is not None
    if temperature == 0.0 and pool == 40:
        assert res.token_ids == base_engine.session().generate(PROMPTS[prompt], params).token_ids


# ---- events, capture, adaptive k, comparison ----------------------------------------------------------------

def test_round_events_carry_the_verification(engine):
    cfg = SpeculativeConfig("early_exit", 3, exit_layer=24)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, repetition_penalty=1.3, presence_penalty=0.5)
    rid = engine.add_request("Name three planets.", params, speculative=cfg)
    engine.instrument = Capture(lens_top_k=2)
    events = [engine.step() for _ in range(4)]
    engine.instrument = None
    seq = engine.sequences[rid]
    checked = 0
    for ev in events[1:]:
        s = ev.seq(rid)
        sp = s.spec
        json.dumps(s.to_dict(), allow_nan=False)
        assert s.phase == "decode" and s.num_processed == 1 + sp.num_drafted
        assert s.new_token == sp.emitted_ids[-1] and sp.num_emitted == len(sp.emitted_ids)
        assert s.capture is not None and len(s.capture.positions) == s.num_processed
        for d in sp.draft:
            if d.verdict != "unchecked":
                assert (d.verdict == "accepted") == (d.p > 0 and d.u * d.q <= d.p)
        kept = [d.token for d in sp.draft[: sp.num_accepted]]
        assert sp.emitted_ids == kept + [sp.final.token]
        assert len(sp.dists) == sp.num_accepted + 1
        # p(x) at every tested draft, recomputed independently: the target run on the context with the earlier
        # drafts, penalised as if they had been accepted
        start = s.num_tokens - sp.num_emitted  # length before the round (pending token included)
        ctx = seq.token_ids[:start]
        for d in sp.draft:
            if d.verdict == "unchecked":
                continue
            prev = [x.token for x in sp.draft[: d.position - 1]]
            logits = _logits(engine.model, [ctx + prev])[0]
            p = sampling_probs(logits, params, seq.prompt_ids, ctx[len(seq.prompt_ids):] + prev)
            q = sampling_probs(_logits(engine.model, [ctx + prev], 24)[0], params, seq.prompt_ids,
                               ctx[len(seq.prompt_ids):] + prev)
            assert d.p == pytest.approx(float(p[d.token]), abs=2e-4)
            assert d.q == pytest.approx(float(q[d.token]), abs=2e-4)
            checked += 1
        if sp.residual is not None:
            r = sp.residual
            assert r.drawn == sp.final.token and sp.final.kind == "resampled" and r.mass > 0
            for p_, q_, res in zip(r.p, r.q, r.residual):
                assert res == pytest.approx(max(p_ - q_, 0.0) / r.mass, abs=1e-5)
    assert checked >= 3
    engine.run_until_done()


def test_adaptive_k_follows_acceptance(engine):
    rid = engine.add_request("Write a haiku about the sea.", greedy(14),
                             speculative=SpeculativeConfig("early_exit", 4, adaptive=True))
    ks = [ev.seq(rid).spec for ev in engine.run_until_done() if ev.seq(rid) and ev.seq(rid).spec]
    assert all(r.adaptive is not None for r in ks)
    # the exit at a third of the layers almost never agrees with the target: k falls from 4
    assert ks[-1].adaptive.k_next < 4
    for prev, cur in zip(ks, ks[1:]):
        assert cur.k <= prev.adaptive.k_next
    rid = engine.add_request(EXTRACTIVE, greedy(12), speculative=SpeculativeConfig("ngram", 4, adaptive=False))
    assert all(ev.seq(rid).spec.adaptive is None for ev in engine.run_until_done() if ev.seq(rid).spec)


def test_compare_with_plain(base_engine):
    ids = base_engine.encode(EXTRACTIVE).token_ids
    out = S.compare_with_plain(base_engine, ids, greedy(64, ignore_eos=True), SpeculativeConfig("ngram", 4),
                               max_tokens=20)
    assert out["same_tokens"] and out["plain"]["tokens"] == out["speculative"]["tokens"] == 20
    assert out["speedup"] == pytest.approx(out["speculative"]["tok_s"] / out["plain"]["tok_s"])
    stats = out["speculative"]["stats"]
    assert stats["target_passes"] < 20 and stats["tokens_per_pass"] == pytest.approx(20 / stats["target_passes"])
    assert stats["expected_tokens_per_round"] == pytest.approx(
        sum(c * expected_tokens_per_pass(stats["alpha"], k) for k, c in stats["k_hist"].items()) / stats["rounds"])
