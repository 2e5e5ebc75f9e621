"""Export one chart of the page as a PNG image or as a standalone HTML file that works offline.

PNG goes through kaleido 1.x, which drives a headless Chromium (it finds Debian's /usr/bin/chromium by
itself). Starting Chromium costs ~3 s, so the first PNG starts kaleido's persistent server and later ones take
~0.3 s; kaleido's server is not safe for concurrent callers, so a lock serialises them. HTML inlines the
plotly.js bundled with the plotly package, so the file opens without a network.
"""
from __future__ import annotations

import html
import json
import os
import re
import threading
from pathlib import Path

from .render import CHART_IDS

FORMATS = ("png", "html")
DEFAULT_HEIGHT = 500
RENDER_TIMEOUT_S = 60
MAX_PIXELS = 4096  # width/height (times scale) of one image: enough for a slide, bounded for the server

_png_lock = threading.Lock()


def figure_png(fig: dict, width: int = 900, height: int | None = None, scale: float = 1) -> bytes:
    """The figure as PNG bytes. height=None uses the figure's own layout height (the grids and the logit
    lens set one), else DEFAULT_HEIGHT."""
    _check_figure(fig)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 8:
        raise ValueError(f"scale must be in (0, 8] (got {scale!r})")
    height = height or (fig.get("layout") or {}).get("height") or DEFAULT_HEIGHT
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 16 <= v * scale <= MAX_PIXELS:
            raise ValueError(f"{name} × scale must be between 16 and {MAX_PIXELS} pixels (got {v!r} × {scale!r})")
    import kaleido  # imported here: only PNG export needs it (and it pulls in a browser driver)

    opts = dict(format="png", width=int(width), height=int(height), scale=scale)
    with _png_lock:
        try:
            # a no-op once running. mathjax=False: the default loads MathJax from a CDN, which offline
            # machines cannot reach; timeout bounds a stuck render instead of hanging the handler
            kaleido.start_sync_server(mathjax=False, timeout=RENDER_TIMEOUT_S, silence_warnings=True)
            return kaleido.calc_fig_sync(fig, opts=opts)
        except Exception as exc:  # noqa: BLE001 - the browser's failure becomes one clear line
            name = type(exc).__name__
            if "ChromeNotFound" in name or "BrowserFailed" in name:
                raise RuntimeError("PNG export needs Chromium: install it (apt-get install chromium)") from None
            raise RuntimeError(f"PNG export failed ({name}: {str(exc).splitlines()[0] if str(exc) else ''})") \
                from None


def figure_html(fig: dict, title: str) -> str:
    """A standalone HTML page with the interactive figure; plotly.js is inlined, so it works offline."""
    _check_figure(fig)
    import plotly.io as pio

    # validate=False: the figure is already plain Plotly JSON (the page draws the same dict with Plotly.react)
    body = pio.to_html(fig, include_plotlyjs=True, full_html=False, validate=False,
                       config={"displaylogo": False, "responsive": True}, default_width="100%",
                       default_height=f"{int((fig.get('layout') or {}).get('height') or DEFAULT_HEIGHT)}px")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<style>body{margin:16px;font-family:Inter,system-ui,sans-serif}</style>\n</head>\n<body>\n"
            f"{body}\n</body>\n</html>\n")


def chart_title(fig: dict, chart_id: str) -> str:
    """A plain-text title for a chart file: the figure's own title without markup, else the chart id."""
    title = ((fig.get("layout") or {}).get("title") or {})
    text = title.get("text") if isinstance(title, dict) else title
    text = re.sub(r"<[^>]+>", " ", str(text or "")).strip()
    return html.unescape(text) or chart_id


def chart_file(figs: dict, chart_id: str, fmt: str, directory: str | os.PathLike, **png_options) -> Path:
    """Write chart `chart_id` of a payload's figures (payload["figs"]) as `fmt` ("png" or "html") into
    `directory` and return the file's path (for a download button). png_options go to figure_png."""
    if chart_id not in CHART_IDS:
        raise ValueError(f"unknown chart {chart_id!r}; charts are: {', '.join(CHART_IDS)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")
    fig = (figs or {}).get(chart_id)
    if fig is None:
        raise ValueError(f"chart {chart_id!r} has not been drawn yet: scroll it into view and try again")
    path = Path(directory) / f"inferlab-{chart_id.removeprefix('chart-')}.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "png":
        path.write_bytes(figure_png(fig, **png_options))
    else:
        path.write_text(figure_html(fig, f"InferLab · {chart_title(fig, chart_id)}"), encoding="utf-8")
    return path


def _check_figure(fig) -> None:
    if not isinstance(fig, dict) or not isinstance(fig.get("data", []), list):
        raise ValueError("a figure must be a Plotly figure dict with a 'data' list")
    try:
        json.dumps(fig, allow_nan=False)  # non-JSON content would fail inside the browser with a worse message
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the figure is not plain JSON ({exc})") from None
