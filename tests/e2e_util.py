"""Helpers for browser tests: a real uvicorn server on a free port and Debian's Chromium via Playwright."""
from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("INFERLAB_CHROMIUM", "/usr/bin/chromium")
# Where tests put the pictures they take along the way: an ignored folder (build/), so a run never rewrites the
# curated screenshots in assets/screenshots/ (tests/screenshots.py, run as a script, makes those).
TEST_SHOTS = Path(os.environ.get("INFERLAB_TEST_SHOTS")
                  or Path(__file__).resolve().parent.parent / "build" / "test-shots")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_available() -> bool:
    return os.path.exists(CHROMIUM) or shutil.which("chromium") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app):
    """Serve an ASGI app with uvicorn on a free loopback port, in this process, until the block exits; yields
    its URL. As `python -m app` serves: proxy_headers=False, so the client address is the lab's own rule's
    (uvicorn would otherwise believe X-Forwarded-For from any loopback peer)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           proxy_headers=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def running_server(base_engine, kv_memory: int | None = 32 * 1024 * 1024, presenter_token: str | None = None,
                   **create_kwargs):
    """Serve the lab in this process (sharing the loaded model) until the block exits (`create_kwargs`: more
    of create_app's settings, e.g. api=ApiSettings(...)); yields (url, app)."""
    from app.server import create_app

    app, holder = create_app(base=base_engine, kv_memory=kv_memory, presenter_token=presenter_token,
                             **create_kwargs)
    with serving(app) as url:
        yield url, app


@contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def served_lab(base_engine):
    """(url, app, browser): a real server on the shared model and Chromium, for a test module's fixture."""
    with running_server(base_engine) as (url, app):
        with browser() as b:
            yield url, app, b


def open_lab(b, url: str, width: int = 1600, height: int = 1000):
    # a Browser takes the viewport per page; a BrowserContext (a separate "tab" with its own cookies) has one
    page = b.new_page(viewport={"width": width, "height": height}) if hasattr(b, "new_context") else b.new_page()
    page.goto(url)
    page.wait_for_selector("#step", timeout=60000)
    page.wait_for_function("() => window.inferlab && window.Plotly", timeout=60000)
    page.wait_for_selector(".il-ready", timeout=60000)
    return page


def renders(page) -> int:
    return page.evaluate("() => window.inferlab.state.renders")


def click_and_wait(page, selector: str, timeout: float = 60000) -> None:
    """Click a control and wait until the page has drawn the payload that click produced.

    A Step click waits for a step payload: a view refresh (lab.js asks for charts that scrolled into view)
    is also a render and could otherwise end the wait before the step's own payload arrived."""
    if "step" in selector and "tour" not in selector:
        before = page.evaluate("() => window.inferlab.state.ops.step || 0")
        page.click(selector)
        page.wait_for_function(f"() => (window.inferlab.state.ops.step || 0) > {before}", timeout=timeout)
        return
    before = renders(page)
    page.click(selector)
    page.wait_for_function(f"() => window.inferlab.state.renders > {before}", timeout=timeout)


def click_until_message(page, selector: str, text: str, timeout: float = 60000) -> None:
    """Click a control whose answer is a message line, and wait for that line: the page draws other payloads
    meanwhile (a View answer for charts that scrolled into view), so any render would not do."""
    page.click(selector)
    page.wait_for_function("txt => document.querySelector('#html-message').innerText.includes(txt)", arg=text,
                           timeout=timeout)


def chart_traces(page, chart_id: str):
    return page.evaluate(f"""() => {{
        const el = document.getElementById('{chart_id}');
        return el && el.data ? el.data.map(t => ({{type: t.type || 'scatter', n: (t.y || t.z || t.x ||
            (t.cells && t.cells.values) || []).length, name: t.name || ''}})) : null;
    }}""")


def ensure_drawn(page, chart_id: str, timeout: float = 30000) -> None:
    """Scroll a chart into view and wait until its current figure is drawn (charts draw lazily)."""
    # drawing other charts can shift the layout, so the predicate scrolls the chart back into view each poll
    page.wait_for_function(
        """id => { const s = window.inferlab.state; const el = document.getElementById(id);
                   const r = el.getBoundingClientRect();
                   if (r.bottom < 0 || r.top > window.innerHeight) { el.scrollIntoView({block: 'center'}); return false; }
                   return !s.stale[id] && !s.pending[id] && el.data && el.data.length > 0; }""",
        arg=chart_id, timeout=timeout, polling=250)
