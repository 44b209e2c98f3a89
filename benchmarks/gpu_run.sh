#!/usr/bin/env bash
# Run benchmarks/gpu_run.py where sparsefx is not installed (a GPU machine with torch and no network):
# the package is assembled from this checkout with symlinks (sparsefx/'s entries, passes/ and runtime/
# as sparsefx.passes and sparsefx.runtime, as pyproject.toml maps them) and put on PYTHONPATH.
#
#     bash benchmarks/gpu_run.sh [gpu_run.py options]      # from anywhere; python3 is the interpreter
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg="$(mktemp -d)"
trap 'rm -rf "$pkg"' EXIT
mkdir "$pkg/sparsefx"
for entry in "$root"/sparsefx/*; do
    [ "$(basename "$entry")" = "__pycache__" ] || ln -s "$entry" "$pkg/sparsefx/"
done
ln -s "$root/passes" "$pkg/sparsefx/passes"
ln -s "$root/runtime" "$pkg/sparsefx/runtime"

export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# from $pkg: run from the checkout, python3 -c would find its sparsefx/ (no runtime/ in it) first
(cd "$pkg" && python3 -c "import sparsefx.runtime.run, sparsefx.passes; print('sparsefx from', sparsefx.__path__[0])")
cd "$root"
python3 benchmarks/gpu_run.py "$@"
