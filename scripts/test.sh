#!/usr/bin/env bash
# The README's test command: install dgps with its test extras, lint, check that specs/ pass and that
# generated/ is fresh, then run pytest (Triton kernels run under TRITON_INTERPRET=1 without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0 triton==3.6.0
python -m pip install -q -e ".[test,fla]"
ruff check .
dgps check -q specs/*.dgps
python -m dgps.codegen.generate --check
python -m pytest tests -n 2 --durations=15
