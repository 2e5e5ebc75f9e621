"""Whiteboard calculators: KV cache size, what fits on a GPU, the decode-step bound, the roofline, speculation.

Pure functions: each takes rows of numbers already computed by app.calculators (with engine.metrics) and
returns a Plotly figure dict, so a test can compare a chart's data with the formulas directly. Byte axes use
binary units (KiB, MiB, GiB) because memory capacities are binary; bandwidths and FLOP/s are decimal.
"""
from __future__ import annotations

import math

from .common import (ABOVE_PLOT, BAR, FREE, GREY, KEY_CHARS, KEY_ROW, LINE, empty, figure, fmt_bytes, fmt_int,
                     fmt_num, fmt_si, key_rows, label_px, layout, legend_key)
from ..i18n import t, texts
from .timeline import KIND_COLORS as TIMELINE_KINDS

UIREV_KV = "chart-calc-kv"
UIREV_FIT = "chart-calc-fit"
UIREV_STEP = "chart-calc-step"
UIREV_ROOF = "chart-calc-roofline"
UIREV_SPEC = "chart-calc-spec"

DTYPE_COLORS = {"fp32": "#4C78A8", "bf16": "#F58518", "fp8": "#54A24B", "int8": "#9D755D", "q4": "#72B7B2",
                "int4": "#B279A2"}
MEM_COLORS = {"weights": "#4C78A8", "reserve": GREY, "kv": "#F58518", "unused": FREE}
KIND_COLORS = {k: TIMELINE_KINDS[k] for k in ("prefill", "decode")}  # the same as the live roofline's
ROOF_COLOR = "#444444"
# the fit chart's plot area at its narrowest: a calculator chart is never narrower than ~450 px (static/lab.css
# lays them two to a row only in a panel over 920 px), less its 150 + 20 px margins
FIT_PLOT_PX = 280
K_COLORS = ["#9ECAE1", "#6BAED6", "#3182BD", "#08519C", "#08306B", "#F58518"]


def _t(lang: str) -> dict:
    return texts("calc_chart", lang)


# ---- number formatting (shared with the formulas in app.calculators; fmt_num and fmt_bytes: .common) ----

def fmt_seconds(s: float, lang: str = "en") -> str:
    seconds, ms, us = t("time_units", lang)
    if s >= 1:
        return f"{fmt_num(s, lang)} {seconds}"
    if s >= 1e-3:
        return f"{fmt_num(s * 1e3, lang)} {ms}"
    return f"{fmt_num(s * 1e6, lang)} {us}"


def byte_ticks(lo: float, hi: float, lang: str = "en", max_ticks: int = 8) -> tuple[list[float], list[str]]:
    """Tick values at powers of two between lo and hi (bytes), labelled in binary units, at most max_ticks."""
    if not (lo > 0 and hi > lo):
        return [], []
    j0, j1 = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    for stride in (1, 2, 5, 10, 20):
        js = [j for j in range(j0, j1 + 1) if j % stride == 0]
        if len(js) <= max_ticks:
            break
    vals = [2.0 ** j for j in js]
    return vals, [fmt_bytes(v, lang) for v in vals]


def _log_range(lo: float, hi: float, pad: float = 1.6) -> list[float]:
    return [math.log10(lo / pad), math.log10(hi * pad)]


def _key(items: list[tuple[str, str, str]], left: int, chars: int = KEY_CHARS) -> tuple[dict, int]:
    """A key above the plot, under the title, from the left margin's axis title on (`left`: the margin's width),
    and the top margin it needs. A Plotly legend there wrapped by the chart's width and grew into the title; a
    key's rows are fixed (common.key_rows)."""
    rows = key_rows(items, chars)
    # 8 px above the plot: the top tick label of the y axis reaches above it
    key = legend_key(rows, x=0, xanchor="left", xshift=22 - left, yshift=8, align="left")
    return key, ABOVE_PLOT + KEY_ROW * len(rows) + 8


def _two_lines(label: str) -> str:
    """A long device or model name as two tick-label lines, its parenthesis on the second: turned by the axis,
    the whole name ran off the chart's left edge."""
    head, sep, tail = label.partition(" (")
    return f"{head}<br>({tail}" if sep and len(label) > 16 else label


# ---- (a) KV bytes per token / per sequence -----------------------------------------------------------------

