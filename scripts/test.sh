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
# The newest tested Triton (3.9, see pyproject.toml): a representative subset of the interpreter tests, with
# that Triton ahead on the path (generated/ records 3.6, the H200's, so its freshness check is not rerun here).
python -m pip install -q --no-deps --upgrade --target .triton-newest triton==3.9.0
PYTHONPATH=.triton-newest python -m pytest -n 2 -q -p no:cacheprovider tests/test_chunk_kernel.py \
    tests/test_chunk_backward.py tests/test_recurrent_kernel.py -k "(gdn or kda or gla or pgdn or ccq) and not aot"
