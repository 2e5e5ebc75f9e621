"""Browser tests of lecture mode (presenter + follower pages), the guided tour, the calculators and trace
replay: Debian's Chromium via Playwright against a real server and the real engine."""
import json
import time

import pytest

from e2e_util import (TEST_SHOTS, browser, chromium_available, click_and_wait, click_until_message, ensure_drawn,
                      open_lab, running_server)

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SCREENSHOTS = TEST_SHOTS
TOKEN = "e2e-presenter-token"


@pytest.fixture(scope="module")
def lab(base_engine):
    with running_server(base_engine, presenter_token=TOKEN) as (url, app):
        with browser() as b:
            yield url, app, b


def open_accordion(page, elem_id):
    page.click(f"#{elem_id} > button, #{elem_id} .label-wrap")


def chart_data(page, chart_id):
    return page.evaluate("""id => { const el = document.getElementById(id);
        return el && el.data ? el.data.map(t => ({x: t.x, y: t.y, customdata: t.customdata, name: t.name || ''}))
                             : null; }""", chart_id)


def shot(page, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))


def test_follower_sees_the_presenters_charts(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.fill("#prompt textarea", "Что такое гравитация?")
    open_accordion(page, "lecture")
    page.fill("#presenter_token input", "wrong")
    click_until_message(page, "#present", "Wrong presenter token")
    page.fill("#presenter_token input", TOKEN)
    click_until_message(page, "#present", "presenting")

    viewer = b.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    viewer.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    viewer.goto(url + "/follow")
    assert viewer.locator("#step").count() == 0 and viewer.locator("input").count() == 0  # nothing to drive
    assert TOKEN not in viewer.content()
    for _ in range(3):
        click_and_wait(page, "#step")
    session = app.state.lecture.session
    deadline = time.time() + 30
    while len(session.events) < 3 and time.time() < deadline:  # a render can also come from a view refresh
        time.sleep(0.1)
    assert len(session.events) == 3
    last_step = session.events[-1].step
    try:
        viewer.wait_for_function(f"() => (window.inferlabFollow || {{}}).lastStep === {last_step}", timeout=30000,
                                 polling=250)
        viewer.wait_for_function(f"() => window.inferlabFollow.frameStep === {last_step}", timeout=30000,
                                 polling=250)
    except Exception:
        hub = app.state.hub
        raise AssertionError(f"follower state {viewer.evaluate('() => window.inferlabFollow')}; viewers "
                             f"{hub.viewer_count}; frames {hub.frame_count}; latest "
                             f"{(hub.latest_frame or '')[:80]}; sent_step {app.state.lecture.sent_step}; last step {last_step}; thread {app.state.lecture._thread}")
    # the frame after the last step: same numbers as the presenter's own charts
    viewer.bring_to_front()  # a background page may not run its animation frames
    for cid in ("chart-logits", "chart-sampling", "chart-timeline"):
        ensure_drawn(page, cid)
        viewer.wait_for_function(
            """([id, n]) => { const el = document.getElementById(id); el.scrollIntoView({block: 'center'});
                window.inferlab.flush();
                return el.data && el.data.length > 0 && window.inferlabFollow.frameStep === n; }""",
            arg=[cid, last_step], timeout=30000)
        deadline = time.time() + 20
        while chart_data(viewer, cid) != chart_data(page, cid) and time.time() < deadline:
            time.sleep(0.3)  # the newest frame may still be on its way
            viewer.evaluate("() => window.inferlab.flush()")
        assert chart_data(viewer, cid) == chart_data(page, cid), cid
    ev = session.events[-1].seq(session.focus)
    assert viewer.inner_text("#html-stream").strip() == page.inner_text("#html-stream").strip()
    assert f"step {last_step}" in viewer.inner_text("#follow-last")
    assert ev.new_token_text.strip()[:3] in viewer.inner_text("#html-stream") or not ev.new_token_text.strip()
    viewer.evaluate("() => window.scrollTo(0, 0)")
    shot(viewer, "follower.png")
    # a Russian-speaking viewer: the page's own status line in Russian (the panels are the presenter's)
    ru = b.new_page(viewport={"width": 1000, "height": 700})
    ru.goto(url + "/follow?lang=ru")
    ru.wait_for_function("() => document.getElementById('follow-status').textContent.includes('ведущ')",
                         timeout=30000)
    assert ru.title() == "InferLab — трансляция лекции" and ru.evaluate("document.documentElement.lang") == "ru"
    click_and_wait(page, "#step")
    ru.wait_for_function("() => document.getElementById('follow-last').textContent.startsWith('шаг ')",
                         timeout=30000)
    ru.close()
    click_and_wait(page, "#unpresent")
    viewer.close()
    page.close()


def test_tour_runs_the_engine_and_highlights_each_panel(lab):
    url, app, b = lab
    page = open_lab(b, url)
    open_accordion(page, "tour")
    click_and_wait(page, "#tour_start")
    page.wait_for_selector("#panel-template.il-tour-focus", timeout=10000)
    assert "1 /" in page.inner_text("#tour-box")
    from app.tour import load_tour

    steps = load_tour()
    session = max(app.state.registry.sessions.values(), key=lambda s: s.last_used)
    assert session.requests and not session.events  # the first step only starts the request
    for i in range(1, 4):
        click_and_wait(page, "#tour_next")
        page.wait_for_selector(f"#panel-{steps[i].panel}.il-tour-focus", timeout=10000)
        # the step's own answer (two steps may highlight the same panel, and a View answer is a render too)
        page.wait_for_function("t => document.querySelector('#tour-box').innerText.includes(t)",
                               arg=steps[i].title["en"], timeout=30000)
    stepped = sum(s.action.get("count", 0) for s in steps[:4] if s.action["type"] == "step")
    assert len(session.events) == stepped
    time.sleep(1)
    shot(page, "tour.png")
    page.close()


def test_calculators_draw_the_formulas_numbers(lab):
    url, app, b = lab
    from app import calculators as calc

    page = open_lab(b, url)
    page.wait_for_function("() => document.getElementById('html-calc-formulas').innerText.length > 0",
                           timeout=30000)
    for cid in calc.CHART_IDS:
        ensure_drawn(page, cid)
    live = calc.live_model_preset_from_engine(app.state.registry.base)
    d = calc.DEFAULTS
    expected = calc.calculator_payload(d["model"], d["dtype"], d["context"], d["batch"], d["gpu"], d["alpha"],
                                       d["k"], d["draft_cost"], "en", live, app.state.holder.machine)
    for cid in ("chart-calc-fit", "chart-calc-spec"):
        want = [{"x": t.get("x"), "y": t.get("y")} for t in expected["figs"][cid]["data"]]
        got = [{"x": t["x"], "y": t["y"]} for t in chart_data(page, cid)]
        assert json.loads(json.dumps(want)) == got, cid
    assert "512 MiB" in page.inner_text("#html-calc-formulas")  # Llama-3-8B, bf16, 4096 tokens
    # choosing int4 changes the numbers on the page
    page.click("#calc_dtype input")
    page.fill("#calc_dtype input", "int4")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.getElementById('html-calc-formulas').innerText.includes('128 MiB')",
                           timeout=20000)
    for cid in calc.CHART_IDS:
        ensure_drawn(page, cid)
    page.evaluate("() => window.inferlab.flush()")
    time.sleep(1)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#panel-calculators").first.screenshot(path=str(SCREENSHOTS / "calculators.png"))
    page.close()


