"""Weight formats side by side: pure functions of one engine.formats_compare.FormatsComparison.

  floor_chart   ms per decode step against MB read per step, one point per format, over this machine's floor
                max(bytes ÷ bandwidth, FLOPs ÷ peak): the roofline of a decode step, in time
  kl_chart      per generated position, KL(p_fp32 || p_format) of each format fed fp32's own tokens
  logit_chart   per position, the raw logit each format gives fp32's chosen token
  table_chart   format, bytes/weight, MB/step, ms/step, speed vs fp32, top-1 agreement, first divergence, mean KL
"""
from __future__ import annotations

import math

from .common import LINE, column_widths, empty, figure, fmt_num, layout, legend_key, plain
from ..i18n import texts

FORMAT_COLORS = {"fp32": "#4C78A8", "bf16": "#F58518", "int8": "#9D755D", "q4": "#72B7B2"}  # as the calculators' dtypes
FLOOR_COLOR = "#444444"
UIREV = {"floor": "chart-formats-floor", "kl": "chart-formats-kl", "logit": "chart-formats-logit",
         "table": "chart-formats-table"}
AGREE, DISAGREE = "circle", "x"


def _t(lang: str):
    return texts("quant", lang)


def floor_ms(step_bytes: float, step_flops: float, bandwidth: float, peak_flops: float) -> float:
    """The least time a step reading `step_bytes` and doing `step_flops` can take on this machine (ms)."""
    return 1e3 * max(step_bytes / bandwidth, step_flops / peak_flops)


def _machine_ok(bandwidth, peak_flops) -> bool:
    try:
        return all(math.isfinite(float(v)) and float(v) > 0 for v in (bandwidth, peak_flops))
    except (TypeError, ValueError):
        return False


def floor_points(cmp, bandwidth: float, peak_flops: float) -> list[dict]:
    """One point per format that measured a decode step: MB read, ms measured, the floor's ms and the share
    of the floor's speed reached."""
    ref = cmp.reference.step_ms
    pts = []
    for r in cmp.runs:
        if r.step_ms is None:
            continue
        lo = floor_ms(r.step_bytes, r.step_flops, bandwidth, peak_flops)
        pts.append(dict(weights=r.weights, mb=r.step_bytes / 1e6, ms=r.step_ms, floor_ms=lo,
                        pct=100.0 * lo / r.step_ms, bytes_per_weight=r.bytes_per_weight,
                        speedup=(ref / r.step_ms) if ref else None, kernel=r.kernels["qkv"]["single"]))
    return pts


def floor_chart(cmp, bandwidth: float, peak_flops: float, lang: str = "en") -> dict:
    """x: MB read per decode step, y: measured ms per decode step; the floor line: the memory slope
    bytes ÷ bandwidth above the compute floor FLOPs ÷ peak (the fp32 run's FLOPs: every format does the same
    multiply-adds). Trace "formats": customdata [format, MB, ms, floor ms, % of floor, B/weight, × fp32]."""
    tx = _t(lang)
    if cmp is None:
        return empty(tx["floor"], tx["none"], UIREV["floor"])
    if not _machine_ok(bandwidth, peak_flops):
        return empty(tx["floor"], tx["no_machine"], UIREV["floor"])
    bw, pf = float(bandwidth), float(peak_flops)
    pts = floor_points(cmp, bw, pf)
    if not pts:
        return empty(tx["floor"], tx["no_decode"], UIREV["floor"])
    flops = cmp.reference.step_flops
    x_hi = max(p["mb"] for p in pts) * 1.25
    y_hi = max(max(p["ms"] for p in pts), floor_ms(x_hi * 1e6, flops, bw, pf)) * 1.2
    knee = flops / pf * bw / 1e6  # MB where reading starts to take longer than computing
    line_x = [0.0] + ([knee] if 0 < knee < x_hi else []) + [x_hi]
    data = [
        dict(type="scatter", name="floor", mode="lines", x=line_x,
             y=[floor_ms(x * 1e6, flops, bw, pf) for x in line_x], line=dict(color=FLOOR_COLOR, width=2),
             hovertemplate=tx["floor_hover"] + "<extra></extra>"),
        dict(type="scatter", name="formats", mode="markers+text", x=[p["mb"] for p in pts],
             y=[p["ms"] for p in pts], text=[p["weights"] for p in pts], textposition="top center",
             marker=dict(size=13, color=[FORMAT_COLORS[p["weights"]] for p in pts], line=dict(color="white", width=1)),
             customdata=[[p["weights"], p["mb"], p["ms"], p["floor_ms"], p["pct"], p["bytes_per_weight"],
                          p["speedup"]] for p in pts],
             hovertemplate=tx["point_hover"] + "<extra></extra>"),
    ]
    key = [(LINE, FLOOR_COLOR, tx["floor_name"].format(bw=fmt_num(bw / 1e9, lang)))]
    lay = layout(tx["floor_title"], UIREV["floor"], height=380, annotations=[legend_key([key])],
                 margin=dict(l=60, r=20, t=78, b=45),
                 xaxis=dict(title=dict(text=tx["x_mb"]), range=[0, x_hi], gridcolor="#EEE", zeroline=True),
                 yaxis=dict(title=dict(text=tx["y_ms"]), range=[0, y_hi], gridcolor="#EEE", zeroline=True))
    return figure(data, lay)


