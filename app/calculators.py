"""The whiteboard calculators panel: presets, the live model and this machine as presets, and the payload.

Inputs (model, dtype, context, batch, GPU, α, k, draft cost) become {"figs": {chart id: figure},
"html": {"html-calc-formulas": html}} in the same shape as app.render's payload. Every number comes from an
engine.metrics formula applied to a preset from assets/presets/ (each with its source), to the loaded model's
own ModelSpec, or to this machine's measured bandwidth and matmul speed.
"""
from __future__ import annotations

import copy
import functools
import html
import json
import math
import os
import re
from pathlib import Path

from engine import metrics

from .charts import calculators as charts
from .charts.calculators import fmt_bytes, fmt_int, fmt_num, fmt_seconds, fmt_si
from .i18n import UI, Phrase, Refusal, t, texts

PANEL = "calculators"
CHART_IDS = ["chart-calc-kv", "chart-calc-fit", "chart-calc-step", "chart-calc-roofline", "chart-calc-spec"]
HTML_IDS = ["html-calc-formulas"]
PRESETS_DIR = Path(__file__).resolve().parent.parent / "assets" / "presets"
LIVE_ID = "live"
MACHINE_ID = "this-machine"
LANGS = ("en", "ru")
MAX_CONTEXT = 2**21  # 2M tokens: beyond any preset's context, still a finite whiteboard number
MAX_BATCH = 4096
MAX_K = 32

DEFAULTS = {"model": "llama-3-8b", "dtype": "bf16", "context": 4096, "batch": 1, "gpu": "h100-sxm-80gb",
            "alpha": 0.8, "k": 4, "draft_cost": 0.05}


# ---- presets --------------------------------------------------------------------------------------------------

_MODEL_INT = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
              "vocab_size", "num_params")
_GPU_NUM = ("memory_bytes", "bandwidth", "peak_flops")


def load_presets(directory: str | Path | None = None) -> dict:
    """{"models": [...], "gpus": [...], "dtypes": [...]} from assets/presets/*.json, validated (a fresh copy)."""
    return copy.deepcopy(_load_presets(str(Path(directory) if directory else PRESETS_DIR)))


@functools.lru_cache(maxsize=4)
def _load_presets(directory: str) -> dict:
    d = Path(directory)
    out = {}
    for key, fname in (("models", "models.json"), ("gpus", "gpus.json"), ("dtypes", "dtypes.json")):
        path = d / fname
        try:
            items = json.loads(path.read_text(encoding="utf-8"))[key]
        except FileNotFoundError:
            raise ValueError(f"preset file {path} is missing") from None
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: expected a JSON object with a {key!r} list ({exc})") from None
        if not isinstance(items, list) or not items:
            raise ValueError(f"{path}: {key!r} must be a non-empty list")
        seen = set()
        for item in items:
            _check_preset(path, key, item)
            if item["id"] in seen or item["id"] in (LIVE_ID, MACHINE_ID):
                raise ValueError(f"{path}: id {item['id']!r} is used twice or is reserved")
            seen.add(item["id"])
        out[key] = items
    return out


def _check_preset(path: Path, key: str, item) -> None:
    where = f"{path}: {item.get('id', '?') if isinstance(item, dict) else item!r}"
    if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("name"), str):
        raise ValueError(f"{where}: each entry needs a string 'id' and 'name'")
    if not str(item.get("source", "")).startswith("https://"):
        raise ValueError(f"{where}: 'source' must be an https URL")
    fields = {"models": _MODEL_INT, "gpus": _GPU_NUM, "dtypes": ("bytes",)}[key]
    for f in fields:
        v = item.get(f)
        ok = (isinstance(v, int) if key == "models" else isinstance(v, (int, float))) and not isinstance(v, bool)
        if not ok or not v > 0:
            raise ValueError(f"{where}: {f!r} must be a positive {'integer' if key == 'models' else 'number'}")
    if key == "models":
        for f in ("tie_word_embeddings", "qkv_bias"):
            if not isinstance(item.get(f, False), bool):
                raise ValueError(f"{where}: {f!r} must be true or false")
        if item["num_heads"] % item["num_kv_heads"]:
            raise ValueError(f"{where}: num_heads must be a multiple of num_kv_heads (GQA groups)")


