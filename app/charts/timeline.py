"""Timeline panel: how long each step took, latency per sequence, and where each step sits on the roofline.

All times are engine time: measured step durations (engine_clock_s is their sum), so the idle time between two
clicks of "Step" does not count.
"""
from __future__ import annotations

import math

from .common import BAR, GREY, LINE, empty, figure, fmt_si, layout, legend_key, seq_color
from ..i18n import t, texts

UIREV_TIMELINE = "chart-timeline"
UIREV_LATENCY = "chart-latency"
UIREV_ROOFLINE = "chart-roofline"
# A step's kind in dark shades, far from every sequence's colour (common.SEQ_COLORS, drawn in the same chart's
# batch strip and key): "mixed" was the orange of seq #1, "decode" the green of seq #2
KIND_COLORS = {"prefill": "#2D004B", "decode": "#00441B", "mixed": "#8C2D04", "idle": GREY}
ROOF_COLOR = "#444444"
HATCH, HOLLOW = "▨", "□"


def _t(lang: str) -> dict:
    return texts("timeline", lang)


def step_kind(event) -> str:
    """"prefill", "decode", "mixed" (both in one batch) or "idle" (nothing scheduled)."""
    phases = {s.phase for s in event.seqs}
    if not phases:
        return "idle"
    if phases == {"prefill"}:
        return "prefill"
    if phases == {"decode"}:
        return "decode"
    return "mixed"


def _step_hover(event, tx: dict) -> str:
    kind = step_kind(event)
    lines = [f"<b>{tx['step']} {event.step}</b> · {tx['kinds'][kind]}"]
    for s in event.seqs:
        start, n = s.chunk_start, s.num_processed
        pos = f" [{start}–{start + n - 1}]" if n > 1 else f" [{start}]"
        lines.append(f"{tx['seq']} {s.seq_id}: {s.phase} {n} {tx['tok']}{pos}")
    tm = event.timing
    ms = tx["ms_short"]
    lines.append(f"{tx['forward']} {tm.forward_ms:.1f} {ms} · {tx['sample']} "
                 f"{tm.sample_ms:.1f} {ms} · {tx['schedule']} {tm.schedule_ms:.2f} {ms}")
    if getattr(tm, "grammar_ms", 0.0):  # constrained decoding: the masks' build time, a part of "sample"
        lines.append(tx["grammar_ms"].format(ms=tm.grammar_ms, fwd=tm.forward_ms))
    for key in ("admitted", "preempted", "finished", "waiting"):
        ids = getattr(event, key)
        if ids:
            lines.append(f"{tx[key]}: {', '.join(map(str, ids))}")
    return "<br>".join(lines)


# ---- who was in each step -------------------------------------------------------------------------------
# A step's batch is drawn as one unit-high segment per sequence (the bar's height is the batch size), coloured
# by sequence; a prefill chunk is hatched, a decode solid, and the number inside is the tokens it processed.
# The waiting queue sits on top as hollow segments, and a preemption is a red cross over its step.
OTHER_COLOR = "#D9D9D9"  # another tab's sequence in the same engine step (the room batches everyone)
PREEMPT_COLOR = "#D62728"
GRAMMAR_COLOR = "#6A3D9A"  # the grammar masks' build time (constrained decoding)
PHASE_PATTERN = {"prefill": "/", "decode": "", "verify": "x"}


def my_owner(events) -> str | None:
    """The owner whose share these events are (StepEvent.for_owner keeps only its sequences' records); None
    when no sequence of its own ran yet (then every sequence an event names is treated as its own)."""
    for e in events:
        for s in e.seqs:
            if s.seq_id in e.owners:
                return e.owners[s.seq_id]
    return None


def _mine(event, seq_id: int, me: str | None) -> bool:
    if me is None or not event.owners:
        return True
    return event.owners.get(seq_id, me) == me


