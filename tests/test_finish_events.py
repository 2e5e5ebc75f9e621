"""Finishing, as the step events tell it: for every way a sequence can end (length on its prefill step, EOS as
its first token, length after decoding, a stop string, a grammar that completes, an abort, a forced EOS, the
last chunk of a chunked prefill, a prefix-cache hit, a speculative round cut mid-draft, several sequences
batched, preemption, rewind and branch) every step's event is checked by one function, `check_step`.

The bug this guards (fixed in "fix: a sequence that finishes on its prefill step ..."): a request that finished
on its prefill step had SeqEvent(finished=False, finish_reason=None) while StepEvent.finished named it.

The invariant, on every step: each SeqEvent's `finished` is exactly "its id is in event.finished"; a finished
one has a non-empty reason equal to its view's (status "finished") and a new token; an unfinished one has no
reason and its view runs; every id in event.finished has a SeqEvent; a finished sequence never shows up in a
later step (until rewound); running/waiting never hold a finished id; `new_token` is None exactly when the step
did not sample for that sequence (a non-final prefill chunk), judged from the sequence's length before the step.
Also: step(trace=True), step(trace=False), generate and stream agree on the ending of the same seeded request,
and a hypothesis test mixes random requests, stops, grammars, temperatures and aborts.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Grammar, SamplingParams, SpeculativeConfig, StepEvent

REASONS = {"length", "eos", "stop", "grammar"}  # what a step can end a sequence with ("abort" comes from outside)
EOS_PROMPT = "Write a poem about rain."  # raw completion (chat=False): the greedy first token is <|im_end|>
REPEAT = "Repeat the following text exactly: The quick brown fox jumps over the lazy dog, and the dog keeps sleeping."
QUESTIONS = ["Hi!", "Name three planets.", "What is 2 + 2?", "Write a haiku about the sea, please, in English.",
             "Что такое гравитация?", "def add(a, b):"]
YES_NO = Grammar.choice(["yes", "no"])


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def small(base_engine, blocks: int = 64, **kw):
    """A session with a small KV pool (the default 256 MiB one costs ~0.25 s to allocate)."""
    return base_engine.session(kv_memory=blocks * 16 * base_engine.kv_bytes_per_token, **kw)


def _n(view) -> int:
    return len(view.prompt_ids) + len(view.output_ids)


class Checked:
    """Drives an engine step by step and checks every StepEvent (`check_step`). Aborts and rewinds go through
    it so that it knows which finished sequences may run again."""

    def __init__(self, eng, roundtrip: bool = True):
        self.eng = eng
        self.gone: dict[int, str] = {}  # finished (or aborted) ids -> their reason; must never reappear
        self.events: list[StepEvent] = []
        self.roundtrip = roundtrip

    def step(self, trace: bool = False) -> StepEvent:
        eng = self.eng
        before = {sid: eng.seq_view(sid) for sid in eng.seq_ids()}
        event = eng.step(trace=trace)
        check_step(eng, event, before, self.gone)
        if self.roundtrip:  # what a replay or a websocket follower reads says the same
            back = StepEvent.from_dict(event.to_dict())
            assert back.finished == event.finished
            assert [(s.seq_id, s.finished, s.finish_reason, s.new_token) for s in back.seqs] == \
                   [(s.seq_id, s.finished, s.finish_reason, s.new_token) for s in event.seqs]
        self.events.append(event)
        return event

    def run(self, trace: bool = False, max_steps: int = 400) -> list[StepEvent]:
        start = len(self.events)
        while self.eng.has_unfinished():
            assert len(self.events) - start < max_steps, "the engine did not finish"
            self.step(trace)
        return self.events[start:]

    def abort(self, sid: int) -> None:
        was = self.eng.seq_view(sid)
        self.eng.abort(sid)
        view = self.eng.seq_view(sid)
        assert view.status == "finished"
        if was.status == "finished":  # aborting a finished sequence changes nothing
            assert view.finish_reason == was.finish_reason
        else:
            assert view.finish_reason == "abort"
            assert self.eng.result(sid).finish_reason == "abort"
            self.gone[sid] = "abort"

    def rewind(self, sid: int, n: int) -> None:
        self.eng.rewind(sid, n)
        self.gone.pop(sid, None)
        view = self.eng.seq_view(sid)
        assert view.status != "finished" and view.finish_reason is None

    def of(self, sid: int) -> list:
        """The SeqEvents of `sid`, in step order."""
        return [s for e in self.events for s in e.seqs if s.seq_id == sid]


def check_step(eng, event: StepEvent, before: dict, gone: dict[int, str]) -> None:
    """The whole invariant for one step. `before`: every sequence's view just before the step; `gone`: ids that
    finished earlier (updated here with this step's)."""
    ids = [s.seq_id for s in event.seqs]
    assert len(ids) == len(set(ids)), f"step {event.step}: a sequence twice in seqs {ids}"
    fin = event.finished
    assert len(fin) == len(set(fin)), f"step {event.step}: finished {fin} names a sequence twice"
    assert set(fin) <= set(ids), f"step {event.step}: finished {fin} without a SeqEvent (seqs {ids})"
    for sid in (*event.running, *event.waiting):
        assert sid not in fin and sid not in gone, f"step {event.step}: finished {sid} still queued"
        assert eng.seq_view(sid).status != "finished"
    assert not set(event.running) & set(event.waiting)
    assert not set(event.preempted) & set(ids), f"step {event.step}: preempted {event.preempted} also ran"
    assert set(event.preempted) <= set(event.waiting)

    for ev in event.seqs:
        sid, view, b = ev.seq_id, eng.seq_view(ev.seq_id), before[ev.seq_id]
        where = f"step {event.step}, seq {sid}"
        assert sid not in gone, f"{where}: finished earlier ({gone.get(sid)}) but in this step's seqs"
        assert b.status != "finished", f"{where}: was finished before the step"
        assert ev.finished == (sid in fin), f"{where}: SeqEvent.finished={ev.finished}, event.finished={fin}"
        # did this step sample for it? Its own tokens (drafts aside) reached the sequence's end as it was
        drafted = ev.spec.num_drafted if ev.spec is not None else 0
        sampled = ev.chunk_start + ev.num_processed - drafted == _n(b)
        assert (ev.new_token is not None) == sampled, \
            f"{where}: new_token={ev.new_token} but the chunk {ev.chunk_start}+{ev.num_processed} of {_n(b)} " \
            f"{'did' if sampled else 'did not'} sample"
        if ev.new_token is None:  # a non-final prefill chunk
            assert ev.phase == "prefill" and not ev.finished and ev.finish_reason is None, where
            assert view.output_ids == b.output_ids and ev.num_tokens == _n(b) and ev.emitted == "", where
            assert ev.spec is None and ev.sampling is None, where
        else:
            count = ev.spec.num_emitted if ev.spec is not None else 1
            assert count >= 1, where
            assert view.output_ids[: len(b.output_ids)] == b.output_ids, where
            assert len(view.output_ids) == len(b.output_ids) + count, where
            assert view.output_ids[-1] == ev.new_token and ev.num_tokens == _n(view), where
        if ev.finished:
            assert isinstance(ev.finish_reason, str) and ev.finish_reason in REASONS, f"{where}: {ev.finish_reason!r}"
            assert ev.finish_reason == view.finish_reason, f"{where}: {ev.finish_reason} vs view {view.finish_reason}"
            assert view.status == "finished", f"{where}: finished in the event, {view.status} in the view"
            assert ev.new_token is not None, f"{where}: finished without a token"
            assert eng.result(sid).finish_reason == ev.finish_reason
            assert view.num_blocks == 0 and sid not in event.block_tables, f"{where}: a finished one holds blocks"
            assert sid not in event.running and sid not in event.waiting
        else:
            assert ev.finish_reason is None, f"{where}: finish_reason {ev.finish_reason!r} but not finished"
            assert view.status == "running" and view.finish_reason is None, f"{where}: view {view.status}"
            assert sid in event.running, f"{where}: unfinished but not running"
        _check_reason(eng, ev, view, where)

    # nothing finishes silently: every sequence that ended in this step is named by it
    for sid, b in before.items():
        if b.status != "finished" and eng.seq_view(sid).status == "finished":
            assert sid in fin, f"step {event.step}: seq {sid} finished ({eng.seq_view(sid).finish_reason}) unnamed"
    for sid in fin:
        gone[sid] = eng.seq_view(sid).finish_reason
    for sid, reason in gone.items():  # and what has finished stays finished, with its reason
        view = eng.seq_view(sid)
        assert view.status == "finished" and view.finish_reason == reason, f"seq {sid}: {view.finish_reason}"


def _check_reason(eng, ev, view, where: str) -> None:
    """The reason fits what happened: the token, the length, min_tokens, the stop string or token, the grammar."""
    p, out = view.params, view.output_ids
    ends = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eng.eos_ids))  # tokens that end it
    if not ev.finished:
        if ev.new_token is not None:  # it went on: nothing that ends a sequence happened
            assert len(out) < p.max_tokens, f"{where}: at max_tokens and still running"
            assert not (len(out) >= p.min_tokens and out[-1] in ends), f"{where}: a stop token and still running"
        return
    r = ev.finish_reason
    if r == "length":
        assert len(out) == p.max_tokens, f"{where}: length at {len(out)}/{p.max_tokens}"
    elif r == "eos":
        assert ev.new_token in eng.eos_ids and not p.ignore_eos and ev.new_token not in p.stop_token_ids, where
        assert len(out) >= p.min_tokens, f"{where}: EOS before min_tokens={p.min_tokens}"
    elif r == "stop":
        by_token = ev.new_token in p.stop_token_ids
        assert by_token or (p.stop and any(s in _raw_text(eng, view) for s in p.stop)), \
            f"{where}: stopped without a stop string ({p.stop}) or stop token ({p.stop_token_ids})"
        assert len(out) >= p.min_tokens, f"{where}: stopped before min_tokens={p.min_tokens}"
    elif r == "grammar":
        assert p.grammar is not None, where
    assert len(out) <= p.max_tokens, where


