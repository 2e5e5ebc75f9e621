"""Attach mode's panel 1, the prompt as the model reads it: through the model's own tokenizer when it can be loaded
here, else through the attached server's tokenize endpoint, else a note saying why there are no tokens.

Servers tokenize under different routes and shapes, tried in this order (the first that answers is kept):
* `POST /tokenize` in vLLM's shape ({"model", "messages", "add_generation_prompt", "return_token_strs"} ->
  {"tokens", "token_strs"}): vLLM, and this lab's own API. The server applies its chat template: the ids are
  exactly what it will read, the template's text is not returned.
* `POST /extras/tokenize` ({"input"} -> {"tokens"}), llama-cpp-python's server, which has no chat-template
  endpoint: the prompt's own text is tokenized, without the template the server wraps it in (the panel says so),
  and each token's text read back with `POST /extras/detokenize`.
SGLang (older versions) has neither: the note says the server exposes no tokenize endpoint.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import httpx
# at import, not in the loader thread: two threads importing transformers at once can see it half-initialised
from transformers import AutoTokenizer

MAX_DETOKENIZE = 256  # tokens read back one by one from a server without token strings (llama-cpp-python)


@dataclass
class Tokens:
    """What panel 1 draws: the template's text (None when only the server saw it), the token pieces, and
    where they came from: "model" (the tokenizer here), "server" (its /tokenize, template applied), "server_raw"
    (the prompt's own text tokenized by the server, without the template), or "" with a `note`."""

    text: str | None
    pieces: list[str] | None
    source: str
    note: str = ""


class Tokenizer:
    """The model's tokenizer, loaded in the background (the page serves at once); the server's endpoint if not."""

    def __init__(self, model: str, target, load_name: str | None = None):
        self.target = target
        self.tok, self.note, self.ready = None, "loading", threading.Event()
        self.endpoint: str | None = None  # the server route that answered last ("/tokenize", "/extras/tokenize")
        threading.Thread(target=self._load, args=(load_name or model,), daemon=True, name="attach-tokenizer").start()

    def _load(self, model: str) -> None:
        from engine.loader import BUNDLED_ID, bundled_dir

        try:
            source = str(bundled_dir()) if model in ("bundled", BUNDLED_ID.split(" (")[0]) else model
            self.tok, self.note = AutoTokenizer.from_pretrained(source), ""
        except Exception as exc:  # noqa: BLE001 - any loader failure is a note on the page, not a crash
            self.note = f"{type(exc).__name__}: {exc}"[:200]
        self.ready.set()

    def render(self, prompt: str, system: str | None) -> Tokens:
        self.ready.wait(60)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        if self.tok is not None:
            text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            return Tokens(text, [self.tok.decode([i]) for i in ids], "model")
        return self.from_server(messages, prompt)

    def from_server(self, messages: list[dict], prompt: str) -> Tokens:
        """The attached server's tokenization of the request (vLLM's shape first, then llama-cpp-python's)."""
        t = self.target
        routes = [self.endpoint] if self.endpoint else ["/tokenize", "/extras/tokenize"]
        for route in routes:
            try:
                if route == "/tokenize":
                    r = httpx.post(t.url + route, headers=t.headers, timeout=30,
                                   json={"model": t.model, "messages": messages, "add_generation_prompt": True,
                                         "return_token_strs": True})
                    ids = r.json().get("tokens") if r.status_code == 200 else None
                    if isinstance(ids, list):
                        self.endpoint = route
                        strs = r.json().get("token_strs")
                        return Tokens(None, strs if isinstance(strs, list) else [str(i) for i in ids], "server")
                else:
                    r = httpx.post(t.url + route, headers=t.headers, timeout=30,
                                   json={"model": t.model, "input": prompt})
                    ids = r.json().get("tokens") if r.status_code == 200 else None
                    if isinstance(ids, list):
                        self.endpoint = route
                        return Tokens(None, self._pieces(ids), "server_raw")
            except (httpx.HTTPError, ValueError, AttributeError):
                continue  # unreachable, not JSON, not an object: try the next shape
        return Tokens(None, None, "", self.note)

    def _pieces(self, ids: list[int]) -> list[str]:
        """Each token's text, read back one by one (llama-cpp-python's /extras/tokenize returns ids only)."""
        t, out = self.target, []
        for i in ids[:MAX_DETOKENIZE]:
            r = httpx.post(t.url + "/extras/detokenize", headers=t.headers, timeout=30,
                           json={"model": t.model, "tokens": [i]})
            out.append(r.json().get("text", str(i)) if r.status_code == 200 else str(i))
        return out + [str(i) for i in ids[MAX_DETOKENIZE:]]
