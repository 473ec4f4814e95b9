// Conv, kiln.FusedConv, kiln.NhwcConv and ConvTranspose on the GPU, from one of two sources
// (cuda.conv.source):
//
//   - cudnn: cuDNN 9's graph API. prepare() builds an operation graph of the convolution (for
//     ConvTranspose the backward-data convolution, ConvTranspose being the gradient of Conv with
//     respect to its input: X as dY, Y as dX, W as it is) followed by the bias add, the residual
//     add and the activation, each fused as a POINTWISE node where cuDNN's modes compute exactly
//     what kiln's op does (cuda.conv.epilogue=separate fuses none);
//     heuristics (mode A or B as cuda.conv.heuristics says, then the fallback list) give engine
//     configs, of which those that would not keep the step's accuracy or want more workspace than
//     cuda.conv.workspace allows are dropped (below); the first that finalizes is kept
//     (cuda.conv.algo=heuristic), or the fastest of up to cuda.conv.candidates timed on the
//     step's own buffers (timed). What the graph does not fuse runs after it in kiln's epilogue
//     kernel (conv.cu).
//   - native: kiln's direct kernels (conv.cu), epilogue fused; ConvTranspose gathered per output
//     element.
//
// Element types: float32, and float16 / bfloat16 where cuda.precision made the node reduced or
// the model gave it so (all of its tensors then have the reduced type). cuDNN reads and writes
// the reduced type with float math (the convolution's compute type, the pointwise math precision
// and the virtual tensors between them are all float), on tensor cores where an engine has them;
// kiln's kernels load into float and round once. The engines dropped: down-converted inputs and
// reduced-precision reductions (fp16 accumulation), FFT and Winograd transforms, unless
// cuda.conv.reduced_precision, cuda.conv.fft and cuda.conv.winograd allow them (they change
// numerics), and tensor cores for float32 unless cuda.precision=tf32 allows TF32 for the node
// (allowsTf32; not for ConvTranspose, whose step records fp32). ConvTranspose also drops
// nondeterministic engines (atomic accumulation): a run must give the same bits every time;
// cuda.conv.nondeterministic=deny drops them for every convolution.
//
// Where cuDNN cannot be used the step runs kiln's kernel instead, never the host: at lowering for
// asymmetric pads (cuDNN pads both ends of a dimension alike), ConvTranspose geometries a forward
// convolution cannot mirror (negative pads from output_shape, output_padding of a stride or more)
// and empty tensors; in prepare() when no engine finalizes even for the bare convolution (the
// step's tactic then says "kiln.conv" or "kiln.convtranspose"). When the fused graph has no
// engine, the bare convolution plus kiln's epilogue kernel is tried before that.
//
// Tactics: "cudnn" (everything in the cuDNN graph), "cudnn+epilogue" (kiln's epilogue kernel
// after it), the same with ".timed" after "cudnn" for cuda.conv.algo=timed, and "kiln.conv"
// ("kiln.convtranspose" for ConvTranspose).
//
// Depthwise convolutions in NHWC (kiln.NhwcConv with group == C == M) take kiln's depthwise
// kernels whatever the source (cuda.conv.depthwise=kiln, the default), epilogue fused: the window
// kernel (tactic "kiln.conv.depthwise.window") where the kernel is 3, 5 or 7 wide with stride 1
// or 2 and dilation 1 along the row, a thread computing several outputs of a row from one load of
// each input pixel they read, else the direct kernel ("kiln.conv.depthwise"), a thread loading
// every tap of its outputs (both take a vector of channels a thread). cuDNN's
// engines for them were measured at 10 to 30 times the memory-bound time on the H200
// (EfficientNet-B0, batch 8, fp16: 1.12 ms of the model's 2.93 in 16 depthwise layers).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/kernels/conv.h"
#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/backends/cuda/precision.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/layout.h"
#include "kiln/ir/ops/neural.h"

