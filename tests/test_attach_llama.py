"""Attach mode against llama.cpp's server (issue 16: "llama.cpp's server from llama-cpp-python[server] on the same
bundled GGUF when it is installed"): `python -m llama_cpp.server --model <the bundled GGUF>` started here, the
attach page (`python -m app --attach URL`) pointed at it. The page's answer, top-N and token panel are compared with
what the server answers the same request through the official `openai` client; a room load goes through the attach
page's relay with followers on real websockets.

Needs a Python with llama-cpp-python[server]: `INFERLAB_LLAMA_PYTHON=/path/to/python`, or `llama_cpp` importable
here. Without either, every test here is skipped with that reason."""
from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from e2e_util import browser, chromium_available, free_port
from test_openai_api import app_process

PROMPT = "What is gravity?"
TOKEN = "llama-room-token"


def _llama_python() -> str | None:
    """The Python that runs llama.cpp's server: $INFERLAB_LLAMA_PYTHON, else this one if it has llama_cpp."""
    given = os.environ.get("INFERLAB_LLAMA_PYTHON")
    if given:
        return given if shutil.which(given) or Path(given).exists() else None
    try:
        import llama_cpp.server.app  # noqa: F401  (the [server] extra: llama_cpp alone cannot serve)
    except ImportError:
        return None
    return sys.executable


PYTHON = _llama_python()
pytestmark = pytest.mark.skipif(
    PYTHON is None, reason="llama.cpp's server is not installed: set INFERLAB_LLAMA_PYTHON to a Python with "
                           "llama-cpp-python[server] (pip install \"llama-cpp-python[server]\"), or install it here")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(llama.cpp server URL, its model name, attach page URL)."""
    from engine.loader import bundled_gguf_path

    logs = tmp_path_factory.mktemp("llama")
    port = free_port()
    log = logs / "llama.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([PYTHON, "-m", "llama_cpp.server", "--model", str(bundled_gguf_path()), "--port",
                                 str(port), "--n_threads", "1", "--n_ctx", "2048", "--verbose", "False",
                                 # by default a new request interrupts the running one: a room load's
                                 # requests would cut each other short; queued, they run one after another
                                 "--interrupt_requests", "False"],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                r = httpx.get(url + "/v1/models", timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        model = r.json()["data"][0]["id"]
        os.environ["INFERLAB_PRESENTER_TOKEN"] = TOKEN
        try:
            with app_process(["--attach", url], logs / "attach.log", ready="/") as page:
                yield url, model, page
        finally:
            os.environ.pop("INFERLAB_PRESENTER_TOKEN", None)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _frames(page: str, body: dict) -> list[dict]:
    r = httpx.post(page + "/attach/ask", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines() if line]


def test_the_attach_page_draws_llama_cpps_own_answer(llama):
    url, model, page = llama
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=12, temperature=0, logprobs=True, top_logprobs=5)
    last = _frames(page, {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "top_n": 5})[-1]
    assert last["done"] and "at-error" not in last["html"]["attach-stream"]
    # the streamed deltas are the server's answer (greedy: the same as through the official client)
    deltas = re.findall(r'<span class="at-delta"[^>]*>(.*?)<sub>', last["html"]["attach-stream"], re.S)
    assert "".join(html.unescape(d).replace("∅", "") for d in deltas) == answer.choices[0].message.content
    # the top-N chart of the last token: llama.cpp's own top-5 with their probabilities
    top = last["figs"]["attach-top"]["data"][0]
    content = answer.choices[0].logprobs.content
    want = [math.exp(x.logprob) for x in content[-1].top_logprobs]
    assert [round(p, 4) for p in top["x"][::-1]] == [round(p, 4) for p in want]
    # panel 1: the server names its model by the GGUF's path; the tokenizer read from that GGUF here gives the
    # model's real tokens, the engine tokenizer's ids (and as many as llama.cpp counted, give or take its BOS)
    panel = last["html"]["attach-tokens"]
    ids = [int(i) for i in re.findall(r'class="at-tok" data-id="(\d+)"', panel)]
    assert 'data-source="model"' in panel and ids == _engine_ids(PROMPT), panel
    assert abs(len(ids) - answer.usage.prompt_tokens) <= 1
    # where the stream carried no usage the page says so; no "?" for a count
    status = re.sub(r"<[^>]+>", " ", last["html"]["attach-stream"].rpartition("</div>")[2])
    assert "?" not in status and ("sent no token counts" in status or "the server counted" in status), status
    # no /metrics on llama-cpp-python's server: the chart says so, and it is asked again less and less often
    metrics = httpx.get(page + "/attach/metrics", timeout=30).json()
    assert metrics["points"] == 0 and metrics["absent"] is True and metrics["retry_s"] >= 2


def _engine_ids(prompt: str) -> list[int]:
    """The engine tokenizer's ids of the chat-templated prompt (engine.loader's bundled model)."""
    from engine.loader import bundled_dir
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundled_dir()))
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
def test_the_page_in_chromium_shows_llama_cpps_model_and_its_real_tokens(llama, tmp_path):
    """The attach page in Chromium at 420 px: the header names the GGUF by its file (the path in the hover title),
    the tokens panel holds the model's real tokens (ids equal to the engine tokenizer's), the page stops polling
    /metrics every 2 s after the server's 404, and nothing is wider than the window."""
    url, model, page_url = llama
    with browser() as b:
        page = b.new_page(viewport={"width": 420, "height": 900})
        page.goto(page_url)
        name = page.locator("#attach-model-name")
        assert name.inner_text() == Path(model).name and name.get_attribute("title") == model
        page.fill("#attach-prompt", PROMPT)
        page.fill("#attach-max-tokens", "8")
        page.fill("#attach-top-n", "5")
        page.click("#attach-send")
        page.wait_for_function("() => window.attach.state.done", timeout=180000)
        ids = page.evaluate("() => [...document.querySelectorAll('#attach-tokens .at-tok')].map((e) => +e.dataset.id)")
        assert ids == _engine_ids(PROMPT)
        assert "?" not in page.inner_text("#attach-stream .at-note")
        page.wait_for_function("() => window.attach.state.absent && window.attach.state.delay >= 4000",
                               timeout=30000)
        polls = page.evaluate("() => window.attach.state.polls")
        time.sleep(6)
        assert page.evaluate("() => window.attach.state.polls") - polls <= 2  # at 2 s a poll it would be 3
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 420
        page.screenshot(path=str(tmp_path / "attach-llama-420.png"), full_page=True)


