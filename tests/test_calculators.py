"""Whiteboard calculators: the formulas against values worked out by hand, the presets' sources, the charts'
data against the formulas, the filled-in formulas' text, and clear errors for bad inputs.

The hand values are written out as arithmetic (2 × 32 × 8 × 128 × 2, …) so a reader can check them on paper;
the figures in the source texts (seeds) are reproduced where they are exact.
"""
from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import pytest

from app import calculators as calc
from app.charts import calculators as charts
from engine import metrics
from engine.records import dumps

KiB, MiB, GiB = 2**10, 2**20, 2**30
MACHINE = {"bandwidth": 20e9, "peak_flops": 150e9}  # a made-up CPU: the app measures the real one


@pytest.fixture(scope="module")
def presets():
    return calc.load_presets()


def _by_id(items, key):
    return next(x for x in items if x["id"] == key)


def _trace(fig, name):
    return next(t for t in fig["data"] if t.get("name") == name)


# ---- the formulas, by hand ---------------------------------------------------------------------------------

def test_kv_cache_bytes_by_hand():
    # Llama-3-8B in bf16: 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes per token
    assert metrics.kv_cache_bytes(32, 8, 128, 1, 1, 2) == 2 * 32 * 8 * 128 * 2 == 131072 == 128 * KiB
    assert metrics.kv_cache_bytes(32, 8, 128, 4096, 1, 2) == 512 * MiB
    assert metrics.kv_cache_bytes(32, 8, 128, 4096, 3, 2) == 3 * 512 * MiB
    # Llama-3-70B (seed 001, Q34): 80 × 8 × 128 → 320 KiB per token, 2.5 GiB for 8k tokens, ~20 GiB without GQA
    assert metrics.kv_cache_bytes(80, 8, 128, 1, 1, 2) == 327680 == 320 * KiB
    assert metrics.kv_cache_bytes(80, 8, 128, 8192, 1, 2) == 2.5 * GiB
    assert metrics.kv_cache_bytes(80, 64, 128, 8192, 1, 2) == 20 * GiB
    # int4 halves a byte: fractional widths are allowed
    assert metrics.kv_cache_bytes(32, 8, 128, 4096, 1, 0.5) == 128 * MiB
    assert metrics.kv_cache_bytes(32, 8, 128, 0, 1, 2) == 0  # an empty cache is a valid edge


def test_speculative_formulas_by_hand():
    e = (1 - 0.8**5) / (1 - 0.8)
    assert e == pytest.approx(3.3616)
    assert metrics.expected_tokens_per_pass(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert metrics.speculative_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4) == pytest.approx(2.40114, abs=1e-5)
    # the seed's example: α = 0.8, k = 4, c = 0.05 → ≈ 2.8×
    assert metrics.speculative_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    # edges: α = 1 accepts every draft (k + 1 tokens); α = 0 still yields the target's own token
    assert metrics.expected_tokens_per_pass(1.0, 4) == 5.0
    assert metrics.expected_tokens_per_pass(1, 0) == 1.0
    assert metrics.expected_tokens_per_pass(0.0, 7) == 1.0
    assert metrics.speculative_speedup(0.0, 4, 0.25) == pytest.approx(1 / 2)
    # the closed form equals the series 1 + α + … + α^k
    for a in (0.1, 0.5, 0.9, 0.999):
        assert metrics.expected_tokens_per_pass(a, 6) == pytest.approx(sum(a**i for i in range(7)))


def test_decode_bound_intensity_and_ridge_by_hand():
    # 16 GB of bf16 weights streamed at the H100's 3.35 TB/s: at least 4.78 ms per decode step
    t = metrics.decode_step_lower_bound(16e9, 3.35e12)
    assert t == pytest.approx(16 / 3350) and t == pytest.approx(4.776e-3, abs=1e-6)
    # seed 001, Q35: 70B in fp16 ≈ 140 GB weights + ~2 GB KV over 3.35 TB/s ≈ 42 ms, ~24 tokens/s
    t = metrics.decode_step_lower_bound(metrics.weight_bytes(70e9, 2) + 2e9, 3.35e12)
    assert t == pytest.approx(0.04239, abs=1e-4) and 1 / t == pytest.approx(23.6, abs=0.1)
    # and its intensity: 2 × 70e9 FLOP over 140e9 bytes = 1 FLOP per byte
    assert metrics.arithmetic_intensity(2 * 70e9, 140e9) == 1.0
    # H100 ridge: 989 TFLOP/s ÷ 3.35 TB/s ≈ 295 FLOP/byte
    assert metrics.ridge_point(989e12, 3.35e12) == pytest.approx(295.2, abs=0.1)
    assert metrics.attainable_flops(1.0, 989e12, 3.35e12) == 3.35e12  # below the ridge: bandwidth × I
    assert metrics.attainable_flops(1000.0, 989e12, 3.35e12) == 989e12  # above it: the peak


