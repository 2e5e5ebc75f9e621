"""Issue 37, items 1, 3 and 9 in Debian's Chromium against a real server and the real engine.

1. What the layers and embeddings panels draw is captured whether or not they are on screen: a Step taken at
   the top of the page shows in the attention, logit-lens and embedding charts when the visitor scrolls down,
   and a lecture's follower sees it without the presenter scrolling.
3. The prompt rows that came from the prefix cache (never computed for this sequence) are a labelled band.
9. A long prompt's token chips are folded behind a keyboard-reachable control, and the attention chart says
   which rows it shows and why the others are empty.
Each chart is checked against the engine's event for the step it draws.
"""
import time

import numpy as np
import pytest

from e2e_util import browser, chromium_available, click_and_wait, click_until_message, ensure_drawn, open_lab, \
    running_server

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
TOKEN = "e2e-capture-token"
CAPTURE_CHARTS = ("chart-attention", "chart-lens", "chart-pca")
# ~390 tokens: past the chips' fold (app/panels/tokens.py) and the heatmap's 256-position window, one prefill
LONG_PROMPT = ("Gravity is the force by which a planet or other body draws objects toward its center. " * 30)[:1800]


@pytest.fixture(scope="module")
def lab(base_engine):
    # a pool that holds the long prompt's request (the default test pool refuses it)
    with running_server(base_engine, kv_memory=128 * 2**20, presenter_token=TOKEN) as (url, app):
        with browser() as b:
            yield url, app, b


def session_of(app, prompt):
    """The lab session (the newest) that holds a request for `prompt`."""
    found = [s for s in app.state.registry.sessions.values()
             if any(r.prompt == prompt for r in s.requests.values())]
    assert found, f"no session holds {prompt!r}"
    return max(found, key=lambda s: s.last_used)


def wait_steps(session, n):
    deadline = time.time() + 60
    while len(session.events) < n and time.time() < deadline:
        time.sleep(0.1)
    assert len(session.events) == n


OFF_SCREEN_JS = """ids => ids.every((id) => document.getElementById(id).getBoundingClientRect().top >
                                       window.innerHeight && !window.inferlab.visible.has(id))"""


def off_screen(page, ids):
    """Each chart's top is below the window, and the page does not count it as in view."""
    return page.evaluate(OFF_SCREEN_JS, list(ids))


def step_here(page):
    """Step without scrolling to the button (Playwright's click would bring it into view first), and wait for
    the step's own payload."""
    before = page.evaluate("() => window.inferlab.state.ops.step || 0")
    page.evaluate("() => document.querySelector('#step button, button#step').click()")
    page.wait_for_function(f"() => (window.inferlab.state.ops.step || 0) > {before}", timeout=60000)


def at_the_top(page):
    """Scrolled to the top, with the capture charts out of the page's view (what its Step tells the server)."""
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_function(OFF_SCREEN_JS, arg=list(CAPTURE_CHARTS), timeout=10000)


def figure(page, chart_id):
    return page.evaluate("""id => { const el = document.getElementById(id);
        return {data: el.data.map((t) => ({name: t.name || '', z: t.z, x: t.x, y: t.y, customdata: t.customdata})),
                layout: {title: el.layout.title.text, annotations: (el.layout.annotations || []).map((a) => a.text)}};
    }""", chart_id)


def weights(fig):
    """The heatmap trace of attention weights (the prefix-cache band, when drawn, is another trace)."""
    return next(t for t in fig["data"] if t["name"] == "")


def drawn(page, chart_id):
    """Scroll to the chart, wait for its figure with data, return it."""
    ensure_drawn(page, chart_id)
    return figure(page, chart_id)


def check_capture_charts(page, session):
    """The page's attention, logit-lens and embedding charts draw the newest step's capture of the focused
    sequence (its numbers, not just "something")."""
    ev = session.events[-1]
    sev = ev.seq(session.focus)
    cap = sev.capture
    assert cap is not None and cap.attention, "the step was not captured"
    T = sev.chunk_start + sev.num_processed
    lo = max(0, T - 256)
    # attention, layer 0 head 0: the newest row equals the captured row (4 digits, as the chart rounds)
    fig = drawn(page, "chart-attention")
    z = weights(fig)["z"]
    assert len(z) == T - lo
    row = np.array([np.nan if v is None else v for v in z[-1]], dtype=float)
    want = cap.attention[0][0, -1, lo:T].float().numpy()
    np.testing.assert_allclose(row, np.round(want, 4), atol=1e-4)
    # logit lens: the newest position's column, the top-1 probability at every layer
    fig = drawn(page, "chart-lens")
    lens = fig["data"][0]
    pos = cap.lens_positions[-1]
    col = next(j for j, x in enumerate(lens["x"]) if x.split(" ")[0] == str(pos))
    probs = cap.lens_probs.float().numpy()[:, -1, 0]
    np.testing.assert_allclose([lens["z"][layer][col] for layer in range(len(probs))], np.round(probs, 5),
                               atol=1e-5)
    # embeddings: one point per position the sequence's steps computed (a prefix-cache hit computed fewer)
    fig = drawn(page, "chart-pca")
    shown = sorted(p[0] for t in fig["data"] for p in (t["customdata"] or []))
    computed = sorted({p for e in session.events for p in e.seq(session.focus).capture.positions})
    assert shown == computed and computed[-1] == T - 1


