"""The model's output for one step (logits → probabilities) and the sequence's log-probabilities over time."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.events import LogitStats
from engine.sampling import SamplingTrace, StageSnapshot

from .attention import seq_events
from .common import ACCENT, BAR, DOTS, GREY, LABEL_CHARS, LINE, empty, figure, label_px, layout, legend_key, plain, rank_shown, rotated_px, shorten
from ..i18n import texts

MAX_POINTS = 512
LOGIT_COLOR = "#4C78A8"
PROB_COLOR = "#72B7B2"
FINAL_COLOR = "#F58518"
CHOSEN_COLOR = ACCENT
FORCED_COLOR = "#9467BD"  # a forced token, in every chart that shows one
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


@dataclass(frozen=True)
class Forced:
    """A token the user forced at a step (SeqEvent.forced): it was emitted, not the one the draw picked
    (SamplingTrace.chosen, which the charts then call "would have sampled")."""

    token: int
    text: str
    logprob: float | None = None  # the model's own log-probability of it (SeqEvent.logit_stats; traced steps)
    rank: int | None = None  # tokens with a higher raw logit (0: the argmax)

    def label(self) -> str:
        return id_label(self.text, self.token)


def forced_of(seq_event) -> Forced | None:
    """The forced token of a SeqEvent, or None when the step emitted what it sampled."""
    if seq_event is None or not seq_event.forced or seq_event.new_token is None:
        return None
    stats = seq_event.logit_stats
    return Forced(int(seq_event.new_token), seq_event.new_token_text,
                  None if stats is None else stats.token_logprob, None if stats is None else stats.token_rank)


def logits_chart(seq_event_sampling: SamplingTrace | None, logit_stats: LogitStats | None, lang: str = "en",
                 forced: Forced | None = None) -> dict:
    """Left: raw logits of the tracked top-N tokens; right: their softmax probabilities and the final
    probabilities after the sampling chain. The sampled token's bars are red, its row banded.

    `seq_event_sampling` is SeqEvent.sampling (or Engine.what_if(...)); `logit_stats` is SeqEvent.logit_stats.
    `forced` (forced_of(SeqEvent)): the token emitted instead of the sample. Its row is banded in purple and
    its bars outlined; the sample keeps its red bars and is called "would have sampled".
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
    emitted = forced.token if forced is not None else chosen  # the row that went on into the text
    y = list(range(len(ids)))
    labels = [id_label(s, i) for s, i in zip(texts, ids)]
    # a constrained step: the rows the grammar's mask removed are grey, their labels marked with ⊘
    # (the bias stage's bans, vLLM's allowed_token_ids / bad_words / min_tokens, are marked the same way)
    masked = set()
    for name in ("grammar", "bias"):
        stage = _stage(sampling, name)
        if stage is not None:
            masked |= {i for i, k in zip(ids, stage.kept) if not k}
    outline = dict(color=[FORCED_COLOR if forced is not None and i == forced.token else "#222" for i in ids],
                   width=[2.5 if i in (chosen, emitted) else 0 for i in ids])
    custom = [[ids[k], labels[k], _row_role(ids[k], chosen, forced, t) + (t["key_masked"] if ids[k] in masked else "")]
              for k in y]  # [0] = token id: forced on click
    hover_head = "%{customdata[1]} · id %{customdata[0]}%{customdata[2]}<br>"
    data = [
        dict(type="bar", orientation="h", name=t["logit"], x=raw.logits, y=y, xaxis="x", yaxis="y",
             customdata=custom,
             marker=dict(color=[GREY if i in masked else _bar_color(i, chosen, forced, LOGIT_COLOR) for i in ids],
                         line=outline),
             hovertemplate=hover_head + f"{t['logit']}: %{{x:.3f}}<extra></extra>", showlegend=False),
        dict(type="bar", orientation="h", name=t["softmax"], x=raw.probs, y=y, xaxis="x2", yaxis="y",
             customdata=custom, marker=dict(color=PROB_COLOR, line=outline),
             hovertemplate=hover_head + f"{t['softmax']}: %{{x:.4f}}<extra></extra>"),
    ]
    if final is not raw:
        data.append(dict(type="bar", orientation="h", name=t["final"], x=final.probs, y=y, xaxis="x2", yaxis="y",
                         customdata=custom, marker=dict(color=FINAL_COLOR, line=outline),
                         hovertemplate=hover_head + f"{t['final']}: %{{x:.4f}}<extra></extra>"))
    shapes = []
    if emitted in ids:  # a band behind the emitted token's row, across both panels: red sampled, purple forced
        k = ids.index(emitted)
        band = "rgba(148,103,189,0.22)" if forced is not None else "rgba(214,39,40,0.12)"
        shapes.append(dict(type="rect", xref="paper", yref="y", x0=0, x1=1, y0=k - 0.5, y1=k + 0.5, layer="below",
                           line=dict(width=0), fillcolor=band))
    finite = [v for v in raw.logits if v is not None and math.isfinite(v)]
    xaxis = dict(domain=[0.0, 0.44], anchor="y", title=dict(text=t["logit"]), gridcolor="#eee", zeroline=False)
    if finite:
        lo, hi = min(finite), max(finite)
        pad = max(0.5, 0.08 * (hi - lo))
        xaxis["range"] = [lo - pad, hi + pad]
    pmax = max(list(raw.probs) + list(final.probs) + [1e-6])

    key = [(BAR, PROB_COLOR, t["softmax"])] + ([(BAR, FINAL_COLOR, t["final"])] if final is not raw else [])
    if masked:
        key.append((BAR, GREY, t["key_masked_legend"]))
    if forced is not None:  # what the marked rows mean (the forced one may be outside the rows shown)
        key = [key, ([(BAR, FORCED_COLOR, t["key_forced"])] if forced.token in ids else [])
               + [(BAR, CHOSEN_COLOR, t["key_would"])]]
    else:
        key = [key]
    lay = layout(_title(sampling, logit_stats, labels, forced, t), uirev,
                 xaxis=xaxis,
                 xaxis2=dict(domain=[0.56, 1.0], anchor="y", title=dict(text=t["prob"]),
                             range=[0, min(1.0, pmax * 1.1)], gridcolor="#eee"),
                 # the top token at the top: an explicit reversed range (autorange "reversed" is lost when
                 # Plotly.react follows a placeholder figure of the same uirevision)
                 yaxis=dict(tickmode="array", tickvals=y,
                            ticktext=[("⊘ " if i in masked else "") + shorten(s) for s, i in zip(labels, ids)],
                            range=[len(ids) - 0.5, -0.5], autorange=False, tickfont=dict(size=10)),
                 # a fixed left margin, sized for LABEL_CHARS (see common.py); hovers keep the whole token
                 barmode="group", bargap=0.2, shapes=shapes,
                 # a forced token adds two subtitle lines (forced, would have sampled) and a row to the key
                 margin=dict(l=label_px(10, LABEL_CHARS + 1) + 8, r=20, t=60 + 32 * (forced is not None),
                             b=72 + 20 * (forced is not None)),
                 annotations=[legend_key(key, y=0, yanchor="top", yshift=-24)],  # under the tick labels
                 height=max(320, 20 * len(ids) + 130) + 46 * (forced is not None))
    return figure(data, lay)


