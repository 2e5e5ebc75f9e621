"""Two tabs, one engine (issue 12), in Debian's Chromium against a real server and the real engine: two browser
contexts (two visitors, two sessions) press Run at once; the room view's batch strip shows steps that carry
both tabs' sequences, exactly as the server's room recorded them, and each tab's streamed answer is the one the
engine gives for that prompt alone (greedy sampling). A tab that presses nothing but has the room panel in view
watches another tab's Run happen, and no chart scrolled into view costs a Gradio request."""
import re
import time

import pytest

from e2e_util import TEST_SHOTS, chromium_available, ensure_drawn, open_lab, served_lab

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SCREENSHOTS = TEST_SHOTS
PROMPTS = ("What is gravity?", "Что такое гравитация?")
MAX_TOKENS = 12
ROOM_CHARTS = ("chart-room-batch", "chart-room-pool", "chart-room-throughput", "chart-room-size")

# the batch strip's segments as the page holds them: (step, owner as shown, sequence id) per segment
SEGMENTS_JS = """() => {
  const el = document.getElementById('chart-room-batch');
  const t = el && el.data && el.data.find((d) => d.name === 'batch');
  return t ? t.x.map((x, i) => [x, t.customdata[i][0], t.customdata[i][1]]) : null;
}"""


@pytest.fixture(scope="module")
def room_lab(base_engine):
    with served_lab(base_engine) as lab:
        yield lab


def _prepare(page, prompt, max_tokens=MAX_TOKENS):
    page.fill("#prompt textarea", prompt)
    for sel, value in (("#temperature input[type=number]", "0"), ("#max_tokens input", str(max_tokens))):
        box = page.locator(sel)
        box.fill(value)
        box.press("Enter")
        box.blur()
    page.wait_for_timeout(300)  # Gradio takes the new values on its next tick


def _chart_steps(page) -> dict:
    """{step: sorted [(owner label, seq id)]} from the batch chart's data in the page."""
    segs = page.evaluate(SEGMENTS_JS) or []
    out: dict[int, list] = {}
    for step, shown, sid in segs:
        owner = str(shown).removesuffix(" (you)")
        out.setdefault(int(step), []).append((owner, int(sid)))
    return {k: sorted(v) for k, v in out.items()}


def _record_steps(records, window: int) -> dict:
    return {int(r["step"]): sorted((str(b["owner"]), int(b["seq_id"])) for b in r["batch"])
            for r in list(records)[-window:]}


def _refresh(page) -> None:
    before = page.evaluate("() => window.inferlab.state.renders")
    page.evaluate("() => window.inferlab.refresh()")  # the charts in view, asked for over the page's socket
    page.wait_for_function(f"() => window.inferlab.state.renders > {before}", timeout=30000)


