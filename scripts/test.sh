#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the lint and the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check nanospec train tests scripts
.venv/bin/python -m pytest -q "$@"
