"""The room: one shared engine for every tab (app/room.py), seen through the tabs' sessions.

Real model, real paged KV, real threads: each tab steps from its own thread as the web server's handlers do.
"""
import threading

import pytest

from app.room import RoomLimits
from app.session import LabSession, new_room
from engine import SamplingParams, StepFailed

PROMPTS = ("What is gravity?", "Что такое гравитация?")


def _greedy(n=8):
    return SamplingParams(max_tokens=n, temperature=0.0)


def _alone(base_engine, prompt, params):
    """The tokens a request gets with an engine to itself."""
    return base_engine.session().generate(prompt, params).token_ids


def _both(sessions, fn):
    """Run fn(session) in one thread per session at once, as two tabs' handlers do; re-raise any failure."""
    errors = []

    def go(s):
        try:
            fn(s)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]


@pytest.fixture
def room(base_engine):
    r = new_room(base_engine, 32 * 2**20)
    yield r
    r.close()


@pytest.mark.parametrize("params", [_greedy(), SamplingParams(max_tokens=8, temperature=1.0, seed=7)],
                         ids=["greedy", "seeded"])
def test_two_tabs_share_each_step_and_get_what_they_get_alone(room, base_engine, params):
    a, b = LabSession.create(room), LabSession.create(room)
    for s, prompt in zip((a, b), PROMPTS):
        s.add_request(prompt, params, True, None)
    _both((a, b), lambda s: [None for _ in s.run_steps()])
    for s, prompt in zip((a, b), PROMPTS):
        assert list(s.focus_view().output_ids) == _alone(base_engine, prompt, params)
        assert s.focus_view().finished
    # some steps ran both tabs' sequences together; each tab's events hold only its own sequence
    shared = [e for e in a.events if len(e.batch) == 2]
    assert shared and {x["owner"] for x in shared[0].batch} == {a.owner, b.owner}
    assert all([x.seq_id for x in e.seqs] == [a.focus] for e in a.events)
    assert room.stats()["max_batch"] == 2


def test_a_held_sequence_is_never_scheduled_and_keeps_its_blocks(room, base_engine):
    a, b = LabSession.create(room), LabSession.create(room)
    a.add_request(PROMPTS[0], _greedy(12), True, None)
    b.add_request(PROMPTS[1], _greedy(12), True, None)
    b.step()  # b's prompt is in the pool now
    held = b.focus_view()
    table = room.engine.kv_block_states()
    mine = [x["id"] for x in table if b.focus in x["owners"]]
    for _ in range(5):
        ev = a.step()
        assert [x["owner"] for x in ev.batch] == [a.owner]  # b holds no grant: not in the step
    after = b.focus_view()
    assert after.output_ids == held.output_ids and after.num_computed == held.num_computed
    assert [x["id"] for x in room.engine.kv_block_states() if b.focus in x["owners"]] == mine
    while b.step() is not None:
        pass
    assert list(b.focus_view().output_ids) == _alone(base_engine, PROMPTS[1], _greedy(12))


def test_an_owner_over_its_cap_is_refused_while_others_proceed(base_engine):
    room = new_room(base_engine, 32 * 2**20, RoomLimits(max_seqs_per_owner=2))
    a, b = LabSession.create(room), LabSession.create(room)
    a.add_request("one", _greedy(), True, None)
    a.add_request("two", _greedy(), True, None)
    with pytest.raises(ValueError, match="unfinished sequences"):
        a.add_request("three", _greedy(), True, None)
    assert len(a.requests) == 2 and len(room.engine.seq_ids(a.owner)) == 2  # nothing half-added
    b.add_request(PROMPTS[0], _greedy(4), True, None)
    assert b.step() is not None and b.focus_view().num_computed > 0
    # KV blocks: one request whose worst case exceeds the owner's share of the pool
    blocks = room.max_blocks_per_owner * room.engine.block_size
    with pytest.raises(ValueError, match="KV blocks"):
        b.add_request("long", SamplingParams(max_tokens=blocks, temperature=0.0), True, None)
    room.close()


def test_closing_a_tab_frees_its_blocks_at_once(room):
    a, b = LabSession.create(room), LabSession.create(room)
    a.add_request(PROMPTS[0], _greedy(), True, None)
    b.add_request("Tell me about the Moon and its phases in detail.", _greedy(), True, None)
    _both((a, b), lambda s: s.step())
    b_blocks = {x["id"] for x in room.engine.kv_block_states() if b.focus in x["owners"]}
    assert room.engine.seq_view(a.focus).num_blocks > 0
    a.close()
    assert room.engine.seq_ids(a.owner) == []
    in_use = {x["id"] for x in room.engine.kv_block_states() if x["refcount"] > 0}
    assert in_use == b_blocks  # only b's blocks are still held
    with pytest.raises(ValueError, match="left the room"):
        a.add_request("again", _greedy(), True, None)


def test_an_owner_never_sees_steps_forces_or_rewinds_anothers_sequence(room):
    a, b = LabSession.create(room), LabSession.create(room)
    theirs = a.add_request(PROMPTS[0], _greedy(), True, None)
    a.step()
    a.step()
    before = room.engine.seq_view(theirs)
    b.add_request(PROMPTS[1], _greedy(), True, None)
    b.focus = theirs  # as if a hostile client could name it
    for act in (lambda: b.seq_view(theirs), lambda: b.force(5), lambda: b.rewind(0), lambda: b.branch(0),
                lambda: b.what_if_trace(_greedy())):
        with pytest.raises(ValueError, match="not one of"):
            act()
    ev = b.step()  # b's Step runs b's sequences only
    assert all(x["owner"] == b.owner for x in ev.batch)
    assert room.engine.seq_view(theirs) == before
    assert all(s.seq_id != theirs for e in b.events for s in e.seqs)
    assert theirs not in {k for e in b.events for k in e.block_tables}