def test_two_tabs_run_at_once_in_one_engine(room_lab, base_engine):
    from app.charts.room import WINDOW_STEPS
    from app.i18n import t
    from engine import SamplingParams

    url, app, b = room_lab
    registry = app.state.registry
    contexts = [b.new_context(viewport={"width": 1600, "height": 1000}) for _ in PROMPTS]
    pages = [open_lab(ctx, url) for ctx in contexts]
    for page, prompt in zip(pages, PROMPTS):
        _prepare(page, prompt)
    # both Runs at (nearly) the same time: trigger both clicks, then wait for both
    for page in pages:
        page.click("#run button, button#run")
    finished = t("finished", "en")
    for page in pages:
        # the page's last frame arrives when its Run ends: the sequence's finish mark and the status line
        page.wait_for_selector("#html-stream .il-finish", state="attached", timeout=180000)
        page.wait_for_function("txt => document.querySelector('#html-message').innerText.includes(txt)",
                               arg=finished, timeout=60000)

    # the two tabs are two owners of the room's one engine, each with its own request
    sessions = {}
    for s in registry.sessions.values():
        prompts = [r.prompt for r in s.requests.values()]
        if len(prompts) == 1 and prompts[0] in PROMPTS:
            sessions[prompts[0]] = s
    assert set(sessions) == set(PROMPTS), [[r.prompt for r in s.requests.values()] for s in registry.sessions.values()]
    owners = {p: s.owner for p, s in sessions.items()}
    assert len(set(owners.values())) == 2
    assert all(s.engine is registry.room.engine for s in sessions.values())
    for s in sessions.values():
        params = s.engine.sequences[s.focus].params
        assert params.temperature == 0.0 and params.max_tokens == MAX_TOKENS  # the page's controls took

    records = registry.room.records()
    server = _record_steps(records, WINDOW_STEPS)
    both = [step for step, batch in server.items() if len({o for o, _ in batch}) == 2]
    assert both, f"no engine step carried both tabs: {server}"

    for page, prompt in zip(pages, PROMPTS):
        me = owners[prompt]
        # (a) the room view's batch strip is the server's record, step by step
        ensure_drawn(page, "chart-room-batch", timeout=60000)
        shown = {}
        for _ in range(5):
            shown = _chart_steps(page)
            if shown == server:
                break
            _refresh(page)  # a frame drawn before the last step: ask for the current one
            ensure_drawn(page, "chart-room-batch", timeout=60000)
        assert shown == server
        two = [step for step, batch in shown.items() if len(batch) == 2 and len({o for o, _ in batch}) == 2]
        assert two == both
        labels = page.evaluate("""() => document.getElementById('chart-room-batch').data[0].customdata
                                        .map((c) => c[0])""")
        assert f"{me} (you)" in labels and any(not x.endswith("(you)") for x in labels)  # its own and the other
        # (b) the streamed answer is the one the engine gives for this prompt alone
        alone = base_engine.session().generate(prompt, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                                               chat=True).text
        stream = page.evaluate("() => document.querySelector('#html-stream .il-stream-text').textContent")
        assert stream == alone, (prompt, stream, alone)
        assert sessions[prompt].engine.sequences[sessions[prompt].focus].detok.text == alone
        # (c) no error anywhere on the page
        assert page.locator(".il-msg-error").count() == 0, page.inner_text("#html-message")
        assert "Traceback" not in page.content()

    # the room panel as a student sees it, all four charts and the log drawn
    page = pages[0]
    for cid in ROOM_CHARTS:
        ensure_drawn(page, cid, timeout=60000)
    page.wait_for_function("() => document.querySelector('#html-room-log').innerText.trim().length > 0",
                           timeout=30000)
    page.evaluate("() => { document.getElementById('panel-room').scrollIntoView({block: 'start'}); "
                  "window.inferlab.flush(); }")
    time.sleep(0.5)  # Plotly's responsive relayout after the scroll
    # the throughput chart as drawn spans the window its title names
    tps = page.evaluate("""() => { const l = document.getElementById('chart-room-throughput')._fullLayout;
                               return {title: l.title.text, range: l.xaxis.range}; }""")
    window = float(re.search(r"over the last (\d+) s", tps["title"].replace("<br>", " ")).group(1))
    assert tps["range"] == [-window, 0], tps
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#panel-room").screenshot(path=str(SCREENSHOTS / "room.png"))
    for ctx in contexts:
        ctx.close()


def _gradio_requests(page) -> list:
    """The page's requests to Gradio's API from now on (its queue and run endpoints: an event, a button)."""
    seen = []
    page.on("request", lambda r: seen.append(r.url) if "/gradio_api/" in r.url and
            ("/queue/" in r.url or "/run/" in r.url or "/call/" in r.url) else None)
    return seen


