#!/usr/bin/env bash
# Run PyTorch's own DataLoader tests with torch's DataLoader, loaderkit.DataLoader or
# create_dataloader behind the name the tests use. See README.md.
#
# Usage: tools/torch_suite/run.sh SUITE_FILE VARIANT OUT_DIR [extra pytest args...]
#   SUITE_FILE  a copy of pytorch/data test/stateful_dataloader/test_dataloader.py
#   VARIANT     torch | class | function
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
suite="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
variant="$2"
out="$(mkdir -p "$3" && cd "$3" && pwd)"
shift 3
extra="$out/extra"
if [ ! -d "$extra/expecttest" ]; then
    # torch.testing's helpers need expecttest; dill lets the DataPipe-with-lambda test run.
    python -m pip install --quiet --no-deps --target "$extra" expecttest dill
fi
cd "$(dirname "$suite")"
start=$SECONDS
set +e
# --tb=native: pytest's own traceback formatting parses source with ast, which CPython 3.11.7
# sometimes fails inside this suite ("AST constructor recursion depth mismatch", INTERNALERROR)
PYTHONPATH="$here/shim:$extra${PYTHONPATH:+:$PYTHONPATH}" LOADER_VARIANT="$variant" \
PYTHONDONTWRITEBYTECODE=1 python -m pytest -p no:cacheprovider -q -rA --timeout 120 --tb=native \
    -k "not TestStatefulDataLoaderEnumerate" --junitxml "$out/$variant.xml" \
    "$(basename "$suite")" "$@" > "$out/$variant.log" 2>&1
rc=$?
set -e
echo "variant=$variant rc=$rc wall_s=$((SECONDS - start)) log=$out/$variant.log"
