"""Owners on one engine (tabs of a room): shared steps, held sequences, release, round-robin admission, the fair
prefill share, preemption of the greediest owner, for_owner, set_params and queue_position. Real model, no mocks;
every expectation is checked against the engine's own output (a solo run in a fresh session, the plain FIFO
policy of a single-owner engine)."""
import pytest

from engine import SamplingParams

A, B, C = "tab 1", "tab 2", "tab 3"


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def seeded(n, seed):
    return SamplingParams(max_tokens=n, temperature=1.0, seed=seed, ignore_eos=True)


def run(eng, owners=None, trace=False):
    events = []
    while eng.has_unfinished():
        events.append(eng.step(trace=trace, owners=owners))
    return events


_SOLO: dict = {}


def solo(base_engine, params, prompt=None, prompt_ids=None):
    """The tokens a request gets alone in a fresh session (remembered: several tests ask for the same run)."""
    key = (repr(params), prompt, None if prompt_ids is None else tuple(prompt_ids))
    if key not in _SOLO:
        eng = base_engine.session(kv_memory=64 * 16 * base_engine.kv_bytes_per_token)
        sid = eng.add_request(prompt, params, chat=False, prompt_ids=prompt_ids, owner="solo")
        run(eng)
        _SOLO[key] = eng.result(sid).token_ids
    return list(_SOLO[key])


def distinct_ids(base_engine, word, n):
    """n prompt token ids starting with `word` (distinct first blocks: no prefix-cache hits between prompts)."""
    ids = base_engine.encode(" ".join(f"{word} {i}," for i in range(n)), chat=False).token_ids
    assert len(ids) >= n
    return list(ids[:n])


def batch_ids(event, phase=None):
    return {x["seq_id"] for x in event.batch if phase is None or x["phase"] == phase}


@pytest.mark.parametrize("params", [(greedy(4), greedy(4)), (seeded(4, 11), seeded(4, 22))],
                         ids=["greedy", "seeded"])
def test_two_owners_decode_in_one_step_and_get_their_solo_tokens(base_engine, params):
    pa, pb = params
    eng = base_engine.session()
    a = eng.add_request("The capital of France is", pa, chat=False, owner=A)
    b = eng.add_request("Ten green bottles hanging on the wall,", pb, chat=False, owner=B)
    events = run(eng, owners={A, B})
    assert batch_ids(events[0], "prefill") == {a, b}  # prefilled together
    shared = [e for e in events if batch_ids(e, "decode") == {a, b}]
    assert len(shared) == 3  # 4 tokens each: one from the prefill, three from decode steps they shared
    for e in shared:
        assert {s.seq_id for s in e.seqs} == {a, b}
        assert e.owners[a] == A and e.owners[b] == B
        assert {x["owner"] for x in e.batch} == {A, B}
    assert eng.result(a).token_ids == solo(base_engine, pa, "The capital of France is")
    assert eng.result(b).token_ids == solo(base_engine, pb, "Ten green bottles hanging on the wall,")
    assert eng.blocks.stats()["used"] == 0


def test_held_sequence_keeps_its_blocks_and_place_then_continues_as_if_never_held(base_engine):
    eng = base_engine.session()
    pa, pb, pc = "Once upon a time there was", "The best way to learn a language is", "Water boils at"
    a = eng.add_request(pa, greedy(9), chat=False, owner=A)
    b = eng.add_request(pb, greedy(4), chat=False, owner=B)
    first = eng.step(trace=False, owners={A, B})
    assert batch_ids(first) == {a, b}
    c = eng.add_request(pc, greedy(3), chat=False, owner=C)  # held while still waiting
    held_b, table_b = eng.seq_view(b), list(first.block_tables[b])
    assert held_b.status == "running" and held_b.num_blocks == len(table_b) > 0
    for _ in range(6):
        ev = eng.step(trace=False, owners={A})
        assert batch_ids(ev) == {a} and {s.seq_id for s in ev.seqs} == {a}
        assert ev.block_tables[b] == table_b and b in ev.running  # held, not preempted
        assert ev.waiting == [c] and eng.queue_position(c) == 0
    assert eng.seq_view(b) == held_b  # not one token, computed position or block moved
    assert eng.seq_view(c).num_blocks == 0 and eng.seq_view(c).status == "waiting"
    assert eng.has_unfinished(B) and eng.has_unfinished(C)
    run(eng)  # everyone again
    assert eng.result(a).token_ids == solo(base_engine, greedy(9), pa)
    assert eng.result(b).token_ids == solo(base_engine, greedy(4), pb)
    assert eng.result(c).token_ids == solo(base_engine, greedy(3), pc)


