"""Shared look and helpers for chart functions."""
from __future__ import annotations

import html
import math
import re
import textwrap
from typing import Any

import numpy as np

from ..i18n import t

# One colour per sequence id, reused by every chart that distinguishes sequences (KV grid, timeline, ...).
SEQ_COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D",
              "#BAB0AC", "#EECA3B"]
GREY = "#C8C8C8"
FREE = "#EEEEEE"
ACCENT = "#D62728"


def seq_color(seq_id: int) -> str:
    return SEQ_COLORS[int(seq_id) % len(SEQ_COLORS)]


def rank_shown(ahead: int) -> int:
    """A token's rank as a reader counts it, 1 for the most likely, from the engine's count of the tokens ahead
    of it (SamplingTrace.chosen_rank, LogitStats.token_rank: 0 for the top token)."""
    return int(ahead) + 1


def to_np(x: Any) -> np.ndarray:
    """Tensor, list or array -> float numpy array (None -> nan)."""
    if x is None:
        return np.zeros(0)
    if hasattr(x, "detach"):
        return x.detach().cpu().float().numpy()
    flat = isinstance(x, list) and x and not isinstance(x[0], list)
    return np.asarray([np.nan if v is None else v for v in x] if flat else x, dtype=float)


def clean(v: Any) -> Any:
    """Make a value JSON-safe for the browser: numpy -> lists, non-finite floats -> None.

    Figures hold thousands of numbers (heatmaps), and this runs on every step's critical path: arrays are
    converted whole, and list items that are already plain skip the recursive call."""
    if isinstance(v, np.ndarray):
        if v.dtype.kind == "f":
            finite = np.isfinite(v)
            if finite.all():
                return v.tolist()
            out = v.astype(object)
            out[~finite] = None
            return out.tolist()
        if v.dtype.kind in "iub":
            return v.tolist()
        return clean(v.tolist())
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            t = type(x)
            if t is float:
                out.append(x if math.isfinite(x) else None)
            elif t is str or t is int or t is bool or x is None:
                out.append(x)
            else:
                out.append(clean(x))
        return out
    return v


# Plotly's default for numeric axes and colour bars, ticklabeloverflow "hide past div", measures every tick
# label after drawing it (a getBoundingClientRect, each forcing a layout of the page) to hide the labels that
# cross the figure's edge: about a third of a step's drawing time in the browser (a CPU profile of
# bench/ui_latency.py). Our margins are sized for the labels, so the labels are drawn as they are.
_ALLOW = {"ticklabeloverflow": "allow"}
TEMPLATE = {"layout": {"xaxis": _ALLOW, "yaxis": _ALLOW, "coloraxis": {"colorbar": _ALLOW}},
            "data": {"heatmap": [{"colorbar": _ALLOW}]}}


# A title is one line of text that Plotly neither wraps nor measures against the chart's width: a long one ran
# off the chart or under its legend. Titles are wrapped here, at a fixed number of characters that fits the
# narrowest chart static/lab.css lays out (~410 px; a chart that spans its panel: ~700 px), and the top margin
# grows by a line for each line added; the title sits at the top of the figure, so what a chart draws above
# its plot area (legend keys, stage headers) keeps the room the chart gave it below the title.
TITLE_CHARS = 46
WIDE_TITLE_CHARS = 76
WIDE_CHARTS = frozenset({"chart-bytes", "chart-heads", "chart-lens", "chart-detok", "chart-kv-pool",
                         "chart-latency", "chart-room-batch", "chart-room-pool", "chart-calc-spec"})
TITLE_TOP = 5  # px above the title's first line
TITLE_LINE = 18  # px a line of the 14 px title takes
# Plotly sets a one-line title's first baseline 0.7 em below its anchor, and a title of several lines' first
# baseline at the anchor: the anchor moves down by as much, so both start TITLE_TOP px from the top
_CAP_SHIFT = {False: 3, True: 13}
_NOT_IN_TAG = re.compile(r" (?![^<]*>)")  # a space outside "<...>" (Plotly's pseudo-HTML tags hold spaces)
_TAG = re.compile(r"<[^>]*>")


def _visible_len(text: str) -> int:
    return len(html.unescape(_TAG.sub("", text)))


