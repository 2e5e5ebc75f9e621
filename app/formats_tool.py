"""The weight-formats panel: the user's prompt under fp32, bf16, int8 and q4 side by side (speed and drift).

The comparison itself is engine.formats_compare.compare_formats; the charts are app/charts/quantization.py.
Here: the engines of the other formats (loaded on first use, kept for the process), one comparison at a time in
the whole server with a status line while it runs, and the payload that reaches the tab's page.
"""
from __future__ import annotations

import html
import threading
import time
from collections import OrderedDict

import gradio as gr

from engine.formats_compare import MAX_COMPARE_TOKENS, REFERENCE, compare_formats
from engine.kernels import FORMATS

from . import render
from .charts import quantization as charts
from .charts.common import markup
from .i18n import Refusal, lang_of, t
from .session import request_key as _key
from .trace import ReplaySession

DEFAULT_TOKENS = 16
PROGRESS_EVERY_S = 0.5
KEPT_RESULTS = 64  # tabs whose last comparison is kept (redrawn on a language switch)
# Each format's engine holds its own copy of the weights: ~0.54 GB fp32, ~0.3 GB bf16 (+ its prefill copy),
# ~0.4 GB int8 and q4 (their prefill kernels keep a bf16 copy too). Loaded once per process and never more than
# one per format (kernels.FORMATS: four), so the panel costs at most ~1.5-2 GB beside the served model.
ENGINE_KV_MEMORY = 4 << 20  # each comparison runs in sessions with their own pools: the engine's own stays tiny
_comparing = threading.Lock()  # one comparison in the whole server: it shares the one compute thread


class FormatEngines:
    """The served engine for its own format, and one engine per other format, loaded when first asked for."""

    def __init__(self, holder, registry):
        self.holder, self.registry = holder, registry
        self._loaded: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, fmt: str, on_load=None):
        base = self.registry.base
        if base is None:
            raise RuntimeError("model still loading")
        if base.model.weights == fmt:
            return base
        with self._lock:
            if fmt not in self._loaded:
                from engine import Engine

                if on_load:
                    on_load(fmt)
                self._loaded[fmt] = Engine.from_pretrained(self.holder.source, device=self.holder.device,
                                                           weights=fmt, kv_memory=ENGINE_KV_MEMORY)
            return self._loaded[fmt]


def texts_html(cmp, lang: str) -> str:
    """Each format's greedy text, the part after its first token that differs from fp32's highlighted."""
    if cmp is None:
        return ""
    rows = []
    for r in cmp.runs:
        same = r.text.startswith(r.common_text)
        head, rest = (r.common_text, r.text[len(r.common_text):]) if same else ("", r.text)
        colour = charts.FORMAT_COLORS[r.weights]
        rows.append(f'<div class="il-fmt-text"><b style="color:{colour}">{r.weights}</b> '
                    f'{markup(head)}<mark>{markup(rest)}</mark></div>')
    return (f'<p class="il-explain">{html.escape(t("formats.texts", lang))}</p>' + "".join(rows))


class FormatsHandlers:
    def __init__(self, lab):
        self.lab = lab  # LabHandlers: sessions, the model holder
        self.out = lab.delivery
        self.engines = FormatEngines(lab.holder, lab.registry)
        self.results: OrderedDict = OrderedDict()  # tab key -> its last FormatsComparison
        lab.formats = self  # the server's handlers, reachable from the app (app.state.formats)

    def payload(self, cmp, lang: str, message: str = "") -> dict:
        m = self.lab.holder.machine or {}
        p = {"figs": charts.all_charts(cmp, m.get("bandwidth"), m.get("peak_flops"), lang),
             "html": {"html-formats-texts": texts_html(cmp, lang)}, "op": "formats"}
        if message:
            p["html"]["html-message"] = render.message_html(message)
        return p

    def compare(self, formats, tokens, prompt, chat, system, lang, request: gr.Request = None):
        out = None
        for out in self.compare_live(formats, tokens, prompt, chat, system, lang, request):
            pass
        return out

    def compare_live(self, formats, tokens, prompt, chat, system, lang, request: gr.Request = None):
        """Load what is missing, run the comparison on a thread of its own, and say every PROGRESS_EVERY_S
        what runs; then the charts."""
        try:
            lang = lang_of(lang)
            s = self.lab._session(request)  # the model is loaded (or this says it is still loading)
            if isinstance(s, ReplaySession):
                raise Refusal("formats.replay")
            if not isinstance(prompt, str) or not prompt.strip():
                raise Refusal("formats.no_prompt")
            picked = [f for f in FORMATS if f == REFERENCE or f in (formats or [])]
            n = int(tokens or DEFAULT_TOKENS)
            if not 1 <= n <= MAX_COMPARE_TOKENS:
                raise ValueError(f"tokens must be between 1 and {MAX_COMPARE_TOKENS} (got {n})")
            if not _comparing.acquire(blocking=False):
                raise Refusal("formats.busy")
            state, done, start = {"line": ("loading", REFERENCE, 0, n)}, {}, time.monotonic()

            def work():
                try:  # released here, not by the handler: a page closed mid-way must not free it early
                    engines = {f: self.engines.get(f, lambda fmt: state.update(line=("loading", fmt, 0, n)))
                               for f in picked}
                    return compare_formats(engines, prompt, n, chat=bool(chat), system=system or None,
                                           progress=lambda fmt, stage, k, total: state.update(
                                               line=(stage, fmt, k, total)))
                finally:
                    _comparing.release()

            worker = threading.Thread(target=lambda: done.update(self._run(work)), daemon=True,
                                      name="inferlab-formats")
            worker.start()
            while worker.is_alive():
                stage, fmt, k, total = state["line"]
                yield self.out.message(t(f"formats.{stage}", lang).format(fmt=fmt, k=k, n=total,
                                                                            s=int(time.monotonic() - start)))
                worker.join(PROGRESS_EVERY_S)
            if "error" in done:
                raise done["error"]
            cmp = done["value"]
            key = _key(request)
            self.results[key] = cmp
            self.results.move_to_end(key)
            while len(self.results) > KEPT_RESULTS:
                self.results.popitem(last=False)
            msg = t("formats.done", lang).format(fmts=", ".join(r.weights for r in cmp.runs),
                                                 n=len(cmp.reference_ids), s=int(time.monotonic() - start))
            yield self.out.deliver(self.payload(cmp, lang, msg), key)
        except Exception as exc:  # noqa: BLE001 - a message on the page, never a traceback
            yield self.out.error(exc, lang)

    @staticmethod
    def _run(work) -> dict:
        try:
            return {"value": work()}
        except Exception as exc:  # noqa: BLE001 - handed to the handler, which shows it as a message
            return {"error": exc}

    def redraw(self, lang, request: gr.Request = None):
        """The tab's last comparison in the page's new language (nothing when it has none)."""
        cmp = self.results.get(_key(request))
        if cmp is None:
            return gr.skip()
        return self.out.deliver(self.payload(cmp, lang_of(lang)), _key(request))


def header_html(lang: str) -> str:
    return (f'<h3 id="html-title-formats">{html.escape(t("formats.title", lang))}</h3>'
            f'<p class="il-explain">{html.escape(t("formats.text", lang))}</p>')


def charts_html() -> str:
    chart_divs = "".join(f'<div id="{cid}" class="il-chart {cid}"></div>' for cid in charts.CHART_IDS)
    return (f'<div class="il-charts il-formats-charts">{chart_divs}</div>'
            '<div id="html-formats-texts" class="il-html html-formats-texts"></div>')


def format_choices() -> list[str]:
    return [f for f in FORMATS if f != REFERENCE]
