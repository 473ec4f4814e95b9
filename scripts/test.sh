#!/usr/bin/env bash
# Builds kiln and runs the whole test suite: unit, end-to-end and ONNX conformance tests.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)"
