"""Every model family we run, through our engine, against transformers' own model of the same weights.

No network here, so each family is a tiny randomly initialised checkpoint built from transformers' own config
class with the family's distinctive options switched on (llama3 RoPE scaling; q/k/v biases; a sliding window
shorter than the prompt, on every layer or from a layer on; per-head q/k RMSNorm), its norm weights and biases
randomised as trained checkpoints have them (a freshly initialised model has norms of exactly 1 and biases of 0,
which hide a missing norm or bias), saved with the bundled tokenizer to a temporary directory and loaded by
`Engine.from_pretrained(dir)`.

For three prompts, each run of the engine must give:
- the greedy ids of transformers' `generate`, 48 tokens each;
- at every prompt position, the prompt log-probabilities (the prompt token's own and the 20 most likely) of
  transformers' logits, and at every sampled position (the prefill's last and each decode step) the raw
  logits themselves (`Engine.last_logits`), within MAX_DIFF.
The runs cover the engine's paths: a single sequence (the native decode step), the three prompts batched
(batched decode), chunked prefill (chunks mixed with decode steps), prefix caching on and off (a second run
of the same prompts reads the cached blocks), the instrumented forward (`Engine.instrument`, the lab's
capture path) and speculative decoding (greedy ids). A family we do not run is refused before its weights.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from engine import Capture, Engine, ModelLoadError, SamplingParams
from engine.loader import SUPPORTED_MODEL_TYPES, load

PROMPTS = [
    "What is gravity? Explain it to a ten-year-old.",
    "Что такое гравитация?",
    "Write a short story about a lighthouse keeper who finds a message in a bottle, in three paragraphs, "
    "and then explain what the story means.",
]
MAX_NEW = 48
MAX_DIFF = 1e-4  # |our logit - transformers' logit|, float32; the same bound for log-probabilities
TOP = 20  # prompt log-probabilities' alternatives per position (the engine's limit)
WINDOW = 12  # the sliding window (Mistral's every layer, Qwen3's from layer 1): shorter than every prompt (44-58)

COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
              # wider than the default 0.02, so that logits spread (top-2 margins ~0.1, not ~0.01) and greedy
              # choices are not near-ties that float32 rounding could flip
              initializer_range=0.1, bos_token_id=1, eos_token_id=2)


def _config(family: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if family == "llama":  # Llama 3.x: RoPE with the llama3 rescaling of long wavelengths
        return LlamaConfig(**COMMON, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64))
    if family == "qwen2":  # q/k/v biases (always on in Qwen2), tied embeddings as the small Qwen2.5s have
        return Qwen2Config(**{**COMMON, "tie_word_embeddings": True},
                           rope_parameters=dict(rope_type="default", rope_theta=1e6))
    if family == "mistral":  # a sliding window shorter than the prompt; one K/V head
        return MistralConfig(**{**COMMON, "num_key_value_heads": 1}, sliding_window=WINDOW)
    if family == "qwen3":  # per-head RMSNorm of q and k before RoPE; head_dim x heads != hidden, as in Qwen3;
        # and Qwen's sliding window on the layers from max_window_layers on: full and windowed layers in one model
        return Qwen3Config(**{**COMMON, "tie_word_embeddings": True}, head_dim=32,
                           rope_parameters=dict(rope_type="default", rope_theta=1e6), use_sliding_window=True,
                           sliding_window=WINDOW, max_window_layers=1)
    raise KeyError(family)


FAMILIES = ["llama", "qwen2", "mistral", "qwen3"]


def _randomise(hf) -> None:
    """Norm weights ~ N(1, 0.5) and biases ~ N(0, 0.5), as a trained checkpoint's are far from 1 and 0."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


@dataclass
class Reference:
    prompt_ids: list[int]
    ids: list[int]  # transformers' greedy continuation
    logits: torch.Tensor  # [len(prompt) + MAX_NEW - 1, vocab]: row p predicts position p + 1


@dataclass
class Family:
    name: str
    directory: object  # the checkpoint (a pathlib.Path)
    engine: Engine
    refs: list[Reference]


