#!/usr/bin/env bash
# Run the README's test command against one torch release, in a fresh virtual environment.
#
# Usage: tools/torch_matrix.sh [--prepare] TORCH_VERSION [PYTHON_VERSION] [-- extra pytest arguments]
#   tools/torch_matrix.sh 2.9.1                  # the default python3
#   tools/torch_matrix.sh 2.4.1 3.10             # under Python 3.10 (pyenv's 3.10.x)
#   tools/torch_matrix.sh 2.14.1 3.13 -- -x tests/test_loader.py
#   tools/torch_matrix.sh --prepare 2.9.1        # only make the venv (CI downloads ahead)
#
# torch 2.13.0 installs the CPU build from this machine's disk; any other release comes from
# the package index (a CUDA build, about 3 GB with its dependencies; it runs on the CPU here).
# Venvs are kept under $TORCH_MATRIX_DIR (default ~/.cache/loaderkit-torch-matrix) and reused
# when their torch matches; the project itself is reinstalled every time (not editable: the
# tests import the installed package, exactly as the README's command does). The run fails if
# installing the project's test extra replaced the torch asked for.
set -euo pipefail
cd "$(dirname "$0")/.."

prepare_only=0
if [ "${1:-}" = "--prepare" ]; then
    prepare_only=1
    shift
fi
if [ $# -lt 1 ]; then
    sed -n '2,14p' "$0" >&2
    exit 2
fi
torch_version="$1"
shift
python_version=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    python_version="$1"
    shift
fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift

if [ -n "$python_version" ]; then
    full="$(pyenv versions --bare 2>/dev/null | grep -E "^${python_version//./\\.}(\.[0-9]+)?$" | tail -n 1 || true)"
    if [ -n "$full" ]; then
        python="$(PYENV_VERSION="$full" pyenv which python)"
    else
        python="$(command -v "python$python_version" || true)"
    fi
    if [ -z "$python" ]; then
        echo "torch_matrix: no Python $python_version here (pyenv versions; python$python_version)" >&2
        exit 2
    fi
else
    python="$(command -v python3)"
fi
py_tag="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"

# This machine's pip config (/etc/xdg/pip) caps torch at the releases on its disk: a newer torch
# (2.15) is installed, and the project installed beside it, without that config, or the cap
# would replace the torch asked for.
if [ -f /etc/xdg/pip/constraints.txt ] && ! python3 - "$torch_version" <<'PY'
import pathlib, re, sys
want = tuple(int(n) for n in sys.argv[1].split(".")[:3])
for line in pathlib.Path("/etc/xdg/pip/constraints.txt").read_text().splitlines():
    m = re.match(r"torch\s*<=\s*([\d.]+)", line.strip())
    if m and want > tuple(int(n) for n in m.group(1).split(".")):
        sys.exit(1)
PY
then
    export PIP_CONFIG_FILE=/dev/null
fi

root="${TORCH_MATRIX_DIR:-$HOME/.cache/loaderkit-torch-matrix}"
venv="$root/torch-$torch_version-py$py_tag"
if [ ! -x "$venv/bin/python" ] || \
   [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" != "$torch_version" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet "torch==$torch_version"
fi
if [ "$prepare_only" = 1 ]; then
    echo "torch_matrix: $venv has torch $torch_version"
    exit 0
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
torch_before="$(python -c 'import torch; print(torch.__version__)')"

test_command="$(sed -n 's/^    \(.*\)  # ci: test$/\1/p; s/^\(.*\)  # ci: test$/\1/p' README.md | head -n 1)"
if [ -z "$test_command" ]; then
    echo "torch_matrix: README.md has no line marked '# ci: test'" >&2
    exit 1
fi
echo "+ torch $torch_before, Python $(python -c 'import platform; print(platform.python_version())')"
echo "+ $test_command $*"
start=$SECONDS
set +e
bash -euo pipefail -c "$test_command \"\$@\"" bash "$@"
rc=$?
set -e
torch_after="$(python -c 'import torch; print(torch.__version__)')"
if [ "$torch_before" != "$torch_after" ]; then
    echo "torch_matrix: installing the project replaced torch $torch_before with $torch_after" >&2
    exit 1
fi
echo "torch_matrix: torch $torch_after, Python $py_tag: rc=$rc in $((SECONDS - start)) s"
exit $rc
