#!/usr/bin/env bash
# Creates .venv in the repository root and installs NanoSpec with every extra (SGLang, training,
# model fetching, benchmarks, tests). Safe to run again: an up-to-date environment installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[all]"
