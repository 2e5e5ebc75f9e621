"""Constrained decoding on the real model (engine/grammar.py, the "grammar" stage of engine/sampling.py).

What issue 15 asks to show: every output parses under its grammar over seeded samples at temperature 1 (JSON
Schema checked by `jsonschema`, regexes full-matched); greedy under a grammar that allows the unconstrained
greedy path gives the same ids; the masked distribution is the unmasked one restricted and renormalised
(1e-6); speculative decoding with a grammar equals plain decoding under greedy; force / rewind / branch keep the
matcher where the output is; bad grammars are refused with a clear message before any step.
"""
from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
import torch

from engine import Grammar, SamplingParams, SpeculativeConfig, StepEvent, sampling_probs
from engine import grammar as G
from engine.sampling import SamplingTrace, trace_chain
from engine.tokenizer import token_bytes

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
DATE = r"\d{4}-\d{2}-\d{2}"
YES_NO = ["yes", "no"]
# Lark syntax, as llguidance reads it: a small arithmetic language
EXPR = 'start: expr\nexpr: NUM OP NUM | NUM OP NUM OP NUM\nNUM: /[0-9]{1,3}/\nOP: " + " | " - " | " * "'
EXPR_RE = r"[0-9]{1,3}( [-+*] [0-9]{1,3}){1,2}"

CASES = [  # (grammar, prompt, check of the output text)
    (Grammar.json_schema(PERSON), "Invent a person. Answer as JSON with name and age.",
     lambda text: jsonschema.validate(json.loads(text), PERSON)),
    (Grammar.regex(DATE), "When did the first person land on the Moon? Give the date.",
     lambda text: _fullmatch(DATE, text)),
    (Grammar.choice(YES_NO), "Is the sky blue? Answer yes or no.", lambda text: _is_in(text, YES_NO)),
    (Grammar.ebnf(EXPR), "Write a short sum of two numbers.", lambda text: _fullmatch(EXPR_RE, text)),
]


def _fullmatch(pattern: str, text: str) -> None:
    assert re.fullmatch(pattern, text), f"{text!r} does not match {pattern}"


def _is_in(text: str, options: list[str]) -> None:
    assert text in options, f"{text!r} is not one of {options}"


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def run(eng, ids, trace=False):
    events = []
    while eng.has_unfinished():
        events.append(eng.step(trace=trace))
    return [eng.result(i) for i in ids], events


def matcher_matches_output(eng, sid):
    """The engine's matcher for `sid` has consumed exactly the sequence's output."""
    return eng._grammars[sid].consumed == list(eng.seq_view(sid).output_ids)


# ---- every output parses ---------------------------------------------------------------------------------------

def test_every_sample_at_temperature_1_parses(engine):
    seeds = range(5)
    ids = [(check, engine.add_request(prompt, SamplingParams(max_tokens=48, temperature=1.0, seed=s, grammar=g)))
           for g, prompt, check in CASES for s in seeds]
    results, events = run(engine, [sid for _, sid in ids])
    assert len(results) == len(CASES) * len(seeds)
    for (check, _), res in zip(ids, results):
        assert res.finish_reason in ("grammar", "eos"), (res.text, res.finish_reason)
        check(res.text)
    # the samples differ (the loop is not checking one answer twenty times)
    assert len({r.text for r in results[: len(seeds)]}) > 1
    # every constrained step built its masks, and the step's timing says how long that took
    assert all(e.timing.grammar_ms > 0 for e in events if any(s.new_token is not None for s in e.seqs))


def test_eos_is_allowed_only_once_the_grammar_accepts(engine):
    # digits then EOS: "\d+" accepts after the first digit but may go on, so only EOS (or max_tokens) ends it
    g = Grammar.regex(r"[0-9]+")
    sid = engine.add_request("Count from one to five, digits only.", greedy(12, grammar=g))
    _, events = run(engine, [sid], trace=True)
    res = engine.result(sid)
    steps = [e.seq(sid).sampling for e in events if e.seq(sid) is not None and e.seq(sid).sampling is not None]
    first = steps[0]
    assert not first.grammar.accepting and engine.eos_ids.isdisjoint(
        t for t, kept in zip(first.token_ids, _stage(first, "grammar").kept) if kept)
    assert all(s.grammar.accepting for s in steps[1:])
    text = res.text
    assert re.fullmatch(r"[0-9]+", text), text
    assert res.finish_reason in ("eos", "length")