def _follow(page: str, ws) -> str:
    """What a follower's page does (static/follow_load.js): its ticket, its streamed request, its report."""
    msg = next(m for m in (json.loads(ws.recv(timeout=30)) for _ in range(5)) if m["type"] == "load")
    sent, ttft, text = time.perf_counter(), None, ""
    with httpx.stream("POST", page + msg["url"], json={}, timeout=300,
                      headers={"Authorization": f"Bearer {msg['ticket']}"}) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                for c in json.loads(line[5:]).get("choices") or []:
                    piece = (c.get("delta") or {}).get("content") or ""
                    if piece and ttft is None:
                        ttft = time.perf_counter() - sent
                    text += piece
    assert text and ttft is not None, "the stream ended before its first token"
    ws.send(json.dumps({"op": "load_report", "round": msg["round"], "ok": True, "ttft_ms": ttft * 1e3, "tokens": 0}))
    return text


def test_a_room_load_through_the_relay_to_llama_cpp(llama):
    """Two followers on real websockets do what a follower's page does, at once; the presenter's summary counts
    both. (llama-cpp-python's server runs one request at a time: it has no /metrics, so no batches are shown.)"""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import ExitStack

    from websockets.sync.client import connect

    url, model, page = llama
    with ExitStack() as stack:
        followers = [stack.enter_context(connect(page.replace("http", "ws") + "/ws/follow")) for _ in range(2)]
        r = httpx.post(page + "/attach/room/send", json={"token": TOKEN, "prompt": PROMPT, "max_tokens": 8,
                                                        "temperature": 0}, timeout=30)
        assert r.status_code == 200 and r.json()["asked"] == 2, r.text
        with ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(lambda ws: _follow(page, ws), followers))
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        want = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=8, temperature=0)
        assert texts == [want.choices[0].message.content] * 2
        deadline = time.time() + 30
        while (s := httpx.get(page + "/attach/room/summary", timeout=30).json()["summary"])["answered"] < 2:
            assert time.time() < deadline, s
            time.sleep(0.5)
        assert s["failed"] == 0 and s["tokens"] == 2 * want.usage.completion_tokens and s["batches"] is None
