"""Room panel: one shared engine serves every tab of a room, and each step batches everyone's sequences.

Everything here reads the room's own records (app/room.py makes them; no token text is in them):
`records`, one dict per engine step, oldest first —
    {"step", "t" (wall clock at the step's end), "step_ms",
     "batch": [{"seq_id", "owner", "phase" ("prefill" | "decode" | "verify"), "num_processed", "num_emitted",
                "grammar" (the kind of its structured-output constraint, "" for none)}],
     "admitted" / "preempted": [{"seq_id", "owner"}], "finished": [{"seq_id", "owner", "reason"}],
     "waiting": [{"seq_id", "owner"}] (queue order after the step), "held" (running sequences not in the step),
     "pool": {"num_blocks", "used", "cached", "free", "shared", "hit_tokens", "prompt_tokens", "hit_rate"}};
`blocks`, one entry per KV block of the shared pool now: "" (free), "cached", "shared" or an owner label;
`me`, this tab's own owner label, marked "you" in every chart.

An owner keeps one colour everywhere (owner_color is a function of the label alone), so a projected room
view and each student's own tab agree on who is who. All visible text comes from app/i18n.py.
"""
from __future__ import annotations

import math
import re
import zlib

from ..i18n import UI, t
from .common import BAR, GREY, KEY_CHARS, LINE, SEQ_COLORS, empty, figure, key_rows, layout, legend_key, markup
from .kv_cache import COLS, FREE_COLOR

UIREV_BATCH = "chart-room-batch"
UIREV_POOL = "chart-room-pool"
UIREV_THROUGHPUT = "chart-room-throughput"
UIREV_SIZE = "chart-room-size"

WINDOW_STEPS = 60  # the batch strip shows the last this many steps
ROLL_S = 5.0  # throughput: tokens emitted in the last ROLL_S seconds of wall time, per second
SHOWN_S = 60.0  # the throughput chart's x axis: the last this many seconds (its title names both windows)
LOG_EVENTS = 12  # the event log's length
KEY_OWNERS = 10  # owners named in a chart's key; the rest are counted ("+3 more")

# The palette's grey reads as "cached": owners get the other colours.
OWNER_COLORS = [c for c in SEQ_COLORS if c != "#BAB0AC"]
SHARED_COLOR = "#3A2E5C"  # a block held by sequences of several owners (a common system prompt)
LECTURE_COLOR = "#8C6D31"  # the lecturer's sequences: a colour no tab has
ROOM_COLOR = "#222222"  # the whole room's throughput
ME_LINE = "#111111"  # the outline that marks this tab's own segments
PHASE_OPACITY = {"prefill": 1.0, "decode": 0.45, "verify": 0.8}
PHASE_PATTERN = {"prefill": "", "decode": "", "verify": "/"}
PHASES = ("prefill", "decode", "verify")
HATCH = "▨"

# pool grid colour codes: 0 free, 1 cached, 2 shared, 3 the lecture, CODE_OWNER0 + i: OWNER_COLORS[i]
CODE_FREE, CODE_CACHED, CODE_SHARED, CODE_LECTURE, CODE_OWNER0 = 0, 1, 2, 3, 4
POOL_COLORS = [FREE_COLOR, GREY, SHARED_COLOR, LECTURE_COLOR, *OWNER_COLORS]


def _label_parts(owner: str) -> tuple[str, int | None]:
    """"tab 12" -> ("tab", 12); "lecture" -> ("lecture", None)."""
    m = re.fullmatch(r"(.*?)\s*(\d+)", owner)
    return (m.group(1), int(m.group(2))) if m else (owner, None)


def owner_order(owner: str) -> tuple:
    """Sort key: "tab 2" before "tab 10", tabs before other owners."""
    prefix, num = _label_parts(owner)
    return (prefix != "tab", prefix, -1 if num is None else num)


def owner_index(owner: str) -> int:
    """The owner's palette index: tab n takes colour n - 1 (tabs 1-9 all differ), api client n the palette
    from its end (so the first API clients and the first tabs differ), any other label a stable hash."""
    prefix, num = _label_parts(str(owner))
    if prefix == "tab" and num:
        return (num - 1) % len(OWNER_COLORS)
    if prefix == "api" and num:
        return -num % len(OWNER_COLORS)
    return zlib.crc32(str(owner).encode("utf-8")) % len(OWNER_COLORS)