def _build(name: str, config, directory, tokenizer) -> Family:
    """The checkpoint of `config` (randomised) in `directory`, our engine over it, and transformers' references."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomise(hf)
    hf.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    eng = Engine.from_pretrained(str(directory), kv_memory=4 << 20)
    assert eng.spec.model_type == config.model_type
    hf.generation_config.eos_token_id = None  # 48 tokens whatever comes, as ignore_eos in ours
    refs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = list(eng.encode(prompt).token_ids)
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, temperature=None,
                              top_p=None, top_k=None)[0]
            assert len(out) == len(ids) + MAX_NEW
            logits = hf(out[None, :-1]).logits[0].float()
            refs.append(Reference(ids, out[len(ids):].tolist(), logits))
    return Family(name, directory, eng, refs)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, loaded):
    return _build(request.param, _config(request.param), tmp_path_factory.mktemp(request.param), loaded.tokenizer)


def _run(eng: Engine, refs: list[Reference], together: bool, prompt_logprobs: bool) -> list[dict]:
    """Run the prompts (all at once, or one after another) to the end with traced steps; per prompt the ids, the
    raw logits of every sampled position and the prompt log-probabilities the engine reported (a request for
    them computes every prompt position: it reads nothing from the prefix cache)."""
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True,
                            prompt_logprobs=TOP if prompt_logprobs else None)
    runs: dict[int, dict] = {}

    def drive():
        while eng.has_unfinished():
            for sev in eng.step(trace=True).seqs:
                run = runs[sev.seq_id]
                run["prompt_logprobs"] += sev.prompt_logprobs
                run["cached"] += sev.num_cached_tokens
                if sev.new_token is not None:
                    run["logits"].append(eng.last_logits(sev.seq_id))

    for ref in refs:
        rid = eng.add_request(prompt_ids=ref.prompt_ids, params=params)
        runs[rid] = dict(logits=[], prompt_logprobs=[], cached=0, with_prompt=prompt_logprobs)
        if not together:
            drive()
    drive()
    for rid, run in runs.items():
        run["ids"] = list(eng.result(rid).token_ids)
    return list(runs.values())


def _check(runs: list[dict], refs: list[Reference], what: str) -> float:
    """Every run against transformers: ids, then logits and prompt log-probabilities; returns the largest
    difference seen."""
    worst = 0.0
    for k, (run, ref) in enumerate(zip(runs, refs)):
        where = f"{what}, prompt {k}"
        if run["ids"] != ref.ids:
            first = next(i for i, (a, b) in enumerate(zip(run["ids"], ref.ids)) if a != b)
            row = ref.logits[len(ref.prompt_ids) - 1 + first]
            top = row.topk(2).values
            pytest.fail(f"{where}: greedy ids differ from transformers' from output token {first} "
                        f"(ours {run['ids'][first]}, theirs {ref.ids[first]}; their top-2 margin "
                        f"{float(top[0] - top[1]):.4g})")
        n = len(ref.prompt_ids)
        assert len(run["logits"]) == MAX_NEW
        ours = torch.stack(run["logits"])
        diff = (ours - ref.logits[n - 1:]).abs().max(dim=-1).values
        bad = int(diff.argmax())
        assert diff[bad] <= MAX_DIFF, f"{where}: logits of output token {bad} differ by {float(diff[bad]):.3g}"
        worst = max(worst, float(diff.max()))
        if not run["with_prompt"]:
            continue
        logp = torch.log_softmax(ref.logits[: n - 1], dim=-1)
        reported = sorted(run["prompt_logprobs"], key=lambda r: r.position)
        assert [r.position for r in reported] == list(range(n)), f"{where}: prompt positions reported"
        for r in reported[1:]:
            row = logp[r.position - 1]
            assert r.token_id == ref.prompt_ids[r.position]
            got = torch.tensor([r.logprob] + r.top_logprobs)
            want = row[[r.token_id] + r.top_ids]
            d = float((got - want).abs().max())
            assert d <= MAX_DIFF, f"{where}: prompt log-probabilities at position {r.position} differ by {d:.3g}"
            worst = max(worst, d)
            # the reported alternatives are transformers' most likely tokens (ties aside: the margin is checked)
            theirs = row.topk(TOP)
            assert set(r.top_ids) == set(theirs.indices.tolist()) or \
                float(theirs.values[-1] - row.topk(TOP + 1).values[-1]) < 2 * MAX_DIFF
    return worst


def test_single_sequence_then_prefix_cache(family):
    """Each prompt alone (a single sequence's decode step: the engine's fastest path), then again, its blocks
    now read from the prefix cache."""
    eng = family.engine.session()
    _check(_run(eng, family.refs, together=False, prompt_logprobs=True), family.refs, "alone")
    warm = _run(eng, family.refs, together=False, prompt_logprobs=False)
    assert all(r["cached"] > 0 for r in warm), "the second run reads the prompts' blocks from the prefix cache"
    _check(warm, family.refs, "alone, prefix-cached")


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_batched(family, prefix_caching):
    """The three prompts in one batch: their prefills in one step, then batched decode steps."""
    eng = family.engine.session(enable_prefix_caching=prefix_caching)
    _check(_run(eng, family.refs, True, prompt_logprobs=not prefix_caching), family.refs, "batched")


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_chunked_prefill(family, prefix_caching):
    """Prompts in chunks of 5 tokens, mixed in steps with the other sequences' decode tokens; with prefix
    caching, the system prompt's first block is shared between the prompts."""
    eng = family.engine.session(max_num_batched_tokens=5, enable_prefix_caching=prefix_caching)
    runs = _run(eng, family.refs, together=True, prompt_logprobs=not prefix_caching)
    _check(runs, family.refs, "chunked")
    if prefix_caching:
        assert any(r["cached"] > 0 for r in runs)


