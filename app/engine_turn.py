"""The engine's turn: while the room's engine runs Python, the web server's threads wait, and they yield the CPU.

Why (measured, issue 12): one process holds the engine and the web server, and they share one GIL. An engine
step's Python phases (building the batch, sampling every sequence with its trace, the event) make ~1,000 small
tensor calls, and each call gives the GIL up and must win it back. With twenty tabs running, the event loop
thread (Gradio's queue, socket frames, JSON) and the page builders held the GIL a third of the time, and the
compute thread spent half of each step waiting for it: a twenty-sequence step took 260-340 ms in the server
against 120-135 ms alone, and the room gave 3.3-4.7x the tokens of one tab instead of the 5x targeted.

Two rules fix most of it:

1. **Turns on the GIL.** A room (app/room.py) closes its turn while its engine runs Python and opens it during
   the forward's GIL-free layers and between steps. Page builds wait for the turn at each chart (Room.page_turn);
   the event loop waits for it before each poll for I/O (`loop_factory`, given to uvicorn). Both waits are
   bounded: a stuck engine delays a page or a socket message, it never stops them.
2. **The engine's threads first.** `engine_first()` lowers the scheduling priority (raises the nice value) of the
   thread that starts the web server, before it starts any other; every thread it creates later inherits it.
   The compute thread (engine/compute.py) and its OpenMP team, started before, keep theirs. On a 2-core
   machine the forward runs on one core while the pages are built on the other; when the web threads want
   more than that, the forward is not the one that waits.

With both, a twenty-sequence step in the server went from 260-340 ms to 162-188 ms (bench/room.py;
docs/performance.md, "The room: many tabs on one engine").
"""
from __future__ import annotations

import asyncio
import os
import selectors
import threading

LOOP_WAIT_S = 0.05  # the longest the event loop waits for a turn before each poll
WEB_NICE = 10  # the web server threads' nice value (0 is the default; 19 the lowest priority)

_turns: set[threading.Event] = set()  # one per live room: set while its engine needs no GIL
_lock = threading.Lock()


def register(turn: threading.Event) -> None:
    with _lock:
        _turns.add(turn)


def unregister(turn: threading.Event) -> None:
    with _lock:
        _turns.discard(turn)


def wait_turn(max_s: float) -> None:
    """Return when no room's engine runs Python, or after about max_s seconds."""
    for turn in list(_turns):
        if not turn.wait(max_s):
            return  # bounded in all: one late room is enough waiting


class _TurnSelector(selectors.DefaultSelector):
    """The event loop's selector: before each poll for I/O the loop waits for the engine's turn to end."""

    def select(self, timeout=None):
        wait_turn(LOOP_WAIT_S)
        return super().select(timeout)


def loop_factory(use_subprocess: bool = False) -> asyncio.AbstractEventLoop:
    """uvicorn's loop factory (uvicorn.run(loop="app.engine_turn:loop_factory")): asyncio's selector loop, with
    the turn-taking selector."""
    return asyncio.SelectorEventLoop(_TurnSelector())


def engine_first() -> int | None:
    """Raise the calling thread's nice value to WEB_NICE (threads it starts later inherit it); returns the new
    value, or None where the platform cannot (the lab still works, only less well under load). Call it after
    the engine's compute thread exists and before the web server starts its threads."""
    if not hasattr(os, "setpriority"):
        return None
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        if now < WEB_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, WEB_NICE)  # on Linux a thread id names the one thread
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None
