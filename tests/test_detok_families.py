"""IncrementalDetokenizer across tokenizer families (issue 17).

Two families: the bundled SmolLM2 tokenizer (byte-level BPE) and a Llama-2-layout SentencePiece BPE
with byte fallback built here (no download): "▁" for spaces, the 256 <0xNN> byte tokens, a handful of
merges, and the decoder chain Replace("▁", " ") + ByteFallback + Fuse + Strip. Most non-Latin text
falls back to byte tokens in it, which is what Llama 2 / TinyLlama / Mistral do for rarer characters.

The cases follow vLLM's incremental detokenization tests (streaming over many strings, with and
without a prompt, skip_special_tokens on and off, an out-of-vocabulary id) and the tokenizers
library's DecodeStream tests (added tokens, prefilled ids, byte fallback, Metaspace), rewritten
for our API, plus every prompt split of strings in many scripts."""
from __future__ import annotations

import string

import pytest

from engine.tokenizer import IncrementalDetokenizer, _incomplete_tail, token_bytes

REPLACEMENT = "\ufffd"

# vLLM's strings (plain, CJK, Burmese that splits characters across tokens) and our own.
STRINGS = [
    "Hello here, this is a simple test",
    "vLLM is a high-throughput and memory-efficient inference and serving engine for LLMs.",
    "我很感谢你的热情",
    "ပုံပြင်လေးပြောပြပါ်",
    "the 中文 world 我很感谢你的热情 한의 test",
    "日本語の文章を書きます。カタカナとひらがな",
    "한국어 문장입니다. 안녕하세요",
    "नमस्ते दुनिया, यह एक परीक्षण है",
    "สวัสดีครับ ภาษาไทยไม่มีช่องว่าง",
    "مرحبا بالعالم، هذا اختبار",
    "שָׁלוֹם עולם, זה מבחן",
    "👩🏽‍🚀 astronaut, family 👨‍👩‍👧‍👦, flag 🇯🇵, thumbs 👍🏿 ✅",
    "combining: e\u0301 a\u0308 n\u0303 \u1100\u1161\u11a8 Z\u0351\u0352\u0353",
    "mixed 重力 ≈ 9.81 m/s² 🚀 — гравитация",
    "ok 中",
    "中",
]


# --------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------


def _llama2_layout():
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    # A few whole non-ASCII characters so byte runs and character tokens alternate, as in Llama 2.
    for ch in ["▁", *string.ascii_letters, *string.digits, *string.punctuation, *"中文한의éा"]:
        vocab.setdefault(ch, len(vocab))
    merges = []
    for word in ["▁the", "▁hello", "▁world", "▁is", "▁test", "ing", "▁中文", "한의", "▁a", "▁an", "▁and"]:
        for k in range(2, len(word) + 1):
            if word[:k] not in vocab:
                merges.append((word[: k - 1], word[k - 1]))
                vocab[word[:k]] = len(vocab)
    tk = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tk.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def llama2_tok():
    return _llama2_layout()


@pytest.fixture(params=["bundled", "llama2"])
def family(request, hf_tokenizer, llama2_tok):
    return (hf_tokenizer if request.param == "bundled" else llama2_tok), request.param


def _with_specials(tok, text):
    """BOS (where the tokenizer has one) + text + EOS, as vLLM's streaming test builds its ids."""
    ids = tok.encode(text, add_special_tokens=False)
    head = [tok.bos_token_id] if tok.bos_token_id is not None else []
    return head + ids + [tok.eos_token_id]


def _stream(tok, prompt, out, **kwargs):
    det = IncrementalDetokenizer(tok, prompt_ids=prompt, **kwargs)
    steps = [det.push(i) for i in out]
    tail = det.finish()
    return det, steps, tail


def _mid_char(tok, ids):
    return bool(_incomplete_tail(b"".join(token_bytes(tok, i) for i in ids)))


def _expected(tok, prompt, out, skip):
    """What the stream of `out` after `prompt` must read.

    At a character boundary: the text decode(prompt + out) adds to decode(prompt), which is decode(out)
    except that SentencePiece keeps the first token's space (it is not the sequence start). A prompt
    cut inside a character leaves the output's leading bytes orphaned: decode(out) renders them."""
    if _mid_char(tok, prompt):
        return tok.decode(out, skip_special_tokens=skip), True
    full = tok.decode(prompt + out, skip_special_tokens=skip)
    head = tok.decode(prompt, skip_special_tokens=skip)
    assert full.startswith(head)
    return full[len(head) :], False


def test_llama2_layout_really_falls_back_to_bytes(llama2_tok):
    tok = llama2_tok
    pieces = tok.convert_ids_to_tokens(tok.encode("the 我很 ပုံ", add_special_tokens=False))
    assert "▁the" in pieces and "<0xE6>" in pieces and "<0xE1>" in pieces
    for text in STRINGS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


