"""Attach mode's web page: `python -m app --attach URL [--api-key K] [--model NAME]` serves this instead of the lab.

A separate page (no local model is loaded): a prompt box and the panels an OpenAI-compatible server can feed,
each drawn by app/charts/attach.py from the server's answers (app/attach.py). `POST /attach/ask` streams the
page one JSON frame per line while the server's answer streams in; `GET /attach/top` redraws the top-N chart at
another token; `GET /attach/metrics` (polled by the page) the server's /metrics over time. One user at a
time is the expected use (a lecturer's laptop); a few requests at once are allowed, more are refused.
"""
from __future__ import annotations

import html
import json
import logging
import threading
import time
from pathlib import Path

from fastapi import Request

from .attach import MAX_PROMPT_CHARS, MAX_TOKENS, MAX_TOP, AttachTarget
from .charts import attach as charts
from .i18n import lang_of, texts

log = logging.getLogger("inferlab")

MAX_RUNNING = 4  # requests to the server at once from this page
FRAME_EVERY_S = 0.1  # the page is sent at most this many frames a second while an answer streams


class Tokenizer:
    """The model's tokenizer, loaded in the background (the page serves at once); `note` says why not."""

    def __init__(self, model: str):
        self.tok, self.note, self.ready = None, "loading", threading.Event()
        threading.Thread(target=self._load, args=(model,), daemon=True, name="attach-tokenizer").start()

    def _load(self, model: str) -> None:
        from transformers import AutoTokenizer

        from engine.loader import BUNDLED_ID, bundled_dir

        try:
            source = str(bundled_dir()) if model in ("bundled", BUNDLED_ID.split(" (")[0]) else model
            self.tok, self.note = AutoTokenizer.from_pretrained(source), ""
        except Exception as exc:  # noqa: BLE001 - any loader failure is a note on the page, not a crash
            self.note = f"{type(exc).__name__}: {exc}"[:200]
        self.ready.set()

    def render(self, prompt: str, system: str | None) -> tuple[str | None, list[str] | None]:
        """The chat template's text and its tokens as text pieces (None, None without a tokenizer)."""
        self.ready.wait(60)
        if self.tok is None:
            return None, None
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return text, [self.tok.decode([i]) for i in ids]


def create_attach_app(url: str, api_key: str | None = None, model: str | None = None):
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from fastapi.staticfiles import StaticFiles

    from .server import STATIC

    target = AttachTarget(url, api_key, model)
    model = target.resolve_model()  # fails here, at start, when the server cannot be reached
    tokenizer = Tokenizer(model)
    state = {"run": None}
    slots = threading.BoundedSemaphore(MAX_RUNNING)
    app = FastAPI(title="InferLab attach")

    @app.get("/")
    def page(lang: str = "en"):
        return HTMLResponse(page_html(lang_of(lang), target.url, model))

    @app.get("/lab-static/plotly.min.js")
    def plotly_bundle():  # the lab's own Plotly, from the plotly package (no CDN: this works offline too)
        import plotly
        from fastapi.responses import FileResponse

        return FileResponse(Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
                            media_type="application/javascript")

    @app.post("/attach/ask")
    async def ask(request: Request):
        try:
            body = json.loads(await request.body())
            lang, prompt, system, params = _checked(body)
        except (ValueError, TypeError, KeyError) as exc:
            return JSONResponse({"error": str(exc)[:300]}, status_code=400)
        if not slots.acquire(blocking=False):
            return JSONResponse({"error": f"at most {MAX_RUNNING} requests at once"}, status_code=429)

        def frames():
            try:
                text, tokens = tokenizer.render(prompt, system)
                last = 0.0
                for run in target.stream_chat(prompt, params, system):
                    state["run"] = run
                    if run.done or time.monotonic() - last >= FRAME_EVERY_S:
                        last = time.monotonic()
                        yield json.dumps(frame(run, lang, text, tokens), ensure_ascii=False) + "\n"
            finally:
                slots.release()
        return StreamingResponse(frames(), media_type="application/x-ndjson")

    def frame(run, lang, text, tokens) -> dict:
        server = (run.usage or {}).get("prompt_tokens")
        return {"figs": {"attach-top": charts.top_figure(run, None, lang),
                         "attach-timing": charts.timing_figure(run, lang)},
                "html": {"attach-stream": charts.stream_html(run, lang),
                         "attach-tokens": charts.tokens_html(text, tokens, tokenizer.note, server, lang)},
                "tokens": len(run.tokens), "done": run.done}

    @app.get("/attach/top")
    def top(i: int = -1, lang: str = "en"):
        run = state["run"]
        index = None if i < 0 else i
        return {"figs": {"attach-top": charts.top_figure(run, index, lang_of(lang))}}

    @app.get("/attach/metrics")
    def metrics(lang: str = "en"):
        series = target.scrape()
        return {"figs": {"attach-metrics": charts.metrics_figure(series, target.metrics_note, lang_of(lang))},
                "points": len(series)}

    app.mount("/lab-static", StaticFiles(directory=str(STATIC)), name="lab-static")
    app.state.target, app.state.tokenizer = target, tokenizer
    return app


