"""vLLM's request extras in the engine (issue 31): the bias stage of the sampling chain (logit_bias,
allowed_token_ids, bad_words, min_tokens), stop_token_ids, include_stop_str_in_output, skip_special_tokens and
prompt_logprobs, each checked for doing exactly what vLLM documents, on the bundled model."""
from __future__ import annotations

import math

import pytest
import torch

from engine import SamplingParams
from engine.sampling import BIAS_STAGE, sample, sampling_probs, token_bias, trace_chain

QUESTION = "What is gravity?"
RAIN = "Write a poem about rain."  # raw completion: the model's greedy first token is <|im_end|> (EOS)


def greedy(engine, prompt, chat=True, **kw):
    return engine.generate(prompt, SamplingParams(temperature=0.0, **kw), chat=chat)


# ---- the bias vector and the chain (no model) -------------------------------------------------------------
def test_token_bias_adds_bans_and_holds_eos_back_as_vllm_does():
    p = SamplingParams(logit_bias={3: 2.5, 4: -100}, min_tokens=2, stop_token_ids=(7,))
    b = token_bias(p, [1], 10, frozenset({0, 7}), bad_words_ids=((5,), (8, 9)))
    assert b[3] == 2.5 and b[4] == -100
    assert b[0] == b[7] == b[5] == -math.inf  # EOS and the stop token held back (1 < min_tokens); 5 is a bad word
    assert b[9] == 0  # (8, 9) is banned only after 8
    assert token_bias(p, [1, 8], 10, frozenset({0, 7}), ((8, 9),))[9] == -math.inf
    assert token_bias(p, [1, 2], 10, frozenset({0, 7}))[0] == 0  # min_tokens reached: EOS may come
    only = token_bias(SamplingParams(allowed_token_ids=(2, 6)), [], 10, frozenset())
    assert torch.isfinite(only).nonzero().flatten().tolist() == [2, 6]
    assert token_bias(SamplingParams(), [], 10, frozenset({0})) is None  # nothing to do: no stage


def test_the_bias_stage_is_recorded_and_drives_the_draw():
    torch.manual_seed(0)
    logits = torch.randn(50)
    params = SamplingParams(temperature=0.0, logit_bias={int(logits.argmax()): -100.0})
    bias = token_bias(params, [], 50, frozenset())
    trace = trace_chain(logits, params, [], [], 0.5, top_n=5, bias=bias)
    assert [s.name for s in trace.stages][:2] == ["logits", BIAS_STAGE]
    assert trace.chosen == int((logits + bias).argmax()) != int(logits.argmax())
    g = torch.Generator().manual_seed(1)
    assert sample(logits, params, [], [], g, bias=bias)[0] == trace.chosen
    # the distribution the draw uses is the biased one, renormalised
    hot = SamplingParams(logit_bias={1: 5.0, 2: -100.0})
    probs = sampling_probs(logits, hot, bias=token_bias(hot, [], 50, frozenset()))
    expected = torch.softmax(logits + token_bias(hot, [], 50, frozenset()), 0)
    assert torch.allclose(probs, expected, atol=1e-6) and probs[2] < 1e-30


@pytest.mark.parametrize("bad", [dict(logit_bias={1: 101}), dict(logit_bias={-1: 1}), dict(min_tokens=-1),
                                 dict(max_tokens=3, min_tokens=4), dict(allowed_token_ids=()),
                                 dict(stop_token_ids=("a",)), dict(bad_words=("",)), dict(prompt_logprobs=21),
                                 dict(skip_special_tokens="no"), dict(logit_bias={i: 1 for i in range(1025)})])
def test_bad_extras_are_refused_by_name(bad):
    with pytest.raises(ValueError) as err:
        SamplingParams(**bad)
    assert next(iter(bad)) in str(err.value)


