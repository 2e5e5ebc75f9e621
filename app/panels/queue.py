"""The line above the timeline that says where each of this tab's sequences stands now: running, waiting in the
queue (and how many requests are ahead), or preempted (its KV blocks were taken back; it will be recomputed).

A waiting request shows here, in the panel that draws the batches, not only in the sequence selector.
Pure function of the session's queue states (LabSession.queue_states); a replayed trace has none.
"""
from __future__ import annotations

import html

from app.i18n import t

STATE_COLORS = {"running": "#2CA02C", "waiting": "#8A6D00", "preempted": "#D62728"}


def queue_html(states: dict[int, dict] | None, lang: str = "en", own_pool_blocks: int | None = None) -> str:
    """One line: "Your sequences now: #0: running · #1: preempted — …" (or that none is unfinished); empty
    without states (a replay)."""
    if states is None:
        return ""
    items = []
    if not states:
        items.append(f'<span class="il-queue-item">{html.escape(t("queue.none", lang))}</span>')
    for sid, st in sorted(states.items()):
        state = st.get("state", "running")
        if state == "running":
            key, n = ("queue.recomputed", st.get("preemptions", 0)) if st.get("preemptions") else ("queue.running", 0)
        else:
            key, n = f"queue.{state}", st.get("ahead", 0)
        text = html.escape(t(key, lang).format(sid=sid, n=n))
        items.append(f'<span class="il-queue-item" data-seq="{int(sid)}" data-state="{html.escape(state)}" '
                     f'style="color:{STATE_COLORS.get(state, "#333")}">{text}</span>')
    pool = ""
    if own_pool_blocks:
        note = t("queue.own_room", lang).format(blocks=own_pool_blocks)
        pool = f' <span class="il-queue-pool">({html.escape(note)})</span>'
    return (f'<div class="il-queue"><b>{html.escape(t("queue.title", lang))}</b> '
            + " · ".join(items) + pool + "</div>")