def _raw_text(eng, view) -> str:
    return eng.tokenizer.decode(list(view.output_ids))


# ---- one way to finish at a time ------------------------------------------------------------------------------

def test_length_on_the_prefill_step(engine):
    c = Checked(engine)
    sid = engine.add_request("Name three planets.", greedy(1))
    events = c.run(trace=True)
    assert len(events) == 1
    ev = events[0].seq(sid)
    assert ev.phase == "prefill" and ev.finished and ev.finish_reason == "length" and events[0].finished == [sid]
    assert ev.new_token is not None and ev.sampling is not None


def test_eos_as_the_first_token(engine):
    c = Checked(engine)
    sid = engine.add_request(EOS_PROMPT, greedy(8), chat=False)
    events = c.run(trace=True)
    ev = events[0].seq(sid)
    assert len(events) == 1 and ev.phase == "prefill"
    assert ev.new_token in engine.eos_ids and ev.new_token_text == "<|im_end|>"
    assert ev.finished and ev.finish_reason == "eos" and events[0].finished == [sid]
    assert engine.result(sid).token_ids == [ev.new_token]


def test_eos_first_with_ignore_eos_runs_to_length(engine):
    c = Checked(engine)
    sid = engine.add_request(EOS_PROMPT, greedy(3, ignore_eos=True), chat=False)
    c.run()
    assert engine.seq_view(sid).finish_reason == "length"
    assert [s.finished for s in c.of(sid)] == [False, False, True]


