#!/usr/bin/env bash
# Set-up on a fresh machine, idempotent: the Python env in .venv/ and the
# native forwarding proxy (built with cargo, installed into .venv/bin).
set -euo pipefail
cd "$(dirname "$0")"

py=${DASKPROBE_PYTHON:-$HOME/.pyenv/versions/3.11.7/bin/python}
[ -x "$py" ] || py=$(command -v python3)
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

cargo build -q --release --manifest-path probes/proxy-core/Cargo.toml
install -m 755 probes/proxy-core/target/release/daskprobe-proxy .venv/bin/daskprobe-proxy
echo "daskprobe set up in $(pwd)/.venv" >&2