def test_instrumented(family):
    """The lab's capture path (attention maps and residual norms: the Python forward), one sequence and then the
    three together. (The logit lens only reads the residual stream the forward computes anyway.)"""
    eng = family.engine.session(enable_prefix_caching=False)
    eng.instrument = Capture(logit_lens=False, embeddings=False)
    _check(_run(eng, family.refs[:1], False, prompt_logprobs=True), family.refs[:1], "instrumented, alone")
    _check(_run(eng, family.refs, True, prompt_logprobs=True), family.refs, "instrumented, batched")


def test_fast_paths_equal_the_python_path_bitwise(family):
    """The engine's invariant for every family: the scripted stack and the native decode step give the bits of
    Model.forward's op-by-op Python loop (contexts of up to 40 tokens: past every window), logits and K/V alike."""
    from engine import compute
    from test_engine_fastpath import NOTHING, _forward_three_ways

    fast = compute.run(_forward_three_ways, family.engine.model, None)
    slow = compute.run(_forward_three_ways, family.engine.model, NOTHING)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)


def test_biases_wherever_a_config_puts_them(tmp_path, loaded):
    """A Llama config with attention_bias (q, k, v and o) and mlp_bias (gate, up, down): every fused matrix's
    bias is read from the checkpoint and added on every path (alone and batched here)."""
    from transformers import LlamaConfig

    fam = _build("llama", LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True), tmp_path, loaded.tokenizer)
    assert all(fam.engine.model.layers[0][m].bias is not None for m in ("qkv", "o", "gate_up", "down"))
    _check(_run(fam.engine.session(), fam.refs, together=False, prompt_logprobs=True), fam.refs, "biased, alone")
    _check(_run(fam.engine.session(), fam.refs, together=True, prompt_logprobs=False), fam.refs, "biased, batched")


@pytest.mark.parametrize("method", ["ngram", "early_exit"])
def test_speculative_decoding_keeps_the_greedy_ids(family, method):
    """Drafts verified in one forward of several rows per sequence (the prefill path's attention over a
    window, q/k norms on every row), the three prompts together: greedy verification keeps transformers' ids."""
    from engine import SpeculativeConfig

    eng = family.engine.session()
    spec = SpeculativeConfig(method, 3, exit_layer=1) if method == "early_exit" else SpeculativeConfig(method, 4)
    rids = [eng.add_request(prompt_ids=ref.prompt_ids, speculative=spec,
                            params=SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True))
            for ref in family.refs]
    events = eng.run_until_done()
    assert any(s.spec is not None and s.spec.num_drafted for e in events for s in e.seqs), "drafts were verified"
    for rid, ref in zip(rids, family.refs):
        assert list(eng.result(rid).token_ids) == ref.ids


@pytest.mark.parametrize("family", ["qwen3"], indirect=True)
def test_bfloat16_activations(family):
    """dtype=torch.bfloat16 on the CPU (torch's kernels: the lab's take float32 rows) loads and runs; the
    logits at each prompt's end are transformers' float32 ones to bf16's precision (a missing norm or bias would
    be off by whole units)."""
    eng = Engine.from_pretrained(str(family.directory), dtype=torch.bfloat16, kv_memory=4 << 20)
    rids = [eng.add_request(prompt_ids=ref.prompt_ids, params=SamplingParams(max_tokens=1, temperature=0.0))
            for ref in family.refs]
    eng.step()
    for rid, ref in zip(rids, family.refs):
        diff = (eng.last_logits(rid) - ref.logits[len(ref.prompt_ids) - 1]).abs().max()
        assert diff <= 0.3, f"bf16 logits differ from float32 transformers' by {float(diff):.3g}"


