"""KV-cache panel: the paged block pool, the per-sequence block tables and where the memory goes.

All three read one StepEvent: event.blocks (id, refcount, state, hashed, owners), event.block_tables and
event.kv (engine.kv_cache.KVStats: BlockManager.stats() plus bytes and the naive allocator's numbers).
"""
from __future__ import annotations

import math

from engine.kv_cache import KVStats

from .common import (ABOVE_PLOT, BAR, FREE, GREY, KEY_ROW, SEQ_COLORS, empty, figure, fmt_bytes, label_px, layout,
                     legend_key, seq_color)
from ..i18n import texts

COLS = 32  # blocks per grid row: block id = row * COLS + col
MIN_ROWS = 2  # grid rows drawn at least; past the last block in use only one row of free blocks is drawn
LINE_BLOCKS = 16  # logical blocks per row of a block table; a longer table wraps (a row is a readable ~450 px)
UIREV_POOL = "chart-kv-pool"
UIREV_TABLES = "chart-kv-tables"
UIREV_MEMORY = "chart-kv-memory"

# Discrete colour codes shared by the pool grid and the block tables.
CODE_FREE = 0
CODE_CACHED = 1
CODE_SEQ0 = 2  # + seq_id % len(SEQ_COLORS): the same colour seq_color(seq_id) gives everywhere else
NUM_CODES = CODE_SEQ0 + len(SEQ_COLORS)
FREE_COLOR = "#FAFAFA"  # near-white: a free block
ORPHAN_COLOR = "#555555"

MEM_COLORS = {"used": "#4C78A8", "cached": GREY, "free": FREE, "stored": "#54A24B", "paged_waste": "#F58518",
              "naive_waste": "#E45756"}


def _t(lang: str) -> dict:
    return texts("kv", lang)


def discrete_colorscale() -> list:
    """Plotly colorscale mapping integer codes 0..NUM_CODES-1 (with zmin=-0.5, zmax=NUM_CODES-0.5) to colours."""
    colors = [FREE_COLOR, GREY] + list(SEQ_COLORS)
    scale = []
    for i, c in enumerate(colors):
        scale.append([i / NUM_CODES, c])
        scale.append([(i + 1) / NUM_CODES, c])
    return scale


def block_code(block: dict) -> int:
    """Colour code of a block: owning sequence (its first owner) when used, else cached / free."""
    owners = block.get("owners") or []
    if block.get("state") == "used" and owners:
        return CODE_SEQ0 + int(owners[0]) % len(SEQ_COLORS)
    if block.get("state") == "used":
        return CODE_CACHED  # a used block with no table (never expected): shown like cached
    return CODE_CACHED if block.get("state") == "cached" else CODE_FREE


def _legend(name: str, color: str) -> dict:
    """An empty trace that only puts a coloured square in the legend."""
    return dict(type="scatter", mode="markers", x=[None], y=[None], name=name, showlegend=True, hoverinfo="skip",
                marker=dict(symbol="square", size=11, color=color, line=dict(color="#999", width=1)))


