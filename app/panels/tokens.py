"""HTML views of tokenization: the rendered chat template, token chips, and a BPE merge trace.

Pure functions returning HTML strings; every piece of user or model text is escaped with html.escape.
Their classes are styled in static/lab.css.
"""
from __future__ import annotations

import html

from app.charts.common import markup, plain, token_label
from app.i18n import texts


def _tr(lang: str) -> dict:
    return texts("tokens", lang)


def _text_html(text: str) -> str:
    """Escaped text with each newline shown as ⏎ followed by a real line break."""
    return "<span class=\"il-nl\">⏎</span><br>".join(html.escape(part) for part in text.split("\n"))


def template_html(text: str, spans: list[dict], lang: str = "en") -> str:
    """The rendered chat template (ChatPrompt.text / .spans): special tokens in <span class="il-special">,
    newlines visible. Zero-width special spans (a BOS added without text) show as a ◆ marker."""
    t = _tr(lang)
    if not text and not spans:
        return f'<div class="il-template il-empty">{html.escape(t["template_empty"])}</div>'
    parts, cursor = [], 0
    for sp in sorted(spans or [], key=lambda s: (int(s.get("start", 0)), int(s.get("end", 0)))):
        start = max(0, min(len(text), int(sp.get("start", 0))))
        end = max(start, min(len(text), int(sp.get("end", start))))
        if start > cursor:  # text the spans do not cover
            parts.append(_text_html(text[cursor:start]))
        seg = text[max(start, cursor):end]
        if sp.get("kind") == "special":
            if seg:
                title = t["special_tokens"].format(a=sp.get("token_start", "?"))
                parts.append(f'<span class="il-special" title="{html.escape(title)}">{_text_html(seg)}</span>')
            elif end >= cursor:
                parts.append(f'<span class="il-special il-special-implicit" title="{html.escape(t["implicit"])}">◆</span>')
        elif seg:
            parts.append(_text_html(seg))
        cursor = max(cursor, end)
    if cursor < len(text):
        parts.append(_text_html(text[cursor:]))
    if len(text) > TEMPLATE_SCROLL_CHARS:  # a box of its own that scrolls (the keyboard reaches it: tabindex)
        label = html.escape(t["template_scroll"].format(n=len(text)))
        return (f'<div class="il-template il-template-long" tabindex="0" role="region" aria-label="{label}" '
                f'title="{label}">{"".join(parts)}</div>')
    return f'<div class="il-template">{"".join(parts)}</div>'


def chip_text(info: dict) -> str:
    """What a chip shows (unescaped): visible whitespace; a partial UTF-8 token shows its bytes ⟨d0⟩."""
    if info.get("partial_utf8") and not info.get("special"):
        return "⟨" + (info.get("bytes_hex") or "") + "⟩"
    return token_label(info.get("text", ""))


def _chip_title(info: dict, pos: int, generated: bool, t: dict, forced: bool = False) -> str:
    bits = [f"{t['id']} {int(info['id'])}", f"{t['pos']} {pos}", f"{t['bytes']} {info.get('bytes_hex', '')}",
            f"{t['piece']} {info.get('piece', '')}"]
    if info.get("special"):
        bits.append(t["flag_special"])
    if info.get("byte_fallback"):
        bits.append(t["flag_fallback"])
    if info.get("partial_utf8"):
        bits.append(t["flag_partial"])
    if generated:
        bits.append(t["flag_forced"] if forced else t["flag_generated"])
    return " · ".join(bits)


# A long prompt's chips are folded: the first and last CHIPS_EDGE are shown and the rest sit behind a "… K more
# tokens" control (a <details>, so the keyboard opens it too). A 20,000-character prompt's 4,539 chips made the
# page 30,000 px tall. Fewer than CHIPS_MIN_FOLDED hidden chips are not worth a control: they are shown.
CHIPS_EDGE = 100
CHIPS_MIN_FOLDED = 40
# A rendered template longer than this scrolls in a box of its own (lab.css .il-template-long)
TEMPLATE_SCROLL_CHARS = 2000


