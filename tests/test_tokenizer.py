"""engine/tokenizer.py against the bundled SmolLM2 tokenizer (byte-level BPE, ChatML) and a tiny
SentencePiece-style tokenizer with byte fallback built here."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.tokenizer import (
    ChatPrompt,
    DetokStep,
    IncrementalDetokenizer,
    bpe_merges,
    is_byte_fallback,
    render_prompt,
    token_bytes,
    token_info,
)

RUSSIAN = "Что такое гравитация? Гравитация — это сила, которая притягивает тела друг к другу…"
EMOJI = "Astronaut 👩‍🚀 flag 🇷🇺 family 👨‍👩‍👧 thumbs 👍🏽 ok ✅"
CJK = "日本語の文章を書きます。中文句子。한국어 문장."
CODE = 'def f(x: int) -> str:\n    return f"{x!r} → ∞"  # ü ß\n\n\tprint(f(3))'
MIXED = "Gravity (гравитация, 重力) ≈ 9.81 m/s² 🚀\n— done."
TEXTS = [RUSSIAN, EMOJI, CJK, CODE, MIXED]

IM_START, IM_END, ENDOFTEXT = 1, 2, 0


def ids_of(tok, text):
    return tok.encode(text, add_special_tokens=False)


def stream(tok, ids, **kwargs):
    det = IncrementalDetokenizer(tok, **kwargs)
    steps = [det.push(i) for i in ids]
    tail = det.finish()
    return det, steps, tail


def chat_ids(result):
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list.
    return list(result["input_ids"]) if hasattr(result, "keys") else list(result)


# --------------------------------------------------------------------------------------------------
# Streaming detokenization
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS, ids=["russian", "emoji", "cjk", "code", "mixed"])
def test_stream_equals_full_decode(hf_tokenizer, text):
    tok = hf_tokenizer
    ids = ids_of(tok, text)
    det, steps, tail = stream(tok, ids)
    full = tok.decode(ids, skip_special_tokens=True)
    assert full == text  # no normalizer, no space clean-up: byte-level BPE round-trips exactly
    assert "".join(s.emitted for s in steps) + tail == full
    assert det.text == full
    # The text ends on a whole character, so nothing should be left for finish().
    assert tail == ""
    for s in steps:
        assert "\ufffd" not in s.emitted
        assert s.stop is None and s.held_text == "" and s.stop_partial == ""


def test_held_bytes_when_a_character_is_split(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, EMOJI)
    # The tokenizer really splits some characters across tokens ("ðŁ" = f0 9f, the first half of 👩).
    assert any(info["partial_utf8"] for info in token_info(tok, ids))
    _, steps, _ = stream(tok, ids)
    held = [s for s in steps if s.held_bytes]
    assert held, "expected at least one step holding an incomplete UTF-8 character"
    first = held[0]
    assert first.emitted == ""
    prefix = bytes.fromhex(first.held_bytes)
    # What is held is the start of a real character of the text: a lead byte plus continuations.
    assert prefix[0] >= 0xC0 and len(prefix) < 4
    assert any(ch.encode("utf-8").startswith(prefix) for ch in EMOJI if len(ch.encode("utf-8")) > len(prefix))
    # The step after the character completes releases it, with no held bytes left.
    idx = steps.index(first)
    completed = next(s for s in steps[idx:] if not s.held_bytes)
    assert completed.emitted and "\ufffd" not in completed.emitted


def test_held_bytes_in_cjk_and_russian(hf_tokenizer):
    for text in (CJK, RUSSIAN):
        _, steps, _ = stream(hf_tokenizer, ids_of(hf_tokenizer, text))
        assert any(s.held_bytes for s in steps)


def test_truncated_character_left_out_at_finish(hf_tokenizer):
    """A max_tokens cut inside a character: its bytes never made one. decode renders them as U+FFFD; the stream
    leaves them out and keeps them in `dropped` (an answer must not end in "�")."""
    tok = hf_tokenizer
    ids = ids_of(tok, "ok 👩")
    cut = ids[:-1]  # drop the last byte token: the emoji is left unfinished
    det, steps, tail = stream(tok, cut)
    assert steps[-1].held_bytes
    held = bytes.fromhex(steps[-1].held_bytes)
    assert "👩".encode().startswith(held)
    assert all("\ufffd" not in s.emitted for s in steps)
    assert det.dropped == held
    # the space before the emoji came in the same token as its first bytes: held with them, released at finish
    assert "".join(s.emitted for s in steps) + tail == det.text == "ok "
    assert tok.decode(cut, skip_special_tokens=True) == det.text + "\ufffd"


def test_special_tokens_skipped_or_kept(hf_tokenizer):
    tok = hf_tokenizer
    ids = [IM_START] + ids_of(tok, "Hi there") + [IM_END, ENDOFTEXT]
    det, steps, tail = stream(tok, ids)
    assert det.text == tok.decode(ids, skip_special_tokens=True) == "Hi there"
    assert steps[-2].emitted == "" and steps[-1].emitted == ""
    det, steps, tail = stream(tok, ids, skip_special_tokens=False)
    assert det.text == tok.decode(ids, skip_special_tokens=False)
    assert steps[-2].emitted == "<|im_end|>"


def test_prompt_seeding_keeps_decode_contract(hf_tokenizer):
    tok = hf_tokenizer
    prompt = render_prompt(tok, "What is gravity?").token_ids
    out = ids_of(tok, " Gravity is a force. Гравитация 👩‍🚀!")
    det, steps, tail = stream(tok, out, prompt_ids=prompt)
    expected = tok.decode(out, skip_special_tokens=True)
    assert det.text == expected
    # For byte-level BPE the prompt context changes nothing: the suffix of a full decode is the same.
    full = tok.decode(prompt + out, skip_special_tokens=True)
    assert full[len(tok.decode(prompt, skip_special_tokens=True)) :] == expected
    assert steps[0].emitted == " Gravity"  # the leading space is kept


def test_push_stays_windowed(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, RUSSIAN) * 20
    det = IncrementalDetokenizer(tok)
    for i in ids:
        det.push(i)
        assert len(det._ids) <= 80  # the id buffer is compacted, so push does not grow with the text
    assert det.text + det.finish() == tok.decode(ids, skip_special_tokens=True)


def test_detokstep_to_dict(hf_tokenizer):
    tok = hf_tokenizer
    step = IncrementalDetokenizer(tok).push(ids_of(tok, "Ч")[0])
    assert isinstance(step, DetokStep)
    d = step.to_dict()
    assert set(d) >= {"token_id", "token_bytes", "emitted", "held_text", "held_bytes", "stop", "stop_partial"}
    assert d["token_bytes"] == "d0" and d["held_bytes"] == "d0" and d["emitted"] == ""


# --------------------------------------------------------------------------------------------------
# Stop strings
# --------------------------------------------------------------------------------------------------

SENTENCE = "Well, gravity pulls. And gravity is a force."


def test_stop_spanning_tokens_is_cut_exactly(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, SENTENCE)
    pieces = [tok.decode([i]) for i in ids]
    assert not any("gravity is" in p for p in pieces)  # the stop really spans two tokens
    det, steps, tail = stream(tok, ids, stop=["gravity is"])
    assert det.text == "Well, gravity pulls. And "
    assert det.stop == "gravity is" and tail == ""
    hit = [k for k, s in enumerate(steps) if s.stop]
    assert len(hit) == 1 and steps[hit[0]].finished
    assert all(s.emitted == "" for s in steps[hit[0] + 1 :])  # nothing after the stop, ever
    assert det.finish() == ""


def test_partial_stop_held_then_released(hf_tokenizer):
    tok = hf_tokenizer
    _, steps, _ = stream(tok, ids_of(tok, SENTENCE), stop=["gravity is"])
    first_gravity = steps[2]  # " gravity" could start "gravity is": held back
    assert first_gravity.emitted == " "
    assert first_gravity.held_text == "gravity" == first_gravity.stop_partial
    assert steps[3].emitted == "gravity pulls"  # " pulls" breaks the match: released
    assert steps[3].held_text == ""


def test_unfinished_partial_released_by_finish(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, "Well, gravity")
    det, steps, tail = stream(tok, ids, stop=["gravity is"])
    assert steps[-1].stop_partial == "gravity"
    assert tail == "gravity" and det.text == "Well, gravity" and det.stop is None


def test_multiple_stops_first_to_complete_wins(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, SENTENCE)
    det, _, _ = stream(tok, ids, stop=["force", " pulls", "zzz"])
    assert det.text == "Well, gravity" and det.stop == " pulls"
    # "gravity is a" starts earlier but "is" completes first: streaming semantics, independent of
    # how the text happens to be split into tokens.
    det, _, _ = stream(tok, ids, stop=["gravity is a", "is"])
    assert det.text == "Well, gravity pulls. And gravity " and det.stop == "is"


def test_stop_at_first_token_and_inside_a_token(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, SENTENCE)
    det = IncrementalDetokenizer(tok, stop=["Well"])
    step = det.push(ids[0])
    assert step.stop == "Well" and step.emitted == "" and det.finished
    assert det.push(ids[1]).emitted == "" and det.finish() == "" and det.text == ""
    det, _, _ = stream(tok, ids, stop="Well")  # a bare string is one stop; None means none
    assert det.stop == "Well" and det.text == ""
    assert stream(tok, ids, stop=None)[0].text == SENTENCE
    det, _, _ = stream(tok, ids, stop=["avi"])  # a stop inside one token cuts the token
    assert det.text == "Well, gr"


def test_stop_across_split_characters(hf_tokenizer):
    tok = hf_tokenizer
    det, steps, _ = stream(tok, ids_of(tok, RUSSIAN), stop=["гравитация"])
    assert det.text == "Что такое " and det.stop == "гравитация"
    det, _, _ = stream(tok, ids_of(tok, EMOJI), stop=["🇷🇺"])
    assert det.text == "Astronaut 👩‍🚀 flag "
    assert all("\ufffd" not in s.emitted for s in steps)


def test_stop_with_special_tokens_in_the_stream(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, "Hello") + [IM_END] + ids_of(tok, " world")
    det, _, _ = stream(tok, ids, stop=["o w"])  # the skipped special token does not break the match
    assert det.text == "Hell" and det.stop == "o w"


def reference_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """The text a perfect character-by-character streamer releases."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), -len(s)) < (best[0] + len(best[1]), -len(best[1]))):
            best = (i, s)
    return (text, None) if best is None else (text[: best[0]], best[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(["the", " gravity", " is", " сила", " 重力", " 👩‍🚀", ",", "\n", " a", "is"]),
                   min_size=1, max_size=25),
    picks=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), min_size=1, max_size=3),
)
def test_stop_strings_match_reference(hf_tokenizer, words, picks):
    tok = hf_tokenizer
    text = "".join(words)
    stops = [text[a : a + n] for a, n in picks if text[a : a + n]] or ["zz"]
    ids = ids_of(tok, text)
    det, steps, tail = stream(tok, ids, stop=stops)
    expected, stop = reference_stop(tok.decode(ids, skip_special_tokens=True), stops)
    assert det.text == expected and det.stop == stop
    for s in steps:
        assert "\ufffd" not in s.emitted


