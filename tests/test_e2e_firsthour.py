"""A newcomer's first hour (issue 13, items 7, 11 and 12) in Debian's Chromium against a real server and the real
engine: the first screen teaches before any step, the timeline shows who was in each step (a one-click preemption
demo), and long actions say what they are doing while they run."""
import os
import time

import pytest

from e2e_util import chart_traces, chromium_available, click_and_wait, ensure_drawn, open_lab, served_lab

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SHOTS = "/tmp/inferlab-firsthour"


@pytest.fixture(scope="module")
def lab(base_engine):
    with served_lab(base_engine) as lab:
        yield lab


def _session(app, pred=lambda s: True):
    return max((s for s in app.state.registry.sessions.values() if pred(s)), key=lambda s: s.last_used)


def _shot(page, name):
    page.screenshot(path=f"{SHOTS}/{name}.png", full_page=False)


def test_first_screen_teaches_before_any_step(lab):
    url, app, b = lab
    os.makedirs(SHOTS, exist_ok=True)
    page = open_lab(b, url)
    # the default prompt is one the small model answers sensibly
    assert page.input_value("#prompt textarea") == "What is gravity?"
    # no Step yet: the chat template, the tokens and their bytes are drawn from the prompt box
    page.wait_for_function("() => document.querySelector('#html-template').innerText.includes('What is gravity?')",
                           timeout=60000)
    template = page.inner_text("#html-template")
    assert "<|im_start|>" in template and "assistant" in template
    session = _session(app)
    assert session.events == [] and session.preview is not None
    n = len(session.preview.token_ids)
    assert page.locator("#html-tokens .il-chip").count() == n
    ensure_drawn(page, "chart-bytes")
    assert sum(tr["n"] for tr in chart_traces(page, "chart-bytes") if tr["type"] == "bar") >= n
    # the other panels say what the next click will do (a placeholder: a note and no data)
    page.locator("#chart-logits").scroll_into_view_if_needed()
    page.wait_for_function("""() => { const el = document.getElementById('chart-logits');
        return !window.inferlab.state.stale['chart-logits'] && el.layout && (el.layout.annotations || []).length; }""",
                           timeout=30000)
    note = page.evaluate("() => document.getElementById('chart-logits').layout.annotations[0].text")
    assert "Press Step" in note and f"{n} tokens" in note
    page.locator("#panel-template").screenshot(path=f"{SHOTS}/first-screen-template.png")
    # typing redraws it (a Cyrillic prompt also says what this model does with Russian)
    page.fill("#prompt textarea", "Что такое гравитация?")
    page.wait_for_function("() => document.querySelector('#html-template').innerText.includes('гравитация')",
                           timeout=60000)
    assert "trained on English" in page.inner_text("#html-template")
    assert page.locator("#html-tokens .il-chip").count() == len(session.preview.token_ids) > n
    assert session.events == []
    # the first Step shows the real prefill of the same tokens
    click_and_wait(page, "#step")
    assert len(session.events) == 1 and session.events[0].seqs[0].prompt_len == len(session.preview.token_ids)
    assert "trained on English" not in page.inner_text("#html-template")
    page.close()


def test_the_timeline_shows_each_steps_batch_and_a_preemption(lab):
    url, app, b = lab
    page = open_lab(b, url, 1600, 1000)
    page.click("#preempt_demo")
    page.wait_for_function("() => document.querySelector('#html-message').innerText.includes('engine of its own')",
                           timeout=60000)
    # the demo is greedy (it plays the same every time), and the temperature control says so
    page.wait_for_function("() => document.querySelector('#temperature input[type=number]').value === '0'",
                           timeout=30000)
    s = _session(app, lambda s: s.own_room)
    short, long = s.seq_ids()
    # a waiting request is visible in the panel, not only in the selector
    queue = page.inner_text("#html-queue")
    assert f"#{long}: running" in queue or f"#{long}: waiting" in queue
    for _ in range(40):
        click_and_wait(page, "#step")
        if any(e.preempted for e in s.events):
            break
    hit = next(e for e in s.events if e.preempted)
    assert hit.preempted == [long]
    click_and_wait(page, "#step")  # one step more: the preempted request waits at the head of the queue
    page.wait_for_function(
        "sid => document.querySelector('#html-queue').innerText.includes('#' + sid + ': preempted')",
        arg=long, timeout=30000)
    assert "will be recomputed" in page.inner_text("#html-queue")
    ensure_drawn(page, "chart-timeline")
    data = page.evaluate("""() => document.getElementById('chart-timeline').data.map(t => ({name: t.name,
        x: t.x, base: t.base, text: t.text, customdata: t.customdata}))""")
    by = {tr["name"]: tr for tr in data}
    # every step's bar is its batch: one segment per sequence, the tokens each processed written in it
    for e in s.events:
        segs = [i for i, x in enumerate(by["batch"]["x"]) if x == e.step]
        assert sorted(by["batch"]["text"][i] for i in segs) == sorted(str(x["num_processed"]) for x in e.batch)
        waits = [i for i, x in enumerate(by["waiting"]["x"]) if x == e.step]
        assert len(waits) == len(e.waiting)
    assert by["preempted"]["x"] == [hit.step] and f"#{long}" in by["preempted"]["text"][0]
    assert any("prefill chunk" in h for h in by["batch"]["customdata"])  # the long prompt went in chunks
    page.locator("#panel-timeline").scroll_into_view_if_needed()
    page.locator("#panel-timeline").screenshot(path=f"{SHOTS}/timeline-preemption.png")
    # Reset brings the tab back to the shared room
    click_and_wait(page, "#reset")
    deadline = time.monotonic() + 30  # the page redraws first; the server-side swap may land just after it
    while _session(app).own_room and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _session(app).own_room
    page.close()


def test_measure_speedup_and_chart_export_say_what_they_are_doing(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.click("#speculative > button, #speculative .label-wrap")
    page.check("#spec_on input[type=checkbox]")
    deadline = time.time() + 20
    while _session(app).speculative is None and time.time() < deadline:
        time.sleep(0.2)
    click_and_wait(page, "#step")
    page.click("#spec_measure")
    # while the two runs go, the status line says which one and how far
    # (one check of the same text: read a moment later, the line may already say the result)
    page.wait_for_function(
        "() => { const t = document.querySelector('#html-message').innerText;"
        " return t.includes('Measuring the speed-up') && t.includes('⏳'); }",
        timeout=60000, polling=100)
    page.wait_for_function(
        "() => document.querySelector('#html-message').innerText.includes('Measured on this prompt')",
        timeout=180000)
    # a PNG export starts a headless Chromium: seconds, said while they pass
    page.click("#trace > button, #trace .label-wrap")
    # every text the message line shows (a quick export may replace its progress line between two polls)
    page.evaluate("""() => { window.__seen = []; const el = document.querySelector('#html-message');
        new MutationObserver(() => window.__seen.push(el.innerText))
          .observe(el, {childList: true, subtree: true, characterData: true}); }""")
    page.click("#export_btn")
    page.wait_for_function("() => document.querySelector('#html-message').innerText.includes('is ready')",
                           timeout=120000)
    assert any("Exporting" in t for t in page.evaluate("() => window.__seen")), page.evaluate("() => window.__seen")
    page.close()