def _checked(body) -> tuple[str, str, str | None, dict]:
    """The page's request, capped before anything is sent: (lang, prompt, system, params for the server)."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    prompt, system = body.get("prompt"), body.get("system") or None
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt must be 1 to {MAX_PROMPT_CHARS} characters")
    if system is not None and (not isinstance(system, str) or len(system) > MAX_PROMPT_CHARS):
        raise ValueError(f"the system prompt must be at most {MAX_PROMPT_CHARS} characters")
    params = {"temperature": _num(body, "temperature", 0.0, 2.0, 0.0),
              "max_tokens": int(_num(body, "max_tokens", 1, MAX_TOKENS, 64, whole=True)),
              "top_logprobs": int(_num(body, "top_n", 0, MAX_TOP, 10, whole=True))}
    if body.get("seed") not in (None, ""):
        params["seed"] = int(_num(body, "seed", -(2**63), 2**63 - 1, 0, whole=True))
    return lang_of(body.get("lang")), prompt, system, params


def _num(body: dict, name: str, low: float, high: float, default: float, whole: bool = False) -> float:
    v = body.get(name)
    if v in (None, ""):
        return default
    x = float(v)
    if not low <= x <= high or (whole and not x.is_integer()):
        raise ValueError(f"{name} must be {'a whole number ' if whole else ''}in [{low:g}, {high:g}]")
    return x


STYLE = """
body { font-family: Inter, system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #222; }
header { padding: 12px 20px; background: white; border-bottom: 1px solid #ddd; }
header h1 { font-size: 20px; margin: 0 0 4px; } header p { margin: 0; font-size: 13px; color: #555; }
main { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; padding: 14px 20px; }
section { background: white; border: 1px solid #e2e2e2; border-radius: 8px; padding: 10px 14px; }
section.wide { grid-column: 1 / -1; } section h2 { font-size: 15px; margin: 2px 0 6px; }
.at-controls { display: flex; flex-wrap: wrap; gap: 10px; align-items: end; }
.at-controls label { font-size: 12px; display: flex; flex-direction: column; gap: 2px; }
.at-controls input { width: 90px; } textarea { width: 100%; box-sizing: border-box; font: inherit; }
button { padding: 6px 18px; font-size: 14px; cursor: pointer; }
.at-note { font-size: 13px; color: #555; } .at-error { color: #b00020; font-size: 13px; }
.at-stream { line-height: 2.1; } .at-delta { background: #eef3fb; border-radius: 4px; padding: 1px 3px; margin: 1px;
  white-space: pre-wrap; } .at-delta sub { color: #888; font-size: 9px; margin-left: 2px; }
.at-tokens span, .at-tok { display: inline-block; background: #f1efe8; border-radius: 3px; padding: 0 3px; margin: 1px;
  font-family: ui-monospace, monospace; font-size: 12px; white-space: pre; }
.at-template { font-size: 11px; background: #fafafa; padding: 6px; white-space: pre-wrap; max-height: 140px;
  overflow: auto; }
"""


def page_html(lang: str, url: str, model: str) -> str:
    say = texts("attach", lang)
    e = html.escape
    config = json.dumps({"lang": lang, "sending": say["sending"], "send": say["send"]}).replace("</", "<\\/")
    return f"""<!doctype html><html lang="{lang}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{e(say["title"])}</title>
<style>{STYLE}</style><script>window.ATTACH = {config};</script>
<script src="/lab-static/plotly.min.js"></script></head><body>
<header><h1>{e(say["title"])}</h1><p id="attach-target">{e(say["target"].format(url=url, model=model))}</p></header>
<main>
<section class="wide"><div class="at-controls">
 <label style="flex: 1 1 400px">{e(say["prompt"])}<textarea id="attach-prompt" rows="2">What is gravity?</textarea></label>
 <label style="flex: 1 1 250px">{e(say["system"])}<textarea id="attach-system" rows="2"></textarea></label>
 <label>{e(say["temperature"])}<input id="attach-temperature" type="number" min="0" max="2" step="0.1" value="0"></label>
 <label>{e(say["max_tokens"])}<input id="attach-max-tokens" type="number" min="1" max="{MAX_TOKENS}" value="48"></label>
 <label>{e(say["top_n"])}<input id="attach-top-n" type="number" min="0" max="{MAX_TOP}" value="10"></label>
 <label>{e(say["seed"])}<input id="attach-seed" type="number" value=""></label>
 <button id="attach-send">{e(say["send"])}</button></div>
 <p id="attach-status" class="at-error"></p></section>
<section><h2>{e(say["panel_tokens"])}</h2><div id="attach-tokens"></div></section>
<section><h2>{e(say["panel_stream"])}</h2><p class="at-note">{e(say["panel_stream_text"])}</p>
 <div id="attach-stream">{charts.stream_html(None, lang)}</div></section>
<section><h2>{e(say["panel_top"])}</h2><p class="at-note">{e(say["panel_top_text"])}</p>
 <label class="at-note">{e(say["step"])} <input id="attach-step" type="range" min="0" max="0" value="0"></label>
 <div id="attach-top"></div></section>
<section><h2>{e(say["panel_timing"])}</h2><div id="attach-timing"></div></section>
<section><h2>{e(say["panel_metrics"])}</h2><p class="at-note">{e(say["panel_metrics_text"])}</p>
 <div id="attach-metrics"></div></section>
<section><h2>{e(say["panel_absent"])}</h2><div id="attach-absent">{charts.absent_html(lang)}</div></section>
</main><script src="/lab-static/attach.js"></script></body></html>"""
