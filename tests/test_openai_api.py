"""The lab's OpenAI-compatible API (issue 16, "Serve") driven by the official `openai` client — a client no one here
wrote — against a real `python -m app` process on a free port: the real engine, the room it shares with the tabs,
real HTTP and server-sent events. One server per module (started with --api-key, so every call also exercises the
key check). Usage is checked against the model's own tokenizer, the room view in Chromium, /metrics with
prometheus_client's parser."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e_util import TEST_SHOTS, chromium_available, free_port

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = TEST_SHOTS  # pictures of a run: an ignored folder
KEY = "test-key-16"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is gravity?"}]


@contextmanager
def app_process(args: list[str], log: Path, ready: str = "/healthz"):
    """`python -m app ARGS` on a free port until the block exits; yields its URL once `ready` answers (the lab:
    once its model has loaded)."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("INFERLAB_API_KEY", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), *args], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600  # a first run dequantises the model; a busy 2-core machine takes minutes
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                r = httpx.get(url + ready, timeout=5)
                if r.status_code == 200 and (ready != "/healthz" or r.json()["ready"]):
                    break
                assert ready != "/healthz" or not r.json()["error"], r.json()["error"]
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, f"{args} did not get ready:\n" + log.read_text()
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def module_server(name: str):
    """The fixtures `server` ((url, log path): `python -m app --api-key KEY` until the module ends) and `client`
    (the official client on it; max_retries=0: a 5xx must show, not be retried away) for a test module. Each
    module has a server of its own: tests count what their own requests did to /metrics."""
    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        log = tmp_path_factory.mktemp(name) / "server.log"
        with app_process(["--api-key", KEY, "--kv-memory-mb", "128"], log) as url:
            yield url, log

    @pytest.fixture(scope="module")
    def client(server):
        return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=300)

    return server, client


server, client = module_server("api")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from engine.loader import bundled_dir

    return AutoTokenizer.from_pretrained(str(bundled_dir()))


