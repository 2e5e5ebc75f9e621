"""python -m app [--model SRC] [--device cpu] [--host 127.0.0.1] [--port 7860]: start the lab.

The page is served at once; the model loads in a background thread while the page shows its progress.
FastAPI hosts Gradio and our static files on one port (a Hugging Face Space exposes only one).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app", description="InferLab: a real LLM, one step at a time.")
    ap.add_argument("--model", default=os.environ.get("INFERLAB_MODEL", "bundled"),
                    help="'bundled' (default), a local Hugging Face directory, or a hub id")
    ap.add_argument("--device", default=os.environ.get("INFERLAB_DEVICE", "cpu"), help="cpu, cuda or mps")
    ap.add_argument("--host", default=os.environ.get("INFERLAB_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("INFERLAB_PORT", "7860")))
    ap.add_argument("--kv-memory-mb", type=int, default=64, help="KV pool per browser tab, in MiB")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import uvicorn

    from .server import create_app

    app, holder = create_app(args.model, args.device, kv_memory=args.kv_memory_mb * 1024 * 1024)
    url = f"http://{args.host}:{args.port}"
    print(f"InferLab on {url}  (model: {args.model}, device: {args.device})", flush=True)
    # lecture mode: the presenter types this token into the page's "Lecture mode" box; viewers open /follow
    print(f"Lecture mode: presenter token {app.state.hub.token}  ·  viewers open {url}/follow", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