def owner_code(owner: str) -> int:
    """The owner's pool-grid colour code (the lecture has its own colour, outside the tabs' palette)."""
    return CODE_LECTURE if owner == "lecture" else CODE_OWNER0 + owner_index(owner)


def owner_color(owner: str) -> str:
    return POOL_COLORS[owner_code(owner)]


def owner_name(owner: str, me: str, lang: str, mark: str = "room_you") -> str:
    """The label as a chart shows it, in the page's language: "tab 2" is "вкладка 2" on a Russian page, this
    tab's own is "tab 2 (you)"; a sequence with no owner "—". `mark`: the i18n key of the word for `me`
    ("room_presenter" on a follower's page, whose own tab is not in the room: it shows the presenter's)."""
    if not owner:
        return "—"
    kind, num = _label_parts(owner)
    key = f"room_owner.{kind}"
    name = (t(key, lang) if key in UI else kind) + ("" if num is None else f" {num}")
    return f"{name} ({t(mark, lang)})" if me and owner == me else name


def owners_shown(records, blocks=()) -> set[str]:
    """Every owner a room chart or the event log may name: those in a step's batch, admitted, preempted or
    finished, and those holding blocks. A tab missing from this set sees exactly what `me=""` draws, so tabs
    that took no part share one drawing (app/delivery.py RoomPusher)."""
    out = {str(b or "") for b in blocks or []}
    for rec in records or []:
        for kind in ("batch", "admitted", "preempted", "finished"):
            out.update(str(e.get("owner", "")) for e in rec.get(kind) or [])
    return out


def _note(lang: str, replay: bool) -> str:
    return t("room_replay" if replay else "room_no_steps", lang)


def _key_rows(items: list[tuple[str, str, str]], lang: str, per_row: int = 5) -> list[list[tuple[str, str, str]]]:
    """Key items in rows of `per_row`, at most KEY_OWNERS of them (the rest counted as "+n more")."""
    shown = items[:KEY_OWNERS]
    rows = [shown[i:i + per_row] for i in range(0, len(shown), per_row)]
    if len(items) > KEY_OWNERS:
        rows[-1] = rows[-1] + [("", "#777", t("room_more", lang).format(n=len(items) - KEY_OWNERS))]
    return rows


def _key_below(rows: list[list[tuple[str, str, str]]]) -> tuple[dict, int]:
    """A static key under the x axis's tick labels (the axis title sits at the margin's bottom edge), and the
    bottom margin that holds both."""
    note = legend_key(rows, x=0, xanchor="left", y=0, yanchor="top", yshift=-22, align="left")
    return note, 48 + 16 * len(rows)


def _owners_key(owners, me: str, lang: str, mark: str) -> list[tuple[str, str, str]]:
    return [(BAR, owner_color(o), owner_name(o, me, lang, mark)) for o in sorted(owners, key=owner_order)]


# ---- 1 · the batch strip ----------------------------------------------------------------------------------

def batch_segments(records, me: str = "") -> list[dict]:
    """The segments of the strip over the last WINDOW_STEPS records: one per sequence of each step's batch,
    this tab's first (at the bottom), then by owner and sequence id; `base` is its place in the stack."""
    out = []
    for rec in list(records or [])[-WINDOW_STEPS:]:
        batch = sorted(rec.get("batch") or [], key=lambda b: (str(b.get("owner", "")) != me or not me,
                                                               owner_order(str(b.get("owner", ""))),
                                                               int(b.get("seq_id", 0))))
        for i, b in enumerate(batch):
            out.append({"step": int(rec.get("step", 0)), "base": i, "seq_id": int(b.get("seq_id", 0)),
                        "owner": str(b.get("owner", "")), "phase": str(b.get("phase", "decode")),
                        "num_processed": int(b.get("num_processed", 0) or 0),
                        "num_emitted": int(b.get("num_emitted", 0) or 0), "grammar": str(b.get("grammar") or "")})
    return out