def wrap_title(title: str, chars: int = TITLE_CHARS) -> tuple[str, int]:
    """The title broken into lines of at most `chars` visible characters, at spaces (a <sub> line, drawn
    smaller, holds more); and how many lines the wrapping added."""
    lines, added = [], 0
    for part in (title or "").split("<br>"):
        small = part.lstrip().startswith(("<sub>", "<span style='font-size:1"))  # a line of 10-12 px text
        budget = int(chars * 1.3) if small else chars
        line = ""
        for word in _NOT_IN_TAG.split(part):
            if line and _visible_len(line) + 1 + _visible_len(word) > budget:
                lines.append(line)
                line, added = word, added + 1
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "<br>".join(lines), added


def layout(title: str, uirevision: str, **extra) -> dict:
    """A compact layout. `uirevision` stays constant for a chart so Plotly.react keeps the user's zoom/pan.
    The title is wrapped to the chart's width (see TITLE_CHARS) and pinned to the figure's top."""
    text, added = wrap_title(title, WIDE_TITLE_CHARS if uirevision in WIDE_CHARTS else TITLE_CHARS)
    base = dict(
        title=dict(text=text, font=dict(size=14), x=0.01, xanchor="left", yref="container", y=1, yanchor="top",
                   pad=dict(t=_CAP_SHIFT["<br>" in text] + TITLE_TOP)),
        margin=dict(l=50, r=20, t=44, b=40),
        uirevision=uirevision,
        hovermode="closest",
        paper_bgcolor="white",
        plot_bgcolor="white",
        font=dict(family="Inter, system-ui, sans-serif", size=12),
        showlegend=False,
    )
    base.update(extra)
    if added:  # the plot area keeps its height
        base["margin"] = {**base["margin"], "t": base["margin"].get("t", 44) + added * TITLE_LINE}
        if base.get("height"):
            base["height"] += added * TITLE_LINE
    return base


def figure(data: list[dict], layout_: dict) -> dict:
    # the template reaches every axis and colour bar, also those the figure does not name
    return clean({"data": data, "layout": titles_at_margin({**layout_, "template": TEMPLATE})})


# Plotly moves an axis title clear of its tick labels by measuring every label on every draw (each a forced
# layout of the page), and it keys a label's cached size to the label's position: a step that adds a row or
# changes the tokens has all its labels measured afresh. That cost 15-35 ms of a step's drawing in views of
# 4-5 charts (A/B in bench/ui_latency.py's setting). Our margins are fixed and hold the labels and the title,
# so a title is written as an annotation at the outer edge of its margin instead: measured once, then cached.
_PLOTLY_MARGIN = {"l": 80, "r": 80, "t": 100, "b": 80}
AXIS_TITLE_FONT = {"size": 12, "color": "#444"}


def _domain_starts(lay: dict, axis: str, end: int) -> bool:
    """Whether layout axis `axis` (e.g. "yaxis2") spans to the plot area's edge (end 0: start, 1: end)."""
    domain = (lay.get(axis) or {}).get("domain") or [0, 1]
    return float(domain[end]) == float(end)


def titles_at_margin(lay: dict) -> dict:
    """Axis titles -> annotations at the margin's outer edge, named "axis-title:<axis>" (see above).

    An axis that does not sit on the plot area's edge (a subplot in the middle), or whose margin Plotly sizes
    (automargin), keeps Plotly's title."""
    margin = {**_PLOTLY_MARGIN, **(lay.get("margin") or {})}
    notes = list(lay.get("annotations") or [])
    for key in sorted(k for k in lay if k[1:5] == "axis" and k[0] in "xy" and (k[5:] == "" or k[5:].isdigit())):
        axis = dict(lay[key])
        title = axis.get("title")
        text = title.get("text") if isinstance(title, dict) else title
        if not text or axis.get("automargin"):  # a margin Plotly sizes to the labels: its edge moves
            continue
        num = key[5:]
        anchor = axis.get("anchor") or ("y" if key[0] == "x" else "x") + num
        counter = anchor[0] + "axis" + anchor[1:]
        font = {**AXIS_TITLE_FONT, **((title.get("font") or {}) if isinstance(title, dict) else {})}
        note = dict(text=text, name="axis-title:" + key, showarrow=False, font=font)
        if key[0] == "x" and axis.get("side", "bottom") == "bottom" and _domain_starts(lay, counter, 0):
            note.update(xref=f"x{num} domain", x=0.5, xanchor="center",
                        yref="paper", y=0, yanchor="bottom", yshift=-margin["b"] + 2)
        elif key[0] == "y" and axis.get("side", "left") == "left" and \
                (axis.get("overlaying") or _domain_starts(lay, counter, 0)):
            note.update(yref=f"y{num} domain", y=0.5, yanchor="middle", textangle=-90,
                        xref="paper", x=0, xanchor="left", xshift=-margin["l"] + 2)
        elif key[0] == "y" and axis.get("side") == "right" and \
                (axis.get("overlaying") or _domain_starts(lay, counter, 1)):
            note.update(yref=f"y{num} domain", y=0.5, yanchor="middle", textangle=-90,
                        xref="paper", x=1, xanchor="right", xshift=margin["r"] - 2)
        else:
            continue
        axis["title"] = {"text": ""}
        lay[key] = axis
        notes.append(note)
    if notes:
        lay["annotations"] = notes
    return lay


