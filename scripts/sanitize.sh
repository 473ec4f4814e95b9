#!/usr/bin/env bash
# The sanitizer and fuzzing build: kiln built by clang with AddressSanitizer and
# UndefinedBehaviorSanitizer (any report fails the run) and instrumented for libFuzzer, into
# build-sanitize/ (no CUDA backend, no benchmarks). Runs the unit tests, the pass tests and the
# ONNX conformance suite under the sanitizers, then every fuzz harness of fuzz/: first over its
# seeds and past crashes, then for --fuzz-seconds each (default 30; 0 skips fuzzing).
# Usage: scripts/sanitize.sh [--fuzz-seconds S]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
fuzz_seconds=30
while [[ $# -gt 0 ]]; do
  case "$1" in
    --fuzz-seconds) fuzz_seconds="$2"; shift 2 ;;
    -h|--help) sed -n 2,7p "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
"$root/scripts/setup.sh"
build="$root/build-sanitize"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DKILN_SANITIZE=address,undefined -DKILN_FUZZ=ON \
  -DKILN_CUDA=OFF -DKILN_BUILD_BENCH=OFF -DKILN_WERROR=ON -DKILN_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
harnesses=(onnx_import_fuzz npy_fuzz route_fuzz engine_fuzz store_fuzz passes_fuzz)
cmake --build "$build" --target kiln_unit_tests kiln_pass_tests kiln_conformance "${harnesses[@]}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cd "$build"
echo "== unit tests under ASan+UBSan"
tests/kiln_unit_tests --gtest_brief=1
echo "== pass tests under ASan+UBSan"
tests/kiln_pass_tests --gtest_brief=1
echo "== ONNX conformance under ASan+UBSan"
tests/kiln_conformance --expected-failures "$root/tests/conformance/expected_failures.txt"
echo "== fuzzing (${fuzz_seconds} s a harness)"
if ((fuzz_seconds > 0)); then
  ctest -L fuzz --output-on-failure
else
  ctest -L fuzz -R _replay --output-on-failure
fi
