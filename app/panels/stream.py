"""The streamed answer of one sequence, as the client would have received it so far.

CSS classes: il-stream (container; white-space: pre-wrap is set inline), il-stream-text (released text),
il-held (what the detokenizer holds back: a possible stop-string prefix and/or incomplete UTF-8 bytes),
il-held-bytes (the hex bytes inside il-held), il-finish + il-finish-<reason> (finish badge),
il-stream-empty (placeholder when nothing has been sampled yet).
"""
from __future__ import annotations

import html
from ..i18n import texts


def _seq_events(events, seq_id: int) -> list:
    out = []
    for ev in events or []:
        for s in ev.seqs:
            if s.seq_id == seq_id:
                out.append(s)
    return out


def streamed_text(events, seq_id: int) -> str:
    """Concatenation of SeqEvent.emitted for `seq_id`, in step order (raw, unescaped)."""
    return "".join(s.emitted for s in _seq_events(events, seq_id))


def stream_html(events, seq_id: int, lang: str = "en") -> str:
    tx = texts("stream", lang)
    seqs = _seq_events(events, seq_id)
    sampled = [s for s in seqs if s.detok is not None or s.emitted]
    if not sampled:
        return (f'<div class="il-stream il-stream-empty" data-seq="{int(seq_id)}">'
                f'{html.escape(tx["empty"].format(seq=seq_id))}</div>')
    text = "".join(s.emitted for s in seqs)
    parts = [f'<span class="il-stream-text">{html.escape(text)}</span>']
    last = sampled[-1]
    finished = last.finished
    detok = last.detok
    if not finished and detok is not None:
        held_text = detok.held_text
        held_bytes = detok.held_bytes.strip()
        if held_text or held_bytes:
            inner = html.escape(held_text)
            if held_bytes:
                inner += f'<span class="il-held-bytes">⟨{html.escape(held_bytes)}⟩</span>'
            parts.append(f'<span class="il-held" title="{html.escape(tx["held"])}">{inner}</span>')
    if finished:
        reason = last.finish_reason or "stop"
        label = tx["finish"].get(reason, reason)
        parts.append(f'<span class="il-finish il-finish-{html.escape(reason)}" '
                     f'title="{html.escape(tx["finish_title"].format(r=label))}">{html.escape(label)}</span>')
    return (f'<div class="il-stream" data-seq="{int(seq_id)}" style="white-space: pre-wrap">'
            + "".join(parts) + "</div>")