# --------------------------------------------------------------------------------------------------
# Token bytes and info
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_concatenate_to_utf8(hf_tokenizer, text):
    ids = ids_of(hf_tokenizer, text)
    assert b"".join(token_bytes(hf_tokenizer, i) for i in ids) == text.encode("utf-8")


def test_token_info_fields(hf_tokenizer):
    tok = hf_tokenizer
    ids = ids_of(tok, "Ч gravity 👩") + [IM_END]
    info = token_info(tok, ids)
    assert [r["id"] for r in info] == ids
    assert set(info[0]) == {"id", "piece", "text", "bytes_hex", "special", "byte_fallback", "partial_utf8"}
    assert info[0]["piece"] == "Ð" and info[0]["bytes_hex"] == "d0" and info[0]["partial_utf8"]
    assert info[0]["text"] == "\ufffd"
    gravity = next(r for r in info if r["piece"] == "Ġgravity")
    assert gravity["text"] == " gravity" and not gravity["partial_utf8"] and not gravity["special"]
    assert gravity["bytes_hex"] == " gravity".encode().hex(" ")
    end = info[-1]
    assert end["special"] and end["piece"] == end["text"] == "<|im_end|>" and not end["partial_utf8"]
    assert not any(r["byte_fallback"] for r in info)  # byte-level BPE has no <0xNN> tokens
    assert token_bytes(tok, 49152 + 7) == b"" and token_info(tok, [49159])[0]["piece"] is None
    for special in (ENDOFTEXT, IM_START, IM_END):
        assert token_info(tok, [special])[0]["special"]
        assert not is_byte_fallback(tok, special)