def token_chips_html(infos: list[dict], n_prompt: int, lang: str = "en", forced: set[int] = frozenset()) -> str:
    """One chip per token (engine.tokenizer.token_info records), then a counts line; past
    2 * CHIPS_EDGE + CHIPS_MIN_FOLDED tokens the middle ones are folded (fold_chips).

    `forced`: indices among the generated tokens that the user forced (detok.forced_indices): their chips get
    il-forced and say so in their title, and the counts line counts them.
    Chip: <span class="il-chip il-prompt|il-generated [il-forced] [il-special] [il-byte-fallback] [il-partial]"
    title="id … · pos … · bytes … · piece …" data-token-id="…" data-pos="…" [data-gen-index="…"]>
    text<sub>id</sub></span>; data-gen-index (generated chips only) is the index among the generated tokens.
    """
    t = _tr(lang)
    if not infos:
        return f'<div class="il-tokens il-empty">{html.escape(t["chips_empty"])}</div>'
    chips, data = [], b""
    for i, info in enumerate(infos):
        generated = i >= n_prompt
        cls = ["il-chip", "il-generated" if generated else "il-prompt"]
        is_forced = generated and (i - n_prompt) in forced
        if is_forced:
            cls.append("il-forced")
        if info.get("special"):
            cls.append("il-special")
        if info.get("byte_fallback"):
            cls.append("il-byte-fallback")
        if info.get("partial_utf8"):
            cls.append("il-partial")
        tid = int(info["id"])
        gen = f' data-gen-index="{i - n_prompt}"' if generated else ""  # the page rewinds to it on click
        chips.append(f'<span class="{" ".join(cls)}" title="{html.escape(_chip_title(info, i, generated, t, is_forced))}" '
                     f'data-token-id="{tid}" data-pos="{i}"{gen}>{markup(chip_text(info))}<sub>{tid}</sub></span>')
        try:
            data += bytes.fromhex(info.get("bytes_hex") or "")
        except ValueError:
            data += (info.get("text") or "").encode("utf-8")
    n = len(infos)
    n_p = min(max(0, int(n_prompt)), n)
    counts = t["counts"].format(chars=len(data.decode("utf-8", errors="replace")), nbytes=len(data), tokens=n,
                                prompt=n_p, gen=n - n_p, bpt=len(data) / n)
    n_forced = sum(1 for k in forced if 0 <= k < n - n_p)
    if n_forced:
        counts += " · " + t["forced_count"].format(n=n_forced)
    return (f'<div class="il-tokens">{fold_chips(chips, t)}'
            f'<div class="il-counts">{html.escape(counts)}</div></div>')


def fold_chips(chips: list[str], t) -> str:
    """The chips' HTML: all of them in one row-wrapping box, or, when many, the first and last CHIPS_EDGE with
    the middle in a <details> whose summary says how many it holds and which positions (data-il-fold: the page
    keeps it open across redraws, static/lab.js)."""
    n = len(chips)
    if n - 2 * CHIPS_EDGE < CHIPS_MIN_FOLDED:
        return f'<div class="il-chips">{"".join(chips)}</div>'
    a, b = CHIPS_EDGE, n - CHIPS_EDGE
    more = html.escape(t["chips_more"].format(k=b - a, first=a, last=b - 1))
    return (f'<div class="il-chips">{"".join(chips[:a])}</div>'
            f'<details class="il-chips-fold" data-il-fold="chips"><summary>{more}'
            f'<span class="il-fold-show">{html.escape(t["chips_show"])}</span>'
            f'<span class="il-fold-hide">{html.escape(t["chips_hide"])}</span></summary>'
            f'<div class="il-chips">{"".join(chips[a:b])}</div></details>'
            f'<div class="il-chips">{"".join(chips[b:])}</div>')


def _sym(text: str, title: str, new: bool = False) -> str:
    cls = "il-sym il-sym-new" if new else "il-sym"
    return f'<span class="{cls}" title="{html.escape(title)}">{plain(text)}</span>'


def bpe_merges_html(steps: list[dict], lang: str = "en") -> str:
    """The merge trace of engine.tokenizer.bpe_merges as a table: step, merge applied (with its rank),
    the symbols after it as little boxes (the symbols the merge produced in .il-sym-new)."""
    t = _tr(lang)
    if not steps:
        return f'<div class="il-bpe-trace il-empty">{html.escape(t["bpe_empty"])}</div>'
    display: dict[str, str] = {}  # vocab piece -> readable text
    for st in steps:
        for piece, sym in zip(st.get("pieces") or [], st.get("symbols") or []):
            display.setdefault(piece, sym)
    rows = []
    for k, st in enumerate(steps):
        merge = st.get("merge")
        pieces = list(st.get("pieces") or st.get("symbols") or [])
        symbols = list(st.get("symbols") or pieces)
        ids = list(st.get("ids") or [None] * len(symbols))
        joined = merge[0] + merge[1] if merge else None
        if merge:
            left, right = (display.get(m, m) for m in merge)
            merged = display.get(joined, left + right)
            cell = (f'{_sym(left, merge[0])} + {_sym(right, merge[1])} → {_sym(merged, joined, new=True)}'
                    f'<span class="il-rank">{html.escape(t["rank"])} {html.escape(str(st.get("rank")))}</span>')
        else:
            cell = html.escape(t["initial"] if k == 0 else t["whole"])
        boxes = []
        for j, sym in enumerate(symbols):
            piece = pieces[j] if j < len(pieces) else sym
            tid = ids[j] if j < len(ids) else None
            title = f"{t['id']} {tid} · {t['piece']} {piece}" if tid is not None else f"{piece} · {t['not_in_vocab']}"
            boxes.append(_sym(sym, title, new=joined is not None and piece == joined))
        rows.append(f'<tr class="il-bpe-row"><td class="il-bpe-step">{int(st.get("step", k))}</td>'
                    f'<td class="il-bpe-merge">{cell}</td><td class="il-bpe-symbols">{"".join(boxes)}</td></tr>')
    head = (f'<thead><tr><th>{html.escape(t["step"])}</th><th>{html.escape(t["merge"])}</th>'
            f'<th>{html.escape(t["symbols"])}</th></tr></thead>')
    return f'<table class="il-bpe">{head}<tbody>{"".join(rows)}</tbody></table>'
