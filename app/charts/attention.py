"""Attention and logit-lens charts, assembled from the CaptureData of a sequence's step events.

Every step that captured a sequence carries, per layer, a block of attention rows [heads, rows, context]:
the whole prompt (or one chunk of it) at prefill, one row at decode. The charts stitch those blocks into the
causal matrix of the sequence, keeping for every position the row of the latest step that computed it, and
draw only a window of it (the last `max_positions` positions) so the payload stays small.
"""
from __future__ import annotations

import math

import numpy as np

from .common import (ACCENT, LABEL_CHARS, empty, figure, fmt_bytes, label_px, layout, plain, rotated_px, to_np,
                     wrap_title)
from ..i18n import texts

MAX_POSITIONS = 256  # one heatmap: at most this many query rows and key columns
GRID_MAX_POSITIONS = 64  # every head of a layer at once: smaller tiles
LENS_MAX_POSITIONS = 48  # logit-lens columns
POS_LABEL_CHARS = LABEL_CHARS + 4  # "117 " + the token text (pos_label)
IN_PLOT_CHARS = 24  # a line of a label inside the heatmap (11 px): its plot is ~200 px wide in a narrow column


# ColorBrewer "Blues" spread with a gamma: weights are dominated by a few large values (the first token
# is an attention sink), so a linear scale would hide everything else. z stays the true weight.
_BLUES = ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]
_GAMMA = 2.5
ATTN_COLORSCALE = [[(k / (len(_BLUES) - 1)) ** _GAMMA, c] for k, c in enumerate(_BLUES)]


def tr(lang: str) -> dict:
    return texts("attn", lang)


def pos_label(p: int, texts: list[str] | None) -> str:
    """A unique category label for position p ("12 ␣gra"), so repeated tokens get their own row/column; the
    token text is cut to LABEL_CHARS (the axes' margins are sized for that)."""
    if texts is not None and 0 <= p < len(texts):
        return f"{p} {plain(texts[p], LABEL_CHARS)}"
    return f"{p}"


def seq_events(events, seq_id: int) -> list:
    """The SeqEvents of `seq_id` in event order (steps that did not schedule it are skipped)."""
    out = []
    for ev in events or ():
        s = ev.seq(seq_id) if ev is not None else None
        if s is not None:
            out.append(s)
    return out


def context_len(evs: list) -> int:
    """Positions computed so far: the end of the latest step's chunk. Rows beyond it are stale (rewind)."""
    if not evs:
        return 0
    last = evs[-1]
    return int(last.chunk_start + last.num_processed)


SUBTITLE = "<br><span style='font-size:11px;color:#555'>{}</span>"
SUBTITLE_PX = 24  # the top margin a subtitle line adds (Plotly centres the title's first line in the margin, so
# the lines below it need about twice their height)


def count_text(n: int, lang: str) -> str:
    """1,400 (en) / 1 400 (ru, a no-break space)."""
    return f"{int(n):,}".replace(",", "\u00a0" if lang == "ru" else ",")


def _rows_of(cap) -> list[int]:
    """Absolute positions of the rows of cap.attention (the kept rows under a capture budget)."""
    rows = getattr(cap, "attention_rows", None)
    return list(cap.positions) if rows is None else rows


def _dropped(cap, part: str) -> bool:
    return part in (getattr(cap, "dropped", None) or ())


def _spans(evs: list, lo: int, T: int):
    """(positions of [lo, T), the capture of the latest step that computed them) for each step, oldest first."""
    for s in evs:
        cap = s.capture
        if cap is not None:
            span = [int(p) for p in cap.positions if lo <= p < T]
        else:  # only the window: a step's counts come from the event (a replayed trace's, too)
            span = range(max(lo, int(s.chunk_start)), min(T, int(s.chunk_start) + int(s.num_processed)))
        yield span, cap


