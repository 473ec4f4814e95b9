#!/usr/bin/env bash
# Installs the Debian 12 packages kiln's build and tests need. Idempotent: installs only what is
# missing, so it is cheap to run before every build.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libprotobuf-dev protobuf-compiler   # ONNX files are protobuf
  libonnx-dev                         # onnx.proto, the ONNX schema kiln compiles
  libonnx-testdata                    # the ONNX backend test data (conformance)
  libcli11-dev libfmt-dev             # command line, formatting
  nlohmann-json3-dev                  # JSON (knob listings, reports)
  libzip-dev zlib1g-dev               # .npz archives
  libopenblas-dev                     # BLAS tactic source of the CPU backend
  libdnnl-dev                         # oneDNN tactic source
  libsqlite3-dev                      # the tuner's result store
  libpq-dev postgresql                # the shared store (PostgreSQL), and a server for its tests
  libgtest-dev libgmock-dev           # unit tests
  chromium poppler-utils              # the HTML report's test renders it and reads the page
  clang libclang-rt-14-dev            # scripts/sanitize.sh: ASan, UBSan and libFuzzer
  python3                             # the self-tests of bench/gpu's analysis scripts
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kiln setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "kiln setup: run as root or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