# A legend is redrawn and laid out with its chart on every step (10-18 ms a chart in the browser, A/B in
# bench/ui_latency.py's setting); a key written as one annotation is measured once, then cached. Charts that
# redraw on every step use a key; the key cannot hide a trace on click, as a legend can.
BAR, LINE, DOTS = "■", "━", "┈"


def legend_key(rows: list[list[tuple[str, str, str]]], **place) -> dict:
    """A static legend: an annotation of (mark, colour, name) items, one line per row. `place` overrides the
    position (default: above the plot area's right end)."""
    text = "<br>".join("   ".join(f"<span style='color:{colour}'>{mark}</span> {html.escape(name, quote=False)}"
                                   for mark, colour, name in row) for row in rows)
    return {"text": text, "name": "legend-key", "showarrow": False, "xref": "paper", "yref": "paper",
            "x": 1, "y": 1, "xanchor": "right", "yanchor": "bottom", "align": "right",
            "font": {"size": 11, "color": "#333"}, **place}


KEY_ROW = 15  # px a row of a key takes (11 px text)
KEY_CHARS = 56  # characters of a key's row in the narrowest chart (~6.5 px each at 11 px, see TITLE_CHARS)
ABOVE_PLOT = 28  # px from the figure's top to what a chart draws above its plot area, under a one-line title


def key_rows(items: list[tuple[str, str, str]], chars: int = KEY_CHARS) -> list[list[tuple[str, str, str]]]:
    """A key's (mark, colour, name) items packed into rows of at most `chars` characters, in order (a row
    that long still fits the narrowest chart, so a key never runs off it or under its title)."""
    rows, row, used = [], [], 0
    for item in items:
        n = len(item[2]) + 5  # the mark and the gap before the next item
        if row and used + n > chars:
            rows.append(row)
            row, used = [], 0
        row.append(item)
        used += n
    return rows + [row] if row else rows


def axis_title(fig: dict, axis: str) -> str:
    """The title text of layout axis `axis` ("xaxis", "yaxis2"), wherever titles_at_margin put it."""
    for note in fig["layout"].get("annotations") or []:
        if note.get("name") == "axis-title:" + axis:
            return note["text"]
    title = (fig["layout"].get(axis) or {}).get("title") or {}
    return title.get("text", "") if isinstance(title, dict) else title


EMPTY_LINE_CHARS = 48  # a placeholder message's line: half-width panels cut a longer one off (annotations do not wrap)


def empty(title: str, message: str, uirevision: str) -> dict:
    """A placeholder figure with a centred message (e.g. 'Step the engine to see attention'), broken into
    lines of at most EMPTY_LINE_CHARS characters."""
    text = "<br>".join(textwrap.wrap(message, EMPTY_LINE_CHARS)) or message
    return figure([], layout(title, uirevision, xaxis=dict(visible=False), yaxis=dict(visible=False),
                             annotations=[dict(text=text, showarrow=False, x=0.5, y=0.5, xref="paper",
                                               yref="paper", font=dict(size=13, color="#777"))]))


# Token tick labels are cut to LABEL_CHARS characters, and the margins around them are fixed to fit that
# many. With Plotly's automargin the widest token of the step set the margin; it changed on most steps, and
# each change made Plotly draw the whole chart a second time (a third of a step's drawing time in the
# browser, bench/ui_latency.py) and moved the plot sideways under the reader's eyes. Hovers keep the full text.
LABEL_CHARS = 14