# --------------------------------------------------------------------------------------------------
# Prompt rendering
# --------------------------------------------------------------------------------------------------


def check_spans(tok, p: ChatPrompt):
    spans = p.spans
    assert spans[0]["start"] == 0 and spans[-1]["end"] == len(p.text)
    assert spans[0]["token_start"] == 0 and spans[-1]["token_end"] == len(p.token_ids)
    for a, b in zip(spans, spans[1:]):
        assert a["end"] == b["start"] and a["token_end"] == b["token_start"]
    for s in spans:
        ids = p.token_ids[s["token_start"] : s["token_end"]]
        assert tok.decode(ids) == p.text[s["start"] : s["end"]]
        if s["kind"] == "special":
            assert len(ids) == 1 and token_info(tok, ids)[0]["special"]
        else:
            assert s["kind"] == "text" and not any(r["special"] for r in token_info(tok, ids))


@pytest.mark.parametrize("system", [None, "", "Answer briefly."])
def test_render_chat_matches_apply_chat_template(hf_tokenizer, system):
    tok = hf_tokenizer
    user = "Что такое гравитация? 👩‍🚀"
    p = render_prompt(tok, user, chat=True, system=system)
    messages = ([] if system is None else [{"role": "system", "content": system}]) + [
        {"role": "user", "content": user}
    ]
    expected = chat_ids(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
    assert p.token_ids == expected
    assert p.text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert p.text.endswith("<|im_start|>assistant\n")
    if system is None:
        assert "You are a helpful AI assistant named SmolLM" in p.text  # the template's default
    else:
        assert p.text.startswith(f"<|im_start|>system\n{system}<|im_end|>")
    check_spans(tok, p)
    specials = [p.text[s["start"] : s["end"]] for s in p.spans if s["kind"] == "special"]
    assert specials == ["<|im_start|>", "<|im_end|>"] * 2 + ["<|im_start|>"]


def test_render_raw(hf_tokenizer):
    tok = hf_tokenizer
    p = render_prompt(tok, "Once upon a time", chat=False)
    assert p.text == "Once upon a time"
    assert p.token_ids == tok("Once upon a time")["input_ids"] == ids_of(tok, p.text)  # SmolLM adds no BOS
    assert p.spans == [{"start": 0, "end": len(p.text), "kind": "text", "token_start": 0,
                        "token_end": len(p.token_ids)}]
    p = render_prompt(tok, "a<|im_end|>b", chat=False)  # special text in a raw prompt is a special token
    check_spans(tok, p)
    assert [s["kind"] for s in p.spans] == ["text", "special", "text"]


# --------------------------------------------------------------------------------------------------
# BPE merge trace
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", [" gravity", "гравитация", " Гравитация", "👩‍🚀", " 🇷🇺", "Hello", " 日本語"])
def test_bpe_merges_reach_the_tokenizers_tokens(hf_tokenizer, word):
    tok = hf_tokenizer
    trace = bpe_merges(tok, word)
    ids = ids_of(tok, word)
    assert trace[0]["step"] == 0 and trace[0]["merge"] is None
    assert len(trace[0]["pieces"]) == len(word.encode("utf-8"))  # one symbol per byte to start
    assert trace[-1]["pieces"] == tok.convert_ids_to_tokens(ids)
    assert trace[-1]["ids"] == ids
    assert "".join(trace[-1]["pieces"]) == "".join(trace[0]["pieces"])
    ranks = [s["rank"] for s in trace[1:]]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)  # lowest rank first, each once
    for k, s in enumerate(trace[1:], start=1):
        assert s["step"] == k and "".join(s["merge"]) in s["pieces"]
        assert None not in s["ids"]


