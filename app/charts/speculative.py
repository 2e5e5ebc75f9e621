"""Speculative decoding panel: rounds on a timeline, p vs q of the current round, acceptance by draft position,
tokens per target pass against the formula, and the measured speed-up over plain decoding.

Inputs are engine facts only: SeqEvent.spec of each round (engine.speculative.SpecRound), the cumulative statistics
in SpecRound.stats (the same dict as GenerationResult.speculative) and engine.speculative.compare_with_plain()'s
result.
"""
from __future__ import annotations

from engine.metrics import expected_tokens_per_pass
from engine.speculative import SpecRound

from .common import ABOVE_PLOT, ACCENT, BAR, KEY_ROW, empty, figure, key_rows, layout, legend_key, rotated_px
from .common import markup, plain
from ..i18n import texts

ACCEPTED = "#2CA02C"
REJECTED = "#D62728"
UNCHECKED = "#C8C8C8"
BONUS = "#1F77B4"
RESAMPLED = "#FF7F0E"
SAMPLED = "#7F7F7F"
P_COLOR = "#1F77B4"
Q_COLOR = "#FF7F0E"
RESIDUAL_COLOR = "#D62728"
PLAIN_COLOR = "#7F7F7F"
SPEC_COLOR = "#2CA02C"
UIREV_ROUNDS = "chart-spec-rounds"
UIREV_PQ = "chart-spec-pq"
UIREV_ALPHA = "chart-spec-alpha"
UIREV_PASS = "chart-spec-pass"
UIREV_SPEEDUP = "chart-spec-speedup"
UIREV_TABLE = "chart-spec-table"
MAX_LABELLED_ROUNDS = 30  # beyond this the token labels overlap; hover still tells everything
MAX_PQ_PANELS = 6
DROPPED_OPACITY = 0.3


KEY_MARKS = {"square": BAR, "square-x": "☒", "star": "★", "diamond": "◆", "circle": "●", "circle-x": "⊗"}
PQ_TICKS = rotated_px(9, 10, 45) + 8  # px under the p-vs-q panels for their tick labels (10 characters at 45°)
PQ_HEADER_ROW = 40  # px between the two rows of the p-vs-q panels' headings (three lines of 10 px text)
KIND_STYLE = {  # marker colour and symbol per kind of cell on the rounds timeline
    "accepted": (ACCEPTED, "square"), "rejected": (REJECTED, "square-x"), "unchecked": (UNCHECKED, "square"),
    "bonus": (BONUS, "star"), "resampled": (RESAMPLED, "diamond"), "sampled": (SAMPLED, "circle"),
    "forced": (ACCENT, "circle-x"),
}


def _t(lang: str) -> dict:
    return texts("spec", lang)


def _f(v, digits: int = 3) -> str:
    return "–" if v is None else f"{float(v):.{digits}f}"


def spec_rounds(events, seq_id: int | None = None) -> list[tuple[int, SpecRound]]:
    """(step, SeqEvent.spec) of every speculative round of `seq_id` (default: the last sequence that had one)."""
    pairs = []
    for e in events or []:
        for s in e.seqs:
            if s.spec is not None:
                pairs.append((e.step, s.seq_id, s.spec))
    if not pairs:
        return []
    if seq_id is None:
        seq_id = pairs[-1][1]
    return [(step, sp) for step, sid, sp in pairs if sid == seq_id]


def _stats(spec_or_stats) -> dict | None:
    """Cumulative statistics of a round (SpecRound.stats), or the statistics dict itself."""
    if isinstance(spec_or_stats, SpecRound):
        return spec_or_stats.stats
    return spec_or_stats or None


# ---- rounds timeline --------------------------------------------------------------------------------------------