def test_exported_trace_replays_in_the_page(lab, tmp_path):
    url, app, b = lab
    page = open_lab(b, url)
    page.fill("#prompt textarea", "What is gravity?")
    for _ in range(3):
        click_and_wait(page, "#step")
    ensure_drawn(page, "chart-timeline")
    live_timeline = chart_data(page, "chart-timeline")
    open_accordion(page, "trace")
    page.click("#trace_export")
    link = page.wait_for_selector("#download a", timeout=30000)
    with page.expect_download() as dl:
        link.click()
    path = tmp_path / "trace.json.gz"
    dl.value.save_as(path)
    click_and_wait(page, "#reset")
    page.set_input_files("#trace_load input[type=file], input[type=file]", str(path))
    page.wait_for_function("() => document.getElementById('html-message').innerText.includes('Replaying')",
                           timeout=30000)
    for _ in range(3):
        click_and_wait(page, "#step")
    ensure_drawn(page, "chart-timeline")
    assert chart_data(page, "chart-timeline") == live_timeline
    page.close()


def test_speculative_panel_shows_accepted_and_rejected_drafts(lab):
    url, app, b = lab
    page = open_lab(b, url)
    open_accordion(page, "speculative")
    page.click("#spec_method label:has-text('early exit')")
    page.fill("#spec_exit input[type=number]", "29")
    page.press("#spec_exit input[type=number]", "Enter")
    page.check("#spec_on input[type=checkbox]")
    session = max(app.state.registry.sessions.values(), key=lambda s: s.last_used)
    deadline = time.time() + 20
    while (session.speculative is None or session.speculative.exit_layer != 29) and time.time() < deadline:
        time.sleep(0.2)
    assert session.speculative.method == "early_exit" and session.speculative.exit_layer == 29
    page.fill("#prompt textarea", "Что такое гравитация?")
    page.fill("#temperature input[type=number]", "0")
    page.press("#temperature input[type=number]", "Enter")
    verdicts = {}
    for _ in range(14):
        click_and_wait(page, "#step")
        for ev in session.events:
            for se in ev.seqs:
                for d in (se.spec.draft if se.spec is not None else []):
                    verdicts[(ev.step, d.position)] = d.verdict
        if {"accepted", "rejected"} <= set(verdicts.values()):
            break
    assert {"accepted", "rejected"} <= set(verdicts.values()), verdicts  # greedy α ≈ 0.3 at layer 29: both occur
    ensure_drawn(page, "chart-spec-rounds")
    traces = {t["name"]: t for t in chart_data(page, "chart-spec-rounds")}
    from app.charts.speculative import _t

    names = _t("en")["kinds"]
    for kind in ("accepted", "rejected"):
        want = sum(1 for v in verdicts.values() if v == kind)
        assert len(traces[names[kind]]["x"]) == want, kind
    for cid in ("chart-spec-pq", "chart-spec-alpha", "chart-spec-pass"):
        ensure_drawn(page, cid)
    page.evaluate("() => document.getElementById('panel-speculative').scrollIntoView()")
    time.sleep(0.5)
    page.locator("#panel-speculative").screenshot(path=str(SCREENSHOTS / "speculative.png"))
    page.close()
