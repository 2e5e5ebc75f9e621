"""The soak in short (bench/soak.py): browser-like pages over the real server, started as a subprocess.

Four pages for half a minute: page loads (heartbeat, Gradio load events, the tab's socket), Steps over the
socket, finished sequences (a small max-tokens box) followed by Reset or a new request, a reload; then every
page closes and the server must report no session and no KV block left. The default run (20 pages, 5
minutes) is a benchmark, run by hand: `python bench/soak.py`.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak_has_no_errors_and_frees_everything():
    cmd = [sys.executable, "bench/soak.py", "--clients", "4", "--minutes", "0.5", "--max-tokens", "8",
           "--churn-every", "15"]
    # bounded: model load (~5-20 s), 30 s of clients, their last steps, the freeing; a killed soak takes its
    # server with it (PR_SET_PDEATHSIG in bench/soak.py)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    report = out.stdout[-6000:] + out.stderr[-3000:]
    assert out.returncode == 0, report
    summary = [line for line in out.stdout.splitlines() if line.startswith("SUMMARY:")]
    assert summary, report
    assert "errors 0 PASS" in summary[-1], report
    assert re.search(r"freed sessions 0 kv_blocks_used 0 after [\d.]+ s PASS", summary[-1]), report
    steps = re.search(r"^steps (\d+),", out.stdout, re.M)
    assert steps and int(steps.group(1)) > 0, report