def rounds_timeline(events, seq_id: int | None = None, lang: str = "en") -> dict:
    """One column per round (x = round), one cell per slot (y = position in the round, 1 at the top).

    Drafts are squares: green accepted, red rejected, grey never checked (after a rejection). The round's own
    token sits at its position: a blue star for the bonus (all accepted), an orange diamond for the token
    resampled where a draft was rejected (drawn just right of that draft), a grey circle when nothing was drafted.
    """
    tx = _t(lang)
    rounds = spec_rounds(events, seq_id)
    if not rounds:
        return empty(tx["rounds"], tx["no_rounds"], UIREV_ROUNDS)
    cells: dict[str, dict] = {k: dict(x=[], y=[], text=[], hover=[], opacity=[]) for k in KIND_STYLE}
    labelled = len(rounds) <= MAX_LABELLED_ROUNDS
    ticks, max_slot = [], 1
    for r, (step, sp) in enumerate(rounds, start=1):
        ticks.append(step)
        emitted = sp.num_emitted
        for d in sp.draft:
            kind = d.verdict
            c = cells[kind if kind in cells else "unchecked"]
            # an accepted draft past a stop string / EOS inside the round was never emitted
            dropped = kind == "accepted" and d.position > emitted
            c["x"].append(r)
            c["y"].append(d.position)
            c["text"].append(plain(d.text, 8) if labelled else "")
            c["opacity"].append(DROPPED_OPACITY if dropped else 1.0)
            c["hover"].append(
                f"<b>{plain(d.text)}</b> (id {d.token})<br>{tx['step']} {step} · "
                f"{tx['pos'].format(i=d.position)}<br>q(x) = {_f(d.q, 4)} · p(x) = {_f(d.p, 4)}"
                f"<br>p/q = {_f(d.ratio)} · u = {_f(d.u)}<br>{tx['kinds'].get(kind, kind)}"
                + (f"<br>{tx['dropped']}" if dropped else ""))
            max_slot = max(max_slot, d.position)
        fin = sp.final
        kind = fin.kind
        c = cells[kind if kind in cells else "sampled"]
        pos = fin.position
        collides = kind == "resampled"  # it replaces the rejected draft at the same position
        c["x"].append(r + (0.32 if collides else 0.0))
        c["y"].append(pos)
        c["text"].append(plain(fin.text, 8) if labelled else "")
        c["opacity"].append(1.0 if fin.kept else DROPPED_OPACITY)
        note = "" if fin.kept else f"<br>{tx['dropped']}"
        c["hover"].append(f"<b>{plain(fin.text)}</b> (id {fin.token})<br>{tx['step']} {step}"
                          f" · {tx['pos'].format(i=pos)}<br>p = {_f(fin.prob, 4)} · u = {_f(fin.u)}"
                          f"<br>{tx['kinds'].get(kind, kind)}{note}")
        max_slot = max(max_slot, pos)
    data = []
    for kind, c in cells.items():
        if not c["x"]:
            continue
        color, symbol = KIND_STYLE[kind]
        data.append(dict(type="scatter", mode="markers+text" if labelled else "markers", name=tx["kinds"][kind],
                         x=c["x"], y=c["y"], text=c["text"], textposition="middle right",
                         textfont=dict(size=9, color="#333"),
                         marker=dict(color=color, symbol=symbol, size=13, opacity=c["opacity"],
                                     line=dict(color="white", width=1)),
                         customdata=c["hover"], hovertemplate="%{customdata}<extra></extra>"))
    stats = _stats(rounds[-1][1]) or {}
    drafted = sum(len(sp.draft) for _, sp in rounds)
    accepted = sum(sp.num_accepted for _, sp in rounds)
    title = tx["rounds_title"].format(n=len(rounds), acc=accepted, drafted=drafted, tok=stats.get("tokens", "?"))
    # a key above the plot, not a legend under it: a legend's rows depend on the chart's width and ran into
    # the axis title; the key's rows are fixed (common.key_rows) and it is measured once
    rows = key_rows([(KEY_MARKS[KIND_STYLE[k][1]], KIND_STYLE[k][0], tx["kinds"][k])
                     for k, c in cells.items() if c["x"]])
    lay = layout(title, UIREV_ROUNDS, height=max(280, 40 * max_slot + 120 + KEY_ROW * len(rows)),
                 margin=dict(l=55, r=20, t=ABOVE_PLOT + KEY_ROW * len(rows) + 4, b=50),
                 annotations=[legend_key(rows)],
                 xaxis=dict(title=dict(text=tx["round"]), tickmode="array", tickvals=list(range(1, len(rounds) + 1)),
                            ticktext=[str(s) for s in ticks], range=[0.4, len(rounds) + 0.9], gridcolor="#EEE"),
                 # position 1 at the top, by an explicit range: autorange "reversed" was lost whenever Plotly.react
                 # drew this over the page's placeholder (same uirevision), so the axis flipped between a live
                 # page and a replay (or a chart scrolled into view later), depending on what was drawn before
                 yaxis=dict(title=dict(text=tx["slot"]), autorange=False, dtick=1, gridcolor="#EEE",
                            range=[max_slot + 0.5, 0.5]))
    return figure(data, lay)