namespace kiln::cuda {

const knobs::Knob kConvSource = knobs::declareKnob({
    .name = "cuda.conv.source",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"cudnn", "native"},
    .defaultValue = "cudnn",
    .help = "convolution kernels (Conv, kiln's fused and NHWC convolutions, ConvTranspose): "
            "cuDNN's graph API (asymmetric pads, empty tensors and shapes no cuDNN engine takes "
            "still run kiln's kernel), or kiln's own direct kernel",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvAlgo = knobs::declareKnob({
    .name = "cuda.conv.algo",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"heuristic", "timed"},
    .defaultValue = "heuristic",
    .help = "cuDNN engine choice: the first config cuDNN's heuristics rank highest among those "
            "that keep the step's precision, or the fastest of up to eight of them, timed on the "
            "step's buffers when the plan is prepared",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvEpilogue = knobs::declareKnob({
    .name = "cuda.conv.epilogue",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fused", "separate"},
    .defaultValue = "fused",
    .help = "bias, residual and activation of a cuDNN convolution: inside cuDNN's graph where "
            "its pointwise modes express them, or all in kiln's epilogue kernel after the bare "
            "convolution",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvEpilogueBlock = knobs::declareKnob({
    .name = "cuda.conv.epilogue.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of kiln's convolution epilogue kernel (the bias, residual or "
            "activation a cuDNN convolution leaves: all of them with cuda.conv.epilogue=separate), "
            "a thread an output element",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwise = knobs::declareKnob({
    .name = "cuda.conv.depthwise",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"kiln", "source"},
    .defaultValue = "kiln",
    .help = "depthwise NHWC convolutions (kiln.NhwcConv with group == C == M): kiln's "
            "vectorised depthwise kernel with its epilogue fused, or whatever cuda.conv.source "
            "chooses",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwisePixels = knobs::declareKnob({
    .name = "cuda.conv.depthwise.pixels",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1", "2", "4"},
    .defaultValue = "1",
    .help = "output pixels along a row each thread of kiln's direct depthwise kernel computes "
            "(the convolutions the window kernel does not take, and all with "
            "cuda.conv.depthwise.window=loads): more reuse each weight vector it loads, fewer "
            "threads run",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwiseWindow = knobs::declareKnob({
    .name = "cuda.conv.depthwise.window",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"registers", "loads"},
    .defaultValue = "registers",
    .help = "depthwise convolutions whose kernel is 3, 5 or 7 wide with stride 1 or 2 and "
            "dilation 1 along the row (cuda.conv.depthwise=kiln). registers: the window kernel, "
            "a thread loading each input pixel its outputs read once and adding it into each of "
            "them from registers ((P - 1) * stride + 2K vector loads a kernel row for P outputs). "
            "loads: the direct kernel, loading every tap of every output (2PK). Same sums in the "
            "same order: the same bits",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwiseWindowPixels = knobs::declareKnob({
    .name = "cuda.conv.depthwise.window.pixels",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "8", "4", "2"},
    .defaultValue = "auto",
    .help = "output pixels along a row each thread of the depthwise window kernel computes "
            "(cuda.conv.depthwise.window=registers): more reuse of each input pixel loaded, more "
            "registers and fewer threads. auto: 8 or 4, the most that keep a thread's "
            "accumulators within 32 floats and leave 2^17 threads, else 2",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwiseWindowRegisters = knobs::declareKnob({
    .name = "cuda.conv.depthwise.window.registers",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"natural", "56"},
    .defaultValue = "natural",
    .help = "registers a thread of the depthwise window kernel may take at float16 / bfloat16: "
            "what ptxas gives each instance (natural), or at most 56 (an instance compiled for 9 "
            "blocks of 128 threads an SM, 1152 threads, launched in 128-thread blocks; "
            "cuda.conv.depthwise.block does not apply) wherever ptxas spilled nothing at that "
            "bound (ConvNeXt's 7x7 instance at 2 channels and 8 pixels: 64 registers natural, "
            "56 capped). Same bits",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwiseBlock = knobs::declareKnob({
    .name = "cuda.conv.depthwise.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "occupancy"},
    .defaultValue = "256",
    .help = "threads per block of kiln's depthwise kernels, window and direct "
            "(cuda.conv.depthwise=kiln); occupancy: the CUDA occupancy calculator's block for "
            "the instance launched (the largest of at most 512 threads that leaves the most "
            "threads resident an SM: 9 blocks of 128 or 3 of 384 at 56 registers a thread, "
            "1152 threads, where 256-thread blocks leave 1024)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvDepthwiseVector = knobs::declareKnob({
    .name = "cuda.conv.depthwise.vector",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "16", "8", "4"},
    // auto: two elements a thread. With the window kernel at fp16 (H100, 2026-12-07,
    // bench/gpu/results/2026-12-07-depthwise.md), 4 bytes against 8 and 16: ConvNeXt-T b8 0.9123
    // against 0.9687 and 0.9731 ms, MobileNetV3-L b1 0.3173 against 0.3444 and 0.3967;
    // EfficientNet-B0 b8 is faster at 8 (0.8414 against 0.8628 at 4). float32 is not measured.
    .defaultValue = "auto",
    .help = "the widest run of channels, in bytes, a thread of kiln's depthwise kernels (window "
            "and direct) loads and stores at once (cuda.conv.depthwise=kiln; narrower where the "
            "channels or pointers do not allow it): narrower runs give more threads fewer bytes "
            "and registers each. auto: two elements (4 bytes for float16 and bfloat16, 8 for "
            "float32)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvNativeBlock = knobs::declareKnob({
    .name = "cuda.conv.native.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512"},
    .defaultValue = "256",
    .help = "threads per block of kiln's direct and transposed convolution kernels (a thread an "
            "output element; cuda.conv.source=native, and the shapes cuDNN does not take)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvEngineRank = knobs::declareKnob({
    .name = "cuda.conv.engine_rank",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"0", "1", "2", "3"},
    .defaultValue = "0",
    .help = "under cuda.conv.algo=heuristic, which of the engine configs that plan (in cuDNN's "
            "heuristic order, accurate enough and within the workspace) a convolution takes: the "
            "first, or the second, third or fourth (the last there is where fewer plan), so a "
            "search can try other engines without timing them layer by layer",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvNativeBelow = knobs::declareKnob({
    .name = "cuda.conv.native_below",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"0", "65536", "1048576"},
    .defaultValue = "0",
    .help = "convolutions of fewer multiply-adds than this run kiln's direct kernel instead of "
            "cuDNN, whose per-call cost can outweigh tiny problems (the 1x1 convolutions of "
            "squeeze-excite blocks over 1x1 images); 0: none",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvWorkspace = knobs::declareKnob({
    .name = "cuda.conv.workspace",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "0", "16", "64", "1024"},
    .defaultValue = "256",
    .help = "MiB of scratch a cuDNN engine may ask for: engines that want more are passed over "
            "(0 keeps only engines that need none; more lets the larger-tile and split-K engines "
            "in, at the arena's cost)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvCandidates = knobs::declareKnob({
    .name = "cuda.conv.candidates",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"8", "2", "4", "16"},
    .defaultValue = "8",
    .help = "how many engine configs cuda.conv.algo=timed times, taken in cuDNN's heuristic "
            "order (more: a longer build and a better chance of the fastest)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvTimingRuns = knobs::declareKnob({
    .name = "cuda.conv.timing_runs",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"3", "1", "10"},
    .defaultValue = "3",
    .help = "timed runs of each engine config under cuda.conv.algo=timed, after one untimed run "
            "(more: less noise in the choice, a longer build)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvHeuristics = knobs::declareKnob({
    .name = "cuda.conv.heuristics",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"a", "b"},
    .defaultValue = "a",
    .help = "the cuDNN heuristics that rank engine configs before its fallback list: mode A (fast "
            "to query, what cuDNN recommends by default) or mode B (a slower, more accurate "
            "ranking on some problems)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConvWinograd = knobs::declareKnob({
    .name = "cuda.conv.winograd",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"deny", "allow"},
    .defaultValue = "deny",
    .help = "cuDNN engines that compute through Winograd transforms: passed over (their results "
            "drift from the direct sum), or allowed where the heuristics rank them",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kConvFft = knobs::declareKnob({
    .name = "cuda.conv.fft",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"deny", "allow"},
    .defaultValue = "deny",
    .help = "cuDNN engines that compute through FFTs: passed over, or allowed where the "
            "heuristics rank them",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kConvReducedPrecision = knobs::declareKnob({
    .name = "cuda.conv.reduced_precision",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"deny", "allow"},
    .defaultValue = "deny",
    .help = "cuDNN engines that down-convert their inputs or accumulate in the reduced type "
            "(float16 sums): passed over, or allowed (faster tensor-core engines, fewer bits)",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kConvNondeterministic = knobs::declareKnob({
    .name = "cuda.conv.nondeterministic",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"allow", "deny"},
    .defaultValue = "allow",
    .help = "cuDNN engines that accumulate with atomics (bits may differ run to run) for forward "
            "convolutions: allowed, or passed over so every run gives the same bits "
            "(ConvTranspose passes them over always)",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

constexpr int64_t kWorkspaceAlignment = 256;
constexpr int64_t kTensorAlignment = 16;  // every arena, weight and workspace range is 256-aligned

int64_t alignUp(int64_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// ---------------------------------------------------------------------------------------------
// The convolution a node asks for.

struct ConvProblem {
  ConvGeometry geometry;  // strides of the node's own layouts (kiln's kernel reads these)
  ElementType type = ElementType::kFloat32;  // of every tensor
  size_t spatialRank = 2;                    // 1..3, as the node has it
  // ConvTranspose: geometry.channels is X's C, outChannels Y's M, wStrides over (c, m within the
  // group, kernel axes); padBegin may be negative.
  bool transpose = false;
  // cuDNN can express the geometry: pads alike at both ends (for ConvTranspose also not
  // negative, and X's extents those a convolution of Y with them gives).
  bool cudnnGeometry = true;
  bool empty = false;  // some tensor has no elements
  bool nhwc = false;
  bool hasBias = false;
  bool hasResidual = false;
  bool weightsConstant = false;
  ConvEpilogue epilogue;
  int64_t outputElements = 0;
  int64_t outputSpatial = 0;  // elements of one output plane
  int64_t weightElements = 0;
  std::string shapes;  // "X [..] W [..]": for messages
  // A depthwise NHWC convolution launchDepthwiseNhwc takes (group == C == M, 2-D, contiguous).
  bool depthwise = false;
};

// Element strides over (n, c, d, h, w) from the strides of the node's batch, channel and spatial
// axes, the spatial axes right-aligned; a missing leading spatial axis gets the stride it would
// have as an axis of extent 1.
void alignStrides(int64_t batchStride, int64_t channelStride,
                  const std::vector<int64_t>& spatialStrides,
                  const std::vector<int64_t>& spatialExtents, int64_t out[5]) {
  const size_t missing = 3 - spatialStrides.size();
  int64_t extent[3] = {1, 1, 1};
  out[0] = batchStride;
  out[1] = channelStride;
  for (size_t i = 0; i < spatialStrides.size(); ++i) {
    out[2 + missing + i] = spatialStrides[i];
    extent[missing + i] = spatialExtents[i];
  }
  for (size_t axis = missing; axis-- > 0;) out[2 + axis] = out[3 + axis] * extent[axis + 1];
}

// The activation attributes of a FusedConv / NhwcConv (fused.cc); nullopt for one kiln's
// epilogue does not implement or a malformed parameter.
std::optional<ConvEpilogue> readEpilogue(const ir::Node& node) {
  ConvEpilogue epilogue;
  if (!node.hasAttribute("activation")) return epilogue;
  auto name = node.getString("activation", "");
  if (!name.isOk()) return std::nullopt;
  struct Entry {
    const char* name;
    ConvActivation activation;
    float alpha, beta;  // the ONNX op's defaults
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  static const Entry kEntries[] = {
      {"Relu", ConvActivation::kRelu, 0, 0},
      {"LeakyRelu", ConvActivation::kLeakyRelu, 0.01f, 0},
      {"Clip", ConvActivation::kClip, -kInf, kInf},
      {"Sigmoid", ConvActivation::kSigmoid, 0, 0},
      {"HardSigmoid", ConvActivation::kHardSigmoid, 0.2f, 0.5f},
      {"HardSwish", ConvActivation::kHardSwish, 0, 0},
      {"Tanh", ConvActivation::kTanh, 0, 0},
      {"Gelu", ConvActivation::kGelu, 0, 0},
      {"GeluTanh", ConvActivation::kGeluTanh, 0, 0},
      {"Silu", ConvActivation::kSilu, 0, 0},
  };
  for (const Entry& entry : kEntries) {
    if (*name != entry.name) continue;
    auto alpha = node.getFloat("activation_alpha", entry.alpha);
    auto beta = node.getFloat("activation_beta", entry.beta);
    if (!alpha.isOk() || !beta.isOk()) return std::nullopt;
    epilogue.activation = entry.activation;
    epilogue.alpha = *alpha;
    epilogue.beta = *beta;
    return epilogue;
  }
  return std::nullopt;
}

std::vector<int64_t> tail(const std::vector<int64_t>& values, size_t from) {
  return std::vector<int64_t>(values.begin() + static_cast<std::ptrdiff_t>(from), values.end());
}

// Conv (X, W, B?), FusedConv (X, W, B?, residual?) and NhwcConv (the same, channels-last) in
// float32, float16 or bfloat16 (every tensor the same) with 1 to 3 spatial axes; nullopt for
// anything else.
std::optional<ConvProblem> readProblem(const ir::Node& node) {
  const bool onnxConv = node.domain.empty() && node.opType == "Conv";
  const bool fusedConv = node.domain == ir::kKilnDomain && node.opType == "FusedConv";
  const bool nhwcConv = node.domain == ir::kKilnDomain && node.opType == "NhwcConv";
  if (!onnxConv && !fusedConv && !nhwcConv) return std::nullopt;
  const ir::Value* x = node.input(0);
  const ir::Value* w = node.input(1);
  const ir::Value* y = node.outputs.size() == 1 ? node.outputs[0] : nullptr;
  if (!x || !w || !y || node.inputs.size() > (onnxConv ? 3u : 4u)) return std::nullopt;
  const std::optional<ElementType> type = floatTypeOf(y->dtype);
  if (!type) return std::nullopt;
  for (const ir::Value* value : node.inputs) {
    if (value && value->dtype != y->dtype) return std::nullopt;
  }
  const size_t rank = x->shape.rank();
  if (rank < 3 || rank > 5 || w->shape.rank() != rank || (nhwcConv && rank != 4)) {
    return std::nullopt;
  }
  const ir::Shape nchw = nhwcConv ? ir::permuteShape(x->shape, ir::kNhwcToNchw) : x->shape;
  const ir::Shape oihw = nhwcConv ? ir::permuteShape(w->shape, ir::kHwioToOihw) : w->shape;
  auto g = ir::resolveConvGeometry(node, nchw, oihw);
  auto group = node.getInt("group", 1);
  if (!g.isOk() || !group.isOk() || *group < 1 || nchw[1] != oihw[1] * *group ||
      oihw[0] % *group != 0) {
    return std::nullopt;
  }
  // The output must be what the geometry implies (shape inference gave it the same way).
  std::vector<int64_t> outDims = {nchw[0], oihw[0]};
  outDims.insert(outDims.end(), g->output.begin(), g->output.end());
  const ir::Shape expectedY =
      nhwcConv ? ir::permuteShape(ir::Shape(outDims), ir::kNchwToNhwc) : ir::Shape(outDims);
  if (y->shape != expectedY) return std::nullopt;

  ConvProblem p;
  p.type = *type;
  p.nhwc = nhwcConv;
  p.hasBias = node.hasInput(2);
  p.hasResidual = !onnxConv && node.hasInput(3);
  if (p.hasBias && node.input(2)->shape != ir::Shape{oihw[0]}) return std::nullopt;
  if (p.hasResidual && node.input(3)->shape != y->shape) return std::nullopt;
  if (!onnxConv) {
    std::optional<ConvEpilogue> epilogue = readEpilogue(node);
    if (!epilogue) return std::nullopt;
    p.epilogue = *epilogue;
  }
  p.spatialRank = rank - 2;
  p.cudnnGeometry = g->padsBegin == g->padsEnd;
  p.weightsConstant = w->constant.has_value();
  p.outputElements = y->shape.elementCount();
  p.weightElements = w->shape.elementCount();
  p.outputSpatial = 1;
  for (int64_t extent : g->output) p.outputSpatial *= extent;
  p.empty = x->shape.elementCount() == 0 || p.weightElements == 0 || p.outputElements == 0;
  p.shapes =
      fmt::format("X {} W {} Y {}", x->shape.toString(), w->shape.toString(), y->shape.toString());

  ConvGeometry& geo = p.geometry;
  geo.batch = nchw[0];
  geo.channels = nchw[1];
  geo.outChannels = oihw[0];
  geo.group = *group;
  const size_t missing = 3 - p.spatialRank;
  for (size_t i = 0; i < p.spatialRank; ++i) {
    geo.in[missing + i] = g->input[i];
    geo.out[missing + i] = g->output[i];
    geo.kernel[missing + i] = g->kernel[i];
    geo.stride[missing + i] = g->strides[i];
    geo.dilation[missing + i] = g->dilations[i];
    geo.padBegin[missing + i] = g->padsBegin[i];
  }
  const std::vector<int64_t> xs = x->shape.strides();
  const std::vector<int64_t> ws = w->shape.strides();
  const std::vector<int64_t> ys = y->shape.strides();
  if (nhwcConv) {
    // X and Y [N, H, W, C]; W [kH, kW, C/group, M].
    alignStrides(xs[0], xs[3], {xs[1], xs[2]}, g->input, geo.xStrides);
    alignStrides(ws[3], ws[2], {ws[0], ws[1]}, g->kernel, geo.wStrides);
    alignStrides(ys[0], ys[3], {ys[1], ys[2]}, g->output, geo.yStrides);
  } else {
    alignStrides(xs[0], xs[1], tail(xs, 2), g->input, geo.xStrides);
    alignStrides(ws[0], ws[1], tail(ws, 2), g->kernel, geo.wStrides);
    alignStrides(ys[0], ys[1], tail(ys, 2), g->output, geo.yStrides);
  }
  geo.channelsLast = nhwcConv;
  p.depthwise = !p.empty && depthwiseNhwcFits(geo);
  return p;
}

// ConvTranspose (X, W, B?) in float32, float16 or bfloat16 (every tensor the same), NCHW with 1
// to 3 spatial axes; nullopt for anything else. X is [N, C, ...], W [C, M/group, k...], Y [N, M,
// ...] with the extents resolveConvTransposeGeometry gives (output_shape, output_padding and
// auto_pad already applied).
std::optional<ConvProblem> readTransposeProblem(const ir::Node& node) {
  const ir::Value* x = node.input(0);
  const ir::Value* w = node.input(1);
  const ir::Value* y = node.outputs.size() == 1 ? node.outputs[0] : nullptr;
  if (!x || !w || !y || node.inputs.size() > 3) return std::nullopt;
  const std::optional<ElementType> type = floatTypeOf(y->dtype);
  if (!type) return std::nullopt;
  for (const ir::Value* value : node.inputs) {
    if (value && value->dtype != y->dtype) return std::nullopt;
  }
  const size_t rank = x->shape.rank();
  if (rank < 3 || rank > 5 || w->shape.rank() != rank) return std::nullopt;
  auto g = ir::resolveConvTransposeGeometry(node, x->shape, w->shape);
  auto group = node.getInt("group", 1);
  if (!g.isOk() || !group.isOk() || *group < 1 || w->shape[0] != x->shape[1] ||
      x->shape[1] % *group != 0) {
    return std::nullopt;
  }
  const int64_t outChannels = w->shape[1] * *group;
  std::vector<int64_t> outDims = {x->shape[0], outChannels};
  outDims.insert(outDims.end(), g->output.begin(), g->output.end());
  if (y->shape != ir::Shape(outDims)) return std::nullopt;

  ConvProblem p;
  p.type = *type;
  p.transpose = true;
  p.hasBias = node.hasInput(2);
  if (p.hasBias && node.input(2)->shape != ir::Shape{outChannels}) return std::nullopt;
  p.spatialRank = rank - 2;
  p.weightsConstant = w->constant.has_value();
  p.outputElements = y->shape.elementCount();
  p.weightElements = w->shape.elementCount();
  p.outputSpatial = 1;
  for (int64_t extent : g->output) p.outputSpatial *= extent;
  p.empty = x->shape.elementCount() == 0 || p.weightElements == 0 || p.outputElements == 0;
  p.shapes =
      fmt::format("X {} W {} Y {}", x->shape.toString(), w->shape.toString(), y->shape.toString());
  // cuDNN's backward data checks that a convolution of Y (dX) with the same pads, strides and
  // dilations has X's (dY's) extents; output_padding of a stride or more breaks that.
  p.cudnnGeometry = g->padsBegin == g->padsEnd;
  for (size_t i = 0; i < p.spatialRank; ++i) {
    const int64_t window = (g->kernel[i] - 1) * g->dilations[i] + 1;
    const int64_t span = g->output[i] + g->padsBegin[i] + g->padsEnd[i] - window;
    if (g->padsBegin[i] < 0 || span < 0 || span / g->strides[i] + 1 != g->input[i]) {
      p.cudnnGeometry = false;
    }
  }

  ConvGeometry& geo = p.geometry;
  geo.batch = x->shape[0];
  geo.channels = x->shape[1];
  geo.outChannels = outChannels;
  geo.group = *group;
  const size_t missing = 3 - p.spatialRank;
  for (size_t i = 0; i < p.spatialRank; ++i) {
    geo.in[missing + i] = g->input[i];
    geo.out[missing + i] = g->output[i];
    geo.kernel[missing + i] = g->kernel[i];
    geo.stride[missing + i] = g->strides[i];
    geo.dilation[missing + i] = g->dilations[i];
    geo.padBegin[missing + i] = g->padsBegin[i];
  }
  const std::vector<int64_t> xs = x->shape.strides();
  const std::vector<int64_t> ws = w->shape.strides();
  const std::vector<int64_t> ys = y->shape.strides();
  alignStrides(xs[0], xs[1], tail(xs, 2), g->input, geo.xStrides);
  alignStrides(ws[0], ws[1], tail(ws, 2), g->kernel, geo.wStrides);
  alignStrides(ys[0], ys[1], tail(ys, 2), g->output, geo.yStrides);
  return p;
}

// ---------------------------------------------------------------------------------------------
// cuDNN's backend descriptors.

class CudnnDescriptor {
 public:
  CudnnDescriptor() = default;
  ~CudnnDescriptor() { reset(); }
  CudnnDescriptor(CudnnDescriptor&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  CudnnDescriptor& operator=(CudnnDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  static Result<CudnnDescriptor> create(cudnnBackendDescriptorType_t type) {
    CudnnDescriptor descriptor;
    KILN_RETURN_IF_ERROR(
        cudnnStatus(cudnnBackendCreateDescriptor(type, &descriptor.raw_),
                    fmt::format("creating backend descriptor type {}", static_cast<int>(type))));
    return descriptor;
  }

  cudnnBackendDescriptor_t get() const { return raw_; }
  explicit operator bool() const { return raw_ != nullptr; }

 private:
  void reset() {
    if (raw_) cudnnBackendDestroyDescriptor(raw_);
    raw_ = nullptr;
  }
  cudnnBackendDescriptor_t raw_ = nullptr;
};

Status setAttribute(const CudnnDescriptor& descriptor, cudnnBackendAttributeName_t name,
                    cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  return cudnnStatus(cudnnBackendSetAttribute(descriptor.get(), name, type, count, values),
                     fmt::format("setting backend attribute {}", static_cast<int>(name)));
}

Status setInt64s(const CudnnDescriptor& descriptor, cudnnBackendAttributeName_t name,
                 const std::vector<int64_t>& values) {
  return setAttribute(descriptor, name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()),
                      values.data());
}

Status setDescriptor(const CudnnDescriptor& descriptor, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value) {
  return setAttribute(descriptor, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

Status finalize(const CudnnDescriptor& descriptor, std::string_view what) {
  return cudnnStatus(cudnnBackendFinalize(descriptor.get()), fmt::format("finalizing {}", what));
}

// ---------------------------------------------------------------------------------------------
// The operation graph.

enum TensorUid : int64_t {
  kUidX = 1,
  kUidW = 2,
  kUidY = 3,
  kUidBias = 4,
  kUidResidual = 5,
  kUidFirstVirtual = 100,
};

// An activation as cuDNN's RELU_FWD / SIGMOID_FWD / TANH_FWD / GELU_FWD computes it.
struct CudnnActivation {
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_RELU_FWD;
  double lowerClip = 0;
  double upperClip = std::numeric_limits<float>::max();
  double lowerClipSlope = 0;
};

// The cuDNN pointwise mode that computes `epilogue`'s activation exactly, if there is one.
// RELU_FWD gives x below the lower clip as lower + slope * (x - lower) and clips x above the
// upper clip, so Relu, LeakyRelu (slope alpha) and a Clip with finite, ordered bounds fit;
// GELU_FWD is the erf form, GELU_APPROX_TANH_FWD the tanh one, SWISH_FWD with beta 1 is Silu.
// HardSigmoid and HardSwish have no mode.
std::optional<CudnnActivation> cudnnActivationFor(const ConvEpilogue& epilogue) {
  CudnnActivation a;
  switch (epilogue.activation) {
    case ConvActivation::kRelu:
      return a;
    case ConvActivation::kLeakyRelu:
      a.lowerClipSlope = epilogue.alpha;
      return a;
    case ConvActivation::kClip:
      if (!std::isfinite(epilogue.alpha) || !std::isfinite(epilogue.beta) ||
          epilogue.alpha > epilogue.beta) {
        return std::nullopt;
      }
      a.lowerClip = epilogue.alpha;
      a.upperClip = epilogue.beta;
      return a;
    case ConvActivation::kSigmoid:
      a.mode = CUDNN_POINTWISE_SIGMOID_FWD;
      return a;
    case ConvActivation::kTanh:
      a.mode = CUDNN_POINTWISE_TANH_FWD;
      return a;
    case ConvActivation::kGelu:
      a.mode = CUDNN_POINTWISE_GELU_FWD;
      return a;
    case ConvActivation::kGeluTanh:
      a.mode = CUDNN_POINTWISE_GELU_APPROX_TANH_FWD;
      return a;
    case ConvActivation::kSilu:
      a.mode = CUDNN_POINTWISE_SWISH_FWD;  // x * sigmoid(beta * x), beta 1
      return a;
    case ConvActivation::kNone:
    case ConvActivation::kHardSigmoid:
    case ConvActivation::kHardSwish:
      return std::nullopt;
  }
  return std::nullopt;
}

// What a cuDNN graph computes after the convolution, in this order.
struct Fusion {
  bool bias = false;
  bool residual = false;
  std::optional<CudnnActivation> activation;

  bool any() const { return bias || residual || activation; }
};

// Everything of `problem`'s epilogue that cuDNN can take.
Fusion fullFusion(const ConvProblem& problem) {
  return {problem.hasBias, problem.hasResidual, cudnnActivationFor(problem.epilogue)};
}

// Whether cuDNN may take `problem`'s epilogue into its graph. Not for a float16 or bfloat16 NCHW
// convolution whose output planes are 1x1 (squeeze-and-excitation's 1x1 convolutions over pooled
// channels): cuDNN 9.14's fused engines for it, on an H100, leave part of Y unwritten
// (compute-sanitizer's initcheck shows the next kernel reading it; EfficientNet-B0 gave NaN), while
// the bare convolution and kiln's epilogue kernel after it are right. See
// bench/gpu/results/2026-12-05-validation-2.md.
bool cudnnMayFuse(const ConvProblem& problem) {
  const bool reduced =
      problem.type == ElementType::kFloat16 || problem.type == ElementType::kBFloat16;
  return !(reduced && !problem.nhwc && problem.outputSpatial == 1);
}

// Whether kiln's epilogue kernel has work left after a graph with `fusion`.
bool epilogueRemains(const ConvProblem& problem, const Fusion& fusion) {
  return (problem.hasBias && !fusion.bias) || (problem.hasResidual && !fusion.residual) ||
         (problem.epilogue.activation != ConvActivation::kNone && !fusion.activation);
}

// The tensors as cuDNN sees them: 4-D for 1-D (height 1) and 2-D convolutions, 5-D for 3-D;
// dims in NCHW order, strides giving the layout. NhwcConv's weights are read reordered to
// [M, kH, kW, C/group] (KRSC, the filter layout of NHWC convolutions).
struct CudnnShapes {
  std::vector<int64_t> xDims, xStrides, wDims, wStrides, yDims, yStrides, biasDims, biasStrides;
  std::vector<int64_t> pads, convStrides, dilations;
};

CudnnShapes cudnnShapesFor(const ConvProblem& p) {
  const ConvGeometry& g = p.geometry;
  const size_t spatial = std::max<size_t>(p.spatialRank, 2);
  const size_t first = 3 - spatial;  // first geometry axis cuDNN sees
  CudnnShapes s;
  const int64_t groupChannels = g.channels / g.group;
  s.xDims = {g.batch, g.channels};
  s.xStrides = {g.xStrides[0], g.xStrides[1]};
  // A forward filter is [M, C/group, ...]; ConvTranspose's is [C, M/group, ...], which is what
  // backward data reads (K = dY's channels = X's C, then dX's channels per group).
  s.wDims = p.transpose ? std::vector<int64_t>{g.channels, g.outChannels / g.group}
                        : std::vector<int64_t>{g.outChannels, groupChannels};
  s.wStrides = {g.wStrides[0], g.wStrides[1]};
  s.yDims = {g.batch, g.outChannels};
  s.yStrides = {g.yStrides[0], g.yStrides[1]};
  s.biasDims = {1, g.outChannels};
  s.biasStrides = {g.outChannels, 1};
  for (size_t axis = first; axis < 3; ++axis) {
    s.xDims.push_back(g.in[axis]);
    s.xStrides.push_back(g.xStrides[2 + axis]);
    s.wDims.push_back(g.kernel[axis]);
    s.wStrides.push_back(g.wStrides[2 + axis]);
    s.yDims.push_back(g.out[axis]);
    s.yStrides.push_back(g.yStrides[2 + axis]);
    s.biasDims.push_back(1);
    s.biasStrides.push_back(p.nhwc ? g.outChannels : 1);
    s.pads.push_back(g.padBegin[axis]);  // symmetric: the end pads are the same
    s.convStrides.push_back(g.stride[axis]);
    s.dilations.push_back(g.dilation[axis]);
  }
  if (p.nhwc) {
    // KRSC: [M][kH][kW][C/group], packed.
    s.wStrides = {g.kernel[1] * g.kernel[2] * groupChannels, 1, g.kernel[2] * groupChannels,
                  groupChannels};
  }
  return s;
}

cudnnDataType_t cudnnTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kFloat16:
      return CUDNN_DATA_HALF;
    case ElementType::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

// A finalized operation graph and the descriptors it was made from, which live as long as it
// does (cuDNN's own frontend keeps them so).
struct CudnnGraph {
  std::vector<CudnnDescriptor> parts;
  CudnnDescriptor graph;
  std::vector<int64_t> uids;  // the graph's non-virtual tensors
  Fusion fusion;
};

class GraphBuilder {
 public:
  explicit GraphBuilder(CudnnGraph& graph) : graph_(graph) {}

  // A tensor of `type`; virtual tensors (between the graph's operations) are float whatever the
  // step's element type, so the epilogue works on the convolution's float sums.
  Result<cudnnBackendDescriptor_t> tensor(int64_t uid, const std::vector<int64_t>& dims,
                                          const std::vector<int64_t>& strides, bool isVirtual,
                                          cudnnDataType_t type) {
    KILN_ASSIGN_OR_RETURN(CudnnDescriptor t,
                          CudnnDescriptor::create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    const bool virtualFlag = isVirtual;
    KILN_RETURN_IF_ERROR(
        setAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    KILN_RETURN_IF_ERROR(setInt64s(t, CUDNN_ATTR_TENSOR_DIMENSIONS, dims));
    KILN_RETURN_IF_ERROR(setInt64s(t, CUDNN_ATTR_TENSOR_STRIDES, strides));
    KILN_RETURN_IF_ERROR(setInt64s(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, {uid}));
    KILN_RETURN_IF_ERROR(setInt64s(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {kTensorAlignment}));
    KILN_RETURN_IF_ERROR(
        setAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virtualFlag));
    KILN_RETURN_IF_ERROR(finalize(t, fmt::format("tensor {}", uid)));
    return keep(std::move(t));
  }

  // y = conv(x, w), or with `transpose` y = ConvTranspose(x, w) as cuDNN's backward data (dX = y,
  // dY = x).
  Result<cudnnBackendDescriptor_t> convolution(const CudnnShapes& s, bool transpose,
                                               cudnnBackendDescriptor_t x,
                                               cudnnBackendDescriptor_t w,
                                               cudnnBackendDescriptor_t y) {
    KILN_ASSIGN_OR_RETURN(CudnnDescriptor conv,
                          CudnnDescriptor::create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
    // fp32 math whatever the element type (tensor-core engines are filtered later).
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // ONNX Conv does not flip
    KILN_RETURN_IF_ERROR(
        setAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
    KILN_RETURN_IF_ERROR(setAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                      CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    KILN_RETURN_IF_ERROR(setInt64s(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
                                   {static_cast<int64_t>(s.pads.size())}));
    KILN_RETURN_IF_ERROR(setInt64s(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, s.pads));
    KILN_RETURN_IF_ERROR(setInt64s(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, s.pads));
    KILN_RETURN_IF_ERROR(setInt64s(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, s.dilations));
    KILN_RETURN_IF_ERROR(setInt64s(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, s.convStrides));
    KILN_RETURN_IF_ERROR(finalize(conv, "the convolution descriptor"));
    if (transpose) return backwardData(std::move(conv), x, w, y);

    KILN_ASSIGN_OR_RETURN(
        CudnnDescriptor op,
        CudnnDescriptor::create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR));
    const float alpha = 1.0f, beta = 0.0f;
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x));
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w));
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y));
    KILN_RETURN_IF_ERROR(
        setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv.get()));
    KILN_RETURN_IF_ERROR(setAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                      CUDNN_TYPE_FLOAT, 1, &alpha));
    KILN_RETURN_IF_ERROR(setAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                      CUDNN_TYPE_FLOAT, 1, &beta));
    KILN_RETURN_IF_ERROR(finalize(op, "the convolution operation"));
    keep(std::move(conv));
    return addOperation(std::move(op));
  }

  Result<cudnnBackendDescriptor_t> backwardData(CudnnDescriptor conv, cudnnBackendDescriptor_t dy,
                                                cudnnBackendDescriptor_t w,
                                                cudnnBackendDescriptor_t dx) {
    KILN_ASSIGN_OR_RETURN(
        CudnnDescriptor op,
        CudnnDescriptor::create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR));
    const float alpha = 1.0f, beta = 0.0f;
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, dx));
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w));
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, dy));
    KILN_RETURN_IF_ERROR(
        setDescriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv.get()));
    KILN_RETURN_IF_ERROR(setAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                      CUDNN_TYPE_FLOAT, 1, &alpha));
    KILN_RETURN_IF_ERROR(setAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                                      CUDNN_TYPE_FLOAT, 1, &beta));
    KILN_RETURN_IF_ERROR(finalize(op, "the backward-data convolution operation"));
    keep(std::move(conv));
    return addOperation(std::move(op));
  }

  // y = x + b (ADD, b broadcast), or y = activation(x) (b null, `activation` given).
  Result<cudnnBackendDescriptor_t> pointwise(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                             cudnnBackendDescriptor_t y,
                                             const std::optional<CudnnActivation>& activation) {
    KILN_ASSIGN_OR_RETURN(CudnnDescriptor mode,
                          CudnnDescriptor::create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    const cudnnPointwiseMode_t pointwiseMode = activation ? activation->mode : CUDNN_POINTWISE_ADD;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    KILN_RETURN_IF_ERROR(setAttribute(mode, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
                                      &pointwiseMode));
    KILN_RETURN_IF_ERROR(
        setAttribute(mode, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    if (activation && activation->mode == CUDNN_POINTWISE_RELU_FWD) {
      KILN_RETURN_IF_ERROR(setAttribute(mode, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP,
                                        CUDNN_TYPE_DOUBLE, 1, &activation->lowerClip));
      KILN_RETURN_IF_ERROR(setAttribute(mode, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP,
                                        CUDNN_TYPE_DOUBLE, 1, &activation->upperClip));
      KILN_RETURN_IF_ERROR(setAttribute(mode, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE,
                                        CUDNN_TYPE_DOUBLE, 1, &activation->lowerClipSlope));
    }
    if (activation && activation->mode == CUDNN_POINTWISE_SWISH_FWD) {
      const double beta = 1.0;
      KILN_RETURN_IF_ERROR(
          setAttribute(mode, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &beta));
    }
    KILN_RETURN_IF_ERROR(finalize(mode, "a pointwise descriptor"));

    KILN_ASSIGN_OR_RETURN(CudnnDescriptor op,
                          CudnnDescriptor::create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
    const float one = 1.0f;
    KILN_RETURN_IF_ERROR(
        setDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, mode.get()));
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
    if (b) KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b));
    KILN_RETURN_IF_ERROR(setDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
    KILN_RETURN_IF_ERROR(
        setAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one));
    KILN_RETURN_IF_ERROR(
        setAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one));
    KILN_RETURN_IF_ERROR(finalize(op, "a pointwise operation"));
    keep(std::move(mode));
    return addOperation(std::move(op));
  }

  Status finish(cudnnHandle_t handle) {
    KILN_ASSIGN_OR_RETURN(graph_.graph,
                          CudnnDescriptor::create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    KILN_RETURN_IF_ERROR(
        setAttribute(graph_.graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                     static_cast<int64_t>(operations_.size()), operations_.data()));
    KILN_RETURN_IF_ERROR(setAttribute(graph_.graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                      CUDNN_TYPE_HANDLE, 1, &handle));
    return finalize(graph_.graph, "the operation graph");
  }

 private:
  cudnnBackendDescriptor_t keep(CudnnDescriptor descriptor) {
    graph_.parts.push_back(std::move(descriptor));
    return graph_.parts.back().get();
  }
  cudnnBackendDescriptor_t addOperation(CudnnDescriptor op) {
    operations_.push_back(op.get());
    return keep(std::move(op));
  }

  CudnnGraph& graph_;
  std::vector<cudnnBackendDescriptor_t> operations_;
};

// The convolution, then `fusion`'s steps in order; the last writes Y, the others virtual
// tensors.
Result<CudnnGraph> buildGraph(const ConvProblem& problem, const Fusion& fusion,
                              cudnnHandle_t handle) {
  const CudnnShapes s = cudnnShapesFor(problem);
  const cudnnDataType_t type = cudnnTypeOf(problem.type);
  CudnnGraph result;
  result.fusion = fusion;
  GraphBuilder b(result);
  KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t x,
                        b.tensor(kUidX, s.xDims, s.xStrides, false, type));
  KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t w,
                        b.tensor(kUidW, s.wDims, s.wStrides, false, type));
  KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t y,
                        b.tensor(kUidY, s.yDims, s.yStrides, false, type));
  result.uids = {kUidX, kUidW, kUidY};
  cudnnBackendDescriptor_t bias = nullptr;
  cudnnBackendDescriptor_t residual = nullptr;
  if (fusion.bias) {
    KILN_ASSIGN_OR_RETURN(bias, b.tensor(kUidBias, s.biasDims, s.biasStrides, false, type));
    result.uids.push_back(kUidBias);
  }
  if (fusion.residual) {
    KILN_ASSIGN_OR_RETURN(residual, b.tensor(kUidResidual, s.yDims, s.yStrides, false, type));
    result.uids.push_back(kUidResidual);
  }
  int remaining = int{fusion.bias} + int{fusion.residual} + int{fusion.activation.has_value()};
  int64_t nextVirtual = kUidFirstVirtual;
  // The output of the next operation: Y for the last, else a fresh virtual tensor.
  auto nextOutput = [&]() -> Result<cudnnBackendDescriptor_t> {
    if (remaining-- == 0) return y;
    return b.tensor(nextVirtual++, s.yDims, s.yStrides, true, CUDNN_DATA_FLOAT);
  };
  KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t current, nextOutput());
  KILN_RETURN_IF_ERROR(b.convolution(s, problem.transpose, x, w, current).status());
  if (fusion.bias) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t out, nextOutput());
    KILN_RETURN_IF_ERROR(b.pointwise(current, bias, out, std::nullopt).status());
    current = out;
  }
  if (fusion.residual) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t out, nextOutput());
    KILN_RETURN_IF_ERROR(b.pointwise(current, residual, out, std::nullopt).status());
    current = out;
  }
  if (fusion.activation) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t out, nextOutput());
    KILN_RETURN_IF_ERROR(b.pointwise(current, nullptr, out, fusion.activation).status());
  }
  KILN_RETURN_IF_ERROR(b.finish(handle));
  return result;
}

