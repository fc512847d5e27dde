#!/usr/bin/env bash
# The README's test command: install dgps with its test extras, lint, check generated/ is fresh, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0 triton==3.6.0
python -m pip install -q -e ".[test,fla]"
ruff check .
dgps check -q specs/*.dgps
python -m pytest
