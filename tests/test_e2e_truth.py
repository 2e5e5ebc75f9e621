"""Issue 13's chart fixes in Debian's Chromium against a real server and the real engine: a forced token named
everywhere (item 3), long block tables legible (item 8), one detokenizer row per token of a speculative round
(item 9), Enter in the layer box redraws attention (item 10), and the small ones (item 13): the rounds chart's
axis top-down however it was first drawn, "seq #N finished", the perplexity title's units."""
import re

import pytest

from e2e_util import (browser, chromium_available, click_and_wait, click_until_message, ensure_drawn, open_lab,
                      running_server)

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
EXTRACTIVE = ("Repeat the following text exactly: The quick brown fox jumps over the lazy dog, "
              "and the dog keeps sleeping.")


@pytest.fixture(scope="module")
def lab(base_engine):
    # a pool of ~170 blocks: one visitor may reserve about half, enough for the 57-block prompt below
    with running_server(base_engine, kv_memory=128 * 1024 * 1024) as (url, app):
        with browser() as b:
            yield url, app, b


def newest_session(app):
    return max(app.state.registry.sessions.values(), key=lambda s: s.last_used)


def title(page, chart_id):
    """The chart's title as one line (titles are wrapped at spaces)."""
    text = page.evaluate("id => document.getElementById(id).layout.title.text", chart_id)
    return re.sub(r"\s+", " ", text.replace("<br>", " "))


def top_down(page, chart_id):
    """Whether the drawn chart's y axis runs from its first row at the top down (a reversed range)."""
    lo, hi = page.evaluate("id => document.getElementById(id)._fullLayout.yaxis.range", chart_id)
    return lo > hi


def draw_placeholder(page, chart_id):
    """Scroll a chart into view before anything is stepped, so the page draws its placeholder first (what a
    user who reads the page top to bottom sees)."""
    page.evaluate("id => document.getElementById(id).scrollIntoView({block: 'center'})", chart_id)
    page.wait_for_function("id => { const el = document.getElementById(id); return el.layout && "
                           "!window.inferlab.state.pending[id]; }", arg=chart_id, timeout=30000)