def test_extras_travel_as_json_and_back():
    p = SamplingParams(min_tokens=2, stop_token_ids=[5], logit_bias={"12": -3}, allowed_token_ids=[1, 2],
                       bad_words=["x"], prompt_logprobs=2, include_stop_str_in_output=True, skip_special_tokens=False)
    assert SamplingParams.from_dict(p.to_dict()) == p and p.logit_bias == {12: -3.0}


# ---- the engine -------------------------------------------------------------------------------------------
def test_ignore_eos_and_min_tokens_hold_the_end_back(engine):
    first = greedy(engine, RAIN, chat=False, max_tokens=6)
    assert first.finish_reason == "eos" and len(first.token_ids) == 1 and first.text == ""
    held = greedy(engine, RAIN, chat=False, max_tokens=6, min_tokens=4)
    assert held.token_ids[:4] and not set(held.token_ids[:4]) & engine.eos_ids and len(held.token_ids) >= 4
    ignored = greedy(engine, RAIN, chat=False, max_tokens=6, ignore_eos=True)
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 6 and ignored.token_ids[0] in engine.eos_ids


def test_logit_bias_allowed_tokens_and_bad_words_change_the_answer(engine):
    base = greedy(engine, QUESTION, max_tokens=8)
    banned = base.token_ids[2]
    biased = greedy(engine, QUESTION, max_tokens=8, logit_bias={banned: -100})
    assert banned not in biased.token_ids and biased.token_ids[:2] == base.token_ids[:2]
    allowed = (30, 31, 32)
    only = greedy(engine, QUESTION, max_tokens=5, allowed_token_ids=allowed)
    assert set(only.token_ids) <= set(allowed)
    word = base.text.split()[0]  # "Gravity"
    clean = greedy(engine, QUESTION, max_tokens=8, bad_words=[word])
    assert word not in clean.text and clean.text != base.text


def test_stop_token_ids_and_include_stop_str_in_output(engine):
    base = greedy(engine, QUESTION, max_tokens=8)
    stop_id = base.token_ids[2]
    cut = greedy(engine, QUESTION, max_tokens=8, stop_token_ids=[stop_id])
    assert cut.finish_reason == "stop" and cut.token_ids == base.token_ids[:3]
    assert cut.text == engine.tokenizer.decode(base.token_ids[:2])  # the stop token's text is left out
    kept = greedy(engine, QUESTION, max_tokens=8, stop_token_ids=[stop_id], include_stop_str_in_output=True)
    assert kept.text == engine.tokenizer.decode(base.token_ids[:3])
    word = base.text.split()[1]
    with_stop = greedy(engine, QUESTION, max_tokens=8, stop=[word], include_stop_str_in_output=True)
    assert with_stop.finish_reason == "stop" and with_stop.text == base.text[: base.text.index(word) + len(word)]
    # min_tokens: the stop string is not looked for until min_tokens tokens exist
    late = greedy(engine, QUESTION, max_tokens=8, stop=[base.text.split()[0]], min_tokens=3)
    assert late.text.startswith(base.text.split()[0])


def test_skip_special_tokens_false_shows_the_special_tokens(engine):
    shown = greedy(engine, RAIN, chat=False, max_tokens=3, ignore_eos=True, skip_special_tokens=False)
    assert shown.text == engine.tokenizer.decode(shown.token_ids, skip_special_tokens=False)
    assert "<|im_end|>" in shown.text
    hidden = greedy(engine, RAIN, chat=False, max_tokens=3, ignore_eos=True)
    assert "<|im_end|>" not in hidden.text and hidden.token_ids == shown.token_ids


def test_what_if_and_speculative_rounds_apply_the_same_bias(engine):
    from engine import SpeculativeConfig

    rid = engine.add_request(QUESTION, SamplingParams(max_tokens=3, temperature=0.0))
    engine.step()
    trace = engine.what_if(rid, SamplingParams(temperature=0.0, logit_bias={engine.seq_view(rid).output_ids[0]: -100}))
    assert BIAS_STAGE in [s.name for s in trace.stages] and trace.chosen != engine.seq_view(rid).output_ids[0]
    base = greedy(engine, "one two one two one two one two one two", chat=False, max_tokens=10)
    banned = base.token_ids[3]
    spec = engine.generate("one two one two one two one two one two", SamplingParams(
        temperature=0.0, max_tokens=10, logit_bias={banned: -100}), chat=False,
        speculative=SpeculativeConfig(method="ngram", num_tokens=4))
    plain = greedy(engine, "one two one two one two one two one two", chat=False, max_tokens=10,
                   logit_bias={banned: -100})
    assert banned not in spec.token_ids and spec.token_ids == plain.token_ids


