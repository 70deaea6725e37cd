#!/usr/bin/env bash
# Set-up on a fresh machine, idempotent: the Python env in .venv/, the native
# proxy and sampler (cargo, installed into .venv/bin), and what the eBPF probes
# need (Debian's bcc, kernel headers, tracefs), Chromium for the browser test, and as root distributed-ucxx
# in .venv-ucx/ for the ucx:// tests.
# DASKPROBE_VENV (default .venv) and DASKPROBE_DASK (newest or oldest: tracer/capture/dask_versions.py) let CI
# make a second venv with the oldest Dask supported (.ci/oldest-dask).
set -euo pipefail
cd "$(dirname "$0")"

started=$SECONDS
step() { printf 'setup [%4ss] %s\n' "$((SECONDS - started))" "$*" >&2; }

venv=${DASKPROBE_VENV:-.venv}
copy=.python${venv#.venv}  # the interpreter's copy, if one is needed: .python for .venv
py=${DASKPROBE_PYTHON:-$HOME/.pyenv/versions/3.11.7/bin/python}
[ -x "$py" ] || py=$(command -v python3)
py=$(readlink -f "$py")
step "interpreter: $py"

# A root set-up must leave a venv every user of the machine can run, but pyenv's
# interpreter lives in root's private home: then the checkout gets its own copy
# of it (interpreter, libpython and standard library, ~90 MB), found through its
# own rpath. The copy is the same build, so the GIL probe finds take_gil in it.
others_can_run() { [ "$(id -u)" != 0 ] || setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$1"; }
if ! others_can_run "$py"; then
  command -v patchelf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null; }
  prefix=$(dirname "$(dirname "$py")")
  if [ ! -x "$copy/bin/$(basename "$py")" ] || [ "$(cat "$copy/FROM" 2>/dev/null)" != "$py" ]; then
    step "copying the interpreter into $copy/ (others cannot run root's)"
    rm -rf "$copy" && mkdir -p "$copy"
    tar -C "$prefix" -cf - --exclude=site-packages --exclude=test --exclude='config-*' --exclude=__pycache__ \
        "bin/$(basename "$py")" lib include | tar -C "$copy" -xf -
    patchelf --set-rpath '$ORIGIN/../lib' "$copy/bin/$(basename "$py")"
    echo "$py" > "$copy/FROM"
    chmod -R a+rX "$copy"
  fi
  py=$PWD/$copy/bin/$(basename "$py")
fi
# A venv made from another interpreter (an older set-up) is made again.
if ! grep -qx "executable = $py" "$venv/pyvenv.cfg" 2>/dev/null; then
  step "making $venv/"
  rm -rf "$venv" && "$py" -m venv "$venv"
fi

# Cargo first, its progress shown: pip's build below (setuptools-rust) then finds the binaries built.
step "building the Rust binaries (cargo; the first time takes minutes)"
cargo build --release --manifest-path probes/Cargo.toml
dask=$("$py" tracer/capture/dask_versions.py "${DASKPROBE_DASK:-newest}")  # pins: dask==... distributed==...
step "installing daskprobe, its test extras and $dask into $venv/ (pip)"
"$venv/bin/pip" install --disable-pip-version-check -e '.[test]' $dask | { grep -v '^Requirement already satisfied' || true; }
for bin in daskprobe-proxy daskprobe-tap daskprobe-sampler daskprobe-unwind; do
  install -m 755 "probes/target/release/$bin" "$venv/bin/$bin"
done

# eBPF: bcc comes from Debian (python3-bpfcc; the PyPI package named bcc is
# unrelated). bcc compiles against kernel headers; a kernel that ships none
# gets Debian's newest, which is safe for what we compile (tracepoint args,
# uprobes, perf events: no kernel structs are read).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  pkgs="bpfcc-tools python3-bpfcc linux-headers-amd64 chromium"  # chromium: the report's browser test
  if ! dpkg -s $pkgs >/dev/null 2>&1; then
    step "installing $pkgs (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
  fi
  mod=/lib/modules/$(uname -r)
  if [ ! -e "$mod/build" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n 1)
    mkdir -p "$mod"
    ln -sfn "$hdr" "$mod/build"
    ln -sfn "${hdr%-amd64}-common" "$mod/source"
  fi
  [ -d /sys/kernel/tracing/events ] || mount -t tracefs tracefs /sys/kernel/tracing || true
else
  echo "setup: not root or no apt-get: the eBPF probes (cpu, gil, offcpu, tcp) will be skipped" >&2
fi
# UCX on CPU (distributed-ucxx): a venv of its own, .venv-ucx, since it pins its own Dask. The ucx:// tests
# run their clusters with it. Root only: a ucx:// run needs a network namespace of its own (docs/probes.md).
ucxx=distributed-ucxx-cu12==0.52.0
# .venv-ucx/INSTALLED says the install ended; without it the tests skip ucx:// (a registry's hiccup must not
# fail the set-up of everything else).
if [ "$(id -u)" = 0 ] && [ "$venv" = .venv ] && ! [ -e .venv-ucx/INSTALLED ]; then
  step "installing $ucxx into .venv-ucx/ (pip): the ucx:// tests' cluster"
  if rm -rf .venv-ucx && "$py" -m venv .venv-ucx && .venv-ucx/bin/pip install --disable-pip-version-check -q "$ucxx" \
      && .venv-ucx/bin/python -c 'import distributed_ucxx'; then
    touch .venv-ucx/INSTALLED
  else
    echo "setup: distributed-ucxx did not install: the ucx:// tests will skip" >&2
  fi
fi
step "daskprobe set up in $(pwd)/$venv"