def test_run_is_a_standing_grant_until_pause(room):
    a = LabSession.create(room)
    a.add_request(PROMPTS[0], _greedy(40), True, None)
    frames = 0
    for _ in a.run_steps():
        frames += 1
        if frames == 3:
            a.pause()
    n = len(a.focus_view().output_ids)
    assert 3 <= n < 40 and not a.running and not room.running(a.owner)
    assert room.engine.seq_view(a.focus).status == "running"  # paused: held, not finished
    assert len(a.events) == n  # every step that ran reached the tab, drawn or not


def test_a_failed_step_reaches_every_owner_in_it_and_undoes_itself(room, monkeypatch):
    a, b = LabSession.create(room), LabSession.create(room)
    a.add_request(PROMPTS[0], _greedy(), True, None)
    b.add_request(PROMPTS[1], _greedy(), True, None)
    _both((a, b), lambda s: s.step())
    before = (room.engine.seq_view(a.focus), room.engine.seq_view(b.focus))
    model = room.engine.model
    real = model.forward

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(model, "forward", broken)
    with pytest.raises(StepFailed, match="injected"):
        a.step()
    assert (room.engine.seq_view(a.focus), room.engine.seq_view(b.focus)) == before
    monkeypatch.setattr(model, "forward", real)
    assert a.step() is not None  # the room's loop lives on


def test_a_long_prompt_does_not_starve_a_short_one(base_engine):
    room = new_room(base_engine, 256 * 2**20)
    a, b = LabSession.create(room), LabSession.create(room)
    a.add_request("gravity " * 1400, _greedy(4), False, None)  # ~1,400 tokens: three steps of 512 alone
    b.add_request(PROMPTS[0], _greedy(4), True, None)
    def drive(s):  # Run (a standing grant) until the first token
        for _ in s.run_steps():
            if s.focus_view().output_ids:
                s.pause()
    _both((a, b), drive)
    first_token = {s.owner: next(e.step for e in s.events if e.seq(s.focus).new_token is not None) for s in (a, b)}
    # b's short prompt got its first token while a's long one was still being prefilled, in shared steps
    assert first_token[b.owner] < first_token[a.owner]
    shared = [r for r in room.records() if {x["owner"] for x in r["batch"]} == {a.owner, b.owner}]
    assert shared and all(x["num_processed"] <= 256 for x in shared[0]["batch"] if x["owner"] == a.owner)
    room.close()


def test_pages_take_their_turn_while_the_engine_needs_no_gil(room, monkeypatch):
    """Room.page_turn: free between steps and during a step's GIL-free forward, closed while the engine runs a
    step's Python phases (a page build waits there, at most PAGE_WAIT_S). Recorded from inside a real Run: at
    the hook's calls the turn is open exactly when the engine says it is in its GIL-free part."""
    from app import room as room_mod

    seen = []
    hook = room.engine.forward_hook

    def spy(inside):
        hook(inside)
        seen.append((inside, room._pages_turn.is_set()))

    room.engine.forward_hook = spy
    try:
        # a page showing no chart drawn from captures, in a room that captures nothing for such pages: the
        # GIL-free forward (a capture runs Model.forward's Python loop)
        monkeypatch.setattr(room_mod, "ROOM_BACKGROUND_CAPTURES", 0)
        a = LabSession.create(room)
        a.add_request(PROMPTS[0], _greedy(6), True, None)
        for _ in a.run_steps():
            pass
    finally:
        room.engine.forward_hook = hook
    assert seen and all(inside == open_ for inside, open_ in seen)
    assert room._pages_turn.is_set()  # no step running: pages are free
    assert 0 < room_mod.PAGE_WAIT_S <= 0.25  # a page never waits long for a stuck engine
    a.page_turn()  # returns at once now


def test_a_tab_is_captured_whatever_its_page_shows_and_a_busy_room_captures_in_turn(room):
    """Capture does not depend on scrolling (issue 37): a lone tab whose page shows no chart drawn from captures
    has its focused sequence captured at every step. When many such tabs step together, at most
    ROOM_BACKGROUND_CAPTURES of them are captured a step, those captured longest ago first; a tab whose page
    shows such a chart, and a presented one, are captured at every step."""
    from app import room as room_mod

    alone = LabSession.create(room)
    assert not alone.shows_captures and not alone.presented  # the page has not said what it shows
    alone.add_request(PROMPTS[0], _greedy(3), True, None)
    while alone.has_unfinished():
        alone.step()
    seqs = [ev.seq(alone.focus) for ev in alone.events]
    assert seqs and all(s.capture is not None and s.capture.attention for s in seqs)
    alone.close()

    tabs = [LabSession.create(room) for _ in range(5)]
    for s in tabs:
        s.add_request(PROMPTS[1], _greedy(3), True, None)
    tabs[0].shows_captures = True
    tabs[1].presented = True
    granted = [room._owners[s.owner] for s in tabs]
    k = room_mod.ROOM_BACKGROUND_CAPTURES
    rest = {s.focus for s in tabs[2:]}
    seen = []
    for _ in range(3):
        chosen = room._capture_for(granted)
        room.steps += 1  # as a step would
        assert {tabs[0].focus, tabs[1].focus} <= chosen
        assert len(chosen & rest) == min(k, len(rest))
        seen.append(chosen & rest)
    assert set().union(*seen) == rest  # in turn: each of the three others within three steps
    assert seen[0] != seen[1]
    for s in tabs:
        s.close()
