"""Sampling panel: the chain of cuts (one subplot per stage) and the inverse-CDF draw.

Both charts read one sampling trace (SeqEvent.sampling or Engine.what_if(...)): tracked token ids and texts,
one snapshot per stage (renormalised probs, kept flags, survivors over the vocabulary, mass removed), the
uniform number u, the chosen token and the cumulative distribution in draw order.
"""
from __future__ import annotations

from engine.sampling import SamplingTrace, StageSnapshot

from .common import (ABOVE_PLOT, ACCENT, GREY, LABEL_CHARS, empty, figure, label_px, layout, plain, rank_shown,
                     rotated_px, wrap_title)
from .logits import FORCED_COLOR, Forced, row_role
from ..i18n import texts

CHAIN_ORDER = ("logits", "penalties", "temperature", "min_p", "top_k", "top_p")
# a constrained request's trace has one more stage, the grammar's mask, right after the raw logits, and a request
# with vLLM's extras (logit_bias, allowed_token_ids, bad_words, min_tokens) the bias stage after it (engine/sampling.py)
GRAMMAR_ORDER = ("logits", "grammar", "bias", *CHAIN_ORDER[1:])
KEPT_COLOR = "#4C78A8"
WHAT_IF_COLOR = "#FF7F0E"
U_COLOR = "#FF7F0E"
UIREV_CHAIN = "chart-sampling"
UIREV_CDF = "chart-cdf"


HEADER_ROW = 40  # px between the two rows of stage headers (up to three lines of 10 px text each)
BADGE_ROW = 24  # px for the what-if badge, in its own row above the headers (beside them it ran into them)
NOTE_CHARS = 50  # a line of 11 px text across the inverse-CDF chart's narrowest plot area (~330 px)
COLUMN_GAP = 0.2  # between two stages' columns, as a fraction of a column's width


def _t(lang: str) -> dict:
    return texts("sampling", lang)


def _texts(sampling: SamplingTrace) -> list[str]:
    ids = sampling.token_ids
    texts = list(sampling.token_texts)
    texts += [""] * (len(ids) - len(texts))
    return [t if t else f"#{i}" for t, i in zip(texts, ids)]


def _ordered_stages(sampling: SamplingTrace) -> list[StageSnapshot]:
    rank = {name: i for i, name in enumerate(GRAMMAR_ORDER)}
    return sorted(sampling.stages, key=lambda s: rank.get(s.name, len(rank)))