def kv_chart(models: list[dict], dtypes: list[dict], context: int, batch: int = 1, lang: str = "en") -> dict:
    """Grouped bars: one group per model, one bar per dtype, height = KV bytes per token (log axis).

    models: [{"id", "label", "per_token": {dtype id: bytes}, "selected": bool}]; dtypes: [{"id", "label"}].
    The right axis is the left one scaled by `context`, so the same bar reads as bytes per sequence.
    """
    tx = _t(lang)
    if not models or not dtypes:
        return empty(tx["kv_title"].format(ctx=context), tx["no_data"], UIREV_KV)
    labels = [("<b>" + m["label"] + "</b>") if m.get("selected") else m["label"] for m in models]
    data = []
    values = []
    for d in dtypes:
        ys = [float(m["per_token"][d["id"]]) for m in models]
        values += ys
        hover = [tx["kv_hover"].format(model=m["label"], dtype=d["label"], tok=fmt_bytes(y, lang),
                                       seq=fmt_bytes(y * context, lang), ctx=fmt_int(context, lang),
                                       batch=fmt_bytes(y * context * batch, lang), b=batch)
                 for m, y in zip(models, ys)]
        data.append(dict(type="bar", name=d["label"], x=labels, y=ys, customdata=hover,
                         marker=dict(color=DTYPE_COLORS.get(d["id"], GREY),
                                     line=dict(color=["#222" if m.get("selected") else "rgba(0,0,0,0)"
                                                      for m in models], width=1.5)),
                         hovertemplate="%{customdata}<extra></extra>"))
    lo, hi = min(values), max(values)
    yr = _log_range(lo, hi)
    shift = math.log10(context)
    y2r = [yr[0] + shift, yr[1] + shift]
    tv, tt = byte_ticks(10 ** yr[0], 10 ** yr[1], lang)
    tv2, tt2 = byte_ticks(10 ** y2r[0], 10 ** y2r[1], lang)
    # An invisible trace on the right axis: plotly.js draws an overlaying axis only when a trace uses it.
    data.append(dict(type="scatter", mode="markers", x=[labels[0]], y=[10 ** y2r[0]], yaxis="y2", showlegend=False,
                     hoverinfo="skip", marker=dict(opacity=0, size=1)))
    key, top = _key([(BAR, DTYPE_COLORS.get(d["id"], GREY), d["label"]) for d in dtypes], 75)
    # names of two lines turned by 45°: at 30° a name's second line ran into the next name ("(loaded)" over
    # "Llama-3-8B") where groups are ~55 px apart (a chart half of a 1600 px window)
    lay = layout(tx["kv_title"].format(ctx=fmt_int(context, lang)), UIREV_KV, height=410 + top - 44,
                 barmode="group", bargap=0.25, margin=dict(l=75, r=85, t=top, b=110), annotations=[key],
                 xaxis=dict(tickangle=-45, automargin=True, tickmode="array", tickvals=labels,
                            ticktext=[_two_lines(x) for x in labels]),
                 yaxis=dict(type="log", range=yr, title=dict(text=tx["per_token"]), tickvals=tv, ticktext=tt,
                            gridcolor="#EEE"),
                 yaxis2=dict(type="log", range=y2r, overlaying="y", side="right", tickvals=tv2, ticktext=tt2,
                             title=dict(text=tx["per_seq"].format(ctx=fmt_int(context, lang))), showgrid=False))
    return figure(data, lay)


# ---- (b) how many sequences fit ---------------------------------------------------------------------------