// ---------------------------------------------------------------------------------------------
// Engine configs and execution plans.

struct CudnnPlan {
  CudnnDescriptor config;
  CudnnDescriptor plan;
  int64_t workspace = 0;
  int64_t engine = -1;  // cuDNN's global engine index
  // Where the config came from: the heuristics list (kHeuristicModes' index: mode A, mode B or
  // the fallback list) and its position in that list (what the timing cache records, with the
  // engine to check it against).
  int heuristics = 0;
  int64_t configIndex = -1;
};

// Which engines a step may run.
struct EngineFilter {
  bool tensorCores = false;    // on tensor cores (reduced types, or tf32 allowed)
  bool deterministic = false;  // no nondeterministic (atomic) accumulation
  bool winograd = false;       // Winograd transforms allowed (cuda.conv.winograd)
  bool fft = false;            // FFTs allowed (cuda.conv.fft)
  bool reducedPrecision =
      false;  // down-converted inputs, reduced-type sums (cuda.conv.reduced_precision)
  int64_t maxWorkspace = int64_t{256} << 20;  // bytes (cuda.conv.workspace)
  int heuristicsMode = 0;                     // kHeuristicModes[heuristicsMode] before the fallback
};

// Whether `engine` keeps the step's accuracy: no down-converted inputs, reduced-precision
// (fp16) reductions, FFT or Winograd transforms (their results drift from the reference by more
// than kiln's convolution tolerance), tensor cores only where the filter allows them (on
// float32 data they mean TF32, which cuda.precision=tf32 alone allows; float16 and bfloat16 data
// are what they are for), and nondeterministic engines only where the filter allows them.
bool keepsAccuracy(cudnnBackendDescriptor_t engine, const EngineFilter& filter) {
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count,
                               notes) != CUDNN_STATUS_SUCCESS) {
    return false;  // unknown numerics: not for a step that promises its accuracy
  }
  for (int64_t i = 0; i < count; ++i) {
    switch (notes[i]) {
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (!filter.tensorCores) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        if (filter.deterministic) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        if (!filter.reducedPrecision) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_FFT:
        if (!filter.fft) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
        if (!filter.winograd) return false;
        break;
      default:
        break;
    }
  }
  return true;
}