def live_model_preset(spec, *, name: str | None = None, model_id: str | None = None,
                      weight_bytes_per_step: int | None = None, params_per_token: int | None = None,
                      element_size: int = 4) -> dict:
    """The loaded model's ModelSpec as a preset (id "live"), next to the JSON ones.

    weight_bytes_per_step / params_per_token: Model's own counts (what the engine's cost model uses); when
    absent they are derived from the shapes. element_size: the bytes per value the engine actually stores.
    """
    counts = metrics.llama_param_counts(spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads,
                                        spec.head_dim, spec.intermediate_size, spec.vocab_size,
                                        bool(spec.tie_word_embeddings), bool(getattr(spec, "qkv_bias", False)))
    short = name or _short_name(model_id) or "Loaded model"
    per_step = counts["per_step"] if weight_bytes_per_step is None else weight_bytes_per_step / element_size
    source = f"https://huggingface.co/{model_id.split(' ')[0]}/blob/main/config.json" if model_id and \
        re.match(r"^[\w.-]+/[\w.-]+(\s|$)", model_id) else None
    return {
        "id": LIVE_ID, "name": t("calc.loaded", "en").format(name=short),
        "name_ru": t("calc.loaded", "ru").format(name=short), "live": True,
        "num_layers": spec.num_layers, "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size, "tie_word_embeddings": bool(spec.tie_word_embeddings),
        "qkv_bias": bool(getattr(spec, "qkv_bias", False)), "num_params": counts["total"],
        "params_per_step": per_step, "params_per_token": params_per_token or counts["matmul"],
        "loaded_bytes_per_elem": element_size, "model_id": model_id, "source": source,
        "note": UI["calc.loaded_note"],
    }


def live_model_preset_from_engine(engine) -> dict:
    """live_model_preset for an engine.Engine: its spec, weight bytes per step and MACs per token, and the bytes
    per weight its format reads (4 for fp32; ~0.6 for q4, scales and zeros included)."""
    m = engine.model
    return live_model_preset(engine.spec, model_id=engine.model_id, weight_bytes_per_step=m.weight_bytes_per_step,
                             params_per_token=m.params_per_token,
                             element_size=m.weight_bytes_per_step / m.params_per_step)


def _short_name(model_id: str | None) -> str | None:
    if not model_id:
        return None
    return model_id.split(" ")[0].split("/")[-1] or None