def batch_segments(event, me: str | None = None) -> list[dict]:
    """The step's batch, one dict per sequence: seq_id, mine, phase ("prefill", "decode", or "verify" for a
    speculative round), tokens (processed this step), emitted, start (first position, own sequences only).

    From `event.batch` (the whole batch, every owner's, in brief); an event without it (a trace from before the
    room) from its own sequences."""
    own = {s.seq_id: s for s in event.seqs}
    rows = event.batch or [{"seq_id": s.seq_id, "phase": s.phase, "num_processed": s.num_processed,
                            "num_drafted": 0 if s.spec is None else s.spec.num_drafted,
                            "num_emitted": int(s.new_token is not None)} for s in event.seqs]
    out = []
    for b in rows:
        sid = int(b["seq_id"])
        s = own.get(sid)
        out.append(dict(seq_id=sid, mine=_mine(event, sid, me), tokens=int(b["num_processed"]),
                        phase="verify" if b.get("num_drafted") else b["phase"], emitted=int(b.get("num_emitted", 0)),
                        start=None if s is None else s.chunk_start))
    out.sort(key=lambda r: (not r["mine"], r["seq_id"]))  # this tab's own first, at the bottom of the bar
    return out


def _segment_hover(seg: dict, step: int, tx: dict) -> str:
    who = f"{tx['seq']} #{seg['seq_id']}" if seg["mine"] else tx["other_tab"]
    what = tx["phase_" + seg["phase"]]
    line = f"<b>{who}</b> · {tx['step']} {step}<br>{what}: {seg['tokens']} {tx['tok']}"
    if seg["start"] is not None and seg["tokens"]:
        a, b = seg["start"], seg["start"] + seg["tokens"] - 1
        line += f" [{a}–{b}]" if b > a else f" [{a}]"
    if seg["phase"] == "prefill" and not seg["emitted"]:
        line += f"<br>{tx['chunk_more']}"
    return line


def _waiting_hover(sid: int, mine: bool, ahead: int, preempted: bool, step: int, tx: dict) -> str:
    who = f"{tx['seq']} #{sid}" if mine else tx["other_tab"]
    line = f"<b>{who}</b> · {tx['step']} {step}<br>" + tx["waits"].format(n=ahead)
    if preempted:
        line += "<br>" + tx["preempt_why"]
    return line


def _composition(events, batches, me, tx) -> tuple[dict, dict, dict, int]:
    """The batch, waiting and preemption traces of the upper plot, and the tallest stack (`batches`: each
    event's batch_segments)."""
    bx, by, base, color, pattern, text, hover = [], [], [], [], [], [], []
    wx, wbase, wline, whover = [], [], [], []
    px, py, ptext, phover = [], [], [], []
    top = 1
    for e, segs in zip(events, batches):
        for i, seg in enumerate(segs):
            bx.append(e.step)
            base.append(i)
            color.append(seq_color(seg["seq_id"]) if seg["mine"] else OTHER_COLOR)
            pattern.append(PHASE_PATTERN.get(seg["phase"], ""))
            text.append(str(seg["tokens"]))
            hover.append(_segment_hover(seg, e.step, tx))
        preempted = set(e.preempted)
        for j, sid in enumerate(e.waiting):  # in queue order: j requests are ahead of this one
            mine = _mine(e, sid, me)
            wx.append(e.step)
            wbase.append(len(segs) + j)
            wline.append(seq_color(sid) if mine else "#999999")
            whover.append(_waiting_hover(sid, mine, j, sid in preempted, e.step, tx))
        height = len(segs) + len(e.waiting)
        top = max(top, height)
        if e.preempted:
            px.append(e.step)
            py.append(height + 0.45)
            names = ", ".join(f"#{sid}" for sid in e.preempted)
            ptext.append(f"{tx['preempted_short']} {names}")
            phover.append(f"<b>{tx['step']} {e.step}</b> · {tx['preempted']}: {names}<br>{tx['preempt_why']}")
    batch = dict(type="bar", name="batch", x=bx, y=[1] * len(bx), base=base, yaxis="y2", width=0.8,
                 showlegend=False, text=text, textposition="inside", insidetextanchor="middle",
                 textfont=dict(size=10, color="#111"),
                 marker=dict(color=color, line=dict(color="#FFFFFF", width=0.5),
                             pattern=dict(shape=pattern, fgcolor="#FFFFFF", size=6, solidity=0.3)),
                 customdata=hover, hovertemplate="%{customdata}<extra></extra>")
    waiting = dict(type="bar", name="waiting", x=wx, y=[1] * len(wx), base=wbase, yaxis="y2", width=0.8,
                   showlegend=False, marker=dict(color="rgba(255,255,255,0)", line=dict(color=wline, width=1.5)),
                   customdata=whover, hovertemplate="%{customdata}<extra></extra>")
    preempt = dict(type="scatter", name="preempted", mode="markers+text", x=px, y=py, yaxis="y2",
                   showlegend=False, text=ptext, textposition="top center",
                   textfont=dict(size=10, color=PREEMPT_COLOR),
                   marker=dict(symbol="x", size=11, color=PREEMPT_COLOR),
                   customdata=phover, hovertemplate="%{customdata}<extra></extra>")
    return batch, waiting, preempt, top