def test_length_after_decoding(engine):
    c = Checked(engine)
    sid = engine.add_request("Write a haiku about the sea, please, in English.", greedy(5, ignore_eos=True))
    events = c.run(trace=True)
    evs = c.of(sid)
    assert [e.phase for e in evs] == ["prefill"] + ["decode"] * 4
    assert [e.finished for e in evs] == [False] * 4 + [True] and evs[-1].finish_reason == "length"
    assert [e.finished for e in events] == [[]] * 4 + [[sid]]


def test_a_stop_string_mid_output(engine):
    ref = engine.generate("Name three planets.", greedy(24))
    assert ref.finish_reason in ("eos", "length") and len(ref.token_ids) >= 6
    # a stop string that the greedy output completes at its 4th token or later
    texts = [engine.token_text(t) for t in ref.token_ids]
    k = next(i for i in range(3, len(texts))
             if texts[i].strip() and texts[i].strip() not in "".join(texts[:i]))
    stop = texts[k].strip()
    c = Checked(engine)
    sid = engine.add_request("Name three planets.", greedy(24, stop=(stop,)))
    c.run()
    evs = c.of(sid)
    assert evs[-1].finished and evs[-1].finish_reason == "stop" and evs[-1].phase == "decode"
    assert len(evs) == k + 1 and not any(e.finished for e in evs[:-1])
    res = engine.result(sid)
    assert stop not in res.text and res.token_ids == ref.token_ids[: k + 1]


