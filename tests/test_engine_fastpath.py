"""The engine's two speed paths for a room: the GIL-free layer stack (engine/scripted.py) and public reads that do
not wait for a running step. Real model, no mocks: the scripted path is checked bitwise against the Python path
it replaces, and reads are checked against the engine's state after each kind of change."""
import threading

import torch
from torch.overrides import TorchFunctionMode

from engine import SamplingParams, compute, native, scripted
from engine.model import Capture, KVStorage, SeqInput

NOTHING = Capture(attention=False, logit_lens=False, residual_norms=False, embeddings=False)


def _forward_three_ways(model, capture):
    """A mixed prefill (three sequences, chunked), a batched decode, a single decode: logits and the K/V pool."""
    kv = KVStorage(model.spec, 64, 16, model.dtype, model.device)
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen).tolist() for n in (37, 5, 20)]
    slots = [torch.arange(i * 256, i * 256 + 64) for i in range(3)]
    out = []
    out.append(model.forward([SeqInput(ids[0], 0, slots[0][:37]), SeqInput(ids[1], 0, slots[1][:5]),
                              SeqInput(ids[2][:12], 0, slots[2][:12])], kv, capture)[0])
    out.append(model.forward([SeqInput([5], 37, slots[0][:38]), SeqInput([7], 5, slots[1][:6]),
                              SeqInput(ids[2][12:], 12, slots[2][:20])], kv, capture)[0])
    out.append(model.forward([SeqInput([9], 38, slots[0][:39]), SeqInput([11], 6, slots[1][:7])], kv, capture)[0])
    out.append(model.forward([SeqInput([13], 39, slots[0][:40])], kv, capture)[0])
    return out + [kv.k, kv.v]


def test_scripted_layers_equal_the_python_path_bitwise(base_engine):
    """capture=None runs engine/scripted.py; a capture that records nothing runs Model.forward's Python loop:
    the same kernels in the same order, so every logit and every K/V value must be identical."""
    model = base_engine.model
    # with the lab's kernels built, the single decode runs the whole stack as one native call (decode_layers),
    # unless timing at load chose oneDNN for a matrix's one row (which that call does not run: a loaded machine
    # can make it win a shape; tests/test_weights.py forces each kind through the call)
    one_row = model._script_args["kinds"][0::3]
    runs_stack = native.available() and all(k in scripted.STACK_KINDS for k in one_row)
    assert (model._stack_args is not None) == runs_stack
    fast = compute.run(_forward_three_ways, model, None)
    slow = compute.run(_forward_three_ways, model, NOTHING)
    for a, b in zip(fast, slow):
        assert a.shape == b.shape
        assert torch.equal(a, b)
    assert not torch._C._jit_can_fuse_on_cpu()  # no fused kernels: the module docstring's promise


def test_scripted_path_makes_no_python_calls_per_layer(base_engine):
    """The point of the scripted path: each torch call made from Python gives up the GIL and must take it back,
    which a busy page-building thread makes slow. Counted, not timed: the calls a forward makes from Python
    (TorchFunctionMode sees those, not the ones inside TorchScript) must not grow with the number of layers."""
    model = base_engine.model
    kv = KVStorage(model.spec, 16, 16, model.dtype, model.device)
    seqs = [SeqInput([100 + i], 40 + i, torch.arange(41 + i)) for i in range(4)]

    def count(capture):
        calls = [0]

        class Count(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                calls[0] += 1
                return func(*args, **(kwargs or {}))

        with Count():
            model.forward(seqs, kv, capture)
        return calls[0]

    fast, slow = compute.run(count, None), compute.run(count, NOTHING)
    assert slow > 20 * model.spec.num_layers  # the Python loop: tens of calls per layer
    assert fast < 60, fast  # inputs, embedding, head: none per layer


def test_reads_do_not_wait_for_a_step_and_follow_every_change(engine):
    sid = engine.add_request("The sky is", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                             chat=False, owner="tab 1")
    first = engine.seq_view(sid)
    assert engine.has_unfinished("tab 1") and engine.seq_ids("tab 1") == [sid]

    # a step in progress holds the engine's lock: published reads answer without it
    answers = {}
    with engine._lock:
        t = threading.Thread(target=lambda: answers.update(view=engine.seq_view(sid),
                                                           busy=engine.has_unfinished("tab 1")))
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "a published read waited for the engine's lock"
    assert answers == {"view": first, "busy": True}

    engine.step()
    after = engine.seq_view(sid)
    assert after.num_computed > first.num_computed and len(after.output_ids) == 1
    token = after.output_ids[0] + 1
    engine.force_token(sid, token)
    assert engine.seq_view(sid).forced_token == token
    engine.step()
    assert engine.seq_view(sid).output_ids[-1] == token and engine.seq_view(sid).forced_token is None
    engine.set_params(sid, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert engine.seq_view(sid).params.max_tokens == 3
    while engine.has_unfinished("tab 1"):
        engine.step()
    assert engine.seq_view(sid).status == "finished" and not engine.has_unfinished("tab 1")
    engine.rewind(sid, 1)
    assert engine.seq_view(sid).output_ids == after.output_ids and engine.has_unfinished("tab 1")
    child = engine.branch(sid, 1)
    assert engine.seq_ids("tab 1") == [sid, child]
    engine.release([sid, child])
    assert engine.seq_ids("tab 1") == [] and not engine.has_unfinished("tab 1")
    try:
        engine.seq_view(sid)
    except ValueError as exc:
        assert "not a sequence" in str(exc)
    else:
        raise AssertionError("a released sequence still has a view")


def test_forward_hook_brackets_only_the_gil_free_part(engine):
    """Engine.forward_hook: True then False around the scripted layers and head of each uninstrumented step;
    never for an instrumented forward (its Python loop needs the GIL throughout), and the step's result is the
    same with or without a hook."""
    calls = []
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    plain = engine.session(kv_memory=engine.kv_bytes_per_token * 16 * 16)
    a = plain.add_request("Water boils at", params, chat=False)
    engine.forward_hook = calls.append
    b = engine.add_request("Water boils at", params, chat=False)
    engine.step(trace=False)
    assert calls == [True, False]
    engine.instrument = Capture(attention=True, logit_lens=False, residual_norms=False, embeddings=False)
    engine.step(trace=False)
    assert calls == [True, False]  # the instrumented step ran the Python path: no call
    engine.instrument = None
    while engine.has_unfinished():
        engine.step(trace=False)
    while plain.has_unfinished():
        plain.step(trace=False)
    assert engine.result(b).token_ids == plain.result(a).token_ids
    assert calls == [True, False] * (len(calls) // 2) and len(calls) >= 4