def test_bpe_merges_display(hf_tokenizer):
    trace = bpe_merges(hf_tokenizer, " gravity")
    assert trace[0]["symbols"] == list(" gravity")
    assert trace[-1]["symbols"] == [" gravity"]
    start = bpe_merges(hf_tokenizer, "Ч")[0]
    assert start["symbols"] == ["<0xD0>", "<0xA7>"]  # half a character shows as its byte
    with pytest.raises(ValueError):
        bpe_merges(hf_tokenizer, "two words")


# --------------------------------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------------------------------

ALPHABETS = st.one_of(
    st.characters(codec="ascii"),
    st.characters(min_codepoint=0x0400, max_codepoint=0x04FF),  # Cyrillic
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),  # emoji
    st.sampled_from(["\u200d", "\ufe0f", "🇷", "🇺", " ", "\n", "é", "\u0301"]),
    st.characters(exclude_categories=("Cs",)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=ALPHABETS, max_size=40))
def test_stream_equals_decode_random_text(hf_tokenizer, text):
    tok = hf_tokenizer
    ids = ids_of(tok, text)
    det, steps, tail = stream(tok, ids)
    full = tok.decode(ids, skip_special_tokens=True)
    assert "".join(s.emitted for s in steps) + tail == full
    # Not `text`: the bundled vocabulary lacks 21 byte tokens (c0 c1 f1 f2 f5-ff and some controls),
    # so e.g. U+40000 (f1 80 80 80) loses its lead byte and decodes to U+FFFDs.
    if "\ufffd" not in full:
        assert all("\ufffd" not in s.emitted for s in steps)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.one_of(st.integers(0, 49160), st.integers(0, 300)), max_size=30))
