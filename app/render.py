"""Turn a LabSession's events into the page payload: {"figs": {container id: figure}, "html": {id: html}}.

The browser applies it with Plotly.react on persistent divs (static/lab.js), which keeps each chart's zoom.
Everything here is a call to a pure chart/panel function; no engine state is changed. The session is read
only through the LabView protocol (app/session.py), so a replayed trace (app/trace.py) renders the same
payload with no model loaded.
"""
from __future__ import annotations

import html
import logging

from engine.sampling import SamplingTrace

from .charts import attention, detok, embeddings, kv_cache, logits, room, sampling, speculative, timeline, tokens
from .charts.common import empty
from .i18n import PANEL_KEYS, Refusal, t
from .panels import kv as kv_panel
from .panels import pipeline, queue, stream
from .panels import tokens as token_panels
from .session import MAX_PREVIEW_CHARS, LabView

CHART_IDS = ["chart-bytes", "chart-pca", "chart-neighbours", "chart-attention", "chart-heads", "chart-entropy",
             "chart-lens", "chart-logits", "chart-perplexity", "chart-sampling", "chart-cdf", "chart-detok",
             "chart-kv-pool", "chart-kv-tables", "chart-kv-memory", "chart-timeline", "chart-latency",
             "chart-roofline", "chart-spec-rounds", "chart-spec-pq", "chart-spec-alpha", "chart-spec-pass",
             "chart-spec-speedup", "chart-room-batch", "chart-room-pool", "chart-room-throughput", "chart-room-size"]

# which chart containers sit in which panel (the page layout and the tests both use this)
PANEL_CHARTS = {
    "template": ["chart-bytes"],
    "embeddings": ["chart-pca", "chart-neighbours"],
    "layers": ["chart-attention", "chart-heads", "chart-entropy", "chart-lens"],
    "logits": ["chart-logits", "chart-perplexity"],
    "sampling": ["chart-sampling", "chart-cdf"],
    "detok": ["chart-detok"],
    "kv": ["chart-kv-pool", "chart-kv-tables", "chart-kv-memory"],
    "timeline": ["chart-timeline", "chart-roofline", "chart-latency"],
    "speculative": ["chart-spec-rounds", "chart-spec-pq", "chart-spec-alpha", "chart-spec-pass", "chart-spec-speedup"],
    "room": ["chart-room-batch", "chart-room-pool", "chart-room-throughput", "chart-room-size"],
}
# charts drawn from the tensors the engine captures (attention, logit lens, residual norms, embeddings): a
# tab whose page shows one of these is captured first when the room is busy (LabSession.shows_captures)
CAPTURE_CHARTS = frozenset([*PANEL_CHARTS["layers"], "chart-pca"])
PANEL_HTML = {
    "template": ["html-template", "html-tokens", "html-bpe"],
    "detok": ["html-stream"],
    "kv": ["html-kv-formula"],
    "timeline": ["html-queue"],
    "room": ["html-room-log"],
}


def message_html(text: str, kind: str = "info") -> str:
    return f'<div class="il-msg il-msg-{kind}">{html.escape(text)}</div>' if text else ""


def panel_headers(lang: str) -> dict[str, str]:
    out = {}
    for key in PANEL_KEYS:
        out[f"html-title-{key}"] = html.escape(t(f"panel.{key}.title", lang))
        out[f"html-text-{key}"] = html.escape(t(f"panel.{key}.text", lang))
    return out


def build_payload(s: LabView, lang: str = "en", layer: int = 0, head: int = 0, word: str = "",
                  neighbour_pos: int | None = None, machine: dict | None = None,
                  what_if: SamplingTrace | None = None,
                  message: str = "", message_kind: str = "info", only: set[str] | None = None,
                  me_mark: str = "room_you") -> dict:
    """The panels' figures and HTML for the session's current state.

    `only`: the chart containers to build (those in the user's view); the rest are listed as "stale" and
    fetched when they scroll into view. None builds everything. `me_mark`: the i18n key of the word the room
    charts put after the session's own tab ("room_presenter" in a lecture's frames: not the follower's tab).
    """
    payload = _build(s, lang, layer, head, word, neighbour_pos, machine, what_if, message, message_kind, only,
                     me_mark)
    if only is not None:
        payload["stale"] = sorted(set(CHART_IDS) - set(payload["figs"]))
    return payload


log = logging.getLogger(__name__)

# A replayed trace was written by whoever uploaded it: app/trace.py checks what the charts read at load, and
# each piece of a replay's page is drawn on its own, so a value no check foresaw costs one chart, not the page
# (the placeholder says so: i18n "draw_failed").