def test_weights_and_concurrent_sequences_by_hand():
    assert metrics.weight_bytes(8e9, 0.5) == 4e9
    # seed 001, Q36: 2 × H100 = 160 GB, 140 GB of weights → 20 GB for KV; 320 KiB/token × 4096 tokens each
    assert metrics.max_concurrent_sequences(160e9, 140e9, 327680 * 4096, reserve_fraction=0) == 14  # 20e9 / 1.342e9
    # Llama-3-8B bf16 on an 80 GiB H100 with the default 10% reserve:
    # ⌊(80 GiB × 0.9 − 8,030,261,248 × 2 B) / 512 MiB⌋ = ⌊(77,309,411,328 − 16,060,522,496) / 536,870,912⌋ = 114
    assert metrics.max_concurrent_sequences(80 * GiB, 8030261248 * 2, 512 * MiB) == 114
    assert metrics.DEFAULT_RESERVE_FRACTION == 0.1
    assert metrics.max_concurrent_sequences(24 * GiB, 140e9, 1e6) == 0  # weights alone overflow: none, not negative


def test_param_counts_by_hand():
    # Llama-3-8B: embedding + untied head, 32 × (q, k, v, o, gate/up/down, 2 norms), final norm
    h, inter, v = 4096, 14336, 128256
    layer = h * h + 2 * h * 1024 + h * h + 3 * h * inter + 2 * h
    assert 2 * v * h + 32 * layer + h == 8030261248
    assert metrics.llama_param_counts(32, h, 32, 8, 128, inter, v)["total"] == 8030261248
    # Qwen2 adds q/k/v biases: 3584 + 2 × 512 per layer
    q = metrics.llama_param_counts(28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=True)
    q0 = metrics.llama_param_counts(28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=False)
    assert q["total"] - q0["total"] == 28 * (3584 + 2 * 512)
    # a tied head is the embedding: counted once in memory, but read in full every step
    tied = metrics.llama_param_counts(30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True)
    assert tied["total"] == tied["per_step"]
    assert q["total"] - q["per_step"] == 152064 * 3584  # untied: the input table is gathered, not streamed


def test_presets_have_sources_and_match_their_cards(presets):
    models, gpus, dtypes = presets["models"], presets["gpus"], presets["dtypes"]
    assert {m["id"] for m in models} >= {"llama-3-8b", "llama-3-70b", "llama-3-70b-mha", "qwen2.5-7b", "mistral-7b"}
    for m in models:
        assert m["source"].startswith("https://huggingface.co/") and m["source"].endswith("/config.json")
        assert m["note"]["en"] and m["note"]["ru"]
        counts = metrics.llama_param_counts(m["num_layers"], m["hidden_size"], m["num_heads"], m["num_kv_heads"],
                                            m["head_dim"], m["intermediate_size"], m["vocab_size"],
                                            m["tie_word_embeddings"], m["qkv_bias"])
        assert counts["total"] == pytest.approx(m["num_params"], rel=1e-3), m["id"]
    # the sizes the model cards state (billions)
    for key, billions in (("llama-3-8b", 8.03), ("llama-3-70b", 70.55), ("qwen2.5-7b", 7.62), ("mistral-7b", 7.24)):
        assert _by_id(models, key)["num_params"] / 1e9 == pytest.approx(billions, abs=0.01)
    mha = _by_id(models, "llama-3-70b-mha")
    assert mha.get("hypothetical") is True and mha["num_kv_heads"] == mha["num_heads"] == 64
    assert "hypothetical" in mha["note"]["en"].lower() and "гипотетическ" in mha["note"]["ru"].lower()
    for g in gpus:
        assert g["source"].startswith("https://") and "nvidia.com" in g["source"]
    h100 = _by_id(gpus, "h100-sxm-80gb")
    assert (h100["memory_bytes"], h100["bandwidth"]) == (80 * GiB, 3.35e12)
    assert metrics.ridge_point(h100["peak_flops"], h100["bandwidth"]) == pytest.approx(295, abs=1)
    assert {g["id"] for g in gpus} == {"h100-sxm-80gb", "h200-sxm-141gb", "a100-sxm-80gb", "a100-sxm-40gb", "rtx-4090"}
    assert {d["id"]: d["bytes"] for d in dtypes} == {"fp32": 4, "bf16": 2, "fp8": 1, "int8": 1, "q4": 0.625,
                                                      "int4": 0.5}
    assert all(d["source"].startswith("https://") for d in dtypes)