def _bar_color(token: int, chosen: int, forced: Forced | None, plain_color: str) -> str:
    if forced is not None and token == forced.token:
        return FORCED_COLOR
    return CHOSEN_COLOR if token == chosen else plain_color


def row_role(token: int, chosen: int, forced: Forced | None) -> str | None:
    """The part a row played in the step: "forced", "would" (the draw's pick when another token was forced),
    "sampled", or None. The logits and sampling charts word it each in their own hover."""
    if forced is not None and token == forced.token:
        return "forced"
    if token == chosen:
        return "would" if forced is not None else "sampled"
    return None


def _row_role(token: int, chosen: int, forced: Forced | None, t: dict) -> str:
    """What a row's hover says after its id (nothing for rows that played no part)."""
    role = row_role(token, chosen, forced)
    return f" · {t['key_' + role]}" if role else ""


def _prob(p: float) -> str:
    """A probability for a title: three decimals, or two significant digits when that would read 0.000."""
    return f"{p:.3f}" if p >= 0.0005 else f"{p:.1e}"


def _title(sampling: SamplingTrace, logit_stats: LogitStats | None, labels: list[str], forced: Forced | None,
           t: dict) -> str:
    """The title and its subtitle: entropy, then the emitted token (and, when forced, what the draw picked)."""
    ids = list(sampling.token_ids)
    chosen = sampling.chosen
    sub = []
    if logit_stats is not None:
        h = logit_stats.entropy
        sub.append(t["stats"].format(nats=h, bits=h / LN2))
    tok = f"«{labels[ids.index(chosen)]}»" if chosen in ids else f"#{chosen}"
    lines = []
    if forced is not None:
        p = "–" if forced.logprob is None else _prob(math.exp(forced.logprob))
        rank = "–" if forced.rank is None else rank_shown(forced.rank)
        lines.append(t["forced_line"].format(tok=f"«{forced.label()}»", id=forced.token, rank=rank, p=p)
                     + ("" if forced.token in ids else t["not_shown"]))
        lines.append(t["would"].format(tok=tok, rank=rank_shown(sampling.chosen_rank), p=sampling.chosen_prob))
    elif chosen >= 0:
        sub.append(t["chosen"].format(tok=tok, rank=rank_shown(sampling.chosen_rank), p=sampling.chosen_prob))
    rows = [" · ".join(sub)] if sub else []
    rows += lines
    return t["title"] + "".join(f"<br><span style='font-size:11px;color:#555'>{r}</span>" for r in rows)


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