class _Lazy(dict):
    """A figure dict that computes a chart only if that chart is wanted; `guard` (a replay) draws each
    chart and HTML piece on its own, a failure becoming a placeholder."""

    def __init__(self, only, guard: bool = False, lang: str = "en", turn=None):
        super().__init__()
        self.only, self.guard, self.lang = only, guard, lang
        self.turn = turn  # a live session's Room.page_turn: charts are drawn while the engine needs no GIL

    def put(self, cid, make):
        if self.only is None or cid in self.only:
            if self.turn is not None:
                self.turn()
            self[cid] = self.draw(make, lambda: empty("", t("draw_failed", self.lang), cid))

    def draw(self, make, fallback):
        if not self.guard:
            return make()
        try:
            return make()
        except Exception:  # noqa: BLE001 - any failure of a chart over an untrusted trace
            log.warning("a replayed trace's chart failed", exc_info=True)
            return fallback()


def _build(s: LabView, lang, layer, head, word, neighbour_pos, machine, what_if, message, message_kind,
           only, me_mark="room_you") -> dict:
    layer = max(0, min(int(layer), s.num_layers - 1))
    head = max(0, min(int(head), s.num_heads - 1))
    events = s.events
    last = events[-1] if events else None
    figs = _Lazy(only, bool(getattr(s, "untrusted", False)), lang, getattr(s, "page_turn", None))
    failed = message_html(t("draw_failed", lang), "warn")
    htmls: dict[str, str] = {"html-pipeline": figs.draw(lambda: pipeline.pipeline_html(last, lang), lambda: "")}
    htmls.update(panel_headers(lang))
    if what_if is None:
        what_if = s.what_if
    if message is not None:  # None: leave the page's message as it is (a refresh of charts in view)
        htmls["html-message"] = message_html(message, message_kind)
    if what_if is not None and not message:
        htmls["html-message"] = message_html(t("whatif", lang), "whatif")

    me = getattr(s, "room_me", None)  # this tab's owner label (a replay reads it off its events)
    htmls["html-queue"] = figs.draw(lambda: _queue(s, lang), lambda: "")
    sid = s.focus if s.focus is not None and s.has_seq(s.focus) else None
    if sid is None:
        preview = getattr(s, "preview", None)
        hint = t("idle", lang)
        if preview is not None and preview.token_ids:  # the first screen: the prompt box before any step
            hint = t("preview_hint", lang).format(n=len(preview.token_ids))
        for cid in CHART_IDS:
            figs.put(cid, lambda: empty("", hint, cid))
        for key in ("html-template", "html-tokens", "html-bpe", "html-stream", "html-kv-formula"):
            htmls[key] = ""
        if preview is not None:
            _preview(s, preview, lang, word, figs, htmls, failed)
        if last is not None:
            figs.put("chart-kv-pool", lambda: kv_cache.block_pool_chart(last, lang))
            figs.put("chart-timeline", lambda: timeline.timeline_chart(events, lang, me))
        _room(s, lang, figs, htmls, failed, me_mark)  # the room's steps show while this tab has nothing of its own
        return {"figs": dict(figs), "html": htmls}

    req = s.requests[sid]
    token_ids = s.seq_token_ids(sid)
    texts = s.token_texts(sid)
    infos = s.token_infos(sid)
    # a running sequence grows (or a rewind shrinks it) between these reads: draw one consistent prefix
    n = min(len(token_ids), len(texts), len(infos))
    token_ids, texts, infos = token_ids[:n], texts[:n], infos[:n]
    n_prompt = s.prompt_len(sid)

    # 1 · template & tokens
    htmls["html-template"] = figs.draw(lambda: token_panels.template_html(req.text, req.spans, lang), lambda: failed)
    htmls["html-tokens"] = figs.draw(lambda: token_panels.token_chips_html(
        infos, n_prompt, lang, forced=detok.forced_indices(events, sid)), lambda: failed)
    figs.put("chart-bytes", lambda: tokens.bytes_per_token_chart(infos, n_prompt, lang))
    htmls["html-bpe"] = _bpe_html(s, (word or "").strip() or _default_word(req.prompt), lang, figs, failed)

    # 2 · embeddings
    figs.put("chart-pca", lambda: embeddings.embedding_pca(events, sid, texts, lang))
    pos = len(texts) - 1 if neighbour_pos is None else max(0, min(int(neighbour_pos), len(texts) - 1))
    tok_id = token_ids[pos]
    figs.put("chart-neighbours", lambda: embeddings.neighbours_chart(s.nearest(int(tok_id), 10), texts[pos], lang))

    # 3 · layers & attention
    figs.put("chart-attention", lambda: attention.attention_heatmap(events, sid, layer, head, texts, lang))
    figs.put("chart-heads", lambda: attention.attention_heads_grid(events, sid, layer, texts, lang, max_positions=32))
    figs.put("chart-entropy", lambda: attention.head_entropy_chart(events, sid, lang))
    # 16 columns: each cell's top token stays legible, and the cell texts are most of this chart's drawing time
    figs.put("chart-lens", lambda: attention.logit_lens_chart(events, sid, lang, texts=texts, max_positions=16))

    # 4 · logits, 5 · sampling
    _, sev = figs.draw(lambda: s.last_seq_event(sid), lambda: (None, None))
    if sev is not None:
        forced = logits.forced_of(sev) if what_if is None else None  # a what-if shows a draw, nothing forced
        figs.put("chart-logits", lambda: logits.logits_chart(sev.sampling, sev.logit_stats, lang,
                                                             forced=logits.forced_of(sev)))
        chain = what_if if what_if is not None else sev.sampling
        figs.put("chart-sampling", lambda: sampling.sampling_chain_chart(chain, what_if=what_if is not None, lang=lang,
                                                                         forced=forced))
        figs.put("chart-cdf", lambda: sampling.sampling_cdf_chart(chain, lang, forced=forced))
    else:
        for cid in ("chart-logits", "chart-sampling", "chart-cdf"):
            figs.put(cid, lambda: empty("", t("idle", lang) if not events else "…", cid))
    figs.put("chart-perplexity", lambda: logits.perplexity_chart(events, sid, lang))

    # 6 · detokenizer & stream
    htmls["html-stream"] = figs.draw(lambda: stream.stream_html(events, sid, lang), lambda: failed)
    figs.put("chart-detok", lambda: detok.detok_table(events, sid, lang=lang))

    # 7 · KV cache, 8 · timeline
    if last is not None:
        figs.put("chart-kv-pool", lambda: kv_cache.block_pool_chart(last, lang))
        figs.put("chart-kv-tables", lambda: kv_cache.block_tables_chart(last, lang))
        figs.put("chart-kv-memory", lambda: kv_cache.kv_memory_chart(last, lang))
        htmls["html-kv-formula"] = figs.draw(lambda: kv_panel.kv_formula_html(last, lang), lambda: failed)
    else:
        for cid in ("chart-kv-pool", "chart-kv-tables", "chart-kv-memory"):
            figs.put(cid, lambda: empty("", t("idle", lang), cid))
        htmls["html-kv-formula"] = ""
    figs.put("chart-timeline", lambda: timeline.timeline_chart(events, lang, me))
    figs.put("chart-latency", lambda: timeline.latency_table(events, lang))
    machine = machine or {}
    if machine.get("bandwidth") and machine.get("peak_flops"):
        figs.put("chart-roofline",
                 lambda: timeline.roofline_chart(events, machine["bandwidth"], machine["peak_flops"], lang))
    else:
        figs.put("chart-roofline", lambda: empty("", t("measuring", lang), "chart-roofline"))

    # 9 · speculative decoding: the focused sequence's rounds, its latest round, its running stats
    spec = figs.draw(lambda: next((se.spec for ev in reversed(events) for se in ev.seqs
                                   if se.seq_id == sid and se.spec is not None), None), lambda: None)
    figs.put("chart-spec-rounds", lambda: speculative.rounds_timeline(events, sid, lang))
    figs.put("chart-spec-pq", lambda: speculative.pq_chart(spec, lang=lang))
    figs.put("chart-spec-alpha", lambda: speculative.acceptance_chart(spec, lang))
    figs.put("chart-spec-pass", lambda: speculative.tokens_per_pass_chart(spec, lang))
    figs.put("chart-spec-speedup", lambda: speculative.speedup_chart(getattr(s, "spec_comparison", None), lang))

    # 10 · the room: the shared engine's steps, everyone's sequences
    _room(s, lang, figs, htmls, failed, me_mark)
    return {"figs": dict(figs), "html": htmls}


