// NVRTC, CUDA's runtime compiler, for the kernels kiln generates while it builds a plan
// (codegen/fused_codegen.h). The library is loaded on first use (dlopen of libnvrtc.so.13, as the
// toolkit or the nvidia-cuda-nvrtc wheel installs it, found through the loader's search path and
// then the toolkit folder kiln was built against), so a CUDA build of kiln still runs where it is
// missing: lowering asks nvrtcAvailable() and keeps the interpreted kernels instead.
//
// Compiling needs no GPU: the target is named (sm_90), so tests compile generated sources
// anywhere NVRTC is.
#pragma once

#include <string>
#include <string_view>

#include "kiln/base/status.h"

namespace kiln::cuda {

// Whether NVRTC could be loaded; when not, `why` (if given) says what was tried.
bool nvrtcAvailable(std::string* why = nullptr);

// "13.0", or the reason there is no NVRTC.
std::string nvrtcVersion();

// Compiles CUDA C++ `source` (named `name` in diagnostics) into machine code for
// sm_<computeMajor><computeMinor>. The result for a (source, target) pair is kept for the
// process's lifetime, so plans that generate the same kernels compile them once. A compile error
// is kInternal (kiln wrote the source) with NVRTC's log; a missing library is kUnsupported.
Result<std::string> compileToCubin(std::string_view source, std::string_view name, int computeMajor,
                                   int computeMinor);

// How many compileToCubin calls compiled (rather than found their result kept), for tests and the
// build-time report.
int nvrtcCompilations();

}  // namespace kiln::cuda
