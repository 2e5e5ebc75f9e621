"""The ASGI app: static files first, then Gradio mounted at "/" (routes declared before the mount win)."""
from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

# module level, not inside create_app: FastAPI resolves the string annotations (PEP 563) from module globals
from fastapi import WebSocket

STATIC = Path(__file__).resolve().parent.parent / "static"
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
# Gradio's POST routes whose body is a form (the trace upload), not JSON: they keep the Origin rule only
GRADIO_FORM_POSTS = ("/gradio_api/upload", "/gradio_api/process_recording")
log = logging.getLogger("inferlab")


@dataclass
class ModelHolder:
    """Loading state of the one model this process serves; every tab's engine shares its weights."""

    source: str = "bundled"
    device: str = "cpu"
    ready: bool = False
    progress: float = 0.0
    message: str = ""
    error: str = ""
    model_id: str = ""
    spec: object = None
    machine: dict = field(default_factory=dict)

    def load(self, registry, **engine_kwargs) -> None:
        from engine import Engine, native
        from engine.metrics import measure_bandwidth, measure_peak_flops

        def progress(fraction: float, message: str) -> None:
            self.progress, self.message = fraction, message

        try:
            base = Engine.from_pretrained(self.source, device=self.device, progress=progress, **engine_kwargs)
            self.message = "measuring this machine's bandwidth and matmul speed"
            self.machine = {"bandwidth": measure_bandwidth(base.device), "peak_flops": measure_peak_flops(base.device)}
        except ValueError as exc:  # ModelLoadError and bad settings: a message, no traceback anywhere
            log.error("model load failed: %s", exc)
            self.error = f"Could not load model {self.source!r}: {exc}"
            return
        except Exception as exc:  # noqa: BLE001 - unexpected: the console keeps the traceback, the page a message
            log.exception("model load failed")
            self.error = f"Could not load model {self.source!r}: {type(exc).__name__}: {exc}"
            return
        self.model_id, self.spec = base.model_id, base.spec
        log.info("weights %s; kernels: %s; the lab's CPU kernels: %s", base.model.weights, base.model.kernels(),
                 native.status())
        registry.base = base
        gc.freeze()  # what loading made lives as long as the process: later collections need not walk it
        self.ready, self.progress, self.message = True, 1.0, "ready"


def head_html() -> str:
    """The head of both pages (the lab, and /follow): the page constants (app/protocol.py, as window.INFERLAB)
    before the scripts that read them, Plotly, lab.js and the style sheet."""
    from .protocol import constants_script

    return (constants_script() + '<script src="/lab-static/plotly.min.js"></script>'
            '<script src="/lab-static/lab.js"></script>'
            '<link rel="stylesheet" href="/lab-static/lab.css">')


def follow_html(lang: str = "en") -> str:
    """The viewer page: the lab's panels without any control; static/follow.js fills them from /ws/follow.
    Its own status line is in `lang` (?lang=ru); the panels come in the presenter's language."""
    import html
    import json

    from .i18n import lang_of, texts
    from .ui import panels_html

    lang = lang_of(lang)
    say = texts("follow", lang)
    table = json.dumps(dict(say), ensure_ascii=False).replace("</", "<\\/")  # inside a <script>
    return (f'<!doctype html><html lang="{lang}"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(say["title"])}</title>'
            '<script>window.INFERLAB_ROLE = "viewer";'
            f'window.INFERLAB_FOLLOW = {table};</script>'
            + head_html() +
            '</head><body class="il-follow"><header class="il-follow-head"><h1>InferLab</h1>'
            f'<span id="follow-status" class="il-follow-status">{html.escape(say["connecting"])}</span>'
            '<span id="follow-last" class="il-follow-last"></span></header>'
            f'<div id="follow-load" class="il-follow-load" hidden></div>'
            f'<main class="il-main">{panels_html()}</main>'
            '<script src="/lab-static/follow_load.js"></script>'
            '<script src="/lab-static/follow.js"></script></body></html>')