def _positions(cmp) -> list[int]:
    return list(range(len(cmp.reference_ids)))


def kl_chart(cmp, lang: str = "en") -> dict:
    """One line per format except fp32 (0 by definition): KL(p_fp32 || p_format) at each generated position.
    A cross marks a position where the format's own greedy choice is not fp32's token.
    Each trace: customdata [fp32's token, its own top token, KL, logit, log-prob, agrees]."""
    tx = _t(lang)
    if cmp is None:
        return empty(tx["kl"], tx["none"], UIREV["kl"])
    others = [r for r in cmp.runs if r.weights != "fp32"]
    if not others:
        return empty(tx["kl"], tx["only_fp32"], UIREV["kl"])
    xs = _positions(cmp)
    data = []
    for r in others:
        data.append(dict(
            type="scatter", name=r.weights, mode="lines+markers", x=xs, y=list(r.kl),
            line=dict(color=FORMAT_COLORS[r.weights], width=1.5),
            marker=dict(color=FORMAT_COLORS[r.weights], size=[7 if a else 12 for a in r.top1],
                        symbol=[AGREE if a else DISAGREE for a in r.top1]),
            customdata=[[plain(cmp.reference_texts[i]), r.own_top[i], r.kl[i], r.chosen_logit[i],
                         r.chosen_logprob[i], tx["agrees"] if r.top1[i] else tx["differs"]] for i in xs],
            hovertemplate=f"<b>{r.weights}</b> · " + tx["kl_hover"] + "<extra></extra>"))
    key = [("●", FORMAT_COLORS[r.weights], r.weights) for r in others] + [("✕", "#333", tx["differs_key"])]
    lay = layout(tx["kl_title"], UIREV["kl"], height=340, annotations=[legend_key([key])],
                 margin=dict(l=84, r=20, t=78, b=45),
                 xaxis=dict(title=dict(text=tx["x_pos"]), gridcolor="#EEE", dtick=max(1, len(xs) // 8),
                            zeroline=False),
                 yaxis=dict(title=dict(text=tx["y_kl"]), gridcolor="#EEE", rangemode="tozero",
                            tickformat=".2~g", exponentformat="none"))  # 0.0006, not 600µ
    return figure(data, lay)


def logit_chart(cmp, lang: str = "en") -> dict:
    """One line per format: the raw logit it gives fp32's chosen token at each position (fp32's own line is the
    reference). Each trace: customdata [fp32's token, logit, log-prob]."""
    tx = _t(lang)
    if cmp is None:
        return empty(tx["logit"], tx["none"], UIREV["logit"])
    xs = _positions(cmp)
    data = [dict(type="scatter", name=r.weights, mode="lines+markers", x=xs, y=list(r.chosen_logit),
                 line=dict(color=FORMAT_COLORS[r.weights], width=2.5 if r.weights == "fp32" else 1.5,
                           dash="solid" if r.weights == "fp32" else "dot"),
                 marker=dict(color=FORMAT_COLORS[r.weights], size=6),
                 customdata=[[plain(cmp.reference_texts[i]), r.chosen_logit[i], r.chosen_logprob[i]] for i in xs],
                 hovertemplate=f"<b>{r.weights}</b> · " + tx["logit_hover"] + "<extra></extra>")
            for r in cmp.runs]
    key = [("●", FORMAT_COLORS[r.weights], r.weights) for r in cmp.runs]
    lay = layout(tx["logit_title"], UIREV["logit"], height=340, annotations=[legend_key([key])],
                 margin=dict(l=60, r=20, t=78, b=45),
                 xaxis=dict(title=dict(text=tx["x_pos"]), gridcolor="#EEE", dtick=max(1, len(xs) // 8),
                            zeroline=False),
                 yaxis=dict(title=dict(text=tx["y_logit"]), gridcolor="#EEE"))
    return figure(data, lay)


def table_rows(cmp, lang: str = "en") -> list[list[str]]:
    """The table's rows, formatted: one per format, fp32 first."""
    tx = _t(lang)
    ref = cmp.reference.step_ms
    rows = []
    for r in cmp.runs:
        if r.first_divergence is None:
            div = tx["never"]
        else:
            i = r.first_divergence
            tok = plain(cmp.reference_texts[i]) if i < len(cmp.reference_texts) else tx["end"]
            div = tx["at"].format(i=i, tok=tok)
        rows.append([r.weights, fmt_num(r.bytes_per_weight, lang), fmt_num(r.step_bytes / 1e6, lang),
                     "–" if r.step_ms is None else fmt_num(r.step_ms, lang),
                     "–" if not (ref and r.step_ms) else f"{fmt_num(ref / r.step_ms, lang)}×",
                     f"{fmt_num(100 * r.agreement, lang)} %", div, fmt_num(r.mean_kl, lang, 2)])
    return rows


def table_chart(cmp, lang: str = "en") -> dict:
    tx = _t(lang)
    if cmp is None:
        return empty(tx["table"], tx["none"], UIREV["table"])
    rows = table_rows(cmp, lang)
    cols = [list(c) for c in zip(*rows)]
    trace = dict(type="table", columnwidth=column_widths(tx["cols"], cols),
                 header=dict(values=[f"<b>{c}</b>" for c in tx["cols"]], fill=dict(color="#F0F0F0"), align="left",
                             height=40),
                 cells=dict(values=cols, align="left", height=24,
                            fill=dict(color=[[_tint(FORMAT_COLORS[r.weights]) for r in cmp.runs]] + [["white"]] * 7)))
    lay = layout(tx["table_title"].format(n=len(cmp.reference_ids), p=cmp.prompt_tokens), UIREV["table"],
                 height=120 + 46 * len(rows), margin=dict(l=10, r=10, t=44, b=10))  # a cell may wrap to two lines
    return figure([trace], lay)


def _tint(colour: str) -> str:
    """A light version of a format's colour for its table cell."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#%02X%02X%02X" % tuple(int(v + (255 - v) * 0.75) for v in (r, g, b))


def all_charts(cmp, bandwidth: float, peak_flops: float, lang: str = "en") -> dict:
    """{chart id: figure} of the panel."""
    return {"chart-formats-floor": floor_chart(cmp, bandwidth, peak_flops, lang),
            "chart-formats-kl": kl_chart(cmp, lang),
            "chart-formats-logit": logit_chart(cmp, lang),
            "chart-formats-table": table_chart(cmp, lang)}


CHART_IDS = ["chart-formats-floor", "chart-formats-kl", "chart-formats-logit", "chart-formats-table"]
