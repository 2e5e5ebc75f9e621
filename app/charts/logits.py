"""The model's output for one step (logits → probabilities) and the sequence's log-probabilities over time."""
from __future__ import annotations

import math

import numpy as np

from engine.events import LogitStats
from engine.sampling import SamplingTrace, StageSnapshot

from .attention import seq_events
from .common import ACCENT, BAR, DOTS, LABEL_CHARS, LINE, empty, figure, label_px, layout, legend_key, plain, rotated_px, shorten
from ..i18n import texts

MAX_POINTS = 512
LOGIT_COLOR = "#4C78A8"
PROB_COLOR = "#72B7B2"
FINAL_COLOR = "#F58518"
CHOSEN_COLOR = ACCENT
LN2 = math.log(2.0)


def _tr(lang: str) -> dict:
    return texts("logits", lang)


def id_label(text: str, token_id: int) -> str:
    """Token text for a label; a token that is not whole UTF-8 (shows as �) or is empty gets its id too."""
    if not text or "\ufffd" in text:
        return f"{plain(text)} #{int(token_id)}"
    return plain(text)


def _stage(sampling: SamplingTrace, name: str) -> StageSnapshot | None:
    return next((s for s in sampling.stages if s.name == name), None)


def logits_chart(seq_event_sampling: SamplingTrace | None, logit_stats: LogitStats | None, lang: str = "en",
                 forced_token: int | None = None) -> dict:
    """Left: raw logits of the tracked top-N tokens; right: their softmax probabilities and the final
    probabilities after the sampling chain. The sampled token's bars are red.

    `seq_event_sampling` is SeqEvent.sampling (or Engine.what_if(...)); `logit_stats` is SeqEvent.logit_stats.
    Pass `forced_token` (SeqEvent.new_token when SeqEvent.forced) to mark a forced token in the title.
    """
    t = _tr(lang)
    uirev = "next-token-logits"
    sampling = seq_event_sampling
    if sampling is None or not sampling.stages or not sampling.token_ids:
        return empty(t["title"], t["empty"], uirev)
    ids = list(sampling.token_ids)
    texts = list(sampling.token_texts)
    texts += [str(i) for i in ids[len(texts):]]
    raw = _stage(sampling, "logits") or sampling.stages[0]
    final = sampling.stages[-1]
    chosen = sampling.chosen
    widths = [2.5 if i == chosen else 0 for i in ids]
    y = list(range(len(ids)))
    labels = [id_label(s, i) for s, i in zip(texts, ids)]
    custom = [[ids[k], labels[k]] for k in y]  # customdata[0] = token id: the page forces it on click
    hover_head = f"%{{customdata[1]}} · id %{{customdata[0]}}<br>"
    data = [
        dict(type="bar", orientation="h", name=t["logit"], x=raw.logits, y=y, xaxis="x", yaxis="y",
             customdata=custom,
             marker=dict(color=[CHOSEN_COLOR if i == chosen else LOGIT_COLOR for i in ids],
                         line=dict(color="#222", width=widths)),
             hovertemplate=hover_head + f"{t['logit']}: %{{x:.3f}}<extra></extra>", showlegend=False),
        dict(type="bar", orientation="h", name=t["softmax"], x=raw.probs, y=y, xaxis="x2", yaxis="y",
             customdata=custom, marker=dict(color=PROB_COLOR, line=dict(color="#222", width=widths)),
             hovertemplate=hover_head + f"{t['softmax']}: %{{x:.4f}}<extra></extra>"),
    ]
    if final is not raw:
        data.append(dict(type="bar", orientation="h", name=t["final"], x=final.probs, y=y, xaxis="x2", yaxis="y",
                         customdata=custom, marker=dict(color=FINAL_COLOR, line=dict(color="#222", width=widths)),
                         hovertemplate=hover_head + f"{t['final']}: %{{x:.4f}}<extra></extra>"))
    shapes = []
    if chosen in ids:  # a red band behind the sampled token's row, across both panels
        k = ids.index(chosen)
        shapes.append(dict(type="rect", xref="paper", yref="y", x0=0, x1=1, y0=k - 0.5, y1=k + 0.5, layer="below",
                           line=dict(width=0), fillcolor="rgba(214,39,40,0.12)"))
    finite = [v for v in raw.logits if v is not None and math.isfinite(v)]
    xaxis = dict(domain=[0.0, 0.44], anchor="y", title=dict(text=t["logit"]), gridcolor="#eee", zeroline=False)
    if finite:
        lo, hi = min(finite), max(finite)
        pad = max(0.5, 0.08 * (hi - lo))
        xaxis["range"] = [lo - pad, hi + pad]
    pmax = max(list(raw.probs) + list(final.probs) + [1e-6])

    sub = []
    if logit_stats is not None:
        h = logit_stats.entropy
        sub.append(t["stats"].format(nats=h, bits=h / LN2))
    if chosen >= 0:
        tok = f"«{labels[ids.index(chosen)]}»" if chosen in ids else f"#{chosen}"
        sub.append(t["chosen"].format(tok=tok, rank=sampling.chosen_rank, p=sampling.chosen_prob))
    if forced_token is not None:
        sub.append(f"{t['token']} #{forced_token}{t['forced']}")
    title = t["title"] + (f"<br><span style='font-size:11px;color:#555'>{' · '.join(sub)}</span>" if sub else "")
    lay = layout(title, uirev,
                 xaxis=xaxis,
                 xaxis2=dict(domain=[0.56, 1.0], anchor="y", title=dict(text=t["prob"]),
                             range=[0, min(1.0, pmax * 1.1)], gridcolor="#eee"),
                 yaxis=dict(tickmode="array", tickvals=y, ticktext=[shorten(s) for s in labels], autorange="reversed",
                            tickfont=dict(size=10)),
                 # a fixed left margin, sized for LABEL_CHARS (see common.py); hovers keep the whole token
                 barmode="group", bargap=0.2, shapes=shapes,
                 margin=dict(l=label_px(10, LABEL_CHARS + 1) + 8, r=20, t=60, b=72),
                 annotations=[legend_key([[(BAR, PROB_COLOR, t["softmax"])] +
                                          ([(BAR, FINAL_COLOR, t["final"])] if final is not raw else [])],
                                         y=0, yanchor="top", yshift=-24)],  # under the tick labels
                 height=max(320, 20 * len(ids) + 130))
    return figure(data, lay)