def test_a_stop_string_on_the_prefill_step(engine):
    first = engine.generate("Hi", greedy(1), chat=False)
    text = engine.token_text(first.token_ids[0])
    assert text.strip()
    c = Checked(engine)
    sid = engine.add_request("Hi", greedy(8, stop=(text.strip(),)), chat=False)
    events = c.run(trace=True)
    assert len(events) == 1 and events[0].seq(sid).finish_reason == "stop" and events[0].finished == [sid]


@pytest.mark.parametrize("max_tokens", [1, 8])
def test_a_grammar_that_completes(engine, max_tokens):
    c = Checked(engine)
    sid = engine.add_request("Is the sky blue? Answer yes or no.", greedy(max_tokens, grammar=YES_NO))
    c.run(trace=True)
    evs = c.of(sid)
    res = engine.result(sid)
    assert res.text in ("yes", "no")
    # "yes"/"no" are one token each here: the grammar completes on the prefill step, before max_tokens could
    assert len(evs) == 1 and evs[0].finish_reason == "grammar" and evs[0].phase == "prefill"


def test_abort_between_steps(engine):
    c = Checked(engine)
    a = engine.add_request("Name three planets.", greedy(30, ignore_eos=True))
    b = engine.add_request("What is 2 + 2?", greedy(6, ignore_eos=True))
    c.step()
    c.step()
    c.abort(a)
    c.abort(a)  # twice: nothing changes
    rest = c.run()
    assert all(e.seq(a) is None for e in rest) and all(a not in e.running + e.waiting for e in rest)
    assert engine.seq_view(a).finish_reason == "abort" and engine.seq_view(b).finish_reason == "length"
    assert a not in [sid for e in c.events for sid in e.finished]  # an abort is no step's finishing
    c.abort(b)  # an already finished one keeps its reason
    assert engine.seq_view(b).finish_reason == "length"


def test_abort_while_waiting_and_mid_prefill(base_engine):
    eng = small(base_engine, max_num_batched_tokens=8, max_num_seqs=1)
    c = Checked(eng)
    a = eng.add_request("Explain photosynthesis in simple words for a child who is seven.", greedy(3))
    b = eng.add_request("Name three planets.", greedy(2))
    c.step()  # a's first chunk; b waits (one seat)
    assert c.events[-1].seq(a).new_token is None and b in c.events[-1].waiting
    c.abort(b)  # waiting
    c.abort(a)  # half prefilled
    assert not eng.has_unfinished()
    assert c.step().idle
    assert eng.blocks.stats()["used"] == 0


def test_forced_eos_finishes_with_eos(engine):
    c = Checked(engine)
    sid = engine.add_request("Name three planets.", greedy(10))
    c.step()
    engine.force_token(sid, next(iter(engine.eos_ids)))
    ev = c.step(trace=True).seq(sid)
    assert ev.forced and ev.finished and ev.finish_reason == "eos"
    assert not engine.has_unfinished()


def test_chunked_prefill_finishing_on_its_last_chunk(base_engine):
    eng = small(base_engine, max_num_batched_tokens=8)
    c = Checked(eng)
    a = eng.add_request("Explain photosynthesis in simple words for a child who is seven years old.", greedy(1))
    b = eng.add_request(EOS_PROMPT, greedy(5), chat=False)  # EOS first, after its own chunks
    c.run(trace=True)
    for sid, reason in ((a, "length"), (b, "eos")):
        evs = c.of(sid)
        assert len(evs) >= 2, "the prompt should take several chunks"
        assert all(e.new_token is None and not e.finished and e.phase == "prefill" for e in evs[:-1])
        assert evs[-1].new_token is not None and evs[-1].finished and evs[-1].finish_reason == reason
        assert evs[-1].phase == "prefill"


