#!/usr/bin/env bash
# Run the README's test command under Python 3.14 (Debian's python3.14) with torch 2.15, in a
# debootstrap root: the stack a new user gets today, with forkserver as the default start method.
#
# Usage: tools/py314_root.sh [--prepare] ROOT [-- extra pytest arguments]
#   tools/py314_root.sh --prepare /tmp/py314     # make the root and its venv only (CI downloads ahead)
#   tools/py314_root.sh /tmp/py314               # copy this checkout in, install it as the README says, test
#   tools/py314_root.sh /tmp/py314 -- -x tests/test_loader.py
#
# Making the root (needs root and the network to Debian's and Python's package registries):
#   debootstrap --variant=minbase --include=python3.14,python3.14-venv,ca-certificates,libgomp1 sid ROOT
# with debootstrap's default mirror; then this host's CA bundle, resolv.conf and /etc/hosts (torchrun
# resolves this host's name) are copied in, and ROOT/venv gets torch 2.15.0 from the package index
# (PIP_CONFIG_FILE=/dev/null: this machine's pip config caps torch below 2.15). A root whose venv
# already holds torch 2.15.0 is reused. /proc, /dev and /dev/shm are mounted while commands run in
# the root and unmounted on every exit path.
#
# The checkout is copied in as git sees it (tracked and untracked-not-ignored files), so the run
# tests exactly what a clone would; the project is installed not editable, as the README says.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${PY314_TORCH_VERSION:-2.15.0}"
prepare_only=0
if [ "${1:-}" = "--prepare" ]; then
    prepare_only=1
    shift
fi
if [ $# -lt 1 ]; then
    sed -n '2,9p' "$0" >&2
    exit 2
fi
root="$(realpath -m "$1")"
shift
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
if [ "$(id -u)" != 0 ]; then
    echo "py314_root: needs root (debootstrap, chroot, mounts)" >&2
    exit 2
fi

mounted=()
unmount_all() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -l "${mounted[$i]}" 2>/dev/null || true
    done
    mounted=()
}
trap unmount_all EXIT

mount_into_root() {
    mkdir -p "$root/proc" "$root/dev" "$root/dev/shm"
    mount -t proc proc "$root/proc" && mounted+=("$root/proc")
    mount --bind /dev "$root/dev" && mounted+=("$root/dev")
    mount --bind /dev/shm "$root/dev/shm" && mounted+=("$root/dev/shm")
}

in_root() {  # in_root COMMAND...: run a bash command line inside the root, with a clean environment
    chroot "$root" /usr/bin/env -i HOME=/root PATH=/venv/bin:/usr/local/bin:/usr/bin:/bin \
        LANG=C.UTF-8 PYTHONUNBUFFERED=1 ${CI:+CI="$CI"} PIP_DISABLE_PIP_VERSION_CHECK=1 \
        PIP_DEFAULT_TIMEOUT=180 PIP_CONFIG_FILE=/dev/null \
        /bin/bash -euo pipefail -c "$*"
}

copy_host_files() {
    cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    cp -L /etc/hosts "$root/etc/hosts"
    cp -L /etc/hostname "$root/etc/hostname" 2>/dev/null || true
}

if [ ! -x "$root/usr/bin/python3.14" ]; then
    if ! command -v debootstrap >/dev/null; then
        apt-get install -y -q debootstrap >/dev/null
    fi
    rm -rf --one-file-system "$root"
    debootstrap --variant=minbase \
        --include=python3.14,python3.14-venv,ca-certificates,libgomp1 sid "$root"
fi
copy_host_files
mount_into_root

if ! in_root "/venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split(\"+\")[0] != \"$TORCH_VERSION\")'" \
        2>/dev/null; then
    rm -rf "$root/venv"
    in_root "python3.14 -m venv /venv && python -m pip install --quiet --upgrade pip \
        && python -m pip install --quiet torch==$TORCH_VERSION"
fi
if [ "$prepare_only" = 1 ]; then
    in_root "python -c 'import sys, torch; print(\"py314_root: Python\", sys.version.split()[0], \"torch\", torch.__version__)'"
    exit 0
fi

# The checkout as a clone would have it, installed exactly as the README says.
rm -rf --one-file-system "$root/work"
mkdir -p "$root/work"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' path; do
    [ -e "$path" ] || continue  # deleted in the work tree, not yet committed
    mkdir -p "$root/work/$(dirname "$path")"
    cp -a "$path" "$root/work/$path"
done
test_command="$(sed -n 's/^    \(.*\)  # ci: test$/\1/p; s/^\(.*\)  # ci: test$/\1/p' README.md | head -n 1)"
if [ -z "$test_command" ]; then
    echo "py314_root: README.md has no line marked '# ci: test'" >&2
    exit 1
fi
extra=""
if [ $# -gt 0 ]; then
    extra=" $(printf '%q ' "$@")"
fi
in_root "cd /work && python -c 'import multiprocessing as m, sys, torch; \
print(\"py314_root: Python\", sys.version.split()[0], \"torch\", torch.__version__, \
\"default start method\", m.get_start_method())' && echo '+ $test_command$extra' && $test_command$extra"
# The test extra must not have replaced the torch asked for.
in_root "python -c 'import sys, torch; v = torch.__version__.split(\"+\")[0]; \
sys.exit(0 if v == \"$TORCH_VERSION\" else f\"py314_root: installing the project replaced torch $TORCH_VERSION with {v}\")'"