// The engine configs of heuristics `mode` for `graph`, in cuDNN's order.
Result<std::vector<CudnnDescriptor>> engineConfigs(const CudnnGraph& graph,
                                                   cudnnBackendHeurMode_t mode) {
  KILN_ASSIGN_OR_RETURN(CudnnDescriptor heuristics,
                        CudnnDescriptor::create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(
      setDescriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.graph.get()));
  KILN_RETURN_IF_ERROR(
      setAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  KILN_RETURN_IF_ERROR(finalize(heuristics, "the engine heuristics"));
  int64_t available = 0;
  KILN_RETURN_IF_ERROR(
      cudnnStatus(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr),
                  "counting the heuristics' engine configs"));
  std::vector<CudnnDescriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < available; ++i) {
    KILN_ASSIGN_OR_RETURN(CudnnDescriptor config,
                          CudnnDescriptor::create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(config.get());
    configs.push_back(std::move(config));
  }
  if (available == 0) return configs;
  int64_t returned = 0;
  KILN_RETURN_IF_ERROR(cudnnStatus(
      cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &returned, raw.data()),
      "reading the heuristics' engine configs"));
  configs.resize(static_cast<size_t>(std::clamp<int64_t>(returned, 0, available)));
  return configs;
}

// The heuristics lists: mode A or B (cuda.conv.heuristics), then the fallback list.
constexpr cudnnBackendHeurMode_t kHeuristicModes[3] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B,
                                                       CUDNN_HEUR_MODE_FALLBACK};