# ---- p vs q bars of one round ------------------------------------------------------------------------------------

def pq_panels(spec: SpecRound | None) -> list[dict]:
    """The panels of one round: per checked position the tracked tokens with p, q (and the residual there)."""
    if spec is None:
        return []
    residual = spec.residual
    drafts = {d.position: d for d in spec.draft}
    panels = []
    for d in spec.dists or []:
        pos = d.position
        check = drafts.get(pos)
        panel = dict(position=pos, token_ids=list(d.token_ids), texts=list(d.texts), p=list(d.p),
                     q=None if d.q is None else list(d.q), residual=None, draft=d.draft,
                     verdict=None if check is None else check.verdict, check=check)
        if residual is not None and residual.position == pos:
            # the residual's own token list: it covers the tokens the residual could draw
            panel.update(token_ids=list(residual.token_ids), texts=list(residual.texts), p=list(residual.p),
                         q=list(residual.q), residual=list(residual.residual))
        panels.append(panel)
    for pn in panels:  # tokens with no mass anywhere (greedy one-hot rows) say nothing: keep the others
        keep = [i for i, t in enumerate(pn["token_ids"])
                if t == pn["draft"] or any(v is not None and v[i] > 0 for v in (pn["p"], pn["q"], pn["residual"]))]
        if keep and len(keep) < len(pn["token_ids"]):
            for key in ("token_ids", "texts", "p", "q", "residual"):
                if pn[key] is not None:
                    pn[key] = [pn[key][i] for i in keep]
    if not panels and residual is not None:  # untraced step: the residual is still recorded
        pos = residual.position
        d = drafts.get(pos)
        panels.append(dict(position=pos, token_ids=list(residual.token_ids), texts=list(residual.texts),
                           p=list(residual.p), q=list(residual.q), residual=list(residual.residual),
                           draft=None if d is None else d.token, verdict=None if d is None else d.verdict, check=d))
    return panels[:MAX_PQ_PANELS]