def metrics(url: str) -> dict:
    """{sample name with labels: value} from /metrics, read with prometheus_client's own parser."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


# ---- answers ------------------------------------------------------------------------------------------------
def test_chat_answers_and_counts_tokens_as_the_tokenizer_does(client, tokenizer):
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, logprobs=True)
    choice = r.choices[0]
    assert r.object == "chat.completion" and choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    # prompt tokens: the model's chat template, tokenized by its own tokenizer
    expected = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert r.usage.prompt_tokens == len(expected)
    tokens = choice.logprobs.content
    assert r.usage.completion_tokens == len(tokens) and r.usage.total_tokens == len(expected) + len(tokens)
    ids = tokenizer(choice.message.content, add_special_tokens=False)["input_ids"]
    if choice.finish_reason == "length":
        assert len(tokens) == 12
        # byte-level BPE: the tokens' bytes are the answer's bytes, and the tokenizer reads the text back the same
        assert b"".join(bytes(t.bytes) for t in tokens).decode() == choice.message.content
        assert tokenizer.decode(ids) == choice.message.content

    # the same request streamed gives the same greedy answer, delta by delta
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_completions_stream_and_not_agree_and_usage_counts_the_prompt(client, tokenizer):
    prompt = "The three primary colors are"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.prompt_tokens == len(tokenizer(prompt)["input_ids"])
    assert r.usage.completion_tokens == (10 if r.choices[0].finish_reason == "length" else r.usage.completion_tokens)
    parts = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text
    assert parts[-1].usage.model_dump() == r.usage.model_dump()
    # a prompt of token ids is read as those ids
    ids = tokenizer(prompt)["input_ids"]
    same = client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0)
    assert same.choices[0].text == r.choices[0].text and same.usage.prompt_tokens == len(ids)


def test_logprobs_are_the_distribution_each_token_was_drawn_from(client):
    # top_k=3 with temperature 1: the draw's distribution holds three tokens, renormalised to sum to 1
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=1.0, seed=5,
                                       logprobs=True, top_logprobs=5, extra_body={"top_k": 3})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        top = entry.top_logprobs
        assert len(top) == 3 and abs(sum(math.exp(t.logprob) for t in top) - 1.0) < 1e-4
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert entry.token in [t.token for t in top]
        assert entry.logprob == next(t.logprob for t in top if t.token == entry.token) and entry.logprob <= 0
    # greedy: the argmax of the model's (penalised) distribution is the token kept, with its real probability
    g = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=4)
    for entry in g.choices[0].logprobs.content:
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        assert len(entry.top_logprobs) == 4 and sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-6
    # legacy completions: logprobs=N gives the N most likely and always the chosen one
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0.8, seed=1,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and top[token] == value <= 0
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_stop_strings_cut_the_answer_before_the_stop(client):
    base = client.completions.create(model=MODEL, prompt="Count: one, two, three,", max_tokens=16, temperature=0)
    text = base.choices[0].text
    words = [w for w in text.split(" ") if w.strip()]
    assert len(words) >= 3, text
    stop = words[2]  # a stop string the greedy answer reaches after a few tokens
    cut = client.completions.create(model=MODEL, prompt="Count: one, two, three,", max_tokens=16, temperature=0,
                                    stop=[stop, "never-appears"])
    assert cut.choices[0].text == text[:text.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt="Count: one, two, three,", max_tokens=16,
                                              temperature=0, stop=stop, stream=True))
    assert "".join(p.choices[0].text for p in streamed) == cut.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_seeds_reproduce_and_n_gives_n_choices(client):
    def ask():
        return client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=1.0,
                                              seed=1234, n=3, logprobs=True)
    a, b = ask(), ask()
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]  # the same seed, the same three answers
    assert len(set(texts)) > 1  # choice j samples with seed + j: n answers, not one answer n times
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) for c in a.choices)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens  # the prompt is counted once, as OpenAI counts it
    # streamed, the three choices arrive interleaved, each with its own finish
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=1.0,
                                                 seed=1234, n=3, stream=True))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)]
    assert streamed == texts


# ---- refusals -------------------------------------------------------------------------------------------------
BAD = [  # (fields, the param the error names)
    ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"), ({"n": 9}, "n"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10**6}, "max_tokens"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"), ({"logit_bias": {"42": 500}}, "logit_bias"),
    ({"seed": "7"}, "seed"), ({"stop": ["x"] * 17}, "stop"), ({"extra_body": {"mirostat": 2}}, "mirostat"),
    ({"extra_body": {"top_k": -2}}, "top_k"), ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"), ({"extra_body": {"best_of": 2}}, "best_of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"), ({"extra_body": {"guided_json": {"type": "object"}, "guided_regex": "a"}}, "guided_regex"),
    ({"extra_body": {"chat_template_kwargs": {"tokenize": True}}}, "chat_template_kwargs"),
    ({"extra_body": {"min_tokens": 5}}, "min_tokens"), ({"extra_body": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0]"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=[p for _, p in BAD])
def test_bad_fields_are_answered_400_with_an_openai_error_body(client, fields, param):
    fields = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**fields)
    body = err.value.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    assert body["param"] == param and body["message"] and "Traceback" not in body["message"]


def test_unknown_model_bad_json_and_oversized_bodies_are_refused(server, client):
    url = server[0]
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert err.value.response.json()["error"]["code"] == "model_not_found"
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    bad = httpx.post(url + "/v1/completions", content=b'{"model": ', headers=auth, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    big = httpx.post(url + "/v1/completions", content=b'{"prompt": "' + b"a" * (2 << 20) + b'"}', headers=auth,
                     timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    long = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "word " * 30000}, headers=auth,
                      timeout=30)
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt"
    deep = httpx.post(url + "/v1/completions", content=b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                      headers=auth, timeout=30)
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_json"
    lone = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=30,
                      content=b'{"model": "%s", "messages": [{"role": "user", "content": "a \\ud800"}]}'
                      % MODEL.encode())
    assert lone.status_code == 400 and lone.json()["error"]["param"] == "messages[0].content"
    # the room's cap on one owner's KV reservation (half of this server's 128 MiB pool), said in the API's terms
    huge = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2048},
                      headers=auth, timeout=30)
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "request_too_large"
    assert "max_tokens" in huge.json()["error"]["message"]
    assert "Traceback" not in server[1].read_text()


def test_the_api_key_is_required(server):
    url = server[0]
    for key in ("", "wrong-key"):
        c = openai.OpenAI(base_url=url + "/v1", api_key=key or "none", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            c.models.list()
        assert err.value.response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/metrics", timeout=30).status_code == 200  # open, as vLLM's (--guard-metrics guards it)
    assert httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": QUESTION},
                      timeout=30).status_code == 401


# ---- the room, /metrics, a client that leaves ---------------------------------------------------------------
def test_metrics_parse_and_count_what_the_api_did(server, client):
    url = server[0]
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)  # its prompt's blocks: cached
    before = metrics(url)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, temperature=0, n=2)
    after = metrics(url)
    assert after["inferlab:model_ready"] == 1
    assert after["inferlab:prompt_tokens_total"] - before["inferlab:prompt_tokens_total"] == r.usage.prompt_tokens
    assert after["inferlab:generation_tokens_total"] - before["inferlab:generation_tokens_total"] == \
        r.usage.completion_tokens
    # one first token per choice, and a gap between every two tokens of a choice
    def grew(name):
        return after[name] - before[name]
    assert grew("inferlab:time_to_first_token_seconds_count") == 2
    assert grew("inferlab:inter_token_latency_seconds_count") == r.usage.completion_tokens - 2
    assert after['inferlab:time_to_first_token_seconds_bucket{le=+Inf}'] == \
        after["inferlab:time_to_first_token_seconds_count"]
    assert 0 <= after["inferlab:kv_cache_usage_perc"] <= 1 and after["inferlab:api_requests_in_flight"] == 0
    hits = after["inferlab:prefix_cache_hits_total"] - before["inferlab:prefix_cache_hits_total"]
    queries = after["inferlab:prefix_cache_queries_total"] - before["inferlab:prefix_cache_queries_total"]
    assert queries == r.usage.prompt_tokens * 2 and 0 < hits < queries  # the same prompt asked a moment ago
    assert 0 <= after["inferlab:prefix_cache_hit_rate"] <= 1
    assert after["inferlab:room_generation_tokens_total"] >= after["inferlab:generation_tokens_total"]


def wait_idle(url: str, timeout: float = 30) -> dict:
    """/metrics once no API request runs and the room holds no running sequence (what a released request leaves)."""
    deadline = time.time() + timeout
    while True:
        now = metrics(url)
        if now["inferlab:api_requests_in_flight"] == 0 and now["inferlab:num_requests_running"] == 0:
            return now
        assert time.time() < deadline, now
        time.sleep(0.2)


LONG = [{"role": "user", "content": "Write a long story about a dragon."}]
ABORTED = 'inferlab:request_success_total{finished_reason=abort}'


def test_a_client_that_disconnects_mid_stream_frees_its_sequences(server, client):
    url = server[0]
    before = metrics(url)
    got = 0
    with client.chat.completions.create(model=MODEL, max_tokens=400, temperature=0, stream=True,
                                        messages=LONG) as stream:
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got >= 3:
                break  # leaving the block closes the connection
    now = wait_idle(url)
    assert now['inferlab:kv_cache_blocks{state=used}'] == 0
    assert now.get(ABORTED, 0) == before.get(ABORTED, 0) + 1
    assert now["inferlab:generation_tokens_total"] - before["inferlab:generation_tokens_total"] < 400

    # a non-streaming request whose client gives up waiting is released as well
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=2.0,
                   json={"model": MODEL, "messages": LONG, "max_tokens": 400, "temperature": 0})
    later = wait_idle(url)
    assert later['inferlab:kv_cache_blocks{state=used}'] == 0
    assert later.get(ABORTED, 0) == now.get(ABORTED, 0) + 1


def test_one_client_may_run_eight_requests_at_once(server, client):
    """Eight streams held open are the client's limit: a ninth is answered 429 at once; they all run meanwhile."""
    url = server[0]
    streams = []
    try:
        for _ in range(8):
            s = client.chat.completions.create(model=MODEL, messages=LONG, max_tokens=300, temperature=0, stream=True)
            next(iter(s))  # its first chunk: the request runs
            streams.append(s)
        assert metrics(url)["inferlab:api_requests_in_flight"] == 8
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
        assert err.value.response.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        for s in streams:
            s.close()
    assert wait_idle(url)['inferlab:kv_cache_blocks{state=used}'] == 0
    assert client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2).choices  # free again


@pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
def test_an_api_request_runs_live_in_the_room_batched_with_a_tab(server, client):
    """Two pages on the lab: one watches the room panel and presses nothing, the other presses Run while an API
    request streams. The watcher's batch strip draws the request's two sequences while it runs, one step per
    token the API returned, and steps that carry the tab's sequence and the request's together."""
    from e2e_util import browser, open_lab
    from test_e2e_room import _prepare

    url = server[0]
    segments = """() => { const el = document.getElementById('chart-room-batch');
        const t = el && el.data && el.data.find((d) => d.name === 'batch');
        return t ? t.x.map((x, i) => [x, t.customdata[i][0], t.customdata[i][1]]) : []; }"""
    answer = {}

    def ask():  # streamed: the response's headers name the request's owner in the room at once
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt="The sky is blue because", max_tokens=40, temperature=0, n=2, stream=True,
            stream_options={"include_usage": True})
        answer["owner"] = raw.headers["x-inferlab-owner"]
        answer["usage"] = [c.usage for c in raw.parse()][-1]

    with browser() as b:
        watcher, runner = (open_lab(b.new_context(viewport={"width": 1600, "height": 1000}), url) for _ in range(2))
        for page in (watcher, runner):
            page.wait_for_function("() => window.inferlab.state.tied", timeout=60000)
        watcher.evaluate("() => document.getElementById('panel-room').scrollIntoView({block: 'start'})")
        watcher.wait_for_function("""() => { const s = window.inferlab.state, id = 'chart-room-batch';
                                             return s.drawn[id] && !s.stale[id] && !s.pending[id]; }""",
                                  timeout=60000)
        _prepare(runner, "What is gravity?", max_tokens=20)

        def shown():  # {step: {owners}}, and {api sequence: {steps}} of this request
            steps, mine = {}, {}
            for step, owner, sid in watcher.evaluate(segments):
                steps.setdefault(step, set()).add(owner)
                if owner == answer.get("owner"):
                    mine.setdefault(sid, set()).add(step)
            return steps, mine

        worker = threading.Thread(target=ask)
        worker.start()
        runner.click("#run button, button#run")
        seen_live = False
        while worker.is_alive():  # drawn while it runs: the room pushes its steps to the watching tab
            seen_live |= bool(shown()[1])
            time.sleep(0.2)
        worker.join()
        runner.wait_for_selector("#html-stream .il-finish", state="attached", timeout=180000)
        owner, usage = answer["owner"], answer["usage"]
        deadline = time.time() + 30
        while True:  # the last push after both finished
            steps, api = shown()
            together = [k for k, owners in steps.items()
                        if owner in owners and any(o.startswith("tab ") for o in owners)]
            if (sum(len(s) for s in api.values()) == usage.completion_tokens and together) or time.time() > deadline:
                break
            time.sleep(0.3)
        watcher.evaluate("() => { document.getElementById('panel-room').scrollIntoView({block: 'start'}); "
                         "window.inferlab.flush(); }")
        time.sleep(0.5)  # Plotly's responsive relayout after the scroll
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        watcher.locator("#panel-room").screenshot(path=str(SCREENSHOTS / "room-api.png"))
    assert seen_live, "the request's steps did not reach the watching tab while it ran"
    assert owner.startswith("api ") and len(api) == 2, (owner, api)  # its two choices' sequences
    assert sum(len(s) for s in api.values()) == usage.completion_tokens  # a step per token generated
    assert together, steps  # the tab's Run and the API request in the same engine steps


