// What the neural-op reference kernels (neural*.cc) share: per-file registration, conversion to
// and from double, and walking sliding windows.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kiln/ir/ops/neural.h"
#include "kiln/reference/kernel.h"

namespace kiln::reference {

void registerConvKernels(KernelRegistry& registry);
void registerPoolKernels(KernelRegistry& registry);
void registerNormalizationKernels(KernelRegistry& registry);
void registerLinearAlgebraKernels(KernelRegistry& registry);

// Every element as double (float16 and bfloat16 through float).
std::vector<double> readAsDouble(const Tensor& tensor);
// Rounds `values` into `tensor`'s dtype, element by element.
void writeFromDouble(Tensor& tensor, const std::vector<double>& values);

// Advances a row-major multi-index within `extent`; false once it wraps past the last.
bool nextIndex(std::vector<int64_t>& index, const std::vector<int64_t>& extent);

int64_t product(const std::vector<int64_t>& values);

// One kernel position of a window that lands inside the target: flat offsets into the kernel
// and into the target's spatial extent.
struct WindowTap {
  int64_t kernel;
  int64_t target;
};

// The taps of the window anchored at spatial position `position`: target coordinate
// position * stride - padBegin + k * dilation, kept when inside [0, targetExtent). For forward
// windows the target is the input; ConvTranspose scatters into its output with the same rule.
void windowTaps(const ir::WindowGeometry& g, const std::vector<int64_t>& position,
                const std::vector<int64_t>& targetExtent, std::vector<WindowTap>& taps);

// How many of the window's positions fall inside the padded input: AveragePool's divisor with
// count_include_pad.
int64_t paddedWindowSize(const ir::WindowGeometry& g, const std::vector<int64_t>& position);

// Float types accumulate in double, integers in uint64_t (wrapping, as fixed-width integer
// arithmetic does).
template <typename T>
inline constexpr bool kFloatLike = std::is_floating_point_v<T> || std::is_same_v<T, ir::Float16> ||
                                   std::is_same_v<T, ir::BFloat16>;
template <typename T>
using AccumulatorOf = std::conditional_t<kFloatLike<T>, double, uint64_t>;

template <typename T>
AccumulatorOf<T> widen(T value) {
  if constexpr (kFloatLike<T>) {
    return ir::convertElement<double>(value);
  } else {
    return static_cast<uint64_t>(value);
  }
}

template <typename T>
T narrow(AccumulatorOf<T> value) {
  if constexpr (kFloatLike<T>) {
    return ir::convertElement<T>(value);
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace kiln::reference
