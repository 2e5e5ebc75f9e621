"""The lab after its default flow, at the widths a reader may have, in English and Russian: the flow and the
text-box check tests/test_e2e_layout.py runs, and, run as a script, the curated screenshots in
assets/screenshots/ (no test writes there: tests keep theirs in e2e_util.TEST_SHOTS): the full page at each
width and language (lab-800-en.png ... lab-1600-ru.png) and projector mode on a 1280 × 720 screen at 150 %
(projector-1280x720-*.png):

    python tests/screenshots.py            # serves the bundled model itself, Debian's Chromium
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from e2e_util import click_and_wait

SCREENSHOTS = Path(__file__).resolve().parent.parent / "assets" / "screenshots"
WIDTHS = (1600, 1280, 800)
LANGS = ("en", "ru")
WHAT_IF = {"en": "what-if", "ru": "что-если"}

# Every text the reader sees in each chart (titles, axis titles, legends, annotations, tick labels) as
# Plotly drew it: its box relative to the figure, and the figure's own size (what its SVG is drawn at).
TEXT_BOXES_JS = """(ids) => {
  const SEL = ".gtitle, .annotation-text, .legendtext, .xtick text, .ytick text, .cbaxis text, .cbtitle text, " +
              ".g-xtitle text, .g-ytitle text, .textpoint text";
  const out = {};
  for (const id of ids) {
    const div = document.getElementById(id);
    const box = div && div._fullLayout && div.querySelector(".svg-container");
    if (!box) continue;
    const at = box.getBoundingClientRect();
    // the text's own box, turned as the text is (a tick label at -30°): its four corners, the box's top and
    // bottom sixths left out (line spacing, not glyphs: one axis's stacked labels touch there)
    const quad = (el) => { const b = el.getBBox(), m = el.getScreenCTM(), y0 = b.y + b.height / 6,
                                 y1 = b.y + b.height * 5 / 6;
      return [[b.x, y0], [b.x + b.width, y0], [b.x + b.width, y1], [b.x, y1]]
        .map(([x, y]) => [m.a * x + m.c * y + m.e - at.left, m.b * x + m.d * y + m.f - at.top]); };
    const texts = [];
    for (const el of div.querySelectorAll(SEL)) {
      const r = el.getBoundingClientRect();
      if (el.closest(".hoverlayer") || !el.textContent.trim() || r.width < 1 || r.height < 1) continue;
      const tick = el.closest(".xtick, .ytick, .cbaxis");
      const trace = el.closest(".trace"), cd = trace && trace.__data__;  // a point's label: is it clipped?
      const clipped = !(cd && cd[0] && cd[0].trace && cd[0].trace.cliponaxis === false);
      const kind = tick ? "tick" : el.classList.contains("gtitle") ? "title" :
                   el.closest(".textpoint") ? (clipped ? "point" : "label") :
                   el.classList.contains("legendtext") ? "legend" : "annotation";
      texts.push({text: el.textContent.trim().slice(0, 50), kind, axis: tick ? tick.parentNode.getAttribute("class") : "",
                  x0: r.left - at.left, y0: r.top - at.top, x1: r.right - at.left, y1: r.bottom - at.top,
                  quad: quad(el)});
    }
    // a table's cells (the weight-formats table): each text against its own cell, which clips it
    for (const cell of div.querySelectorAll(".column-cell")) {
      const rect = cell.querySelector(".cell-rect"), text = cell.querySelector(".cell-text");
      if (!rect || !text || !text.textContent.trim()) continue;
      const c = rect.getBoundingClientRect(), r = text.getBoundingClientRect();
      if (r.width < 1) continue;
      texts.push({text: text.textContent.trim().slice(0, 50), kind: "cell", axis: "",
                  x0: r.left - at.left, y0: r.top - at.top, x1: r.right - at.left, y1: r.bottom - at.top,
                  cell: [c.left - at.left, c.top - at.top, c.right - at.left, c.bottom - at.top]});
    }
    const s = div._fullLayout._size;  // the plot area, which clips a point's label
    out[id] = {width: div._fullLayout.width, height: div._fullLayout.height, texts, font: div._fullLayout.font.size,
               plot: [s.l, s.t, s.l + s.w, s.t + s.h]};
  }
  return out;
}"""

# Each line a chart draws (a trace's line, a shape: the what-if frame, a roof) that runs through a text: the
# text's box, inset by 2 px, is sampled on a grid and each point is tested against the line's stroke.
STROKES_JS = """(ids) => {
  const SEL = ".gtitle, .annotation-text, .legendtext, .xtick text, .ytick text, .g-xtitle text, .g-ytitle text";
  const out = [];
  for (const id of ids) {
    const div = document.getElementById(id);
    if (!div || !div._fullLayout) continue;
    const svg = div.querySelector(".main-svg");
    const lines = [...div.querySelectorAll(".scatterlayer .js-line, .shapelayer path")].filter((p) => {
      const s = getComputedStyle(p); return s.stroke !== "none" && parseFloat(s.strokeWidth) > 0 &&
        parseFloat(s.strokeOpacity || 1) > 0 && p.getAttribute("d"); });
    // an annotation on its own background hides the lines behind it
    const covered = (el) => { const bg = el.closest(".annotation") && el.closest(".annotation").querySelector(".bg");
      const fill = bg && getComputedStyle(bg).fill, alpha = fill && fill.startsWith("rgba") ?
        parseFloat(fill.split(",")[3]) : fill && fill !== "none" ? 1 : 0;
      return alpha * parseFloat((bg && getComputedStyle(bg).fillOpacity) || 1) >= 0.7; };
    const texts = [...div.querySelectorAll(SEL)].filter((el) => !el.closest(".hoverlayer") && el.textContent.trim()
                                                                && !covered(el));
    // a trace's line is clipped to the plot area (a shape on paper coordinates is not)
    const s = div._fullLayout._size, at = svg.getBoundingClientRect();
    const clipped = (line, x, y) => line.classList.contains("js-line") &&
      (x < at.left + s.l || x > at.left + s.l + s.w || y < at.top + s.t || y > at.top + s.t + s.h);
    for (const el of texts) {
      const r = el.getBoundingClientRect();
      if (r.width < 5 || r.height < 5) continue;
      for (const line of lines) {
        const m = line.getScreenCTM().inverse();
        let hit = false;
        for (let i = 0; i <= 8 && !hit; i++) for (let j = 0; j <= 2 && !hit; j++) {
          const pt = svg.createSVGPoint();
          pt.x = r.left + 2 + (r.width - 4) * i / 8; pt.y = r.top + 2 + (r.height - 4) * j / 2;
          hit = !clipped(line, pt.x, pt.y) && line.isPointInStroke(pt.matrixTransform(m));
        }
        if (hit) { out.push([id, el.textContent.trim().slice(0, 50)]); break; }
      }
    }
  }
  return out;
}"""

ALL_DRAWN_JS = """() => { const s = window.inferlab.state;
  // the weight-formats charts are drawn by their own button (a comparison), not by stepping
  const ids = [...document.querySelectorAll('.il-chart')].filter((e) => !e.closest('.il-formats-charts'))
    .map((e) => e.id);
  if (ids.every((id) => !s.stale[id] && !s.pending[id] && document.getElementById(id)._fullLayout)) return true;
  window.inferlab.flush();  // figures that came for charts the observer has not seen yet
  return false; }"""


def default_flow(page) -> None:
    """What a newcomer does first, with speculative decoding on: a request stepped a few times (early exit at
    the model's last layer but one, greedy: drafts are accepted and rejected), in a window as tall as the page,
    so every panel is in view and the engine records what the layers panel shows. The calculators draw
    themselves once the model is loaded."""
    page.set_viewport_size({"width": page.viewport_size["width"],
                            "height": page.evaluate("() => document.documentElement.scrollHeight")})
    page.click("#speculative > button, #speculative .label-wrap")
    page.check("#spec_method input[value=early_exit]")
    page.check("#spec_on input[type=checkbox]")
    page.fill("#temperature input[type=number]", "0")
    page.press("#temperature input[type=number]", "Enter")
    page.wait_for_timeout(500)  # the setting reaches the session before the first step
    for _ in range(5):
        click_and_wait(page, "#step")


def what_if_flow(page, lang: str) -> None:
    """A plain request stepped twice and a what-if on its sampling chain (a speculative round has none)."""
    for _ in range(2):
        click_and_wait(page, "#step")
    what_if(page, lang, "1.2")


def what_if(page, lang: str, temperature: str) -> None:
    page.fill("#temperature input[type=number]", temperature)
    page.press("#temperature input[type=number]", "Enter")
    page.wait_for_function("w => document.querySelector('#html-message').innerText.toLowerCase().includes(w)",
                           arg=WHAT_IF[lang], timeout=30000)


def switch_language(page, lang: str) -> None:
    page.locator("#lang label", has_text={"en": "English", "ru": "Русский"}[lang]).click()
    page.wait_for_function("w => document.querySelector('#step').innerText.includes(w)",
                           arg={"en": "Step", "ru": "Шаг"}[lang], timeout=30000)


def show_all(page, width: int) -> None:
    """The page at `width`, its window as tall as the page, so every chart is in view and drawn."""
    page.set_viewport_size({"width": width, "height": 1000})
    page.wait_for_timeout(300)
    height = page.evaluate("() => document.documentElement.scrollHeight")
    page.set_viewport_size({"width": width, "height": height + 100})
    page.wait_for_timeout(300)
    page.evaluate("() => window.inferlab.refresh()")
    page.wait_for_function(ALL_DRAWN_JS, timeout=60000, polling=250)
    page.wait_for_timeout(500)  # Plotly's own resize after the window's (debounced)


# charts whose data labels name a few points each, and must not run into each other (a scatter of many tokens
# labels points that sit together: there they may)
LABELS_APART = frozenset({"chart-calc-roofline", "chart-roofline"})


def text_problems(page, ids: list[str] | None = None) -> list[str]:
    """Each chart text that runs off its chart (a point's label: off the plot area, which clips it; a table's
    text: off its cell), each two texts of one chart that overlap (but data labels, which sit where their points
    are, except in LABELS_APART; one axis's tick labels by their turned boxes), and each line through a text."""
    ids = ids or page.evaluate("() => [...document.querySelectorAll('.il-chart')].map((e) => e.id)")
    problems = []
    for cid, fig in page.evaluate(TEXT_BOXES_JS, ids).items():
        apart = ("cell",) if cid in LABELS_APART else ("point", "label", "cell")
        texts = [t for t in fig["texts"] if t["kind"] not in apart]
        for t in fig["texts"]:
            x0, y0, x1, y1 = fig["plot"] if t["kind"] == "point" else (0, 0, fig["width"], fig["height"])
            if t["kind"] == "cell":  # a table's text and its cell: the cell clips it
                x0, y0, x1, y1 = t["cell"]
            if t["x0"] < x0 - 1 or t["y0"] < y0 - 1 or t["x1"] > x1 + 1 or t["y1"] > y1 + 1:
                edge = "its cell's edge" if t["kind"] == "cell" else "the chart's edge"
                problems.append(f"{cid}: {t['kind']} «{t['text']}» is cut by {edge}")
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                ticks = a["kind"] == b["kind"] == "tick"
                if ticks and a["axis"] == b["axis"]:
                    # one axis's labels, turned alike: their upright boxes overlap where the labels do not (a
                    # label of two lines at -30° ran into the next one)
                    if _quads_overlap(a["quad"], b["quad"], slack=2):
                        problems.append(f"{cid}: tick «{a['text']}» overlaps tick «{b['text']}»")
                    continue
                # two axes' labels meet at a corner: their boxes are taller than the glyphs (by as much more as
                # the type is larger: projector mode)
                slack = (6 if ticks else 2) * max(1.0, (fig.get("font") or 12) / 12)
                if min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack and \
                        min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack:
                    problems.append(f"{cid}: {a['kind']} «{a['text']}» overlaps {b['kind']} «{b['text']}»")
    problems += [f"{cid}: a line runs through «{text}»" for cid, text in page.evaluate(STROKES_JS, ids)]
    return problems


def _quads_overlap(p: list, q: list, slack: float) -> bool:
    """Whether two convex quadrilaterals overlap by more than `slack` px (separating axis test on their edges)."""
    for poly in (p, q):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y0 - y1, x1 - x0
            norm = math.hypot(nx, ny) or 1.0
            a = [(x * nx + y * ny) / norm for x, y in p]
            b = [(x * nx + y * ny) / norm for x, y in q]
            if min(max(a), max(b)) - max(min(a), min(b)) <= slack:
                return False
    return True


def save_screenshot(page, width: int, lang: str) -> Path:
    """A full-page screenshot, its colours reduced to a palette: a 1600 × 12,000 px page stays under ~1.5 MB."""
    page.evaluate("() => window.scrollTo(0, 0)")
    return _save(page, SCREENSHOTS / f"lab-{width}-{lang}.png", full_page=True)


def _save(page, path: Path, full_page: bool = False) -> Path:
    from PIL import Image

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    Image.open(path).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


# what projector mode is photographed at: the screen a room's projector shows (the panel's top at the window's)
PROJECTOR_SHOTS = {"top": None, "lens": "chart-lens", "sampling": "panel-sampling"}


def projector_screenshots(b, url: str) -> list[Path]:
    """Projector mode on a 1280 × 720 screen at 150 % (a laptop on a projector), after a few steps."""
    page = b.new_page(viewport={"width": 1280, "height": 720}, device_scale_factor=1.5)
    page.goto(url)
    page.wait_for_selector(".il-ready", timeout=60000)
    page.check("#projector input[type=checkbox]")
    page.wait_for_function("() => document.documentElement.classList.contains('il-projector')")
    # stepped with the layers panel in view (Alt+S: a click would scroll to Step), so the logit lens has the
    # prompt's positions too
    page.evaluate("() => document.getElementById('panel-layers').scrollIntoView({block: 'start'})")
    for _ in range(4):
        before = page.evaluate("() => window.inferlab.state.ops.step || 0")
        page.keyboard.press("Alt+s")
        page.wait_for_function(f"() => (window.inferlab.state.ops.step || 0) > {before}", timeout=60000)
    paths = []
    for name, target in PROJECTOR_SHOTS.items():
        page.evaluate("id => id ? document.getElementById(id).scrollIntoView({block: 'start'}) : scrollTo(0, 0)",
                      target)
        page.wait_for_timeout(1500)  # the charts that came into view are fetched and drawn
        page.evaluate("() => window.inferlab.flush()")
        page.wait_for_timeout(800)
        paths.append(_save(page, SCREENSHOTS / f"projector-1280x720-{name}.png"))
    page.close()
    return paths


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from engine import Engine
    from e2e_util import browser, open_lab, running_server

    engine = Engine.from_pretrained("bundled", device="cpu")
    with running_server(engine, kv_memory=512 * 1024 * 1024) as (url, _app), browser() as b:  # as `python -m app`
        page = open_lab(b, url, WIDTHS[0], 1000)
        default_flow(page)
        for lang in LANGS:
            if lang == "ru":
                switch_language(page, "ru")
            for width in WIDTHS:
                show_all(page, width)
                for problem in text_problems(page):
                    print("  ", problem)
                print(save_screenshot(page, width, lang))
        for path in projector_screenshots(b, url):
            print(path)


if __name__ == "__main__":
    main()
