"""The whole page in Debian's Chromium, driven by Playwright against a real server and the real engine."""
import json

import pytest

from e2e_util import (TEST_SHOTS, chart_traces, chromium_available, click_and_wait, ensure_drawn, open_lab, renders,
                      served_lab)

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SCREENSHOTS = TEST_SHOTS


@pytest.fixture(scope="module")
def lab(base_engine):
    with served_lab(base_engine) as lab:
        yield lab


def set_prompt(page, text):
    page.fill("#prompt textarea", text)


def chart_ids():
    from app.render import CHART_IDS

    return CHART_IDS


OVERFLOW_JS = """(id) => {
  const fl = document.getElementById(id)._fullLayout, fd = document.getElementById(id)._fullData;
  const axes = Object.keys(fl).filter((k) => /^[xy]axis\\d*$/.test(k)).map((k) => fl[k].ticklabeloverflow);
  const bars = fd.filter((t) => t.showscale && t.colorbar).map((t) => t.colorbar.ticklabeloverflow);
  const shared = fl.coloraxis && fl.coloraxis.showscale ? [fl.coloraxis.colorbar.ticklabeloverflow] : [];
  return axes.concat(bars, shared).map((v) => v === undefined ? null : v);
}"""


def test_step_draws_every_panel(lab):
    url, app, b = lab
    page = open_lab(b, url)
    set_prompt(page, "Что такое гравитация?")
    for _ in range(4):
        click_and_wait(page, "#step button, button#step")
    allowed = 0
    for cid in chart_ids():
        if cid.startswith("chart-spec-"):
            continue  # speculative decoding is off here: tests/test_e2e_tools.py turns it on
        ensure_drawn(page, cid)
        traces = chart_traces(page, cid)
        assert traces, f"{cid} has no traces"
        assert any(t["n"] > 0 for t in traces), f"{cid} has empty traces: {traces}"
        # tick labels are drawn as they are, not measured one by one to hide overflow (app/charts/common.py)
        overflow = page.evaluate(OVERFLOW_JS, cid)
        assert set(overflow) <= {"allow", None}, (cid, overflow)  # a table has no axes
        allowed += overflow.count("allow")
    assert allowed > 20
    # the page's data is the engine's: the stream text equals what the engine emitted
    registry = app.state.registry
    session = next(iter(registry.sessions.values()))
    seq = session.engine.sequences[session.focus]
    import time

    deadline = time.time() + 30
    while len(seq.output_ids) < 4 and time.time() < deadline:  # a render can also come from a view refresh
        time.sleep(0.1)
    before = renders(page)  # and the page shows that state (the charts in view, asked for over the socket)
    page.evaluate("() => window.inferlab.refresh()")
    page.wait_for_function(f"() => window.inferlab.state.renders > {before}", timeout=30000)
    assert len(seq.output_ids) == 4  # the prefill step samples the first token, then 3 decode steps
    # every Step went over the page's websocket (the page got its ticket and its session on load); the sequence
    # selector, server-drawn HTML, came with the steps' own payloads
    assert page.evaluate("() => window.inferlab.state.socketSteps") == 4
    page.wait_for_function("""sid => { const s = document.querySelector('#focus-select');
        return s && s.value === String(sid) && s.options[s.selectedIndex].text === `#${sid} · running`; }""",
                           arg=session.focus, timeout=30000)
    stream = page.inner_text("#html-stream")
    assert seq.detok.text.strip()[:10] in stream
    chips = page.locator("#html-tokens .il-chip").count()
    assert chips == seq.num_tokens
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("() => { window.scrollTo(0, 0); window.inferlab.flush(); }")
    page.screenshot(path=str(SCREENSHOTS / "lab.png"), full_page=True)
    page.close()


def test_temperature_changes_sampling_chart_without_a_step(lab):
    url, app, b = lab
    page = open_lab(b, url)
    set_prompt(page, "Name a fruit.")
    click_and_wait(page, "#step button, button#step")
    click_and_wait(page, "#step button, button#step")
    registry = app.state.registry
    steps_before = sum(len(s.events) for s in registry.sessions.values())
    ensure_drawn(page, "chart-sampling")
    before = page.evaluate("() => JSON.stringify(document.getElementById('chart-sampling').data)")
    slider = page.locator("#temperature input[type=number]")
    slider.fill("1.8")
    slider.press("Enter")
    # other payloads (a refresh of charts in view) may arrive first: wait for the what-if one itself
    page.wait_for_function("""before => { window.inferlab.flush();
        const el = document.getElementById('chart-sampling');
        return JSON.stringify(el.data) !== before; }""", arg=before, timeout=30000, polling=250)
    after = page.evaluate("() => JSON.stringify(document.getElementById('chart-sampling').data)")
    assert before != after
    assert "what-if" in page.inner_text("#html-message").lower()
    title = page.evaluate("() => JSON.stringify(document.getElementById('chart-sampling').layout.title)")
    assert "what-if" in title.lower()  # the chart itself is marked as a what-if
    assert sum(len(s.events) for s in registry.sessions.values()) == steps_before  # no model step ran
    # the next Step applies the slider: it travels over the page's websocket (tied to its session since the
    # page loaded) with the values read off the controls, and the engine uses 1.8 from then on
    socket_steps = page.evaluate("() => window.inferlab.state.socketSteps || 0")
    click_and_wait(page, "#step button, button#step")
    assert page.evaluate("() => window.inferlab.state.socketSteps || 0") == socket_steps + 1
    session = next(s for s in registry.sessions.values() if s.events and s.requests)
    assert session.engine.sequences[session.focus].params.temperature == pytest.approx(1.8)
    assert sum(len(s.events) for s in registry.sessions.values()) == steps_before + 1
    page.close()