def cached_rows(evs: list, lo: int, T: int) -> range:
    """The positions of [lo, T) that came from the prefix cache and no step of this sequence computed: their
    K/V were reused from another request, so they have no attention row. From the event that admitted the
    sequence (SeqEvent.num_cached_tokens); empty without a prefix hit."""
    cached = next((int(s.num_cached_tokens) for s in reversed(evs) if int(s.num_cached_tokens or 0) > 0), 0)
    computed = {p for span, _ in _spans(evs, lo, min(T, cached)) for p in span}
    rows = [p for p in range(lo, min(T, cached)) if p not in computed]
    return range(rows[0], rows[-1] + 1) if rows and rows == list(range(rows[0], rows[-1] + 1)) else range(0)


def _row_reasons(evs: list, lo: int, T: int, filled: list[int]) -> tuple[dict[int, str], int | None]:
    """Why each computed position of [lo, T) without a row has none: "over" (the per-step budget, engine
    Capture.max_attention_bytes), "freed" (freed later to save memory), "uncaptured" (its step captured nothing
    for this sequence: another one was in focus, or a busy room captured other tabs first, app/room.py); and the
    budget in force. Prefix-cache rows were never computed: cached_rows marks them."""
    latest: dict[int, object] = {}  # position -> the capture of the latest step that computed it
    for span, cap in _spans(evs, lo, T):
        for p in span:
            latest[p] = cap if cap is not None else False
    have = set(filled)
    out: dict[int, str] = {}
    budget = None
    kept_rows: dict[int, set[int]] = {}
    for p, cap in latest.items():
        if p in have:
            continue
        if cap is False:
            out[p] = "uncaptured"
        elif _dropped(cap, "attention"):
            out[p] = "freed"
        elif getattr(cap, "attention_budget", None) is not None:
            rows = kept_rows.setdefault(id(cap), set(_rows_of(cap)))
            if p not in rows:
                out[p], budget = "over", cap.attention_budget
    return out, budget


def kept_note(evs: list, lo: int, T: int, filled: list[int], lang: str) -> str:
    """The lines saying which positions of [lo, T) show no attention, and why (_row_reasons)."""
    t = tr(lang)
    reasons, budget = _row_reasons(evs, lo, T, filled)
    if not reasons:
        return ""
    counts = {r: sum(1 for v in reasons.values() if v == r) for r in ("over", "freed", "uncaptured")}
    k, total = len([p for p in filled if lo <= p < T]), T - lo
    if k == 0:
        head = t["kept_none"].format(total=count_text(total, lang))
    else:
        key = "kept_last" if [p for p in filled if lo <= p < T] == list(range(T - k, T)) else "kept_some"
        head = t[key].format(k=count_text(k, lang), total=count_text(total, lang))
    why = []
    if counts["over"]:
        why.append(t["over_budget"].format(n=count_text(counts["over"], lang), budget=fmt_bytes(budget, lang)))
    if counts["freed"]:
        why.append(t["freed"].format(n=count_text(counts["freed"], lang)))
    if counts["uncaptured"]:
        why.append(t["uncaptured"].format(n=count_text(counts["uncaptured"], lang)))
    return head + "<br>" + " · ".join(why)


def gap_label(evs: list, lo: int, T: int, filled: list[int], lang: str) -> dict | None:
    """A label inside the longest run of empty rows of the heatmap, when it spans at least a quarter of the
    window: which rows they are and why they are empty, so a mostly blank chart says what it shows."""
    reasons, budget = _row_reasons(evs, lo, T, filled)
    best, run = (0, 0, ""), None
    for p in range(lo, T + 1):
        r = reasons.get(p)
        if run is not None and (r != run[2] or p == T):
            if p - run[0] > best[1] - best[0]:
                best = (run[0], p, run[2])
            run = None
        if r is not None and run is None and p < T:
            run = (p, p, r)
    a, b, why = best
    if b - a < max(2, (T - lo) / 4):
        return None
    t = tr(lang)
    text = t["gap_" + why].format(first=count_text(a, lang), last=count_text(b - 1, lang),
                                   budget=fmt_bytes(budget, lang) if budget else "")
    return dict(text=wrap_title(text, IN_PLOT_CHARS)[0], xref="paper", x=0.02, xanchor="left", yref="y",
                y=(a + b - 1) / 2 - lo,
                yanchor="middle", showarrow=False, align="left", font=dict(size=11, color="#444"),
                bgcolor="rgba(255,255,255,0.85)")


