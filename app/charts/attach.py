"""Attach mode's panels: pure functions of what an attached OpenAI-compatible server answered (app/attach.py's
AttachRun and /metrics series) -> Plotly figure dicts and HTML. Every number drawn is the server's own (its
top-N log-probabilities, its metrics) or measured at this client (arrival times); labels say which."""
from __future__ import annotations

import html
import math

from ..i18n import t, texts
from .common import ACCENT, SEQ_COLORS, empty, figure, layout, token_label

UIREV_TOP, UIREV_TIMING, UIREV_METRICS = "attach-top", "attach-timing", "attach-metrics"


def top_figure(run, index: int | None, lang: str) -> dict:
    """The server's top-N at one generated token (the last by default): a bar per token, probability e^logprob,
    the token the server kept in the accent colour. Only N tokens: the rest of the distribution is not sent."""
    say = texts("attach", lang)
    with_top = [i for i, t in enumerate(run.tokens if run else []) if t.top]
    if not with_top:
        return empty(say["top_title_empty"], say["no_logprobs"], UIREV_TOP)
    i = with_top[-1] if index is None or index not in with_top else index
    tok = run.tokens[i]
    labels = [token_label(t) for t, _ in tok.top]
    probs = [math.exp(lp) for _, lp in tok.top]
    colors = [ACCENT if t == tok.text else SEQ_COLORS[0] for t, _ in tok.top]
    rest = max(0.0, 1.0 - sum(probs))
    data = [{"type": "bar", "orientation": "h", "x": probs[::-1], "y": labels[::-1], "marker": {"color": colors[::-1]},
             "customdata": [[lp] for _, lp in tok.top[::-1]], "name": "top",
             "hovertemplate": "%{y}: p=%{x:.4f} (logprob %{customdata[0]:.3f})<extra></extra>"}]
    title = say["top_title"].format(n=len(tok.top), i=i + 1, token=token_label(tok.text), rest=f"{rest:.1%}")
    lay = layout(title, UIREV_TOP, height=max(260, 60 + 22 * len(labels)),
                 xaxis={"title": {"text": say["top_x"]}, "range": [0, 1]},
                 yaxis={"automargin": True, "type": "category"}, margin={"l": 110, "r": 20, "t": 60, "b": 50})
    return figure(data, lay)


