#!/usr/bin/env bash
# One command from a fresh clone to a working vtrain: Python venv with pinned packages, the npm
# toolchain (solc WASM compiler, anvil, cast, hardhat), then the main job (`vtrain demo`).
#
# Idempotent: each stage records a stamp (a hash of its lock file) only after it succeeded, so a
# second run skips finished stages and a failed run is redone from the failed stage next time.
# Nothing is downloaded except from PyPI and npm.
#
# Usage: bash scripts/setup.sh [--no-demo]
#   --no-demo    install only; skip the main job (CI runs the tests instead)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$PWD"
RUN_DEMO=1
for arg in "$@"; do
  case "$arg" in
    --no-demo) RUN_DEMO=0 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }
fail() { printf '\nsetup failed: %s\n' "$*" >&2; exit 1; }
hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

# ---- prerequisites --------------------------------------------------------------------------
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
command -v "$PYTHON" >/dev/null 2>&1 || fail "python3 not found: install Python 3.11 (apt-get install python3.11 python3.11-venv) and rerun"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' \
  || fail "$PYTHON is $("$PYTHON" --version 2>&1); vtrain pins torch 2.13.0 for Python 3.11: set PYTHON=/path/to/python3.11 and rerun"
command -v node >/dev/null 2>&1 || fail "node not found: install Node.js 20 or newer (apt-get install nodejs npm) and rerun"
command -v npm >/dev/null 2>&1 || fail "npm not found: install npm (apt-get install npm) and rerun"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[ "$NODE_MAJOR" -ge 20 ] || fail "node $(node --version) is too old: hardhat 2 and solc need Node.js 20 or newer"

# ---- Python ---------------------------------------------------------------------------------
PY_STAMP=".venv/.vtrain-setup-stamp"
PY_HASH="$(hash_of requirements.lock pyproject.toml)"
if [ -x .venv/bin/python ] && [ "$(cat "$PY_STAMP" 2>/dev/null)" = "$PY_HASH" ]; then
  step "Python environment is up to date (.venv)"
else
  step "Creating .venv and installing pinned Python packages (requirements.lock, ~2 min the first time)"
  rm -f "$PY_STAMP"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv || fail "could not create .venv: install python3.11-venv and rerun"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock 2>&1 \
    | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip check >/dev/null || fail "pip could not install requirements.lock consistently; see the messages above, then rerun"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e . 2>&1 \
    | grep -v "^WARNING: Location" || true
  .venv/bin/python -c 'import torch, web3, solcx, pymerkle, sha3, xdist, vtrain, protocol' \
    || fail "the Python packages did not import after installation; rerun scripts/setup.sh"
  echo "$PY_HASH" > "$PY_STAMP"
fi

# ---- npm toolchain --------------------------------------------------------------------------
NPM_STAMP="node_modules/.vtrain-setup-stamp"
NPM_HASH="$(hash_of package-lock.json)"
if [ -d node_modules ] && [ "$(cat "$NPM_STAMP" 2>/dev/null)" = "$NPM_HASH" ]; then
  step "npm toolchain is up to date (node_modules)"
else
  step "Installing the npm toolchain from package-lock.json (solc, anvil, cast, hardhat)"
  npm ci --no-audit --no-fund --loglevel=error || fail "npm ci failed; check that the npm registry is reachable and rerun"
  echo "$NPM_HASH" > "$NPM_STAMP"
fi
ANVIL=node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil
CAST=node_modules/@foundry-rs/cast-linux-amd64/bin/cast
"$ANVIL" --version >/dev/null 2>&1 || fail "$ANVIL does not run (this machine must be linux x86_64)"
"$CAST" --version >/dev/null 2>&1 || fail "$CAST does not run (this machine must be linux x86_64)"
scripts/solc --version | grep -q "Version: " || fail "scripts/solc (the npm solc compiler) does not answer --version"

# ---- the main job ---------------------------------------------------------------------------
if [ "$RUN_DEMO" = 1 ]; then
  step "Running the main job: vtrain demo (the whole story on the embedded chain)"
  .venv/bin/vtrain demo || fail "vtrain demo failed (see above); the environment is installed, rerun it with .venv/bin/vtrain demo"
fi
step "Done. Run the tests with: .venv/bin/pytest"