def fit_chart(rows: list[dict], model: str, dtype: str, context: int, reserve_fraction: float,
              lang: str = "en") -> dict:
    """Horizontal stacked bars per device: weights | reserve | KV of the n sequences that fit | left over.

    rows: [{"id", "label", "memory_bytes", "weight_bytes", "reserve_bytes", "kv_bytes_per_seq", "n"}];
    the "kv" trace's customdata[i] is n for row i. x is in GiB.
    """
    tx = _t(lang)
    title = tx["fit_title"].format(model=model, dtype=dtype, ctx=fmt_int(context, lang))
    if not rows:
        return empty(title, tx["no_data"], UIREV_FIT)
    gib = float(2**30)
    ys = [r["label"] for r in rows]
    w = [min(r["weight_bytes"], r["memory_bytes"]) for r in rows]
    res = [min(r["reserve_bytes"], max(0.0, r["memory_bytes"] - r["weight_bytes"])) for r in rows]
    kv = [r["n"] * r["kv_bytes_per_seq"] for r in rows]
    unused = [max(0.0, r["memory_bytes"] - a - b - c) for r, a, b, c in zip(rows, w, res, kv)]
    hover = []
    for r in rows:
        free = max(0.0, r["memory_bytes"] - r["reserve_bytes"] - r["weight_bytes"])
        hover.append(tx["fit_hover"].format(gpu=r["label"], mem=fmt_bytes(r["memory_bytes"], lang),
                                            w=fmt_bytes(r["weight_bytes"], lang), r=fmt_bytes(r["reserve_bytes"], lang),
                                            free=fmt_bytes(free, lang), kv=fmt_bytes(r["kv_bytes_per_seq"], lang),
                                            n=fmt_int(r["n"], lang)))
    pct = fmt_num(100 * reserve_fraction, lang)
    parts = [("weights", tx["weights"], w), ("reserve", tx["reserve"].format(pct=pct), res), ("kv", tx["kv"], kv),
             ("unused", tx["unused"], unused)]
    data = []
    for key, name, xs in parts:
        trace = dict(type="bar", orientation="h", name=name, y=ys, x=[v / gib for v in xs],
                     marker=dict(color=MEM_COLORS[key], line=dict(color="white", width=0.5)),
                     hovertext=hover, hovertemplate="%{hovertext}<extra></extra>")
        if key == "kv":
            trace["customdata"] = [r["n"] for r in rows]
        data.append(trace)
    # Weights that exceed the device: draw the overflow past the capacity line in red.
    over = [max(0.0, r["weight_bytes"] - r["memory_bytes"]) / gib for r in rows]
    if any(over):
        data.append(dict(type="bar", orientation="h", name=tx["no_fit"], y=ys, x=over,
                         marker=dict(color="#E45756", pattern=dict(shape="/")), hovertext=hover,
                         hovertemplate="%{hovertext}<extra></extra>"))
    ends = [max(r["memory_bytes"], r["weight_bytes"]) / gib for r in rows]
    labels = [" " + (tx["no_fit"] if r["weight_bytes"] > r["memory_bytes"] else tx["no_kv"] if r["n"] == 0
                     else tx["fit_n"].format(n=fmt_int(r["n"], lang))) for r in rows]
    data.append(dict(type="scatter", mode="text", name="n", y=ys, x=ends, text=labels, textposition="middle right",
                     cliponaxis=False,
                     showlegend=False, hoverinfo="skip", textfont=dict(size=12, color="#222")))
    data.append(dict(type="scatter", mode="markers", name=tx["capacity"], y=ys,
                     x=[r["memory_bytes"] / gib for r in rows], showlegend=False, hoverinfo="skip",
                     marker=dict(symbol="line-ns", size=22, line=dict(width=2.5, color="#222"))))
    # room after each bar for its label ("546 seq.", "weights do not fit"), in a plot at least FIT_PLOT_PX wide:
    # a fixed 45 % cut "weights do not fit" where the weights' own bar was the longest
    xmax = max(max(ends) * 1.1, *(e / max(0.2, 1 - label_px(12, len(s)) / FIT_PLOT_PX) for e, s in zip(ends, labels)))
    items = [(BAR, MEM_COLORS[key], name) for key, name, _ in parts] + [(BAR, "#E45756", tx["no_fit"])] * any(over)
    key, top = _key(items, 150)
    lay = layout(title, UIREV_FIT, barmode="stack", height=max(300, 100 + 46 * len(rows)) + top,
                 margin=dict(l=150, r=20, t=top, b=50), annotations=[key],
                 xaxis=dict(title=dict(text=tx["gib"]), range=[0, xmax], gridcolor="#EEE"),
                 yaxis=dict(autorange="reversed", automargin=True))
    return figure(data, lay)


# ---- (c) decode-step lower bound per dtype and device -------------------------------------------------------