def test_release_frees_blocks_at_once_and_forgets_the_sequence(base_engine):
    eng = base_engine.session()
    pa = "Photosynthesis is the process by which"
    a = eng.add_request(pa, greedy(5), chat=False, owner=A)
    b = eng.add_request("Seventeen sailors sang songs about the sea while", greedy(20), chat=False, owner=B)
    for _ in range(2):
        eng.step(trace=False)
    nb, used = eng.seq_view(b).num_blocks, eng.blocks.stats()["used"]
    assert nb > 0 and eng.blocks.block_tables[b]
    eng.release([b, 999])  # an unknown id is skipped
    assert eng.blocks.stats()["used"] == used - nb  # at once, not at the next step
    assert b not in eng.blocks.block_tables
    assert b not in eng.scheduler.running and b not in [s.seq_id for s in eng.scheduler.waiting]
    with pytest.raises(ValueError, match="not a sequence"):
        eng.seq_view(b)
    assert eng.seq_ids() == [a] and eng.seq_ids(B) == [] and not eng.has_unfinished(B)
    events = run(eng)
    assert all(b not in e.owners and b not in batch_ids(e) for e in events)
    assert eng.result(a).token_ids == solo(base_engine, greedy(5), pa)
    eng.release([a])  # a finished sequence is forgotten too
    assert eng.seq_ids() == [] and eng.blocks.stats()["used"] == 0
    eng.blocks.check_invariants()


def _admissions(eng):
    order = []
    for e in run(eng):
        order += e.admitted
    return order


def test_round_robin_admission_within_a_step(base_engine):
    """Two seats: owner A's three earlier requests do not both take them; B's single one gets the second."""
    orders = {}
    for owner_b in (B, A):  # the second run: one owner, plain FIFO
        eng = base_engine.session(max_num_seqs=2)
        a = [eng.add_request(f"Apples number {i} are", greedy(2), chat=False, owner=A) for i in range(3)]
        b = eng.add_request("Bananas are", greedy(2), chat=False, owner=owner_b)
        # queue_position counts the requests admitted before it: B's goes second, one owner's fourth
        assert eng.queue_position(b) == (1 if owner_b == B else 3)
        orders[owner_b] = _admissions(eng)
    assert orders[B][:2] == [a[0], b]
    assert orders[A][:2] == [a[0], a[1]]  # with one owner: arrival order
    assert sorted(orders[B]) == sorted(orders[A]) == [*a, b]


def test_round_robin_admission_across_steps(base_engine):
    eng = base_engine.session(max_num_seqs=1)
    a = [eng.add_request(f"Apples number {i} are", greedy(2), chat=False, owner=A) for i in range(3)]
    b = eng.add_request("Bananas are", greedy(2), chat=False, owner=B)
    order = _admissions(eng)
    assert order.index(b) < order.index(a[2])  # observed: [a0, a1, a2, b]


def _chunks(events):
    """Per step, seq id -> tokens processed, for the steps that prefilled something."""
    return [{x["seq_id"]: x["num_processed"] for x in e.batch} for e in events
            if any(x["phase"] == "prefill" for x in e.batch)]


def test_prefill_share_splits_the_budget_between_owners(base_engine):
    ids_a, ids_b = distinct_ids(base_engine, "apple", 100), distinct_ids(base_engine, "pear", 100)
    eng = base_engine.session(max_num_batched_tokens=64)
    a = eng.add_request(prompt_ids=ids_a, params=greedy(2), owner=A)
    b = eng.add_request(prompt_ids=ids_b, params=greedy(2), owner=B)
    chunks = _chunks(run(eng, owners={A, B}))
    # both progress in every step, with equal chunks of half the budget, until their prompts end together
    assert chunks == [{a: 32, b: 32}] * 3 + [{a: 4, b: 4}]
    assert eng.result(a).token_ids == solo(base_engine, greedy(2), prompt_ids=ids_a)
    assert eng.result(b).token_ids == solo(base_engine, greedy(2), prompt_ids=ids_b)


def test_prefill_share_with_one_owner_is_the_plain_chunking(base_engine):
    ids_a, ids_b = distinct_ids(base_engine, "apple", 100), distinct_ids(base_engine, "pear", 100)
    got = {}
    for owner in ("", A):  # "": a single-user engine, the policy as it was before owners
        eng = base_engine.session(max_num_batched_tokens=64)
        a = eng.add_request(prompt_ids=ids_a, params=greedy(2), owner=owner)
        b = eng.add_request(prompt_ids=ids_b, params=greedy(2), owner=owner)
        got[owner] = _chunks(run(eng))
    assert got[A] == got[""]
    assert got[A][0] == {a: 64}  # the whole budget to the first prompt
    assert got[A][1] == {a: 36, b: 28}  # then first-come first-served
    # a held owner's prompt does not shrink the share of the owner that runs
    eng = base_engine.session(max_num_batched_tokens=64)
    a = eng.add_request(prompt_ids=ids_a, params=greedy(2), owner=A)
    b = eng.add_request(prompt_ids=ids_b, params=greedy(2), owner=B)
    assert _chunks([eng.step(trace=False, owners={A})]) == [{a: 64}]
    assert eng.seq_view(b).status == "waiting"