def _only_uncaptured(evs: list, lo: int, T: int) -> bool:
    """No position of [lo, T) was computed by a step that captured this sequence (nothing to say of budgets)."""
    return all(cap is None for span, cap in _spans(evs, lo, T) if len(span))


def _with_note(title: str, note: str) -> tuple[str, int]:
    """The title with the note as small subtitle lines, and the top margin the lines add."""
    if not note:
        return title, 0
    return title + SUBTITLE.format(note), SUBTITLE_PX * (note.count("<br>") + 1)


def _head_index(cap, head: int, num_rows: int) -> int | None:
    heads = cap.attention_heads
    if heads is None:
        return head if 0 <= head < num_rows else None
    heads = list(heads)
    return heads.index(head) if head in heads else None


def _assemble(events, seq_id: int, layer: int, heads: list[int], max_positions: int | None):
    """Attention matrices of `heads` for positions [lo, T): (array [len(heads), n, n], lo, T, filled).

    Row p holds the weights of query p over keys lo..T-1 (zeros after p); rows never captured are NaN.
    """
    evs = seq_events(events, seq_id)
    T = context_len(evs)
    lo = 0 if max_positions is None else max(0, T - int(max_positions))
    n = T - lo
    out = np.full((len(heads), n, n), np.nan)
    filled: set[int] = set()
    for s in evs:
        cap = s.capture
        if cap is None or layer not in (cap.attention or {}) or not cap.positions:
            continue
        block = cap.attention[layer]
        rows = [(i, p) for i, p in enumerate(_rows_of(cap)) if lo <= p < T]
        if not rows:
            continue
        i0, i1 = rows[0][0], rows[-1][0] + 1
        idx = [_head_index(cap, h, block.shape[0]) for h in heads]
        have = [k for k, hi in enumerate(idx) if hi is not None]
        if not have:
            continue
        sub = to_np(block[[idx[k] for k in have]][:, i0:i1, lo:])  # [heads, rows, keys from lo]
        for i, p in rows:
            r = i - i0
            width = p + 1 - lo
            for j, k in enumerate(have):
                out[k, p - lo, :] = 0.0
                out[k, p - lo, :width] = sub[j, r, :width]
            filled.add(p)
    return out, lo, T, sorted(filled)


def attention_matrix(events, seq_id: int, layer: int, head: int) -> tuple[np.ndarray, list[int]]:
    """The causal attention matrix [T, T] of one head for positions 0..T-1, and the positions captured.

    Row p: the weights of query p over keys 0..p (entries after p are 0). Each position keeps the row of the
    latest step that computed it; a position no captured step computed (capture off, prefix-cache hit) is a
    NaN row. T is the context computed so far (end of the latest step's chunk for this sequence).
    """
    mats, _, _, filled = _assemble(events, seq_id, layer, [head], None)
    return mats[0], filled


def _round(a: np.ndarray, digits: int = 4) -> np.ndarray:
    return np.round(a, digits)


def _upper_to_nan(m: np.ndarray) -> np.ndarray:
    """Keys after the query are not visible to it: blank them (no colour, no hover) instead of 0."""
    m = m.copy()
    n = m.shape[-1]
    m[..., np.triu(np.ones((n, n), dtype=bool), k=1)] = np.nan
    return m


