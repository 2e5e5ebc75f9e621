"""The Russian page in Chromium: after the language switch, a Step, the tour's first step and a Step of the
tour's request, nothing the reader sees is English (tests/i18n_check.py says what counts: token text and
quoted data are not UI text)."""
import json

import pytest

from e2e_util import TEST_SHOTS, chromium_available, click_and_wait, open_lab, served_lab
from i18n_check import DATA_CLASSES, english, figure_texts

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SCREENSHOTS = TEST_SHOTS
ACCORDIONS = ("tour", "speculative", "lecture", "trace")
TYPED = "#prompt, #system, #stop, #bpe_word, #presenter_token"


@pytest.fixture(scope="module")
def lab(base_engine):
    with served_lab(base_engine) as lab:
        yield lab


# Every text node the reader can see, but the charts' (their figures are read whole below) and the data's:
# the model's text and the tokens cut from it (DATA_CLASSES); and the values boxes show, but what the reader
# types (TYPED).
VISIBLE_TEXT_JS = """([skip, typed]) => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const text = n.textContent.trim();
    const el = n.parentElement;
    if (!text || !el || el.closest(skip) || el.closest('.il-chart, script, style')) continue;
    if (!el.checkVisibility({opacityProperty: true, visibilityProperty: true})) continue;
    const r = el.getBoundingClientRect();  // a screen reader's live region is clipped to a pixel: not seen
    if (r.width <= 1 || r.height <= 1) continue;
    out.push(text);
  }
  // what a box shows as its value: a dropdown's choice; boxes the reader types into are theirs
  for (const input of document.querySelectorAll('input[type=text], input:not([type])')) {
    if (input.closest(typed) || !input.value || !input.checkVisibility()) continue;
    out.push(input.value);
  }
  return out;
}"""

FIGURE_JS = """(id) => {
  const el = document.getElementById(id);
  if (!el || !el.layout) return null;
  return {layout: el.layout, data: (el.data || []).map((t) => ({type: t.type, name: t.name,
          showlegend: t.showlegend, hovertemplate: t.hovertemplate, colorbar: t.colorbar,
          header: t.header ? {values: t.header.values} : undefined}))};
}"""

# a chart is drawn when its latest figure is on the page (an empty placeholder has a layout and no traces)
DRAWN_JS = """(id) => { const s = window.inferlab.state; const el = document.getElementById(id);
  const r = el.getBoundingClientRect();
  if (r.bottom < 0 || r.top > window.innerHeight) { el.scrollIntoView({block: 'center'}); return false; }
  return !s.stale[id] && !s.pending[id] && !!el.layout; }"""


def chart_ids():
    from app.calculators import CHART_IDS as CALC_IDS
    from app.render import CHART_IDS

    return CHART_IDS + CALC_IDS


def test_the_russian_page_has_no_english_left(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.locator("#lang label", has_text="Русский").click()
    page.wait_for_function("() => document.querySelector('#step').innerText.includes('Шаг')", timeout=30000)
    click_and_wait(page, "#step button, button#step")
    for acc in ACCORDIONS:
        page.click(f"#{acc} > button, #{acc} .label-wrap")
    click_and_wait(page, "#tour_start")
    page.wait_for_selector("#tour-box .il-tour-step", timeout=30000)
    click_and_wait(page, "#step button, button#step")  # the tour's request is admitted: every panel has data
    for cid in chart_ids():
        page.wait_for_function(DRAWN_JS, arg=cid, timeout=30000, polling=250)

    found = {}
    for text in page.evaluate(VISIBLE_TEXT_JS, [", ".join(f".{c}" for c in sorted(DATA_CLASSES)), TYPED]):
        if english(text):
            found.setdefault("page", []).append(text)
    for cid in chart_ids():
        for text in figure_texts(page.evaluate(FIGURE_JS, cid)):
            if english(text):
                found.setdefault(cid, []).append(text)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / "lab-ru.png"), full_page=True)
    assert not found, json.dumps(found, ensure_ascii=False, indent=1)
    page.close()