def _preemption_run(base_engine, owner_a, owner_b):
    """A pool of 6 blocks of 16: A's two 30-token prompts, then B's 20-token one, fill it; A's growth past 32
    tokens needs a seventh block."""
    ids = [distinct_ids(base_engine, "apple", 30), distinct_ids(base_engine, "pear", 30),
           distinct_ids(base_engine, "plum", 20)]
    eng = base_engine.session(kv_memory=6 * 16 * base_engine.kv_bytes_per_token)
    a0 = eng.add_request(prompt_ids=ids[0], params=greedy(4), owner=owner_a)
    a1 = eng.add_request(prompt_ids=ids[1], params=greedy(4), owner=owner_a)
    first = eng.step(trace=False)
    b0 = eng.add_request(prompt_ids=ids[2], params=greedy(4), owner=owner_b)  # the newest sequence
    assert first.admitted == [a0, a1]
    found = None  # (blocks per owner, running ids, preempted) at the first step that preempted
    while eng.has_unfinished():
        held = {}  # blocks each owner's running sequences hold before the step
        for sid in eng.seq_ids():
            view = eng.seq_view(sid)
            if view.status == "running":
                held[view.owner] = held.get(view.owner, 0) + view.num_blocks
        running = [s.seq_id for s in eng.scheduler.running]
        ev = eng.step(trace=False)
        if ev.preempted and found is None:
            found = (held, running, ev.preempted)
    outputs = [eng.result(s).token_ids for s in (a0, a1, b0)]
    solos = [solo(base_engine, greedy(4), prompt_ids=p) for p in ids]
    return (a0, a1, b0), found, outputs, solos


def test_preemption_takes_the_newest_sequence_of_the_owner_holding_most_blocks(base_engine):
    (a0, a1, b0), first, outputs, solos = _preemption_run(base_engine, A, B)
    assert first is not None, "the pool never filled"
    held, running, preempted = first
    assert running[-1] == b0  # B's is the newest running sequence...
    assert held[A] > held[B]
    assert preempted == [a1]  # ...but A holds more blocks: A's newest goes
    assert outputs == solos  # recomputed to the same tokens


def test_preemption_with_one_owner_takes_the_newest(base_engine):
    (a0, a1, b0), first, outputs, solos = _preemption_run(base_engine, A, A)
    assert first is not None
    assert first[2] == [b0]
    assert outputs == solos


def test_a_held_sequence_preempted_under_pool_pressure_recomputes_to_its_solo_tokens(base_engine):
    """Current policy: held sequences keep their blocks unless the pool runs out; then the victim may be a held
    one (held sequences are candidates in Scheduler._victim). It must come back to the same tokens."""
    ids_a, ids_b = distinct_ids(base_engine, "apple", 30), distinct_ids(base_engine, "pear", 30)
    eng = base_engine.session(kv_memory=4 * 16 * base_engine.kv_bytes_per_token)  # A and B fill it
    a = eng.add_request(prompt_ids=ids_a, params=greedy(5), owner=A)
    b = eng.add_request(prompt_ids=ids_b, params=greedy(5), owner=B)
    eng.step(trace=False)
    held_b = eng.seq_view(b)
    events = [eng.step(trace=False, owners={A}) for _ in range(3)]  # A's third token needs a third block
    assert all(b not in batch_ids(e) for e in events)
    assert [e.preempted for e in events] == [[], [], [b]]
    assert eng.seq_view(b).status == "waiting" and eng.seq_view(b).num_blocks == 0
    assert eng.seq_view(b).output_ids == held_b.output_ids  # its token stays; its KV is recomputed later
    run(eng)
    assert eng.result(a).token_ids == solo(base_engine, greedy(5), prompt_ids=ids_a)
    assert eng.result(b).token_ids == solo(base_engine, greedy(5), prompt_ids=ids_b)


