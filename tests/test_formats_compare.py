"""Weight formats side by side (engine/formats_compare.py, app/charts/quantization.py): the comparison's numbers
against a direct computation on the real model, its caps, the charts against the record, and the calculators'
bytes-per-weight presets against what each format's engine reads."""
import math

import pytest
import torch

from engine import Engine, SamplingParams, metrics
from engine.formats_compare import MAX_COMPARE_TOKENS, FormatsComparison, compare_formats, first_divergence

from app import calculators as calc
from app.charts import quantization as Q
from app.charts.common import axis_title
from i18n_check import english, figure_texts

PROMPT = "What is gravity?"
TOKENS = 12
BW, PEAK = 20e9, 1e11  # a machine's measured numbers, as ModelHolder.machine holds them


@pytest.fixture(scope="module")
def engines(base_engine):
    """One engine per format (the shared fp32 one among them), loaded when first asked for."""
    made = {"fp32": base_engine}

    def get(fmt):
        if fmt not in made:
            made[fmt] = Engine.from_pretrained("bundled", weights=fmt, kv_memory=4 << 20)
        return made[fmt]

    yield get
    made.clear()


@pytest.fixture(scope="module")
def cmp(engines):
    return compare_formats({"fp32": engines("fp32"), "q4": engines("q4")}, PROMPT, TOKENS)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # stopped early (EOS): differs where it stopped
    assert first_divergence([1], [1, 2]) == 1


def test_caps_and_bad_arguments_refused(base_engine):
    ok = {"fp32": base_engine}
    with pytest.raises(ValueError, match="max_tokens"):
        compare_formats(ok, PROMPT, MAX_COMPARE_TOKENS + 1)
    with pytest.raises(ValueError, match="max_tokens"):
        compare_formats(ok, PROMPT, 10**9)
    with pytest.raises(ValueError, match="max_tokens"):
        compare_formats(ok, PROMPT, 0)
    with pytest.raises(ValueError, match="prompt"):
        compare_formats(ok, "x" * 10**6, 4)
    with pytest.raises(ValueError, match="'fp32'"):
        compare_formats({}, PROMPT, 4)
    with pytest.raises(ValueError, match="weights are 'q4'"):
        compare_formats({"fp32": base_engine, "q4": base_engine}, PROMPT, 4)  # an fp32 engine called q4
    with pytest.raises(ValueError, match="engines"):
        compare_formats({"int3": base_engine}, PROMPT, 4)
    with pytest.raises(TypeError):
        compare_formats([base_engine], PROMPT, 4)


def test_fp32_against_itself_is_exact(base_engine):
    """fp32 forced along its own greedy tokens: KL 0, agreement 100 %, the same text as a plain generate."""
    c = compare_formats({"fp32": base_engine}, PROMPT, 6)
    plain = base_engine.session().generate(PROMPT, SamplingParams(max_tokens=6, temperature=0.0))
    r = c.reference
    assert c.reference_ids == r.token_ids == plain.token_ids and r.text == plain.text
    assert r.kl == [0.0] * 6 and all(r.top1) and r.agreement == 1.0 and r.first_divergence is None
    assert r.own_top == plain.token_ids and r.common_text == r.text
    assert r.bytes_per_weight == 4.0 and r.step_bytes >= r.weight_bytes_per_step
    assert r.step_ms is not None and r.step_ms > 0 and len(r.step_ms_all) == 5  # 6 tokens: 1 prefill + 5 decode
    back = FormatsComparison.from_dict(c.to_dict())
    assert back.runs[0].token_ids == r.token_ids and back.reference.weights == "fp32"


def forced_directly(eng: Engine, ids: list[int]) -> tuple[list, list, list]:
    """Teacher forcing written out in the test: raw logits, the engine's own log-prob of each forced token,
    and its greedy choice, step by step."""
    sid = eng.add_request(PROMPT, SamplingParams(max_tokens=len(ids), temperature=0.0, ignore_eos=True))
    logits, logps, own = [], [], []
    for tok in ids:
        eng.force_token(sid, tok)
        while True:
            ev = eng.step(trace=True).seq(sid)
            if ev is not None and ev.new_token is not None:
                break
        logits.append(eng.last_logits(sid))
        logps.append(ev.logit_stats.token_logprob)
        own.append(ev.sampling.chosen)
    return logits, logps, own


def test_q4_drift_equals_direct_computation(cmp, engines):
    """The record's KL, log-probs and top-1 against the same forcing done here, with torch's own kl_div;
    agreement within tests/test_weights.py's threshold (85 %: measured 94-100 %, a broken format < 10 %)."""
    ref, q4 = cmp.reference, cmp.run("q4")
    assert len(q4.kl) == len(q4.top1) == len(q4.chosen_logit) == len(cmp.reference_ids)
    p_logits, p_logps, p_own = forced_directly(engines("fp32").session(), cmp.reference_ids)
    q_logits, q_logps, q_own = forced_directly(engines("q4").session(), cmp.reference_ids)
    for i, tok in enumerate(cmp.reference_ids):
        want = torch.nn.functional.kl_div(torch.log_softmax(q_logits[i].double(), -1),
                                          torch.log_softmax(p_logits[i].double(), -1), log_target=True,
                                          reduction="sum")
        assert q4.kl[i] == pytest.approx(float(want), abs=1e-6)
        assert q4.chosen_logprob[i] == pytest.approx(q_logps[i], abs=1e-4)
        assert ref.chosen_logprob[i] == pytest.approx(p_logps[i], abs=1e-4)
        assert q4.chosen_logit[i] == pytest.approx(float(q_logits[i][tok]), abs=1e-4)
        assert q4.top1[i] == (q_own[i] == tok) and q4.own_top[i] == q_own[i]
    assert p_own == cmp.reference_ids  # the reference is fp32's own greedy text
    assert q4.agreement >= 0.85 and 0 <= q4.mean_kl < 0.1, (q4.agreement, q4.mean_kl)
    # its free-running text: the same tokens up to first_divergence
    d = q4.first_divergence
    n = len(cmp.reference_ids) if d is None else d
    assert q4.token_ids[:n] == cmp.reference_ids[:n]
    assert d is None or q4.token_ids[d:d + 1] != cmp.reference_ids[d:d + 1]
    # fewer bytes per step: 4-bit projections and an int8 head against fp32
    assert q4.step_bytes < 0.25 * ref.step_bytes and q4.bytes_per_weight == pytest.approx(0.7055, abs=0.001)
    assert q4.step_ms > 0 and q4.kernels["qkv"]["format"] == "q4"