def _stage(trace: SamplingTrace, name: str):
    return next(s for s in trace.stages if s.name == name)


# ---- greedy under a grammar that allows the greedy path ------------------------------------------------------------

def test_greedy_with_a_grammar_allowing_its_path_gives_the_same_ids(base_engine):
    prompt = "What is the capital of France?"
    plain = base_engine.session()
    ref = plain.generate(prompt, greedy(20))
    assert ref.text and ref.token_ids
    # (1) a grammar that allows any text: the same ids and the same ending (EOS stays allowed: it accepts)
    anything = base_engine.session().generate(prompt, greedy(20, grammar=Grammar.regex(r"(?s:.*)")))
    assert anything.token_ids == ref.token_ids and anything.finish_reason == ref.finish_reason
    # (2) a grammar that allows exactly the greedy text: the same ids, ended by the grammar instead of EOS
    eos = ref.token_ids[-1] in base_engine.eos_ids
    kept = ref.token_ids[:-1] if eos else ref.token_ids
    text = b"".join(token_bytes(base_engine.tokenizer, t) for t in kept).decode("utf-8")
    exact = base_engine.session().generate(prompt, greedy(20, grammar=Grammar.choice([text])))
    assert exact.token_ids == kept
    assert exact.finish_reason == "grammar"


# ---- the masked distribution ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_step(base_engine):
    """Real logits of a real prompt and the JSON grammar's mask after a real prefix of output."""
    eng = base_engine.session()
    sid = eng.add_request("Invent a person. Answer as JSON with name and age.", greedy(6, grammar=Grammar.json_schema(PERSON)))
    run(eng, [sid], trace=True)
    out = list(eng.seq_view(sid).output_ids)
    gm = G.compile_grammar(Grammar.json_schema(PERSON), eng.tokenizer, eng.spec.vocab_size, eng.eos_ids)
    gm.sync(out)
    return eng.last_logits(sid), gm.allowed(), eng.seq_view(sid)


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7), dict(temperature=1.3, top_p=0.9),
                                dict(temperature=0.8, top_k=3, repetition_penalty=1.3)])
def test_masked_distribution_is_the_reference_restricted_and_renormalised(real_step, kw):
    logits, mask, view = real_step
    assert 1 < int(mask.sum()) < mask.numel()  # a real cut: inside a JSON string many tokens, not all
    params = SamplingParams(**kw)
    got = sampling_probs(logits, params, view.prompt_ids, view.output_ids, mask=mask).double()
    assert float(got[~mask].abs().max()) == 0.0
    assert abs(float(got.sum()) - 1.0) < 1e-6

    def restricted(p):
        p = torch.where(mask, p.double(), torch.zeros_like(p.double()))
        return p / p.sum()
    if "top_k" not in kw and "top_p" not in kw:
        # the reference: the unmasked chain's own distribution, restricted to the allowed tokens and renormalised
        ref = sampling_probs(logits, params, view.prompt_ids, view.output_ids)
        assert float((got - restricted(ref)).abs().max()) < 1e-6
        # and the same computed apart in float64: softmax(logits / T) over the vocabulary, restricted, renormalised
        exact = restricted(torch.softmax(logits.double() / kw["temperature"], 0))
        assert float((got - exact).abs().max()) < 1e-6
    else:
        # with cuts, the mask comes first: the cuts choose among allowed tokens (the unmasked chain run on logits
        # the mask already set to -inf), then the same renormalisation
        pre = logits.masked_fill(~mask, float("-inf"))
        ref = sampling_probs(pre, params, view.prompt_ids, view.output_ids)
        assert float((got - restricted(ref)).abs().max()) < 1e-6
        # and the cuts did cut: fewer tokens than the mask allows
        assert 0 < int((got > 0).sum()) < int(mask.sum())


