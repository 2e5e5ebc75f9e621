"""The lab's operations surface read as vLLM's is read (issue 31, part 4): /metrics and /health open without the
key, vLLM's metric names with model_name and the values they must hold after known requests, /detokenize,
GET /v1/models/{id} through the official `openai` client, --guard-metrics, and whose address counts as the client
behind a proxy. A real `python -m app --api-key KEY` (tests/test_openai_api.py's app_process) for everything that
needs the model; the policy and the proxy rule without one."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_openai_api import KEY, MODEL, QUESTION, app_process, module_server

AUTH = {"Authorization": f"Bearer {KEY}"}


server, client = module_server("ops")


def scrape(url: str) -> dict:
    """{family name: [(sample name, labels, value)]} from /metrics read WITHOUT a key, by prometheus_client."""
    r = httpx.get(url + "/metrics", timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(r.text)}


def value(families: dict, sample: str, **labels) -> float:
    """The one sample named `sample` whose labels include `labels` (vLLM's: model_name and engine)."""
    found = [v for fam in families.values() for name, lab, v in fam
             if name == sample and all(lab.get(k) == str(x) for k, x in labels.items())]
    assert len(found) == 1, (sample, labels, found)
    return found[0]


def vllm(families: dict, sample: str, **labels) -> float:
    return value(families, sample, model_name=MODEL, engine="0", **labels)


# ---- /metrics: vLLM's names, labels and values ---------------------------------------------------------------
def test_metrics_are_open_and_vllm_families_count_what_the_requests_did(server, client):
    url = server[0]
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)  # the room has run
    before = scrape(url)
    answers = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=5,
                                              temperature=0, n=1)
               for q in ("What is gravity?", "Name a color.")]
    after = scrape(url)

    def grew(sample, **labels):
        return vllm(after, sample, **labels) - vllm(before, sample, **labels)

    # every vllm: sample carries the served model's name and engine 0; the lab's own names stay unlabelled
    for fam in after.values():
        for name, labels, _ in fam:
            if name.startswith("vllm:"):
                assert labels.get("model_name") == MODEL and labels.get("engine") == "0", (name, labels)
            else:
                assert name.startswith("inferlab:") and "model_name" not in labels, (name, labels)
    # both prefixes carry the same numbers
    assert value(after, "inferlab:request_params_max_tokens_sum") == vllm(after, "vllm:request_params_max_tokens_sum")
    for family in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                   "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens",
                   "request_params_n", "request_params_max_tokens", "iteration_tokens_total",
                   "time_to_first_token_seconds", "e2e_request_latency_seconds", "cache_config_info"):
        assert "vllm:" + family in after and "inferlab:" + family in after, family

    # what the two requests were: n = 1 and max_tokens = 5 each
    assert grew("vllm:request_params_max_tokens_count") == 2 and grew("vllm:request_params_max_tokens_sum") == 10
    assert grew("vllm:request_params_n_count") == 2 and grew("vllm:request_params_n_sum") == 2
    assert grew("vllm:request_params_n_bucket", le="1") == 2
    # their usage, as the API answered it
    completion = sum(a.usage.completion_tokens for a in answers)
    prompt = sum(a.usage.prompt_tokens for a in answers)
    assert grew("vllm:request_generation_tokens_count") == 2
    assert grew("vllm:request_generation_tokens_sum") == completion
    assert grew("vllm:request_prompt_tokens_sum") == prompt
    assert grew("vllm:generation_tokens_total") == completion and grew("vllm:prompt_tokens_total") == prompt
    reasons = {a.choices[0].finish_reason for a in answers}
    assert sum(grew("vllm:request_success_total", finished_reason=r) for r in reasons) == 2
    # each request's phases: one observation per request in every phase; inference is prefill + decode, and
    # queue + inference fit within its end-to-end latency (one clock, the room's step stamps inside the request)
    phases = {p: grew(f"vllm:request_{p}_time_seconds_sum") for p in ("queue", "prefill", "decode", "inference")}
    for p in phases:
        assert grew(f"vllm:request_{p}_time_seconds_count") == 2
        assert phases[p] >= 0
    assert phases["prefill"] > 0  # a prefill step takes time
    assert abs(phases["inference"] - phases["prefill"] - phases["decode"]) < 1e-5
    assert phases["queue"] + phases["inference"] <= grew("vllm:e2e_request_latency_seconds_sum") + 1e-5
    # a request of 5 tokens that ran to its length decoded for 4 steps after its first token
    if reasons == {"length"}:
        assert phases["decode"] > 0

    # every engine step of the room is in iteration_tokens_total: its tokens are the prompt tokens the steps
    # prefilled (the prompts less what the prefix cache held) plus the tokens they sampled
    steps = vllm(after, "vllm:room_steps_total") - vllm(before, "vllm:room_steps_total")
    assert grew("vllm:iteration_tokens_total_count") == steps > 0
    sampled = vllm(after, "vllm:room_generation_tokens_total") - vllm(before, "vllm:room_generation_tokens_total")
    assert sampled == completion
    prefilled = grew("vllm:iteration_tokens_total_sum") - sampled
    hits = grew("vllm:prefix_cache_hits_total")
    assert prompt - hits <= prefilled <= prompt
    assert vllm(after, "vllm:iteration_tokens_total_bucket", le="+Inf") == \
        vllm(after, "vllm:iteration_tokens_total_count")

    # the KV cache's configuration as vLLM's info gauge
    info = [(lab, v) for name, lab, v in after["vllm:cache_config_info"]]
    assert len(info) == 1 and info[0][1] == 1
    labels = info[0][0]
    blocks = sum(vllm(after, "vllm:kv_cache_blocks", state=s) for s in ("used", "cached", "free"))
    assert labels["block_size"] == "16" and labels["num_gpu_blocks"] == str(int(blocks))
    assert labels["enable_prefix_caching"] == "True" and labels["model_name"] == MODEL
    assert vllm(after, "vllm:model_ready") == 1 and "Traceback" not in server[1].read_text()


