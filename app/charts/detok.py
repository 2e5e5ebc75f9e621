"""Detokenizer panel: what each sampled token's bytes turned into, step by step, for one sequence."""
from __future__ import annotations

from engine.events import SeqEvent
from engine.tokenizer import DetokStep

from .common import empty, figure, layout
from .common import markup, plain
from ..i18n import texts

UIREV = "chart-detok"
HELD_FILL = "#FFF4D6"
STOP_FILL = "#FDE2E2"
ROW_FILL = "white"


def seq_steps(events, seq_id: int) -> list[tuple[int, SeqEvent]]:
    """(step, SeqEvent) of every step in which `seq_id` sampled a token (has a detokenizer record)."""
    out = []
    for ev in events or []:
        for s in ev.seqs:
            if s.seq_id == seq_id and s.detok is not None:
                out.append((ev.step, s))
    return out


def held_display(detok: DetokStep) -> str:
    """Held-back text plus incomplete UTF-8 bytes, e.g. ' in' or '⟨d0⟩' (unescaped)."""
    hb = detok.held_bytes.strip()
    return detok.held_text + (f"⟨{hb}⟩" if hb else "")


def detok_table(events, seq_id: int, last_n: int = 12, lang: str = "en") -> dict:
    """A table of the last `last_n` sampled tokens of one sequence: step, id, token text, its bytes in hex,
    the text the detokenizer released, what it still holds back (stop-string prefix or incomplete UTF-8 bytes)
    and the stop-string state. Rows holding something back are tinted yellow, a matched stop red."""
    tx = _t(lang)
    rows = seq_steps(events, seq_id)[-max(1, int(last_n)):]
    if not rows:
        return empty(tx["empty_title"], tx["empty"], UIREV)
    cols: list[list] = [[] for _ in range(7)]
    fills = []
    for step, s in rows:
        d = s.detok
        text = s.new_token_text
        held = held_display(d)
        stop = d.stop
        partial = d.stop_partial
        cols[0].append(step)
        cols[1].append(d.token_id)
        cols[2].append(plain(text))
        cols[3].append(markup(d.token_bytes))
        emitted = s.emitted or d.emitted  # includes the flush at a length/eos finish
        cols[4].append(plain(emitted) if emitted else "")
        cols[5].append(plain(held) if held else "")
        if stop is not None:
            cols[6].append(f"{tx['matched']}: {plain(stop)}")
        else:
            cols[6].append(plain(partial) if partial else "")
        fills.append(STOP_FILL if stop is not None else (HELD_FILL if held else ROW_FILL))
    trace = dict(
        type="table", columnwidth=[36, 56, 90, 90, 110, 80, 90],
        header=dict(values=[f"<b>{c}</b>" for c in tx["cols"]], fill=dict(color="#F0F0F0"), align="left",
                    font=dict(size=12)),
        cells=dict(values=cols, align="left", height=24, fill=dict(color=[fills] * 7),
                   font=dict(family="JetBrains Mono, ui-monospace, monospace", size=12)),
    )
    lay = layout(tx["title"].format(n=len(rows), seq=seq_id), UIREV, height=min(110 + 32 * len(rows), 480),
                 margin=dict(l=10, r=10, t=40, b=10))
    return figure([trace], lay)


def _t(lang: str) -> dict:
    return texts("detok", lang)
