#!/usr/bin/env bash
# Fast incremental developer build: compiles the extension with CMake into build/dev and
# copies it into src/fastcopy/, so `PYTHONPATH=src python -m pytest` uses it without pip.
# Usage: tools/dev_build.sh [extra cmake args]   (BUILD_DIR overrides build/dev)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build/dev}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTCOPY_BUILD_MODULE=ON \
  -Dpybind11_DIR="$(python -c 'import pybind11; print(pybind11.get_cmake_dir())')" "$@" >/dev/null
cmake --build "$BUILD_DIR"
# Copy, then rename over the old module: a Python process that has it loaded keeps the old
# file (overwriting it in place would change the pages it runs from: SIGBUS).
for so in "$BUILD_DIR"/_core*.so; do
  cp "$so" "src/fastcopy/$(basename "$so").tmp"
  mv -f "src/fastcopy/$(basename "$so").tmp" "src/fastcopy/$(basename "$so")"
done
echo "built $(ls src/fastcopy/_core*.so)"