def test_trace_records_the_grammar_stage(base_engine):
    # the first token of a JSON answer: the model would start with prose, the grammar allows only "{"
    eng = base_engine.session()
    sid = eng.add_request("Invent a person. Answer as JSON with name and age.", greedy(1))
    eng.step()
    logits, view = eng.last_logits(sid), eng.seq_view(sid)
    mask = G.compile_grammar(Grammar.json_schema(PERSON), eng.tokenizer, eng.spec.vocab_size, eng.eos_ids).allowed()
    view = dataclasses.replace(view, output_ids=())
    params = SamplingParams(temperature=1.0)
    tr = trace_chain(logits, params, view.prompt_ids, view.output_ids, 0.5, top_n=20, mask=mask)
    names = [s.name for s in tr.stages]
    assert names[:3] == ["logits", "grammar", "penalties"]
    st = _stage(tr, "grammar")
    raw_p = torch.softmax(logits.double(), 0)
    assert st.num_kept == int(mask.sum())
    # the mass is read off the raw logits' float32 softmax (the "logits" stage, as unconstrained traces show it)
    assert st.mass_removed == pytest.approx(float(raw_p[~mask].sum()), abs=2e-5)
    for tid, kept, p in zip(tr.token_ids, st.kept, st.probs):
        assert kept == bool(mask[tid])
        assert p == pytest.approx(float(raw_p[tid] / raw_p[mask].sum()) if kept else 0.0, abs=1e-6)
    # the tracked tokens are the model's own top 20 (the ones the grammar cut included), plus allowed ones
    top20 = torch.topk(logits, 20).indices.tolist()
    assert tr.token_ids[:20] == top20
    assert sum(st.kept[:20]) < 20 and sum(st.kept) >= 1
    assert SamplingTrace.from_dict(json.loads(json.dumps(tr.to_dict()))).to_dict() == tr.to_dict()


# ---- speculative decoding ------------------------------------------------------------------------------------------

def test_speculative_with_a_grammar_equals_plain_under_greedy(base_engine):
    # the prompt's JSON has a string age: prompt lookup drafts it, the grammar (an integer age) forbids it
    prompt = 'Copy this JSON: {"name": "Ada Lovelace",  "age": "thirty-six"}'
    params = greedy(40, grammar=Grammar.json_schema(PERSON))
    plain = base_engine.session().generate(prompt, params)
    eng = base_engine.session()
    sid = eng.add_request(prompt, params, speculative=SpeculativeConfig("ngram", num_tokens=4))
    _, events = run(eng, [sid], trace=True)
    spec = eng.result(sid)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason == "grammar"
    jsonschema.validate(json.loads(spec.text), PERSON)
    rounds = [e.seq(sid).spec for e in events if e.seq(sid) is not None and e.seq(sid).spec is not None]
    drafts = [d for r in rounds for d in r.draft]
    assert any(d.verdict == "accepted" for d in drafts)
    # drafts outside the grammar were checked and rejected: under the mask the target gives them p = 0
    rejected = [d for d in drafts if d.verdict == "rejected"]
    assert rejected and all(d.p == 0.0 for d in rejected)


def test_speculative_samples_with_a_grammar_parse(base_engine):
    eng = base_engine.session()
    cfg = SpeculativeConfig("ngram", num_tokens=3)
    ids = [eng.add_request('Repeat exactly: {"name": "Ada", "age": 36}',
                           SamplingParams(max_tokens=40, temperature=1.0, seed=s, grammar=Grammar.json_schema(PERSON)),
                           speculative=cfg) for s in range(3)]
    results, _ = run(eng, ids)
    for r in results:
        jsonschema.validate(json.loads(r.text), PERSON)
        assert r.speculative["proposed"] > 0


# ---- force, rewind, branch -----------------------------------------------------------------------------------------