def _key_rows(events, batches, me, tx) -> list[list[tuple[str, str, str]]]:
    mine = sorted({seg["seq_id"] for segs in batches for seg in segs if seg["mine"]}
                  | {sid for e in events for sid in e.waiting if _mine(e, sid, me)})
    others = any(not seg["mine"] for segs in batches for seg in segs)
    seqs = [(BAR, seq_color(sid), f"{tx['seq']} #{sid}") for sid in mine[:8]]
    if others:
        seqs.append((BAR, OTHER_COLOR, tx["other_tabs"]))
    marks = [(HATCH, "#555", tx["phase_prefill"]), (BAR, "#555", tx["phase_decode"]),
             (HOLLOW, "#777", tx["waiting"])]
    if any(e.preempted for e in events):
        marks.append(("✕", PREEMPT_COLOR, tx["preempted"]))
    kinds = [(BAR, KIND_COLORS[k], tx["kind_step"].format(kind=tx["kinds"][k]))
             for k in ("prefill", "decode", "mixed") if any(step_kind(e) == k for e in events)]
    return [r for r in (seqs, marks, kinds) if r]


def timeline_chart(events, lang: str = "en", me: str | None = None) -> dict:
    """Two plots over the same steps. Above, who was in each step: one segment per sequence (this tab's own in
    their colours, other tabs' grey), prefill chunks hatched with their token count, the waiting queue as hollow
    segments on top, preemptions as red crosses. Below, trace "steps": one bar per step, y = timing.step_ms,
    colour = prefill / decode / mixed / idle. `me`: this tab's owner label (default: read off the events)."""
    tx = _t(lang)
    events = list(events or [])
    if not events:
        return empty(tx["timeline"], tx["no_steps"], UIREV_TIMELINE)
    me = me or my_owner(events)  # "" too: a replay knows no owner of its own
    kinds = [step_kind(e) for e in events]
    xs = [e.step for e in events]
    ys = [float(e.timing.step_ms) for e in events]
    steps = dict(type="bar", name="steps", x=xs, y=ys, showlegend=False, width=0.8,
                 marker=dict(color=[KIND_COLORS[k] for k in kinds]),
                 customdata=[_step_hover(e, tx) for e in events],
                 hovertemplate="%{customdata}<br>" + tx["step_ms"] + "<extra></extra>")
    traces = [steps]
    masks = [float(getattr(e.timing, "grammar_ms", 0.0)) for e in events]
    if any(masks):  # the grammar masks' build time beside each step's bar (the forward's share is the rest)
        traces.append(dict(type="bar", name="grammar", x=xs, y=masks, showlegend=False, width=0.35, offset=0.05,
                           marker=dict(color=GRAMMAR_COLOR), hovertemplate=tx["grammar_ms_hover"] + "<extra></extra>"))
    batches = [batch_segments(e, me) for e in events]
    batch, waiting, preempt, top = _composition(events, batches, me, tx)
    rows = _key_rows(events, batches, me, tx)
    if any(masks):  # its key beside the step kinds' (the last row)
        mask_key = (BAR, GRAMMAR_COLOR, tx["grammar_key"])
        rows = [*rows[:-1], [*rows[-1], mask_key]] if rows else [[mask_key]]
    key_h = 16 * len(rows)
    few = max(xs) - min(xs) <= 16
    lay = layout(tx["timeline_title"], UIREV_TIMELINE, height=400 + key_h, barmode="overlay", bargap=0.15,
                 margin=dict(l=55, r=20, t=44 + key_h, b=45), annotations=[legend_key(rows)],
                 uniformtext=dict(minsize=8, mode="hide"),
                 # no x range of its own: one given would move with every step and undo the reader's zoom
                 xaxis=dict(title=dict(text=tx["step"]), tickformat="d", gridcolor="#EEE", dtick=1 if few else None),
                 yaxis=dict(title=dict(text=tx["ms_short"]), domain=[0, 0.3], rangemode="tozero", gridcolor="#EEE"),
                 yaxis2=dict(title=dict(text=tx["in_step"]), domain=[0.38, 1], range=[0, top + 1.2],
                             dtick=1 if top <= 10 else None, gridcolor="#EEE"))
    return figure([*traces, batch, waiting, preempt], lay)


