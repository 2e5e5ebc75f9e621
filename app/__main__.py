"""python -m app [--model SRC] [--device cpu] [--host 127.0.0.1] [--port 7860]: start the lab.

The page is served at once; the model loads in a background thread while the page shows its progress.
FastAPI hosts Gradio and our static files on one port (a Hugging Face Space exposes only one).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from dataclasses import replace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main(argv: list[str] | None = None) -> int:
    from engine.kernels import FORMATS

    ap = argparse.ArgumentParser(prog="python -m app", description="InferLab: a real LLM, one step at a time.")
    ap.add_argument("--model", default=os.environ.get("INFERLAB_MODEL", "bundled"),
                    help="'bundled' (default), a local Hugging Face directory, or a hub id")
    ap.add_argument("--device", default=os.environ.get("INFERLAB_DEVICE", "cpu"), help="cpu, cuda or mps")
    ap.add_argument("--host", default=os.environ.get("INFERLAB_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("INFERLAB_PORT", "7860")))
    ap.add_argument("--kv-memory-mb", type=int, default=512,
                    help="the KV pool that every browser tab's sequences share (one engine serves the room), in MiB")
    ap.add_argument("--max-sessions", type=int, default=int(os.environ.get("INFERLAB_MAX_SESSIONS", "24")),
                    help="browser tabs served at once (all batched in one shared engine); more visitors read 'the "
                         "lab is full'")
    ap.add_argument("--allow-origin", action="append", default=None, metavar="URL",
                    help="a page origin whose websockets are accepted besides this server's own host, e.g. "
                         "https://NAME.hf.space (repeatable; default: $INFERLAB_ALLOWED_ORIGINS, comma-separated)")
    ap.add_argument("--idle-minutes", type=float, default=float(os.environ.get("INFERLAB_IDLE_MINUTES", "5")),
                    help="a session whose page has no open websocket (an API client) is freed after this long "
                         "without an event")
    ap.add_argument("--weights", default=os.environ.get("INFERLAB_WEIGHTS", "fp32"), choices=FORMATS,
                    help="the format the projections run in: fp32 (the reference), bf16, int8 (per channel) or q4 "
                         "(the bundled GGUF's own 4-bit weights); smaller is faster on a CPU")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("INFERLAB_THREADS", "0")),
                    help="torch threads for the engine (default: one core fewer than the machine has, at least 1: "
                         "the page-building threads need a core, and a full OpenMP team slows down when they "
                         "take one)")
    ap.add_argument("--api-key", default=os.environ.get("INFERLAB_API_KEY") or None, metavar="KEY",
                    help="the OpenAI-compatible API (/v1, /tokenize, /detokenize) then requires 'Authorization: "
                         "Bearer KEY'; on a public deployment (a Space, or a --host other than loopback) it is off "
                         "without one (default: $INFERLAB_API_KEY). /health and /metrics stay open, as vLLM's do, "
                         "unless --guard-metrics")
    ap.add_argument("--api", default=os.environ.get("INFERLAB_API", "auto"), choices=("auto", "on", "off"),
                    help="auto (default): the API is on when the lab listens on this machine only or a key is set; "
                         "on / off force it")
    ap.add_argument("--guard-metrics", action="store_true",
                    default=os.environ.get("INFERLAB_GUARD_METRICS", "") not in ("", "0"),
                    help="/metrics and /health pass the same check as /v1 (the key; off where the API is off) "
                         "instead of answering anyone (default: $INFERLAB_GUARD_METRICS=1)")
    ap.add_argument("--metrics-prefix", default=os.environ.get("INFERLAB_METRICS_PREFIX", "both"),
                    choices=("both", "vllm", "inferlab"),
                    help="the names /metrics writes: vllm:NAME{model_name=...} as vLLM's dashboards read them, the "
                         "lab's own inferlab:NAME, or both (default)")
    ap.add_argument("--forwarded-allow-ips", default=os.environ.get("INFERLAB_FORWARDED_ALLOW_IPS"), metavar="IPS",
                    help="proxies whose X-Forwarded-For header names the client (for the per-client request "
                         "limit): a comma list of addresses or networks, or '*' for any peer. Default: '*' on a "
                         "Hugging Face Space (only its proxy reaches the lab), else none (the header is ignored)")
    ap.add_argument("--attach", default="", metavar="URL",
                    help="attach mode: instead of running its own engine, the lab draws the panels an "
                         "OpenAI-compatible server at URL can feed (vLLM, SGLang, llama.cpp's server, another lab); "
                         "--api-key is then that server's key and --model its model name (default: the first it lists)")
    args = ap.parse_args(argv)
    for name, value, low in (("--kv-memory-mb", args.kv_memory_mb, 1), ("--max-sessions", args.max_sessions, 1)):
        if value < low:
            ap.error(f"{name} must be at least {low} (got {value})")
    if args.threads < 0:
        ap.error(f"--threads must be 0 (automatic) or positive (got {args.threads})")
    if not args.idle_minutes > 0:
        ap.error(f"--idle-minutes must be positive (got {args.idle_minutes})")
    from .ops_api import parse_proxies

    # a Hugging Face Space sets SPACE_ID and SPACE_HOST: the lab is public there whatever --host says, and every
    # request reaches it through the Space's proxy
    on_space = bool(os.environ.get("SPACE_ID") or os.environ.get("SPACE_HOST"))
    forwarded = forwarded_allow_ips(args.forwarded_allow_ips, on_space)
    try:
        proxies = parse_proxies(forwarded)
    except ValueError as exc:
        ap.error(f"--forwarded-allow-ips: {exc}")
    problem = _port_problem(args.host, args.port)
    if problem:  # before the model loads: otherwise the load runs for a minute and then dies on the bind
        print(f"inferlab: cannot listen on {args.host}:{args.port}: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import uvicorn

    if args.attach:
        return attach(args)

    from engine import compute

    from . import engine_turn
    from .openai_api import decide, startup_line
    from .server import create_app

    api = replace(decide(args.host, args.api_key, args.api, space=on_space), guard_metrics=args.guard_metrics,
                  metrics_prefix=args.metrics_prefix, proxies=proxies)
    compute.set_threads(args.threads or max(1, (os.cpu_count() or 2) - 1))
    # the engine's compute thread exists (engine.compute): the server's threads, all started from here on, run
    # at a lower priority and wait for the engine's turn on the GIL (app/engine_turn.py)
    engine_turn.engine_first()

    app, holder = create_app(args.model, args.device, kv_memory=args.kv_memory_mb * 1024 * 1024,
                             max_sessions=args.max_sessions,
                             allowed_origins=tuple(args.allow_origin) if args.allow_origin else None,
                             socketless_timeout_s=args.idle_minutes * 60, weights=args.weights, api=api,
                             listen_host=args.host)
    url = f"http://{args.host}:{args.port}"
    print(f"InferLab on {url}  (model: {args.model}, weights: {args.weights}, device: {args.device}, "
          f"torch threads: {compute.THREADS})",
          flush=True)
    # lecture mode: the presenter types this token into the page's "Lecture mode" box; viewers open /follow
    print(f"Lecture mode: presenter token {app.state.hub.token}  ·  viewers open {url}/follow "
          f"(in Russian: {url}/follow?lang=ru)", flush=True)
    print(startup_line(api, url), flush=True)
    print(f"Operations: /health and /metrics {'as /v1 (--guard-metrics)' if api.guard_metrics else 'open to anyone'}"
          f"; metric names: {args.metrics_prefix}; X-Forwarded-For read from: {forwarded or 'no proxy'}", flush=True)
    # proxy_headers=False: uvicorn would otherwise take X-Forwarded-For from any loopback peer and rewrite the
    # client's address before the lab could apply its own rule (app/ops_api.py client_address)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", loop="app.engine_turn:loop_factory",
                proxy_headers=False)
    return 0


def forwarded_allow_ips(flag: str | None, space: bool) -> str:
    """--forwarded-allow-ips, else "*" on a Space (its proxy is the only way in, and every visitor arrives with
    the proxy's address: without the header the per-client limit would be one limit for everyone), else none."""
    if flag is not None:
        return flag
    return "*" if space else ""


def attach(args) -> int:
    """Serve the attach page (app/attach_server.py) for the server at --attach; no local model is loaded."""
    import httpx
    import uvicorn

    from .attach_server import create_attach_app

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per metrics poll

    origins = tuple(args.allow_origin) if args.allow_origin else tuple(
        o for o in os.environ.get("INFERLAB_ALLOWED_ORIGINS", "").split(",") if o.strip())
    try:
        app = create_attach_app(args.attach, args.api_key, None if args.model == "bundled" else args.model,
                                host=args.host, presenter_token=os.environ.get("INFERLAB_PRESENTER_TOKEN") or None,
                                allowed_origins=origins)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        print(f"Could not attach to {args.attach}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    url = f"http://{args.host}:{args.port}"
    target = app.state.attachment.target
    print(f"InferLab attached to {target.url} (model {target.model}): open {url} (in Russian: {url}/?lang=ru)",
          flush=True)
    # the room load: followers open /follow; the presenter types this token on the attach page
    print(f"Lecture mode: presenter token {app.state.hub.token}  ·  followers open {url}/follow", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _port_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None when it can): checked by binding as uvicorn will."""
    import socket

    if not 0 <= port <= 65535:
        return "a port is a number from 0 to 65535"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "the port is already in use (another InferLab? pick another with --port)"
            return exc.strerror or str(exc)
    return None


if __name__ == "__main__":
    sys.exit(main())