def test_force_refuses_a_token_the_grammar_forbids_and_follows_an_allowed_one(engine):
    sid = engine.add_request("Is the sky blue?", greedy(8, grammar=Grammar.choice(["yes", "no", "maybe"])))
    tok = engine.tokenizer
    hello = tok.encode("Hello", add_special_tokens=False)[0]
    with pytest.raises(ValueError, match="not allowed by sequence .* grammar"):
        engine.force_token(sid, hello)
    eos = min(engine.eos_ids)
    with pytest.raises(ValueError, match="not allowed"):  # EOS before the grammar accepts
        engine.force_token(sid, eos)
    assert engine.seq_view(sid).forced_token is None  # a refusal changes nothing
    may = tok.encode("maybe", add_special_tokens=False)
    engine.force_token(sid, may[0])
    run(engine, [sid])
    res = engine.result(sid)
    assert res.text == "maybe" and res.finish_reason == "grammar"
    assert matcher_matches_output(engine, sid)


def test_rewind_and_branch_keep_the_matcher_with_the_output(base_engine):
    prompt = "Invent a person. Answer as JSON with name and age."
    params = greedy(40, grammar=Grammar.json_schema(PERSON))
    eng = base_engine.session()
    sid = eng.add_request(prompt, params)
    full = run(eng, [sid])[0][0]
    assert full.finish_reason == "grammar" and len(full.token_ids) > 6
    # rewind into the middle of the object: the matcher rolls back with the output, and greedy continues the same
    eng.rewind(sid, 5)
    assert matcher_matches_output(eng, sid) and not eng._grammars[sid].done
    again = run(eng, [sid])[0][0]
    assert again.token_ids == full.token_ids
    # a branch from token 4 gets a matcher of its own at token 4; the parent's is untouched
    child = eng.branch(sid, 4, params=SamplingParams(max_tokens=40, temperature=1.0, seed=3,
                                                     grammar=Grammar.json_schema(PERSON)))
    assert eng._grammars[child].consumed == list(full.token_ids[:4])
    assert matcher_matches_output(eng, sid)
    res = run(eng, [child])[0][0]
    assert res.token_ids[:4] == full.token_ids[:4]
    jsonschema.validate(json.loads(res.text), PERSON)
    assert matcher_matches_output(eng, child) and matcher_matches_output(eng, sid)
    # a branch under a grammar its inherited output does not fit is refused, and nothing is added
    before = eng.seq_ids()
    with pytest.raises(ValueError, match="does not fit the grammar"):
        eng.branch(sid, 4, params=greedy(40, grammar=Grammar.regex(DATE)))
    assert eng.seq_ids() == before


def test_what_if_recomputes_with_the_same_mask(engine):
    sid = engine.add_request("When did the first person land on the Moon?", greedy(10, grammar=Grammar.regex(DATE)))
    ev = engine.step()
    ev = engine.step()  # a decode step: the mask allows digits only
    tr = ev.seq(sid).sampling
    wi = engine.what_if(sid, SamplingParams(temperature=2.0, top_k=0))  # the slider's params carry no grammar
    g, gw = _stage(tr, "grammar"), _stage(wi, "grammar")
    assert gw.num_kept == g.num_kept and wi.grammar == tr.grammar
    assert [s.name for s in wi.stages][:2] == ["logits", "grammar"]
    for tid, p in zip(wi.token_ids, wi.stages[-1].probs):
        assert p == 0.0 or engine.token_text(tid).isdigit()
    assert engine.token_text(wi.chosen).isdigit()


def test_a_failed_step_leaves_the_matcher_with_the_output(engine, monkeypatch):
    sid = engine.add_request("When did the first person land on the Moon?", greedy(10, grammar=Grammar.regex(DATE)))
    engine.step()
    engine.step()
    before = list(engine.seq_view(sid).output_ids)
    real = engine._make_event

    def boom(w):
        raise RuntimeError("injected after sampling")
    monkeypatch.setattr(engine, "_make_event", boom)
    with pytest.raises(Exception, match="undone"):
        engine.step()
    monkeypatch.setattr(engine, "_make_event", real)
    assert list(engine.seq_view(sid).output_ids) == before
    res = run(engine, [sid])[0][0]
    _fullmatch(DATE, res.text)
    assert matcher_matches_output(engine, sid)