def batch_strip_chart(records, me: str = "", lang: str = "en", replay: bool = False, mark: str = "room_you") -> dict:
    """x = step, one stacked unit segment per sequence in that step (so a bar's height is the batch size),
    coloured by owner; prefill solid, decode faded, speculative verify hatched; this tab's segments outlined.

    One bar trace "batch": x = step, y = 1, base = the segment's place; customdata per segment = [owner as
    shown, seq id, phase (localised), tokens processed, tokens emitted, its constraint's line ("" for none)]."""
    records = list(records or [])
    if not records:
        return empty(t("room_batch", lang), _note(lang, replay), UIREV_BATCH)
    segs = batch_segments(records, me)
    steps = [int(r.get("step", 0)) for r in records[-WINDOW_STEPS:]]
    phase_name = {p: t(f"room_phase_{p}", lang) for p in PHASES}
    data = [dict(
        type="bar", name="batch", x=[s["step"] for s in segs], y=[1] * len(segs), base=[s["base"] for s in segs],
        width=0.8, showlegend=False,
        marker=dict(color=[owner_color(s["owner"]) for s in segs],
                    opacity=[PHASE_OPACITY.get(s["phase"], 1.0) for s in segs],
                    pattern=dict(shape=[PHASE_PATTERN.get(s["phase"], "") for s in segs], fgcolor="#FFFFFF",
                                 size=6, solidity=0.35),
                    line=dict(color=[ME_LINE if me and s["owner"] == me else "#FFFFFF" for s in segs],
                              width=[2 if me and s["owner"] == me else 0.5 for s in segs])),
        customdata=[[markup(owner_name(s["owner"], me, lang, mark)), s["seq_id"],
                     phase_name.get(s["phase"], s["phase"]), s["num_processed"], s["num_emitted"],
                     t("room_constrained", lang).format(kind=s["grammar"]) if s["grammar"] else ""] for s in segs],
        hovertemplate=(f"<b>%{{customdata[0]}}</b> · {t('room_seq', lang)} %{{customdata[1]}}%{{customdata[5]}}"
                       f"<br>%{{customdata[2]}}"
                       f"<br>%{{customdata[3]}} {t('room_processed', lang)} · %{{customdata[4]}} "
                       f"{t('room_emitted', lang)}<br>{t('room_step', lang)} %{{x}}<extra></extra>"))]
    rows = _key_rows(_owners_key({s["owner"] for s in segs}, me, lang, mark), lang)
    rows.append([(BAR, "rgba(85,85,85,1)", phase_name["prefill"]), (BAR, "rgba(85,85,85,0.45)", phase_name["decode"]),
                 (HATCH, "rgba(85,85,85,0.8)", phase_name["verify"])])
    key, bottom = _key_below(rows)
    top = max([s["base"] + 1 for s in segs] or [1])
    lay = layout(t("room_batch_title", lang).format(n=WINDOW_STEPS), UIREV_BATCH, height=260 + 16 * len(rows),
                 barmode="overlay", bargap=0.15, annotations=[key], margin=dict(l=55, r=20, t=40, b=bottom),
                 xaxis=dict(title=dict(text=t("room_step", lang)), range=[min(steps) - 0.5, max(steps) + 0.5],
                            tickformat="d", dtick=1 if max(steps) - min(steps) <= 12 else None, gridcolor="#EEE"),
                 yaxis=dict(title=dict(text=t("room_seqs", lang)), range=[0, top + 0.5], rangemode="tozero",
                            dtick=1 if top <= 12 else None, gridcolor="#EEE"))
    return figure(data, lay)


# ---- 2 · the shared KV pool -------------------------------------------------------------------------------

def pool_code(entry: str) -> int:
    if not entry:
        return CODE_FREE
    if entry == "cached":
        return CODE_CACHED
    if entry == "shared":
        return CODE_SHARED
    return owner_code(entry)


def pool_counts(blocks) -> dict[str, int]:
    """Blocks per entry of `blocks` ("" free, "cached", "shared", owner labels)."""
    out: dict[str, int] = {}
    for b in blocks or []:
        out[str(b or "")] = out.get(str(b or ""), 0) + 1
    return out


def _hit_line(pool: dict, lang: str) -> str:
    rate = pool.get("hit_rate")
    if rate is None or not pool.get("prompt_tokens"):
        return t("room_no_hit", lang)
    return t("room_hit", lang).format(pct=round(100 * float(rate)), hit=int(pool.get("hit_tokens") or 0),
                                      prompt=int(pool.get("prompt_tokens") or 0))


