"""The room benchmark in short (bench/room.py): a few browser-like pages over the real server, started as a
subprocess, first one alone, then all at once, pressing Run (or clicking Step) like the page does.

No timing thresholds here (a busy CI machine is slow, not wrong): the run must complete with no dropped socket,
no error, and payloads for every client. Once the server reports the room's counters on /healthz ("room":
issue 12's one shared engine), the clients running at once must have been batched together (max batch >= 2 in
the second phase; Steps meet in one engine step only when they coincide, so step mode is not held to it); a
server without them prints "room stats: n/a" and that check is skipped. The default run (20 clients, a minute
per phase) is a benchmark, run by hand: `python bench/room.py`.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mode,clients", [("run", 3), ("step", 2)])
def test_short_room_bench_completes_without_errors(tmp_path, mode, clients):
    out_json = tmp_path / "room.json"
    cmd = [sys.executable, "bench/room.py", "--clients", str(clients), "--seconds", "8", "--warmup", "2",
           "--mode", mode, "--max-tokens", "8", "--json", str(out_json)]
    # bounded: model load (~5-20 s), two phases of 10 s, their last steps, the freeing; a killed bench takes its
    # server with it (PR_SET_PDEATHSIG in bench/soak.py)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    report = out.stdout[-6000:] + out.stderr[-3000:]
    assert out.returncode == 0, report  # without --strict a missed target is reported, not an exit code
    assert any(line.startswith("SUMMARY:") for line in out.stdout.splitlines()), report
    result = json.loads(out_json.read_text())
    one, many = result["phases"]
    assert (one["clients"], many["clients"]) == (1, clients), report
    for phase in (one, many):
        assert phase["dropped"] == 0, report
        assert phase["errors"] == 0, report
        assert min(phase["frames_all_per_client"]) > 0, report  # every client got payloads
        assert phase["tokens"] > 0, report
    if many["room"] is not None:
        # the server has the shared room. Runs hold their grants until Pause, so running clients share its steps;
        # a Step grants one step, and two clicks meet in one step only when they happen to coincide: timing
        if mode == "run":
            assert many["room"]["batch_max"] is not None and many["room"]["batch_max"] >= 2, report
    else:
        assert "room stats: n/a" in out.stdout, report