def test_prefix_hit_then_finishing_on_the_prefill_step(engine):
    ids = engine.encode("Write a haiku about the sea, please, in English. Then explain it to me.").token_ids
    ids = list(ids)[:33]  # two full blocks of 16 and one token more
    assert len(ids) == 33
    c = Checked(engine)
    first = engine.add_request(prompt_ids=ids, params=greedy(2))
    c.run()
    second = engine.add_request(prompt_ids=ids, params=greedy(1))
    (event,) = c.run(trace=True)
    ev = event.seq(second)
    assert ev.num_cached_tokens == 32 and ev.num_processed == 1
    assert ev.finished and ev.finish_reason == "length"
    assert engine.result(second).token_ids == engine.result(first).token_ids[:1]


def test_stop_token_ids_on_the_prefill_step_and_mid_output(engine):
    ref = engine.generate("Name three planets.", greedy(8, ignore_eos=True))
    first, later = ref.token_ids[0], ref.token_ids[4]
    c = Checked(engine)
    a = engine.add_request("Name three planets.", greedy(8, stop_token_ids=(first,)))
    b = engine.add_request("Name three planets.", greedy(8, stop_token_ids=(later,)))
    events = c.run(trace=True)
    assert events[0].finished == [a] and events[0].seq(a).finish_reason == "stop"
    k = ref.token_ids.index(later)
    assert [e.finished for e in c.of(b)] == [False] * k + [True] and c.of(b)[-1].finish_reason == "stop"
    # EOS named in stop_token_ids ends it as a stop token
    d = engine.add_request(EOS_PROMPT, greedy(4, stop_token_ids=tuple(engine.eos_ids)), chat=False)
    (event,) = c.run()
    assert event.finished == [d] and event.seq(d).finish_reason == "stop"


def test_min_tokens_holds_eos_back(engine):
    c = Checked(engine)
    sid = engine.add_request(EOS_PROMPT, greedy(8, min_tokens=3), chat=False)
    c.run(trace=True)
    evs = c.of(sid)
    assert len(evs) >= 3 and not any(e.finished for e in evs[:2])
    assert evs[-1].finished and evs[-1].finish_reason in ("eos", "length")


def test_prompt_logprobs_with_chunks_finishing_on_the_last(base_engine):
    eng = small(base_engine, max_num_batched_tokens=8)
    c = Checked(eng)
    sid = eng.add_request("Name three planets.", greedy(1, prompt_logprobs=1))
    c.run()
    evs = c.of(sid)
    assert len(evs) >= 4 and all(e.new_token is None for e in evs[:-1])
    assert evs[-1].finished and evs[-1].finish_reason == "length"


# ---- speculative rounds that end mid-draft --------------------------------------------------------------------

def _spec_run(engine, params, cfg):
    c = Checked(engine)
    sid = engine.add_request(REPEAT, params, speculative=cfg)
    c.run(trace=True)
    return c, sid


@pytest.fixture(scope="module")
def repeat_ref(base_engine):
    return small(base_engine).generate(REPEAT, greedy(20))


def test_speculative_round_reaching_max_tokens(engine, repeat_ref):
    # the n-gram drafter copies the prompt: a round accepts several drafts; put max_tokens at the end of one
    probe = engine.session()
    c0, sid0 = _spec_run(probe, greedy(20), SpeculativeConfig("ngram", 4))
    n = 0
    for e in c0.of(sid0):
        n += 1 if e.spec is None else e.spec.num_emitted
        if e.spec is not None and e.spec.num_emitted >= 3:
            break
    else:
        pytest.fail("no round accepted two drafts or more")
    c, sid = _spec_run(engine, greedy(n), SpeculativeConfig("ngram", 4))
    last = c.of(sid)[-1]
    assert last.finished and last.finish_reason == "length" and last.spec is not None
    assert last.spec.num_emitted >= 3 and len(engine.result(sid).token_ids) == n
    assert engine.result(sid).token_ids == repeat_ref.token_ids[:n]