def sampling_chain_chart(sampling: SamplingTrace | None, what_if: bool = False, lang: str = "en",
                         forced: Forced | None = None) -> dict:
    """One column of horizontal bars per stage (logits → … → top_p), tokens as rows shared by every column.

    Bars are the tracked tokens' renormalised probabilities after the stage; removed tokens are grey at 0 and
    marked ✕; an inactive stage is faded and titled "off"; the chosen token is red in the last stage (and
    outlined in red elsewhere). Every column has the same scale (up to the largest probability in any stage),
    so renormalisation shows as longer bars. The columns share one x axis, each bar starting at its column's
    origin (`base`): six subplots with their own axes cost the browser ~12 ms more to redraw after every step
    (in-page A/B).

    `forced` (logits.forced_of(SeqEvent)): the token emitted instead of the draw's pick. Its row is banded in
    purple and the title names it; the pick keeps its red bar and is what the draw "would have sampled".
    """
    tx = _t(lang)
    if sampling is None or not sampling.stages or not sampling.token_ids:
        return empty(tx["chain"], tx["no_trace"], UIREV_CHAIN)
    ids = list(sampling.token_ids)
    texts = _texts(sampling)
    labels = [plain(t, LABEL_CHARS) for t in texts]
    full = [plain(t) for t in texts]
    n = len(ids)
    chosen = sampling.chosen
    vocab = sampling.vocab_size
    stages = _ordered_stages(sampling)
    ns = len(stages)

    # every column on one scale, up to the largest probability of any stage (flat distributions stay legible)
    reach = max([p for st in stages for p in st.probs] + [1e-6]) * 1.08
    # a round tick well inside the column: at its right end it would meet the next column's "0"
    tick = next(v for v in (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0) if v <= 0.75 * reach)
    col = reach * (1 + COLUMN_GAP)  # a column and the gap after it, in probability units
    span = ns * col - reach * COLUMN_GAP  # the x axis
    data, annotations, tickvals, ticktext = [], [], [], []
    for k, st in enumerate(stages):
        last = k == ns - 1
        active = st.active
        probs = list(st.probs)
        kept = list(st.kept)
        logits_ = st.logits
        colors, line_colors, line_widths, bar_text, cd = [], [], [], [], []
        for i in range(n):
            is_chosen = ids[i] == chosen
            if not kept[i]:
                c = GREY
            elif last and is_chosen:
                c = ACCENT
            else:
                c = KEPT_COLOR
            colors.append(c)
            line_colors.append(ACCENT if is_chosen else "rgba(0,0,0,0)")
            line_widths.append(1.5 if is_chosen else 0)
            bar_text.append("✕" if not kept[i] else "")
            lv = logits_[i] if i < len(logits_) else None
            cd.append([ids[i], full[i], "−∞" if lv is None else f"{lv:.3f}",
                       (tx["kept"] if kept[i] else tx["removed"]) + _role(ids[i], chosen, forced, tx), probs[i]])
        name = st.name
        label = tx["stage_names"].get(name, name)
        origin = k * col
        data.append(dict(
            type="bar", orientation="h", name=name, x=probs, base=origin, y=list(range(n)),
            marker=dict(color=colors, line=dict(color=line_colors, width=line_widths)),
            opacity=1.0 if active else 0.35, text=bar_text, textposition="outside", cliponaxis=False,
            customdata=cd,
            hovertemplate=("%{customdata[1]} (id %{customdata[0]})<br>p = %{customdata[4]:.4f}"
                           "<br>" + tx["logit"] + " = %{customdata[2]}<br>%{customdata[3]}<extra>" + label + "</extra>"),
        ))
        # the column's 0 is its bars' left edge, left unlabelled: "0" ran into "20%" in a column ~45 px wide
        tickvals += [origin, origin + tick]
        ticktext += ["", f"{tick:.0%}" if tick >= 0.01 else f"{tick:.1%}"]
        x0 = origin / span  # the column's left edge in paper coordinates
        width = reach / span
        removed = st.mass_removed
        kept_n = st.num_kept
        # one short item per line: a column is about 60 px wide in the page's two-column layout
        if not active:
            sub = f"<b>{label}</b><br>{tx['off']}"
        else:
            sub = f"<b>{label}</b><br>{kept_n:,}" + (f"<br>−{removed:.1%}" if removed > 0 else "")
        # headers alternate between two rows: "penalties" and "temperature" side by side would overlap; the
        # first and last are held inside the plot's edges (centred on a narrow column, "49,152" crossed the
        # what-if frame)
        edge = "left" if k == 0 else "right" if k == ns - 1 else "center"
        annotations.append(dict(text=sub, x={"left": x0, "right": x0 + width, "center": x0 + width / 2}[edge],
                                y=1.0, xref="paper", yref="paper", xanchor=edge, align=edge,
                                xshift={"left": 3, "right": -3, "center": 0}[edge],
                                yanchor="bottom", yshift=HEADER_ROW * (k % 2), showarrow=False,
                                font=dict(size=10, color="#333" if active else "#999"),
                                hovertext=tx["stage_hover"].format(name=label, kept=kept_n, vocab=vocab, removed=removed)))

    tok = plain(texts[ids.index(chosen)] if chosen in ids else f"#{chosen}")
    title = tx["chain_title"].format(tok=tok, p=sampling.chosen_prob, rank=rank_shown(sampling.chosen_rank))
    grammar_line = "<br>".join(line for line in (_grammar_line(sampling, tx), _bias_line(sampling, tx)) if line)
    if grammar_line:
        title += "<br>" + grammar_line
    extra, shapes = {}, []
    if forced is not None:
        title = tx["chain_title_forced"].format(forced=forced.label(), tok=tok, p=sampling.chosen_prob,
                                                rank=rank_shown(sampling.chosen_rank))
        if forced.token in ids:  # the forced row banded across every stage, as in the logits chart
            k = ids.index(forced.token)
            shapes.append(dict(type="rect", xref="paper", yref="y", x0=0, x1=1, y0=k - 0.5, y1=k + 0.5,
                               layer="below", line=dict(width=0), fillcolor="rgba(148,103,189,0.22)"))
    # from the top: the title (common.layout adds a line for each line it wraps; a forced token's title has
    # two), the what-if badge, the two rows of stage headers; the plot is tall enough for its rows and for the
    # axis title along it
    top = (ABOVE_PLOT + 18 * (forced is not None) + 18 * (grammar_line.count("<br>") + bool(grammar_line))
           + 2 * HEADER_ROW
           + (BADGE_ROW if what_if else 0))
    bottom = 45
    plot_height = max(330, 18 * n + 30)
    height = top + bottom + plot_height
    if what_if:
        title = f"{title} — {tx['what_if']}"
        annotations.append(dict(text=f"<b>{tx['what_if_badge']}</b>", x=1.0, y=1.0, xref="paper", yref="paper",
                                xanchor="right", yanchor="bottom", yshift=2 * HEADER_ROW + 2, showarrow=False,
                                font=dict(size=12, color="white"), bgcolor=WHAT_IF_COLOR, borderpad=3))
        # the frame on the plot area's edges, the tick labels held off them: a frame a few pixels outside ran
        # through the token labels' last letters ("␣can" read "␣car")
        shapes.append(dict(type="rect", xref="paper", yref="paper", x0=0, x1=1, y0=0,
                           y1=1.0 + (2 * HEADER_ROW + BADGE_ROW) / plot_height,
                           line=dict(color=WHAT_IF_COLOR, width=3), fillcolor="rgba(0,0,0,0)", layer="above"))
        extra["paper_bgcolor"] = "#FFF6EC"
    if shapes:
        extra["shapes"] = shapes
    lay = layout(title, UIREV_CHAIN, barmode="overlay", bargap=0.15, height=height,
                 # a fixed left margin for labels of LABEL_CHARS and the axis title (see common.py)
                 margin=dict(l=label_px(12, LABEL_CHARS) + 20, r=20, t=top, b=bottom), annotations=annotations,
                 # the top token at the top: an explicit reversed range (autorange "reversed" is lost when
                 # Plotly.react follows the page's placeholder, which has the same uirevision)
                 yaxis=dict(tickmode="array", tickvals=list(range(n)), ticktext=labels, range=[n - 0.5, -0.5],
                            autorange=False, ticksuffix=" ", ticklabelstandoff=4,
                            title=dict(text=tx["tokens_axis"], font=dict(size=11)), fixedrange=False),
                 xaxis=dict(range=[0, span], tickmode="array", tickvals=tickvals, ticktext=ticktext,
                            tickfont=dict(size=9), tickangle=0, showgrid=True, gridcolor="#EEE", zeroline=False,
                            ticklabelstandoff=3, title=dict(text=tx["prob"], font=dict(size=11))),
                 **extra)
    return figure(data, lay)


