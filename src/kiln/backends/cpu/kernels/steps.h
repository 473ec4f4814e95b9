// The CPU backend's kernel families. Each factory returns null when its kernels do not apply to
// the node (dtype, attributes) or the route picks another tactic for it; lowering then tries the
// next family and finally the reference kernel.
#pragma once

#include <memory>

#include "kiln/backends/cpu/plan.h"

namespace kiln::cpu {

std::unique_ptr<Step> makeGemmStep(const ir::Node& node, const knobs::Route& route);
// float32 Conv, FusedConv and NhwcConv by oneDNN primitives, where cpu.conv.source=onednn picks
// them (conv_onednn.cc); ranked before makeConvStep, which takes every node it declines.
std::unique_ptr<Step> makeOnednnConvStep(const ir::Node& node, const knobs::Route& route);
std::unique_ptr<Step> makeConvStep(const ir::Node& node, const knobs::Route& route);
// MaxPool (without Indices), AveragePool, GlobalAveragePool, GlobalMaxPool on 4-D float32.
std::unique_ptr<Step> makePoolStep(const ir::Node& node, const knobs::Route& route);
// Softmax and LogSoftmax over the last axis, float32.
std::unique_ptr<Step> makeSoftmaxStep(const ir::Node& node, const knobs::Route& route);
std::unique_ptr<Step> makeAttentionStep(const ir::Node& node, const knobs::Route& route);
// LayerNormalization over trailing axes, float32, without the Mean and InvStdDev outputs.
std::unique_ptr<Step> makeLayerNormStep(const ir::Node& node, const knobs::Route& route);
// Transpose of any rank, any fixed-size dtype.
std::unique_ptr<Step> makeTransposeStep(const ir::Node& node, const knobs::Route& route);
// float32 unary ops, broadcasting Add/Sub/Mul/Div/Pow, and last-axis ReduceMean.
std::unique_ptr<Step> makeEltwiseStep(const ir::Node& node, const knobs::Route& route);
std::unique_ptr<Step> makeFusedEltwiseStep(const ir::Node& node, const knobs::Route& route);
// Data movement for any dtype: the copying shape ops, Concat, Split, Slice, Expand, Tile, Pad,
// Gather, Where, Resize, and Cast between float32, int64, int32 and bool (datamove.cc).
std::unique_ptr<Step> makeDataMoveStep(const ir::Node& node, const knobs::Route& route);
// ReduceSum, ReduceMean, ReduceMax and ReduceMin on float32 over constant axes (reduce.cc).
std::unique_ptr<Step> makeReduceStep(const ir::Node& node, const knobs::Route& route);
// Runs the node with the reference executor's kernel, over arena views: correct for every op,
// fast for none. Its tactic is "reference".
std::unique_ptr<Step> makeReferenceStep(const ir::Node& node);

}  // namespace kiln::cpu