def test_speculative_round_cut_by_a_stop_string(engine, repeat_ref):
    # " fox" sits inside a run of accepted drafts (" brown fox jumps over ..."): the round is cut there
    c, sid = _spec_run(engine, greedy(20, stop=(" fox",)), SpeculativeConfig("ngram", 4))
    last = c.of(sid)[-1]
    assert last.finished and last.finish_reason == "stop" and last.spec is not None
    assert last.spec.truncated and last.spec.num_emitted < last.spec.num_accepted + 1
    assert "fox" not in engine.result(sid).text and engine.result(sid).text.endswith("brown")


def test_speculative_round_cut_by_a_stop_token(engine, repeat_ref):
    fox = next(t for t in repeat_ref.token_ids if engine.token_text(t) == " fox")  # inside an accepted round
    c, sid = _spec_run(engine, greedy(20, stop_token_ids=(fox,)), SpeculativeConfig("ngram", 4))
    last = c.of(sid)[-1]
    assert last.finished and last.finish_reason == "stop" and last.spec is not None and last.spec.truncated
    assert engine.result(sid).token_ids == repeat_ref.token_ids[: repeat_ref.token_ids.index(fox) + 1]


def test_speculative_round_cut_by_eos_in_the_drafts(engine, repeat_ref):
    # the chat template after the prompt's last sentence gives the n-gram drafter "<|im_end|>" to draft
    assert repeat_ref.finish_reason == "eos"
    c, sid = _spec_run(engine, greedy(40), SpeculativeConfig("ngram", 4))
    last = c.of(sid)[-1]
    assert last.finished and last.finish_reason == "eos" and last.spec is not None
    assert engine.result(sid).token_ids == repeat_ref.token_ids


def test_early_exit_rounds_finish_consistently(engine):
    c = Checked(engine)
    ids = [engine.add_request(q, greedy(n, ignore_eos=True), speculative=SpeculativeConfig("early_exit", 2))
           for q, n in zip(QUESTIONS[:3], (1, 3, 5))]
    c.run(trace=True)
    assert [engine.seq_view(i).finish_reason for i in ids] == ["length"] * 3
    assert any(e.spec is not None and e.spec.num_drafted for i in ids for e in c.of(i))


def test_speculative_with_a_grammar(engine):
    c = Checked(engine)
    sid = engine.add_request("Is the sky blue? Answer yes or no.", greedy(6, grammar=YES_NO),
                             speculative=SpeculativeConfig("ngram", 3))
    c.run(trace=True)
    assert engine.seq_view(sid).finish_reason == "grammar"


# ---- many at once ------------------------------------------------------------------------------------------

def test_a_batch_finishing_on_different_steps(engine):
    c = Checked(engine)
    reqs = [("Name three planets.", greedy(1)), (EOS_PROMPT, greedy(6)), ("What is 2 + 2?", greedy(3, ignore_eos=True)),
            ("Is the sky blue? Answer yes or no.", greedy(5, grammar=YES_NO)),
            ("Write a haiku about the sea, please, in English.", greedy(7, ignore_eos=True)),
            ("Hi!", SamplingParams(max_tokens=5, temperature=0.9, seed=3, ignore_eos=True))]
    ids = [engine.add_request(p, sp, chat=p != EOS_PROMPT) for p, sp in reqs]
    events = c.run(trace=True)
    assert len(events[0].seqs) == len(ids)  # really batched
    finish_step = {sid: i for i, e in enumerate(events) for sid in e.finished}
    assert set(finish_step) == set(ids)
    assert len(set(finish_step.values())) >= 4  # they left on different steps
    assert [engine.seq_view(i).finish_reason for i in ids] == ["length", "eos", "length", "grammar", "length",
                                                              "length"]
    # a late arrival joins a running batch and finishes with it
    x = engine.add_request("Name three planets.", greedy(2))
    y = engine.add_request("What is 2 + 2?", greedy(4, ignore_eos=True))
    c.step()
    z = engine.add_request("Hi!", greedy(1))
    c.run()
    assert [engine.seq_view(i).finish_reason for i in (x, y, z)] == ["length"] * 3


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_under_a_tiny_pool(base_engine, caching):
    # 6 blocks of 16 tokens: "Hi!" (32 prompt tokens) and "Name three planets." (34) both run until the second
    # needs a fourth block at 49 tokens and preempts itself. Readmitted, the step that recomputes it samples its
    # last token: a whole-prompt prefill without prefix caching, one token after a 48-token hit with it
    reqs = [("Hi!", 20), ("Name three planets.", 16), ("What is 2 + 2?", 1)]
    eng = small(base_engine, blocks=6, enable_prefix_caching=caching)
    c = Checked(eng)
    ids = [eng.add_request(q, greedy(n, ignore_eos=True)) for q, n in reqs]
    events = c.run()
    preempted = [sid for e in events for sid in e.preempted]
    assert preempted == [ids[1]]
    assert [eng.seq_view(i).finish_reason for i in ids] == ["length"] * 3
    last = c.of(ids[1])[-1]
    assert last.finished and last.finish_reason == "length"
    assert any(ids[1] in e.admitted and ids[1] in e.finished for e in events)  # finished on its readmission
    if caching:
        assert (last.num_cached_tokens, last.chunk_start, last.num_processed) == (48, 48, 1)
    else:
        assert (last.phase, last.chunk_start, last.num_processed) == ("prefill", 0, 34 + 15)
    assert eng.blocks.stats()["used"] == 0
    ref = small(base_engine)
    assert [eng.result(i).token_ids for i in ids] == [ref.generate(q, greedy(n, ignore_eos=True)).token_ids
                                                      for q, n in reqs]


