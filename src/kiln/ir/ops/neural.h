// Window geometry (Conv, ConvTranspose, pooling) and Einsum plans: resolved from a node's
// attributes and input shapes, shared by shape inference and the reference kernels so that both
// read the attributes the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

// The spatial part of a sliding-window op. Output position o along axis i reads input position
// o * strides[i] - padsBegin[i] + k * dilations[i] for kernel offset k (ConvTranspose scatters
// along the same relation with input and output swapped).
struct WindowGeometry {
  std::vector<int64_t> input;  // spatial input extent
  std::vector<int64_t> kernel;
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> padsBegin;  // negative only for ConvTranspose asked for a larger output
  std::vector<int64_t> padsEnd;
  std::vector<int64_t> output;  // spatial output extent

  size_t spatialRank() const { return kernel.size(); }
};

// Conv: x is [N, C, D1..Dn], w is [M, C/group, k1..kn]. Checks the geometry attributes (not the
// channel counts, which the caller checks against `group`).
Result<WindowGeometry> resolveConvGeometry(const Node& node, const Shape& x, const Shape& w);

// ConvTranspose: x is [N, C, D1..Dn], w is [C, M/group, k1..kn]; honours output_shape,
// output_padding and auto_pad.
Result<WindowGeometry> resolveConvTransposeGeometry(const Node& node, const Shape& x,
                                                    const Shape& w);

// MaxPool, AveragePool, LpPool: the window from kernel_shape; ceil_mode applies.
Result<WindowGeometry> resolvePoolGeometry(const Node& node, const Shape& x);

// An Einsum equation bound to operand shapes. Every axis of every operand and of the output is
// a label; the ellipsis contributes one label per broadcast axis.
struct EinsumPlan {
  std::vector<int64_t> labelSizes;
  // Per operand, the element stride each label advances it by: 0 where the operand lacks the
  // label or broadcasts it, the sum of the axes' strides where a label repeats (a diagonal).
  std::vector<std::vector<int64_t>> operandStrides;
  std::vector<size_t> outputLabels;  // in output axis order
  std::vector<size_t> summedLabels;  // the labels the output does not keep
  Shape outputShape;
};

Result<EinsumPlan> planEinsum(const Node& node, const std::vector<Shape>& operandShapes);

}  // namespace kiln::ir
