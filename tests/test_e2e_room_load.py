"""Load from the room (issue 16, part 3), in Debian's Chromium against a real server and the real engine: a
presenter's page and three followers' pages; the presenter presses "Every follower sends one request now"; each
follower's browser sends its own streaming request to the lab's /v1 (which requires an API key none of these pages
knows: each page holds a one-time ticket instead), shows its answer and the time to its first token measured in
that browser, and reports back; the presenter's lecture box counts three answers and the batches the room ran."""
import json

import httpx
import openai
import pytest

from e2e_util import TEST_SHOTS, browser, chromium_available, click_until_message, open_lab, running_server

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SCREENSHOTS = TEST_SHOTS
TOKEN = "e2e-room-load-token"
KEY = "e2e-room-load-api-key"
PROMPT = "What is gravity?"
MAX_TOKENS = 16
FOLLOWERS = 3


@pytest.fixture(scope="module")
def lab(base_engine):
    from app.openai_api import ApiSettings

    with running_server(base_engine, kv_memory=64 * 1024 * 1024, presenter_token=TOKEN,
                        api=ApiSettings(True, KEY)) as (url, app):
        with browser() as b:
            yield url, app, b


def _present(b, url):
    page = open_lab(b, url, height=1200)
    page.fill("#prompt textarea", PROMPT)
    for sel, value in (("#temperature input[type=number]", "0"), ("#max_tokens input", str(MAX_TOKENS))):
        box = page.locator(sel)
        box.fill(value)
        box.press("Enter")
        box.blur()
    page.click("#lecture > button, #lecture .label-wrap")
    page.fill("#presenter_token input", TOKEN)
    click_until_message(page, "#present", "presenting")
    page.wait_for_timeout(300)  # Gradio takes the new values on its next tick
    return page


def test_every_follower_sends_one_request_and_the_presenter_sees_the_room(lab):
    url, app, b = lab
    page = _present(b, url)
    followers = []
    for i in range(FOLLOWERS):  # separate contexts: three visitors, three sockets; the last reads Russian
        f = b.new_context(viewport={"width": 1100, "height": 800}).new_page()
        f.goto(url + "/follow" + ("?lang=ru" if i == FOLLOWERS - 1 else ""))
        f.wait_for_function("() => document.getElementById('follow-status').className.includes('ok')",
                            timeout=30000)
        followers.append(f)
    page.wait_for_function(f"() => Number(document.getElementById('viewer-count').textContent) === {FOLLOWERS}",
                           timeout=30000)
    page.click("#room-load")
    for f in followers:
        f.wait_for_function("() => window.inferlabLoad.state.done >= 1", timeout=180000)
    # each follower's own answer and TTFT, measured in its browser
    answers, ttfts = [], []
    for f in followers:
        r = f.evaluate("() => window.inferlabLoad.state.last")
        assert r["ok"] is True, r["error"]
        assert r["text"].strip() and f.inner_text("#follow-load-answer") == r["text"]
        assert 0 < r["ttft_ms"] <= r["elapsed_ms"]
        assert f.get_attribute("#follow-load-status", "data-ttft-ms") == str(r["ttft_ms"])
        said = f.inner_text("#follow-load-status")
        assert ("первый токен через" if "lang=ru" in f.url else "first token after") in said
        assert KEY not in f.content()  # the page never saw the API key
        answers.append(r["text"])
        ttfts.append(r["ttft_ms"] / 1e3)
    # greedy: each is the answer the server gives the same request through the official client and the key
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    want = client.chat.completions.create(model=app.state.lecture.load_request()["model"], max_tokens=MAX_TOKENS,
                                          temperature=0, messages=[{"role": "user", "content": PROMPT}])
    assert answers == [want.choices[0].message.content] * FOLLOWERS
    # the presenter's box (polled every 3 s while open): three answered, and the batches the room ran
    page.wait_for_function(f"""() => {{ const a = document.getElementById('load-answered');
                                       return a && Number(a.textContent) === {FOLLOWERS}; }}""", timeout=60000)
    page.wait_for_selector("#load-max-batch", timeout=30000)
    summary = app.state.room_load.summary()
    assert summary["answered"] == summary["asked"] == FOLLOWERS and summary["failed"] == 0
    assert summary["tokens"] == FOLLOWERS * want.usage.completion_tokens  # counted by the server, not the pages
    ttfts.sort()
    assert summary["ttft_p50_s"] == pytest.approx(ttfts[1]) and summary["ttft_p95_s"] == pytest.approx(ttfts[2])
    # the batches, from the room's own step records: the followers' requests ran together
    records = app.state.registry.room.records()
    ours = [r for r in records if any(b["owner"].startswith("follower") for b in r["batch"])]
    most = max(sum(b["owner"].startswith("follower") for b in r["batch"]) for r in ours)
    assert most >= 2 and summary["batches"]["max_round"] == most
    assert summary["batches"]["max"] == max(len(r["batch"]) for r in ours)
    assert int(page.inner_text("#load-max-batch")) == summary["batches"]["max"]
    shown = page.inner_text("#lecture-status")
    assert f"median {summary['ttft_p50_s'] * 1e3:.0f} ms" in shown
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#lecture").screenshot(path=str(SCREENSHOTS / "room-load-presenter.png"))
    followers[0].screenshot(path=str(SCREENSHOTS / "room-load-follower.png"))

    # bounded: a ticket serves one request (the cooldown between rounds: tests/test_room_load.py); /v1 still
    # needs the key
    used = app.state.room_load.round.slots
    ticket = next(iter(used))
    auth = {"Authorization": f"Bearer {ticket}"}
    body = {"model": want.model, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    other = httpx.post(url + "/v1/chat/completions", json=body, headers=auth)  # another prompt: never allowed
    assert other.status_code == 403 and "round's own prompt" in other.json()["error"]["message"]
    body["messages"][0]["content"] = PROMPT
    again = httpx.post(url + "/v1/chat/completions", json=body, headers=auth)
    assert again.status_code == 403 and "used already" in again.json()["error"]["message"]
    assert httpx.post(url + "/tokenize", json={"prompt": PROMPT}, headers=auth).status_code == 401  # chat only
    assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401
    for f in followers:
        f.context.close()
    page.close()


def test_only_the_presenter_can_ask_and_followers_stay_read_only(lab):
    url, app, b = lab
    page = open_lab(b, url)
    page.click("#lecture > button, #lecture .label-wrap")
    page.click("#room-load")
    page.wait_for_function("() => document.getElementById('lecture-status').innerText.includes('Only the presenter')",
                           timeout=30000)
    # a follower's socket may report its own round, and nothing else
    from websockets.sync.client import connect

    def reply(ws) -> dict:  # the next answer, past the hello and any lecture frame
        while True:
            msg = json.loads(ws.recv(timeout=30))
            if msg["type"] in ("error", "ok"):
                return msg

    with connect(url.replace("http", "ws") + "/ws/follow") as ws:
        ws.send('{"op": "step"}')
        assert "read-only" in reply(ws)["error"]
        ws.send('{"op": "load_report", "round": 1, "ok": true, "ttft_ms": 5, "tokens": 3}')
        assert "no round of yours" in reply(ws)["error"]
    page.close()