# ---- the payload and its charts --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def payload():
    return calc.calculator_payload("llama-3-8b", "bf16", 4096, 4, "h100-sxm-80gb", 0.8, 4, 0.1, "en", None, MACHINE)


def test_payload_shape_and_json(payload):
    assert list(payload["figs"]) == calc.CHART_IDS
    assert list(payload["html"]) == calc.HTML_IDS
    for fig in payload["figs"].values():
        assert fig["data"], fig["layout"]["title"]
    json.loads(dumps(payload))  # strict JSON: no NaN/inf reaches the browser


def test_kv_chart_equals_formula(payload, presets):
    fig = payload["figs"]["chart-calc-kv"]
    labels = [m["name"] for m in presets["models"]]
    for d in presets["dtypes"]:
        tr = _trace(fig, d["name"])
        assert [x.replace("<b>", "").replace("</b>", "") for x in tr["x"]] == labels
        assert tr["y"] == [metrics.kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], 1, 1, d["bytes"])
                           for m in presets["models"]]
    # the right axis is the left one × context: the same bar reads bytes per 4096-token sequence
    lo, hi = fig["layout"]["yaxis"]["range"], fig["layout"]["yaxis2"]["range"]
    assert hi[0] - lo[0] == pytest.approx(math.log10(4096)) and hi[1] - lo[1] == pytest.approx(math.log10(4096))
    assert _trace(fig, "bf16")["y"][0] == 131072


def test_fit_chart_equals_formula(payload, presets):
    fig = payload["figs"]["chart-calc-fit"]
    m = _by_id(presets["models"], "llama-3-8b")
    kv_seq = metrics.kv_cache_bytes(32, 8, 128, 4096, 1, 2)
    devices = presets["gpus"] + [calc.this_machine_preset(MACHINE)]
    expected = [metrics.max_concurrent_sequences(g["memory_bytes"], m["num_params"] * 2, kv_seq) for g in devices]
    kv = _trace(fig, "KV cache of the sequences that fit")
    assert kv["customdata"] == expected
    assert expected[0] == 114  # H100, by hand above
    assert [x * GiB for x in kv["x"]] == pytest.approx([n * kv_seq for n in expected])
    weights = _trace(fig, "weights")
    want = [min(m["num_params"] * 2, g["memory_bytes"]) for g in devices]
    assert [x * GiB for x in weights["x"]] == pytest.approx(want)
    assert _trace(fig, "n")["text"][0].strip() == "114 seq."


def test_step_chart_equals_formula(payload, presets):
    fig = payload["figs"]["chart-calc-step"]
    m = _by_id(presets["models"], "llama-3-8b")
    counts = metrics.llama_param_counts(32, 4096, 32, 8, 128, 14336, 128256)
    devices = presets["gpus"] + [calc.this_machine_preset(MACHINE)]
    for d in presets["dtypes"]:
        tr = _trace(fig, d["name"])
        want = [1e3 * metrics.decode_step_lower_bound(
            counts["per_step"] * d["bytes"] + metrics.kv_cache_bytes(32, 8, 128, 4096, 4, d["bytes"]), g["bandwidth"])
            for g in devices]
        assert tr["y"] == pytest.approx(want)
    # quantisation: bf16 → int4 divides the bound by exactly 4 (weights and KV both shrink 4×)
    bf16, int4 = _trace(fig, "bf16")["y"], _trace(fig, "int4")["y"]
    assert [a / b for a, b in zip(bf16, int4)] == pytest.approx([4.0] * len(devices))
    assert m["num_params"] * 4 > 24 * GiB  # fp32 8B cannot fit a 4090: its bar is hatched
    fp32 = _trace(fig, "fp32")
    assert fp32["marker"]["pattern"]["shape"][[g["id"] for g in devices].index("rtx-4090")] == "/"