def _queue(s: LabView, lang: str) -> str:
    """Where this tab's unfinished sequences stand now (a live session only: a replay shows what was recorded)."""
    states = getattr(s, "queue_states", None)
    if states is None:
        return ""
    own_pool = s.engine.kv_stats().num_blocks if getattr(s, "own_room", False) else None
    return queue.queue_html(states(), lang, own_pool)


def _preview(s, preview, lang: str, word: str, figs: _Lazy, htmls: dict, failed: str) -> None:
    """Panel 1 before any step: the prompt box's chat template, its tokens and their bytes, the BPE trace of its
    longest word, and the nearest embeddings of its last token (none of it needs a model step)."""
    if preview.too_long:
        htmls["html-template"] = message_html(t("preview_long", lang).format(n=MAX_PREVIEW_CHARS), "info")
        return
    infos = figs.draw(lambda: s.preview_infos(), lambda: [])
    n = len(infos)
    htmls["html-template"] = figs.draw(lambda: token_panels.template_html(preview.text, list(preview.spans), lang),
                                       lambda: failed)
    if any("\u0400" <= ch <= "\u04ff" for ch in preview.prompt):  # the small model's limits, said before a step
        htmls["html-template"] = message_html(t("preview_cyrillic", lang), "info") + htmls["html-template"]
    htmls["html-tokens"] = figs.draw(lambda: token_panels.token_chips_html(infos, n, lang), lambda: failed)
    figs.put("chart-bytes", lambda: tokens.bytes_per_token_chart(infos, n, lang))
    htmls["html-bpe"] = _bpe_html(s, (word or "").strip() or _default_word(preview.prompt), lang, figs, failed)
    # the longest token of the visitor's own words (its neighbours say more than the template's newline's)
    words = [i for i in infos if not i.get("special") and i.get("text", "").strip()
             and i["text"].strip() in preview.prompt] or [i for i in infos if not i.get("special")]
    if words:
        tok = max(words, key=lambda i: len(i["text"].strip()))
        figs.put("chart-neighbours", lambda: embeddings.neighbours_chart(s.nearest(int(tok["id"]), 10),
                                                                          tok["text"], lang))