def attention_heatmap(events, seq_id: int, layer: int, head: int, texts: list[str] | None, lang: str = "en",
                      max_positions: int = MAX_POSITIONS) -> dict:
    """Heatmap of one head: query tokens on y (top to bottom), key tokens on x; the newest row outlined."""
    t = tr(lang)
    title = t["attn_title"].format(layer=layer, head=head)
    uirev = "attention-heatmap"
    mats, lo, T, filled = _assemble(events, seq_id, layer, [head], max_positions)
    if T == 0:
        return empty(title, t["attn_empty"], uirev)
    evs = seq_events(events, seq_id)
    note = kept_note(evs, lo, T, filled, lang)
    if not filled:
        return empty(title, _no_rows_message(evs, lo, T, note, layer, head, lang), uirev)
    n = T - lo
    if lo > 0:
        title += t["window"].format(n=count_text(n, lang), total=count_text(T, lang))
    title, extra = _with_note(title, note)
    labels = [pos_label(p, texts) for p in range(lo, T)]
    z = _round(_upper_to_nan(mats[0]))
    trace = dict(
        type="heatmap", z=z, x=labels, y=labels, colorscale=ATTN_COLORSCALE, zmin=0.0, zmax=1.0,
        hoverongaps=False, xgap=0, ygap=0,
        colorbar=dict(title=dict(text=t["weight"]), thickness=12),
        hovertemplate=f"{t['query']} %{{y}} → {t['key']} %{{x}}<br>{t['weight']}: %{{z:.4f}}<extra></extra>",
    )
    shapes = [dict(type="rect", xref="x", yref="y", x0=-0.5, x1=n - 0.5, y0=n - 1.5, y1=n - 0.5,
                   line=dict(color=ACCENT, width=2), fillcolor="rgba(0,0,0,0)")]
    band, notes = cached_band(cached_rows(evs, lo, T), lo, n, labels, lang)
    gap = gap_label(evs, lo, T, filled, lang)
    notes += [gap] if gap else []
    traces = [band, trace] if band else [trace]
    shapes += band.pop("shapes") if band else []
    room = label_px(9, POS_LABEL_CHARS)  # fixed margins: see common.LABEL_CHARS
    lay = layout(title, uirev,
                 xaxis=dict(title=dict(text=t["x_key"]), type="category", tickfont=dict(size=9), tickangle=-90,
                            showgrid=False),
                 # the first query on top, by an explicit range: autorange "reversed" is lost when Plotly.react
                 # draws this over this chart's own placeholder (same uirevision), turning the triangle over
                 yaxis=dict(title=dict(text=t["y_query"]), type="category", autorange=False, range=[n - 0.5, -0.5],
                            tickfont=dict(size=9), showgrid=False),
                 margin=dict(l=room + 30, r=20, t=40 + extra, b=room + 34), shapes=shapes, annotations=notes,
                 height=room + 480 + extra)  # a plot area of about 400 px once the label margins are taken
    return figure(traces, lay)


CACHED_FILL = "#d9d9d9"  # the prefix-cache band: grey, no weight on the Blues scale looks like it


def cached_band(rows: range, lo: int, n: int, labels: list[str], lang: str) -> tuple[dict | None, list[dict]]:
    """The prefix-cache rows of the heatmap (positions `rows`, window starting at `lo`, n wide) as a grey
    heatmap under the weights, whose hover says why they are empty, with a dashed frame (its "shapes") and a
    label in the empty upper triangle beside them; (None, []) without such rows."""
    if not len(rows):
        return None, []
    t = tr(lang)
    top, bottom = rows[0] - lo, rows[-1] - lo
    z = np.full((n, n), np.nan)
    for r in range(top, bottom + 1):
        z[r, :r + 1] = 1.0
    first, last = count_text(rows[0], lang), count_text(rows[-1], lang)
    hover = t["cached_hover"].format(first=first, last=last)
    band = dict(type="heatmap", z=z, x=labels, y=labels, colorscale=[[0, CACHED_FILL], [1, CACHED_FILL]],
                zmin=0, zmax=1, showscale=False, hoverongaps=False, name=t["cached_name"],
                hovertemplate=f"{t['query']} %{{y}}<br>{hover}<extra></extra>",
                shapes=[dict(type="rect", xref="x", yref="y", x0=-0.5, x1=n - 0.5, y0=top - 0.5, y1=bottom + 0.5,
                             line=dict(color="#777", width=1, dash="dot"), fillcolor="rgba(0,0,0,0)")])
    label = dict(text=wrap_title(t["cached_label"].format(first=first, last=last), IN_PLOT_CHARS)[0],
                 # the top right corner of the band: the causal triangle leaves it empty, however tall the band
                 xref="paper", x=0.98, xanchor="right", yref="y", y=top - 0.5, yanchor="top", showarrow=False,
                 align="right",
                 font=dict(size=11, color="#444"), bgcolor="rgba(255,255,255,0.85)", hovertext=hover)
    return band, [label]