def test_roofline_chart_equals_formula(payload, presets):
    fig = payload["figs"]["chart-calc-roofline"]
    g = _by_id(presets["gpus"], "h100-sxm-80gb")
    roof = _trace(fig, "roof")
    ridge = metrics.ridge_point(g["peak_flops"], g["bandwidth"])
    assert roof["x"][1] == pytest.approx(ridge) and roof["y"][1] == pytest.approx(g["peak_flops"])
    counts = metrics.llama_param_counts(32, 4096, 32, 8, 128, 14336, 128256)
    def cost(seqs):
        return metrics.step_cost(counts["per_step"] * 2, counts["matmul"], counts["head"], 131072, seqs, 32, 32, 128)
    want = [cost([(4095, 1, 1)]), cost([(4095, 1, 1)] * 4), cost([(0, 4096, 1)])]
    pts = _trace(fig, "points")
    assert pts["x"] == pytest.approx([metrics.arithmetic_intensity(c.flops, c.bytes) for c in want])
    assert pts["y"] == pytest.approx([metrics.attainable_flops(x, g["peak_flops"], g["bandwidth"]) for x in pts["x"]])
    decode1, decode4, prefill = pts["x"]
    assert decode1 < decode4 < ridge < prefill  # decode is memory-bound, a 4096-token prefill compute-bound
    assert 1.0 < decode1 < 1.3  # ≈ 2 FLOP per bf16 weight (2 bytes) plus a little attention
    # other dtypes at batch 1: int4 moves decode 4× further right than bf16 would
    other = _trace(fig, "decode, batch 1, other dtypes")
    assert other["x"][4] / decode1 == pytest.approx(4.0)
    # the key names them left to right, those at one intensity together (their labels by the points collided)
    xs = other["x"]
    assert xs[1] == pytest.approx(xs[2]) and xs[0] < xs[1] < xs[3] < xs[4]
    key = " ".join(re.sub(r"<[^>]+>", "", a["text"]) for a in fig["layout"]["annotations"])
    assert "decode, batch 1, other dtypes: left to right fp32, fp8 = int8, q4 (g32), int4" in key


def test_spec_chart_equals_formula(payload):
    fig = payload["figs"]["chart-calc-spec"]
    heat = _trace(fig, "speedup")
    for i, k in enumerate(heat["y"]):
        assert heat["z"][i] == pytest.approx([metrics.speculative_speedup(a, k, 0.1) for a in heat["x"]])
    assert heat["x"][0] == 0 and heat["x"][-1] == 1 and heat["y"][:4] == [1, 2, 3, 4]
    e = _trace(fig, "E tokens per pass, k = 4")
    assert e["y"] == pytest.approx([metrics.expected_tokens_per_pass(a, 4) for a in e["x"]])
    assert e["y"][-1] == 5.0  # α = 1
    chosen = [t for t in fig["data"] if t.get("name") == "chosen"][0]
    assert chosen["x"] == [0.8] and chosen["y"] == [pytest.approx(2.40114, abs=1e-5)]
    k4 = _trace(fig, "k = 4")
    assert k4["line"]["width"] > _trace(fig, "k = 1")["line"]["width"]  # the chosen k stands out


def test_formulas_html_fills_in_the_numbers(payload):
    h = payload["html"]["html-calc-formulas"]
    assert "2 × 32 layers × 8 KV heads × 128 (head dim) × 4096 tokens × 4 sequences × 2 bytes (bf16)" in h
    assert "= <b>2 GiB</b> (128 KiB per token)" in h  # 4 × 512 MiB
    assert "= <b>114 sequences</b>" in h
    assert "<b>3.362</b>" in h and "<b>2.401×</b>" in h
    assert "295 FLOP/B" in h
    ru = calc.calculator_payload("llama-3-8b", "bf16", 4096, 1, "h100-sxm-80gb", 0.8, 4, 0.1, "ru")
    r = ru["html"]["html-calc-formulas"]
    assert "2 × 32 слоя × 8 KV-голов × 128 (размерность головы) × 4096 токенов × 1 последовательность × 2 байта" in r
    assert "<b>512 МиБ</b>" in r and "<b>3,362</b>" in r and "<b>2,401×</b>" in r
    assert "<b>114 последовательностей</b>" in r
    # α = 1 has its own form (the closed form would divide by zero)
    one = calc.calculator_payload(alpha=1.0, k=3, draft_cost=0.0)["html"]["html-calc-formulas"]
    assert "E = k + 1 = <b>4</b>" in one