# ---- the policy (no server) ---------------------------------------------------------------------------------
def test_the_api_is_on_locally_and_off_in_public_unless_a_key_is_set():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.openai_api import decide, mount, startup_line
    from app.server import ModelHolder
    from app.session import SessionRegistry

    assert decide("127.0.0.1", None).enabled and decide("localhost", None).api_key is None
    off = decide("0.0.0.0", None)
    assert not off.enabled and "--api-key" in off.why_off and "off" in startup_line(off, "http://h")
    assert not decide("127.0.0.1", None, space=True).enabled  # a Space is public whatever its host
    keyed = decide("0.0.0.0", "k")
    assert keyed.enabled and keyed.api_key == "k" and "Bearer" in startup_line(keyed, "http://h")
    assert decide("0.0.0.0", None, "on").enabled and not decide("127.0.0.1", "k", "off").enabled
    assert "no key" in startup_line(decide("127.0.0.1", None), "http://127.0.0.1:7860")
    # an app with the API off answers every route 403 in OpenAI's error format, before touching the engine
    app = FastAPI()
    mount(app, SessionRegistry(), ModelHolder(), off)
    with TestClient(app, base_url="http://localhost") as http:
        for method, path in (("get", "/v1/models"), ("post", "/v1/chat/completions"), ("post", "/v1/completions"),
                             ("post", "/tokenize"), ("post", "/detokenize")):
            r = http.request(method.upper(), path, json={} if method == "post" else None)
            assert r.status_code == 403 and r.json()["error"]["code"] == "api_disabled"