def test_prompt_logprobs_are_the_models_own_and_computed_in_chunks(base_engine, loaded):
    from transformers import AutoModelForCausalLM

    prompt = "The capital of France is Paris, and the capital of Italy is Rome."
    small = base_engine.session(max_num_batched_tokens=5)  # several prefill chunks: each reports its own rows
    ids = small.encode(prompt, chat=False).token_ids
    # the same prompt cached first: a request for prompt logprobs must still compute every position
    small.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0), chat=False)
    rid = small.add_request(prompt, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3), chat=False)
    records, chunks = [], 0
    while small.has_unfinished():
        ev = small.step().seq(rid)
        if ev is not None and ev.prompt_logprobs:
            chunks += 1
            records += ev.prompt_logprobs
    assert chunks > 1 and [r.position for r in records] == list(range(len(ids)))
    assert records[0].logprob is None and [r.token_id for r in records] == list(ids)
    hf = AutoModelForCausalLM.from_pretrained(str(loaded.source_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    for r in records[1:]:
        row = ref[r.position - 1]
        assert abs(r.logprob - float(row[r.token_id])) < 1e-3
        assert r.rank == int((row > row[r.token_id]).sum()) + 1
        assert r.top_ids == row.topk(3).indices.tolist()


# ---- the lab's charts draw the bias stage from the engine's event -----------------------------------------
def test_the_sampling_chain_chart_draws_the_bias_stage(engine):
    from app.charts import logits as logits_chart
    from app.charts import sampling as chart

    plain = engine.add_request(QUESTION, SamplingParams(max_tokens=1, temperature=0.0))
    first = engine.step().seq(plain).sampling
    banned, runner_up, third = first.token_ids[:3]  # the model's three favourites for the first token
    rid = engine.add_request(QUESTION, SamplingParams(max_tokens=1, temperature=0.0,
                                                      logit_bias={runner_up: 2.0, third: -1.0},
                                                      bad_words=[engine.token_text(banned).strip()]))
    tr = engine.step().seq(rid).sampling
    names = [s.name for s in tr.stages]
    assert names[:2] == ["logits", BIAS_STAGE] and tr.chosen != banned
    fig = chart.sampling_chain_chart(tr)
    bars = {b["name"]: b for b in fig["data"] if b["type"] == "bar"}
    assert [b["name"] for b in fig["data"] if b["type"] == "bar"] == names  # in the chain's order
    bias = next(s for s in tr.stages if s.name == BIAS_STAGE)
    assert bars[BIAS_STAGE]["x"] == bias.probs
    assert banned in chart.banned_by_bias(tr)
    title = fig["layout"]["title"]["text"].replace("<br>", " ")  # titles wrap (common.TITLE_CHARS)
    # the bad word's token banned, the runner-up pushed up, the third down
    assert f"of the {len(tr.token_ids)} shown {len(chart.banned_by_bias(tr))} banned, 1 pushed down, 1 up" in title
    assert tr.chosen == runner_up
    ru = chart.sampling_chain_chart(tr, lang="ru")
    assert "смещение" in ru["layout"]["title"]["text"] and "bias" in ru["data"][1]["name"]
    # the logits chart greys the banned rows as it greys a grammar's masked ones
    raw = logits_chart.logits_chart(tr, None)["data"][0]
    row = tr.token_ids.index(banned)
    assert raw["marker"]["color"][row] == logits_chart.GREY != raw["marker"]["color"][tr.token_ids.index(tr.chosen)]