def test_rewound_and_branched_sequences_finish_again(engine):
    c = Checked(engine)
    sid = engine.add_request("Name three planets.", greedy(4, ignore_eos=True))
    c.run()
    assert engine.seq_view(sid).finish_reason == "length"
    out = engine.result(sid).token_ids
    c.rewind(sid, 1)  # a finished sequence runs again and finishes again
    c.run(trace=True)
    assert engine.seq_view(sid).finish_reason == "length" and engine.result(sid).token_ids == out
    child = engine.branch(sid, 2, greedy(3, ignore_eos=True))
    c.run()
    assert engine.seq_view(child).finish_reason == "length" and engine.result(child).token_ids == out[:3]
    # a running sequence rewound mid-decode, then one branched from it while it runs
    run_id = engine.add_request("What is 2 + 2?", greedy(5, ignore_eos=True))
    c.step()
    c.step()
    c.rewind(run_id, 1)
    kid = engine.branch(run_id, 1, greedy(2, ignore_eos=True))
    c.run()
    assert engine.seq_view(run_id).finish_reason == "length" and engine.seq_view(kid).finish_reason == "length"


# ---- trace or not, step or generate or stream: the same ending ----------------------------------------------

AGREE = [  # (name, prompt, params, chat, speculative method, the ending expected)
    ("length_on_prefill", "Name three planets.", dict(max_tokens=1, temperature=0.8, seed=11), True, None, "length"),
    ("eos_first", EOS_PROMPT, dict(max_tokens=8, temperature=0.0), False, None, "eos"),
    ("length", "Hi!", dict(max_tokens=5, temperature=1.0, seed=5, ignore_eos=True), True, None, "length"),
    ("stop", "Name three planets.", dict(max_tokens=24, temperature=0.7, seed=2, stop=("\n", ",")), True, None,
     "stop"),
    ("grammar", "Is the sky blue? Answer yes or no.", dict(max_tokens=4, temperature=1.0, seed=9, grammar=YES_NO),
     True, None, "grammar"),
    ("ngram_stop", REPEAT, dict(max_tokens=20, temperature=0.0, stop=(" fox",)), True, "ngram", "stop"),
    ("early_exit_length", "What is 2 + 2?", dict(max_tokens=4, temperature=0.6, seed=4, ignore_eos=True), True,
     "early_exit", "length"),
]


@pytest.mark.parametrize("case", AGREE, ids=[a[0] for a in AGREE])
def test_trace_step_generate_and_stream_agree(base_engine, case):
    _, prompt, kw, chat, method, expected = case

    def spec():
        return None if method is None else SpeculativeConfig(method, 3)

    outs = {}
    for trace in (True, False):
        eng = small(base_engine)
        c = Checked(eng, roundtrip=False)
        sid = eng.add_request(prompt, SamplingParams(**kw), chat=chat, speculative=spec())
        c.run(trace=trace)
        last = c.of(sid)[-1]
        assert last.finished and last.finish_reason == eng.seq_view(sid).finish_reason
        r = eng.result(sid)
        outs[f"step(trace={trace})"] = (r.finish_reason, r.token_ids, r.text)
    r = small(base_engine).generate(prompt, SamplingParams(**kw), chat=chat, speculative=spec())
    outs["generate"] = (r.finish_reason, r.token_ids, r.text)
    eng = small(base_engine)
    text = "".join(eng.stream(prompt, SamplingParams(**kw), chat=chat, speculative=spec()))
    (sid,) = eng.seq_ids()
    v = eng.seq_view(sid)
    outs["stream"] = (v.finish_reason, list(v.output_ids), text)
    assert len(set(map(repr, outs.values()))) == 1, outs
    assert outs["generate"][0] == expected