def latency_rows(events) -> list[dict]:
    """Per sequence in order of first appearance: ttft_ms, mean_itl_ms, tokens, tok_s, finish_reason."""
    rows: dict[int, dict] = {}
    for e in events or []:
        for s in e.seqs:
            sid = s.seq_id
            r = rows.setdefault(sid, {"seq_id": sid, "ttft_ms": None, "itl": [], "tokens": 0, "finish_reason": None})
            if s.new_token is not None:
                r["tokens"] += 1
            if s.ttft_s is not None and r["ttft_ms"] is None:
                r["ttft_ms"] = float(s.ttft_s) * 1e3
            if s.itl_s is not None:
                r["itl"].append(float(s.itl_s) * 1e3)
            if s.finished:
                r["finish_reason"] = s.finish_reason
    out = []
    for r in rows.values():
        itl = r.pop("itl")
        mean = sum(itl) / len(itl) if itl else None
        r["mean_itl_ms"] = mean
        r["tok_s"] = 1e3 / mean if mean else None
        out.append(r)
    return out


def latency_table(events, lang: str = "en") -> dict:
    """A table, one row per sequence: TTFT, mean TPOT/ITL, tokens generated, tok/s and status (engine time)."""
    tx = _t(lang)
    rows = latency_rows(events)
    if not rows:
        return empty(tx["latency"], tx["no_steps"], UIREV_LATENCY)
    def f1(v):  # formatted here: plotly.js tables drop every cell when a column's d3 format is null
        return "–" if v is None else f"{v:.1f}"

    cols = [[r["seq_id"] for r in rows], [f1(r["ttft_ms"]) for r in rows], [f1(r["mean_itl_ms"]) for r in rows],
            [r["tokens"] for r in rows], [f1(r["tok_s"]) for r in rows],
            [r["finish_reason"] or tx["running"] for r in rows]]
    trace = dict(type="table", columnwidth=[40, 70, 110, 90, 100, 70],
                 header=dict(values=[f"<b>{c}</b>" for c in tx["cols"]], fill=dict(color="#F0F0F0"), align="left"),
                 cells=dict(values=cols, align="left", height=24))
    lay = layout(tx["latency_title"], UIREV_LATENCY, height=min(100 + 26 * len(rows), 420),
                 margin=dict(l=10, r=10, t=40, b=10))
    return figure([trace], lay)


def roofline_points(events) -> list[dict]:
    """Steps that ran a forward: intensity = flops / bytes, achieved = flops / forward seconds."""
    pts = []
    for e in events or []:
        cost = e.cost
        flops, nbytes, fms = float(cost.flops), float(cost.bytes), float(e.timing.forward_ms)
        if flops <= 0 or nbytes <= 0 or fms <= 0 or not cost.tokens:
            continue
        pts.append(dict(step=e.step, kind=step_kind(e), tokens=cost.tokens, forward_ms=fms,
                        intensity=flops / nbytes, achieved=flops / (fms / 1e3), flops=flops, bytes=nbytes))
    return pts