def masked_by_grammar(sampling: SamplingTrace | None) -> set[int]:
    """The tracked tokens the grammar's mask removed at this step (empty for an unconstrained step)."""
    st = next((s for s in (sampling.stages if sampling is not None else ()) if s.name == "grammar"), None)
    if st is None:
        return set()
    return {t for t, kept in zip(sampling.token_ids, st.kept) if not kept}


def _grammar_line(sampling: SamplingTrace, tx: dict) -> str:
    """One line under the title for a constrained step: tokens allowed, top tokens masked, mass removed, cost."""
    st = next((s for s in sampling.stages if s.name == "grammar"), None)
    if st is None:
        return ""
    g = sampling.grammar
    return tx["grammar_line"].format(allowed=st.num_kept, vocab=sampling.vocab_size,
                                     masked=len(masked_by_grammar(sampling)), n=len(sampling.token_ids),
                                     mass=st.mass_removed, ms=g.mask_ms if g is not None else 0.0)


def banned_by_bias(sampling: SamplingTrace | None) -> set[int]:
    """The tracked tokens the bias stage banned at this step (logit_bias -100 is a ban in all but name: it is
    kept, with its tiny probability; allowed_token_ids, bad_words and min_tokens' held-back EOS are -inf)."""
    st = next((s for s in (sampling.stages if sampling is not None else ()) if s.name == "bias"), None)
    if st is None:
        return set()
    return {t for t, kept in zip(sampling.token_ids, st.kept) if not kept}