def pq_chart(spec: SpecRound | None, step: int | None = None, lang: str = "en") -> dict:
    """One subplot per checked position of the round: grouped bars of p (target) and q (draft) over the tracked
    tokens, the residual norm(max(p − q, 0)) in red at the rejected position, the draft token outlined.
    The last panel without q is the bonus position (every draft accepted)."""
    tx = _t(lang)
    if spec is None or not spec.num_drafted:
        return empty(tx["pq"], tx["no_pq"], UIREV_PQ)
    panels = pq_panels(spec)
    if not panels:
        return empty(tx["pq"], tx["no_dists"], UIREV_PQ)
    n = len(panels)
    gap = 0.05
    width = (1.0 - gap * (n - 1)) / n
    data, axes, annotations = [], {}, []
    for k, pn in enumerate(panels):
        ax = "" if k == 0 else str(k + 1)
        labels = [plain(t, 10) for t in pn["texts"]]
        full = [plain(t) for t in pn["texts"]]
        xs = list(range(len(labels)))
        outline = [2.5 if t == pn["draft"] else 0 for t in pn["token_ids"]]
        series = [("p", pn["p"], P_COLOR), ("q", pn["q"], Q_COLOR), ("residual", pn["residual"], RESIDUAL_COLOR)]
        for key, vals, color in series:
            if vals is None:
                continue
            data.append(dict(type="bar", name=tx[key], x=xs, y=vals, xaxis=f"x{ax}", yaxis=f"y{ax}",
                             legendgroup=key, showlegend=False,
                             marker=dict(color=color, line=dict(color="#111", width=outline)),
                             customdata=[[full[i], pn["token_ids"][i]] for i in xs],
                             hovertemplate=f"%{{customdata[0]}} (id %{{customdata[1]}})<br>{tx[key]} = %{{y:.4f}}"
                                           f"<extra>{tx['pos'].format(i=pn['position'])}</extra>"))
        x0 = k * (width + gap)
        axes[f"xaxis{ax}"] = dict(domain=[x0, x0 + width], anchor=f"y{ax}", tickmode="array", tickvals=xs,
                                  ticktext=labels, tickangle=-45, tickfont=dict(size=9))
        axes[f"yaxis{ax}"] = dict(anchor=f"x{ax}", range=[0, 1.05], tickformat=".0%", gridcolor="#EEE",
                                  showticklabels=k == 0, title=dict(text=tx["prob"] if k == 0 else ""))
        chk = pn.get("check")
        if pn["draft"] is None:
            sub = f"<b>{tx['pos'].format(i=pn['position'])}: {tx['bonus_pos']}</b>"
        else:
            verdict = tx["verdict"].get(pn.get("verdict") or "unchecked", "")
            color = {"accepted": ACCEPTED, "rejected": REJECTED}.get(pn.get("verdict"), "#555")
            # one short item per line: with five panels a heading has ~70 px
            sub = (f"<b>{tx['pos'].format(i=pn['position'])}: {plain(chk.text if chk else '', 8)}</b>"
                   f"<br><span style='color:{color}'>{verdict}</span>")
            if chk is not None and chk.u is not None:
                sub += f"<br>p/q = {_f(chk.ratio)}, u = {_f(chk.u)}"
        # from three panels on, headings alternate between two rows, or neighbours would run into each other
        annotations.append(dict(text=sub, x=x0 + width / 2, y=1.0, xref="paper", yref="paper", xanchor="center",
                                yanchor="bottom", yshift=PQ_HEADER_ROW * (k % 2) if n >= 3 else 0,
                                showarrow=False, font=dict(size=10)))
    series = [("p", P_COLOR), ("q", Q_COLOR)] + [("residual", RESIDUAL_COLOR)] * any(pn["residual"] for pn in panels)
    rows = key_rows([(BAR, color, tx[key]) for key, color in series])
    annotations.append(legend_key(rows, x=0, xanchor="left", y=0, yanchor="top", yshift=-PQ_TICKS, align="left"))
    title = tx["pq_title"].format(step=step) if step is not None else tx["pq_title_nostep"]
    headings = PQ_HEADER_ROW * (2 if n >= 3 else 1)
    lay = layout(markup(title), UIREV_PQ, barmode="group", bargap=0.2, height=260 + headings + KEY_ROW * len(rows),
                 margin=dict(l=55, r=20, t=ABOVE_PLOT + headings, b=PQ_TICKS + KEY_ROW * len(rows) + 6),
                 annotations=annotations, **axes)
    return figure(data, lay)


# ---- acceptance by position --------------------------------------------------------------------------------------

