"""Attach mode's web page: `python -m app --attach URL [--api-key K] [--model NAME]` serves this instead of the lab.

A separate page (no local model is loaded): a prompt box and the panels an OpenAI-compatible server can feed,
each drawn by app/charts/attach.py from the server's answers (app/attach.py). `POST /attach/ask` streams the
page one JSON frame per line while the server's answer streams in; `GET /attach/top` redraws the top-N chart at
another token; `GET /attach/metrics` (polled by the page) the server's /metrics over time. One user at a
time is the expected use (a lecturer's laptop); a few requests at once are allowed, more are refused.
`POST /attach/target` points the page at another server: allowed when this page's server listens on this
machine only (127.0.0.1), else only with the presenter token, so that a public deployment does not become a
way to reach any address; either way only to an address app/attach.py's TargetPolicy allows (judged by what the
host resolves to). Every POST passes app/web_guard.py first (a JSON content type, no foreign page's Origin): a
page on another site cannot make its visitor's browser switch the target or send prompts. Lecture mode's room
load (followers at /follow): app/attach_room.py.
"""
from __future__ import annotations

import asyncio
import html
import json
import logging
import threading
import time
from pathlib import Path

import httpx
from fastapi import Request

from .attach import MAX_PROMPT_CHARS, MAX_TOKENS, MAX_TOP, AttachTarget, TargetPolicy, parse_target_url
from .attach_room import check_token, mount_room, room_batches, watch_metrics
from .attach_tokens import Tokenizer, display_name
from .charts import attach as charts
from .i18n import Refusal, lang_of, texts
from .live import Hub
from .openai_api import LOOPBACK
from .room_load import RoomLoad
from .web_guard import Refused, WebGuard, read_body

log = logging.getLogger("inferlab")

MAX_RUNNING = 4  # requests to the server at once from this page
FRAME_EVERY_S = 0.1  # the page is sent at most this many frames a second while an answer streams
MAX_BODY = 1 << 20  # a request from the page: two prompts of 20,000 characters, each escaped in JSON, fit


class Attachment:
    """The server this page is attached to and its model's tokenizer; the page can point it elsewhere (`switch`)."""

    def __init__(self, target: AttachTarget, tokenizer_name: str | None = None, policy: TargetPolicy | None = None):
        target.resolve_model()  # fails here, at start, when the server cannot be reached
        self.target, self.tokenizer = target, Tokenizer(target.model, target, tokenizer_name)
        self.policy = policy or TargetPolicy.from_environment()
        self.policy.allow_url(target.url)  # the page may come back to the server it was started with

    def switch(self, target: AttachTarget) -> None:
        # the policy first (ValueError: nothing is contacted), then the new server must answer before anything
        # changes; it is reached at the addresses judged, never at a later answer for its name
        target.pin(self.policy.check(target.url))
        target.resolve_model(timeout=10)
        self.target, self.tokenizer = target, Tokenizer(target.model, target)


