// kiln's NHWC ops, which the layout pass (src/kiln/passes/layout_nhwc.cc) creates: each is an
// ONNX (or fused) op computing the same function on channels-last tensors.
//
//   kiln.NhwcConv(X [N,H,W,C], W [kH,kW,C/group,M], B? [M], residual? [N,OH,OW,M])
//       = FusedConv's attributes and semantics, output [N,OH,OW,M]
//   kiln.NhwcMaxPool, kiln.NhwcAveragePool, kiln.NhwcGlobalAveragePool, kiln.NhwcGlobalMaxPool
//       = the ONNX pool of the same name (MaxPool without its Indices output) on [N,H,W,C]
//
// And a channel shuffle, which the fuse_channel_shuffle pass makes of ShuffleNet's
// Concat -> Reshape -> Transpose -> Reshape -> Split, in either layout:
//
//   kiln.ChannelShuffle(X_1, ..., X_n) -> (Y_1, ..., Y_m) {axis (default 1), groups (required)}
//       X = Concat(X_1..X_n, axis) with C channels along `axis`; Y = X's channels reordered so
//       that channel j of Y is channel (j % groups) * (C / groups) + j / groups of X (the
//       Reshape to [.., groups, C / groups, ..], the Transpose of those two axes and the Reshape
//       back); Y_1..Y_m = Split(Y, axis) into m equal parts. The inputs share a dtype and every
//       dimension but `axis`; groups and m divide C.
#pragma once

#include <string>
#include <vector>

#include "kiln/ir/tensor.h"

namespace kiln::ir {

// Transpose permutations (output axis i reads input axis perm[i]) between the layouts.
inline const std::vector<int64_t> kNchwToNhwc = {0, 2, 3, 1};
inline const std::vector<int64_t> kNhwcToNchw = {0, 3, 1, 2};
// Conv weights: ONNX's [M, C/group, kH, kW] and NhwcConv's [kH, kW, C/group, M].
inline const std::vector<int64_t> kOihwToHwio = {2, 3, 1, 0};
inline const std::vector<int64_t> kHwioToOihw = {3, 2, 0, 1};

// The NHWC op that computes ONNX op `opType` ("Conv" and kiln's "FusedConv" both give
// "NhwcConv"), or "" if there is none.
std::string nhwcOpFor(const std::string& opType);
// The op an NHWC op stands for (in kiln's domain for NhwcConv: FusedConv), or "" if `opType` is
// not one.
std::string opForNhwc(const std::string& opType);

// kiln.ChannelShuffle's source of output channel j (over all outputs, in order): the channel of
// the inputs' concatenation it copies.
inline int64_t channelShuffleSource(int64_t j, int64_t channels, int64_t groups) {
  return (j % groups) * (channels / groups) + j / groups;
}

// `tensor` with its axes permuted (output axis i is input axis perm[i]), any dtype.
Tensor permuteTensor(const Tensor& tensor, const std::vector<int64_t>& perm);
Shape permuteShape(const Shape& shape, const std::vector<int64_t>& perm);

}  // namespace kiln::ir