def block_pool_chart(event, lang: str = "en") -> dict:
    """The pool as a grid, COLS blocks per row (block id = row*COLS + col), up to the row after the last block in
    use (or cached): a room's pool of 728 blocks spent a screen on 3 used ones. The free blocks past it are not
    drawn; a legend item counts them.

    z = colour code (owner's sequence colour / cached grey / free near-white); text "×n" on blocks shared by n
    sequences; customdata[row][col] = [id, state, refcount, "owners" ("—" if none), "yes"/"no" hashed], with state
    and yes/no in the page's language (None on padding cells). The hover is a template over customdata, so the
    payload has no per-cell hover strings.
    """
    tx = _t(lang)
    blocks = list(event.blocks) if event is not None else []
    if not blocks:
        return empty(tx["pool"], tx["no_event"], UIREV_POOL)
    kv = event.kv
    n = len(blocks)
    cols = COLS
    last = max((int(b["id"]) for b in blocks if b.get("state", "free") != "free"), default=-1)
    rows = min(math.ceil(n / cols), max(MIN_ROWS, last // cols + 2))
    drawn = min(n, rows * cols)  # blocks 0..drawn-1; every block after them is free
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    cd = [[None] * cols for _ in range(rows)]
    owners_seen: set[int] = set()
    for b in sorted(blocks, key=lambda b: b["id"]):
        bid = int(b["id"])
        if bid >= drawn:
            break
        r, c = divmod(bid, cols)
        owners = [int(o) for o in b.get("owners") or []]
        owners_seen.update(owners)
        rc = int(b.get("refcount", 0))
        state = b.get("state", "free")
        z[r][c] = block_code(b)
        text[r][c] = f"×{rc}" if rc > 1 else ""
        owners_s = ", ".join(str(o) for o in owners)
        hashed = bool(b.get("hashed"))
        # Localised words (in English: the state itself and yes/no), so the hover needs no per-cell strings.
        cd[r][c] = [bid, tx["state"].get(state, state), rc, owners_s or "—", tx["yes"] if hashed else tx["no"]]
    hover = (f"{tx['block']} %{{customdata[0]}}<br>%{{customdata[1]}}<br>{tx['refcount']} %{{customdata[2]}}"
             f"<br>{tx['owners']}: %{{customdata[3]}}<br>{tx['hashed']}: %{{customdata[4]}}<extra></extra>")
    heat = dict(type="heatmap", name="blocks", z=z, text=text, texttemplate="%{text}", textfont=dict(size=10),
                customdata=cd, hovertemplate=hover,
                colorscale=discrete_colorscale(), zmin=-0.5, zmax=NUM_CODES - 0.5, showscale=False, hoverongaps=False,
                xgap=2, ygap=2, x=list(range(cols)), y=list(range(rows)))
    data = [heat]
    for s in sorted(owners_seen):
        data.append(_legend(f"{tx['seq']} {s}", seq_color(s)))
    data.append(_legend(tx["legend_cached"], GREY))
    data.append(_legend(tx["state"]["free"], FREE_COLOR))
    if drawn < n:
        data.append(_legend(tx["not_drawn"].format(k=n - drawn, first=drawn, last=n - 1), FREE_COLOR))
    title = tx["pool_title"].format(used=kv.used, cached=kv.cached, free=kv.free, n=n, bs=kv.block_size)
    row_labels = [f"{r * cols}–{min(drawn, (r + 1) * cols) - 1}" for r in range(rows)]
    # the left margin fits the longest row label and the axis title beside it (a fixed 70 px put "blocks" over
    # "352–383" in a pool of 728 blocks)
    left = label_px(12, max(len(s) for s in row_labels)) + 30
    # room for a legend of three rows under the grid (a narrow window wraps it): in a figure too short for its
    # margins Plotly shrank the top one, and the block numbers ran into the title
    lay = layout(title, UIREV_POOL, showlegend=True, height=max(200, 24 * rows + 150),
                 legend=dict(orientation="h", y=-0.02, yanchor="top", x=0, font=dict(size=11)),
                 margin=dict(l=left, r=10, t=46, b=40),  # the block numbers on top, under the title
                 xaxis=dict(range=[-0.5, cols - 0.5], showgrid=False, zeroline=False, tickmode="array",
                            tickvals=[0, 8, 16, 24, 31], side="top", title=dict(text="")),
                 yaxis=dict(range=[rows - 0.5, -0.5], showgrid=False, zeroline=False, tickmode="array",
                            tickvals=list(range(rows)), ticktext=row_labels, title=dict(text=tx["row"])))
    return figure(data, lay)


def block_tables_chart(event, lang: str = "en") -> dict:
    """One row per sequence (sorted by id): cell i = the physical block holding its logical block i. A table
    longer than LINE_BLOCKS wraps onto more rows, each labelled with the logical blocks it holds ("seq 0 ·
    16–31"): 53 blocks on one row left each id a few pixels, and the numbers ran into each other.

    customdata[row][c] = physical block id (None past the end of that table); colour = the first owner of that
    physical block, so a prefix block shared with another sequence shows in that sequence's colour.
    """
    tx = _t(lang)
    tables = event.block_tables if event is not None else {}
    if not tables:
        return empty(tx["tables"], tx["no_tables"], UIREV_TABLES)
    by_id = {int(b["id"]): b for b in event.blocks}
    bs = event.kv.block_size
    seqs = sorted(tables)
    cols = min(max(len(t) for t in tables.values()), LINE_BLOCKS) or 1
    wrapped = any(len(t) > LINE_BLOCKS for t in tables.values())
    z, text, cd, hover, labels, shapes = [], [], [], [], [], []
    for s in seqs:
        t = tables[s]
        if z and wrapped:  # a line between two sequences' rows
            shapes.append(dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=len(z) - 0.5, y1=len(z) - 0.5,
                               line=dict(color="#999", width=1)))
        for start in range(0, max(len(t), 1), cols):
            zr, tr, cr, hr = [], [], [], []
            for i in range(start, start + cols):
                if i < len(t):
                    pb = t[i]
                    zr.append(_table_cell(by_id, pb, s))
                    tr.append(str(pb))
                    cr.append(pb)
                    hr.append(_table_hover(by_id.get(pb), pb, s, i, bs, tx))
                else:
                    zr.append(None)
                    tr.append("")
                    cr.append(None)
                    hr.append("")
            z.append(zr)
            text.append(tr)
            cd.append(cr)
            hover.append(hr)
            last = min(start + cols, len(t)) - 1
            labels.append(f"{tx['seq']} {s}" + (f" · {start}–{last}" if wrapped and last >= start else ""))
    heat = dict(type="heatmap", name="tables", z=z, text=text, texttemplate="%{text}", textfont=dict(size=10),
                customdata=cd, hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
                colorscale=discrete_colorscale(), zmin=-0.5, zmax=NUM_CODES - 0.5, showscale=False, hoverongaps=False,
                xgap=2, ygap=2, x=list(range(cols)), y=list(range(len(z))))
    # wrapped: the row labels give each row's logical blocks, the hovers each block's tokens
    axis = tx["logical_axis_wrapped"] if wrapped else tx["logical_axis"].format(bs=bs, last=bs - 1)
    lay = layout(tx["tables_title"], UIREV_TABLES, height=max(150, 26 * len(z) + 110),
                 margin=dict(l=110 if wrapped else 60, r=10, t=40, b=45), shapes=shapes,
                 xaxis=dict(title=dict(text=axis), tickmode="linear", dtick=1, range=[-0.5, cols - 0.5],
                            showgrid=False, zeroline=False),
                 yaxis=dict(tickmode="array", tickvals=list(range(len(z))), ticktext=labels,
                            range=[len(z) - 0.5, -0.5], showgrid=False, zeroline=False, title=dict(text="")))
    return figure([heat], lay)


def _table_cell(by_id: dict, pb: int, seq: int) -> int:
    """Colour code of a table cell: the physical block's first owner (a block missing from the event: seq)."""
    b = by_id.get(pb)
    return block_code(b) if b is not None and b.get("owners") else CODE_SEQ0 + seq % len(SEQ_COLORS)


def _table_hover(b: dict | None, pb: int, seq: int, i: int, bs: int, tx: dict) -> str:
    b = b or {"owners": [seq], "refcount": 1}
    owners = [int(o) for o in b.get("owners") or [seq]]
    shared = f"<br>{tx['shared_by']} {', '.join(map(str, owners))}" if len(owners) > 1 else ""
    return (f"{tx['seq']} {seq} · {tx['logical']} {i} ({tx['tokens']} {i * bs}–{(i + 1) * bs - 1})<br>→ "
            f"{tx['block']} {pb} · {tx['refcount']} {b.get('refcount', 1)}{shared}")


def memory_numbers(kv: KVStats) -> dict:
    """Bytes of each bar segment of kv_memory_chart, from event.kv."""
    bpt = float(kv.bytes_per_token)
    naive = kv.naive_reserved_tokens
    stored_tokens = naive - kv.naive_waste_tokens  # one copy per live sequence
    used = float(kv.used_bytes)
    paged_waste = kv.paged_waste_tokens * bpt
    return {
        "used": used,
        "cached": float(kv.cached_bytes),
        "free": float(kv.free_bytes),
        "stored_tokens": stored_tokens,
        "stored": stored_tokens * bpt,
        # The used blocks hold each shared prefix once: what they store is their size minus the empty slots.
        "paged_stored": max(0.0, used - paged_waste),
        "paged_waste": paged_waste,
        "naive_waste": kv.naive_waste_tokens * bpt,
        "naive_reserved": naive * bpt,
        "pool": float(kv.pool_bytes),
    }


def kv_memory_chart(event, lang: str = "en") -> dict:
    """Stacked horizontal bars in bytes, three rows:
    paged pool = used + cached + free blocks (kv used_bytes / cached_bytes / free_bytes);
    paged: used blocks = tokens stored (shared prefixes once) + unused slots of last blocks (paged_waste_tokens);
    naive contiguous = tokens stored (one copy per sequence) + the rest of the max_tokens it reserves up front
    (naive_reserved_tokens in total). Tokens are converted with bytes_per_token. A dashed line marks the pool size.
    """
    tx = _t(lang)
    if event is None:
        return empty(tx["memory"], tx["no_event"], UIREV_MEMORY)
    kv = event.kv
    m = memory_numbers(kv)
    bpt = float(kv.bytes_per_token) or 1.0
    r_pool, r_paged, r_naive = tx["rows"]

    def bar(key: str, name: str, ys: list[str], values: list[float]) -> dict:
        return dict(type="bar", orientation="h", name=name, y=ys, x=values,
                    marker=dict(color=MEM_COLORS[key], line=dict(color="#999", width=0.5)),
                    customdata=[[fmt_bytes(v, lang), round(v / bpt)] for v in values],
                    hovertemplate=f"{name}<br>%{{customdata[0]}} = %{{customdata[1]}} {tx['tokens']}<extra></extra>")

    data = [
        bar("used", tx["used"], [r_pool], [m["used"]]),
        bar("cached", tx["cached"], [r_pool], [m["cached"]]),
        bar("free", tx["free_"], [r_pool], [m["free"]]),
        bar("stored", tx["stored"], [r_paged, r_naive], [m["paged_stored"], m["stored"]]),
        bar("paged_waste", tx["paged_waste"], [r_paged], [m["paged_waste"]]),
        bar("naive_waste", tx["naive_waste"], [r_naive], [m["naive_waste"]]),
    ]
    shapes = []
    if m["pool"] > 0:
        shapes.append(dict(type="line", xref="x", yref="paper", x0=m["pool"], x1=m["pool"], y0=0, y1=1,
                           line=dict(color="#333", dash="dash", width=1.5)))
    # The key above the plot, a fixed row per long name, from the chart's left edge: a Plotly legend wrapped by
    # the chart's width and ran into the axis or off the chart (the Russian names are ~50 characters); the
    # pool's size is the key's last row, not a label at the dashed line, where it met the key.
    rows = [[(BAR, MEM_COLORS[k], tx[n]) for k, n in (("used", "used"), ("cached", "cached"), ("free", "free_"))],
            [(BAR, MEM_COLORS["stored"], tx["stored"])], [(BAR, MEM_COLORS["paged_waste"], tx["paged_waste"])],
            [(BAR, MEM_COLORS["naive_waste"], tx["naive_waste"])]]
    if m["pool"] > 0:
        rows.append([("┆", "#333", f"{tx['pool_size']} {fmt_bytes(m['pool'], lang)}")])
    top = ABOVE_PLOT + KEY_ROW * len(rows) + 6
    lay = layout(tx["memory_title"], UIREV_MEMORY, barmode="stack", height=top + 150, shapes=shapes,
                 annotations=[legend_key(rows, x=0, xanchor="left", xshift=5 - 150, align="left")], bargap=0.35,
                 margin=dict(l=150, r=20, t=top, b=45),
                 xaxis=dict(title=dict(text=tx["bytes"]), tickformat=".3s", gridcolor="#EEE", rangemode="tozero"),
                 yaxis=dict(categoryorder="array", categoryarray=[r_pool, r_paged, r_naive],
                            # the pool on top, by an explicit range: "reversed" is lost over the page's placeholder
                            autorange=False, range=[2.5, -0.5],
                            title=dict(text="")))
    return figure(data, lay)