# ---- bad grammars --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: Grammar.regex("(ab"), r"grammar \(regex\) is invalid: .*unclosed group"),
    (lambda: Grammar.regex("[z-a]"), r"grammar \(regex\) is invalid: .*range"),
    (lambda: Grammar.regex(""), r"grammar \(regex\) must not be empty"),
    (lambda: Grammar.regex(123), r"grammar \(regex\) must be a str"),
    (lambda: Grammar.regex("a" * (G.MAX_GRAMMAR_CHARS + 1)), r"more than the limit of"),
    (lambda: Grammar.json_schema("{not json"), r"grammar \(json_schema\) is not valid JSON"),
    (lambda: Grammar.json_schema({"type": "objekt"}), r"grammar \(json_schema\) is invalid: .*objekt"),
    (lambda: Grammar.json_schema([1, 2]), r"grammar \(json_schema\) must be a JSON object"),
    (lambda: Grammar.json_schema(json.dumps(_nested(40))), r"nests deeper than"),
    (lambda: Grammar.ebnf("start: foo"), r"grammar \(ebnf\) is invalid: .*unknown name"),
    (lambda: Grammar.choice([]), r"grammar \(choice\) needs 1 to"),
    (lambda: Grammar.choice("yes"), r"grammar \(choice\) must be a list of strings"),
    (lambda: Grammar.choice(["ok", ""]), r"options must have 1 to"),
    (lambda: Grammar("sql", "SELECT 1"), r"grammar kind must be one of"),
    (lambda: SamplingParams(grammar="\\d+"), r"^grammar must be a Grammar"),
    (lambda: SamplingParams.from_dict({"grammar": {"kind": "regex"}}), r"^grammar must be a Grammar"),
    (lambda: SamplingParams.from_dict({"grammar": {"kind": "regex", "source": "(("}}), r"grammar \(regex\) is invalid"),
])
def test_bad_grammars_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert "Traceback" not in str(info.value) and len(str(info.value)) < 600