def test_zoom_survives_a_step(lab):
    url, app, b = lab
    page = open_lab(b, url)
    set_prompt(page, "Count to five.")
    for _ in range(3):
        click_and_wait(page, "#step button, button#step")
    ensure_drawn(page, "chart-timeline")
    page.evaluate("() => Plotly.relayout('chart-timeline', {'xaxis.range': [0.5, 1.5]})")
    click_and_wait(page, "#step button, button#step")
    # redrawn with the 4th step's bar (not just left as it was), and the zoom is still there
    page.wait_for_function("""() => { const el = document.getElementById('chart-timeline');
        el.scrollIntoView({block: 'center'}); return el.data[0].x.length === 4; }""", timeout=30000, polling=250)
    ensure_drawn(page, "chart-timeline")
    rng = page.evaluate("() => document.getElementById('chart-timeline').layout.xaxis.range")
    assert rng == [0.5, 1.5]
    page.close()


def test_two_tabs_are_independent(lab):
    url, app, b = lab
    ctx_a = b.new_context(viewport={"width": 1600, "height": 1000})
    ctx_b = b.new_context(viewport={"width": 1600, "height": 1000})
    pa, pb = open_lab(ctx_a, url), open_lab(ctx_b, url)
    set_prompt(pa, "What is gravity?")
    set_prompt(pb, "Что такое гравитация?")
    for _ in range(3):
        click_and_wait(pa, "#step button, button#step")
    click_and_wait(pb, "#step button, button#step")
    ensure_drawn(pa, "chart-timeline")
    ensure_drawn(pb, "chart-timeline")
    sa = json.loads(pa.evaluate("() => JSON.stringify(document.getElementById('chart-timeline').data[0].x)"))
    sb = json.loads(pb.evaluate("() => JSON.stringify(document.getElementById('chart-timeline').data[0].x)"))
    assert len(sa) == 3 and len(sb) == 1
    assert "гравитация" in pb.inner_text("#html-template") and "гравитация" not in pa.inner_text("#html-template")
    ctx_a.close()
    ctx_b.close()


def test_bad_input_shows_message_not_traceback(lab):
    url, app, b = lab
    page = open_lab(b, url)
    set_prompt(page, "   ")
    click_and_wait(page, "#step button, button#step")
    msg = page.inner_text("#html-message")
    assert "prompt must not be empty" in msg and "Traceback" not in page.content()
    set_prompt(page, "Hi")
    page.fill("#max_tokens input", "0")
    click_and_wait(page, "#step button, button#step")
    assert "max_tokens" in page.inner_text("#html-message")
    page.close()


def test_language_switch_relabels_page_and_charts(lab):
    url, app, b = lab
    page = open_lab(b, url)
    set_prompt(page, "Что такое гравитация?")
    click_and_wait(page, "#step button, button#step")
    before = renders(page)
    page.locator("#lang label", has_text="Русский").click()
    page.wait_for_function(f"() => window.inferlab.state.renders > {before}", timeout=30000)
    page.wait_for_function("() => document.querySelector('#step').innerText.includes('Шаг')", timeout=30000)
    # the panel titles come in their own update, which a loaded machine can deliver after the button's
    page.wait_for_function("() => document.querySelector('#html-title-template')?.innerText.includes('Шаблон')",
                           timeout=30000)
    assert "Шаблон" in page.inner_text("#html-title-template")
    assert "Температура" in page.inner_text("#temperature")
    ensure_drawn(page, "chart-timeline")
    title = page.evaluate("() => JSON.stringify(document.getElementById('chart-timeline').layout.title)")
    assert any("\u0400" <= ch <= "\u04ff" for ch in json.loads(title)["text"])  # the chart speaks Russian too
    page.close()


def test_click_a_logits_bar_forces_that_token(lab):
    url, app, b = lab
    page = open_lab(b, url)
    set_prompt(page, "What is gravity?")
    click_and_wait(page, "#step button, button#step")
    ensure_drawn(page, "chart-logits")
    # a real mouse click on the third bar of the logits chart
    bar = page.locator("#chart-logits .bars .point path").nth(2)
    token_id = page.evaluate("""() => { const t = document.getElementById('chart-logits').data[0];
        return Array.isArray(t.customdata[2]) ? t.customdata[2][0] : t.customdata[2]; }""")
    box = bar.bounding_box()  # the bars start left of the visible axis range: click near their right end
    page.mouse.click(box["x"] + box["width"] - 4, box["y"] + box["height"] / 2)
    page.wait_for_function("() => document.querySelector('#html-message').innerText.includes('forced')",
                           timeout=30000)
    click_and_wait(page, "#step button, button#step")
    session = max(app.state.registry.sessions.values(), key=lambda s: s.last_used)
    seq = session.engine.sequences[session.focus]
    assert seq.output_ids[-1] == int(token_id)
    assert session.events[-1].seq(session.focus).forced
    page.close()


def test_closing_a_tab_frees_its_session_and_kv(lab):
    url, app, b = lab
    registry = app.state.registry
    ctx = b.new_context(viewport={"width": 1600, "height": 1000})
    page = open_lab(ctx, url)
    set_prompt(page, "What is gravity?")
    click_and_wait(page, "#step button, button#step")
    mine = max(registry.sessions.items(), key=lambda kv: kv[1].last_used)
    key, session = mine
    assert session.engine.blocks.stats()["used"] > 0
    ctx.close()  # the tab goes away: Gradio's unload fires and the registry drops the session
    import time

    deadline = time.time() + 60
    # the registry forgets the session first, then closes it (its KV freed on the compute thread): wait for both
    while (key in registry.sessions or session.engine.blocks.stats()["used"]) and time.time() < deadline:
        time.sleep(0.5)
    assert key not in registry.sessions
    assert session.engine.blocks.stats()["used"] == 0