def acceptance_chart(spec_or_stats: SpecRound | dict | None, lang: str = "en") -> dict:
    """Bars: α_i = accepted_i / checked_i at draft position i (a draft is checked only if all before it were
    accepted); a dashed line at the overall α = accepted / checked."""
    tx = _t(lang)
    stats = _stats(spec_or_stats)
    by = (stats or {}).get("by_position") or {}
    reached = list(by.get("reached") or [])
    if not stats or not any(reached):
        return empty(tx["alpha"], tx["no_alpha"], UIREV_ALPHA)
    accepted, proposed = list(by.get("accepted") or []), list(by.get("proposed") or [])
    xs = list(range(1, len(reached) + 1))
    rates = [a / r if r else None for a, r in zip(accepted, reached)]
    hover = [f"{tx['pos'].format(i=i)}<br>{tx['acc_hover'].format(a=a, r=r, p=p)}"
             for i, a, r, p in zip(xs, accepted, reached, proposed)]
    alpha = float(stats.get("alpha") or 0.0)
    data = [dict(type="bar", name="α", x=xs, y=rates, marker=dict(color=ACCEPTED),
                 text=[f"{a}/{r}" for a, r in zip(accepted, reached)], textposition="outside", cliponaxis=False,
                 customdata=hover, hovertemplate="%{customdata}<br>α = %{y:.2f}<extra></extra>"),
            dict(type="scatter", mode="lines", name=tx["overall"], x=[0.5, len(xs) + 0.5], y=[alpha, alpha],
                 line=dict(color="#333", dash="dash"), hovertemplate=f"{tx['overall']} = {alpha:.3f}<extra></extra>")]
    lay = layout(tx["alpha_title"].format(a=alpha), UIREV_ALPHA, height=280, margin=dict(l=55, r=20, t=45, b=45),
                 xaxis=dict(title=dict(text=tx["position"]), dtick=1, range=[0.5, len(xs) + 0.5]),
                 yaxis=dict(title=dict(text=tx["rate"]), range=[0, 1.1], gridcolor="#EEE"))
    return figure(data, lay)


# ---- tokens per target pass vs the formula ---------------------------------------------------------------------

def tokens_per_pass_chart(spec_or_stats: SpecRound | dict | None, lang: str = "en", points: int = 51) -> dict:
    """The curve (1 − α^(k+1)) / (1 − α) over α for the configured k, the measured tokens per round at the measured
    α, and the formula's value there (averaged over the rounds' actual k, which max_tokens or a short n-gram
    match can make smaller than the configured one)."""
    tx = _t(lang)
    stats = _stats(spec_or_stats)
    if not stats or not stats.get("rounds"):
        return empty(tx["pass"], tx["no_pass"], UIREV_PASS)
    k = int(stats.get("num_tokens") or 1)
    alpha = float(stats.get("alpha") or 0.0)
    measured = float(stats.get("tokens_per_round") or 0.0)
    expected = stats.get("expected_tokens_per_round")
    expected = float(expected) if expected is not None else expected_tokens_per_pass(alpha, k)
    grid = [i / (points - 1) for i in range(points)]
    curve = [expected_tokens_per_pass(a, k) for a in grid]
    data = [dict(type="scatter", mode="lines", name=tx["formula"].format(k=k), x=grid, y=curve,
                 line=dict(color=P_COLOR), customdata=[tx["pass_hover"].format(t=y) for y in curve],
                 hovertemplate="α = %{x:.2f}<br>%{customdata}<extra></extra>"),
            dict(type="scatter", mode="markers", name=tx["expected"], x=[alpha], y=[expected],
                 marker=dict(color=P_COLOR, size=11, symbol="circle-open", line=dict(width=2)),
                 hovertemplate=f"α = {alpha:.3f}<br>{tx['expected']}: {expected:.3f}<extra></extra>"),
            dict(type="scatter", mode="markers", name=tx["measured"], x=[alpha], y=[measured],
                 marker=dict(color=ACCENT, size=12, symbol="x"),
                 hovertemplate=(f"α = {alpha:.3f}<br>{tx['measured']}: {measured:.3f}<br>"
                                + tx["pass_counts"].format(n=stats.get("rounds"), a=stats.get("accepted"),
                                                           r=stats.get("reached")) + "<extra></extra>"))]
    title = tx["pass_title"].format(m=measured, f=expected, a=alpha, k=float(stats.get("mean_k") or 0.0))
    lay = layout(title, UIREV_PASS, showlegend=True, height=300, margin=dict(l=55, r=20, t=45, b=45),
                 legend=dict(x=0.01, y=0.99, font=dict(size=10), bgcolor="rgba(255,255,255,0.7)"),
                 xaxis=dict(title=dict(text=tx["alpha_axis"]), range=[0, 1], gridcolor="#EEE"),
                 yaxis=dict(title=dict(text=tx["tokens_axis"]), range=[0, k + 1.2], gridcolor="#EEE"))
    return figure(data, lay)


# ---- measured speed-up -------------------------------------------------------------------------------------------