def timing_figure(run, lang: str) -> dict:
    """Client-measured time to first token and the gap before each later token, in ms."""
    say = texts("attach", lang)
    times = [tok.t for tok in (run.tokens if run else [])]
    if not times:
        return empty(say["timing_title_empty"], say["no_tokens"], UIREV_TIMING)
    gaps = [times[0]] + [b - a for a, b in zip(times, times[1:])]
    ms = t("time_units", lang)[1]
    itl = sorted(gaps[1:])
    median = itl[len(itl) // 2] * 1e3 if itl else float("nan")
    data = [{"type": "bar", "x": list(range(1, len(gaps) + 1)), "y": [g * 1e3 for g in gaps], "name": "gaps",
             "marker": {"color": [ACCENT] + [SEQ_COLORS[0]] * (len(gaps) - 1)},
             "hovertemplate": f"#%{{x}}: %{{y:.1f}} {ms}<extra></extra>"}]
    title = say["timing_title"].format(ttft=f"{gaps[0] * 1e3:.0f}", itl="–" if math.isnan(median) else f"{median:.0f}")
    lay = layout(title, UIREV_TIMING, height=280, xaxis={"title": {"text": say["timing_x"]}},
                 yaxis={"title": {"text": ms}})
    return figure(data, lay)


SERIES = (("kv_usage", "y", 100.0), ("hit_rate", "y", 100.0), ("running", "y2", 1.0), ("waiting", "y2", 1.0),
          ("preemptions", "y2", 1.0))


def metrics_figure(series, note: str, lang: str, retry_s: float | None = None) -> dict:
    """The server's /metrics over time: KV-cache usage and prefix hit rate (%, left), requests running and
    waiting and preemptions (right), each drawn when the server exports it. A server without /metrics (it answered
    404: `note` "absent: ...") is said to have none, and when it is asked again (`retry_s`)."""
    say = texts("attach", lang)
    points = list(series)
    if not points:
        if note.startswith("absent"):
            why = say["metrics_absent"].format(status=note.rpartition(" ")[2], s=f"{retry_s or 0:.0f}")
            return empty(say["metrics_title"], why, UIREV_METRICS)
        return empty(say["metrics_title"], say["metrics_none"] if note else say["metrics_wait"], UIREV_METRICS)
    now = points[-1][0]
    data = []
    for i, (q, axis, scale) in enumerate(SERIES):
        xs = [t - now for t, v in points if q in v]
        if xs:
            data.append({"type": "scatter", "mode": "lines", "name": say[f"q_{q}"], "yaxis": axis, "x": xs,
                         "y": [v[q] * scale for _, v in points if q in v],
                         "line": {"color": SEQ_COLORS[i], "dash": "solid" if axis == "y" else "dot"}})
    if not data:
        return empty(say["metrics_title"], say["metrics_none"], UIREV_METRICS)
    counts = [y for d in data if d["yaxis"] == "y2" for y in d["y"]]
    step = max(1, math.ceil(max(counts, default=1) / 4))  # whole requests on the right axis
    lay = layout(say["metrics_title"], UIREV_METRICS, height=330, showlegend=True,
                 legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
                 xaxis={"title": {"text": say["metrics_x"]}},
                 yaxis={"title": {"text": "%"}, "rangemode": "tozero"},
                 yaxis2={"overlaying": "y", "side": "right", "rangemode": "tozero", "showgrid": False, "dtick": step},
                 margin={"l": 50, "r": 40, "t": 100, "b": 50})
    return figure(data, lay)


def stream_html(run, lang: str) -> str:
    """The streamed deltas as they arrived, each with its arrival time: the server's detokenizer at work."""
    say = texts("attach", lang)
    if run is None:
        return f'<p class="at-note">{html.escape(say["stream_empty"])}</p>'
    ms = t("time_units", lang)[1]
    chips = "".join(f'<span class="at-delta" title="{tok.t * 1e3:.0f} {ms}">{html.escape(tok.delta) or "∅"}'
                    f'<sub>{tok.t * 1e3:.0f}</sub></span>' for tok in run.tokens)
    status = run.error and f'<p class="at-error">{html.escape(run.error)}</p>'
    if run.done and not run.error:
        usage = run.usage or {}
        if usage.get("prompt_tokens") is None and usage.get("completion_tokens") is None:
            done = say["finished_no_usage"].format(reason=run.finish_reason or "?", n=len(run.tokens))
        else:
            done = say["finished"].format(reason=run.finish_reason or "?", n=len(run.tokens),
                                          prompt=usage.get("prompt_tokens", "?"),
                                          completion=usage.get("completion_tokens", "?"))
        status = f'<p class="at-note">{html.escape(done)}</p>'
    return f'<div class="at-stream">{chips}</div>{status or ""}'


def tokens_html(tokens, why: str, server_count, lang: str, done: bool = False) -> str:
    """The prompt as the model reads it (app/attach_tokens.Tokens): through the model's own tokenizer and chat
    template when it loads here, else the server's tokenize endpoint's tokens, each labelled by where it came from
    (each chip carries its token id in data-id where known). `server_count`: the prompt tokens the server's usage
    counted; None with `done` says the server sent none (llama-cpp-python's streams carry no usage)."""
    say = texts("attach", lang)
    if tokens is None or tokens.pieces is None:
        return f'<p class="at-note">{html.escape(say["no_tokenizer"].format(why=why))}</p>'
    ids = tokens.ids if tokens.ids is not None and len(tokens.ids) == len(tokens.pieces) else None
    attrs = [f' data-id="{int(i)}"' for i in ids] if ids else [""] * len(tokens.pieces)
    chips = "".join(f'<span class="at-tok"{a}>{html.escape(token_label(t))}</span>'
                    for a, t in zip(attrs, tokens.pieces))
    key = {"model": "token_count", "server": "token_count_server", "server_raw": "token_count_raw"}[tokens.source]
    if server_count is None and done:
        key += "_no_usage"
    count = say[key].format(n=len(tokens.pieces), server="…" if server_count is None else server_count, why=why)
    template = f'<pre class="at-template">{html.escape(tokens.text)}</pre>' if tokens.text is not None else ""
    return (f'<p class="at-note" data-source="{tokens.source}">{html.escape(count)}</p>{template}'
            f'<div class="at-tokens">{chips}</div>')


def absent_html(lang: str) -> str:
    """The lab's panels an attached server cannot feed, said plainly."""
    say = texts("attach", lang)
    items = "".join(f"<li>{html.escape(x)}</li>" for x in say["absent_items"])
    return f'<p class="at-note">{html.escape(say["absent_text"])}</p><ul class="at-note">{items}</ul>'