def _no_rows_message(evs: list, lo: int, T: int, note: str, layer: int, head, lang: str) -> str:
    """What an attention chart with no row to draw says instead."""
    t = tr(lang)
    if note and _only_uncaptured(evs, lo, T):
        return t["not_captured"]
    if note:
        return t["not_kept"].format(layer=layer)
    return t["attn_no_layer"].format(layer=layer, head=head)


def _latest_heads(events, seq_id: int, layer: int) -> list[int]:
    for s in reversed(seq_events(events, seq_id)):
        cap = s.capture
        if cap is not None and layer in (cap.attention or {}):
            if cap.attention_heads is not None:
                return [int(h) for h in cap.attention_heads]
            return list(range(int(cap.attention[layer].shape[0])))
    return []


# The small multiples are one heatmap: the heads' matrices side by side in one grid, a few empty cells between
# them. Nine heatmaps with nine pairs of axes cost the browser ~17 ms more to redraw after every step.
GRID_GAP_COLS, GRID_GAP_ROWS = 2, 4  # the row gap leaves room for the "head k" label above a block


def _grid_labels(labels: list[str], blocks: int, gap: int) -> list[str]:
    """Category labels along one side of the grid: each block repeats the positions' labels, made distinct
    by zero-width spaces (invisible in hovers), and each gap cell gets a distinct invisible label."""
    out = []
    for b in range(blocks):
        out += [lab + "\u200b" * b for lab in labels]
        if b < blocks - 1:
            out += ["\u200c" * (b * gap + i + 1) for i in range(gap)]
    return out


def attention_heads_grid(events, seq_id: int, layer: int, texts: list[str] | None, lang: str = "en",
                         max_positions: int = GRID_MAX_POSITIONS) -> dict:
    """Small multiples: every captured head of `layer` as a block of one heatmap, one shared colour bar."""
    t = tr(lang)
    title = t["grid_title"].format(layer=layer)
    uirev = "attention-grid"
    heads = _latest_heads(events, seq_id, layer)
    evs = seq_events(events, seq_id)
    if not heads:
        T = context_len(evs)
        lo = 0 if max_positions is None else max(0, T - int(max_positions))
        msg = t["attn_empty"] if not evs else _no_rows_message(evs, lo, T, kept_note(evs, lo, T, [], lang),
                                                                 layer, "*", lang)
        return empty(title, msg, uirev)
    mats, lo, T, filled = _assemble(events, seq_id, layer, heads, max_positions)
    n = T - lo
    if lo > 0:
        title += t["window"].format(n=count_text(n, lang), total=count_text(T, lang))
    note = kept_note(evs, lo, T, filled, lang)
    cached = cached_rows(evs, lo, T)
    if len(cached):  # the grid's cells are too small for a label: its subtitle says it
        cached_note = t["cached_note"].format(first=count_text(cached[0], lang), last=count_text(cached[-1], lang))
        note = f"{note}<br>{cached_note}" if note else cached_note
    title, extra = _with_note(title, note)
    labels = [pos_label(p, texts) for p in range(lo, T)]
    ncols = max(1, math.ceil(math.sqrt(len(heads))))
    nrows = math.ceil(len(heads) / ncols)
    width, height = ncols * n + (ncols - 1) * GRID_GAP_COLS, nrows * n + (nrows - 1) * GRID_GAP_ROWS
    z = np.full((height, width), np.nan)
    blocks = _round(_upper_to_nan(mats))
    notes = []
    for k, head in enumerate(heads):
        r, c = divmod(k, ncols)
        top, left = r * (n + GRID_GAP_ROWS), c * (n + GRID_GAP_COLS)
        z[top:top + n, left:left + n] = blocks[k]
        notes.append(dict(text=f"{t['head']} {head}", x=(left + n / 2) / width, y=1.0 - top / height,
                          xref="paper", yref="paper", xanchor="center", yanchor="bottom", showarrow=False,
                          font=dict(size=10)))
    trace = dict(type="heatmap", z=z, x=_grid_labels(labels, ncols, GRID_GAP_COLS),
                 y=_grid_labels(labels, nrows, GRID_GAP_ROWS), coloraxis="coloraxis", hoverongaps=False,
                 hovertemplate=f"%{{y}} → %{{x}}: %{{z:.3f}}<extra>{t['layer']} {layer}</extra>")
    hidden = dict(type="category", showticklabels=False, ticks="", showgrid=False, zeroline=False)
    lay = layout(title, uirev, annotations=notes, height=max(320, 150 * nrows + 70) + extra,
                 coloraxis=dict(colorscale=ATTN_COLORSCALE, cmin=0.0, cmax=1.0,
                                colorbar=dict(title=dict(text=t["weight"]), thickness=10)),
                 xaxis=hidden, yaxis=dict(hidden, autorange=False, range=[height - 0.5, -0.5]),  # see attention_heatmap
                 margin=dict(l=20, r=20, t=50 + extra, b=20))
    return figure([trace], lay)


