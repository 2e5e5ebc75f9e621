"""An answer cut by max_tokens inside a character (issue 37): the cut character's bytes never made a character,
so the answer ends before it instead of in "�" (U+FFFD, what a lossy decode makes of them). The real model, its
tokenizer and the lab's /v1 over HTTP: a greedy Russian answer is read with its tokens' bytes, and asked again
with max_tokens at a token that ends inside a character."""
import codecs

import httpx

from e2e_util import running_server

QUESTION = [{"role": "user", "content": "Напиши одно предложение по-русски о кошках."}]


def unfinished(data: bytes) -> int:
    """How many bytes at the end of `data` start a character that is not complete."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    return len(decoder.getstate()[0])


def ask(url: str, max_tokens: int) -> dict:
    model = httpx.get(url + "/v1/models", timeout=60).json()["data"][0]["id"]
    r = httpx.post(url + "/v1/chat/completions", timeout=300,
                   json={"model": model, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 0,
                         "logprobs": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_an_answer_cut_inside_a_character_does_not_end_in_a_replacement_character(base_engine):
    with running_server(base_engine) as (url, _):
        whole = ask(url, 40)
        data = [bytes(t["bytes"]) for t in whole["logprobs"]["content"]]
        cuts = [k for k in range(1, len(data) + 1) if unfinished(b"".join(data[:k]))]
        assert cuts, "the greedy answer splits no character across tokens"  # Cyrillic does, in this vocabulary
        k = cuts[-1]
        cut = ask(url, k)
        assert cut["finish_reason"] == "length"
        assert [bytes(t["bytes"]) for t in cut["logprobs"]["content"]] == data[:k]  # greedy: the same tokens
        got = b"".join(data[:k])
        complete = got[: len(got) - unfinished(got)].decode("utf-8")
        text = cut["message"]["content"]
        assert "\ufffd" not in text
        assert text == complete  # every whole character, and nothing of the cut one
