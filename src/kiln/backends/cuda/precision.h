// Precision on the CUDA backend: which nodes compute in fp16 or bf16 (cuda.precision, global or
// per node), with reformat (Cast) nodes where values cross between precisions, and the knob that
// keeps normalisations and softmax in fp32 storage inside a reduced-precision region (their
// kernels compute in float32 either way, so by default they read and write the reduced type).
//
// It is a build step of the CUDA backend, after the pass pipeline and before lowering (the CPU
// backend computes in fp32): a node that runs in fp16 gets fp16 twins of its float32 inputs (a
// constant is converted once at build time, a runtime value goes through one Cast shared by all
// its fp16 readers) and writes fp16 outputs, which a Cast turns back into the original float32
// value for readers that stay in fp32 and for the graph's outputs. Casts nobody reads are
// dropped, so a chain of fp16 nodes converts only at its edges:
//
//   %y = Conv "c" (%x, %w); %z = Relu "r" (%y)         (cuda.precision=fp16)
//     =>   %x_fp16 = Cast (%x) {to=float16}
//          %y_fp16 = Conv "c" (%x_fp16, %w_fp16)        (%w_fp16: %w converted at build time)
//          %z_fp16 = Relu "r" (%y_fp16)
//          %z = Cast (%z_fp16) {to=float}
//
// tf32 changes no types: the GEMM and convolution steps read the knob and let the libraries use
// TF32 tensor cores for float32 products.
#pragma once

#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"
#include "kiln/knobs/knob.h"
#include "kiln/knobs/route.h"

namespace kiln::cuda {

extern const knobs::Knob kPrecision;   // cuda.precision: fp32|tf32|fp16|bf16
extern const knobs::Knob kNormInFp32;  // cuda.precision.norm_fp32: on|off

// The reduced type cuda.precision gives `node` (kFloat16 or kBFloat16), or nothing when the node
// stays in float32 (fp32 or tf32, an op without reduced-precision kernels, or a normalisation
// kept in fp32).
std::optional<ir::DType> reducedTypeFor(const ir::Node& node, const knobs::Route& route);

// Whether float32 products at `node` may use TF32 tensor cores (cuda.precision=tf32).
bool allowsTf32(const ir::Node& node, const knobs::Route& route);

// Rewrites `graph` as above; returns one line per change ("c: fp16", "cast x to fp16"). The graph
// must be shape-inferred; types are set directly (no re-inference).
Result<std::vector<std::string>> assignPrecision(ir::Graph& graph, const knobs::Route& route);

}  // namespace kiln::cuda