def test_admission_caps_requests_per_client_and_in_all():
    from app.openai_api import Admission
    from app.openai_schema import ApiError, ApiLimits

    adm = Admission(ApiLimits(max_concurrent_per_client=2, max_concurrent=3))
    adm.acquire("a")
    adm.acquire("a")
    with pytest.raises(ApiError) as err:
        adm.acquire("a")
    assert err.value.status == 429
    adm.acquire("b")
    with pytest.raises(ApiError):
        adm.acquire("c")  # three running in all
    adm.release("a")
    adm.acquire("c")
    assert adm.running() == 3


def test_fields_map_onto_sampling_params():
    from app.openai_schema import SEED_MAX, SEED_MIN, ApiLimits, parse_chat, parse_completion

    limits = ApiLimits()
    job = parse_chat({"model": MODEL, "messages": QUESTION, "max_completion_tokens": 30, "temperature": 0.7,
                      "top_p": 0.9, "top_k": -1, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
                      "repetition_penalty": 1.2, "seed": SEED_MAX, "stop": "\n\n", "n": 3, "logprobs": True,
                      "top_logprobs": 4, "stream": True, "stream_options": {"include_usage": True}}, limits, 49152)
    p = job.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (30, 0.7, 0.9, 0, 0.05)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert p.stop == ("\n\n",) and job.logprobs == 4 and job.stream and job.include_usage and job.n == 3
    # choice j samples with seed + j, wrapping inside the engine's seed range
    job = replace(job, choice_params=(p,))
    assert [c.seed for _, _, c in job.choices()] == [SEED_MAX, SEED_MIN, SEED_MIN + 1]
    assert [i for i, _, _ in job.choices()] == [0, 1, 2]
    # defaults: OpenAI's 16 tokens for completions, logprobs off, no seed
    job = parse_completion({"model": MODEL, "prompt": ["a", "b"], "n": 2, "logprobs": 0}, limits, 49152)
    assert job.params.max_tokens == 16 and job.params.seed is None and job.logprobs == 0
    assert len(job.prompts) == 2 and job.n == 2
