"""The presenter's view of a room load (app/room_load.py `RoomLoad.summary`): how many followers answered, their
time to first token (measured in their browsers), the tokens the server generated for them per second, and the
batches the engine ran (the room's records) or the requests the attached server ran at once (its /metrics).

Element ids the tests read: load-round, load-answered, load-asked, load-max-batch.
"""
from __future__ import annotations

import html

from ..i18n import texts


def _ms(seconds) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.0f}"


def summary_html(summary: dict | None, lang: str, note: str = "") -> str:
    say = texts("load", lang)
    e = html.escape
    parts = [f'<p class="il-load-note">{e(note)}</p>'] if note else []
    if summary is None:
        parts.append(f'<p class="il-load-note">{e(say["none"])}</p>')
        return f'<div class="il-load-summary">{"".join(parts)}</div>'
    s = summary
    head = say["round"].format(round=f'<b id="load-round">{s["round"]}</b>',
                               answered=f'<b id="load-answered">{s["answered"]}</b>',
                               asked=f'<b id="load-asked">{s["asked"]}</b>')
    lines = [head]
    if s["failed"]:
        lines.append(e(say["failed"].format(n=s["failed"])))
    if s["answered"] < s["asked"] and s["window_s"] is None:
        lines.append(e(say["waiting"].format(s=f'{s["age_s"]:.0f}')))
    if s["answered"]:
        lines.append(e(say["ttft"].format(p50=_ms(s["ttft_p50_s"]), p95=_ms(s["ttft_p95_s"]))))
    if s["tok_s"] is not None:
        lines.append(e(say["throughput"].format(tokens=s["tokens"], tok_s=f'{s["tok_s"]:.1f}',
                                                window=f'{s["window_s"]:.1f}')))
    b = s.get("batches")
    if b and b["source"] == "room":
        lines.append(say["batches_room"].format(steps=b["steps"], max=f'<b id="load-max-batch">{b["max"]}</b>',
                                                mean=f'{b["mean"]:.1f}', ours=b["max_round"]))
    elif b:
        lines.append(say["batches_metrics"].format(max=f'<b id="load-max-batch">{b["max"]}</b>',
                                                   mean=f'{b["mean"]:.1f}', n=b["samples"]))
    parts.append("<br>".join(lines))
    return f'<div class="il-load-summary">{"".join(parts)}</div>'
