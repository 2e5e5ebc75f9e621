"""Our forward against transformers' own model on the bundled weights (fp32, CPU)."""
import pytest
import torch

from engine import SamplingParams

PROMPTS = [
    "What is gravity? Explain it to a ten-year-old.",
    "Что такое гравитация?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Describe this: 🚀🌕✨ in one sentence 😀",
    "List three facts about the Moon.",
]
MAX_NEW = 64


@pytest.fixture(scope="module")
def hf_model(loaded):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(loaded.source_dir), dtype=torch.float32).eval()


def hf_greedy(hf_model, ids):
    out = hf_model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, num_beams=1,
                            temperature=None, top_p=None, top_k=None)
    return out[0, len(ids):].tolist()


def test_prefill_logits_match_transformers(engine, hf_model):
    from engine.model import SeqInput

    for prompt in PROMPTS[:3]:
        ids = engine.encode(prompt).token_ids
        rid = engine.add_request(prompt_ids=ids, params=SamplingParams(max_tokens=1, temperature=0))
        table = None
        # drive one step by hand to get every row's logits: allocate through the engine's own block manager
        seq = engine.sequences[rid]
        engine.scheduler.waiting.remove(seq)
        engine.blocks.allocate(rid, ids)
        table = engine.blocks.block_tables[rid]
        from engine.engine import _slots

        slots = _slots(table, engine.block_size, len(ids))
        ours, _ = engine.model.forward([SeqInput(ids, 0, slots, logits_rows=len(ids))], engine.kv)
        engine.blocks.free(rid)
        del engine.sequences[rid]
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0].float()
        # float32 sums in another order over 30 layers: logits of magnitude ~30 differ by ~1e-4 (1.08e-4 on this
        # machine's CPU at the commit before this bound, on its own and in CI alike), a relative 4e-6
        assert (ours - ref).abs().max().item() <= 2e-4


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ids_match_generate(engine, hf_model, prompt):
    ids = engine.encode(prompt).token_ids
    expected = hf_greedy(hf_model, ids)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    cold = engine.generate(prompt, params)
    assert cold.prompt_token_ids == ids
    assert cold.token_ids == expected
    # Again: the prompt's full blocks now come from the prefix cache.
    warm = engine.generate(prompt, params)
    assert warm.num_cached_tokens > 0
    assert warm.token_ids == expected


def test_greedy_ids_match_with_chunked_prefill(engine, hf_model):
    eng = engine.session(max_num_batched_tokens=7, enable_prefix_caching=False)
    for prompt in (PROMPTS[1], PROMPTS[3]):
        ids = eng.encode(prompt).token_ids
        assert len(ids) > 7 * 3
        rid = eng.add_request(prompt, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
        events = eng.run_until_done()
        chunks = [e.seq(rid) for e in events if e.seq(rid) is not None and e.seq(rid).phase == "prefill"]
        assert len(chunks) == -(-len(ids) // 7)  # the prompt went in 7-token chunks
        assert eng.result(rid).token_ids == hf_greedy(hf_model, ids)


def test_prefix_hit_gives_same_logits_as_cold_run(engine):
    """A prefix served from cached blocks must give the same next-token logits as computing it."""
    system = "You are a physics teacher. Answer briefly and precisely, with one everyday example."
    p1 = SamplingParams(max_tokens=1, temperature=0.0)
    cold = engine.session(enable_prefix_caching=False)
    for question in ("What is mass?", "What is weight?"):
        engine.generate(question, p1, system=system)  # the second one hits the system prompt's blocks
    rid = engine.add_request("What is inertia?", p1, system=system)
    ev = engine.step()
    assert ev.seq(rid).num_cached_tokens >= 16
    hot_logits = engine.sequences[rid].last_sampling[0]
    rid2 = cold.add_request("What is inertia?", p1, system=system)
    ev2 = cold.step()
    assert ev2.seq(rid2).num_cached_tokens == 0
    cold_logits = cold.sequences[rid2].last_sampling[0]
    assert (hot_logits - cold_logits).abs().max().item() <= 1e-4