def test_an_idle_tab_watches_another_tabs_run_and_scrolled_charts_need_no_gradio(room_lab):
    from app.charts.room import WINDOW_STEPS

    url, app, b = room_lab
    registry, room = app.state.registry, app.state.registry.room
    earlier = set(registry.sessions)
    contexts = [b.new_context(viewport={"width": 1600, "height": 1000}) for _ in range(2)]
    watcher, runner = (open_lab(ctx, url) for ctx in contexts)
    for page in (watcher, runner):
        page.wait_for_function("() => window.inferlab.state.tied", timeout=30000)  # its socket carries its ops
    # the watcher scrolls the room panel into view, and then presses nothing
    watcher.evaluate("() => document.getElementById('panel-room').scrollIntoView({block: 'start'})")
    # drawn from the view the page sent (a room with no steps yet draws a note, not a trace)
    watcher.wait_for_function("""() => { const s = window.inferlab.state, id = 'chart-room-batch';
                                         return s.drawn[id] && !s.stale[id] && !s.pending[id]; }""", timeout=60000)
    watcher_requests = _gradio_requests(watcher)
    seen_before = max(_chart_steps(watcher), default=-1)
    renders_before = watcher.evaluate("() => window.inferlab.state.renders")

    _prepare(runner, PROMPTS[0], max_tokens=40)  # a Run of a few seconds: several of the room's pushes
    runner_requests = _gradio_requests(runner)
    runner.click("#run button, button#run")
    runner_owner = None
    for _ in range(600):  # the runner's first steps reach the watcher while the Run goes on
        runner_owner = next((s.owner for k, s in registry.sessions.items() if k not in earlier and s.requests),
                            None)
        shown = _chart_steps(watcher)
        if runner_owner and any(o == runner_owner for batch in shown.values() for o, _ in batch):
            break
        time.sleep(0.1)
    assert runner_owner and max(shown) > seen_before, shown
    watcher.evaluate("() => window.inferlab.flush()")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watcher.locator("#panel-room").screenshot(path=str(SCREENSHOTS / "room-watcher.png"))
    runner.wait_for_selector("#html-stream .il-finish", state="attached", timeout=180000)

    # once the Run is over the watcher's strip is the room's record, step by step, without a click
    server = {}
    for _ in range(100):
        server = _record_steps(room.records(), WINDOW_STEPS)
        if _chart_steps(watcher) == server:
            break
        time.sleep(0.2)
    assert _chart_steps(watcher) == server
    sizes = watcher.evaluate("""() => { const t = document.getElementById('chart-room-size').data
                                          .find((d) => d.meta === 'batch'); return [t.x, t.y]; }""")
    assert sizes[0][-1] == max(server) and sizes[1][-1] == len(server[max(server)])
    assert watcher.evaluate("() => window.inferlab.state.renders") > renders_before + 1  # pushed, several times
    assert watcher.evaluate("() => window.inferlab.state.ops") == {}  # the watcher asked for nothing
    assert watcher_requests == []

    # the runner's charts off screen went stale with its steps; scrolled into view, each is asked for over the
    # page's socket and redrawn with the session's data, and Gradio hears nothing of it
    assert runner.evaluate("() => window.inferlab.state.socketRuns") == 1
    assert runner_requests == []  # Run went over the page's socket, as Step does: Gradio heard nothing of it
    session = next(s for s in registry.sessions.values() if s.owner == runner_owner)
    assert runner.evaluate("() => window.inferlab.state.stale['chart-timeline']")
    drawn = runner.evaluate("() => window.inferlab.state.drawn['chart-timeline'] || 0")
    views = runner.evaluate("() => window.inferlab.state.socketViews || 0")
    ensure_drawn(runner, "chart-timeline", timeout=60000)
    assert runner.evaluate("() => window.inferlab.state.drawn['chart-timeline']") > drawn
    assert runner.evaluate("() => window.inferlab.state.socketViews") > views
    xs = runner.evaluate("() => document.getElementById('chart-timeline').data.find((d) => d.name === 'steps').x")
    assert xs == [e.step for e in session.events]
    runner.wait_for_timeout(500)
    assert runner_requests == []
    runner.click("#pause button, button#pause")  # Pause is a Gradio event: what the counting sees
    for _ in range(100):
        if runner_requests:
            break
        time.sleep(0.1)
    assert runner_requests
    for ctx in contexts:
        ctx.close()
