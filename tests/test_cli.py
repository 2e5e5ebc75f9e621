"""The command line streams a real completion and turns bad input into one clear line."""
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=300)


def test_cli_streams_greedy_answer(base_engine):
    out = run("Что такое гравитация?", "--temperature", "0", "--max-tokens", "12", "--stats")
    assert out.returncode == 0, out.stderr
    expected = base_engine.session().generate(
        "Что такое гравитация?", __import__("engine").SamplingParams(max_tokens=12, temperature=0.0)).text
    assert out.stdout.strip() == expected.strip()
    assert "finish: length" in out.stderr


def test_cli_bad_values_are_one_line_errors():
    out = run("hi", "--top-p", "0")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: top_p") and "Traceback" not in out.stderr
    out = run("hi", "--model", "/no/such/model/dir")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "No model directory" in out.stderr


def test_app_port_in_use_is_one_line_before_loading():
    """A second lab on a taken port says so at once (it used to load the model for a minute, then print the
    loader's traceback)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in out.stderr