def _nested(depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_bad_grammar_is_refused_before_any_step(engine):
    p = SamplingParams(max_tokens=4)
    p.grammar = "[0-9]+"  # set after construction: caught where the params are used
    with pytest.raises(ValueError, match="^grammar must be a Grammar"):
        engine.add_request("Hi", p)
    assert engine.seq_ids() == [] and engine.step_index == 0


# ---- the grammar travels with the params and the events -------------------------------------------------------------

def test_params_and_events_round_trip_with_the_grammar(engine):
    for g, _, _ in CASES:
        p = SamplingParams(max_tokens=5, temperature=0.5, grammar=g)
        back = SamplingParams.from_dict(json.loads(json.dumps(p.to_dict())))
        assert back == p and back.grammar == g
    sid = engine.add_request("Is the sky blue?", greedy(4, grammar=Grammar.choice(YES_NO)))
    ev = engine.step()
    back = StepEvent.from_dict(json.loads(json.dumps(ev.to_dict())))
    s = back.seq(sid)
    assert s.sampling.grammar.allowed == _stage(s.sampling, "grammar").num_kept == ev.seq(sid).sampling.grammar.allowed
    assert back.timing.grammar_ms == pytest.approx(ev.timing.grammar_ms, abs=1e-3)
    assert engine.seq_view(sid).params.grammar == Grammar.choice(YES_NO)


# ---- the lab: charts read the engine's event, the grammar box ---------------------------------------------------

@pytest.fixture(scope="module")
def constrained_events(base_engine):
    """A real constrained run, traced: the JSON example to its end."""
    eng = base_engine.session()
    sid = eng.add_request("Invent a person. Answer as JSON with name and age.",
                          SamplingParams(max_tokens=40, temperature=0.7, seed=0, grammar=Grammar.json_schema(PERSON)))
    events = run(eng, [sid], trace=True)[1]
    return sid, events


def test_sampling_chain_chart_shows_the_grammar_stage(constrained_events):
    from app.charts import sampling as chart

    sid, events = constrained_events
    for ev in events:
        tr = ev.seq(sid).sampling
        fig = chart.sampling_chain_chart(tr)
        bars = {t["name"]: t for t in fig["data"]}
        st = _stage(tr, "grammar")
        assert [t["name"] for t in fig["data"]][:3] == ["logits", "grammar", "penalties"]
        assert bars["grammar"]["x"] == st.probs
        assert bars["grammar"]["text"] == ["✕" if not k else "" for k in st.kept]
        assert bars["grammar"]["marker"]["color"] == [chart.GREY if not k else c for k, c in
                                                       zip(st.kept, bars["grammar"]["marker"]["color"])]
        title = fig["layout"]["title"]["text"].replace("<br>", " ")  # the layout wraps long titles
        assert f"grammar: {st.num_kept:,} of 49,152 tokens allowed" in title
        assert f"{len(chart.masked_by_grammar(tr))} of the {len(tr.token_ids)} shown masked" in title
        assert f"−{st.mass_removed:.1%} of the mass" in title
        assert f"mask {tr.grammar.mask_ms:.2f} ms" in title
    # an unconstrained trace has no such stage, no line
    assert chart.masked_by_grammar(None) == set()


def test_logits_and_cdf_charts_mark_the_masked_tokens(constrained_events):
    from app.charts import logits as lchart, sampling as schart

    sid, events = constrained_events
    tr = next(ev.seq(sid).sampling for ev in events if schart.masked_by_grammar(ev.seq(sid).sampling))
    masked = schart.masked_by_grammar(tr)
    fig = lchart.logits_chart(tr, None)
    raw = fig["data"][0]
    ticks = fig["layout"]["yaxis"]["ticktext"]
    for tid, color, tick in zip(tr.token_ids, raw["marker"]["color"], ticks):
        assert (color == lchart.GREY) == (tid in masked and tid != tr.chosen)
        assert tick.startswith("⊘ ") == (tid in masked)
    cdf = schart.sampling_cdf_chart(tr)
    notes = [a["text"].replace("<br>", " ") for a in cdf["layout"]["annotations"]]  # wrapped to the plot's width
    assert any(n.startswith(f"masked by the grammar, not in the draw: {len(masked)} of the top tokens") for n in notes)
    assert not set(t for t, _ in tr.cdf) & masked  # the draw never had them


def test_timeline_and_pipeline_show_the_mask_time(constrained_events):
    from dataclasses import replace

    from app.charts.timeline import timeline_chart
    from app.panels.pipeline import pipeline_summary

    _, events = constrained_events
    fig = timeline_chart(events)
    mask = next(t for t in fig["data"] if t["name"] == "grammar")
    assert mask["y"] == [e.timing.grammar_ms for e in events] and mask["x"] == [e.step for e in events]
    steps = next(t for t in fig["data"] if t["name"] == "steps")
    assert all(f"grammar masks {e.timing.grammar_ms:.2f} ms" in h for e, h in zip(events, steps["customdata"]))
    ev = events[-1]
    assert "grammar masks" not in pipeline_summary(ev)  # 0.3 ms of masks against a forward of tens of ms
    slow = replace(ev, timing=replace(ev.timing, grammar_ms=ev.timing.forward_ms + 5.0))
    assert "more than the model's forward" in pipeline_summary(slow)
    assert "больше, чем прямой проход" in pipeline_summary(slow, "ru")


@pytest.mark.parametrize("text, expect", [
    ("", None), ("   ", None),
    ('json: {"type": "integer"}', Grammar.json_schema({"type": "integer"})),
    (r"regex: \d+", Grammar.regex(r"\d+")),
    ("choice: yes | no", Grammar.choice(["yes", "no"])),
    ('ebnf: start: "a" | "b"', Grammar.ebnf('start: "a" | "b"')),
])
def test_grammar_box_parses(text, expect):
    from app.grammar_examples import parse

    assert parse(text) == expect


@pytest.mark.parametrize("text, message", [
    ("sql: SELECT 1", "must start with «json:», «regex:», «ebnf:» or «choice:»"),
    ("\\d+", "must start with"),
    ("regex: (", "grammar (regex) is invalid"),
    ("json: {oops", "grammar (json_schema) is not valid JSON"),
    ("regex: " + "a" * 20_000, "grammar is 20007 characters; the lab accepts up to"),
])
def test_grammar_box_refuses_clearly(text, message):
    from app import commands as cmd
    from app.i18n import Refusal

    with pytest.raises(Refusal) as info:
        cmd.sampling_params(0.7, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 0, 16, "", text)
    assert message in str(info.value)
    assert info.value.text("ru") and info.value.text("ru") != str(info.value)


def test_examples_and_pair_are_valid_grammars():
    from app import grammar_examples as ex

    for name, text in ex.EXAMPLES.items():
        assert ex.parse(text) is not None
    assert Grammar.json_schema(ex.PAIR_SCHEMA) != Grammar.json_schema(ex.PAIR_SHUFFLED)  # different text,
    same = {**ex.PAIR_SHUFFLED, "required": sorted(ex.PAIR_SHUFFLED["required"])}  # "required" is a set
    assert json.dumps(same, sort_keys=True) == json.dumps({**ex.PAIR_SCHEMA, "required": sorted(
        ex.PAIR_SCHEMA["required"])}, sort_keys=True)  # one schema
    a, b = ex.pair_system(ex.PAIR_SCHEMA), ex.pair_system(ex.PAIR_SHUFFLED)
    assert a[:2] == b[:2] and a[2] != b[2]  # they part at the first key: no KV block can be shared


# ---- grammars that validate but match nothing (issue 36) ---------------------------------------------------------
# Each passed Grammar's validation and used to make every later step of its sequence fail with "grammar matcher
# refused tokens it had validated". They are refused when compiled, by add_request, with nothing added.
MATCH_NOTHING = [
    (lambda: Grammar.ebnf("start: x\nx: x"), "matches no text"),  # a rule that never ends
    (lambda: Grammar.regex(r"[^\x00-\x{10FFFF}]"), "matches no text"),  # a class of no character
    (lambda: Grammar.json_schema({"$ref": "#"}), "matches no text"),  # a schema that is only itself
    (lambda: Grammar.regex("(a{1000}){1000}"), "too large for the grammar engine"),  # past the lexer's limits
]


@pytest.mark.parametrize("make, message", MATCH_NOTHING)
def test_a_grammar_that_matches_nothing_is_refused_by_add_request(engine, make, message):
    grammar = make()  # validation alone cannot tell: it needs the tokenizer's first mask
    with pytest.raises(ValueError, match=message) as info:
        engine.add_request("Say something.", greedy(8, grammar=grammar))
    text = str(info.value)
    assert text.startswith(f"grammar ({grammar.kind})") and "\n" not in text and len(text) < 400
    assert engine.seq_ids() == [] and not engine.has_unfinished() and engine._grammars == {}
    # the engine stays usable: a normal grammar right after runs and parses
    sid = engine.add_request("When did the first person land on the Moon? Give the date.",
                             greedy(16, grammar=Grammar.regex(DATE)))
    _fullmatch(DATE, run(engine, [sid])[0][0].text)


def test_a_refused_grammar_is_not_cached_and_an_empty_match_is_no_fault(engine):
    with pytest.raises(ValueError, match="matches no text"):
        engine.add_request("Hi", greedy(4, grammar=Grammar.regex(r"[^\x00-\x{10FFFF}]")))
    with pytest.raises(ValueError, match="matches no text"):  # refused again, not served from the cache
        engine.add_request("Hi", greedy(4, grammar=Grammar.regex(r"[^\x00-\x{10FFFF}]")))
    assert not any(key[0] == Grammar.regex(r"[^\x00-\x{10FFFF}]") for key in G._compiled)
    # a grammar whose only match is the empty output accepts at the start: the sequence simply ends
    sid = engine.add_request("Hi", greedy(4, grammar=Grammar.regex("a{0}")))
    assert run(engine, [sid])[0][0].text == ""