# --------------------------------------------------------------------------------------------------
# Every prompt split
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "keep"])
def test_every_prompt_split_equals_full_decode(family, skip):
    tok, name = family
    splits = 0
    for text in STRINGS:
        ids = _with_specials(tok, text)
        for i in range(len(ids) + 1):
            prompt, out = ids[:i], ids[i:]
            expected, mid = _expected(tok, prompt, out, skip)
            det, steps, tail = _stream(tok, prompt, out, skip_special_tokens=skip)
            got = "".join(s.emitted for s in steps) + tail
            assert got == expected, (name, text, i)
            assert det.text == expected
            plain = tok.decode(out, skip_special_tokens=skip)
            if name == "bundled" or mid:
                assert expected == plain
            else:  # SentencePiece: only the first token's space may differ from decode(out)
                assert expected in (plain, " " + plain)
            if not mid:
                # Valid text split on a boundary: an unfinished character is held, never shown as U+FFFD.
                assert all(REPLACEMENT not in s.emitted for s in steps), (name, text, i)
                assert tail == ""
            splits += 1
    assert splits > 500


def test_regression_byte_run_split_by_the_seed(llama2_tok):
    # Issue 17: the last 5 prompt ids began inside 我 (<0xE6> <0x88> <0x91>); the orphaned bytes made
    # ByteFallback render the whole run, output included, as U+FFFD.
    tok = llama2_tok
    ids = tok.encode("the 中文 world 我很感谢", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    cut = len(ids) - 6  # prompt ends after 很, output is 感谢 (six byte tokens)
    assert pieces[cut:] == ["<0xE6>", "<0x84>", "<0x9F>", "<0xE8>", "<0xB0>", "<0xA2>"]
    assert pieces[cut - 5] not in ("<0xE6>", "<0xE5>")  # the naive 5-id window starts mid-character
    det, steps, tail = _stream(tok, ids[:cut], ids[cut:])
    assert [s.emitted for s in steps] == ["", "", "感", "", "", "谢"]
    assert [s.held_bytes for s in steps][:2] == ["e6", "e6 84"]
    assert det.text == "感谢" and tail == ""


# --------------------------------------------------------------------------------------------------
# vLLM's streaming cases
# --------------------------------------------------------------------------------------------------


def _special_truth(tok, name):
    if name == "bundled":
        return "Some text with adjacent special tokens    <|im_start|><|im_end|><|endoftext|>other text<|im_end|>"
    return "Some text with adjacent special tokens    <s></s><s>other text</s>"


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "keep"])
@pytest.mark.parametrize("with_prompt", [True, False], ids=["prompt", "no_prompt"])
def test_vllm_decode_streaming(family, skip, with_prompt):
    tok, name = family
    for truth in STRINGS + [_special_truth(tok, name)]:
        ids = _with_specials(tok, truth)
        whole = tok.decode(ids, skip_special_tokens=skip)
        if with_prompt:
            # vLLM's split: the tokens of the first half of the characters (plus BOS).
            n = len(tok.encode(truth[: len(truth) // 2], add_special_tokens=False))
            n += 1 if tok.bos_token_id is not None else 0
            prompt, out = ids[:n], ids[n:]
            expected, mid = _expected(tok, prompt, out, skip)
            if not mid:  # vLLM's reference, which assumes the prompt ends on a character boundary
                assert expected == whole[len(tok.decode(prompt, skip_special_tokens=skip)) :]
        else:
            prompt, out, expected = [], ids, whole
        det, steps, tail = _stream(tok, prompt, out, skip_special_tokens=skip)
        assert "".join(s.emitted for s in steps) + tail == expected, (name, truth)


def test_vllm_out_of_vocabulary_id(family):
    tok, _ = family
    det, steps, tail = _stream(tok, [], [len(tok)])
    assert det.text == "" and tail == ""
    det, steps, tail = _stream(tok, tok.encode("中文", add_special_tokens=False), [len(tok)])
    assert det.text == ""


# --------------------------------------------------------------------------------------------------
# The tokenizers library's DecodeStream cases
# --------------------------------------------------------------------------------------------------


def _wrap(tk, **kwargs):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tk, **kwargs)


def test_decodestream_added_tokens_and_prefill():
    from tokenizers import Tokenizer, models

    tk = Tokenizer(models.BPE())
    tk.add_tokens(["my", "name", "is", "john", "pair"])
    tok = _wrap(tk)
    _, steps, _ = _stream(tok, [], [0, 1, 2, 3], skip_special_tokens=False)
    assert [s.emitted for s in steps] == ["my", " name", " is", " john"]
    # A stream prefilled with the first ids gives the same last chunk as one fed them step by step.
    _, steps, _ = _stream(tok, [0, 1, 2], [3])
    assert [s.emitted for s in steps] == [" john"]


def test_decodestream_byte_fallback_unigram():
    from tokenizers import Tokenizer, decoders, models

    tk = Tokenizer(models.Unigram([("<unk>", 0.0), ("<0x20>", -0.1), ("<0xC3>", -0.2), ("<0xA9>", -0.3)], 0,
                                  byte_fallback=True))
    tk.decoder = decoders.ByteFallback()
    tok = _wrap(tk, unk_token="<unk>")
    _, steps, _ = _stream(tok, [], [1, 2, 3], skip_special_tokens=False)
    assert [s.emitted for s in steps] == [" ", "", "é"]
    assert steps[1].held_bytes == "c3"
    # Prefilled with the space: é still comes out whole.
    _, steps, _ = _stream(tok, [1], [2, 3])
    assert [s.emitted for s in steps] == ["", "é"]


def test_decodestream_metaspace_first_token_space():
    from tokenizers import Tokenizer, decoders, models

    tk = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁This", -0.1)], 0, byte_fallback=False))
    tk.decoder = decoders.Metaspace()
    tok = _wrap(tk, unk_token="<unk>")
    _, steps, _ = _stream(tok, [], [1, 1], skip_special_tokens=False)
    assert [s.emitted for s in steps] == ["This", " This"]
    _, steps, _ = _stream(tok, [1], [1])
    assert [s.emitted for s in steps] == [" This"]


def test_decodestream_thai_split_across_tokens(hf_tokenizer):
    # "อั" is split mid-character by byte-level BPE (as in the tokenizers fallback test).
    tok = hf_tokenizer
    ids = tok.encode("อั", add_special_tokens=False)
    assert any(_mid_char(tok, ids[:k]) for k in range(1, len(ids)))
    det, steps, tail = _stream(tok, [], ids)
    assert "".join(s.emitted for s in steps) == "อั" and tail == ""
    assert all(REPLACEMENT not in s.emitted for s in steps)
    # All ids at once after a prefill that ends on a boundary.
    _, steps, _ = _stream(tok, tok.encode("สวัสดี ", add_special_tokens=False), ids)
    assert "".join(s.emitted for s in steps) == "อั"


def test_decodestream_skip_specials_in_prefill(family):
    tok, name = family
    chat = _special_truth(tok, name)
    prompt = tok.encode(chat, add_special_tokens=False) + tok.encode("I", add_special_tokens=False)
    out = tok.encode("I'm ok 我很", add_special_tokens=False)
    expected, _ = _expected(tok, prompt, out, True)
    det, _, _ = _stream(tok, prompt, out)
    assert det.text == expected and expected.lstrip().startswith("I'm ok")


# --------------------------------------------------------------------------------------------------
# Stop strings and the engine's snapshot/restore across families
# --------------------------------------------------------------------------------------------------


def test_stop_holdback_across_scripts(family):
    tok, name = family
    checked = 0
    for text in STRINGS:
        ids = tok.encode(text, add_special_tokens=False)
        for i in range(0, len(ids), 3):
            prompt, out = ids[:i], ids[i:]
            expected, mid = _expected(tok, prompt, out, True)
            if mid or len(expected) < 4:
                continue
            # A stop of two or three characters in the middle of the output (a CJK pair, an emoji with
            # its modifier...), cut on code points as a user would type it.
            at = len(expected) // 2
            stop = expected[at : at + 2 + (i % 2)]
            det, steps, tail = _stream(tok, prompt, out, stop=[stop])
            cut = expected.find(stop)
            assert det.stop == stop and det.finished
            assert "".join(s.emitted for s in steps) + tail == expected[:cut], (name, text, i)
            released = ""
            for s in steps:
                released += s.emitted
                # Emitted text never runs past the cut and holds back any possible start of the stop.
                assert expected[:cut].startswith(released)
                assert REPLACEMENT not in s.emitted
                if s.stop_partial:
                    assert stop.startswith(s.stop_partial)
            checked += 1
    assert checked > 40


def test_snapshot_restore_inside_a_byte_run(llama2_tok):
    tok = llama2_tok
    ids = tok.encode("the 我很感谢你的热情 ပုံပြင်", add_special_tokens=False)
    for i in range(1, len(ids) - 4):
        prompt, out = ids[:i], ids[i:]
        expected, _ = _expected(tok, prompt, out, True)
        det = IncrementalDetokenizer(tok, prompt_ids=prompt)
        for t in out[:3]:
            det.push(t)
        state = det.snapshot()
        det.push(out[3])
        det.push(out[4])
        det.restore(state)  # the engine undoes a failed step like this
        for t in out[3:]:
            det.push(t)
        det.finish()
        assert det.text == expected, i