# ---- /health, GET /v1/models/{id}, /detokenize ----------------------------------------------------------------
def test_health_is_open_and_models_retrieve_works_with_the_official_client(server, client):
    url = server[0]
    r = httpx.get(url + "/health", timeout=30)
    assert r.status_code == 200 and r.content == b""
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    assert model.model_dump() == client.models.list().data[0].model_dump()  # the object the list holds
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("nobody/no-such-model")
    assert err.value.response.json()["error"]["code"] == "model_not_found"
    # the route is /v1: the key is required there
    assert httpx.get(url + "/v1/models/" + MODEL, timeout=30).status_code == 401


def test_detokenize_round_trips_tokenize_and_refuses_what_is_not_a_token(server):
    url = server[0]

    def post(path, body, headers=AUTH):
        return httpx.post(url + path, json=body, headers=headers, timeout=60)

    text = "The three primary colors are red, yellow and blue."
    ids = post("/tokenize", {"prompt": text}).json()["tokens"]
    r = post("/detokenize", {"model": MODEL, "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": text}
    # a chat through the template comes back as the template's text, special tokens and all (as vLLM's does)
    chat = post("/tokenize", {"messages": QUESTION}).json()["tokens"]
    back = post("/detokenize", {"tokens": chat}).json()["prompt"]
    assert "What is gravity?" in back and "<|im_start|>" in back
    assert post("/tokenize", {"prompt": back}).json()["tokens"] == chat
    assert post("/detokenize", {"tokens": []}).json() == {"prompt": ""}

    vocab = 49152  # SmolLM2's vocabulary
    for body, code in (({"tokens": [1, vocab]}, "invalid_token_id"), ({"tokens": [-1]}, "invalid_token_id"),
                       ({"tokens": [1, "2"]}, "invalid_type"), ({"tokens": [True]}, "invalid_type"),
                       ({"tokens": "1 2"}, "invalid_type"), ({}, "missing_required_parameter"),
                       ({"tokens": [1] * 4097}, "too_many_tokens"), ({"tokens": [1], "extra": 1}, "unknown_parameter")):
        r = post("/detokenize", body)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (code, r.text)
    assert post("/detokenize", {"model": "other", "tokens": [1]}).status_code == 404
    # tokenizer work: guarded as /v1 is, as vLLM guards it
    assert post("/detokenize", {"tokens": ids}, headers={}).status_code == 401
    assert post("/tokenize", {"prompt": text}, headers={}).status_code == 401
    assert "Traceback" not in server[1].read_text()


def test_guard_metrics_puts_metrics_and_health_behind_the_key(tmp_path):
    with app_process(["--api-key", KEY, "--kv-memory-mb", "64", "--guard-metrics", "--metrics-prefix", "vllm"],
                     tmp_path / "guarded.log") as url:
        for path in ("/metrics", "/health"):
            r = httpx.get(url + path, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
            assert httpx.get(url + path, headers=AUTH, timeout=30).status_code == 200, path
        text = httpx.get(url + "/metrics", headers=AUTH, timeout=30).text
        names = {f.name for f in text_string_to_metric_families(text)}
        assert "vllm:kv_cache_usage_perc" in names and not any(n.startswith("inferlab:") for n in names)


# ---- the policy without a model ------------------------------------------------------------------------------
def test_on_a_public_deployment_without_a_key_metrics_and_health_stay_open_and_the_rest_is_off():
    """A Space without a key: the API is off (403), /metrics answers (model_ready 0 while the model loads) and
    /health says 503 in OpenAI's error format until the model is ready."""
    from dataclasses import replace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.openai_api import decide, mount
    from app.server import ModelHolder
    from app.session import SessionRegistry

    off = decide("0.0.0.0", None, space=True)
    for settings, open_ops in ((off, True), (replace(off, guard_metrics=True), False)):
        app = FastAPI()
        holder = ModelHolder()
        holder.progress = 0.4
        mount(app, SessionRegistry(), holder, settings)
        with TestClient(app, base_url="http://localhost") as http:
            m = http.get("/metrics")
            h = http.get("/health")
            if open_ops:
                assert m.status_code == 200
                names = {s.name: s.value for f in text_string_to_metric_families(m.text) for s in f.samples}
                assert names["inferlab:model_ready"] == 0 and names["vllm:model_ready"] == 0
                assert h.status_code == 503 and h.json()["error"]["code"] == "model_not_ready"
                assert "loading (40%)" in h.json()["error"]["message"]
                holder.error = "Could not load model 'x': no such file"
                h = http.get("/health")
                assert h.status_code == 503 and h.json()["error"]["message"] == holder.error
            else:
                assert m.status_code == 403 and h.status_code == 403
                assert m.json()["error"]["code"] == "api_disabled"
            for method, path in (("POST", "/detokenize"), ("POST", "/tokenize"), ("GET", "/v1/models/" + MODEL)):
                r = http.request(method, path, json={"tokens": [1]} if method == "POST" else None)
                assert r.status_code == 403 and r.json()["error"]["code"] == "api_disabled", path


# ---- whose request it is, behind a proxy -------------------------------------------------------------------------
def test_the_client_is_the_peer_unless_the_peer_is_an_allowed_proxy():
    from app.ops_api import Proxies, client_address, parse_proxies

    none = Proxies()
    # no proxy configured: the header is never read, whoever sends it
    assert client_address("1.2.3.4", "127.0.0.1", none) == "127.0.0.1"
    assert client_address(None, "10.0.0.5", none) == "10.0.0.5"
    lb = parse_proxies("10.0.0.1, 10.0.1.0/24")
    # a peer that is not an allowed proxy: its header is its own words, ignored
    assert client_address("9.9.9.9", "203.0.113.7", lb) == "203.0.113.7"
    # from an allowed proxy: the right-most address that is not a proxy; what the client wrote itself (left of
    # the proxies' own entries) is never reached
    assert client_address("198.51.100.2", "10.0.0.1", lb) == "198.51.100.2"
    assert client_address("6.6.6.6, 198.51.100.2", "10.0.0.1", lb) == "198.51.100.2"
    assert client_address("6.6.6.6, 198.51.100.2, 10.0.1.9", "10.0.0.1", lb) == "198.51.100.2"
    assert client_address(["6.6.6.6", "198.51.100.2, 10.0.1.9"], "10.0.0.1", lb) == "198.51.100.2"  # two headers
    assert client_address("10.0.1.8, 10.0.1.9", "10.0.0.1", lb) == "10.0.1.8"  # all proxies: the left-most
    assert client_address(None, "10.0.0.1", lb) == "10.0.0.1"  # a proxy's own request
    assert client_address("198.51.100.2:5123", "10.0.0.1", lb) == "198.51.100.2"
    assert client_address("[2001:db8::1]:443", "10.0.0.1", lb) == "2001:db8::1"
    assert client_address("unknown", "10.0.0.1", lb) == "unknown"  # not an address: named as it came
    assert client_address("x" * 500, "10.0.0.1", lb) == "x" * 64  # capped
    # "*" (a Space): any peer is the proxy, the platform's private hops are skipped, the client is the right-most
    # public address; a client's own prefix does not move it
    star = parse_proxies("*")
    assert client_address("198.51.100.2, 10.16.3.4", "10.16.0.9", star) == "198.51.100.2"
    assert client_address("6.6.6.6, 198.51.100.2", "172.17.0.1", star) == "198.51.100.2"
    assert client_address("192.168.1.5", "172.17.0.1", star) == "192.168.1.5"  # a LAN: nothing public
    assert client_address(None, "172.17.0.1", star) == "172.17.0.1"
    assert client_address(",".join(["7.7.7.7"] * 5000) + ", 198.51.100.2", "10.0.0.1", star) == "198.51.100.2"
    assert client_address("1.2.3.4", "not-an-ip", star) == "not-an-ip"
    assert not parse_proxies("") and not parse_proxies(None) and parse_proxies("::1").allows(
        __import__("ipaddress").ip_address("::1"))
    with pytest.raises(ValueError, match="not an IP address"):
        parse_proxies("10.0.0.1, proxy.local")


def test_the_api_reads_the_client_from_a_real_request_through_the_rule():
    """openai_api's admission key from Starlette's own Request: the header only counts from an allowed proxy."""
    from starlette.requests import Request

    from app.openai_api import _client
    from app.ops_api import parse_proxies

    def request(peer, *forwarded):
        headers = [(b"x-forwarded-for", f.encode()) for f in forwarded]
        return Request({"type": "http", "method": "GET", "path": "/", "headers": headers, "client": (peer, 5000)})

    assert _client(request("127.0.0.1", "1.2.3.4")) == "127.0.0.1"  # no proxy configured
    assert _client(request("127.0.0.1", "1.2.3.4"), parse_proxies("127.0.0.1")) == "1.2.3.4"
    assert _client(request("127.0.0.1", "6.6.6.6", "1.2.3.4"), parse_proxies("127.0.0.1")) == "1.2.3.4"
    assert _client(request("127.0.0.2", "1.2.3.4"), parse_proxies("127.0.0.1")) == "127.0.0.2"


def test_a_space_trusts_its_proxy_by_default_and_the_flag_wins():
    from app.__main__ import forwarded_allow_ips

    assert forwarded_allow_ips(None, space=True) == "*" and forwarded_allow_ips(None, space=False) == ""
    assert forwarded_allow_ips("10.0.0.1", space=True) == "10.0.0.1"
    assert forwarded_allow_ips("", space=True) == ""  # an operator may turn it off on a Space
