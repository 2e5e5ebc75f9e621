"""UI latency: time from a Step click to every chart redrawn in Chromium, at a 100-token sequence.

    python bench/ui_latency.py [--clicks 15] [--tokens 100] [--gap 0.5] [--view chart-sampling]

Serves the lab in-process (real engine; after the page's first Gradio event, a Step click travels over the
page's own websocket and the payload comes back on it, app/live.py), opens it in Debian's
Chromium with Playwright, brings the focused sequence to --tokens tokens, then clicks Step repeatedly. Each
measurement runs inside the page: performance.now() at the click, and again when lab.js has finished
Plotly.react on the payload that click produced (the charts on screen; charts just below or above the screen
follow in a second payload, not counted). Also prints the server-side split (engine step, payload
build) so the browser's share is visible. Target on CPU: median <= 250 ms.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from e2e_util import browser, click_and_wait, ensure_drawn, open_lab, running_server  # noqa: E402

CLICK_JS = """() => new Promise((resolve) => {
  const st = window.inferlab.state;
  const before = st.ops.step || 0;
  // lab.js marks every drawn payload on <body>; observing that attribute waits without polling, so the page
  // is as idle as a user's while the engine steps (a requestAnimationFrame poll makes frames on both cores)
  const timer = setTimeout(() => { obs.disconnect(); resolve([null, null, "{}"]); }, 30000);  // lost: counted
  const obs = new MutationObserver(() => {
    // the step's own payload (charts on screen); charts just off screen follow in a second payload
    if ((st.ops.step || 0) > before) {
      obs.disconnect(); clearTimeout(timer);
      resolve([st.opDrawn - t0, st.opStart - t0, JSON.stringify(st.opTimings)]);
    }
  });
  obs.observe(document.body, { attributes: true, attributeFilter: ["data-il-renders"] });
  const t0 = performance.now();
  document.querySelector('#step').click();  // a script click: the page does not scroll to the button
})"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clicks", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--gap", type=float, default=0.5,
                    help="seconds between clicks, as a person stepping would leave; 0 measures back-to-back "
                         "clicks, where the previous click's off-screen charts still compete for the CPU")
    ap.add_argument("--view", default="", help="a chart id to scroll into view first, e.g. chart-attention")
    args = ap.parse_args()

    from engine import Engine

    base = Engine.from_pretrained("bundled")
    with running_server(base) as (url, app), browser() as b:
        page = open_lab(b, url)
        page.fill("#prompt textarea", "Что такое гравитация? Explain it with an everyday example.")
        page.fill("#max_tokens input", "400")
        page.press("#max_tokens input", "Enter")
        click_and_wait(page, "#step")
        session = next(iter(app.state.registry.sessions.values()))
        seq = session.engine.sequences[session.focus]
        seq.params.ignore_eos = True  # keep the sequence alive long enough to measure
        while seq.num_tokens < args.tokens:
            session.step()
        if args.view:
            ensure_drawn(page, args.view)
        click_and_wait(page, "#step")  # draw the state reached server-side
        if args.view:
            ensure_drawn(page, args.view)
        else:
            page.evaluate("() => window.scrollTo(0, 0)")  # what a visitor sees first
            time.sleep(0.5)
        page.evaluate(CLICK_JS)  # one warm-up click
        times, waits, server_step, server_payload = [], [], [], []
        lost = 0
        for _ in range(args.clicks):
            time.sleep(args.gap)
            total, until_render, per_chart = page.evaluate(CLICK_JS)
            if total is None:
                lost += 1
                continue
            times.append(total)
            waits.append(until_render)
            server_step.append(session.events[-1].timing.step_ms)
        from app import render as R

        # the charts the step's own payload redrew: those on screen (the near ones follow in a second payload)
        only = {k for k in json.loads(per_chart) if k.startswith("chart-")} or None
        in_view = sorted(only or [])
        for _ in range(5):
            t = time.perf_counter()
            R.dumps(R.build_payload(session, "en", 0, 0, "", None, {"bandwidth": 2e10, "peak_flops": 1e11},
                                    only=only))
            server_payload.append((time.perf_counter() - t) * 1e3)
        n = seq.num_tokens
    med = statistics.median(times)
    print(f"sequence length at measurement: {n} tokens; {args.clicks} Step clicks {args.gap:g} s apart ({lost} never "
          f"redrawn within 30 s); charts on screen: {in_view}")
    print(f"click -> all charts redrawn (median): {med:7.1f} ms   (p90 {sorted(times)[int(0.9 * len(times)) - 1]:.1f} ms)"
          f"   target <= 250 ms")
    print(f"  engine step with full instrumentation (median): {statistics.median(server_step):7.1f} ms")
    print(f"  payload build + JSON, charts in view (median):  {statistics.median(server_payload):7.1f} ms")
    print(f"  click -> payload arrives in the page (median):  {statistics.median(waits):7.1f} ms")
    print(f"  drawing (Plotly.react of every chart, median):  {med - statistics.median(waits):7.1f} ms")
    slow = sorted(json.loads(per_chart).items(), key=lambda kv: -kv[1])[:6]
    print("  slowest charts in the last click: " + ", ".join(f"{k} {v:.0f} ms" for k, v in slow))


if __name__ == "__main__":
    main()