def speedup_chart(comparison: dict | None, lang: str = "en") -> dict:
    """Two bars from compare_with_plain(): decode tok/s of plain decoding and of speculative decoding."""
    tx = _t(lang)
    if not comparison or not comparison.get("plain") or not comparison.get("speculative"):
        return empty(tx["speedup"], tx["no_speedup"], UIREV_SPEEDUP)
    plain, spec = comparison["plain"], comparison["speculative"]
    method = str(comparison.get("method", "?"))
    names = [tx["plain"], tx["speculative"].format(method=method)]
    speeds = [plain.get("tok_s"), spec.get("tok_s")]
    stats = spec.get("stats") or {}
    hover = [tx["speed_hover"].format(n=r.get("tokens"), s=_f(r.get("decode_s")), v=_f(r.get("tok_s"), 1))
             for r in (plain, spec)]
    hover[1] += f"<br>α = {_f(stats.get('alpha'))} · {tx['pass_hover'].format(t=stats.get('tokens_per_pass') or 0)}"
    data = [dict(type="bar", x=names, y=speeds, marker=dict(color=[PLAIN_COLOR, SPEC_COLOR]),
                 text=[_f(s, 1) for s in speeds], textposition="outside", cliponaxis=False, customdata=hover,
                 hovertemplate="%{customdata}<extra></extra>")]
    s = comparison.get("speedup")
    title = tx["speedup_title"].format(method=method, k=comparison.get("num_tokens", "?"), s=float(s or 0.0),
                                       same=tx["same"] if comparison.get("same_tokens") else tx["different"])
    lay = layout(title, UIREV_SPEEDUP, height=280, margin=dict(l=55, r=20, t=45, b=45),
                 yaxis=dict(title=dict(text=tx["tok_s"]), rangemode="tozero", gridcolor="#EEE"))
    return figure(data, lay)


def speedup_rows(comparisons: list[dict], prompts: list[str] | None = None) -> list[list]:
    """One row per comparison: prompt, drafter, k, plain tok/s, spec tok/s, ×, α, tokens/pass, formula, same ids."""
    rows = []
    for i, c in enumerate(comparisons or []):
        st = c["speculative"].get("stats") or {}
        rows.append([(prompts[i] if prompts and i < len(prompts) else ""), c.get("method"), c.get("num_tokens"),
                     c["plain"].get("tok_s"), c["speculative"].get("tok_s"), c.get("speedup"), st.get("alpha"),
                     st.get("tokens_per_round"), st.get("expected_tokens_per_round"), bool(c.get("same_tokens"))])
    return rows


def speedup_table(comparisons: list[dict], prompts: list[str] | None = None, lang: str = "en") -> dict:
    """A table of several compare_with_plain() results (the benchmark's table, in the page)."""
    tx = _t(lang)
    rows = speedup_rows(comparisons, prompts)
    if not rows:
        return empty(tx["table"], tx["no_speedup"], UIREV_TABLE)

    def fmt(v, d=1, suffix=""):  # formatted here: plotly.js tables drop every cell when a d3 format is null
        return "–" if v is None else f"{float(v):.{d}f}{suffix}"

    cols = [[markup(r[0]) for r in rows], [r[1] for r in rows], [r[2] for r in rows],
            [fmt(r[3]) for r in rows], [fmt(r[4]) for r in rows], [fmt(r[5], 2, "×") for r in rows],
            [fmt(r[6], 2) for r in rows], [fmt(r[7], 2) for r in rows], [fmt(r[8], 2) for r in rows],
            ["✓" if r[9] else "✗" for r in rows]]
    trace = dict(type="table", header=dict(values=[f"<b>{c}</b>" for c in tx["cols"]], fill=dict(color="#F0F0F0"),
                                           align="left"),
                 cells=dict(values=cols, align="left", height=24))
    lay = layout(tx["table"], UIREV_TABLE, height=min(100 + 26 * len(rows), 460), margin=dict(l=10, r=10, t=40, b=10))
    return figure([trace], lay)


__all__ = ["rounds_timeline", "pq_chart", "pq_panels", "acceptance_chart", "tokens_per_pass_chart",
           "speedup_chart", "speedup_table", "speedup_rows", "spec_rounds"]