def test_every_family_decodes_on_the_native_path(family):
    """No family falls back to a slower decode path: with the lab's kernels built, a single sequence's decode
    step is one native call for each, sliding windows and q/k norms included; --stats names the attention."""
    from engine import native

    model = family.engine.model
    if native.available():
        assert "native call" in model.decode_path, model.decode_path
    described = model.attention
    window = {"mistral": "on every layer", "qwen3": "on layers 1, 2"}.get(family.name)
    assert (f"sliding window of {WINDOW} tokens {window}" in described) if window else "window" not in described, \
        described
    assert ("q and k RMS-normalised" in described) == (family.name == "qwen3"), described


@pytest.mark.parametrize("family", ["mistral", "qwen3"], indirect=True)
def test_sliding_window_is_what_the_attention_maps_show(family):
    """The captured attention of a windowed model: every query row of a windowed layer puts its weight on its
    last WINDOW keys only, of a full layer on every key up to its own (prefill rows and a decode row); each row's
    weights sum to 1."""
    windows = family.engine.model.windows
    eng = family.engine.session(enable_prefix_caching=False)
    eng.instrument = Capture(logit_lens=False, embeddings=False, residual_norms=False)
    ref = family.refs[2]
    rid = eng.add_request(prompt_ids=ref.prompt_ids, params=SamplingParams(max_tokens=2, temperature=0.0))
    rows = []
    while eng.has_unfinished():
        sev = eng.step().seq(rid)
        cap = sev.capture
        positions = cap.attention_positions or list(range(sev.chunk_start, sev.chunk_start + sev.num_processed))
        for layer, probs in cap.attention.items():  # [heads, rows, context]
            for r, pos in enumerate(positions):
                rows.append((windows[layer], pos, probs[:, r]))
    assert {pos for _, pos, _ in rows} >= {0, WINDOW, len(ref.prompt_ids)}  # the prefill's rows and a decode row
    assert {w for w, _, _ in rows} == set(windows)
    for window, pos, p in rows:
        keys = torch.arange(p.shape[-1])
        inside = (keys <= pos) & ((keys > pos - window) if window else True)
        assert float(p[:, ~inside].abs().sum()) == 0.0, f"query {pos} attends outside its window"
        assert torch.allclose(p[:, inside].sum(-1), torch.ones(p.shape[0]), atol=1e-5)


def _refused_dir(tmp_path, config: dict):
    """A directory with `config` and weights that cannot be read: a loader that read them before the check would
    fail with safetensors' error, not ours."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    return tmp_path


def _assert_refusal(message: str, model_type: str) -> None:
    assert f"Unsupported architecture {model_type!r}" in message, message
    assert all(t in message for t in SUPPORTED_MODEL_TYPES), message


@pytest.mark.parametrize("model_type", ["gemma2", "phi3", "olmo2", "not_a_model_type"])
def test_a_family_we_do_not_run_is_refused_before_its_weights(tmp_path, model_type):
    """Named with its model_type and the list we run, before the tokenizer or any weight is read, whether
    transformers knows the type (gemma2, phi3, olmo2: their own config classes) or not."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(model_type, num_hidden_layers=2, hidden_size=64).to_dict()
    except ValueError:  # a type transformers does not know
        config = {"model_type": model_type, "num_hidden_layers": 2}
    with pytest.raises(ModelLoadError) as err:
        Engine.from_pretrained(str(_refused_dir(tmp_path, config)))
    _assert_refusal(str(err.value), model_type)
    with pytest.raises(ModelLoadError) as err:
        load(str(tmp_path))
    _assert_refusal(str(err.value), model_type)


def test_a_hub_model_we_do_not_run_is_refused_from_its_config_alone(tmp_path):
    """`--model org/name`: only config.json is fetched before the check (here from a hub cache holding nothing
    else, offline): the command line says in one line what it does not run, and no weight is asked for."""
    import os
    import subprocess
    import sys

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--someone--gemma-like"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps({"model_type": "gemma2"}))
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "engine", "hi", "--model", "someone/gemma-like"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, out.stderr
    _assert_refusal(error[0], "gemma2")