def step_chart(rows: list[dict], dtypes: list[dict], context: int, batch: int, lang: str = "en") -> dict:
    """Grouped bars: x = device, one bar per dtype, y = (weights + KV read) / bandwidth in ms (log axis).

    rows: [{"id", "label", "bandwidth", "per_dtype": {dtype id: {"weight_bytes", "kv_bytes", "bytes", "seconds",
    "fits"}}}]. Hatched bars do not fit in that device's memory (the bound is then hypothetical).
    """
    tx = _t(lang)
    title = tx["step_title"].format(b=batch, ctx=fmt_int(context, lang))
    if not rows or not dtypes:
        return empty(title, tx["no_data"], UIREV_STEP)
    xs = [r["label"] for r in rows]
    data, all_ms = [], []
    for d in dtypes:
        cells = [r["per_dtype"][d["id"]] for r in rows]
        ms = [c["seconds"] * 1e3 for c in cells]
        all_ms += ms
        hover = []
        for r, c in zip(rows, cells):
            h = tx["step_hover"].format(gpu=r["label"], dtype=d["label"], w=fmt_bytes(c["weight_bytes"], lang),
                                        kv=fmt_bytes(c["kv_bytes"], lang), tot=fmt_bytes(c["bytes"], lang),
                                        bw=fmt_si(r["bandwidth"], "B/s", lang), t=fmt_seconds(c["seconds"], lang),
                                        tps=fmt_num(1.0 / c["seconds"], lang))
            hover.append(h if c["fits"] else h + f"<br><i>{tx['no_room']}</i>")
        data.append(dict(type="bar", name=d["label"], x=xs, y=ms, customdata=hover,
                         text=[fmt_num(v, lang) for v in ms], textposition="outside", textfont=dict(size=9),
                         marker=dict(color=DTYPE_COLORS.get(d["id"], GREY),
                                     opacity=[1.0 if c["fits"] else 0.45 for c in cells],
                                     pattern=dict(shape=["" if c["fits"] else "/" for c in cells])),
                         hovertemplate="%{customdata}<extra></extra>"))
    items = [(BAR, DTYPE_COLORS.get(d["id"], GREY), d["label"]) for d in dtypes]
    if any(not r["per_dtype"][d["id"]]["fits"] for r in rows for d in dtypes):
        items.append(("▨", "#888", tx["no_room"]))
    key, top = _key(items, 85)
    # a left margin wide enough for the first device's name, turned by the axis, beside the axis title
    lay = layout(title, UIREV_STEP, barmode="group", bargap=0.2, height=380 + top - 70,
                 margin=dict(l=85, r=20, t=top, b=70), annotations=[key],
                 xaxis=dict(tickangle=-30, automargin=True),
                 yaxis=dict(type="log", title=dict(text=tx["ms"]), range=_log_range(min(all_ms), max(all_ms), 2.5),
                            gridcolor="#EEE"))
    return figure(data, lay)


# ---- (d) roofline with decode and prefill -------------------------------------------------------------------