def total_memory_bytes() -> int | None:
    """This machine's RAM (POSIX sysconf); None where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def this_machine_preset(machine: dict, memory_bytes: int | None = None) -> dict:
    """A device preset from this machine's measured {"bandwidth", "peak_flops"} and its memory.

    memory_bytes (or machine["memory_bytes"]) wins; otherwise the machine's total RAM, which is where the
    engine keeps its weights on CPU. The peak is a measured fp32 matmul, not a datasheet figure.
    """
    if not isinstance(machine, dict):
        raise ValueError("machine must be a dict with the measured 'bandwidth' and 'peak_flops'")
    vals = {}
    for key in ("bandwidth", "peak_flops"):
        v = machine.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"machine[{key!r}] must be a positive measured number (got {v!r})")
        vals[key] = float(v)
    mem = memory_bytes or machine.get("memory_bytes") or total_memory_bytes()
    if not mem or mem <= 0:
        raise ValueError("this machine's memory size is unknown: pass memory_bytes")
    return {"id": MACHINE_ID, "name": t("calc.machine", "en"), "name_ru": t("calc.machine", "ru"),
            "measured": True, "memory_bytes": int(mem), "bandwidth": vals["bandwidth"],
            "peak_flops": vals["peak_flops"], "source": None,
            "note": UI["calc.machine_note"]}


def label(preset: dict, lang: str) -> str:
    return preset.get("name_ru") if lang == "ru" and preset.get("name_ru") else preset["name"]


def choices(lang: str = "en", live: dict | None = None, machine: dict | None = None) -> dict:
    """Dropdown options [(label, id)] for model, dtype and gpu (live model first, this machine last)."""
    p = load_presets()
    models = ([live] if live else []) + p["models"]
    gpus = p["gpus"] + ([m] if (m := _machine(machine)) else [])
    return {"model": [(label(x, lang), x["id"]) for x in models],
            "dtype": [(x["name"], x["id"]) for x in p["dtypes"]],
            "gpu": [(label(x, lang), x["id"]) for x in gpus]}


def _machine(machine: dict | None) -> dict | None:
    """A device preset from whatever the caller holds: None, a measured dict, or a ready preset."""
    if not machine:
        return None
    if machine.get("id") == MACHINE_ID:
        return machine
    try:
        return this_machine_preset(machine)
    except ValueError:
        return None  # still measuring: the calculators go on without this machine


# ---- per-model numbers ------------------------------------------------------------------------------------------

def model_numbers(m: dict, bytes_per_elem: float) -> dict:
    """What the formulas need for one model at one storage width."""
    counts = metrics.llama_param_counts(m["num_layers"], m["hidden_size"], m["num_heads"], m["num_kv_heads"],
                                        m["head_dim"], m["intermediate_size"], m["vocab_size"],
                                        m.get("tie_word_embeddings", False), m.get("qkv_bias", False))
    per_step = m.get("params_per_step", counts["per_step"])
    return {
        "params": m["num_params"],
        "params_per_step": per_step,
        "params_per_token": m.get("params_per_token", counts["matmul"]),
        "head_params": counts["head"],
        "weight_bytes": metrics.weight_bytes(m["num_params"], bytes_per_elem),
        "weight_step_bytes": metrics.weight_bytes(per_step, bytes_per_elem),
        "kv_per_token": metrics.kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], 1, 1,
                                               bytes_per_elem),
    }


def decode_cost(m: dict, bytes_per_elem: float, context: int, batch: int) -> metrics.StepCost:
    """metrics.step_cost of one decode step: `batch` sequences, each adding its token at position context − 1."""
    n = model_numbers(m, bytes_per_elem)
    return metrics.step_cost(n["weight_step_bytes"], n["params_per_token"], n["head_params"], n["kv_per_token"],
                             [(context - 1, 1, 1)] * batch, m["num_layers"], m["num_heads"], m["head_dim"])


def prefill_cost(m: dict, bytes_per_elem: float, context: int) -> metrics.StepCost:
    """metrics.step_cost of prefilling one prompt of `context` tokens (logits for the last position only)."""
    n = model_numbers(m, bytes_per_elem)
    return metrics.step_cost(n["weight_step_bytes"], n["params_per_token"], n["head_params"], n["kv_per_token"],
                             [(0, context, 1)], m["num_layers"], m["num_heads"], m["head_dim"])


# ---- the payload -------------------------------------------------------------------------------------------------

def calculator_payload(model: str = DEFAULTS["model"], dtype: str = DEFAULTS["dtype"],
                       context: int = DEFAULTS["context"], batch: int = DEFAULTS["batch"],
                       gpu: str = DEFAULTS["gpu"], alpha: float = DEFAULTS["alpha"], k: int = DEFAULTS["k"],
                       draft_cost: float = DEFAULTS["draft_cost"], lang: str = "en", live: dict | None = None,
                       machine: dict | None = None,
                       reserve_fraction: float = metrics.DEFAULT_RESERVE_FRACTION) -> dict:
    """{"figs": {chart id: figure}, "html": {"html-calc-formulas": html}} for the chosen inputs.

    live: live_model_preset(...) or None; machine: the measured {"bandwidth", "peak_flops"} (or
    this_machine_preset's result) or None. Raises ValueError naming the input that is out of range.
    """
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS} (got {lang!r})")
    context = _as_int("context", context, 1, MAX_CONTEXT)
    batch = _as_int("batch", batch, 1, MAX_BATCH)
    k = _as_int("k", k, 1, MAX_K)
    alpha = _as_float("alpha", alpha, 0.0, 1.0)
    draft_cost = _as_float("draft_cost", draft_cost, 0.0, 10.0)
    reserve_fraction = _as_float("reserve_fraction", reserve_fraction, 0.0, 0.99)
    p = load_presets()
    models = ([live] if live else []) + p["models"]
    mach = _machine(machine)
    gpus = p["gpus"] + ([mach] if mach else [])
    m = _pick("model", model, models)
    g = _pick("gpu", gpu, gpus)
    d = _pick("dtype", dtype, p["dtypes"])
    b = d["bytes"]
    dtypes = [{"id": x["id"], "label": x["name"]} for x in p["dtypes"]]

    # (a) KV per token, every model × every dtype
    kv_rows = [{"id": x["id"], "label": label(x, lang), "selected": x["id"] == m["id"],
                "per_token": {y["id"]: metrics.kv_cache_bytes(x["num_layers"], x["num_kv_heads"], x["head_dim"], 1, 1,
                                                              y["bytes"]) for y in p["dtypes"]}} for x in models]
    # (b) what fits on each device, chosen model and dtype
    nm = model_numbers(m, b)
    kv_seq = metrics.kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], context, 1, b)
    fit_rows = [fit_row(x, nm["weight_bytes"], kv_seq, reserve_fraction, lang) for x in gpus]
    # (c) decode-step bound for each device × dtype
    step_rows = []
    for x in gpus:
        per = {}
        for y in p["dtypes"]:
            ny = model_numbers(m, y["bytes"])
            kv_read = metrics.kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], context, batch,
                                             y["bytes"])
            total = ny["weight_step_bytes"] + kv_read
            kv1 = metrics.kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], context, 1, y["bytes"])
            n_fit = metrics.max_concurrent_sequences(x["memory_bytes"], ny["weight_bytes"], kv1, reserve_fraction)
            per[y["id"]] = {"weight_bytes": ny["weight_step_bytes"], "kv_bytes": kv_read, "bytes": total,
                            "seconds": metrics.decode_step_lower_bound(total, x["bandwidth"]), "fits": n_fit >= batch}
        step_rows.append({"id": x["id"], "label": label(x, lang), "bandwidth": x["bandwidth"], "per_dtype": per})
    # (d) roofline of the chosen device
    tx = texts("calc_chart", lang)
    points = []
    runs = [(tx["decode_b"].format(b=1), "decode", decode_cost(m, b, context, 1))]
    if batch > 1:
        runs.append((tx["decode_b"].format(b=batch), "decode", decode_cost(m, b, context, batch)))
    runs.append((tx["prefill_n"].format(n=_q(context, "tokens", lang)), "prefill", prefill_cost(m, b, context)))
    for name, kind, cost in runs:
        points.append(roof_point(name, kind, cost, g))
    dtype_points = []
    for y in p["dtypes"]:
        if y["id"] != d["id"]:
            pt = roof_point(f"{tx['decode_b'].format(b=1)}, {y['name']}", "decode",
                            decode_cost(m, y["bytes"], context, 1), g)
            pt["short"] = y["name"]
            dtype_points.append(pt)
    # (e) speculative decoding
    alphas = [i / 50 for i in range(51)]
    ks = list(range(1, max(12, k) + 1))
    grid = [[metrics.speculative_speedup(a, kk, draft_cost) for a in alphas] for kk in ks]
    expected = [metrics.expected_tokens_per_pass(a, k) for a in alphas]
    e_k = metrics.expected_tokens_per_pass(alpha, k)
    s_k = metrics.speculative_speedup(alpha, k, draft_cost)

    figs = {
        "chart-calc-kv": charts.kv_chart(kv_rows, dtypes, context, batch, lang),
        "chart-calc-fit": charts.fit_chart(fit_rows, label(m, lang), d["name"], context, reserve_fraction, lang),
        "chart-calc-step": charts.step_chart(step_rows, dtypes, context, batch, lang),
        "chart-calc-roofline": charts.roofline_chart({"label": label(g, lang), "peak_flops": g["peak_flops"],
                                                      "bandwidth": g["bandwidth"]}, points, d["name"], lang,
                                                     dtype_points),
        "chart-calc-spec": charts.spec_chart(alphas, ks, grid, expected, alpha, k, draft_cost, e_k, s_k, lang,
                                             line_ks=sorted({1, 2, 4, 8, k})),
    }
    numbers = dict(model=m, gpu=g, dtype=d, context=context, batch=batch, kv_seq=kv_seq, nm=nm,
                   fit=next(r for r in fit_rows if r["id"] == g["id"]), points=points,
                   alpha=alpha, k=k, c=draft_cost, e=e_k, s=s_k, reserve=reserve_fraction, live=live, machine=mach)
    return {"figs": figs, "html": {"html-calc-formulas": formulas_html(numbers, lang)}}


def fit_row(device: dict, weight_bytes: float, kv_seq: float, reserve_fraction: float, lang: str = "en") -> dict:
    n = metrics.max_concurrent_sequences(device["memory_bytes"], weight_bytes, kv_seq, reserve_fraction)
    return {"id": device["id"], "label": label(device, lang), "memory_bytes": device["memory_bytes"],
            "weight_bytes": weight_bytes, "reserve_bytes": device["memory_bytes"] * reserve_fraction,
            "kv_bytes_per_seq": kv_seq, "n": n}


def roof_point(name: str, kind: str, cost: metrics.StepCost, device: dict) -> dict:
    i = metrics.arithmetic_intensity(cost.flops, cost.bytes)
    return {"label": name, "kind": kind, "flops": cost.flops, "bytes": cost.bytes, "intensity": i,
            "attainable": metrics.attainable_flops(i, device["peak_flops"], device["bandwidth"])}


# ---- the formulas, numbers filled in ------------------------------------------------------------------------

def _ru_plural(n: float, one: str, few: str, many: str) -> str:
    if not float(n).is_integer():
        return few  # fractions take the genitive singular: 0,5 байта
    n = abs(int(n))
    if n % 10 == 1 and n % 100 != 11:
        return one
    if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
        return few
    return many


def _q(n: float, word: str, lang: str) -> str:
    """'32 layers' / '32 слоя': a number with its unit word in the right form."""
    forms = texts("calc_word", lang)[word]  # en: (one, many); ru: (one, few, many)
    num = fmt_int(n, lang) if float(n).is_integer() else fmt_num(n, lang)
    if lang == "ru":
        return f"{num} {_ru_plural(n, *forms)}"
    return f"{num} {forms[0] if n == 1 else forms[1]}"


def formulas_html(n: dict, lang: str) -> str:
    """Each whiteboard formula with the chosen numbers substituted, as a small HTML list."""
    f = texts("calc_f", lang)
    m, g, d = n["model"], n["gpu"], n["dtype"]
    b, ctx, batch, nm = d["bytes"], n["context"], n["batch"], n["nm"]
    gname = label(g, lang)
    bytes_w = _q(b, "bytes", lang) + f" ({d['name']})"
    rows = []
    kv_batch = metrics.kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], ctx, batch, b)
    rows.append((f["kv"], f"2 × {_q(m['num_layers'], 'layers', lang)} × {_q(m['num_kv_heads'], 'kv_heads', lang)} × "
                          f"{m['head_dim']} ({f['head_dim']}) × {_q(ctx, 'tokens', lang)} × "
                          f"{_q(batch, 'seqs', lang)} × {bytes_w} = <b>{fmt_bytes(kv_batch, lang)}</b> "
                          f"({fmt_bytes(nm['kv_per_token'], lang)} {f['per_token']})"))
    rows.append((f["weights"], f"{_q(m['num_params'], 'params', lang)} × {bytes_w} = "
                               f"<b>{fmt_bytes(nm['weight_bytes'], lang)}</b>"))
    fit = n["fit"]
    r = n["reserve"]
    ok = f["batch_ok"] if fit["n"] >= batch else f["no_batch"]
    rows.append((f["fit"].format(gpu=_e(gname)),
                 f"⌊({fmt_bytes(g['memory_bytes'], lang)} × (1 − {fmt_num(r, lang)}) − "
                 f"{fmt_bytes(nm['weight_bytes'], lang)}) ÷ {fmt_bytes(n['kv_seq'], lang)}⌋ = "
                 f"<b>{_q(fit['n'], 'seqs', lang)}</b> × {_q(ctx, 'tokens', lang)}; {ok.format(b=batch)}"))
    kv_read = kv_batch
    total = nm["weight_step_bytes"] + kv_read
    t = metrics.decode_step_lower_bound(total, g["bandwidth"])
    rows.append((f["step"].format(gpu=_e(gname)),
                 f"({fmt_bytes(nm['weight_step_bytes'], lang)} + {fmt_bytes(kv_read, lang)}) ÷ "
                 f"{fmt_si(g['bandwidth'], 'B/s', lang)} = <b>{fmt_seconds(t, lang)}</b>; "
                 + f["tps"].format(t=fmt_num(1 / t, lang), tt=fmt_num(batch / t, lang))))
    ridge = metrics.ridge_point(g["peak_flops"], g["bandwidth"])
    fb = UI["si_units"][lang]["FLOP/B"]  # (t is the step's time here)
    parts = []
    for p in n["points"]:
        bound = f["mem_bound"].format(pct=fmt_num(100 * p["attainable"] / g["peak_flops"], lang)) \
            if p["intensity"] < ridge else f["compute_bound"]
        parts.append(f"{_e(p['label'])}: {fmt_si(p['flops'], 'FLOP', lang)} ÷ {fmt_bytes(p['bytes'], lang)} = "
                     f"<b>{fmt_num(p['intensity'], lang)} {fb}</b> — {bound}")
    ridge_txt = (f"{fmt_si(g['peak_flops'], 'FLOP/s', lang)} ÷ {fmt_si(g['bandwidth'], 'B/s', lang)} = "
                 f"<b>{fmt_num(ridge, lang)} {fb}</b>")
    rows.append((f["intensity"].format(gpu=_e(gname)), "<br>".join([ridge_txt] + parts)))
    a, k, c = n["alpha"], n["k"], n["c"]
    rows.append((f["spec"],
                 f"E = (1 − {fmt_num(a, lang)}<sup>{k + 1}</sup>) ÷ (1 − {fmt_num(a, lang)}) = "
                 f"<b>{fmt_num(n['e'], lang, 4)}</b> {f['e']}; {f['speedup']} = {fmt_num(n['e'], lang, 4)} ÷ "
                 f"(1 + {k} × {fmt_num(c, lang)}) = <b>{fmt_num(n['s'], lang, 4)}×</b>"
                 if a < 1 else
                 f"E = k + 1 = <b>{k + 1}</b> {f['e']}; {f['speedup']} = {k + 1} ÷ (1 + {k} × {fmt_num(c, lang)}) = "
                 f"<b>{fmt_num(n['s'], lang, 4)}×</b>"))
    live, mach = n["live"], n["machine"]
    if live:
        eb = live.get("loaded_bytes_per_elem", 4)
        w = metrics.weight_bytes(live["params_per_step"], eb)
        # the loaded format's name, or its measured bytes per weight (q4 with its int8 head reads ~0.71)
        dname = {4: "fp32", 2: "bf16", 1: "int8"}.get(eb, f"{fmt_num(eb, lang)} B")
        line = f["live_line"].format(name=_e(label(live, lang)), dtype=dname, w=fmt_bytes(w, lang))
        if mach:
            t_live = metrics.decode_step_lower_bound(w, mach["bandwidth"])
            line += (f"; {fmt_bytes(w, lang)} ÷ {fmt_si(mach['bandwidth'], 'B/s', lang)} "
                     f"({f['measured']}) = <b>{fmt_seconds(t_live, lang)}</b>")
        rows.append((f["live"], line))
    items = "".join(f'<li><span class="il-calc-name">{_e(name)}</span><br><code>{body}</code></li>'
                    for name, body in rows)
    note = _e(f["notes"].format(pct=fmt_num(100 * r, lang)))
    return f'<div class="il-calc-formulas"><ul>{items}</ul><p class="il-calc-notes">{note}</p></div>'


def _e(s: str) -> str:
    return html.escape(str(s))


# ---- input checks -----------------------------------------------------------------------------------------------

def _pick(what: str, key: str, items: list[dict]) -> dict:
    for x in items:
        if x["id"] == key:
            return x
    raise Refusal("calc_unknown", what=Phrase(f"name.{what}"), value=repr(key), ids=", ".join(x["id"] for x in items))


def _as_int(name: str, v, lo: int, hi: int) -> int:
    """Sliders and number boxes send floats: accept whole numbers, reject fractions and out-of-range values."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or float(v) != int(v):
        raise Refusal("calc_whole", name=Phrase(f"name.{name}"), value=repr(v))
    v = int(v)
    if not lo <= v <= hi:
        raise Refusal("calc_range", name=Phrase(f"name.{name}"), lo=lo, hi=hi, value=v)
    return v


def _as_float(name: str, v, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise Refusal("calc_number", name=Phrase(f"name.{name}"), value=repr(v))
    if not lo <= v <= hi:
        raise Refusal("calc_range", name=Phrase(f"name.{name}"), lo=lo, hi=hi, value=v)
    return float(v)