def _bpe_html(s, word: str, lang: str, figs: _Lazy, failed: str) -> str:
    """The BPE merge trace of `word`, folded (it is long and would push every other panel down)."""
    try:
        summary = t("bpe_summary", lang).format(word=word)
        entry = s.bpe(word)  # its ValueError is the message shown instead
        merges = figs.draw(lambda: token_panels.bpe_merges_html(entry, lang), lambda: failed)
        return (f'<details class="il-bpe-box"><summary>{html.escape(summary)}</summary>'
                f'{merges}</details>')
    except (ValueError, NotImplementedError) as exc:  # a multi-pre-token word, a non-BPE tokenizer, a replay
        return message_html(exc.text(lang) if isinstance(exc, Refusal) else str(exc), "warn")


def _room(s: LabView, lang: str, figs: _Lazy, htmls: dict, failed: str, mark: str = "room_you") -> None:
    """The room panel from the session's room_records / room_blocks / room_me (a session without them, or a
    replay, which holds one tab's view only, gets the panel's note); `mark` names room_me's tab (i18n key)."""
    records = list(getattr(s, "room_records", None) or [])
    me = str(getattr(s, "room_me", "") or "")
    replay = bool(getattr(s, "untrusted", False))
    figs.put("chart-room-batch", lambda: room.batch_strip_chart(records, me, lang, replay, mark))
    # the pool's owners are read from the engine only when the pool chart is wanted
    figs.put("chart-room-pool", lambda: room.pool_chart(list(getattr(s, "room_blocks", None) or []), records, me,
                                                         lang, replay, mark))
    figs.put("chart-room-throughput", lambda: room.throughput_chart(records, me, lang, replay, mark))
    figs.put("chart-room-size", lambda: room.batch_size_chart(records, lang, replay))
    htmls["html-room-log"] = figs.draw(lambda: room.event_log_html(records, me, lang, replay, mark),
                                     lambda: failed)


def room_payload(s, lang: str, only: set[str]) -> dict:
    """The room panel alone: its charts in `only` and its event log, from `s`'s room_records / room_blocks /
    room_me (what the room's steps change on a tab that is not stepping itself: app/delivery.py RoomPusher)."""
    figs, htmls = _Lazy(only, lang=lang), {}
    _room(s, lang, figs, htmls, message_html(t("draw_failed", lang), "warn"))
    return {"figs": dict(figs), "html": htmls}


def what_if_payload(s: LabView, trace: SamplingTrace, lang: str) -> dict:
    """Only the sampling charts, recomputed for new slider values."""
    return {"figs": {"chart-sampling": sampling.sampling_chain_chart(trace, what_if=True, lang=lang),
                     "chart-cdf": sampling.sampling_cdf_chart(trace, lang)},
            "html": {"html-message": message_html(t("whatif", lang), "whatif")}}


def chain_payload(s: LabView, lang: str, message: str, message_kind: str = "info") -> dict:
    """Only the sampling charts, as the last step really sampled (what a what-if returns to)."""
    sev = s.last_seq_event(s.focus)[1] if s.focus is not None else None
    trace = sev.sampling if sev is not None else None
    forced = logits.forced_of(sev)
    return {"figs": {"chart-sampling": sampling.sampling_chain_chart(trace, what_if=False, lang=lang, forced=forced),
                     "chart-cdf": sampling.sampling_cdf_chart(trace, lang, forced=forced)},
            "html": {"html-message": message_html(message, message_kind)}}


def prompt_words(prompt: str) -> list[str]:
    """The prompt's words without surrounding punctuation: what the BPE panel offers (and a trace records)."""
    words = [w.strip(".,!?;:«»\"'()") for w in prompt.split()]
    return [w for w in words if w]


def _default_word(prompt: str) -> str:
    words = prompt_words(prompt)
    return max(words, key=len) if words else "gravity"