def _entropy_bits(p: np.ndarray) -> float:
    p = p[np.isfinite(p) & (p > 0)]
    return float(-(p * np.log2(p)).sum()) if p.size else 0.0


def head_entropy_chart(events, seq_id: int, lang: str = "en") -> dict:
    """Layers × heads heatmap of the attention entropy (bits) of the newest captured query row."""
    t = tr(lang)
    uirev = "head-entropy"
    latest = None
    evs = seq_events(events, seq_id)
    for s in evs:
        if s.capture is not None and s.capture.attention and _rows_of(s.capture):
            latest = s
    T = context_len(evs)
    if latest is None:
        if evs and kept_note(evs, 0, T, [], lang):  # computed, but no row was captured or kept
            return empty(t["entropy_name"], t["not_captured"] if _only_uncaptured(evs, 0, T)
                         else t["not_kept_any"], uirev)
        return empty(t["entropy_name"], t["entropy_empty"], uirev)
    cap = latest.capture
    pos = int(_rows_of(cap)[-1])  # the newest row kept: under a capture budget, the step's last rows
    ctx = pos + 1
    layers = sorted(cap.attention)
    num_heads = int(cap.attention[layers[0]].shape[0])
    heads = list(cap.attention_heads) if cap.attention_heads is not None else list(range(num_heads))
    z = np.full((len(layers), len(heads)), np.nan)
    for li, layer in enumerate(layers):
        rows = to_np(cap.attention[layer][:, -1, :ctx])  # [heads, ctx]
        for hi in range(min(len(heads), rows.shape[0])):
            z[li, hi] = _entropy_bits(rows[hi])
    max_bits = math.log2(ctx) if ctx > 1 else 0.0
    trace = dict(type="heatmap", z=_round(z, 4), x=heads, y=layers, colorscale="Viridis", zmin=0.0,
                 zmax=max(max_bits, 1e-6), colorbar=dict(title=dict(text=t["bits"]), thickness=12),
                 hovertemplate=f"{t['layer']} %{{y}}, {t['head']} %{{x}}<br>%{{z:.2f}} {t['bits']}<extra></extra>")
    if z.size <= 160:  # small models: a number per cell; beyond that the cells are too small to read (hover)
        trace.update(texttemplate="%{z:.1f}", textfont=dict(size=9))
    title = t["entropy_title"].format(pos=pos, ctx=ctx, max=max_bits)
    newer = kept_note(evs, pos + 1, T, [], lang) and T - 1 - pos  # newer positions computed, rows not kept
    title, extra = _with_note(title, t["entropy_older"].format(n=count_text(newer, lang)) if newer else "")
    lay = layout(title, uirev, margin=dict(l=50, r=20, t=60 + extra, b=40),
                 xaxis=dict(title=dict(text=t["x_head"]), dtick=1, showgrid=False),
                 yaxis=dict(title=dict(text=t["y_layer"]), showgrid=False))
    return figure([trace], lay)