def test_a_step_taken_at_the_top_shows_when_the_panels_are_scrolled_to(lab):
    url, app, b = lab
    page = open_lab(b, url, width=1280, height=800)
    prompt = "What is gravity? Answer briefly."
    page.fill("#prompt textarea", prompt)
    at_the_top(page)
    for _ in range(2):
        step_here(page)
    assert page.evaluate("() => window.scrollY") == 0
    assert off_screen(page, CAPTURE_CHARTS)  # the steps ran with none of these charts on the screen
    session = session_of(app, prompt)
    wait_steps(session, 2)
    check_capture_charts(page, session)
    page.close()


def test_a_follower_sees_the_layers_panel_without_the_presenter_scrolling(lab):
    url, app, b = lab
    page = open_lab(b, url, width=1280, height=800)
    prompt = "Name three planets."
    page.fill("#prompt textarea", prompt)
    page.click("#lecture > button, #lecture .label-wrap")
    page.fill("#presenter_token input", TOKEN)
    click_until_message(page, "#present", "presenting")
    viewer = b.new_page(viewport={"width": 1280, "height": 800})
    viewer.goto(url + "/follow")
    viewer.wait_for_function("() => window.inferlabFollow && window.inferlab", timeout=30000)
    at_the_top(page)
    for _ in range(2):
        step_here(page)
    assert off_screen(page, CAPTURE_CHARTS)
    session = app.state.lecture.session
    wait_steps(session, 2)
    last = session.events[-1].step
    viewer.bring_to_front()
    viewer.wait_for_function(f"() => window.inferlabFollow.frameStep === {last}", timeout=30000, polling=250)
    check_capture_charts(viewer, session)
    page.bring_to_front()
    assert page.evaluate("() => window.scrollY") == 0  # the presenter never scrolled
    click_and_wait(page, "#unpresent")
    viewer.close()
    page.close()


def test_prefix_cache_rows_are_a_labelled_band(lab):
    url, app, b = lab
    first = open_lab(b, url, width=1600, height=1000)
    first.fill("#prompt textarea", "What is gravity?")
    click_and_wait(first, "#step")  # its prompt's blocks (the default system prompt) are in the pool now
    page = open_lab(b, url, width=1600, height=1000)
    prompt = "What is mass?"
    page.fill("#prompt textarea", prompt)
    click_and_wait(page, "#step")
    session = session_of(app, prompt)
    wait_steps(session, 1)
    sev = session.events[0].seq(session.focus)
    cached = sev.num_cached_tokens
    assert cached > 0 and sev.chunk_start == cached  # the shared system prompt came from the prefix cache
    fig = drawn(page, "chart-attention")
    band = next(t for t in fig["data"] if t["name"] == "prefix cache")
    rows = [i for i, r in enumerate(band["z"]) if any(v is not None for v in r)]
    assert rows == list(range(cached))
    assert all(v is None for r in weights(fig)["z"][:cached] for v in r)  # no weights drawn there
    label = next(a for a in (a.replace("<br>", " ") for a in fig["layout"]["annotations"]) if "prefix cache" in a)
    assert f"rows 0–{cached - 1}" in label
    first.close()
    page.close()


def test_a_long_prompt_folds_its_chips_and_the_attention_chart_says_what_it_shows(lab):
    from app.panels.tokens import CHIPS_EDGE

    url, app, b = lab
    page = open_lab(b, url, width=1280, height=800)
    page.fill("#prompt textarea", LONG_PROMPT)
    click_and_wait(page, "#step", timeout=180000)
    session = session_of(app, LONG_PROMPT)
    wait_steps(session, 1)
    sev = session.events[0].seq(session.focus)
    n = sev.num_tokens
    page.wait_for_function(f"() => document.querySelectorAll('#html-tokens .il-chip').length === {n}",
                           timeout=30000)
    chips = page.locator("#html-tokens .il-chip")
    assert page.locator("#html-tokens .il-chip:visible").count() == 2 * CHIPS_EDGE
    summary = page.locator("#html-tokens details.il-chips-fold > summary")
    assert f"{n - 2 * CHIPS_EDGE} more tokens" in summary.inner_text()
    folded = page.locator("#html-tokens").bounding_box()["height"]
    # the keyboard opens it: Tab reaches the control, Enter opens it
    summary.focus()
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => [...document.querySelectorAll('#html-tokens .il-chip')]"
                           f".filter((c) => c.offsetParent).length === {n}", timeout=10000)
    assert page.locator("#html-tokens").bounding_box()["height"] > 1.5 * folded
    assert chips.count() == n
    # the attention chart: the window it shows, and a label inside the rows the capture budget did not keep
    T = sev.chunk_start + sev.num_processed
    kept = sev.capture.attention_positions
    fig = drawn(page, "chart-attention")
    title = fig["layout"]["title"].replace("<br>", " ")
    assert f"last 256 of {T:,} positions" in title
    assert f"kept for the last {len(kept)} of the 256 positions shown" in title
    gap = next(a for a in (a.replace("<br>", " ") for a in fig["layout"]["annotations"]) if "not kept" in a)
    assert f"rows {T - 256}–{min(kept) - 1}" in gap
    filled = [i for i, r in enumerate(weights(fig)["z"]) if any(v is not None for v in r)]
    assert filled == [p - (T - 256) for p in kept]
    # the opened fold stays open when the next step redraws the chips
    page.evaluate("() => window.scrollTo(0, 0)")
    click_and_wait(page, "#step")
    page.wait_for_function(f"() => document.querySelectorAll('#html-tokens .il-chip').length === {n + 1}",
                           timeout=30000)
    assert page.locator("#html-tokens details.il-chips-fold").get_attribute("open") is not None
    page.close()