def roofline_chart(device: dict, points: list[dict], dtype: str, lang: str = "en",
                   dtype_points: list[dict] | None = None) -> dict:
    """Log-log roof min(peak, bandwidth × I) with its ridge; the points sit on the roof (the attainable bound).

    device: {"label", "peak_flops", "bandwidth"}; points: [{"label", "kind", "flops", "bytes", "intensity",
    "attainable"}]; dtype_points: batch-1 decode for the other dtypes (hollow markers) — quantisation moves it.
    """
    tx = _t(lang)
    title = tx["roof_title"].format(gpu=device["label"], dtype=dtype)
    pf, bw = float(device["peak_flops"]), float(device["bandwidth"])
    if not points or not (pf > 0 and bw > 0):
        return empty(title, tx["no_data"], UIREV_ROOF)
    ridge = pf / bw
    pts = list(points) + list(dtype_points or [])
    xs = [p["intensity"] for p in pts]
    lo, hi = min(min(xs), ridge) / 4, max(max(xs), ridge) * 4
    roof_x = [lo, ridge, hi]
    roof_y = [min(pf, bw * x) for x in roof_x]

    def hover(p):
        bound = tx["mem_bound"] if p["intensity"] < ridge else tx["compute_bound"]
        return tx["pt_hover"].format(name=p["label"], flops=fmt_si(p["flops"], "FLOP", lang),
                                     bytes=fmt_bytes(p["bytes"], lang), i=fmt_num(p["intensity"], lang),
                                     att=fmt_si(p["attainable"], "FLOP/s", lang), bound=bound)

    data = [dict(type="scatter", name="roof", mode="lines", x=roof_x, y=roof_y, showlegend=False,
                 line=dict(color=ROOF_COLOR, width=2.5),
                 hovertemplate=f"{tx['roof']}<br>{t('roof_hover', lang)}<extra></extra>"),
            dict(type="scatter", name="ridge", mode="lines", x=[ridge, ridge], y=[roof_y[0], pf], showlegend=False,
                 hoverinfo="skip", line=dict(color="#999", width=1, dash="dot"))]
    if dtype_points:  # named in the key, left to right: their labels ran into each other (~15 px apart)
        data.append(dict(type="scatter", name=tx["decode_dtypes"], mode="markers",
                         x=[p["intensity"] for p in dtype_points], y=[p["attainable"] for p in dtype_points],
                         marker=dict(size=9, symbol="circle-open", color=KIND_COLORS["decode"], line=dict(width=2)),
                         customdata=[hover(p) for p in dtype_points], hovertemplate="%{customdata}<extra></extra>"))
    data.append(dict(type="scatter", name="points", mode="markers+text", x=[p["intensity"] for p in points],
                     y=[p["attainable"] for p in points], text=[p["label"] for p in points],
                     # a label on the side of the roof away from it: below and right of a point on the slope (a
                     # label above and right ran into the rising roof; left of it, the plot's edge cut it), above
                     # and left of one on the flat roof
                     textposition=["bottom right" if p["intensity"] < ridge else "top left" for p in points],
                     textfont=dict(size=11), showlegend=False,
                     marker=dict(size=12, color=[KIND_COLORS[p["kind"]] for p in points],
                                 line=dict(color="white", width=1)),
                     customdata=[hover(p) for p in points], hovertemplate="%{customdata}<extra></extra>"))
    # the ridge named at the foot of its dotted line: above the roof its arrow ran through the prefill label
    annotations = [dict(x=math.log10(ridge), y=0, xref="x", yref="paper", xanchor="left", yanchor="bottom",
                        xshift=4, yshift=4, text=tx["ridge"].format(r=fmt_num(ridge, lang)), showarrow=False,
                        font=dict(size=11))]
    ymin = min(roof_y[0], min(p["attainable"] for p in pts)) / 3
    key, top = _key([("○", KIND_COLORS["decode"], dtypes_key(dtype_points, tx))] if dtype_points else [], 65)
    lay = layout(title, UIREV_ROOF, height=380, annotations=annotations + [key] * bool(dtype_points),
                 margin=dict(l=65, r=20, t=max(top, 50), b=45),
                 # a label per decade: the digits between ("2 5 2 5") crowded a narrow chart
                 xaxis=dict(type="log", title=dict(text=tx["x"]), range=[math.log10(lo), math.log10(hi)],
                            gridcolor="#EEE", dtick=1),
                 yaxis=dict(type="log", title=dict(text=tx["y"]), range=[math.log10(ymin), math.log10(pf * 8)],
                            gridcolor="#EEE", exponentformat="SI", dtick=1))
    return figure(data, lay)


def dtypes_key(dtype_points: list[dict], tx: dict) -> str:
    """The hollow points' key: their dtypes left to right, those at one intensity together ("fp8 = int8")."""
    groups: dict[float, list[str]] = {}
    for p in sorted(dtype_points, key=lambda p: p["intensity"]):
        groups.setdefault(round(math.log10(p["intensity"]), 3), []).append(p.get("short", ""))
    return tx["decode_dtypes"] + ": " + tx["left_to_right"].format(names=", ".join(" = ".join(g) for g in
                                                                                   groups.values()))


# ---- (e) speculative decoding ------------------------------------------------------------------------------

