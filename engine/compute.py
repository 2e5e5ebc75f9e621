"""One thread for the tensor work of a multi-threaded host, such as the web app's request handlers.

Why: torch's CPU kernels run on an OpenMP team that belongs to the thread that calls them, and GNU OpenMP
lets a team's idle workers spin (a fast hand-over to the next parallel region) only while the process has no
more OpenMP threads than CPU cores. Handlers run on changing server threads; the second thread that calls
torch brings a second team, every team then sleeps between regions, and a decode step pays for waking it
~120 times: on 2 cores a step went from ~62 to ~90 ms, for every session in the process.

`run(fn, ...)` calls fn on the one compute thread and waits for it, so the process keeps one team; the
Engine's methods that do tensor work are @routed here, so every host (the web app's handler threads, the CLI,
tests) gets this without knowing. Calls made on the compute thread itself run directly (an engine method may
call another). Work from several sessions queues up here; it would contend for the same cores anyway. A host
that runs torch itself on another thread (a reference model in a benchmark) should do it through `run` too.

Torch work that stays elsewhere (the UI converting an event's tensors, indexing a capture) is small, but one
parallel kernel on a thread is enough to give that thread a team for good: the web app had three. So the
compute thread keeps torch's thread count, and every other thread runs torch single-threaded. torch copies
its thread count into each thread the first time that thread calls it, and OpenMP keeps a count per thread.
"""
from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferlab-compute")
_ident: list[int] = []  # the compute thread's id, once it has started


def _start() -> int:
    _ident.append(threading.get_ident())
    threads = torch.get_num_threads()  # OMP_NUM_THREADS, or one per core
    torch.set_num_threads(threads)  # this thread's own count, kept when the default below changes
    return threads


THREADS = _pool.submit(_start).result()
torch.set_num_threads(1)  # this thread, and the default of every thread that first calls torch from now on


def set_threads(n: int) -> None:
    """The compute thread's torch thread count. A host whose other threads do real work (the web app builds
    pages while the engine steps) should leave them a core: with every core in the OpenMP team, the team's
    threads wait for each other whenever one is descheduled, and on 2 cores a 20-sequence room ran at a sixth
    of its speed with 2 threads against 1 (in-process measurement, docs/performance.md)."""
    global THREADS
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads must be a positive integer (got {n!r})")
    run(torch.set_num_threads, n)
    THREADS = n
    _new_threads_start_single()


def _new_threads_start_single() -> None:
    """torch.set_num_threads also sets the count every thread that first calls torch later starts with: put
    that back to 1, from a thread that is not the compute thread (the call sets its caller's count too)."""
    if on_compute_thread():
        helper = threading.Thread(target=torch.set_num_threads, args=(1,))
        helper.start()
        helper.join()
    else:
        torch.set_num_threads(1)


def on_compute_thread() -> bool:
    return threading.get_ident() in _ident


def run(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on the compute thread; its result, or its exception raised here."""
    if on_compute_thread():
        return fn(*args, **kwargs)
    return _pool.submit(fn, *args, **kwargs).result()


def routed(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: every call of fn runs on the compute thread (see the module's docstring)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return run(fn, *args, **kwargs)
    return call
