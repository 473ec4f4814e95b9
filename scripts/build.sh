#!/usr/bin/env bash
# Configures and builds kiln into build/ (warnings are errors). Usage: scripts/build.sh [targets]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON >/dev/null
cmake --build "$root/build" ${1:+--target "$@"}
