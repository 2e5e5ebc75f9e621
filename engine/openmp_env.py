"""OpenMP's waiting policy for torch's thread team, set before torch loads OpenMP (it reads it only then).

GNU OpenMP lets a team's idle threads spin for GOMP_SPINCOUNT rounds (300,000 by default, about a
millisecond) after a parallel region before they sleep. On cores of their own that makes the next region start
at once. On cores shared with other processes it is the collapse of issue 14: the spinning thread burns the
time slice its partner needs to reach the barrier, and a 2-thread q4 decode step took 7x the 1-thread step
beside two busy processes (955-1,242 ms against 121-175). With 1,000 rounds (a few microseconds) the same
2-thread step took 0.4-1.8x the 1-thread one (docs/performance.md, "Threads on shared cores"). engine/governor.py then keeps
1 thread or all, whichever measures faster.

Applied only where it can act and nobody chose: when torch is not imported yet and neither OMP_WAIT_POLICY nor
GOMP_SPINCOUNT is set. The CLI imports the engine first, so it applies there; a library user who imports torch
before the engine should set GOMP_SPINCOUNT=1000 in the environment (or before `import torch`) themselves.
"""
from __future__ import annotations

import os
import sys

SPINCOUNT = "1000"


def _apply() -> str:
    """What the process runs with: 'GOMP_SPINCOUNT=1000 (set by the engine)', or what was there and why."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name in os.environ:
            return f"{name}={os.environ[name]} (set by the environment)"
    if "torch" in sys.modules:
        return "OpenMP's default (torch was imported before the engine; set GOMP_SPINCOUNT=1000 before it)"
    os.environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return f"GOMP_SPINCOUNT={SPINCOUNT} (set by the engine)"


SETTING = _apply()
