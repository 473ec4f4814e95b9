#!/usr/bin/env bash
# Packs what a GPU machine without Debian's libraries needs to run kiln's CUDA and knob tests, the
# conformance suite and the GPU benchmarks: the binaries of a CUDA build (debug info stripped), the
# Debian shared libraries they link (CUDA's own libraries, glibc and libstdc++ are the GPU
# machine's), the ONNX backend test data and the expected-failure list, as one archive,
# .device/kiln-device.tar.xz. The device tool carries it (`carry: [".device"]`); there:
#   mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz &&
#     export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib  # + NVRTC
#   /tmp/k/bin/kiln_cuda_tests; /tmp/k/bin/kiln_conformance --backend cuda --data-dir /tmp/k/testdata ...
# Usage: scripts/device-pack.sh [--kiln-only|--tune] [build folder, default build/]
#   --kiln-only  the kiln binary and its libraries alone (no tests, no test data): a smaller
#                archive, leaving room in the device tool's 64 MiB carry for a tuning campaign's
#                stores (bench/gpu/tune.py --resume)
#   --tune       kiln with kiln_tune_tests and kiln_faulty (the tuner's tests, fault injection
#                included) and no test data: a tuning campaign plus the tuner's tests in one call
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
kiln_only=0
tune_only=0
if [[ "${1:-}" == "--kiln-only" ]]; then
  kiln_only=1
  shift
elif [[ "${1:-}" == "--tune" ]]; then
  kiln_only=1
  tune_only=1
  shift
fi
build="${1:-$root/build}"
out="$root/.device"
stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/testdata"
binaries=(kiln tests/kiln_cuda_tests tests/kiln_knob_tests tests/kiln_conformance tests/kiln_tune_tests tests/kiln_faulty)
if ((tune_only)); then
  binaries=(kiln tests/kiln_tune_tests tests/kiln_faulty)
  ninja -C "$build" kiln_cli kiln_tune_tests kiln_faulty sample_model >/dev/null
elif ((kiln_only)); then
  binaries=(kiln)
  ninja -C "$build" kiln_cli sample_model >/dev/null
else
  ninja -C "$build" kiln_cli kiln_cuda_tests kiln_knob_tests kiln_conformance kiln_tune_tests kiln_faulty sample_model >/dev/null
fi
for binary in "${binaries[@]}"; do
  strip --strip-debug -o "$stage/bin/$(basename "$binary")" "$build/$binary"
done
# Every library the binaries resolve here, except those the GPU machine has its own of.
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcudnn[^/]*|libcublas[^/]*|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
if ((!kiln_only)); then
  for suite in node pytorch-converted pytorch-operator simple; do
    cp -r "/usr/share/libonnx-testdata/data/$suite" "$stage/testdata/"
  done
  cp "$root/tests/conformance/expected_failures.txt" "$stage/"
fi
# kiln_tune_tests finds kiln, kiln_faulty and the sample model where this build put them: link
# them there (bench/gpu/checks.sh does).
mkdir -p "$stage/models"
cp "$build/models/sample_cnn.onnx" "$stage/models/"
echo "$build" > "$stage/BUILD_DIR"
# The commit the binaries were built from (+dirty with uncommitted changes), for reports.
commit="$(git -C "$root" rev-parse --short=12 HEAD)"
git -C "$root" diff --quiet HEAD -- src tests CMakeLists.txt || commit="$commit+dirty"
echo "$commit" > "$stage/COMMIT"
# One xz stream with a dictionary larger than any binary: each test binary links the whole of
# libkiln (its CUDA kernels included), so the second and later copies compress to almost nothing.
# The full pack is 41 MB so (2026-12-07; 70 MB at xz -6 in blocks, over the device tool's 64 MiB
# carry with the working tree), at the price of one core for about two minutes; unpacking needs
# about 200 MiB of memory.
tar -C "$stage" -cf - . | xz -T1 -9 --lzma2=dict=192MiB >"$out/kiln-device.tar.xz.tmp"
mv "$out/kiln-device.tar.xz.tmp" "$out/kiln-device.tar.xz"
rm -rf "$stage"
ls -la "$out/kiln-device.tar.xz"