def shorten(text: str, max_chars: int = LABEL_CHARS) -> str:
    """Cut a label to max_chars characters, the last one an ellipsis (before any HTML escaping)."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def label_px(font_size: float, chars: int = LABEL_CHARS) -> int:
    """The width a label of `chars` characters takes at `font_size` px (a generous mean glyph width: most
    tokens are lower-case Latin or Cyrillic, narrower than this)."""
    return int(math.ceil(chars * font_size * 0.6))


def rotated_px(font_size: float, chars: int, angle_deg: float) -> int:
    """The height a label of `chars` characters takes when its axis turns it by angle_deg."""
    a = math.radians(abs(angle_deg))
    return int(math.ceil(label_px(font_size, chars) * math.sin(a) + font_size * 1.2 * math.cos(a)))


def column_widths(header: list[str], cols: list[list]) -> list[float]:
    """A Plotly table's columnwidth: each column's share of the table's width by what it must hold, its
    header's longest word and its values' (Plotly wraps a cell at spaces, never inside a word, and clips the
    rest: fixed shares cut "format" to "forma" and "B/weight" to "B/weigh"), in characters, plus padding."""
    def words(text) -> list[int]:
        return [len(w) for w in html.unescape(_TAG.sub(" ", str(text))).split()] or [0]

    # a header is bold (wider glyphs); a value of several words wraps, so it asks for its longest word and a
    # little more (a line of two short words reads better than a column of one-word lines)
    return [max(1.15 * max(words(h)), *(min(sum(words(v)) + len(words(v)) - 1, max(words(v)) + 6) for v in col))
            + 2 for h, col in zip(header, cols)]


# ---- token text and numbers, as every chart and panel shows them ------------------------------------------
# Control characters as Unicode's control pictures (␀ … ␟, ␡); a space, a newline and a tab as the marks
# readers know from editors.
_VISIBLE = {**{c: chr(0x2400 + c) for c in range(32)}, 0x7F: "␡", ord(" "): "␣", ord("\n"): "⏎", ord("\t"): "⇥"}


def token_label(text: str, max_chars: int | None = None) -> str:
    """Token text as the page shows it (unescaped): spaces, newlines, tabs and other control characters made
    visible, an empty token as ∅; cut to max_chars characters for a tick label (see LABEL_CHARS)."""
    label = (text or "").translate(_VISIBLE) or "∅"
    return label if max_chars is None else shorten(label, max_chars)


def markup(text) -> str:
    """Text made safe for Plotly's labels, hovers and table cells (Plotly reads '<...>' as tags in any text)
    and for HTML element content. An HTML attribute's value needs its quotes escaped too: html.escape."""
    return html.escape(str(text), quote=False)


def plain(text: str, max_chars: int | None = None) -> str:
    """The token-label escaper: a token's text as a chart or panel shows it, visible and safe (token_label,
    then markup)."""
    return markup(token_label(text, max_chars))


def fmt_num(x: float, lang: str = "en", sig: int = 3) -> str:
    """A number with `sig` significant digits, no trailing zeros; Russian uses a decimal comma."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        s = "0" if x == 0 else str(x)
    elif abs(x) >= 10 ** sig and float(x).is_integer():
        s = f"{int(round(x)):,}".replace(",", "\u202f" if lang == "ru" else ",")
        return s
    else:
        digits = max(0, sig - 1 - int(math.floor(math.log10(abs(x)))))
        s = f"{x:.{digits}f}"
        if "." in s:
            s = s.rstrip("0").rstrip(".")
    return s.replace(".", ",") if lang == "ru" else s


def fmt_int(n: float, lang: str = "en") -> str:
    """An integer; thousands are grouped from 10 000 up (a thin space in Russian, a comma in English)."""
    n = int(round(n))
    if abs(n) < 10000:
        return str(n)
    return f"{n:,}".replace(",", "\u202f" if lang == "ru" else ",")


def fmt_bytes(b: float, lang: str = "en") -> str:
    """The byte formatter: binary units, as memory is sized. 131072 -> '128 KiB', 1572864 -> '1.5 MiB'
    ('1,5 МиБ')."""
    units = t("byte_units", lang)
    b = float(b)
    i = 0
    while abs(b) >= 1024 and i < len(units) - 1:
        b /= 1024
        i += 1
    return f"{fmt_num(b, lang)} {units[i]}"


def fmt_si(v: float, unit: str = "", lang: str = "en") -> str:
    """Decimal SI prefixes, as rates and operation counts are quoted: fmt_si(3.35e12, "B/s") -> '3.35 TB/s'
    ('3,35 ТБ/с'). unit: a key of i18n's "si_units" ("B", "B/s", "FLOP", "FLOP/s"), or none."""
    name = t("si_units", lang)[unit] if unit else ""
    v = float(v)
    for prefix, d in zip(t("si_prefixes", lang), (1e15, 1e12, 1e9, 1e6, 1e3)):
        if abs(v) >= d:
            return f"{fmt_num(v / d, lang)} {prefix}{name}"
    return f"{fmt_num(v, lang)} {name}".rstrip()