def test_stream_equals_decode_random_ids(hf_tokenizer, ids):
    # Arbitrary ids include invalid byte sequences and special tokens: the lossy decode must still
    # match, an invalid byte is released at once rather than waited on; ids past the vocabulary
    # decode to nothing.
    # An unfinished last character is left out of the stream (`dropped`), where decode renders it as U+FFFD.
    for skip in (True, False):
        det, steps, tail = stream(hf_tokenizer, ids, skip_special_tokens=skip)
        full = hf_tokenizer.decode(ids, skip_special_tokens=skip)
        assert "".join(s.emitted for s in steps) + tail == det.text
        assert det.text + det.dropped.decode("utf-8", errors="replace") == full


# --------------------------------------------------------------------------------------------------
# A SentencePiece-style tokenizer ("▁" spaces, <0xNN> byte fallback)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sp_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "д", "я", "▁h", "he", "ll", "llo", "▁he", "▁hello",
                  "▁w", "or", "▁wor", "▁worl", "▁world", "дя"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("h", "e"), ("l", "l"), ("ll", "o"), ("▁h", "e"), ("▁he", "llo"), ("▁", "w"),
              ("o", "r"), ("▁w", "or"), ("▁wor", "l"), ("▁worl", "d"), ("д", "я")]
    model = models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tk = Tokenizer(model)
    # The Llama 2 recipe: spaces become "▁" with one prepended; decode undoes it and strips the first.
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tk.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_sentencepiece_bytes_and_fallback(sp_tokenizer):
    tok = sp_tokenizer
    ids = ids_of(tok, "hello €ы дядя world")
    pieces = tok.convert_ids_to_tokens(ids)
    assert "<0xE2>" in pieces and "▁hello" in pieces
    e2 = ids[pieces.index("<0xE2>")]
    assert is_byte_fallback(tok, e2) and token_bytes(tok, e2) == b"\xe2"
    assert not is_byte_fallback(tok, ids[0]) and token_bytes(tok, ids[0]) == b" hello"
    # Context-free bytes: the text plus the space the normalizer prepended.
    assert b"".join(token_bytes(tok, i) for i in ids) == " hello €ы дядя world".encode()
    info = token_info(tok, [e2])[0]
    assert info["byte_fallback"] and info["partial_utf8"] and info["bytes_hex"] == "e2"


@pytest.mark.parametrize("text", ["hello €ы дядя world", "дядя", "€", "hello  world 👩‍🚀"])
def test_sentencepiece_stream_equals_decode(sp_tokenizer, text):
    tok = sp_tokenizer
    ids = ids_of(tok, text)
    det, steps, tail = stream(tok, ids)
    assert det.text == tok.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in s.emitted for s in steps)
    if "€" in text:
        assert any(s.held_bytes == "e2 82" for s in steps)


def test_sentencepiece_bpe_merges(sp_tokenizer):
    tok = sp_tokenizer
    for word in ["hello", "world", "дядя", "€"]:
        trace = bpe_merges(tok, word)
        assert trace[-1]["pieces"] == tok.convert_ids_to_tokens(ids_of(tok, word))
    assert bpe_merges(tok, "€")[0]["pieces"] == ["▁", "<0xE2>", "<0x82>", "<0xAC>"]


def test_sentencepiece_truncated_character_left_out_at_finish(sp_tokenizer):
    """ByteFallback renders an unfinished run as one U+FFFD per byte: all of them are left out, the text before
    them is not."""
    tok = sp_tokenizer
    ids = ids_of(tok, "hello €")
    cut = ids[:-1]  # <0xE2> <0x82> of the three bytes of €
    det, steps, tail = stream(tok, cut)
    assert det.dropped == "€".encode()[:2]
    assert "".join(s.emitted for s in steps) + tail == det.text == "hello "
    assert tok.decode(cut, skip_special_tokens=True) == "hello \ufffd\ufffd"
