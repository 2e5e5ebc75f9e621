"""The KV-cache whiteboard: the bytes-per-token formula filled in with this model's numbers, and the counters.

CSS classes: il-kv (container), il-formula (one formula line), il-formula-result (the computed value),
il-kv-stats (the <ul> of counters), il-kv-empty (placeholder before the first step).
"""
from __future__ import annotations

import html
from ..charts.common import fmt_bytes, fmt_int
from ..i18n import t, texts


def _num(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return html.escape(str(v))
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def kv_formula_html(event, lang: str = "en") -> str:
    tx = texts("kv_panel", lang)
    if event is None:
        return f'<div class="il-kv il-kv-empty">{html.escape(tx["empty"])}</div>'
    kv = event.kv
    f = kv.formula
    layers, heads, dim, be = f.layers, f.kv_heads, f.head_dim, f.bytes_per_elem
    bpt, bs, nb = kv.bytes_per_token, kv.block_size, kv.num_blocks
    block_bytes, pool = kv.block_bytes, kv.pool_bytes
    byte = t("byte_units", lang)[0]
    line1 = (f"2 × {_num(layers)} {tx['layers']} × {_num(heads)} {tx['kv_heads']} × {_num(dim)} × {_num(be)} {byte} = "
             f'<b class="il-formula-result">{fmt_int(bpt, lang)} {byte}</b> {tx["per_token"]}')
    line2 = (f"{tx['block'].format(bs=bs)} = <b class=\"il-formula-result\">{fmt_bytes(block_bytes, lang)}</b>; "
             f"{tx['pool'].format(n=nb)} = <b class=\"il-formula-result\">{fmt_bytes(pool, lang)}</b>")
    hit, q = kv.prefix_hit_tokens, kv.prefix_query_tokens
    stats = [
        ("hit_rate", tx["hit_rate"], f"{kv.hit_rate:.1%}", tx["hit_detail"].format(hit=hit, q=q)),
        ("prefill_saved", tx["saved"], f"{hit:,}", ""),
        ("evictions", tx["evictions"], f"{kv.evictions:,}", ""),
        ("preemptions", tx["preemptions"], f"{kv.preemptions:,}", ""),
        ("cow_copies", tx["cow"], f"{kv.cow_copies:,}", ""),
        ("shared", tx["shared"], f"{kv.shared:,}", ""),
    ]
    items = "".join(
        f'<li data-stat="{key}">{html.escape(name)}: <b>{html.escape(val)}</b>'
        + (f' <span class="il-kv-detail">({html.escape(detail)})</span>' if detail else "") + "</li>"
        for key, name, val, detail in stats)
    return (f'<div class="il-kv"><div class="il-formula" title="{html.escape(tx["note"])}">{line1}</div>'
            f'<div class="il-formula">{line2}</div><ul class="il-kv-stats">{items}</ul></div>')