def pool_chart(blocks, records=(), me: str = "", lang: str = "en", replay: bool = False,
               mark: str = "room_you") -> dict:
    """The shared pool as a grid (block id = row * cols + col): owners' colours, shared blocks dark, cached grey,
    free near-white; this tab's blocks carry a dot. The title counts used blocks of the total and gives the
    prefix hit rate of the latest record's pool stats. customdata per cell = [block id, what holds it]."""
    blocks = [str(b or "") for b in blocks or []]
    if not blocks:
        return empty(t("room_pool", lang), _note(lang, replay) if replay or not records else
                     t("room_no_pool", lang), UIREV_POOL)
    n = len(blocks)
    cols = COLS if n <= 8 * COLS else 2 * COLS
    rows = math.ceil(n / cols)
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    cd = [[None] * cols for _ in range(rows)]
    what = {"": t("room_free", lang), "cached": t("room_cached", lang), "shared": t("room_shared", lang)}
    for i, b in enumerate(blocks):
        r, c = divmod(i, cols)
        z[r][c] = pool_code(b)
        text[r][c] = "•" if me and b == me else ""
        cd[r][c] = [i, markup(what.get(b) or owner_name(b, me, lang, mark))]
    num = len(POOL_COLORS)
    heat = dict(type="heatmap", name="blocks", z=z, text=text, texttemplate="%{text}", textfont=dict(size=10),
                customdata=cd, hovertemplate=f"{t('room_block', lang)} %{{customdata[0]}}<br>%{{customdata[1]}}"
                                             f"<extra></extra>",
                colorscale=[[(i + e) / num, c] for i, c in enumerate(POOL_COLORS) for e in (0, 1)],
                zmin=-0.5, zmax=num - 0.5, showscale=False, hoverongaps=False, xgap=1, ygap=1,
                x=list(range(cols)), y=list(range(rows)))
    counts = pool_counts(blocks)
    owners = [o for o in counts if o not in what]
    items = [(BAR, owner_color(o), f"{owner_name(o, me, lang, mark)}: {counts[o]}")
             for o in sorted(owners, key=owner_order)]
    rows_key = _key_rows(items, lang)
    # packed into rows that fit the chart at its narrowest (the three in one row ran off it in Russian)
    rows_key += key_rows([(BAR, SHARED_COLOR, f"{what['shared']}: {counts.get('shared', 0)}"),
                          (BAR, GREY, f"{what['cached']}: {counts.get('cached', 0)}"),
                          (BAR, "#DDDDDD", f"{what['']}: {counts.get('', 0)}")], KEY_CHARS * 3 // 2)
    key = legend_key(rows_key, x=0, xanchor="left", y=0, yanchor="top", yshift=-6, align="left")
    pool = (list(records)[-1].get("pool") or {}) if records else {}
    used = n - counts.get("", 0) - counts.get("cached", 0)
    title = (t("room_pool_title", lang).format(used=used, n=n, cached=counts.get("cached", 0))
             + f"<br><span style='font-size:11px;color:#555'>{markup(_hit_line(pool, lang))}</span>")
    cell = 18 if rows <= 12 else 12
    lay = layout(title, UIREV_POOL, height=cell * rows + 90 + 16 * len(rows_key), annotations=[key],
                 margin=dict(l=90, r=10, t=60, b=16 + 16 * len(rows_key)),
                 xaxis=dict(range=[-0.5, cols - 0.5], visible=False),
                 yaxis=dict(range=[rows - 0.5, -0.5], showgrid=False, zeroline=False, tickmode="array",
                            tickvals=list(range(rows)),
                            ticktext=[f"{r * cols}–{min(n, (r + 1) * cols) - 1}" for r in range(rows)],
                            title=dict(text=t("room_blocks", lang))))
    return figure([heat], lay)


# ---- 3 · throughput --------------------------------------------------------------------------------------

def throughput_series(records, window_s: float = ROLL_S) -> dict:
    """Rolling tokens per second at each record's time: tokens emitted by the records whose t lies in
    (t - window_s, t], divided by window_s (or, in the first seconds, by the time since the first step began).

    Returns {"t": [...], "all": [...], "owners": {owner: [...]}}; a record before any time has passed is left
    out. Where no step ran for longer than the window (the room was idle between Runs), the rate is 0 from the
    window's end to the next step: two points at 0, so a line is not drawn straight across the idle time."""
    records = [r for r in records or [] if isinstance(r.get("t"), (int, float))]
    if not records:
        return {"t": [], "all": [], "owners": {}}
    start = float(records[0]["t"]) - float(records[0].get("step_ms") or 0) / 1e3
    owners = sorted({str(b.get("owner", "")) for r in records for b in r.get("batch") or []}, key=owner_order)
    emitted = [{} for _ in records]
    for e, r in zip(emitted, records):
        for b in r.get("batch") or []:
            o = str(b.get("owner", ""))
            e[o] = e.get(o, 0) + int(b.get("num_emitted", 0) or 0)
    out = {"t": [], "all": [], "owners": {o: [] for o in owners}}
    lo = 0
    window: dict[str, int] = {}
    def point(at: float, total: float, per_owner) -> None:
        out["t"].append(at)
        out["all"].append(total)
        for o in owners:
            out["owners"][o].append(per_owner(o))

    for i, r in enumerate(records):
        now = float(r["t"])
        if out["t"] and now - out["t"][-1] > window_s:  # idle longer than the window: it emptied meanwhile
            for at in (out["t"][-1] + window_s, now):
                point(at, 0.0, lambda o: 0.0)
        for o, k in emitted[i].items():
            window[o] = window.get(o, 0) + k
        while float(records[lo]["t"]) <= now - window_s:
            for o, k in emitted[lo].items():
                window[o] -= k
            lo += 1
        span = min(window_s, now - start)
        if span <= 0:
            continue
        point(now, sum(window.values()) / span, lambda o: window.get(o, 0) / span)
    return out


def throughput_chart(records, me: str = "", lang: str = "en", replay: bool = False, mark: str = "room_you") -> dict:
    """The room's aggregate tok/s (a thick dark line, trace "room") against each owner's (thin lines in the
    owner's colour, this tab's thicker), over the last SHOWN_S seconds of wall time before the latest step: the
    x axis is that window, as the title says, however long the room has run (a lecture's hour squeezed the last
    seconds into a sliver). The point just before the window is kept, so the lines enter at its left edge."""
    series = throughput_series(records)
    if not series["t"]:
        return empty(t("room_tps", lang), _note(lang, replay), UIREV_THROUGHPUT)
    now = series["t"][-1]
    first = max([0] + [i for i, x in enumerate(series["t"]) if x - now < -SHOWN_S])
    series = {"t": series["t"][first:], "all": series["all"][first:],
              "owners": {o: ys[first:] for o, ys in series["owners"].items()}}
    xs = [x - now for x in series["t"]]
    hover = f"%{{y:.1f}} {t('room_tok_s', lang)}<extra>%{{fullData.name}}</extra>"
    data = [dict(type="scatter", mode="lines", name=markup(t("room_all", lang)), x=xs, y=series["all"],
                 line=dict(color=ROOM_COLOR, width=3), hovertemplate=hover, meta="room")]
    for o, ys in series["owners"].items():
        data.append(dict(type="scatter", mode="lines", name=markup(owner_name(o, me, lang, mark)), x=xs, y=ys, meta=o,
                         line=dict(color=owner_color(o), width=3.5 if me and o == me else 1.5),
                         opacity=1.0 if me and o == me else 0.75, hovertemplate=hover))
    rows = _key_rows([(LINE, ROOM_COLOR, t("room_all", lang))]
                     + [(LINE, owner_color(o), owner_name(o, me, lang, mark)) for o in series["owners"]], lang)
    key, bottom = _key_below(rows)
    lay = layout(t("room_tps_title", lang).format(w=f"{ROLL_S:g}", span=f"{SHOWN_S:g}"), UIREV_THROUGHPUT,
                 height=280 + 16 * len(rows), hovermode="x unified", annotations=[key],
                 margin=dict(l=55, r=20, t=40, b=bottom),
                 xaxis=dict(title=dict(text=t("room_time", lang)), range=[-SHOWN_S, 0], autorange=False,
                            gridcolor="#EEE", zeroline=False),
                 yaxis=dict(title=dict(text=t("room_tok_s", lang)), rangemode="tozero", gridcolor="#EEE"))
    return figure(data, lay)


# ---- 4 · batch size over time -----------------------------------------------------------------------------

def batch_size_chart(records, lang: str = "en", replay: bool = False) -> dict:
    """Per step: sequences in the step (bars, trace "batch"), held sequences (running, not in the step: they
    keep their KV) and the waiting queue (lines "held" and "waiting"); a dashed line at 1 (one sequence per
    forward pass, no batching)."""
    records = list(records or [])
    if not records:
        return empty(t("room_size", lang), _note(lang, replay), UIREV_SIZE)
    xs = [int(r.get("step", 0)) for r in records]
    colours = {"batch": "#4C78A8", "held": "#F58518", "waiting": "#E45756"}
    names = {"batch": t("room_in_batch", lang), "held": t("room_held", lang), "waiting": t("room_waiting", lang)}
    ys = {"batch": [len(r.get("batch") or []) for r in records],
          "held": [int(r.get("held", 0) or 0) for r in records],
          "waiting": [len(r.get("waiting") or []) for r in records]}
    hover = "%{y}<extra>%{fullData.name}</extra>"
    data = [dict(type="bar", name=markup(names["batch"]), x=xs, y=ys["batch"], meta="batch",
                 marker=dict(color=colours["batch"]), hovertemplate=hover)]
    for k in ("held", "waiting"):
        data.append(dict(type="scatter", mode="lines", name=markup(names[k]), x=xs, y=ys[k], meta=k,
                         line=dict(color=colours[k], width=2, shape="hv"), hovertemplate=hover))
    rows = [[(BAR, colours["batch"], names["batch"]), (LINE, colours["held"], names["held"]),
             (LINE, colours["waiting"], names["waiting"])]]
    key, bottom = _key_below(rows)
    one = dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=1, y1=1, line=dict(color="#555", dash="dash",
                                                                                        width=1))
    note = dict(text=markup(t("room_one", lang)), x=1, xref="paper", xanchor="right", y=1, yref="y",
                yanchor="bottom", showarrow=False, font=dict(size=10, color="#555"), bgcolor="rgba(255,255,255,0.85)")
    top = max(max(v) for v in ys.values())
    lay = layout(t("room_size_title", lang), UIREV_SIZE, height=280 + 16 * len(rows), hovermode="x unified",
                 bargap=0.2 if len(records) <= WINDOW_STEPS else 0.02, shapes=[one], annotations=[key, note],
                 margin=dict(l=55, r=20, t=40, b=bottom),
                 xaxis=dict(title=dict(text=t("room_step", lang)), tickformat="d",
                            dtick=1 if max(xs) - min(xs) <= 12 else None, gridcolor="#EEE"),  # no half steps
                 yaxis=dict(title=dict(text=t("room_count", lang)), range=[0, max(2, top) + 0.5],
                            dtick=1 if top <= 12 else None, gridcolor="#EEE"))
    return figure(data, lay)