def spec_chart(alphas: list[float], ks: list[int], speedup: list[list[float]], expected: list[float],
               alpha: float, k: int, c: float, chosen_e: float, chosen_speedup: float, lang: str = "en",
               line_ks: list[int] | None = None) -> dict:
    """Left: speedup over α for several k (chosen k thick) and E(α) for the chosen k (dashed); right: a heatmap
    of speedup over α × k with the chosen point. speedup[i][j] is for k = ks[i], α = alphas[j]; expected[j] is
    E(alphas[j], k)."""
    tx = _t(lang)
    title = tx["spec_title"].format(c=fmt_num(c, lang))
    if not alphas or not ks:
        return empty(title, tx["no_data"], UIREV_SPEC)
    line_ks = [x for x in (line_ks or ks) if x in ks]
    data = []
    for n, kk in enumerate(line_ks):
        row = speedup[ks.index(kk)]
        chosen = kk == k
        data.append(dict(type="scatter", mode="lines", name=tx["line_k"].format(k=kk), x=alphas, y=row,
                         xaxis="x", yaxis="y",
                         line=dict(color=K_COLORS[-1] if chosen else K_COLORS[n % (len(K_COLORS) - 1)],
                                   width=3.5 if chosen else 1.8),
                         hovertemplate=tx["spec_hover"].replace("{k}", str(kk))))
    data.append(dict(type="scatter", mode="lines", name=tx["e_line"].format(k=k), x=alphas, y=expected,
                     xaxis="x", yaxis="y", line=dict(color=K_COLORS[-1], width=1.5, dash="dash"),
                     hovertemplate="α = %{x:.2f}<br>E = %{y:.3f}<extra></extra>"))
    data.append(dict(type="scatter", mode="lines", name=tx["breakeven"], x=[alphas[0], alphas[-1]], y=[1, 1],
                     showlegend=False, xaxis="x", yaxis="y", hoverinfo="skip",
                     line=dict(color="#999", width=1, dash="dot")))
    data.append(dict(type="scatter", mode="markers", name="chosen", x=[alpha], y=[chosen_speedup], xaxis="x",
                     yaxis="y", showlegend=False,
                     marker=dict(size=11, color=K_COLORS[-1], line=dict(color="#222", width=1.5)),
                     hovertemplate=tx["chosen"].format(a=fmt_num(alpha, lang), k=k, e=fmt_num(chosen_e, lang, 4),
                                                       s=fmt_num(chosen_speedup, lang, 4)) + "<extra></extra>"))
    zmin = min(min(r) for r in speedup)
    zmax = max(2.0, max(max(r) for r in speedup))
    # White exactly at speedup 1: red cells are slower than plain decoding, blue ones faster.
    mid = min(max((1.0 - zmin) / (zmax - zmin), 0.0), 1.0) if zmax > zmin else 0.5
    scale = [[0.0, "#B2182B"], [mid / 2, "#EF8A62"], [mid, "#F7F7F7"], [mid + (1 - mid) / 3, "#92C5DE"],
             [1.0, "#08306B"]] if 0 < mid < 1 else "Blues"
    data.append(dict(type="heatmap", name="speedup", x=alphas, y=ks, z=speedup, xaxis="x2", yaxis="y2",
                     colorscale=scale, zmin=zmin, zmax=zmax, showscale=True,
                     colorbar=dict(x=1.0, len=0.85, thickness=12, title=dict(text="×", side="top")),
                     hovertemplate=tx["heat_hover"]))
    data.append(dict(type="scatter", mode="markers", name="chosen", x=[alpha], y=[k], xaxis="x2", yaxis="y2",
                     showlegend=False, hoverinfo="skip",
                     marker=dict(size=12, symbol="x", color="#111", line=dict(width=1))))
    ymax = max(max(max(r) for r in speedup), max(expected)) * 1.08
    items = [(LINE, K_COLORS[-1] if kk == k else K_COLORS[n % (len(K_COLORS) - 1)], tx["line_k"].format(k=kk))
             for n, kk in enumerate(line_ks)] + [("╌", K_COLORS[-1], tx["e_line"].format(k=k))]
    key, top = _key(items, 60, chars=KEY_CHARS * 3 // 2)  # the chart spans the calculators' width
    lay = layout(title, UIREV_SPEC, height=400 + top - 80, margin=dict(l=60, r=40, t=top, b=50), annotations=[key],
                 xaxis=dict(domain=[0, 0.47], title=dict(text=tx["alpha"]), range=[alphas[0], alphas[-1]],
                            gridcolor="#EEE"),
                 yaxis=dict(title=dict(text=tx["speedup"]), range=[0, ymax], gridcolor="#EEE"),
                 xaxis2=dict(domain=[0.56, 0.94], title=dict(text=tx["alpha"]), anchor="y2"),
                 yaxis2=dict(title=dict(text=tx["k"]), anchor="x2", dtick=1 if len(ks) <= 12 else None))
    return figure(data, lay)