def test_ru_charts_and_plural_forms():
    p = calc.calculator_payload(lang="ru")
    assert "KV-кэш на токен" in p["figs"]["chart-calc-kv"]["layout"]["title"]["text"]
    assert calc._q(1, "layers", "ru") == "1 слой" and calc._q(22, "layers", "ru") == "22 слоя"
    assert calc._q(11, "tokens", "ru") == "11 токенов" and calc._q(0.5, "bytes", "ru") == "0,5 байта"
    assert calc._q(131072, "bytes", "ru") == "131\u202f072 байта"
    assert charts.fmt_bytes(536870912, "ru") == "512 МиБ" and charts.fmt_bytes(131072) == "128 KiB"
    assert charts.fmt_si(3.35e12, "B/s", "ru") == "3,35 ТБ/с" and charts.fmt_si(3.35e12, "B/s") == "3.35 TB/s"


# ---- the live model and this machine --------------------------------------------------------------------

def test_live_model_preset_matches_the_engine(base_engine):
    live = calc.live_model_preset_from_engine(base_engine)
    assert live["id"] == calc.LIVE_ID and "SmolLM2-135M" in live["name"] and live["name"].endswith("(loaded)")
    assert live["source"] == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json"
    m = base_engine.model
    # the engine's own KV bytes per token and weight bytes per step, reproduced by the whiteboard formulas
    assert metrics.kv_cache_bytes(live["num_layers"], live["num_kv_heads"], live["head_dim"], 1, 1,
                                  m.element_size) == base_engine.kv_bytes_per_token
    assert live["params_per_step"] * m.element_size == m.weight_bytes_per_step
    derived = calc.live_model_preset(base_engine.spec)  # from the shapes alone
    assert derived["params_per_step"] == live["params_per_step"]
    assert derived["params_per_token"] == m.params_per_token
    assert live["num_params"] == pytest.approx(135e6, rel=0.01)  # "135M"
    p = calc.calculator_payload("live", "fp32", 2048, 1, calc.MACHINE_ID, 0.8, 4, 0.1, "en", live, MACHINE)
    kv = _trace(p["figs"]["chart-calc-kv"], "fp32")
    assert kv["x"][0] == "<b>" + live["name"] + "</b>" and kv["y"][0] == base_engine.kv_bytes_per_token
    step = _trace(p["figs"]["chart-calc-step"], "fp32")
    t = metrics.decode_step_lower_bound(m.weight_bytes_per_step + 2048 * base_engine.kv_bytes_per_token, 20e9)
    assert step["x"][-1] == "This machine (measured)" and step["y"][-1] == pytest.approx(1e3 * t)
    w = charts.fmt_bytes(m.weight_bytes_per_step)  # 538,060,032 B ≈ 513 MiB
    assert f"{live['name']}: fp32, {w} of weights per step" in p["html"]["html-calc-formulas"]


def test_this_machine_preset():
    mp = calc.this_machine_preset(MACHINE, memory_bytes=16 * GiB)
    assert (mp["id"], mp["bandwidth"], mp["peak_flops"], mp["memory_bytes"]) == (calc.MACHINE_ID, 20e9, 150e9, 16 * GiB)
    assert calc.this_machine_preset(MACHINE)["memory_bytes"] > 0  # total RAM
    ids = [g for _, g in calc.choices("en", machine=MACHINE)["gpu"]]
    assert ids[-1] == calc.MACHINE_ID
    # while the machine is still being measured the calculators work without it
    p = calc.calculator_payload(machine={"bandwidth": None, "peak_flops": None})
    assert "This machine (measured)" not in _trace(p["figs"]["chart-calc-step"], "bf16")["x"]


def test_live_model_preset_without_engine():
    spec = SimpleNamespace(num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
                           intermediate_size=16, vocab_size=10, tie_word_embeddings=False, qkv_bias=False)
    live = calc.live_model_preset(spec, name="Tiny")
    assert live["name"] == "Tiny (loaded)" and live["name_ru"] == "Tiny (загруженная)" and live["source"] is None
    # 10×8 embed + 10×8 head + 2 × (8·8 + 2·8·4 + 8·8 + 3·8·16 + 2·8) + 8
    assert live["num_params"] == 80 + 80 + 2 * (64 + 64 + 64 + 384 + 16) + 8


