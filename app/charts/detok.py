"""Detokenizer panel: what each sampled token's bytes turned into, step by step, for one sequence."""
from __future__ import annotations

from dataclasses import dataclass

from engine.events import SeqEvent
from engine.tokenizer import DetokStep

from .common import column_widths, empty, figure, layout
from .common import markup, plain
from ..i18n import texts

UIREV = "chart-detok"
HELD_FILL = "#FFF4D6"
STOP_FILL = "#FDE2E2"
ROW_FILL = "white"
ROUND_FILL = "#EEF4FB"  # every other speculative round's rows: a round's tokens read as one group
FORCED_FILL = "#EFE7F7"  # a forced token's cell (purple, as in the logits and sampling charts)


def seq_steps(events, seq_id: int) -> list[tuple[int, SeqEvent]]:
    """(step, SeqEvent) of every step in which `seq_id` sampled a token (has a detokenizer record)."""
    out = []
    for ev in events or []:
        for s in ev.seqs:
            if s.seq_id == seq_id and s.detok is not None:
                out.append((ev.step, s))
    return out


@dataclass
class TokenRow:
    """One emitted token as the table shows it. A speculative round emits several in one step: `slot` is the
    token's place in its round (1-based) of `round_size`, `round_index` counts the rounds shown."""

    step: int
    text: str
    detok: DetokStep
    emitted: str  # the text released with this token (the last token of a step also gets a finish's flush)
    forced: bool
    slot: int = 1
    round_size: int = 1
    round_index: int | None = None  # None: an ordinary step (one token)


def token_rows(events, seq_id: int) -> list[TokenRow]:
    """Every emitted token of `seq_id` in order, one row each: a speculative round's tokens get their own
    detokenizer steps (SpecRound.detok), not only the round's last one."""
    rows, rounds = [], 0
    for step, s in seq_steps(events, seq_id):
        spec = s.spec
        steps = list(spec.detok) if spec is not None and spec.detok else []
        if len(steps) <= 1:  # one token (or a trace from before SpecRound.detok): the step's own record
            rows.append(TokenRow(step, s.new_token_text, s.detok, s.emitted or s.detok.emitted, s.forced))
            continue
        rounds += 1
        released = "".join(d.emitted for d in steps)
        flush = s.emitted[len(released):] if s.emitted.startswith(released) else ""  # EOS / max_tokens finish
        texts = list(spec.emitted_texts) + [""] * len(steps)
        for i, d in enumerate(steps):
            last = i == len(steps) - 1
            rows.append(TokenRow(step, texts[i], d, d.emitted + (flush if last else ""), False,
                                 slot=i + 1, round_size=len(steps), round_index=rounds))
    return rows


def held_display(detok: DetokStep) -> str:
    """Held-back text plus incomplete UTF-8 bytes, e.g. ' in' or '⟨d0⟩' (unescaped)."""
    hb = detok.held_bytes.strip()
    return detok.held_text + (f"⟨{hb}⟩" if hb else "")


def detok_table(events, seq_id: int, last_n: int = 12, lang: str = "en") -> dict:
    """A table of the last `last_n` emitted tokens of one sequence: step, id, token text, its bytes in hex,
    the text the detokenizer released, what it still holds back (stop-string prefix or incomplete UTF-8 bytes)
    and the stop-string state. Rows holding something back are tinted yellow, a matched stop red. A
    speculative round's tokens have a row each, their step written "12 · 2/3" (the round's 2nd of 3 tokens),
    and the rows of alternate rounds tinted blue; a forced token is named so, its cell tinted purple."""
    tx = _t(lang)
    rows = token_rows(events, seq_id)[-max(1, int(last_n)):]
    if not rows:
        return empty(tx["empty_title"], tx["empty"], UIREV)
    cols: list[list] = [[] for _ in range(7)]
    fills = []
    for r in rows:
        d = r.detok
        held = held_display(d)
        stop = d.stop
        partial = d.stop_partial
        cols[0].append(r.step if r.round_index is None else f"{r.step} · {r.slot}/{r.round_size}")
        cols[1].append(d.token_id)
        cols[2].append(plain(r.text) + (f" {tx['forced']}" if r.forced else ""))
        cols[3].append(markup(d.token_bytes))
        cols[4].append(plain(r.emitted) if r.emitted else "")
        cols[5].append(plain(held) if held else "")
        if stop is not None:
            cols[6].append(f"{tx['matched']}: {plain(stop)}")
        else:
            cols[6].append(plain(partial) if partial else "")
        base = ROUND_FILL if r.round_index is not None and r.round_index % 2 else ROW_FILL
        fills.append(STOP_FILL if stop is not None else (HELD_FILL if held else base))
    column_fills = [list(fills) for _ in range(7)]
    column_fills[2] = [FORCED_FILL if r.forced else f for r, f in zip(rows, fills)]
    trace = dict(
        type="table", columnwidth=column_widths(tx["cols"], cols),  # fixed shares cut "придержано"
        header=dict(values=[f"<b>{c}</b>" for c in tx["cols"]], fill=dict(color="#F0F0F0"), align="left",
                    font=dict(size=12)),
        cells=dict(values=cols, align="left", height=24, fill=dict(color=column_fills),
                   font=dict(family="JetBrains Mono, ui-monospace, monospace", size=12)),
    )
    title = tx["title"].format(n=len(rows), seq=seq_id)
    if any(r.round_index is not None for r in rows):
        title += tx["rounds_note"]
    lay = layout(title, UIREV, height=min(110 + 32 * len(rows), 480),
                 margin=dict(l=10, r=10, t=40, b=10))
    return figure([trace], lay)


def forced_indices(events, seq_id: int) -> set[int]:
    """Indices among the generated tokens of `seq_id` that were forced (SeqEvent.forced), the latest step
    winning: a rewind drops what came after it, and a token generated again in its place may not be forced."""
    forced: dict[int, bool] = {}
    for _, s in seq_steps(events, seq_id):
        last = int(s.num_tokens - s.prompt_len - 1)  # the step's last token; a speculative round emits several
        first = last - (s.spec.num_emitted - 1 if s.spec is not None else 0)
        for stale in [j for j in forced if j >= first]:
            del forced[stale]
        for k in range(first, last + 1):
            forced[k] = bool(s.forced)  # a forced step emits one token
    return {k for k, f in forced.items() if f}


def _t(lang: str) -> dict:
    return texts("detok", lang)