def test_for_owner_shows_only_its_own_sequences_but_the_whole_batch(base_engine):
    eng = base_engine.session()
    a = eng.add_request("Rain falls on", greedy(3), chat=False, owner=A)
    b = eng.add_request("Snow covers the", greedy(3), chat=False, owner=B)
    c = eng.add_request("Wind blows over", greedy(3), chat=False, owner=C)
    eng.step(trace=True)  # all three hold blocks now
    ev = eng.step(trace=True, owners={A, B})  # C held
    assert {s.seq_id for s in ev.seqs} == {a, b} and set(ev.block_tables) == {a, b, c}
    for owner, mine, others in ((A, a, {b, c}), (B, b, {a, c}), (C, c, {a, b})):
        share = ev.for_owner(owner)
        assert all(share.owners[s.seq_id] == owner for s in share.seqs)
        assert [s.seq_id for s in share.seqs] == ([mine] if mine in (a, b) else [])
        assert set(share.block_tables) == {mine}
        assert not others & {s.seq_id for s in share.seqs} and not others & set(share.block_tables)
        assert share.batch == ev.batch and batch_ids(share) == {a, b}  # everyone in the step, in brief
        assert share.owners == ev.owners == {a: A, b: B, c: C}
        # nothing of another's tokens travels in a share: only their ids, phases, counts and grammar kind in `batch`
        assert all(set(x) == {"seq_id", "owner", "phase", "num_processed", "num_drafted", "num_emitted", "grammar"}
                   for x in share.batch)
    assert {s.seq_id for s in ev.seqs} == {a, b}  # the event itself is untouched
    assert ev.for_owner("nobody").seqs == [] and ev.for_owner("nobody").block_tables == {}


def test_set_params_validates_refuses_a_finished_sequence_and_applies_from_the_next_token(base_engine):
    eng = base_engine.session(kv_memory=8 * 16 * base_engine.kv_bytes_per_token)
    prompt = "Once upon a time"
    s = eng.add_request(prompt, seeded(6, 5), chat=False, owner=A)
    for _ in range(3):
        eng.step(trace=False)
    before = eng.seq_view(s)
    with pytest.raises(TypeError):
        eng.set_params(s, {"temperature": 0.0})
    bad = SamplingParams()
    bad.temperature = -1.0
    with pytest.raises(ValueError, match="temperature"):
        eng.set_params(s, bad)
    with pytest.raises(ValueError, match="kv_memory"):
        eng.set_params(s, greedy(1000))  # beyond the 8-block pool
    with pytest.raises(ValueError, match="not a sequence"):
        eng.set_params(999, greedy(6))
    assert eng.seq_view(s) == before  # refusals change nothing
    prefix = list(before.output_ids)
    assert len(prefix) == 3
    eng.set_params(s, greedy(6))
    assert eng.seq_view(s).params == greedy(6)
    run(eng)
    out = eng.result(s).token_ids
    assert out[:3] == prefix  # tokens already sampled stay
    # from the next token on: the greedy continuation of the prompt and the sampled prefix
    ids = list(before.prompt_ids) + prefix
    assert out[3:] == solo(base_engine, greedy(3), prompt_ids=ids)
    with pytest.raises(ValueError, match="finished"):
        eng.set_params(s, greedy(6))


def test_set_params_stop_strings_take_effect(base_engine):
    prompt = "Count: one, two, three,"
    full = base_engine.session().generate(prompt, greedy(8), chat=False).text
    stop = full.split()[2]  # a word the continuation is known to reach
    eng = base_engine.session()
    s = eng.add_request(prompt, greedy(8), chat=False)
    eng.step(trace=False)
    eng.set_params(s, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop=(stop,)))
    run(eng)
    assert eng.result(s).finish_reason == "stop"


def test_set_params_max_tokens_below_the_output_generates_no_more(base_engine):
    eng = base_engine.session()
    s = eng.add_request("Once upon a time", greedy(10), chat=False)
    for _ in range(4):
        eng.step(trace=False)
    try:
        eng.set_params(s, greedy(2))
    except ValueError:
        return  # refusing is a fix too
    run(eng)
    assert len(eng.result(s).token_ids) <= 4


def test_queue_position_counts_the_requests_ahead(base_engine):
    eng = base_engine.session(max_num_seqs=1)
    ids = [eng.add_request(p, greedy(2), chat=False, owner=A) for p in ("Red is", "Blue is", "Green is")]
    assert [eng.queue_position(s) for s in ids] == [0, 1, 2]
    ev = eng.step(trace=False)
    assert ev.admitted == [ids[0]]
    assert [eng.queue_position(s) for s in ids] == [None, 0, 1]  # running: not waiting
    late = eng.add_request("Gold is", greedy(2), chat=False, owner=B)
    assert eng.queue_position(late) == 0  # B has not had a turn yet: it goes before A's second and third
    eng.step(trace=False, owners={B})  # A held: B's request takes no seat from A's running one
    assert eng.queue_position(late) is None and [eng.queue_position(s) for s in ids[1:]] == [0, 1]
    run(eng)
    assert all(eng.queue_position(s) is None for s in (*ids, late))
    with pytest.raises(ValueError, match="not a sequence"):
        eng.queue_position(999)
