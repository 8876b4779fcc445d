#!/usr/bin/env bash
# Check loaderkit on a CUDA host in one command. See docs/cuda.md ("Checking a GPU host").
#
#   tools/gpu_check.sh [--quick] [extra pytest arguments...]
#
# 1. prints the GPU, torch and CUDA versions, and stops (exit 2) when CUDA is not usable here:
#    the point is to run the CUDA tests, not to skip them;
# 2. runs the whole test suite, CUDA tests included (`-m cuda` ones are not skipped on a GPU),
#    listing every skipped test; any failure stops the script;
# 3. runs the CUDA tests once more on their own and fails if any of them was skipped;
# 4. runs `python benchmarks/transfer.py` (`--quick` with --quick): pinned vs pageable
#    bandwidth, prefetcher vs plain loop, and the prefetcher/plain time ratios for pinned and
#    pageable batches (at most 1.0: the prefetcher is never slower); the numbers are also
#    written to gpu_check_transfer.json in the current directory;
# 5. runs `python benchmarks/feed.py --device cuda` (the end-to-end feed of BENCHMARKS.md at 4,
#    8 and 12 workers; `--quick` keeps it short), `python benchmarks/sparse_feed.py --device
#    cuda` (single-cell CSR batches expanded on the GPU against dense batches from the CPU) and
#    `python benchmarks/handoff.py` (what the worker-to-main hand-off and a second copy cost per
#    batch), JSON next to the first.
#
# PYTHON selects the interpreter (default: python). Exit status: 0 when every step passed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
quick=()
if [ "${1:-}" = "--quick" ]; then
    quick=(--quick)
    shift
fi
out="$(pwd)/gpu_check_transfer.json"
cd "$root"

echo "== gpu_check: machine"
"$python" - <<'PY'
import sys

import torch

if not torch.cuda.is_available():
    print("gpu_check: torch.cuda.is_available() is False: run this on a CUDA host "
          f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})", file=sys.stderr)
    sys.exit(2)
names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {names}")
PY

echo "== gpu_check: full test suite"
"$python" -m pytest -q -rs "$@"

echo "== gpu_check: CUDA tests must run, not skip"
junit="$(mktemp -d)/cuda.xml"
# -n 0: the CUDA tests in one process (one GPU; they count streams, memory and descriptors)
"$python" -m pytest -q -rs -n 0 -m cuda -p no:cacheprovider --junitxml "$junit" "$@"
"$python" - "$junit" <<'PY'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot().iter("testsuite")
counts = {"tests": 0, "skipped": 0}
for s in suite:
    for key in counts:
        counts[key] += int(s.get(key, 0))
print(f"gpu_check: {counts['tests']} CUDA tests, {counts['skipped']} skipped")
if counts["tests"] == 0 or counts["skipped"]:
    sys.exit("gpu_check: CUDA tests were skipped or not found")
PY
rm -rf "$(dirname "$junit")"

echo "== gpu_check: python benchmarks/transfer.py ${quick[*]:-}"
"$python" benchmarks/transfer.py ${quick[@]+"${quick[@]}"} --json "$out"

echo "== gpu_check: python benchmarks/feed.py --device cuda ${quick[*]:-}"
feed=(--device cuda)
if [ ${#quick[@]} -gt 0 ]; then
    feed+=(--workers 4,8 --passes 1)
fi
"$python" benchmarks/feed.py "${feed[@]}" --json "$(dirname "$out")/gpu_check_feed.json"

echo "== gpu_check: python benchmarks/sparse_feed.py --device cuda ${quick[*]:-}"
"$python" benchmarks/sparse_feed.py --device cuda ${quick[@]+"${quick[@]}"} --json "$(dirname "$out")/gpu_check_sparse_feed.json"

echo "== gpu_check: python benchmarks/handoff.py ${quick[*]:-}"
"$python" benchmarks/handoff.py ${quick[@]+"${quick[@]}"} --json "$(dirname "$out")/gpu_check_handoff.json"
echo "gpu_check: passed"