def roofline_chart(events, bandwidth: float, peak_flops: float, lang: str = "en") -> dict:
    """Log-log roofline: the roof min(peak_flops, bandwidth × x) with its ridge point, and one point per step.

    Trace "roof": x = [lo, ridge, hi] (the roof is exactly piecewise linear there); trace "steps": the points,
    coloured prefill / decode / mixed, customdata = [step, tokens, forward ms, % of roof, kind].
    """
    tx = _t(lang)
    try:
        bw, pf = float(bandwidth), float(peak_flops)
    except (TypeError, ValueError):
        bw = pf = float("nan")
    if not (math.isfinite(bw) and math.isfinite(pf) and bw > 0 and pf > 0):
        return empty(tx["roofline"], tx["bad_machine"], UIREV_ROOFLINE)
    pts = roofline_points(events)
    if not pts:
        return empty(tx["roofline"], tx["no_roof"], UIREV_ROOFLINE)
    ridge = pf / bw
    xs = [p["intensity"] for p in pts]
    ys = [p["achieved"] for p in pts]
    lo = min(min(xs), ridge) / 4
    hi = max(max(xs), ridge) * 4
    roof_x = [lo, ridge, hi]
    roof_y = [min(pf, bw * x) for x in roof_x]
    pct = [100.0 * y / min(pf, bw * x) for x, y in zip(xs, ys)]
    data = [
        dict(type="scatter", name=tx["roof_name"], mode="lines", x=roof_x, y=roof_y, showlegend=False,
             line=dict(color=ROOF_COLOR, width=2.5),
             hovertemplate=f"{tx['roof']}<br>{t('roof_hover', lang)}<extra></extra>"),
        dict(type="scatter", name="steps", mode="markers", x=xs, y=ys, showlegend=False,
             marker=dict(size=9, color=[KIND_COLORS[p["kind"]] for p in pts], line=dict(color="white", width=1)),
             customdata=[[p["step"], p["tokens"], p["forward_ms"], q, tx["kinds"][p["kind"]]]
                         for p, q in zip(pts, pct)],
             hovertemplate=(f"<b>{tx['step']} %{{customdata[0]}}</b> · %{{customdata[4]}}<br>%{{customdata[1]}} "
                            f"{tx['tok']} · {tx['forward_ms']}<br>{t('point_hover', lang)}"
                            f"<br>%{{customdata[3]:.1f}}% {tx['of_roof']}<extra></extra>")),
    ]
    # a key, not a legend: one annotation, measured once (see common.legend_key), in the row under the title
    key = [(LINE, ROOF_COLOR, tx["roof_name"])] + [("●", KIND_COLORS[k], tx["kinds"][k])
                                                   for k in ("prefill", "decode", "mixed")
                                                   if any(p["kind"] == k for p in pts)]
    annotations = [
        legend_key([key]),
        dict(x=math.log10(ridge), y=math.log10(pf), xref="x", yref="y", text=tx["ridge"].format(r=ridge),
             showarrow=True, arrowhead=2, ax=0, ay=-30, font=dict(size=11)),
        # below and right of a point on the rising roof, so that the roof passes above the whole label (centred
        # on it, the roof ran through "memory-bound: 25.9 GB/s", and the label over the y axis's ticks)
        dict(x=math.log10(math.sqrt(lo * ridge)), y=math.log10(bw * math.sqrt(lo * ridge)), xref="x", yref="y",
             xanchor="left", yanchor="top", xshift=6, yshift=-6,
             text=tx["mem_bound"].format(bw=fmt_si(bw, "B/s", lang)), showarrow=False, textangle=0,
             font=dict(size=10, color="#555"), bgcolor="rgba(255,255,255,0.75)"),
        # held to the plot's right end: centred on the flat roof, a long label ("пик вычислений: 267 Гфлоп/с")
        # ran past the chart's edge where the roof is short
        dict(x=math.log10(hi), y=math.log10(pf), xref="x", yref="y", xanchor="right", xshift=-4,
             text=tx["compute_bound"].format(pf=fmt_si(pf, "FLOP/s", lang)), showarrow=False, yshift=10,
             font=dict(size=10, color="#555")),
    ]
    ymin = min(min(ys), roof_y[0]) / 3
    lay = layout(tx["roofline_title"], UIREV_ROOFLINE, height=380, annotations=annotations,
                 margin=dict(l=60, r=20, t=78, b=45),  # a two-line title, the key under it
                 # a label per decade: the digits between ("7 8 9") ran into each other
                 xaxis=dict(type="log", title=dict(text=tx["x"]), range=[math.log10(lo), math.log10(hi)],
                            gridcolor="#EEE", dtick=1),
                 yaxis=dict(type="log", title=dict(text=tx["y"]), range=[math.log10(ymin), math.log10(pf * 3)],
                            gridcolor="#EEE", exponentformat="SI", dtick=1))
    return figure(data, lay)
