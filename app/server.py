"""The ASGI app: static files first, then Gradio mounted at "/" (routes declared before the mount win)."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

STATIC = Path(__file__).resolve().parent.parent / "static"
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
        from engine import Engine
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
        registry.base = base
        self.ready, self.progress, self.message = True, 1.0, "ready"


def head_html() -> str:
    return ('<script src="/static/plotly.min.js"></script>'
            '<script src="/static/lab.js"></script>'
            '<link rel="stylesheet" href="/static/lab.css">')


def create_app(source: str = "bundled", device: str = "cpu", kv_memory: int | None = None, base=None):
    """Build the FastAPI app. With `base` (an Engine) no loading happens: used by tests."""
    import gradio as gr
    import plotly
    from fastapi import FastAPI
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    from .session import SessionRegistry
    from .ui import build_demo

    registry = SessionRegistry(kv_memory=kv_memory)
    holder = ModelHolder(source=source, device=device)
    if base is not None:
        from engine.metrics import measure_bandwidth, measure_peak_flops

        registry.base = base
        holder.model_id, holder.spec, holder.ready, holder.progress = base.model_id, base.spec, True, 1.0
        holder.machine = {"bandwidth": measure_bandwidth(base.device), "peak_flops": measure_peak_flops(base.device)}
    else:
        threading.Thread(target=holder.load, args=(registry,), daemon=True, name="model-loader").start()

    app = FastAPI(title="InferLab")
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

    @app.get("/static/plotly.min.js")
    def plotly_bundle():
        # one Plotly per page: ours, from the plotly package (no CDN: the lab must work offline)
        return FileResponse(plotly_js, media_type="application/javascript")

    @app.get("/healthz")
    def healthz():
        return {"ready": holder.ready, "progress": holder.progress, "error": holder.error}

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    demo = build_demo(registry, holder)
    app = gr.mount_gradio_app(app, demo, path="/", head=head_html(), theme=gr.themes.Soft(), ssr_mode=False)
    app.state.registry, app.state.holder = registry, holder
    return app, holder
