"""Attach mode's panel 1, the prompt as the model reads it: through the model's own tokenizer when it can be loaded
here, else through the attached server's tokenize endpoint, else a note saying why there are no tokens.

`load_tokenizer` finds the tokenizer from whatever the server reports as its model: llama.cpp's servers report
the GGUF path they were started with, a directory holds tokenizer files or a GGUF (both read by the engine's
loader, engine.loader.load_tokenizer: the GGUF's own tokenizer metadata, cached as tokenizer.json), a hub id is
read from this machine's Hugging Face cache or downloaded. A path that is not on this machine, or a hub id that
cannot be had offline, ends in the server's endpoint below.

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

import re
import threading
from dataclasses import dataclass
from pathlib import Path

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
    ids: list[int] | None = None  # each piece's token id, where known


def is_path_like(name: str) -> bool:
    """Whether a model name is a file system path rather than a hub id: llama.cpp's servers report the --model
    path they were started with ("/models/x.Q4_1.gguf", "./x.gguf", "C:\\models\\x.gguf")."""
    return (name.lower().endswith(".gguf") or name.startswith(("/", "~", ".", "\\"))
            or re.match(r"^[A-Za-z]:[\\/]", name) is not None or name.count("/") > 1)


def display_name(model: str) -> str:
    """The model's name as a header shows it: a path's base name (the whole path goes in a hover title)."""
    if not model or not is_path_like(model):
        return model
    return re.split(r"[\\/]", model.rstrip("/\\"))[-1] or model


def load_tokenizer(model: str, online: bool = True):
    """The tokenizer of the model a server names: "bundled" (or the lab's own model name), a GGUF file, a directory
    holding tokenizer files or a GGUF, or a hub id (from this machine's Hugging Face cache, else downloaded when
    `online`). Raises ValueError with a sentence for the page when none of these gives one."""
    from engine.loader import BUNDLED, BUNDLED_ID, bundled_dir
    from engine.loader import load_tokenizer as local_tokenizer

    name = model.strip()
    if name in (BUNDLED, BUNDLED_ID, BUNDLED_ID.split(" (")[0]):
        return AutoTokenizer.from_pretrained(str(bundled_dir()))
    path = Path(name).expanduser()
    if path.is_file() or path.is_dir():
        # a GGUF file, or a directory of tokenizer files or a GGUF: the engine's loader reads it (a ModelLoadError
        # is a ValueError whose sentence the page shows)
        return local_tokenizer(path)
    if is_path_like(name):
        raise ValueError(f"{name} is a path, and there is no such file or directory on this machine (a server's "
                         "own files cannot be read from here)")
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - not in the cache (or not a model): maybe the hub has it
        if not online:
            raise ValueError(f"{name} is not in this machine's Hugging Face cache (offline: not downloaded)") from exc
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, gated: one sentence for the page
        raise ValueError(f"{name} is not in this machine's Hugging Face cache and could not be downloaded "
                         f"({type(exc).__name__})") from None


class Tokenizer:
    """The model's tokenizer, loaded in the background (the page serves at once); the server's endpoint if not."""

    def __init__(self, model: str, target, load_name: str | None = None, online: bool = True):
        self.target = target
        self.tok, self.note, self.ready = None, "loading", threading.Event()
        self.endpoint: str | None = None  # the server route that answered last ("/tokenize", "/extras/tokenize")
        threading.Thread(target=self._load, args=(load_name or model, online), daemon=True,
                         name="attach-tokenizer").start()

    def _load(self, model: str, online: bool) -> None:
        try:
            self.tok, self.note = load_tokenizer(model, online), ""
        except Exception as exc:  # noqa: BLE001 - any loader failure is a note on the page, not a crash
            self.note = (str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")[:300]
        self.ready.set()

    def render(self, prompt: str, system: str | None) -> Tokens:
        self.ready.wait(60)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        if self.tok is not None:
            text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            return Tokens(text, [self.tok.decode([i]) for i in ids], "model", ids=list(ids))
        return self.from_server(messages, prompt)

    def from_server(self, messages: list[dict], prompt: str) -> Tokens:
        """The attached server's tokenization of the request (vLLM's shape first, then llama-cpp-python's)."""
        t = self.target
        routes = [self.endpoint] if self.endpoint else ["/tokenize", "/extras/tokenize"]
        for route in routes:
            try:
                if route == "/tokenize":
                    r = t.call("POST", route, 30,
                                   json={"model": t.model, "messages": messages, "add_generation_prompt": True,
                                         "return_token_strs": True})
                    ids = r.json().get("tokens") if r.status_code == 200 else None
                    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
                        self.endpoint = route
                        strs = r.json().get("token_strs")
                        return Tokens(None, strs if isinstance(strs, list) else [str(i) for i in ids], "server",
                                      ids=ids)
                else:
                    r = t.call("POST", route, 30,
                                   json={"model": t.model, "input": prompt})
                    ids = r.json().get("tokens") if r.status_code == 200 else None
                    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
                        self.endpoint = route
                        return Tokens(None, self._pieces(ids), "server_raw", ids=ids)
            except (httpx.HTTPError, ValueError, AttributeError):
                continue  # unreachable, not JSON, not an object: try the next shape
        return Tokens(None, None, "", self.note)

    def _pieces(self, ids: list[int]) -> list[str]:
        """Each token's text, read back one by one (llama-cpp-python's /extras/tokenize returns ids only)."""
        t, out = self.target, []
        for i in ids[:MAX_DETOKENIZE]:
            r = t.call("POST", "/extras/detokenize", 30,
                           json={"model": t.model, "tokens": [i]})
            out.append(r.json().get("text", str(i)) if r.status_code == 200 else str(i))
        return out + [str(i) for i in ids[MAX_DETOKENIZE:]]
