#!/usr/bin/env bash
# Set-up on a fresh machine, idempotent: the Python env in .venv/, the native
# proxy and sampler (cargo, installed into .venv/bin), and what the eBPF probes
# need (Debian's bcc, kernel headers, tracefs), and Chromium for the browser test.
set -euo pipefail
cd "$(dirname "$0")"

py=${DASKPROBE_PYTHON:-$HOME/.pyenv/versions/3.11.7/bin/python}
[ -x "$py" ] || py=$(command -v python3)
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

cargo build -q --release --manifest-path probes/Cargo.toml
for bin in daskprobe-proxy daskprobe-sampler; do
  install -m 755 "probes/target/release/$bin" ".venv/bin/$bin"
done

# eBPF: bcc comes from Debian (python3-bpfcc; the PyPI package named bcc is
# unrelated). bcc compiles against kernel headers; a kernel that ships none
# gets Debian's newest, which is safe for what we compile (tracepoint args,
# uprobes, perf events: no kernel structs are read).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  pkgs="bpfcc-tools python3-bpfcc linux-headers-amd64 chromium"  # chromium: the report's browser test
  if ! dpkg -s $pkgs >/dev/null 2>&1; then
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
echo "daskprobe set up in $(pwd)/.venv" >&2
