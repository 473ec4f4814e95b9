// The per-output-channel view of the constant weight and bias of a Conv, ConvTranspose, Gemm or
// MatMul, shared by the passes that fold a per-channel scale and shift into them
// (fold_batchnorm.cc, fold_affine_into_conv.cc): which output channel each weight element feeds,
// the bias per channel, and new initializers for the folded values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

// The element types whose weights a fold may rescale in double and round back.
bool isFoldableFloat(ir::DType dtype);

// Every element of `tensor`, as double.
std::vector<double> tensorValues(const ir::Tensor& tensor);

// A new initializer holding `values` converted to `dtype`, named after `base` (made unique).
ir::Value* addFoldedConstant(ir::Graph& graph, const std::string& base, ir::DType dtype,
                             const ir::Shape& shape, const std::vector<double>& values);

// The output channel each element of `producer`'s weight (input 1) feeds, for its layout: Conv
// [M, C/group, k...], ConvTranspose [C, M/group, k...], Gemm's B ([K, N] or [N, K] with transB,
// opset 7 on) and MatMul's 2-D B [K, N]. Null when the weight does not have `channels` output
// channels in that layout.
std::optional<std::vector<int64_t>> weightOutputChannels(const ir::Node& producer,
                                                         int64_t channels);

// `producer`'s bias per output channel (zero without one; Gemm's C times beta), or null when the
// bias is not a constant that varies along the output channels alone. MatMul has none.
std::optional<std::vector<double>> biasPerChannel(const ir::Node& producer, int64_t channels);

}  // namespace kiln::passes