def token_logprobs(events, seq_id: int) -> list[dict]:
    """Per generated token (index in the output, latest step winning; stale ones after a rewind dropped):
    {index, token, text, logprob, entropy}. Only steps that traced the sampling have logit_stats."""
    points: dict[int, dict] = {}
    for s in seq_events(events, seq_id):
        if s.new_token is None:
            continue
        k = int(s.num_tokens - s.prompt_len - 1)
        for stale in [j for j in points if j > k]:
            del points[stale]
        points.pop(k, None)
        stats = s.logit_stats
        if stats is None:
            continue
        points[k] = dict(index=k, token=int(s.new_token), text=s.new_token_text, logprob=stats.token_logprob,
                         entropy=stats.entropy)
    return [points[k] for k in sorted(points)]


def perplexity_chart(events, seq_id: int, lang: str = "en", max_points: int = MAX_POINTS) -> dict:
    """Bars: log p of each generated token; dotted line: its expected value −entropy; right axis: the running
    perplexity exp(−mean log p) over the tokens so far."""
    t = _tr(lang)
    uirev = "perplexity"
    pts = token_logprobs(events, seq_id)
    if not pts:
        return empty(t["ppl_name"], t["ppl_empty"], uirev)
    lp = np.array([p["logprob"] for p in pts])
    running = np.exp(-np.cumsum(lp) / np.arange(1, len(lp) + 1))
    ent = np.array([np.nan if p["entropy"] is None else p["entropy"] for p in pts])
    n_total = len(pts)
    pts, lp, running, ent = pts[-max_points:], lp[-max_points:], running[-max_points:], ent[-max_points:]
    x = [p["index"] for p in pts]
    labels = [id_label(p["text"], p["token"]) for p in pts]
    custom = [[labels[i], float(np.exp(lp[i])), None if np.isnan(ent[i]) else float(ent[i] / LN2)]
              for i in range(len(pts))]
    data = [
        dict(type="bar", name=t["logprob"], x=x, y=lp, customdata=custom, marker=dict(color=LOGIT_COLOR),
             hovertemplate=f"#%{{x}} %{{customdata[0]}}<br>{t['logprob']} = %{{y:.3f}} (p = %{{customdata[1]:.3f}})"
                           f"<br>{t['entropy']} %{{customdata[2]:.2f}} {t['bits']}<extra></extra>"),
        dict(type="scatter", mode="lines+markers", name=t["expected"], x=x, y=-ent, customdata=custom,
             line=dict(color="#54A24B", dash="dot", width=1.5), marker=dict(size=4),
             hovertemplate=f"#%{{x}} %{{customdata[0]}}<br>{t['expected']} = %{{y:.3f}}<extra></extra>"),
        dict(type="scatter", mode="lines+markers", name=t["running"], x=x, y=running, yaxis="y2", customdata=custom,
             line=dict(color=FINAL_COLOR, width=2), marker=dict(size=4),
             hovertemplate=f"#%{{x}} %{{customdata[0]}}<br>{t['running']} = %{{y:.3f}}<extra></extra>"),
    ]
    xaxis = dict(title=dict(text=t["x"]), showgrid=False)
    bottom = 40
    if len(x) <= 40:
        xaxis.update(tickmode="array", tickvals=x, ticktext=[shorten(s) for s in labels], tickangle=-60,
                     tickfont=dict(size=9))
        bottom = rotated_px(9, LABEL_CHARS, 60) + 34  # fixed: see common.LABEL_CHARS
    lay = layout(t["ppl_title"].format(ppl=float(running[-1]), n=n_total), uirev, xaxis=xaxis,
                 yaxis=dict(title=dict(text=t["y"]), gridcolor="#eee", zeroline=True, zerolinecolor="#999"),
                 yaxis2=dict(title=dict(text=t["y2"]), overlaying="y", side="right", showgrid=False,
                             rangemode="tozero", tickmode="auto"),
                 annotations=[legend_key([[(BAR, LOGIT_COLOR, t["logprob"]), (DOTS, "#54A24B", t["expected"])],
                                          [(LINE, FINAL_COLOR, t["running"])]])],
                 # room above the plot for the title and, below it, the key's two rows
                 margin=dict(l=50, r=60, t=100, b=bottom))
    return figure(data, lay)