constexpr int kFallbackList = 2;
constexpr const char* kHeuristicNames[3] = {"A", "B", "fallback"};

// The lists `filter` consults, in order.
std::array<int, 2> heuristicLists(const EngineFilter& filter) {
  return {filter.heuristicsMode, kFallbackList};
}

// An execution plan for `config` if its engine keeps the step's accuracy (keepsAccuracy),
// finalizes on this device and needs a workspace within kiln's bound; nullopt otherwise.
Result<std::optional<CudnnPlan>> planFor(CudnnDescriptor config, cudnnHandle_t handle,
                                         const EngineFilter& filter) {
  KILN_ASSIGN_OR_RETURN(CudnnDescriptor engine,
                        CudnnDescriptor::create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  cudnnBackendDescriptor_t rawEngine = engine.get();
  int64_t count = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &rawEngine) != CUDNN_STATUS_SUCCESS ||
      !keepsAccuracy(rawEngine, filter)) {
    return std::optional<CudnnPlan>();
  }
  CudnnPlan plan;
  cudnnBackendGetAttribute(rawEngine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count,
                           &plan.engine);
  KILN_ASSIGN_OR_RETURN(plan.plan,
                        CudnnDescriptor::create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(
      setAttribute(plan.plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
  KILN_RETURN_IF_ERROR(
      setDescriptor(plan.plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config.get()));
  if (cudnnBackendFinalize(plan.plan.get()) != CUDNN_STATUS_SUCCESS) {
    return std::optional<CudnnPlan>();
  }
  KILN_RETURN_IF_ERROR(cudnnStatus(
      cudnnBackendGetAttribute(plan.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &count, &plan.workspace),
      "reading an execution plan's workspace size"));
  if (plan.workspace < 0 || plan.workspace > filter.maxWorkspace) return std::optional<CudnnPlan>();
  plan.config = std::move(config);
  return std::optional<CudnnPlan>(std::move(plan));
}

// Up to `limit` plans for `graph`, best first by cuDNN's heuristics (the filter's mode; the
// fallback list when that gives none that kiln can use). A heuristics mode that fails adds its
// reason to `why`.
Result<std::vector<CudnnPlan>> findPlans(const CudnnGraph& graph, cudnnHandle_t handle,
                                         size_t limit, const EngineFilter& filter,
                                         std::string& why) {
  std::vector<CudnnPlan> plans;
  for (int heuristics : heuristicLists(filter)) {
    auto configs = engineConfigs(graph, kHeuristicModes[heuristics]);
    if (!configs.isOk()) {
      why += configs.status().message() + "; ";
      continue;
    }
    for (size_t i = 0; i < configs->size(); ++i) {
      KILN_ASSIGN_OR_RETURN(std::optional<CudnnPlan> plan,
                            planFor(std::move((*configs)[i]), handle, filter));
      if (plan) {
        plan->heuristics = heuristics;
        plan->configIndex = static_cast<int64_t>(i);
        plans.push_back(std::move(*plan));
      }
      if (plans.size() >= limit) return plans;
    }
    if (!plans.empty()) return plans;
  }
  return plans;
}

// The plan a timing cache record names ({"heuristics", "config", "engine"}), if the same
// heuristics list still has a config of that engine there and it still plans; nullopt otherwise
// (the record is stale: the layer is timed again).
Result<std::optional<CudnnPlan>> recordedPlan(const CudnnGraph& graph, cudnnHandle_t handle,
                                              const EngineFilter& filter,
                                              const nlohmann::json& record) {
  const int64_t heuristics = entryInt(record, "heuristics", -1);
  const int64_t index = entryInt(record, "config", -1);
  const std::array<int, 2> lists = heuristicLists(filter);
  if (std::find(lists.begin(), lists.end(), heuristics) == lists.end() || index < 0) {
    return std::optional<CudnnPlan>();
  }
  auto configs = engineConfigs(graph, kHeuristicModes[heuristics]);
  if (!configs.isOk() || index >= static_cast<int64_t>(configs->size())) {
    return std::optional<CudnnPlan>();
  }
  KILN_ASSIGN_OR_RETURN(std::optional<CudnnPlan> plan,
                        planFor(std::move((*configs)[static_cast<size_t>(index)]), handle, filter));
  if (!plan || plan->engine != entryInt(record, "engine", -2)) {
    return std::optional<CudnnPlan>();
  }
  plan->heuristics = heuristics;
  plan->configIndex = index;
  return plan;
}

// The timing cache's key for timing `candidates` of `problem`'s plans `runs` times each with
// `fusion` under `filter`: everything the operation graph, the candidate list and the timing
// depend on.
std::string timingKey(const ConvProblem& problem, const Fusion& fusion, const EngineFilter& filter,
                      size_t candidates, int runs) {
  const ConvGeometry& g = problem.geometry;
  auto list = [](const int64_t* values, int count) {
    return fmt::format("{}", fmt::join(values, values + count, ","));
  };
  return fmt::format(
      "cudnn.conv{} type={} rank={} n={} c={} m={} group={} in={} out={} kernel={} stride={} "
      "dilation={} pad={} x={} w={} y={} bias={} residual={} act={}:{}:{} fuse={}{}{} "
      "tensor_cores={} deterministic={} winograd={} fft={} reduced={} workspace={} heuristics={} "
      "candidates={} runs={}",
      problem.transpose ? "transpose" : "", static_cast<int>(problem.type), problem.spatialRank,
      g.batch, g.channels, g.outChannels, g.group, list(g.in, 3), list(g.out, 3), list(g.kernel, 3),
      list(g.stride, 3), list(g.dilation, 3), list(g.padBegin, 3), list(g.xStrides, 5),
      list(g.wStrides, 5), list(g.yStrides, 5), problem.hasBias, problem.hasResidual,
      static_cast<int>(problem.epilogue.activation), problem.epilogue.alpha, problem.epilogue.beta,
      fusion.bias ? "b" : "-", fusion.residual ? "r" : "-",
      fusion.activation ? fmt::format("a{}", static_cast<int>(fusion.activation->mode)) : "-",
      filter.tensorCores, filter.deterministic, filter.winograd, filter.fft,
      filter.reducedPrecision, filter.maxWorkspace, filter.heuristicsMode, candidates, runs);
}

Result<CudnnDescriptor> variantPack(const std::vector<int64_t>& uids, std::vector<void*> pointers,
                                    void* workspace) {
  KILN_ASSIGN_OR_RETURN(CudnnDescriptor pack,
                        CudnnDescriptor::create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(setInt64s(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids));
  KILN_RETURN_IF_ERROR(setAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                    CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
                                    pointers.data()));
  KILN_RETURN_IF_ERROR(
      setAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  KILN_RETURN_IF_ERROR(finalize(pack, "the variant pack"));
  return pack;
}

// ---------------------------------------------------------------------------------------------
// The step.

struct ConvChoice {
  bool cudnn = true;
  bool depthwise = false;  // kiln's depthwise NHWC kernel (problem.depthwise is set)
  bool timed = false;
  size_t candidates = 8;    // configs timed (timed)
  int engineRank = 0;       // heuristic: the plannable config taken, in heuristic order
  int nativeBlock = 256;    // threads a block of kiln's direct and transposed kernels
  int epilogueBlock = 256;  // threads a block of kiln's epilogue kernel after cuDNN
  int timingRuns = 3;       // timed runs of each (timed)
  bool fuseEpilogue = true;
  DepthwiseTiling tiling;  // kiln's depthwise kernel
  EngineFilter engines;
};

class ConvStep final : public Step {
 public:
  ConvStep(ConvProblem problem, ConvChoice choice) : problem_(std::move(problem)), choice_(choice) {
    layout = problem_.nhwc ? "nhwc" : "nchw";
    useCudnn_ = choice_.cudnn && !choice_.depthwise;
    fuse_ = choice_.fuseEpilogue && cudnnMayFuse(problem_);
    const Fusion planned = fuse_ ? fullFusion(problem_) : Fusion{};
    tactic = tacticFor(planned);
  }

  Status prepare(PrepareContext& prepare) override {
    if (!useCudnn_ && choice_.depthwise &&
        (choice_.tiling.blockThreads == 0 || choice_.tiling.capRegisters)) {
      // The runtime queries these launches make, now rather than under graph capture.
      return cudaStatus(launchDepthwise(prepare.context, /*queryOnly=*/true),
                        "the depthwise convolution kernel's launch queries");
    }
    if (!useCudnn_) return Status::ok();
    cudnnHandle_t handle = prepare.context.cudnn;
    // Tiers: everything cuDNN can fuse, then the bare convolution (kiln's epilogue kernel after
    // it). A tier cuDNN cannot build or plan is skipped; its reason is kept for the message.
    std::vector<Fusion> tiers;
    if (fuse_ && fullFusion(problem_).any()) tiers.push_back(fullFusion(problem_));
    tiers.push_back(Fusion{});
    std::string reasons;
    for (const Fusion& fusion : tiers) {
      auto graph = buildGraph(problem_, fusion, handle);
      if (!graph.isOk()) {
        reasons += fmt::format("{}; ", graph.status().message());
        continue;
      }
      // A timed choice: the timing cache's record of it when there is one that still plans.
      const std::string key = choice_.timed ? timingKey(problem_, fusion, choice_.engines,
                                                        choice_.candidates, choice_.timingRuns)
                                            : "";
      std::vector<CudnnPlan> plans;
      bool cached = false;
      if (auto record = choice_.timed ? prepare.cachedChoice(key) : std::nullopt) {
        KILN_ASSIGN_OR_RETURN(std::optional<CudnnPlan> plan,
                              recordedPlan(*graph, handle, choice_.engines, *record));
        if (plan) {
          plans.push_back(std::move(*plan));
          cached = true;
          ++prepare.timingHits;
        } else {
          prepare.forgetChoice(key);
        }
      }
      if (!cached) {
        KILN_ASSIGN_OR_RETURN(plans,
                              findPlans(*graph, handle,
                                        choice_.timed ? choice_.candidates
                                                      : static_cast<size_t>(choice_.engineRank) + 1,
                                        choice_.engines, reasons));
      }
      if (plans.empty()) {
        reasons += fmt::format(
            "no accurate enough engine for {} fused op(s); ",
            int{fusion.bias} + int{fusion.residual} + int{fusion.activation.has_value()});
        continue;
      }
      graph_ = std::move(*graph);
      KILN_RETURN_IF_ERROR(prepareWeights(prepare));
      size_t best = 0;
      if (!choice_.timed) {
        best = plans.size() - 1;  // the config of engineRank, or the last that planned
      } else if (plans.size() > 1) {
        KILN_ASSIGN_OR_RETURN(best, fastest(plans, prepare));
        prepare.recordChoice(key, {{"heuristics", plans[best].heuristics},
                                   {"config", plans[best].configIndex},
                                   {"engine", plans[best].engine},
                                   {"of", plans.size()}});
      }
      plan_ = std::move(plans[best]);
      tactic = tacticFor(graph_.fusion);
      return Status::ok();
    }
    // No engine: kiln's kernel computes the same thing.
    useCudnn_ = false;
    tactic = nativeTactic();
    fallbackReason_ = fmt::format("cuDNN has no engine for {} ({})", problem_.shapes, reasons);
    return Status::ok();
  }

  std::string detail() const override {
    if (choice_.depthwise) {
      if (windowKernel()) {
        return fmt::format(
            "kiln's depthwise window kernel, {} px a thread, {} blocks, runs of up to {} bytes{}",
            depthwiseWindowPixels(problem_.geometry, problem_.type, choice_.tiling),
            depthwiseBlocks(), choice_.tiling.vectorBytes,
            choice_.tiling.capRegisters
                ? " (float16 / bfloat16: at most 56 registers a thread in 128-thread blocks "
                  "where that spills nothing)"
                : "");
      }
      return fmt::format(
          "kiln's depthwise kernel, {} px a thread, {} blocks, runs of up to {} bytes",
          choice_.tiling.pixels, depthwiseBlocks(), choice_.tiling.vectorBytes);
    }
    if (!useCudnn_) {
      const std::string kernel =
          fmt::format("kiln's {} kernel, {}-thread blocks",
                      problem_.transpose ? "transposed" : "direct", choice_.nativeBlock);
      return fallbackReason_.empty() ? kernel : kernel + ": " + fallbackReason_;
    }
    const EngineFilter& f = choice_.engines;
    std::string allowed;
    if (f.winograd) allowed += ", Winograd";
    if (f.fft) allowed += ", FFT";
    if (f.reducedPrecision) allowed += ", reduced precision";
    std::string text = fmt::format(
        "cuDNN, heuristics {}{}; engines within {} MiB of workspace{}{}{}",
        kHeuristicNames[f.heuristicsMode],
        choice_.timed
            ? fmt::format(", {} configs timed {} runs each", choice_.candidates, choice_.timingRuns)
        : choice_.engineRank == 0
            ? ", the first that plans"
            : fmt::format(", number {} of those that plan", choice_.engineRank + 1),
        f.maxWorkspace >> 20, f.tensorCores ? ", tensor cores" : "",
        f.deterministic ? ", deterministic" : "",
        allowed.empty() ? "" : " (allowed" + allowed + ")");
    if (problem_.hasBias || problem_.hasResidual ||
        problem_.epilogue.activation != ConvActivation::kNone) {
      text +=
          fmt::format("; {} epilogue kernel of {}-thread blocks",
                      fuse_                  ? "what cuDNN does not fuse: an"
                      : choice_.fuseEpilogue ? "(1x1 reduced-type NCHW output: cuDNN fuses none) an"
                                             : "an",
                      choice_.epilogueBlock);
    }
    if (plan_.engine >= 0) {
      text += fmt::format("; engine {} (config {} of list {}), workspace {} bytes", plan_.engine,
                          plan_.configIndex, kHeuristicNames[plan_.heuristics], plan_.workspace);
    }
    return text;
  }

  int64_t workspaceBytes() const override {
    if (!useCudnn_) return 0;
    return alignUp(plan_.workspace) + (reorderEachRun() ? weightBytes() : 0);
  }

  Status enqueue(const Context& context) const override {
    const void* x = context.address(*inputs[0]);
    const void* w = context.address(*inputs[1]);
    const void* bias = problem_.hasBias ? context.address(*inputs[2]) : nullptr;
    const void* residual = problem_.hasResidual ? context.address(*inputs[3]) : nullptr;
    void* y = context.address(*outputs[0]);
    if (!useCudnn_ && problem_.transpose) {
      return cudaStatus(launchConvTranspose(problem_.geometry, problem_.type, x, w, bias, y,
                                            choice_.nativeBlock, context.stream),
                        "the transposed convolution kernel");
    }
    if (!useCudnn_ && choice_.depthwise) {
      return cudaStatus(launchDepthwise(context, /*queryOnly=*/false),
                        "the depthwise convolution kernel");
    }
    if (!useCudnn_) {
      return cudaStatus(launchDirectConv(problem_.geometry, problem_.type, x, w, bias, residual, y,
                                         problem_.epilogue, choice_.nativeBlock, context.stream),
                        "the direct convolution kernel");
    }
    const void* weights = w;
    if (problem_.nhwc) {
      weights = reorderedWeights_;
      if (reorderEachRun()) {
        void* scratch = context.workspace + alignUp(plan_.workspace);
        KILN_RETURN_IF_ERROR(reorderWeights(w, scratch, context.stream));
        weights = scratch;
      }
    }
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pack,
                          packFor(context, x, weights, y, bias, residual));
    KILN_CUDNN_CHECK(cudnnBackendExecute(context.cudnn, plan_.plan.get(), pack));
    if (!epilogueRemains(problem_, graph_.fusion)) return Status::ok();
    const Fusion& f = graph_.fusion;
    ConvEpilogue rest = problem_.epilogue;
    if (f.activation) rest.activation = ConvActivation::kNone;
    return cudaStatus(launchConvEpilogue(problem_.type, y, f.bias ? nullptr : bias,
                                         f.residual ? nullptr : residual, problem_.outputElements,
                                         problem_.geometry.outChannels,
                                         problem_.nhwc ? 1 : problem_.outputSpatial, rest,
                                         choice_.epilogueBlock, context.stream),
                      "the convolution epilogue kernel");
  }

 private:
  std::string nativeTactic() const {
    if (choice_.depthwise) {
      // Launch settings other than the defaults are named, as cuda.conv.depthwise.* set them.
      std::string name = "kiln.conv.depthwise";
      if (windowKernel()) {
        name += ".window";
        if (choice_.tiling.windowPixels != 0) {
          name += ".px" + std::to_string(choice_.tiling.windowPixels);
        }
        if (choice_.tiling.capRegisters) name += ".regs56";
      } else if (choice_.tiling.pixels != 1) {
        name += ".px" + std::to_string(choice_.tiling.pixels);
      }
      if (choice_.tiling.blockThreads == 0) {
        name += ".occupancy";
      } else if (choice_.tiling.blockThreads != 256) {
        name += ".block" + std::to_string(choice_.tiling.blockThreads);
      }
      return name;
    }
    return problem_.transpose ? "kiln.convtranspose" : "kiln.conv";
  }

  // launchDepthwiseNhwc on the step's tensors in `context`.
  cudaError_t launchDepthwise(const Context& context, bool queryOnly) const {
    return launchDepthwiseNhwc(
        problem_.geometry, problem_.type, context.address(*inputs[0]), context.address(*inputs[1]),
        problem_.hasBias ? context.address(*inputs[2]) : nullptr,
        problem_.hasResidual ? context.address(*inputs[3]) : nullptr, context.address(*outputs[0]),
        problem_.epilogue, choice_.tiling, context.stream, queryOnly);
  }

  // The depthwise kernels' blocks for detail(): "256-thread", or the occupancy calculator's.
  std::string depthwiseBlocks() const {
    return choice_.tiling.blockThreads == 0 ? std::string("occupancy-calculator")
                                            : fmt::format("{}-thread", choice_.tiling.blockThreads);
  }

  // Whether the depthwise convolution runs the window kernel (launchDepthwiseNhwc's choice).
  bool windowKernel() const {
    return choice_.depthwise && choice_.tiling.window && depthwiseWindowFits(problem_.geometry);
  }

  std::string tacticFor(const Fusion& fusion) const {
    if (!useCudnn_) return nativeTactic();
    std::string name = choice_.timed ? "cudnn.timed" : "cudnn";
    if (epilogueRemains(problem_, fusion)) name += "+epilogue";
    return name;
  }

  int64_t weightBytes() const {
    return problem_.weightElements * static_cast<int64_t>(elementBytes(problem_.type));
  }
  // NhwcConv weights that are not constants are reordered for cuDNN on every run, into the
  // workspace after cuDNN's own.
  bool reorderEachRun() const { return problem_.nhwc && !problem_.weightsConstant; }

  Status reorderWeights(const void* hwio, void* ohwi, cudaStream_t stream) const {
    const ConvGeometry& g = problem_.geometry;
    return cudaStatus(launchHwioToOhwi(elementBytes(problem_.type), hwio, ohwi, g.kernel[1],
                                       g.kernel[2], g.channels / g.group, g.outChannels, stream),
                      "reordering NhwcConv weights for cuDNN");
  }

  // Constant NhwcConv weights, reordered once into memory the plan keeps.
  Status prepareWeights(PrepareContext& prepare) {
    if (!problem_.nhwc || !problem_.weightsConstant) return Status::ok();
    KILN_ASSIGN_OR_RETURN(std::byte * memory,
                          prepare.allocate(weightBytes(), "reordered NhwcConv weights"));
    reorderedWeights_ = memory;
    return reorderWeights(prepare.context.address(*inputs[1]), reorderedWeights_,
                          prepare.context.stream);
  }

  std::vector<void*> pointersFor(const void* x, const void* w, void* y, const void* bias,
                                 const void* residual) const {
    std::vector<void*> pointers;
    for (int64_t uid : graph_.uids) {
      switch (uid) {
        case kUidX:
          pointers.push_back(const_cast<void*>(x));
          break;
        case kUidW:
          pointers.push_back(const_cast<void*>(w));
          break;
        case kUidY:
          pointers.push_back(y);
          break;
        case kUidBias:
          pointers.push_back(const_cast<void*>(bias));
          break;
        default:
          pointers.push_back(const_cast<void*>(residual));
          break;
      }
    }
    return pointers;
  }

  // The variant pack for this run's buffers, made once per set of device addresses (they only
  // change if the plan's memory is made again).
  Result<cudnnBackendDescriptor_t> packFor(const Context& context, const void* x, const void* w,
                                           void* y, const void* bias, const void* residual) const {
    const std::vector<void*> pointers = pointersFor(x, w, y, bias, residual);
    void* workspace = plan_.workspace > 0 ? context.workspace : nullptr;
    if (!pack_ || pointers != packPointers_ || workspace != packWorkspace_) {
      KILN_ASSIGN_OR_RETURN(pack_, variantPack(graph_.uids, pointers, workspace));
      packPointers_ = pointers;
      packWorkspace_ = workspace;
    }
    return pack_.get();
  }

  // The index of the fastest of `plans`, each run on the step's own buffers (outputs included:
  // nothing has read them yet) after one untimed run; a plan that fails to run is passed over.
  Result<size_t> fastest(const std::vector<CudnnPlan>& plans, PrepareContext& prepare) const {
    const Context& c = prepare.context;
    int64_t workspaceBytes = 0;
    for (const CudnnPlan& plan : plans) workspaceBytes = std::max(workspaceBytes, plan.workspace);
    KILN_ASSIGN_OR_RETURN(DeviceMemory workspace,
                          DeviceMemory::allocate(workspaceBytes, "timing cuDNN plans"));
    DeviceMemory scratchWeights;
    const void* weights = c.address(*inputs[1]);
    if (problem_.nhwc && problem_.weightsConstant) weights = reorderedWeights_;
    if (reorderEachRun()) {
      KILN_ASSIGN_OR_RETURN(scratchWeights,
                            DeviceMemory::allocate(weightBytes(), "timing cuDNN plans"));
      weights = scratchWeights.data();  // contents do not matter
    }
    const std::vector<void*> pointers =
        pointersFor(c.address(*inputs[0]), weights, c.address(*outputs[0]),
                    problem_.hasBias ? c.address(*inputs[2]) : nullptr,
                    problem_.hasResidual ? c.address(*inputs[3]) : nullptr);
    KILN_ASSIGN_OR_RETURN(Event start, Event::create());
    KILN_ASSIGN_OR_RETURN(Event stop, Event::create());
    size_t best = 0;
    double bestMs = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < plans.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(
          CudnnDescriptor pack,
          variantPack(graph_.uids, pointers, plans[i].workspace > 0 ? workspace.data() : nullptr));
      if (cudnnBackendExecute(c.cudnn, plans[i].plan.get(), pack.get()) != CUDNN_STATUS_SUCCESS) {
        // A failed launch leaves its error for the next cudaGetLastError, which would blame
        // another step's kernel: clear it here.
        cudaGetLastError();
        continue;
      }
      KILN_CUDA_CHECK(cudaEventRecord(start.get(), c.stream));
      bool ran = true;
      for (int run = 0; run < choice_.timingRuns && ran; ++run) {
        ran = cudnnBackendExecute(c.cudnn, plans[i].plan.get(), pack.get()) == CUDNN_STATUS_SUCCESS;
      }
      KILN_CUDA_CHECK(cudaEventRecord(stop.get(), c.stream));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop.get()));
      if (!ran) {
        cudaGetLastError();
        continue;
      }
      KILN_ASSIGN_OR_RETURN(double ms, elapsedMs(start, stop));
      if (ms < bestMs) {
        bestMs = ms;
        best = i;
      }
    }
    // The workspace is freed on return: the runs must have finished with it.
    KILN_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    return best;
  }

  ConvProblem problem_;
  ConvChoice choice_;
  bool useCudnn_ = true;
  bool fuse_ = true;  // cuDNN takes the epilogue into its graph (cuda.conv.epilogue, cudnnMayFuse)
  std::string fallbackReason_;  // why cuDNN was given up in prepare(), for a debugger
  void* reorderedWeights_ = nullptr;
  // Destroyed in reverse order: the pack before the plan before the graph it was made for.
  CudnnGraph graph_;
  CudnnPlan plan_;
  mutable CudnnDescriptor pack_;
  mutable std::vector<void*> packPointers_;
  mutable void* packWorkspace_ = nullptr;
};