# ---- random mixes ------------------------------------------------------------------------------------------

STOPS = [".", ",", "\n", " the", "a", "ing", " and"]
STOP_TOKENS = [".", ",", " the", "\n", " I"]
PROMPTS = [("Name three planets.", True), (EOS_PROMPT, False), ("Hi!", True), ("What is 2 + 2?", True),
           ("Explain photosynthesis in simple words.", True), (REPEAT, True), ("The capital of France is", False)]


@st.composite
def requests(draw):
    prompt, chat = draw(st.sampled_from(PROMPTS))
    max_tokens = draw(st.integers(1, 6))
    params = dict(  # SamplingParams, stop_token_ids as texts (made ids in the test: the tokenizer is needed)
        max_tokens=max_tokens, temperature=draw(st.sampled_from([0.0, 0.7, 1.0, 1.5])),
        seed=draw(st.integers(0, 2**31 - 1)), stop=tuple(draw(st.lists(st.sampled_from(STOPS), max_size=2,
                                                                         unique=True))),
        ignore_eos=draw(st.booleans()), grammar=YES_NO if draw(st.integers(0, 4)) == 0 else None,
        stop_token_ids=tuple(draw(st.lists(st.sampled_from(STOP_TOKENS), max_size=2, unique=True))),
        min_tokens=draw(st.integers(0, max_tokens)) if draw(st.integers(0, 3)) == 0 else 0)
    spec = SpeculativeConfig("ngram", draw(st.integers(1, 4))) if draw(st.integers(0, 3)) == 0 else None
    arrival = draw(st.integers(0, 3))  # the step before which it arrives
    return prompt, chat, params, spec, arrival


def _one_token(eng, text: str) -> int:
    (tid,) = eng.tokenizer.encode(text, add_special_tokens=False)
    return tid


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(requests(), min_size=1, max_size=4),
       budget=st.sampled_from([512, 512, 16, 8]), tiny_pool=st.booleans(),
       aborts=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), max_size=3),
       traces=st.lists(st.booleans(), min_size=1, max_size=8))
def test_random_mixes_keep_every_event_consistent(base_engine, reqs, budget, tiny_pool, aborts, traces):
    # a tiny pool (5 blocks of 16 tokens: two of the chat prompts fill it) preempts and makes requests wait
    eng = small(base_engine, blocks=5 if tiny_pool else 64, max_num_batched_tokens=budget)
    c = Checked(eng)
    ids: list[int] = []
    step = 0
    while step < 200:
        for prompt, chat, kw, spec, arrival in reqs:
            if arrival == step:
                stop_ids = tuple(_one_token(eng, t) for t in kw["stop_token_ids"])
                params = SamplingParams(**{**kw, "stop_token_ids": stop_ids})
                ids.append(eng.add_request(prompt, params, chat=chat, speculative=spec))
        for at, which in aborts:
            if at == step and which < len(ids):
                c.abort(ids[which])
        if not eng.has_unfinished() and step > max(r[4] for r in reqs):
            break
        c.step(trace=traces[step % len(traces)])
        step += 1
    assert not eng.has_unfinished() and len(ids) == len(reqs)
    ended = {sid for e in c.events for sid in e.finished}
    for sid in ids:
        view = eng.seq_view(sid)
        assert view.status == "finished"
        assert (sid in ended) == (view.finish_reason != "abort"), (sid, view.finish_reason)
        assert [e.seq_id for e in c.events for e in e.seqs if e.finished and e.seq_id == sid] == \
               ([sid] if sid in ended else [])
    assert eng.blocks.stats()["used"] == 0