# ---- 5 · the event log ------------------------------------------------------------------------------------

def room_events(records, limit: int = LOG_EVENTS) -> list[dict]:
    """The last `limit` admissions, preemptions and finishes, newest first: {"step", "kind", "seq_id",
    "owner", "reason"} (reason: finishes only). Within a step: admissions, then preemptions, then finishes."""
    out = []
    for rec in reversed(list(records or [])):
        step = int(rec.get("step", 0))
        for kind in ("finished", "preempted", "admitted"):
            for e in reversed(rec.get(kind) or []):
                out.append({"step": step, "kind": kind, "seq_id": int(e.get("seq_id", 0)),
                            "owner": str(e.get("owner", "")), "reason": e.get("reason")})
                if len(out) >= limit:
                    return out
    return out


def event_log_html(records, me: str = "", lang: str = "en", replay: bool = False, mark: str = "room_you") -> str:
    """An HTML list of room_events (every text escaped): step, owner (in its colour), sequence and what
    happened; this tab's own lines are marked."""
    title = f'<div class="il-room-log-title">{markup(t("room_log", lang))}</div>'
    if not records:
        return f'<div class="il-room-log">{title}<div class="il-room-note">{markup(_note(lang, replay))}</div></div>'
    events = room_events(records)
    if not events:
        return (f'<div class="il-room-log">{title}<div class="il-room-note">{markup(t("room_no_events", lang))}'
                f'</div></div>')
    items = []
    for e in events:
        what = t(f"room_{e['kind']}", lang)
        if e["kind"] == "finished" and e["reason"]:
            what += f" ({_reason(str(e['reason']), lang)})"
        mine = " il-room-me" if me and e["owner"] == me else ""
        items.append(
            f'<li class="il-room-ev il-room-{e["kind"]}{mine}">'
            f'<span class="il-room-step">{markup(t("room_step", lang))} {e["step"]}</span> '
            f'<span class="il-room-owner" style="border-color:{owner_color(e["owner"])}">'
            f'{markup(owner_name(e["owner"], me, lang, mark))}</span> '
            f'<span class="il-room-seq">{markup(t("room_seq", lang))} {e["seq_id"]}</span> · '
            f'<span class="il-room-what">{markup(what)}</span></li>')
    return f'<div class="il-room-log">{title}<ol class="il-room-events">{"".join(items)}</ol></div>'


def _reason(reason: str, lang: str) -> str:
    """A finish reason in words; an unknown one as it is."""
    key = f"room_reason_{reason}"
    text = t(key, lang)
    return reason if text == key else text