def create_app(source: str = "bundled", device: str = "cpu", kv_memory: int | None = None, base=None,
               presenter_token: str | None = None, max_sessions: int = 24,
               allowed_origins: tuple[str, ...] | None = None, socketless_timeout_s: float = 300.0,
               weights: str = "fp32", api=None, wrong_token_delay_s: float = 1.0, page_loads=None,
               listen_host: str = "127.0.0.1"):
    """Build the FastAPI app. With `base` (an Engine) no loading happens: used by tests.

    `presenter_token`: the lecture-mode secret (default: $INFERLAB_PRESENTER_TOKEN, else a random one,
    readable as app.state.hub.token and printed by `python -m app`).
    `kv_memory`: bytes of the room's one shared KV pool (app/session.py ROOM_KV_MEMORY when None).
    `max_sessions`: tabs served at once (all in one shared engine); past it a visitor reads "the lab is full".
    `allowed_origins`: websocket origins accepted besides the page's own host (default:
    $INFERLAB_ALLOWED_ORIGINS, comma-separated), e.g. a Space's https://NAME.hf.space.
    `socketless_timeout_s`: a session whose page has no open websocket (an API client) is freed after this long
    without an event.
    `weights`: the format the model's projections run in ("fp32", "bf16", "int8", "q4": engine/kernels.py).
    `api`: app.openai_api.ApiSettings for /v1 and /metrics (default: on, no key: python -m app decides it). Its
    `proxies` (--forwarded-allow-ips) also decide whose address a page load or a presenter token counts against.
    `wrong_token_delay_s`: how long a wrong presenter token's answer waits (per client address, app/live.py).
    `page_loads`: app.session.PageLoads, the per-address limit of page loads (default: PAGE_LOAD_BURST, then
    PAGE_LOADS_PER_MINUTE).
    `listen_host`: the address uvicorn listens on; on loopback every request must name this machine as its Host
    (app/web_guard.py: no DNS rebinding).
    """
    import os

    import gradio as gr
    import plotly
    from fastapi import FastAPI
    from fastapi.responses import FileResponse, HTMLResponse
    from fastapi.staticfiles import StaticFiles

    from . import downloads, openai_api, render
    from .delivery import RoomPusher
    from .live import Hub, Lecture, PresenterSocket, follower_message
    from .room_load import RoomLoad, room_batches
    from .i18n import Refusal
    from .session import LabSession, SessionRegistry
    from .ui import build_demo
    from .web_guard import WebGuard, openai_refusal

    # The room's engine thread releases the interpreter lock around every tensor operation and must win it
    # back while other threads build pages: a 0.2 ms switch interval (Python's default is 5 ms) bounds each
    # wait; a forward pass is a few hundred operations.
    sys.setswitchinterval(0.0002)
    registry = SessionRegistry(kv_memory=kv_memory, max_sessions=max_sessions,
                               socketless_timeout_s=socketless_timeout_s, page_loads=page_loads)
    api = api or openai_api.ApiSettings()
    downloads.remove_stale()
    holder = ModelHolder(source=source, device=device)
    if base is not None:
        from engine.metrics import measure_bandwidth, measure_peak_flops

        registry.base = base
        holder.model_id, holder.spec, holder.ready, holder.progress = base.model_id, base.spec, True, 1.0
        holder.machine = {"bandwidth": measure_bandwidth(base.device), "peak_flops": measure_peak_flops(base.device)}
    else:
        threading.Thread(target=holder.load, args=(registry,), kwargs={"weights": weights}, daemon=True,
                         name="model-loader").start()

    app = FastAPI(title="InferLab")
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

    @app.get("/lab-static/plotly.min.js")
    def plotly_bundle():
        # one Plotly per page: ours, from the plotly package (no CDN: the lab must work offline)
        return FileResponse(plotly_js, media_type="application/javascript")

    @app.get("/healthz")
    async def healthz():  # on the event loop: a busy thread pool (20 tabs stepping) stalled it for seconds
        # sessions and KV blocks in use: what an operator (and bench/soak.py) watches for leaks
        return {"ready": holder.ready, "progress": holder.progress, "error": holder.error,
                "sessions": len(registry.sessions), "max_sessions": registry.max_sessions,
                "kv_blocks_used": registry.kv_blocks_used(),
                "room": None if registry.room is None else registry.room.stats()}

    if allowed_origins is None:
        allowed_origins = tuple(o for o in os.environ.get("INFERLAB_ALLOWED_ORIGINS", "").split(",") if o.strip())
    if os.environ.get("SPACE_HOST"):  # on a Hugging Face Space its own page is https://SPACE_HOST
        allowed_origins = (*allowed_origins, "https://" + os.environ["SPACE_HOST"])
    # one rule for whose request it is, everywhere: the API's (X-Forwarded-For only from a known proxy)
    hub = Hub(presenter_token or os.environ.get("INFERLAB_PRESENTER_TOKEN") or None, allowed_origins,
              tab_key=registry.key_for_ticket, proxies=api.proxies, wrong_token_delay_s=wrong_token_delay_s)
    registry.has_socket, registry.on_create = hub.has_tab, hub.tab_ready
    hub.tab_has_session = lambda key: key in registry.sessions
    hub.on_tab_closed = registry.peek  # the socket-less idle clock starts when the page's socket closes

    def lecture_frame(s, view):
        lang, layer, head, word, npos = view
        # the followers' pages: the presenter's tab is marked as the presenter's, not as "you"
        frame = render.build_payload(s, lang, layer, head, word, npos, holder.machine, None, "", "info", only=None,
                                     me_mark="room_presenter")
        if getattr(s, "tour", None):
            frame["tour"] = s.tour  # viewers' pages follow the presenter's guided tour
        return frame

    lecture = Lecture(hub, lecture_frame)

    def lecture_session():
        if registry.base is None:
            raise RuntimeError("the model is still loading")
        return LabSession.create(registry.room, kind="lecture")  # the lecture is one more owner in the room

    # load from the room: the presenter asks every follower's page to send one request to this lab's /v1 at once
    room_load = RoomLoad(lambda rnd, owners: room_batches(registry.room.records() if registry.room else [], rnd,
                                                          owners))
    lecture.load = room_load
    lecture.load_request = lambda: {"url": "/v1/chat/completions",
                                    "model": openai_api.served_name(holder.model_id)}
    presenter = PresenterSocket(hub, lecture, lecture_session, room_load, lecture.load_request)

    def tab_closed(key):  # a closed (or swept) tab stops presenting
        if lecture.is_presenter(key):
            lecture.stop()

    registry.on_drop = tab_closed

    demo = build_demo(registry, holder, hub, lecture)  # mounted last: routes declared before the mount win
    delivery = demo.lab_handlers.delivery
    hub.on_tab_opened = lambda key: delivery.views.of(key).forget_sent()  # a new socket: the page redraws all

    def open_tab_session(key):
        # a page load makes no session (a script calling it 30 times took every place): the socket's first use
        # does; a full lab is said on the socket, in the payload shape every message takes
        if registry.base is None:
            return None  # still loading: the page's first Step (through Gradio) says so
        try:
            registry.socket_opened(key)
        except Refusal as exc:
            import json

            return json.loads(delivery.error(exc, "en"))
        return None

    hub.open_tab_session = open_tab_session
    pusher = RoomPusher(delivery)  # the room's steps on the tabs that watch the room without stepping
    pusher.start()

    async def tab_message(ch, data):
        # a Step sent by the page itself; one at a time per tab, in the order clicked
        await asyncio.to_thread(demo.lab_handlers.tab_message, ch.session_key, data)

    @app.websocket("/ws/lab")
    async def tab_socket(ws: WebSocket, ticket: str = ""):
        # this tab's own payloads (see app/live.py); the ticket came to the page over its own Gradio event
        await hub.serve(ws, "tab", ticket=ticket[:64], on_message=tab_message)

    follower_reports = follower_message(room_load)  # read-only, but for a room load's report

    @app.websocket("/ws/follow")
    async def follow_socket(ws: WebSocket):
        await hub.serve(ws, "viewer", on_message=follower_reports)

    @app.websocket("/ws/present")
    async def present_socket(ws: WebSocket):
        # the scripted lecture's session is freed when its last script's socket closes (presenter.closed)
        await hub.serve(ws, "unauthenticated", on_message=presenter.handle, on_close=presenter.closed)

    @app.get("/follow")
    def follow_page(lang: str = "en"):
        return HTMLResponse(follow_html(lang))

    # the OpenAI-compatible API and /metrics: requests are owners in the same room as the tabs
    app.state.api_settings = api
    app.state.api_metrics = openai_api.mount(app, registry, holder, app.state.api_settings, room_load)
    app.state.room_load = room_load

    # not "/static": Gradio serves its own fonts and scripts there, and a mount declared first would hide them
    app.mount("/lab-static", StaticFiles(directory=str(STATIC)), name="lab-static")
    # uploads (traces) are capped by Gradio before they reach a handler; app/trace.py checks what is inside
    # footer_links=[]: no Gradio footer. Its links (Gradio's API page, settings, run history) are not the lab's,
    # and their text follows the browser's language, not the page's switch: a Russian page showed them English.
    app = gr.mount_gradio_app(app, demo, path="/", head=head_html(), theme=gr.themes.Soft(), ssr_mode=False,
                              max_file_size=MAX_UPLOAD_BYTES, footer_links=[])
    # the one gate of every request, Gradio's included (app/web_guard.py): no foreign page changes state, and on
    # loopback no request for another host name is answered. Gradio's uploads are multipart from its own page.
    app.add_middleware(WebGuard, origins=lambda: (*api.allowed_origins, *hub.allowed_origins),
                       pin_host=listen_host in openai_api.LOOPBACK and not os.environ.get("SPACE_HOST"),
                       form_paths=GRADIO_FORM_POSTS, refusal=openai_refusal)
    app.state.registry, app.state.holder, app.state.hub, app.state.lecture = registry, holder, hub, lecture
    app.state.formats = getattr(demo.lab_handlers, "formats", None)  # the weight-formats panel's handlers
    app.state.pusher = pusher
    return app, holder