# ---- the calculators' presets against the engine ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "q4"])
def test_calculator_bytes_per_weight_match_the_engine(fmt, engines):
    """Each format's preset width, applied to the matrices in the format its engine runs them (kernels(): q4
    keeps the LM head in int8) and the norms in fp32, gives the bytes a decode step reads, within 0.5 % (int8's
    per-row scales: 2 bytes per row of 576 inputs)."""
    eng = engines(fmt)
    width = {d["id"]: d["bytes"] for d in calc.load_presets()["dtypes"]}
    width["fp32"] = 4
    s, m = eng.spec, eng.model
    counts = metrics.llama_param_counts(s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim,
                                        s.intermediate_size, s.vocab_size, True, False)
    head = counts["head"]
    norms = m.params_per_step - counts["matmul"]  # every weight a step reads that no matmul kernel holds
    layers = m.params_per_step - head - norms
    kinds = m.kernels()
    assert kinds["qkv"]["format"] == fmt
    want = layers * width[fmt] + head * width[kinds["head"]["format"]] + norms * 4
    assert m.weight_bytes_per_step == pytest.approx(want, rel=0.005)
    if fmt == "q4":
        assert width["q4"] == 0.625  # 4 bits + a bf16 scale and zero per 32 weights
    # the live preset reports the engine's own bytes per weight
    live = calc.live_model_preset_from_engine(eng)
    assert live["loaded_bytes_per_elem"] == m.weight_bytes_per_step / m.params_per_step


# ---- charts: pure functions of the record ---------------------------------------------------------------------

def _trace(fig, name):
    return next(t for t in fig["data"] if t.get("name") == name)


def test_floor_chart_equals_the_record(cmp):
    fig = Q.floor_chart(cmp, BW, PEAK)
    pts = _trace(fig, "formats")
    assert pts["text"] == ["fp32", "q4"]
    assert pts["x"] == pytest.approx([r.step_bytes / 1e6 for r in cmp.runs])
    assert pts["y"] == pytest.approx([r.step_ms for r in cmp.runs])
    floor = [1e3 * max(r.step_bytes / BW, r.step_flops / PEAK) for r in cmp.runs]
    assert [c[3] for c in pts["customdata"]] == pytest.approx(floor)
    assert [c[4] for c in pts["customdata"]] == pytest.approx([100 * f / r.step_ms for f, r in zip(floor, cmp.runs)])
    assert pts["customdata"][1][6] == pytest.approx(cmp.reference.step_ms / cmp.run("q4").step_ms)
    line = _trace(fig, "floor")
    flops = cmp.reference.step_flops
    assert line["y"] == pytest.approx([1e3 * max(x * 1e6 / BW, flops / PEAK) for x in line["x"]])
    assert "%{customdata" in pts["hovertemplate"] and "MB" in axis_title(fig, "xaxis")
    # no machine numbers yet, no comparison yet: a placeholder that says so
    assert not Q.floor_chart(cmp, None, None)["data"] and not Q.floor_chart(None, BW, PEAK)["data"]


def test_drift_charts_and_table_equal_the_record(cmp):
    q4 = cmp.run("q4")
    kl = Q.kl_chart(cmp)
    assert [t["name"] for t in kl["data"]] == ["q4"]  # fp32's KL is 0 by definition: not drawn
    tr = kl["data"][0]
    assert tr["y"] == pytest.approx(q4.kl) and tr["x"] == list(range(len(cmp.reference_ids)))
    assert tr["marker"]["symbol"] == [Q.AGREE if a else Q.DISAGREE for a in q4.top1]
    assert [c[3] for c in tr["customdata"]] == pytest.approx(q4.chosen_logit)
    logit = Q.logit_chart(cmp)
    assert [t["name"] for t in logit["data"]] == ["fp32", "q4"]
    for t, r in zip(logit["data"], cmp.runs):
        assert t["y"] == pytest.approx(r.chosen_logit)
        assert [c[2] for c in t["customdata"]] == pytest.approx(r.chosen_logprob)
    table = Q.table_chart(cmp)
    cells = table["data"][0]["cells"]["values"]
    assert cells[0] == ["fp32", "q4"]
    assert cells[5] == [f"{Q.fmt_num(100 * r.agreement)} %" for r in cmp.runs]
    assert cells[5][0] == "100 %" and cells[6][0] == "never"
    assert cells[7] == [Q.fmt_num(r.mean_kl, "en", 2) for r in cmp.runs]
    for fig in Q.all_charts(cmp, BW, PEAK, "ru").values():  # the Russian panel speaks Russian
        words = [w for text in figure_texts(fig) for w in english(text)]
        assert not words, words


def test_empty_states():
    for fig in Q.all_charts(None, BW, PEAK).values():
        assert not fig["data"] and fig["layout"]["annotations"]