def _bias_line(sampling: SamplingTrace, tx: dict) -> str:
    """One line under the title for a step with the bias stage: tokens left, and of the tokens shown how many it
    banned and how many logit_bias pushed down or up (against the stage before it, the raw or masked logits)."""
    stages = _ordered_stages(sampling)
    k = next((i for i, s in enumerate(stages) if s.name == "bias"), None)
    if not k:
        return ""
    st, before = stages[k], stages[k - 1]
    down = up = 0
    for new, old, kept in zip(st.logits, before.logits, st.kept):
        if kept and new is not None and old is not None and new != old:
            down, up = down + (new < old), up + (new > old)
    return tx["bias_line"].format(allowed=st.num_kept, vocab=sampling.vocab_size,
                                  banned=len(banned_by_bias(sampling)), n=len(sampling.token_ids), down=down, up=up)


def _role(token: int, chosen: int, forced: Forced | None, tx: dict) -> str:
    """A hover's note on the draw's pick and the forced token (empty for the other rows)."""
    role = row_role(token, chosen, forced)
    return f"<br>{tx['chosen' if role == 'sampled' else role]}" if role else ""


def sampling_cdf_chart(sampling: SamplingTrace | None, lang: str = "en", forced: Forced | None = None) -> dict:
    """The final distribution as a CDF staircase over the tracked survivors in draw order, u and the pick.

    Trace "interval": each token's slice [cdf − p, cdf) as a floating bar; trace "cdf": the staircase itself
    (y = sampling.cdf cumulative values); trace "u": the horizontal line at u; trace "chosen": the point where
    u crosses the chosen token's slice. Greedy traces get no u line, only an annotation.

    `forced` (logits.forced_of(SeqEvent)): the token emitted instead of the pick. Its slice is purple with a
    "forced" marker (or a note says the chain left it out of the draw); the pick is what u "would have sampled".
    """
    tx = _t(lang)
    if sampling is None or not sampling.cdf:
        return empty(tx["cdf"], tx["no_trace"], UIREV_CDF)
    ids = list(sampling.token_ids)
    texts = _texts(sampling)
    text_of = dict(zip(ids, texts))
    stages = _ordered_stages(sampling)
    final_probs = dict(zip(ids, stages[-1].probs)) if stages else {}

    cdf = list(sampling.cdf)
    m = len(cdf)
    xs = list(range(m))
    cum = [c for _, c in cdf]
    tids = [t for t, _ in cdf]
    p = [final_probs.get(t, c - (cum[i - 1] if i else 0.0)) for i, (t, c) in enumerate(cdf)]
    base = [max(0.0, c - pi) for c, pi in zip(cum, p)]
    chosen = sampling.chosen
    greedy = sampling.greedy
    u = sampling.u
    labels = [plain(text_of.get(t, f"#{t}"), LABEL_CHARS) for t in tids]
    cd = [[t, plain(text_of.get(t, f"#{t}")), pi, b, c] for t, pi, b, c in zip(tids, p, base, cum)]

    forced_id = forced.token if forced is not None else None
    slice_colors = [FORCED_COLOR if t == forced_id else ACCENT if t == chosen else KEPT_COLOR for t in tids]
    data = [
        dict(type="bar", name="interval", x=xs, y=p, base=base, width=0.6,
             marker=dict(color=slice_colors), opacity=0.55,
             customdata=cd,
             hovertemplate=("%{customdata[1]} (id %{customdata[0]})<br>p = %{customdata[2]:.4f}<br>"
                            + tx["slice"] + " [%{customdata[3]:.4f}, %{customdata[4]:.4f})<extra></extra>")),
        dict(type="scatter", name="cdf", mode="lines+markers", x=xs, y=cum,
             line=dict(shape="hv", color="#333", width=2),
             marker=dict(size=5, color="#333"), customdata=cd,
             hovertemplate="%{customdata[1]}<br>CDF = %{y:.4f}<extra></extra>"),
    ]
    annotations = []
    pos = tids.index(chosen) if chosen in tids else None
    tok = plain(text_of.get(chosen, f"#{chosen}"))
    picked = tx["would"] if forced is not None else tx["chosen"]  # the pick's name in hovers
    if greedy:
        title = tx["greedy_title_would" if forced is not None else "greedy_title"].format(tok=tok)
        annotations.append(dict(text=tx["greedy"], x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                                font=dict(size=13, color="#555"), bgcolor="rgba(255,255,255,0.85)"))
        if pos is not None:
            data.append(dict(type="scatter", name="chosen", mode="markers", x=[pos], y=[cum[pos]],
                             marker=dict(symbol="star", size=14, color=ACCENT),
                             hovertemplate=f"{picked}: «{tok}»<extra></extra>"))
    else:
        key = "cdf_title_would" if forced is not None else "cdf_title"
        title = tx[key].format(u=u, tok=tok, p=sampling.chosen_prob)
        data.append(dict(type="scatter", name="u", mode="lines", x=[-0.5, m - 0.5], y=[u, u],
                         line=dict(color=U_COLOR, dash="dash", width=2),
                         hovertemplate=f"u = {u:.4f}<extra></extra>"))
        if pos is not None:
            data.append(dict(type="scatter", name="chosen", mode="markers+text", x=[pos], y=[u],
                             marker=dict(symbol="star", size=14, color=ACCENT), text=[tok],
                             textposition="middle right",
                             hovertemplate=(f"{picked}: «{tok}»<br>u = {u:.4f} ∈ [{base[pos]:.4f}, "
                                            f"{cum[pos]:.4f})<extra></extra>")))
    if forced is not None:
        title = _forced_cdf(forced, tids, cum, p, data, annotations, tx) + title
    masked = masked_by_grammar(sampling)
    if masked:  # the grammar's cut tokens are not in the draw at all: say which of the top ones they were
        names = ", ".join([f"«{plain(text_of.get(t, f'#{t}'), LABEL_CHARS)}»" for t in ids if t in masked][:4])
        # wrapped to the narrowest chart's plot area (~330 px): one line ran past the chart's right edge
        note, _ = wrap_title(tx["cdf_masked"].format(n=len(masked), names=names), NOTE_CHARS)
        annotations.append(dict(text=note, x=0.0, y=1.0, align="left",
                                xref="paper", yref="paper", xanchor="left", yanchor="top", showarrow=False,
                                font=dict(size=11, color="#777"), bgcolor="rgba(255,255,255,0.85)"))
    tail = 1.0 - (cum[-1] if cum else 0.0)
    if tail > 1e-4 and not greedy:
        annotations.append(dict(text=tx["tail"].format(m=tail), x=1.0, y=0.02, xref="paper", yref="paper",
                                xanchor="right", yanchor="bottom", showarrow=False, font=dict(size=11, color="#777")))
    angle = -45 if m > 8 else 0
    axis_title, added = wrap_title(tx["draw_order"], NOTE_CHARS)  # "оставшиеся токены … первыми)" ran off
    lay = layout(title, UIREV_CDF, height=360 + 18 * (forced is not None) + 14 * added, bargap=0.3,
                 annotations=annotations,
                 # a forced token's title has a line more; the bottom fits LABEL_CHARS (see common.py)
                 margin=dict(l=55, r=20, t=45 + 18 * (forced is not None),
                             b=rotated_px(10, LABEL_CHARS, angle) + 30 + 14 * added),
                 xaxis=dict(tickmode="array", tickvals=xs, ticktext=labels, range=[-0.6, max(m, 6) - 0.4],
                            tickfont=dict(size=10), title=dict(text=axis_title, font=dict(size=11)),
                            tickangle=angle),
                 yaxis=dict(range=[0, 1.04], title=dict(text=tx["cum"]), tickformat=".0%", gridcolor="#EEE"))
    return figure(data, lay)


def _forced_cdf(forced: Forced, tids: list[int], cum: list[float], p: list[float], data: list, annotations: list,
                tx: dict) -> str:
    """A forced token on the CDF: a marker on its slice, or a note that the draw could not pick it; returns the
    title's first line (the title's own line then tells what the draw would have sampled)."""
    label = forced.label()
    if forced.token in tids:
        k = tids.index(forced.token)
        data.append(dict(type="scatter", name="forced", mode="markers+text", x=[k], y=[cum[k] - p[k] / 2],
                         marker=dict(symbol="diamond", size=13, color=FORCED_COLOR), text=[tx["forced_mark"]],
                         # under and beside the marker: a small slice sits on the staircase's line
                         textposition="bottom right", textfont=dict(color=FORCED_COLOR, size=11),
                         hovertemplate=f"{tx['forced']}: «{label}»<extra></extra>"))
    else:
        annotations.append(dict(text=tx["forced_outside"].format(tok=label), x=1.0, y=0.12, xref="paper",
                                yref="paper", xanchor="right", yanchor="bottom", showarrow=False,
                                font=dict(size=11, color=FORCED_COLOR)))
    return tx["forced_title"].format(tok=label) + "<br>"
