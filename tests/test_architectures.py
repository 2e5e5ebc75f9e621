"""Other supported architectures through the local-directory source, against transformers' own classes.

No network here, so each architecture is a tiny randomly initialised checkpoint written to a temporary
directory with the bundled tokenizer: the point is that our forward (llama3 RoPE scaling, Qwen2's qkv bias,
untied heads, GQA ratios) computes what transformers computes for the same weights.
"""
import json

import pytest
import torch

from engine import Engine, ModelLoadError, SamplingParams
from engine.loader import load


def tiny(kind):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False)
    if kind == "llama3":
        return LlamaConfig(**common, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64))
    if kind == "qwen2":
        return Qwen2Config(**common, rope_parameters=dict(rope_type="default", rope_theta=1e6))
    if kind == "mistral":
        return MistralConfig(**{**common, "num_key_value_heads": 1}, sliding_window=None)
    raise KeyError(kind)


@pytest.fixture(scope="module")
def tokenizer(loaded):
    return loaded.tokenizer


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "mistral"])
def test_local_dir_parity(tmp_path, tokenizer, kind):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny(kind), dtype=torch.float32).eval()
    if kind == "qwen2":  # random init leaves biases at zero; make them matter
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    hf.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    eng = Engine.from_pretrained(str(tmp_path), kv_memory=1 << 20)
    assert eng.spec.model_type == hf.config.model_type
    ids = tokenizer.encode("Gravity bends light; гравитация искривляет свет. " * 3)
    rid = eng.add_request(prompt_ids=ids, params=SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    eng.run_until_done()
    ours = eng.result(rid).token_ids
    with torch.no_grad():
        ref_logits = hf(torch.tensor([ids])).logits[0, -1]
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, min_new_tokens=20,
                          temperature=None, top_p=None, top_k=None)[0, len(ids):].tolist()
    assert ours == ref
    rid = eng.add_request(prompt_ids=ids, params=SamplingParams(max_tokens=1, temperature=0.0))
    eng.step()
    assert (eng.sequences[rid].last_sampling[0] - ref_logits).abs().max().item() <= 1e-4


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ModelLoadError, match="Unsupported architecture 'gpt2'.*Llama"):
        load(str(tmp_path))


def test_unknown_path_and_offline_hub_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="No model directory"):
        load(str(tmp_path / "nope" / "deeper"))
    with pytest.raises(ModelLoadError, match="not a Hugging Face model directory"):
        load(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="Hugging Face Hub"):
        load("some-org/some-model-that-is-not-cached")
