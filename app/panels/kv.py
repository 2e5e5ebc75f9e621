"""The KV-cache whiteboard: the bytes-per-token formula filled in with this model's numbers, and the counters.

CSS classes: il-kv (container), il-formula (one formula line), il-formula-result (the computed value),
il-kv-stats (the <ul> of counters), il-kv-empty (placeholder before the first step).
"""
from __future__ import annotations

import html
from ..charts.common import field as _g
from ..charts.common import fmt_bytes, fmt_int
from ..i18n import t, texts


def _num(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return html.escape(str(v))
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def kv_formula_html(event, lang: str = "en") -> str:
    tx = texts("kv_panel", lang)
    kv = _g(event, "kv", None) if event is not None else None
    if not kv:
        return f'<div class="il-kv il-kv-empty">{html.escape(tx["empty"])}</div>'
    f = kv.get("formula") or {}
    layers, heads = f.get("layers", "?"), f.get("kv_heads", "?")
    dim, be = f.get("head_dim", "?"), f.get("bytes_per_elem", "?")
    bpt = int(kv.get("bytes_per_token", 0))
    bs = int(kv.get("block_size", 0))
    nb = int(kv.get("num_blocks", 0))
    block_bytes = kv.get("block_bytes", bpt * bs)
    pool = kv.get("pool_bytes", block_bytes * nb)
    byte = t("byte_units", lang)[0]
    line1 = (f"2 × {_num(layers)} {tx['layers']} × {_num(heads)} {tx['kv_heads']} × {_num(dim)} × {_num(be)} {byte} = "
             f'<b class="il-formula-result">{fmt_int(bpt, lang)} {byte}</b> {tx["per_token"]}')
    line2 = (f"{tx['block'].format(bs=bs)} = <b class=\"il-formula-result\">{fmt_bytes(block_bytes, lang)}</b>; "
             f"{tx['pool'].format(n=nb)} = <b class=\"il-formula-result\">{fmt_bytes(pool, lang)}</b>")
    hit, q = int(kv.get("prefix_hit_tokens", 0)), int(kv.get("prefix_query_tokens", 0))
    stats = [
        ("hit_rate", tx["hit_rate"], f"{float(kv.get('hit_rate', 0.0)):.1%}", tx["hit_detail"].format(hit=hit, q=q)),
        ("prefill_saved", tx["saved"], f"{hit:,}", ""),
        ("evictions", tx["evictions"], f"{int(kv.get('evictions', 0)):,}", ""),
        ("preemptions", tx["preemptions"], f"{int(kv.get('preemptions', 0)):,}", ""),
        ("cow_copies", tx["cow"], f"{int(kv.get('cow_copies', 0)):,}", ""),
        ("shared", tx["shared"], f"{int(kv.get('shared', 0)):,}", ""),
    ]
    items = "".join(
        f'<li data-stat="{key}">{html.escape(name)}: <b>{html.escape(val)}</b>'
        + (f' <span class="il-kv-detail">({html.escape(detail)})</span>' if detail else "") + "</li>"
        for key, name, val, detail in stats)
    return (f'<div class="il-kv"><div class="il-formula" title="{html.escape(tx["note"])}">{line1}</div>'
            f'<div class="il-formula">{line2}</div><ul class="il-kv-stats">{items}</ul></div>')