def test_a_forced_token_is_named_and_marked_in_every_view(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.fill("#prompt textarea", "What is gravity?")
    draw_placeholder(page, "chart-sampling")
    click_and_wait(page, "#step")
    ensure_drawn(page, "chart-logits")
    token_id = page.evaluate("() => document.getElementById('chart-logits').data[0].customdata[2][0]")
    page.fill("#force_id input", str(token_id))
    click_until_message(page, "#force", "will be forced")
    click_and_wait(page, "#step")
    session = newest_session(app)
    sev = session.events[-1].seq(session.focus)
    assert sev.forced and sev.new_token == token_id
    from app.charts.logits import id_label

    label = id_label(sev.new_token_text, sev.new_token)  # the token's text as the charts label it
    for cid in ("chart-logits", "chart-sampling", "chart-cdf"):
        ensure_drawn(page, cid)
        text = title(page, cid)
        assert f"orced «{label}»" in text and "would have" in text, (cid, text)
    # the chain's rows run top-down like the logits chart's, also over the placeholder drawn first
    assert top_down(page, "chart-sampling") and top_down(page, "chart-logits")
    ensure_drawn(page, "chart-detok")
    tokens_column = page.evaluate("() => document.getElementById('chart-detok').data[0].cells.values[2]")
    assert tokens_column[-1].endswith("(forced)") and not tokens_column[0].endswith("(forced)")
    chip = page.locator("#html-tokens .il-chip.il-forced")
    assert chip.count() == 1 and "forced" in chip.get_attribute("title")
    page.evaluate("() => document.getElementById('chart-logits').scrollIntoView()")
    page.screenshot(path="/tmp/e2e_truth_forced.png")
    page.close()


def test_speculative_rounds_one_detok_row_per_token_and_positions_top_down(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.click("#speculative > button, #speculative .label-wrap")
    page.check("#spec_on input[type=checkbox]")
    page.fill("#prompt textarea", EXTRACTIVE)
    page.fill("#temperature input[type=number]", "0")
    page.press("#temperature input[type=number]", "Enter")
    draw_placeholder(page, "chart-spec-rounds")
    for _ in range(8):
        click_and_wait(page, "#step")
        session = newest_session(app)  # this page's, once it has stepped
        rounds = [s.spec for e in session.events for s in e.seqs if s.spec is not None]
        if any(r.num_emitted > 1 for r in rounds):
            break
    assert any(r.num_emitted > 1 for r in rounds), "prompt lookup found no multi-token round"
    ensure_drawn(page, "chart-spec-rounds")
    axis_top_down = top_down(page, "chart-spec-rounds")  # position 1 on top, as in a replay drawn fresh
    ensure_drawn(page, "chart-detok")
    ids = page.evaluate("() => document.getElementById('chart-detok').data[0].cells.values[1]")
    emitted = [t for e in session.events for s in e.seqs if s.seq_id == session.focus and s.detok is not None
               for t in (s.spec.emitted_ids if s.spec is not None else [s.new_token])]
    steps = page.evaluate("() => document.getElementById('chart-detok').data[0].cells.values[0]")
    grouped = any(re.fullmatch(r"\d+ · \d+/\d+", str(s)) for s in steps)  # "step · i/k" in a round
    assert (ids == emitted[-12:], grouped, axis_top_down) == (True, True, True)  # a row per token, not per step
    page.evaluate("() => document.getElementById('chart-detok').scrollIntoView()")
    page.screenshot(path="/tmp/e2e_truth_detok.png")
    page.close()


TEXT_BOXES_OVERLAP = """id => {
  const boxes = [...document.querySelectorAll('#' + id + ' text')]
    .filter((t) => /^\\d+$/.test(t.textContent) && t.closest('.heatmap-label, .heatmaplayer'))
    .map((t) => t.getBoundingClientRect());
  let overlaps = 0;
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    const apart = a.right - 0.5 <= b.left || b.right - 0.5 <= a.left || a.bottom - 0.5 <= b.top
                  || b.bottom - 0.5 <= a.top;
    if (!apart) overlaps++;
  }
  return {n: boxes.length, overlaps};
}"""


def test_a_long_block_table_keeps_its_numbers_apart(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.fill("#prompt textarea", " ".join(f"word{i}" for i in range(250)))  # ~900 tokens: 57 blocks
    while True:
        click_and_wait(page, "#step")
        session = newest_session(app)  # this page's, once it has stepped
        sev = session.events[-1].seq(session.focus)
        if sev is not None and sev.new_token is not None:
            break
    assert len(session.events[-1].block_tables[session.focus]) >= 53
    ensure_drawn(page, "chart-kv-tables")
    boxes = page.evaluate(TEXT_BOXES_OVERLAP, "chart-kv-tables")
    assert boxes["n"] >= 53 and boxes["overlaps"] == 0, boxes
    page.evaluate("() => document.getElementById('chart-kv-tables').scrollIntoView()")
    page.screenshot(path="/tmp/e2e_truth_tables.png")
    page.close()


def test_enter_in_the_layer_box_redraws_attention(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.fill("#prompt textarea", "What is gravity?")
    page.evaluate("() => document.getElementById('chart-attention').scrollIntoView()")
    click_and_wait(page, "#step")
    ensure_drawn(page, "chart-attention")
    assert "layer 0, head 0" in title(page, "chart-attention")
    page.fill("#layer input[type=number]", "5")
    page.press("#layer input[type=number]", "Enter")
    page.wait_for_function("() => document.getElementById('chart-attention').layout.title.text.includes('layer 5')",
                           timeout=20000)
    page.fill("#head input[type=number]", "3")
    page.press("#head input[type=number]", "Enter")
    page.wait_for_function("() => document.getElementById('chart-attention').layout.title.text.includes('head 3')",
                           timeout=20000)
    page.close()


def test_finished_sequence_is_named_and_perplexity_has_units(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.fill("#prompt textarea", "What is gravity?")
    page.fill("#max_tokens input", "2")
    for _ in range(4):
        click_and_wait(page, "#step")
        session = newest_session(app)  # this page's, once it has stepped
        if session.events and session.events[-1].finished:
            break
    sid = session.events[-1].finished[0]
    assert f"seq #{sid} finished" in page.inner_text("#html-pipeline")
    ensure_drawn(page, "chart-perplexity")
    text = title(page, "chart-perplexity")
    assert "(nats)" in text and "per token" in text
    page.close()
