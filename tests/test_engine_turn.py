"""The engine's turn (app/engine_turn.py): the server's event loop waits while a room's engine runs Python, never
unboundedly; the web threads run at a lower priority than the engine's; a room's turn lives as long as the room."""
import asyncio
import os
import threading

import pytest

from app import engine_turn
from app.session import new_room


@pytest.fixture
def closed_turn():
    turn = threading.Event()  # cleared: an engine in a Python phase
    engine_turn.register(turn)
    yield turn
    engine_turn.unregister(turn)
    turn.set()


def _run_loop(coro_fn):
    loop = engine_turn.loop_factory()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


def test_the_loop_polls_only_once_the_engines_turn_ends(closed_turn, monkeypatch):
    monkeypatch.setattr(engine_turn, "LOOP_WAIT_S", 30.0)  # the bound cannot end the wait here: only the turn
    opened = []

    def open_later():
        opened.append(True)
        closed_turn.set()

    async def main():
        return bool(opened)  # the loop polls for I/O before it runs its first callback

    threading.Timer(0.05, open_later).start()
    assert _run_loop(main) is True


def test_a_turn_that_never_ends_only_delays_the_loop(closed_turn, monkeypatch):
    monkeypatch.setattr(engine_turn, "LOOP_WAIT_S", 0.001)
    ran = []

    async def main():
        for i in range(5):
            await asyncio.sleep(0)
            ran.append(i)
        return ran

    assert _run_loop(main) == [0, 1, 2, 3, 4]
    assert not closed_turn.is_set()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priorities on this platform")
def test_web_threads_yield_to_the_engine_threads():
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def web():
        seen["web"] = engine_turn.engine_first()
        child = threading.Thread(target=lambda: seen.setdefault(
            "child", os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        child.start()
        child.join()

    t = threading.Thread(target=web)
    t.start()
    t.join()
    assert seen["web"] == max(mine, engine_turn.WEB_NICE)
    assert seen["child"] == seen["web"]  # threads the web thread starts inherit its priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # this thread is untouched


def test_a_rooms_turn_is_registered_while_it_lives(base_engine):
    room = new_room(base_engine)
    turn = room._pages_turn
    assert turn in engine_turn._turns
    room.close()
    assert turn not in engine_turn._turns and turn.is_set()
