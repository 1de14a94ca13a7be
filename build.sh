#!/usr/bin/env bash
# Assemble every kernel variant of kernels.yaml into build/<variant>.co and check each one
# against the manifest; only what changed is rebuilt. Finds LLVM >= 20 (LLVM_BIN overrides;
# default clang-22/lld-22). Options: --force, -m MANIFEST (repeatable), --install-llvm
# (install clang-22 lld-22 llvm-22 with apt-get, as root, when LLVM is missing; never otherwise).
# The work is done by `gfxasm build` (loader/build.py); this wrapper only runs it.
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gfxasm') is None)"; then
  echo "build.sh: the gfxasm package is not installed: run 'pip install -e .' in $(pwd)" >&2
  exit 1
fi
exec python3 -m gfxasm.cli build "$@"
