// Reference kernels for the neural ops: registration of the neural*.cc files and the pieces they
// share (declared in neural.h).
#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

std::vector<double> readAsDouble(const Tensor& tensor) {
  return ir::visitDType(tensor.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> values;
    values.reserve(static_cast<size_t>(tensor.elementCount()));
    for (T v : tensor.data<T>()) values.push_back(ir::convertElement<double>(v));
    return values;
  });
}

void writeFromDouble(Tensor& tensor, const std::vector<double>& values) {
  ir::visitDType(tensor.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto out = tensor.mutableData<T>();
    for (size_t i = 0; i < out.size() && i < values.size(); ++i) {
      out[i] = ir::convertElement<T>(values[i]);
    }
  });
}

bool nextIndex(std::vector<int64_t>& index, const std::vector<int64_t>& extent) {
  for (size_t axis = index.size(); axis-- > 0;) {
    if (++index[axis] < extent[axis]) return true;
    index[axis] = 0;
  }
  return false;
}

int64_t product(const std::vector<int64_t>& values) {
  int64_t result = 1;
  for (int64_t v : values) result *= v;
  return result;
}

void windowTaps(const ir::WindowGeometry& g, const std::vector<int64_t>& position,
                const std::vector<int64_t>& targetExtent, std::vector<WindowTap>& taps) {
  taps.clear();
  const size_t rank = g.spatialRank();
  // Per axis, the (kernel offset, target coordinate) pairs inside the target; the window's taps
  // are their cartesian product.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> axes(rank);
  for (size_t i = 0; i < rank; ++i) {
    for (int64_t k = 0; k < g.kernel[i]; ++k) {
      const int64_t coord = position[i] * g.strides[i] - g.padsBegin[i] + k * g.dilations[i];
      if (coord >= 0 && coord < targetExtent[i]) axes[i].emplace_back(k, coord);
    }
    if (axes[i].empty()) return;
  }
  std::vector<int64_t> pick(rank, 0);
  std::vector<int64_t> counts(rank);
  for (size_t i = 0; i < rank; ++i) counts[i] = static_cast<int64_t>(axes[i].size());
  do {
    WindowTap tap{0, 0};
    for (size_t i = 0; i < rank; ++i) {
      const auto& [k, coord] = axes[i][static_cast<size_t>(pick[i])];
      tap.kernel = tap.kernel * g.kernel[i] + k;
      tap.target = tap.target * targetExtent[i] + coord;
    }
    taps.push_back(tap);
  } while (nextIndex(pick, counts));
}

int64_t paddedWindowSize(const ir::WindowGeometry& g, const std::vector<int64_t>& position) {
  int64_t size = 1;
  for (size_t i = 0; i < g.spatialRank(); ++i) {
    int64_t inside = 0;
    for (int64_t k = 0; k < g.kernel[i]; ++k) {
      const int64_t coord = position[i] * g.strides[i] - g.padsBegin[i] + k * g.dilations[i];
      if (coord >= -g.padsBegin[i] && coord < g.input[i] + g.padsEnd[i]) ++inside;
    }
    size *= inside;
  }
  return size;
}

void registerNeuralKernels(KernelRegistry& registry) {
  registerConvKernels(registry);
  registerPoolKernels(registry);
  registerNormalizationKernels(registry);
  registerLinearAlgebraKernels(registry);
}

}  // namespace kiln::reference