std::unique_ptr<Step> makeConvStep(const ir::Node& node, const knobs::Route& route) {
  const bool transpose = node.domain.empty() && node.opType == "ConvTranspose";
  std::optional<ConvProblem> problem = transpose ? readTransposeProblem(node) : readProblem(node);
  if (!problem) return nullptr;
  ConvChoice choice;
  // cuDNN pads both ends of a dimension alike, and takes no empty tensors: those stay with
  // kiln's kernel whatever the knob says.
  // Multiply-adds: each output sums over its group's channels and the kernel's taps.
  const int64_t outChannels = std::max<int64_t>(problem->geometry.outChannels, 1);
  const double macs = static_cast<double>(problem->outputElements) *
                      static_cast<double>(problem->weightElements / outChannels);
  choice.cudnn = route.value(kConvSource, &node) == "cudnn" && problem->cudnnGeometry &&
                 !problem->empty && macs >= std::stod(route.value(kConvNativeBelow, &node));
  choice.engineRank = std::stoi(route.value(kConvEngineRank, &node));
  choice.depthwise = problem->depthwise && route.value(kConvDepthwise, &node) == "kiln";
  choice.tiling.pixels = std::stoi(route.value(kConvDepthwisePixels, &node));
  const std::string block = route.value(kConvDepthwiseBlock, &node);
  choice.tiling.blockThreads = block == "occupancy" ? 0 : std::stoi(block);
  const std::string vector = route.value(kConvDepthwiseVector, &node);
  choice.tiling.vectorBytes =
      vector == "auto" ? 2 * elementBytes(problem->type) : std::stoi(vector);
  choice.tiling.window = route.value(kConvDepthwiseWindow, &node) == "registers";
  const std::string windowPixels = route.value(kConvDepthwiseWindowPixels, &node);
  choice.tiling.windowPixels = windowPixels == "auto" ? 0 : std::stoi(windowPixels);
  choice.tiling.capRegisters = route.value(kConvDepthwiseWindowRegisters, &node) == "56";
  choice.nativeBlock = std::stoi(route.value(kConvNativeBlock, &node));
  choice.epilogueBlock = std::stoi(route.value(kConvEpilogueBlock, &node));
  choice.timed = route.value(kConvAlgo, &node) == "timed";
  choice.candidates = static_cast<size_t>(std::stoi(route.value(kConvCandidates, &node)));
  choice.timingRuns = std::stoi(route.value(kConvTimingRuns, &node));
  choice.fuseEpilogue = route.value(kConvEpilogue, &node) == "fused";
  // TF32 only where the step records it (lower.cc's products; ConvTranspose is not one).
  EngineFilter& engines = choice.engines;
  engines.tensorCores =
      problem->type != ElementType::kFloat32 || (!transpose && allowsTf32(node, route));
  engines.deterministic = transpose || route.value(kConvNondeterministic, &node) == "deny";
  engines.winograd = route.value(kConvWinograd, &node) == "allow";
  engines.fft = route.value(kConvFft, &node) == "allow";
  engines.reducedPrecision = route.value(kConvReducedPrecision, &node) == "allow";
  engines.maxWorkspace = int64_t{std::stoi(route.value(kConvWorkspace, &node))} << 20;
  engines.heuristicsMode = route.value(kConvHeuristics, &node) == "b" ? 1 : 0;
  return std::make_unique<ConvStep>(std::move(*problem), choice);
}

const int kRegistered = registerStepFactory(kRankConv, "conv", makeConvStep);

}  // namespace
}  // namespace kiln::cuda
