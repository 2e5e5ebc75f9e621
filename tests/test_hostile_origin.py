"""A page of another site against the lab on this machine (issue 36, classes 1 and 2): the browser of someone who
has the lab or an attach page open on 127.0.0.1 visits a page elsewhere, whose script POSTs there with
`fetch(..., {mode: "no-cors"})` and a text/plain body, which a browser sends without asking first. Such a request
must change nothing: no attach target switched, no prompt sent on, no token generated on the engine. Checked in
Debian's Chromium against real servers: `python -m app` with its OpenAI API on and no key (the loopback default),
an attach page (`python -m app --attach`) pointed at it, and the foreign page served from a third port. Then
the same rules in direct requests (415 for a body not declared JSON, 403 for a foreign Origin, OpenAI's error
body on the API), the official client still served, attach targets judged by the addresses they resolve to (any
spelling), redirects not followed, and a body that never arrives answered 408."""
from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from e2e_util import browser, chromium_available, free_port
from test_openai_api import MODEL, app_process

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
BODY_TIMEOUT_S = 3  # the API server's $INFERLAB_BODY_TIMEOUT_S here (30 s by default)
API_POSTS = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
ATTACH_POSTS = ("/attach/target", "/attach/ask", "/attach/room/send", "/attach/room/chat")
FOREIGN = "http://evil.example"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(api url, api log, attach page url, attach log): the lab with its API on and no key (what loopback gets
    by default), and an attach page pointed at it."""
    logs = tmp_path_factory.mktemp("hostile_origin")
    os.environ["INFERLAB_BODY_TIMEOUT_S"] = str(BODY_TIMEOUT_S)  # app_process hands the environment on
    try:
        with app_process(["--kv-memory-mb", "128"], logs / "api.log") as api:
            with app_process(["--attach", api], logs / "attach.log", ready="/") as page:
                yield api, logs / "api.log", page, logs / "attach.log"
    finally:
        os.environ.pop("INFERLAB_BODY_TIMEOUT_S", None)


class _Foreign(BaseHTTPRequestHandler):
    """Another site (another port is another origin): a blank page for the script, an OpenAI-looking server for
    an attach page that is pointed here, and a redirect. Every request it gets is recorded."""

    hits: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.hits.append(self.path)
        if self.path.startswith("/redirect/"):  # to this same server: a followed redirect would show up in hits
            self.send_response(307)
            self.send_header("Location", "/followed" + self.path[len("/redirect"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.endswith("/v1/models"):
            body, kind = json.dumps({"object": "list", "data": [{"id": "foreign-model"}]}).encode(), "application/json"
        else:
            body, kind = b"<!doctype html><html><body>another site</body></html>", "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def foreign():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Foreign)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Foreign.hits
    finally:
        server.shutdown()
        server.server_close()


def _generated(api: str) -> float:
    """The API's generation_tokens_total (tokens generated for /v1 requests) on its /metrics."""
    text = httpx.get(api + "/metrics", timeout=30).text
    return float(re.search(r"^inferlab:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M).group(1))


def _target(page: str) -> str:
    """The URL the attach page is attached to (its switch panel's URL field is filled with it)."""
    html = httpx.get(page + "/", timeout=30).text
    return re.search(r'id="attach-url"[^>]*?value="([^"]*)"', html).group(1)


# the foreign page's script: each request as a page elsewhere can send it without a preflight
NO_CORS = """async ({attach, api, foreign, model}) => {
  const plain = (url, body) => fetch(url, {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: JSON.stringify(body)}).then(() => "sent", (e) => "failed " + e);
  const out = [];
  out.push(await plain(attach + "/attach/target", {url: foreign}));
  out.push(await plain(attach + "/attach/ask", {prompt: "Tell me a story", max_tokens: 8}));
  for (let i = 0; i < 3; i++)
    out.push(await plain(api + "/v1/completions", {model, prompt: "Once upon a time", max_tokens: 8}));
  out.push(await plain(api + "/v1/chat/completions", {model, max_tokens: 8,
                                                     messages: [{role: "user", content: "Hi"}]}));
  out.push(await plain(api + "/tokenize", {model, prompt: "hello"}));
  return out;
}"""

# the same requests declared JSON: a browser asks the server first (a CORS preflight) and sends nothing
# when it is not granted
JSON_CORS = """async ({attach, api, foreign, model}) => {
  const json = (url, body) => fetch(url, {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body)}).then((r) => "answered " + r.status, (e) => "blocked");
  return [await json(attach + "/attach/target", {url: foreign}),
          await json(api + "/v1/completions", {model, prompt: "Once upon a time", max_tokens: 8})];
}"""

SAME_ORIGIN = """async ([path, body]) => {
  const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                               body: JSON.stringify(body)});
  return [r.status, await r.json()];
}"""


def test_a_page_of_another_site_changes_no_target_and_runs_no_tokens(servers, foreign):
    api, api_log, page_url, _ = servers
    foreign_url, hits = foreign
    before_target, before_tokens = _target(page_url), _generated(api)
    assert before_target == api
    hits.clear()
    with browser() as b:
        page = b.new_page()
        page.goto(foreign_url + "/")
        args = {"attach": page_url, "api": api, "foreign": foreign_url, "model": MODEL}
        # the browser did send every one of them (an opaque answer came back for each)...
        assert page.evaluate(NO_CORS, args) == ["sent"] * 7
        assert page.evaluate(JSON_CORS, args) == ["blocked", "blocked"]
        # ...and none changed anything: the attach page still names its server and never asked the foreign one,
        # and the engine generated no token for them
        assert _target(page_url) == before_target
        assert not [h for h in hits if "/v1/models" in h or "/metrics" in h]
        assert _generated(api) == before_tokens
        # the servers' own pages still do all of it (same origin: Chromium sends Origin = the page's host)
        page.goto(page_url + "/")
        status, body = page.evaluate(SAME_ORIGIN, ["/attach/target", {"url": api + "/v1/"}])
        assert status == 200 and body == {"url": api, "model": MODEL}
        page.goto(api + "/follow")
        status, body = page.evaluate(SAME_ORIGIN, ["/tokenize", {"model": MODEL, "prompt": "hello"}])
        assert status == 200 and body["count"] >= 1
    assert "Traceback" not in api_log.read_text()


def _openai_error(r, status: int, code: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code and error["message"]


def test_direct_requests_not_json_or_from_a_foreign_origin_are_refused(servers):
    api, api_log, page_url, attach_log = servers
    before = _generated(api)
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "tokens": [1, 2],
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    for path in API_POSTS:
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"Content-Type": kind} if kind else {}
            _openai_error(httpx.post(api + path, content=body, headers=headers, timeout=30), 415,
                          "unsupported_media_type")
        for origin in (FOREIGN, "null", api.replace("127.0.0.1", "localhost")):
            r = httpx.post(api + path, content=body, timeout=30,
                           headers={"Content-Type": "application/json", "Origin": origin})
            _openai_error(r, 403, "cross_origin")
            assert r.json()["error"]["type"] == "permission_error"
    # this server's own page (Origin = its host), with a charset parameter: served
    r = httpx.post(api + "/tokenize", content=json.dumps({"model": MODEL, "prompt": "hello"}).encode(), timeout=30,
                   headers={"Content-Type": "Application/JSON; charset=utf-8", "Origin": api})
    assert r.status_code == 200 and r.json()["count"] >= 1
    assert _generated(api) == before
    for path in ATTACH_POSTS:
        r = httpx.post(page_url + path, content=b'{"url": "http://127.0.0.1:9"}', timeout=30,
                       headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]
        r = httpx.post(page_url + path, json={"url": "http://127.0.0.1:9"}, headers={"Origin": FOREIGN}, timeout=30)
        assert r.status_code == 403 and "another site" in r.json()["error"]
    assert _target(page_url) == api
    # reading stays open to anyone, as before: a GET changes nothing
    assert httpx.get(api + "/v1/models", headers={"Origin": FOREIGN}, timeout=30).status_code == 200
    for log in (api_log, attach_log):
        assert "Traceback" not in log.read_text()


def test_the_official_client_is_still_served(servers):
    api = servers[0]
    client = openai.OpenAI(base_url=api + "/v1", api_key="none", max_retries=0, timeout=300)
    before = _generated(api)
    answer = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3, temperature=0)
    assert answer.usage.completion_tokens == 3
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=3, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert _generated(api) == before + 6


def test_attach_targets_are_judged_by_the_address_they_resolve_to(servers):
    api, _, page_url, attach_log = servers
    port = api.rsplit(":", 1)[1]

    def switch(host: str):
        return httpx.post(page_url + "/attach/target", json={"url": f"http://{host}:{port}"}, timeout=60)

    # loopback in any spelling the resolver takes: this machine, allowed, and written in its plain form
    for spelling, plain in (("0x7f000001", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("127.1", "127.0.0.1"),
                            ("0177.0.0.1", "127.0.0.1"), ("[::ffff:127.0.0.1]", "127.0.0.1"),
                            ("LOCALHOST", "localhost")):
        r = switch(spelling)
        assert r.status_code == 200 and r.json() == {"url": f"http://{plain}:{port}", "model": MODEL}, spelling
    # 0 (0.0.0.0) names no server (Linux connects it to this machine)
    r = switch("0")
    assert r.status_code == 400 and "0.0.0.0, which is no server's address" in r.json()["error"]
    # other addresses in every spelling are refused as the plain address is, before anything is contacted
    for spelling, plain in (("10.0.0.1", "10.0.0.1"), ("10.1", "10.0.0.1"), ("167772161", "10.0.0.1"),
                            ("0x0a000001", "10.0.0.1"), ("[::ffff:10.0.0.1]", "10.0.0.1"),
                            ("[::ffff:a00:1]", "10.0.0.1"), ("169.254.169.254", "169.254.169.254"),
                            ("0xa9fea9fe", "169.254.169.254"), ("[fe80::1]", "fe80::1")):
        r = switch(spelling)
        assert r.status_code == 400, spelling
        assert f"address {plain} is where this attach page may not send requests" in r.json()["error"], spelling
    assert switch("127.0.0.1").json()["url"] == api
    assert _target(page_url) == api
    assert "Traceback" not in attach_log.read_text()


def test_names_are_judged_by_what_they_resolve_to():
    """The policy itself, with the system's resolver: a host name counts by every address it resolves to (this
    machine's own name and `localhost` resolve to 127.0.0.1 here; no name resolves to a private network without
    one), and an allow-list entry admits exactly its addresses."""
    from app.attach import TargetPolicy, parse_target_url

    name = socket.gethostname()
    own = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)[0][4][0]
    strict = TargetPolicy(loopback=False, allow=["10.0.0.0/8"])
    for url in ("http://localhost:1", f"http://{name}:1"):
        with pytest.raises(ValueError, match="resolves to 127.0.0.1,"):
            strict.check(url)
    assert [str(a) for a in strict.check(parse_target_url("http://10.2.3.4:8000"))] == ["10.2.3.4"]
    by_name = TargetPolicy(loopback=False, allow=[name])  # a name in the list: its addresses, not its spelling
    assert str(by_name.check(parse_target_url("http://0x7f000001:1"))[0]) == own
    assert [str(a) for a in TargetPolicy().check(f"http://{name}:1")] == [own]
    with pytest.raises(ValueError, match="does not resolve"):
        TargetPolicy().check("http://no-such-host.invalid:1")
    for url, plain in (("HTTP://Example.COM:80/v1/", "http://example.com:80"),
                       ("http://bücher.example", "http://xn--bcher-kva.example"),
                       ("http://[::1]:8000/base/", "http://[::1]:8000/base")):
        assert parse_target_url(url) == plain
    for bad in ("http://a b", "http://h:99999", "http://h:0", "http://@h", "http://h\\@evil", "javascript:x"):
        with pytest.raises(ValueError, match="URL"):
            parse_target_url(bad)


def test_redirects_are_not_followed(servers, foreign):
    _, _, page_url, _ = servers
    foreign_url, hits = foreign
    hits.clear()
    r = httpx.post(page_url + "/attach/target", json={"url": foreign_url + "/redirect"}, timeout=60)
    assert r.status_code == 400 and "307" in r.json()["error"]
    assert hits == ["/redirect/v1/models"]  # asked once, and the Location it answered was never fetched
    assert _target(page_url) == servers[0]


def _raw(url: str, path: str, head_body: bytes, length: int) -> socket.socket:
    host, port = url.split("//", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {length}\r\n\r\n".encode() + head_body)
    return s


def test_a_body_that_never_arrives_is_answered_408_and_one_that_stops_is_one_log_line(servers):
    api, api_log, page_url, attach_log = servers
    for url, path in ((api, "/v1/completions"), (page_url, "/attach/ask")):
        s = _raw(url, path, b'{"model": ', 1000)
        started = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        s.close()
        took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert BODY_TIMEOUT_S - 0.5 <= took < BODY_TIMEOUT_S + 10
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        if url == api:  # OpenAI's error body
            assert error["code"] == "request_timeout" and "Content-Length" in error["message"]
        else:
            assert "did not arrive within" in error
    # a client that leaves mid-body: one line in the log, no traceback (the API and the attach page)
    for url, path, log in ((api, "/v1/chat/completions", api_log), (page_url, "/attach/ask", attach_log)):
        _raw(url, path, b'{"prompt": "hal', 1000).close()
        deadline = time.monotonic() + 10
        while "left before sending its whole body" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text()
        assert text.count(f"POST {path}: the client left before sending its whole body") == 1, text[-2000:]
        assert "Traceback" not in text and "ClientDisconnect" not in text