# ---- errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, match", [
    (lambda: metrics.kv_cache_bytes(0, 8, 128, 1, 1, 2), "n_layers"),
    (lambda: metrics.kv_cache_bytes(32, 8, 128, 1.5, 1, 2), "seq_len"),
    (lambda: metrics.kv_cache_bytes(32, True, 128, 1, 1, 2), "n_kv_heads"),
    (lambda: metrics.kv_cache_bytes(32, 8, 128, 1, 1, 0), "bytes_per_elem"),
    (lambda: metrics.decode_step_lower_bound(1e9, 0), "bandwidth"),
    (lambda: metrics.decode_step_lower_bound(-1, 1e9), "bytes_per_step"),
    (lambda: metrics.expected_tokens_per_pass(1.2, 4), "alpha"),
    (lambda: metrics.expected_tokens_per_pass(float("nan"), 4), "alpha"),
    (lambda: metrics.expected_tokens_per_pass(0.5, -1), "k"),
    (lambda: metrics.speculative_speedup(0.5, 4, -0.1), "c"),
    (lambda: metrics.arithmetic_intensity(1e9, 0), "bytes"),
    (lambda: metrics.ridge_point(0, 1e12), "peak_flops"),
    (lambda: metrics.weight_bytes(-5, 2), "n_params"),
    (lambda: metrics.max_concurrent_sequences(80e9, 16e9, 0), "kv_bytes_per_seq"),
    (lambda: metrics.max_concurrent_sequences(80e9, 16e9, 1e9, reserve_fraction=1.0), "reserve_fraction"),
    (lambda: calc.calculator_payload(model="gpt-5"), "unknown model 'gpt-5'"),
    (lambda: calc.calculator_payload(model="live"), "unknown model 'live'"),  # no live model was given
    (lambda: calc.calculator_payload(gpu="tpu"), "unknown gpu"),
    (lambda: calc.calculator_payload(dtype="fp16"), "unknown dtype"),
    (lambda: calc.calculator_payload(context=0), "context"),
    (lambda: calc.calculator_payload(context=10.5), "context"),
    (lambda: calc.calculator_payload(batch=10**6), "batch"),
    (lambda: calc.calculator_payload(alpha=1.5), "alpha"),
    (lambda: calc.calculator_payload(k=0), "k"),
    (lambda: calc.calculator_payload(draft_cost=-1), "draft_cost"),
    (lambda: calc.calculator_payload(lang="de"), "lang"),
    (lambda: calc.this_machine_preset({"bandwidth": 0, "peak_flops": 1e9}), "bandwidth"),
])
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_whole_float_inputs_from_sliders_are_accepted():
    p = calc.calculator_payload(context=4096.0, batch=2.0, k=3.0)
    assert "× 4096 tokens × 2 sequences ×" in p["html"]["html-calc-formulas"]


def test_broken_preset_files_are_rejected(tmp_path, presets):
    def write(models=None, gpus=None, dtypes=None):
        for key, items in (("models", models), ("gpus", gpus), ("dtypes", dtypes)):
            (tmp_path / f"{key}.json").write_text(json.dumps({key: items if items is not None else presets[key]}))
        calc._load_presets.cache_clear()

    write()
    assert calc.load_presets(tmp_path)["models"] == presets["models"]
    no_source = [dict(presets["models"][0], source="")]
    write(models=no_source)
    with pytest.raises(ValueError, match="source"):
        calc.load_presets(tmp_path)
    write(gpus=[dict(presets["gpus"][0], bandwidth=-1)])
    with pytest.raises(ValueError, match="bandwidth"):
        calc.load_presets(tmp_path)
    write(models=[dict(presets["models"][0], num_kv_heads=5)])
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        calc.load_presets(tmp_path)
    write(dtypes=presets["dtypes"] + [presets["dtypes"][0]])
    with pytest.raises(ValueError, match="used twice"):
        calc.load_presets(tmp_path)
    (tmp_path / "gpus.json").unlink()
    calc._load_presets.cache_clear()
    with pytest.raises(ValueError, match="missing"):
        calc.load_presets(tmp_path)