def lens_columns(events, seq_id: int) -> dict[int, tuple[np.ndarray, list[list[str]]]]:
    """Logit-lens columns by position, the latest step winning: {pos: (probs [layers, k], tokens [layers][k])}."""
    evs = seq_events(events, seq_id)
    T = context_len(evs)
    cols: dict[int, tuple[np.ndarray, list[list[str]]]] = {}
    for s in evs:
        cap = s.capture
        if cap is None or not cap.lens_positions or cap.lens_probs is None or cap.lens_tokens is None:
            continue
        probs = to_np(cap.lens_probs)  # [layers, positions, k]
        for j, p in enumerate(cap.lens_positions):
            cols[int(p)] = (probs[:, j, :], [layer[j] for layer in cap.lens_tokens])
    return {p: v for p, v in cols.items() if p < T}


def _lens_freed(events, seq_id: int, cols: dict) -> list[int]:
    """Positions whose logit lens was freed after its step (SeqEvent.drop_capture) and not recomputed since."""
    evs = seq_events(events, seq_id)
    T = context_len(evs)
    out = {int(p) for s in evs if s.capture is not None and _dropped(s.capture, "lens")
           for p in s.capture.lens_positions}
    return sorted(p for p in out if p < T and p not in cols)


def logit_lens_chart(events, seq_id: int, lang: str = "en", texts: list[str] | None = None,
                     max_positions: int = LENS_MAX_POSITIONS) -> dict:
    """Layers (y, 0 at the bottom) × positions (x): colour = top-1 probability of the lens at that layer,
    cell text = the top-1 token where it differs from the layer below, and always in the last layer (the
    model's own prediction); hover lists the top-k everywhere. `texts` (optional) labels the input tokens.

    Writing only the changes shows where in depth a prediction appears, and it halves the text the browser
    lays out on every step (480 labels were most of this chart's drawing time, bench/ui_latency.py)."""
    t = tr(lang)
    uirev = "logit-lens"
    cols = lens_columns(events, seq_id)
    freed = _lens_freed(events, seq_id, cols)
    if not cols:
        return empty(t["lens_title"], t["lens_freed"].format(n=count_text(len(freed), lang)) if freed
                     else t["lens_empty"], uirev)
    positions = sorted(cols)[-int(max_positions):]
    freed = [p for p in freed if p > positions[0]]  # gaps inside the window, or newer than it
    num_layers = min(cols[p][0].shape[0] for p in positions)
    z = np.zeros((num_layers, len(positions)))
    text = [[""] * len(positions) for _ in range(num_layers)]
    hover = [[""] * len(positions) for _ in range(num_layers)]
    for j, p in enumerate(positions):
        probs, toks = cols[p]
        nxt = ""
        if texts is not None and 0 <= p + 1 < len(texts):
            nxt = f"<br>{t['next']}: {plain(texts[p + 1])}"
        for layer in range(num_layers):
            z[layer, j] = probs[layer, 0]
            changed = layer == 0 or layer == num_layers - 1 or toks[layer][0] != toks[layer - 1][0]
            text[layer][j] = plain(toks[layer][0]) if changed else ""
            top = "<br>".join(f"{plain(tok)}  {pr:.3f}" for tok, pr in zip(toks[layer], probs[layer]))
            hover[layer][j] = top + nxt
    labels = [pos_label(p, texts) for p in positions]
    trace = dict(type="heatmap", z=_round(z, 5), x=labels, y=list(range(num_layers)), text=text, customdata=hover,
                 texttemplate="%{text}", textfont=dict(size=9), colorscale="YlGnBu", zmin=0.0, zmax=1.0,
                 colorbar=dict(title=dict(text=t["top1"]), thickness=12), xgap=1, ygap=1,
                 hovertemplate=f"{t['layer']} %{{y}} · {t['position']} %{{x}}<br>%{{customdata}}<extra></extra>")
    title, extra = _with_note(t["lens_title"], t["lens_freed"].format(n=count_text(len(freed), lang))
                              if freed else "")
    lay = layout(title, uirev,
                 xaxis=dict(title=dict(text=t["x_position"]), type="category", tickfont=dict(size=9), tickangle=-45,
                            showgrid=False),
                 yaxis=dict(title=dict(text=t["y_lens_layer"]), showgrid=False),
                 margin=dict(l=50, r=20, t=40 + extra, b=rotated_px(9, POS_LABEL_CHARS, 45) + 34),
                 height=max(360, 14 * num_layers + 120) + extra)
    return figure([trace], lay)