def create_attach_app(url: str, api_key: str | None = None, model: str | None = None, host: str = "127.0.0.1",
                      presenter_token: str | None = None, allowed_origins: tuple[str, ...] = (),
                      tokenizer_name: str | None = None, policy: TargetPolicy | None = None):
    """The attach page for the server at `url`. `host`: where this page's server listens (pointing the page at
    another server needs the presenter token unless that is this machine only); `presenter_token`: the lecture's
    secret (the room load, the switch); `allowed_origins`: pages of other origins that may call it (the
    websockets' list, --allow-origin); `tokenizer_name`: load the tokenizer from this name instead of the
    server's model name; `policy`: where the page may point it (default: loopback, `url`'s own addresses and
    $INFERLAB_ATTACH_ALLOW)."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from fastapi.staticfiles import StaticFiles

    from .server import STATIC

    attachment = Attachment(AttachTarget(parse_target_url(url), api_key, model), tokenizer_name, policy)
    hub = Hub(presenter_token, allowed_origins)
    load = RoomLoad(room_batches(attachment))
    load.on_start = watch_metrics(attachment, load)  # the round's batches: the server's /metrics while it runs
    local = host in LOOPBACK
    state = {"run": None}
    slots = threading.BoundedSemaphore(MAX_RUNNING)
    app = FastAPI(title="InferLab attach")
    # every POST (this page's, the room's) needs a JSON body and no foreign Origin: the sockets' rule and list;
    # on loopback, every request names this machine as its host (no DNS rebinding)
    app.add_middleware(WebGuard, origins=lambda: hub.allowed_origins, pin_host=local)

    @app.get("/")
    def page(lang: str = "en"):
        t = attachment.target
        return HTMLResponse(page_html(lang_of(lang), t.url, t.model, local))

    @app.get("/lab-static/plotly.min.js")
    def plotly_bundle():  # the lab's own Plotly, from the plotly package (no CDN: this works offline too)
        import plotly
        from fastapi.responses import FileResponse

        return FileResponse(Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
                            media_type="application/javascript")

    @app.post("/attach/ask")
    async def ask(request: Request):
        try:
            body = await _body(request)
            lang, prompt, system, params = _checked(body)
        except Refused as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        except (ValueError, TypeError, KeyError) as exc:
            return JSONResponse({"error": str(exc)[:300]}, status_code=400)
        if not slots.acquire(blocking=False):
            return JSONResponse({"error": f"at most {MAX_RUNNING} requests at once"}, status_code=429)
        target, tokenizer = attachment.target, attachment.tokenizer

        def frames():
            try:
                tokens = tokenizer.render(prompt, system)
                last = 0.0
                for run in target.stream_chat(prompt, params, system):
                    state["run"] = run
                    if run.done or time.monotonic() - last >= FRAME_EVERY_S:
                        last = time.monotonic()
                        yield json.dumps(frame(run, lang, tokens, tokenizer.note), ensure_ascii=False) + "\n"
            finally:
                slots.release()
        return StreamingResponse(frames(), media_type="application/x-ndjson")

    def frame(run, lang, tokens, why) -> dict:
        server = (run.usage or {}).get("prompt_tokens")
        return {"figs": {"attach-top": charts.top_figure(run, None, lang),
                         "attach-timing": charts.timing_figure(run, lang)},
                "html": {"attach-stream": charts.stream_html(run, lang),
                         "attach-tokens": charts.tokens_html(tokens, why, server, lang, done=run.done)},
                "tokens": len(run.tokens), "done": run.done}

    @app.get("/attach/top")
    def top(i: int = -1, lang: str = "en"):
        run = state["run"]
        index = None if i < 0 else i
        return {"figs": {"attach-top": charts.top_figure(run, index, lang_of(lang))}}

    @app.get("/attach/metrics")
    def metrics(lang: str = "en"):
        target = attachment.target
        series = target.scrape()
        # the page's next poll: a second or two while the server has metrics, the backoff after its 404
        return {"figs": {"attach-metrics": charts.metrics_figure(series, target.metrics_note, lang_of(lang),
                                                                 retry_s=target.retry_s())},
                "points": len(series), "absent": target.metrics_absent, "retry_s": target.retry_s()}

    @app.post("/attach/target")
    async def switch(request: Request):
        """Point the page at another server: from this machine only, or with the presenter token."""
        lang = "en"
        try:
            body = await _body(request)
            lang = lang_of(body.get("lang"))
            if not local:
                check_token(hub, body.get("token"), request)
            new = AttachTarget(parse_target_url(body.get("url")), _field(body, "api_key"), _field(body, "model"))
            await asyncio.to_thread(attachment.switch, new)  # the policy's name lookups too: off the event loop
        except Refused as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        except Refusal as exc:
            return JSONResponse({"error": exc.text(lang)}, status_code=403)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return JSONResponse({"error": str(exc)[:300]}, status_code=400)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": f"no answer from that server: {type(exc).__name__}: {exc}"[:300]},
                                status_code=400)
        log.info("attach page now points at %s (model %s)", new.url, new.model)
        return {"url": new.url, "model": new.model}

    mount_room(app, hub, load, attachment)
    app.mount("/lab-static", StaticFiles(directory=str(STATIC)), name="lab-static")
    app.state.attachment, app.state.hub = attachment, hub
    return app


async def _body(request) -> dict:
    """The page's JSON object (the middleware has checked its type and origin): capped, with a deadline."""
    try:
        body = json.loads(await read_body(request, MAX_BODY))
    except RecursionError:  # nesting too deep for the parser: bad JSON to the page, not a traceback
        raise ValueError("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def _field(body: dict, name: str) -> str | None:
    v = body.get(name)
    if v in (None, ""):
        return None
    if not isinstance(v, str) or len(v) > 300:
        raise ValueError(f"{name} must be a string of at most 300 characters")
    return v.strip()


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
main { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 14px; padding: 14px 20px; }
section { background: white; border: 1px solid #e2e2e2; border-radius: 8px; padding: 10px 14px; min-width: 0; }
#attach-target { overflow-wrap: anywhere; }
@media (max-width: 760px) {  /* a phone or a narrow window: one column, nothing wider than the screen */
  main { grid-template-columns: minmax(0, 1fr); padding: 10px 8px; gap: 10px; }
  header { padding: 10px 8px; } section { padding: 8px 10px; }
  .at-controls label[style] { flex: 1 1 100% !important; } .at-controls input[style] { max-width: 100%; }
}
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
.il-load-summary { font-size: 13px; line-height: 1.5; } .il-load-note { font-size: 13px; color: #555; margin: 4px 0; }
.at-template { font-size: 11px; background: #fafafa; padding: 6px; white-space: pre-wrap; max-height: 140px;
  overflow: auto; }
"""


def target_html(line: str, url: str, model: str) -> str:
    """The header's "attached to URL, model M" line: a model that is a path (llama.cpp's servers report the GGUF
    path they were started with) by its file's base name, the whole name in the hover title."""
    e = html.escape
    short = display_name(model or "")
    name = f'<span id="attach-model-name" title="{e(model or "")}">{e(short)}</span>'
    return e(line).format(url=e(url), model=name)


def page_html(lang: str, url: str, model: str, local: bool = True) -> str:
    say = texts("attach", lang)
    e = html.escape
    config = json.dumps({"lang": lang, "sending": say["sending"], "send": say["send"],
                         "switched": say["switched"]}, ensure_ascii=False).replace("</", "<\\/")
    return f"""<!doctype html><html lang="{lang}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{e(say["title"])}</title>
<style>{STYLE}</style><script>window.ATTACH = {config};</script>
<script src="/lab-static/plotly.min.js"></script></head><body>
<header><h1>{e(say["title"])}</h1><p id="attach-target">{target_html(say["target"], url, model)}</p></header>
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
<section><h2>{e(say["panel_room"])}</h2>
 <p class="at-note">{e(say["room_text"])} <a href="/follow?lang={lang}" target="_blank">/follow</a></p>
 <div class="at-controls"><label>{e(say["token"])}<input id="attach-token" type="password" style="width: 200px"></label>
 <button id="attach-room-send">{e(say["room_send"])}</button></div>
 <p id="attach-room-status" class="at-note"></p><div id="attach-room-summary"></div></section>
<section><h2>{e(say["panel_switch"])}</h2>
 <p class="at-note">{e(say["switch_local" if local else "switch_token"])}</p>
 <div class="at-controls"><label style="flex: 1 1 260px">{e(say["url"])}<input id="attach-url" style="width: 100%"
  value="{e(url)}"></label>
 <label>{e(say["api_key"])}<input id="attach-key" type="password" style="width: 140px"></label>
 <label>{e(say["model"])}<input id="attach-model" style="width: 160px"></label>
 <button id="attach-switch">{e(say["switch"])}</button></div>
 <p id="attach-switch-status" class="at-note"></p></section>
</main><script src="/lab-static/attach.js"></script></body></html>"""
