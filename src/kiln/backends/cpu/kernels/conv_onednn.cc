// Float32 convolutions (Conv and kiln.FusedConv on NCHW, kiln.NhwcConv on NHWC) run by oneDNN's
// convolution_forward primitive: a second tactic source beside kiln's own kernels (conv.cc,
// conv_nhwc.cc), chosen per node by cpu.conv.source.
//
// Everything oneDNN decides is decided when the plan is built: the primitives (their
// implementation, and the JIT code they generate), the weights reordered once into the format
// they ask for, the reorders between the graph's layout and the formats their fast kernels
// want, and their scratchpads, which the step owns. A run only sets buffer addresses and executes.
//
// Threads: kiln links Debian's oneDNN 2.6, built with the OpenMP runtime. Letting it run on
// OpenMP's threads beside the plan's pool was measured to hurt (libgomp's idle workers spin for
// milliseconds after each primitive, on the cores the pool's threads need next: convnext_mini at 2
// threads 25-28 ms, 17-23 with OMP_WAIT_POLICY=passive, which kiln cannot set once libgomp has
// loaded). So every oneDNN call runs on one thread, and the step splits the convolution itself
// into slices, one primitive each, run on the plan's pool: runs of output channels (of groups)
// in NCHW, runs of output rows or whole images in NHWC, so that each slice's part of the tensors
// is contiguous there (cpu.onednn.split=auto; channels, rows and none choose otherwise, a slice
// then reading and writing strided parts of the tensors where they are not contiguous).
//
// Without oneDNN (KILN_HAVE_ONEDNN unset) none of the knobs below exist, as the CUDA backend's
// do not without CUDA, and the factory takes no node.
#include "kiln/backends/cpu/kernels/steps.h"

#if KILN_HAVE_ONEDNN

#include <omp.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cpu/kernels/conv.h"
#include "kiln/backends/cpu/kernels/epilogue.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/neural.h"

namespace kiln::cpu {

const knobs::Knob kConvSource = knobs::declareKnob({
    .name = "cpu.conv.source",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"native", "onednn"},
    // oneDNN by default where kiln has it: with graph.layout=nhwc, faster than kiln's kernels
    // on every CNN of ../shared/models at 1 and 2 threads
    // (bench/cpu/results/2026-12-03-vs-ort-3.md).
    .defaultValue = "onednn",
    .help = "library for float32 convolutions (Conv, FusedConv, NhwcConv). native: kiln's kernels "
            "(cpu.conv.algo picks one). onednn: oneDNN primitives created, and their weights "
            "reordered, at build time, run on the plan's threads (cpu.onednn.* shape them; a node "
            "oneDNN has no primitive for, or whose weights are not constant, stays native).",
    .backends = {"cpu"},
    .perNode = true,
});

// oneDNN 2.6's convolution_auto resolved to direct for every f32 shape tried on AVX-512 (its
// Winograd kernels ask for auto only where they judge themselves faster, which they did not
// here), so an "auto" value would change nothing: the knob offers the two algorithms.
const knobs::Knob kOnednnAlgo = knobs::declareKnob({
    .name = "cpu.onednn.conv_algo",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"direct", "winograd"},
    .defaultValue = "direct",
    .help = "algorithm of oneDNN convolutions. direct: oneDNN's direct (or GEMM-based) kernels, "
            "float32 sums as kiln's. winograd: Winograd F(2x2,3x3)/F(4x4,3x3) where oneDNN has "
            "it for the shape (3x3 stride 1, cpu.onednn.layout blocked; elsewhere direct, and the "
            "tactic says no_winograd), which rounds differently.",
    .backends = {"cpu"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kOnednnLayout = knobs::declareKnob({
    .name = "cpu.onednn.layout",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "blocked", "plain"},
    .defaultValue = "auto",
    .help =
        "tensor formats of oneDNN convolutions. auto: plain in NHWC graphs (graph.layout=nhwc), "
        "blocked in NCHW ones. blocked: oneDNN picks the source and destination formats its "
        "fastest kernel wants (on AVX-512: NHWC for most, channel blocks of 16 for grouped "
        "convolutions; the tactic names it after .via_), and the step reorders from and to the "
        "graph's layout around the primitive. plain: the primitive reads and writes the graph's "
        "NCHW or NHWC itself (for NCHW on x86, oneDNN's im2col + GEMM kernel for most shapes).",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kOnednnPostops = knobs::declareKnob({
    .name = "cpu.onednn.postops",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "oneDNN convolutions add the bias, FusedConv's residual (a sum post-op) and its "
            "activation (eltwise post-ops) inside the primitive instead of running bare and "
            "leaving all three to kiln's epilogue afterwards",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kOnednnSplit = knobs::declareKnob({
    .name = "cpu.onednn.split",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "channels", "rows", "none"},
    .defaultValue = "auto",
    .help = "how a oneDNN convolution is sliced over the plan's threads, one single-threaded "
            "primitive per slice. auto: channels in NCHW graphs, rows in NHWC ones. channels: "
            "runs of output channels (of whole groups), every image and row. rows: whole images "
            "or, for one image, runs of output rows, all channels. none: one primitive on the "
            "calling thread for the whole convolution. Values other than auto are named in the "
            "tactic (.split_<value>_x<slices>).",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kOnednnWeights = knobs::declareKnob({
    .name = "cpu.onednn.weights",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"blocked", "plain"},
    .defaultValue = "blocked",
    .help = "weights format of oneDNN convolutions, reordered into once at build time. blocked: "
            "the format oneDNN's fastest kernel asks for (blocks of input and output channels). "
            "plain: the graph's own layout (oihw in NCHW graphs, hwio in NHWC ones; goihw and "
            "hwigo when grouped), named .weights_plain in the tactic, for which oneDNN 2.6 runs "
            "its GEMM-based or reference kernels instead (a node it has none for stays native).",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

using dnnl::memory;
using Tag = dnnl::memory::format_tag;
using DataType = dnnl::memory::data_type;
using Args = std::unordered_map<int, memory>;

const dnnl::engine& cpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One OpenMP thread for the calling thread while alive: oneDNN then runs inline, and sizes its
// work for one thread when a primitive is created.
class SingleOmpThread {
 public:
  SingleOmpThread() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleOmpThread() { omp_set_num_threads(previous_); }
  SingleOmpThread(const SingleOmpThread&) = delete;
  SingleOmpThread& operator=(const SingleOmpThread&) = delete;

 private:
  int previous_;
};

// The plan's thread count, as lowerToCpu derives it from cpu.threads (0: one per core).
int planThreads(const knobs::Route& route) {
  const int64_t threads = route.intValue(knobs::Knob("cpu.threads"));
  return threads > 0 ? static_cast<int>(threads)
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

struct EltwiseOp {
  dnnl::algorithm algorithm;
  float alpha, beta;
};

// The oneDNN eltwise post-ops that compute a FusedConv's activation as Epilogue::apply does
// (same attributes, same defaults: epilogue.cc); empty for none, nullopt for one oneDNN lacks.
std::optional<std::vector<EltwiseOp>> activationOps(const ir::Node& node) {
  if (!node.hasAttribute("activation")) return std::vector<EltwiseOp>{};
  auto name = node.getString("activation", "");
  if (!name.isOk()) return std::nullopt;
  const auto param = [&](const char* attribute, float fallback) -> std::optional<float> {
    auto value = node.getFloat(attribute, fallback);
    return value.isOk() ? std::optional<float>(*value) : std::nullopt;
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  using A = dnnl::algorithm;
  if (*name == "Relu") return std::vector<EltwiseOp>{{A::eltwise_relu, 0, 0}};
  if (*name == "LeakyRelu") {
    // oneDNN's relu with alpha is x > 0 ? x : alpha * x.
    auto alpha = param("activation_alpha", 0.01f);
    if (!alpha) return std::nullopt;
    return std::vector<EltwiseOp>{{A::eltwise_relu, *alpha, 0}};
  }
  if (*name == "Clip") {
    auto lo = param("activation_alpha", -kInf), hi = param("activation_beta", kInf);
    if (!lo || !hi) return std::nullopt;
    return std::vector<EltwiseOp>{{A::eltwise_clip, *lo, *hi}};
  }
  if (*name == "HardSigmoid") {
    // oneDNN 2.6 has no hardsigmoid: alpha * x + beta, then clipped to [0, 1], is ONNX's.
    auto alpha = param("activation_alpha", 0.2f), beta = param("activation_beta", 0.5f);
    if (!alpha || !beta) return std::nullopt;
    return std::vector<EltwiseOp>{{A::eltwise_linear, *alpha, *beta}, {A::eltwise_clip, 0, 1}};
  }
  // oneDNN 2.6's hardswish is x * min(max(x + 3, 0), 6) / 6: ONNX's (alpha 1/6, beta 1/2).
  if (*name == "HardSwish") return std::vector<EltwiseOp>{{A::eltwise_hardswish, 0, 0}};
  if (*name == "Sigmoid") return std::vector<EltwiseOp>{{A::eltwise_logistic, 0, 0}};
  if (*name == "Tanh") return std::vector<EltwiseOp>{{A::eltwise_tanh, 0, 0}};
  if (*name == "Gelu") return std::vector<EltwiseOp>{{A::eltwise_gelu_erf, 0, 0}};
  if (*name == "GeluTanh") return std::vector<EltwiseOp>{{A::eltwise_gelu_tanh, 0, 0}};
  // swish is x * sigmoid(alpha * x).
  if (*name == "Silu") return std::vector<EltwiseOp>{{A::eltwise_swish, 1, 0}};
  return std::nullopt;
}

// What the route and the node ask of one node's primitives.
struct OnednnChoice {
  bool winograd = false;
  bool blocked = true;
  bool postops = true;
  std::string split = "auto";  // cpu.onednn.split
  bool plainWeights = false;   // cpu.onednn.weights=plain
  bool nhwc = false;           // kiln.NhwcConv: NHWC tensors, [kH, kW, C/group, M] weights
  bool hasBias = false, hasResidual = false;
  std::vector<EltwiseOp> activation;

  Tag plainTag() const { return nhwc ? Tag::nhwc : Tag::nchw; }
  memory::desc plain(const memory::dims& dims) const { return {dims, DataType::f32, plainTag()}; }
};

// The convolution's window in oneDNN's terms: strides, dilations counted from 0, and ONNX's
// resolved pads at both ends.
struct OnednnWindow {
  memory::dims strides, dilations, padBegin, padEnd;
};

std::optional<OnednnWindow> windowOf(const ir::Node& node, const ConvShape& s, bool nhwc) {
  const ir::Shape& xs = node.input(0)->shape;
  const ir::Shape& ws = node.input(1)->shape;
  auto window = ir::resolveConvGeometry(node, nhwc ? ir::Shape{xs[0], xs[3], xs[1], xs[2]} : xs,
                                        nhwc ? ir::Shape{ws[3], ws[2], ws[0], ws[1]} : ws);
  if (!window.isOk() || window->spatialRank() != 2) return std::nullopt;
  if (window->padsBegin[0] < 0 || window->padsBegin[1] < 0) return std::nullopt;
  return OnednnWindow{.strides = {s.strideH, s.strideW},
                      .dilations = {s.dilationH - 1, s.dilationW - 1},
                      .padBegin = {window->padsBegin[0], window->padsBegin[1]},
                      .padEnd = {window->padsEnd[0], window->padsEnd[1]}};
}

// The part of the convolution one slice computes: images [imageFirst, +images), output rows
// [outRowFirst, +outRows) (reading input rows [inRowFirst, +inRows), with the pads that leaves at
// the slice's top and bottom), and output channels [outFirst, +outCount) (of groups [firstGroup,
// +groups), reading input channels [inFirst, +inCount)).
struct SliceRange {
  int64_t imageFirst, images;
  int64_t outRowFirst, outRows, inRowFirst, inRows, padTop, padBottom;
  int64_t firstGroup, groups, inFirst, inCount, outFirst, outCount;
};

SliceRange wholeRange(const ConvShape& s, const OnednnWindow& window) {
  return {0, s.batch, 0, s.outHeight, 0, s.height,     window.padBegin[0], window.padEnd[0],
          0, s.group, 0, s.channels,  0, s.outChannels};
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Output channels per NCHW slice come in multiples of 16 (an AVX-512 channel block: a smaller
// slice would pad its block anyway).
constexpr int64_t kChannelBlock = 16;

// NCHW: a slice per thread at most, each a contiguous run of output channels (of whole groups,
// for grouped convolutions) of every image.
std::vector<SliceRange> channelSlices(const ConvShape& s, const OnednnWindow& window, int threads) {
  const SliceRange whole = wholeRange(s, window);
  std::vector<SliceRange> slices;
  if (s.group == 1) {
    const int64_t blocks = ceilDiv(s.outChannels, kChannelBlock);
    const int64_t per = ceilDiv(blocks, std::min<int64_t>(threads, blocks)) * kChannelBlock;
    for (int64_t first = 0; first < s.outChannels; first += per) {
      SliceRange r = whole;
      r.outFirst = first;
      r.outCount = std::min(per, s.outChannels - first);
      slices.push_back(r);
    }
    return slices;
  }
  const int64_t mg = s.groupOutChannels(), cg = s.groupChannels();
  const int64_t quantum = mg >= kChannelBlock ? 1 : ceilDiv(kChannelBlock, mg);  // groups
  const int64_t units = ceilDiv(s.group, quantum);
  const int64_t per = ceilDiv(units, std::min<int64_t>(threads, units)) * quantum;
  for (int64_t first = 0; first < s.group; first += per) {
    SliceRange r = whole;
    r.firstGroup = first;
    r.groups = std::min(per, s.group - first);
    r.inFirst = first * cg;
    r.inCount = r.groups * cg;
    r.outFirst = first * mg;
    r.outCount = r.groups * mg;
    slices.push_back(r);
  }
  return slices;
}

// NHWC: a slice per thread at most, each whole images or, for a single image, a contiguous run of
// output rows (and the input rows they read): either way contiguous in memory, all channels.
std::vector<SliceRange> rowSlices(const ConvShape& s, const OnednnWindow& window, int threads) {
  const SliceRange whole = wholeRange(s, window);
  std::vector<SliceRange> slices;
  if (s.batch > 1) {
    const int64_t per = ceilDiv(s.batch, std::min<int64_t>(threads, s.batch));
    for (int64_t first = 0; first < s.batch; first += per) {
      SliceRange r = whole;
      r.imageFirst = first;
      r.images = std::min(per, s.batch - first);
      slices.push_back(r);
    }
    return slices;
  }
  const int64_t per = ceilDiv(s.outHeight, std::min<int64_t>(threads, s.outHeight));
  for (int64_t first = 0; first < s.outHeight; first += per) {
    SliceRange r = whole;
    r.outRowFirst = first;
    r.outRows = std::min(per, s.outHeight - first);
    // Input rows from the first output row's top tap to the last one's bottom tap, clipped to
    // the image; what is cut off at either end is that end's padding.
    const int64_t top = first * s.strideH - window.padBegin[0];
    const int64_t bottom =
        (first + r.outRows - 1) * s.strideH - window.padBegin[0] + (s.kernelH - 1) * s.dilationH;
    r.inRowFirst = std::max<int64_t>(0, top);
    r.inRows = std::min(s.height - 1, bottom) - r.inRowFirst + 1;
    r.padTop = r.inRowFirst - top;
    r.padBottom = bottom - (r.inRowFirst + r.inRows - 1);
    if (r.inRows <= 0) return {whole};  // rows of padding only: not worth a slice
    slices.push_back(r);
  }
  return slices;
}

dnnl::primitive_attr attrFor(const dnnl::post_ops& ops) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_post_ops(ops);
  return attr;
}

// A slice's tensors' extents, in oneDNN's [N, C, H, W] order whatever the layout.
memory::dims srcDims(const ConvShape& s, const SliceRange& r) {
  return {r.images, r.inCount, r.inRows, s.width};
}
memory::dims dstDims(const ConvShape& s, const SliceRange& r) {
  return {r.images, r.outCount, r.outRows, s.outWidth};
}

// What one slice's primitive is, before its buffers: the descriptor oneDNN chose and whether it
// holds the epilogue.
struct SliceDescription {
  dnnl::convolution_forward::primitive_desc pd;
  bool winogradFallback = false;  // winograd asked for, no such kernel: direct instead
  bool fused = false;             // bias, residual and activation run inside the primitive
};

// Winograd if asked and available (else direct), everything fused if asked and available (else
// bare); nullopt where oneDNN has no primitive at all.
std::optional<SliceDescription> describeSlice(const ConvShape& s, const SliceRange& r,
                                              const OnednnWindow& window,
                                              const OnednnChoice& choice) {
  const memory::dims weights =
      s.group > 1
          ? memory::dims{r.groups, s.groupOutChannels(), s.groupChannels(), s.kernelH, s.kernelW}
          : memory::dims{r.outCount, s.channels, s.kernelH, s.kernelW};
  const auto formatOf = [&](const memory::dims& dims) {
    return choice.blocked ? memory::desc(dims, DataType::f32, Tag::any) : choice.plain(dims);
  };
  dnnl::post_ops fusedOps;
  if (choice.hasResidual) fusedOps.append_sum(1.0f);
  for (const EltwiseOp& op : choice.activation) {
    fusedOps.append_eltwise(1.0f, op.algorithm, op.alpha, op.beta);
  }
  const Tag plainWeights =
      s.group > 1 ? (choice.nhwc ? Tag::hwigo : Tag::goihw) : (choice.nhwc ? Tag::hwio : Tag::oihw);
  const memory::desc weightsDesc(weights, DataType::f32,
                                 choice.plainWeights ? plainWeights : Tag::any);
  SliceDescription d;
  const auto describe = [&](dnnl::algorithm algorithm, bool fused) {
    const memory::desc bias = fused && choice.hasBias
                                  ? memory::desc({r.outCount}, DataType::f32, Tag::a)
                                  : memory::desc();
    const dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, algorithm, formatOf(srcDims(s, r)), weightsDesc, bias,
        formatOf(dstDims(s, r)), window.strides, window.dilations, {r.padTop, window.padBegin[1]},
        {r.padBottom, window.padEnd[1]});
    d.pd = dnnl::convolution_forward::primitive_desc(
        desc, attrFor(fused ? fusedOps : dnnl::post_ops()), cpuEngine(), /*allow_empty=*/true);
    return bool(d.pd);
  };
  for (const bool fused : {true, false}) {
    if (fused && !choice.postops) continue;
    const bool winograd = choice.winograd && describe(dnnl::algorithm::convolution_winograd, fused);
    d.winogradFallback = choice.winograd && !winograd;
    if (winograd || describe(dnnl::algorithm::convolution_direct, fused)) {
      d.fused = fused;
      return d;
    }
  }
  return std::nullopt;
}

// The node's weights as they lie in the graph, for slice `r`: ONNX's [M, C/group, kH, kW] is
// oneDNN's plain oihw (goihw by groups); kiln.NhwcConv's [kH, kW, C/group, M] takes strides.
// `first` is set to the float the descriptor starts at.
memory::desc givenWeights(const ConvShape& s, const SliceRange& r, const memory::dims& dims,
                          bool nhwc, int64_t& first) {
  const int64_t m = s.outChannels, cg = s.groupChannels(), kw = s.kernelW;
  if (!nhwc) {
    first = r.outFirst * cg * s.kernelH * kw;
    return {dims, DataType::f32, s.group > 1 ? Tag::goihw : Tag::oihw};
  }
  first = r.outFirst;
  const memory::dims hw = {kw * cg * m, cg * m};
  if (s.group > 1) {
    return {dims, DataType::f32, memory::dims{s.groupOutChannels(), 1, m, hw[0], hw[1]}};
  }
  return {dims, DataType::f32, memory::dims{1, m, hw[0], hw[1]}};
}

// The name of a 4-D format, for tactics: "nhwc", "nChw16c", ...; "blocked" for others.
std::string formatName(const memory::desc& md) {
  static const std::pair<Tag, const char*> kNames[] = {
      {Tag::nchw, "nchw"},     {Tag::nhwc, "nhwc"},     {Tag::nChw16c, "nChw16c"},
      {Tag::nChw8c, "nChw8c"}, {Tag::nChw4c, "nChw4c"},
  };
  for (const auto& [tag, name] : kNames) {
    if (md == memory::desc(md.dims(), DataType::f32, tag)) return name;
  }
  return "blocked";
}

// A reorder primitive and its arguments; its scratchpad is the slice's.
struct Reorder {
  dnnl::reorder primitive;
  Args args;
};

Reorder makeReorder(const memory& from, const memory& to, size_t& scratchpadBytes) {
  const dnnl::reorder::primitive_desc pd(cpuEngine(), from.get_desc(), cpuEngine(), to.get_desc(),
                                         attrFor(dnnl::post_ops()));
  scratchpadBytes = std::max(scratchpadBytes, pd.scratchpad_desc().get_size());
  return {dnnl::reorder(pd), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}};
}

memory scratchpadOf(size_t bytes) {
  return memory({{static_cast<memory::dim>(bytes)}, DataType::u8, Tag::a}, cpuEngine());
}

// A slice's view of an arena tensor: a memory object whose address is set on each run, to the
// tensor's start plus `offset` floats.
struct View {
  memory data;
  int64_t offset = 0;
};

// The part `part` at `at` ([N, C, H, W] both) of a tensor of extents `full` in the graph's
// layout: a dense descriptor where the part is contiguous (NCHW: whole rows of whole channels of
// one image, or of every channel; NHWC: all channels of whole rows of one image, or of whole
// images), else a sub-memory of the whole.
View partView(Tag tag, const memory::dims& full, const memory::dims& at, const memory::dims& part) {
  const bool nchw = tag == Tag::nchw;
  const bool contiguous = nchw ? part[2] == full[2] && (part[0] == 1 || part[1] == full[1])
                               : part[1] == full[1] && (part[0] == 1 || part[2] == full[2]);
  if (contiguous) {
    const int64_t offset = nchw ? ((at[0] * full[1] + at[1]) * full[2] + at[2]) * full[3]
                                : ((at[0] * full[2] + at[2]) * full[3]) * full[1] + at[1];
    return {memory({part, DataType::f32, tag}, cpuEngine(), DNNL_MEMORY_NONE), offset};
  }
  const memory::desc sub = memory::desc(full, DataType::f32, tag).submemory_desc(part, at);
  return {memory(sub, cpuEngine(), DNNL_MEMORY_NONE), 0};
}

// One slice, ready to run: its primitive and weights, and the memory objects it reads and writes.
struct Slice {
  SliceRange range;
  std::string impl;  // primitive_desc::impl_info_str()
  bool winogradFallback = false;
  bool fused = false;
  std::string via;  // the format the primitive reads or writes where not the graph's, else ""
  dnnl::convolution_forward conv;
  memory weights;  // reordered into the primitive's format at build time
  Args convArgs;
  std::optional<Reorder> srcIn, residualIn, dstOut;
  std::optional<View> x, y, residual, bias;
};

// Creates slice `r`'s primitive, reorders its weights (or shares `previous`'s, where they are
// the same), and wires its arguments. `sharedSrc`, for NCHW slices of an ungrouped convolution,
// is the step's one reordered input (all such slices read every input channel); a slice whose
// primitive wants another format reorders its own.
std::optional<Slice> createSlice(const ConvShape& s, const SliceRange& r,
                                 const OnednnWindow& window, const OnednnChoice& choice,
                                 const ir::Tensor& weights, const Slice* previous,
                                 const std::optional<memory>& sharedSrc) {
  const std::optional<SliceDescription> d = describeSlice(s, r, window, choice);
  if (!d) return std::nullopt;
  Slice slice;
  slice.range = r;
  slice.impl = d->pd.impl_info_str();
  slice.winogradFallback = d->winogradFallback;
  slice.fused = d->fused;
  slice.conv = dnnl::convolution_forward(d->pd);
  const dnnl::engine& engine = cpuEngine();
  size_t scratchpadBytes = d->pd.scratchpad_desc().get_size();

  const memory::desc weightsDesc = d->pd.weights_desc();
  if (previous && previous->range.outFirst == r.outFirst &&
      previous->range.outCount == r.outCount && previous->weights.get_desc() == weightsDesc) {
    slice.weights = previous->weights;
  } else {
    int64_t first = 0;
    const memory::desc given = givenWeights(s, r, weightsDesc.dims(), choice.nhwc, first);
    memory source(given, engine, const_cast<float*>(weights.data<float>().data()) + first);
    slice.weights = memory(weightsDesc, engine);
    dnnl::stream stream(engine);
    dnnl::reorder(source, slice.weights).execute(stream, source, slice.weights);
    stream.wait();
  }

  const Tag tag = choice.plainTag();
  const memory::dims xDims = {s.batch, s.channels, s.height, s.width};
  const memory::dims yDims = {s.batch, s.outChannels, s.outHeight, s.outWidth};
  const memory::dims xAt = {r.imageFirst, r.inFirst, r.inRowFirst, 0};
  const memory::dims yAt = {r.imageFirst, r.outFirst, r.outRowFirst, 0};
  const memory::desc srcDesc = d->pd.src_desc(), dstDesc = d->pd.dst_desc();
  if (dstDesc != choice.plain(dstDesc.dims())) {
    slice.via = formatName(dstDesc);
  } else if (srcDesc != choice.plain(srcDesc.dims())) {
    slice.via = formatName(srcDesc);
  }

  // Source: the step's shared reorder (where its format is this primitive's), the input itself,
  // or a reorder of the slice's part of it.
  memory src;
  if (sharedSrc && sharedSrc->get_desc() == srcDesc) {
    src = *sharedSrc;
  } else {
    slice.x = partView(tag, xDims, xAt, srcDims(s, r));
    if (slice.x->data.get_desc() == srcDesc) {
      src = slice.x->data;
    } else {
      src = memory(srcDesc, engine);
      slice.srcIn = makeReorder(slice.x->data, src, scratchpadBytes);
    }
  }
  // Destination: the output itself, or a buffer of the slice's own reordered into it.
  slice.y = partView(tag, yDims, yAt, dstDims(s, r));
  memory dst = slice.y->data;
  if (slice.y->data.get_desc() != dstDesc) {
    dst = memory(dstDesc, engine);
    slice.dstOut = makeReorder(dst, slice.y->data, scratchpadBytes);
  }
  if (choice.hasResidual) {
    slice.residual = partView(tag, yDims, yAt, dstDims(s, r));
    // The sum post-op adds what the destination holds: the residual, put there first.
    if (slice.fused) slice.residualIn = makeReorder(slice.residual->data, dst, scratchpadBytes);
  }
  slice.convArgs = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, slice.weights}, {DNNL_ARG_DST, dst}};
  if (choice.hasBias) {
    slice.bias =
        View{memory({{r.outCount}, DataType::f32, Tag::a}, engine, DNNL_MEMORY_NONE), r.outFirst};
    if (slice.fused) slice.convArgs[DNNL_ARG_BIAS] = slice.bias->data;
  }
  if (scratchpadBytes > 0) {
    const memory scratchpad = scratchpadOf(scratchpadBytes);
    slice.convArgs[DNNL_ARG_SCRATCHPAD] = scratchpad;
    for (std::optional<Reorder>* reorder : {&slice.srcIn, &slice.residualIn, &slice.dstOut}) {
      if (*reorder) (*reorder)->args[DNNL_ARG_SCRATCHPAD] = scratchpad;
    }
  }
  return slice;
}

class OnednnConvStep : public Step {
 public:
  // Inputs: X, W (constant, already in the slices' weights), B? and the residual (FusedConv,
  // NhwcConv).
  OnednnConvStep(const ConvShape& shape, bool nhwc, std::vector<Slice> slices,
                 std::optional<Reorder> sharedSrcIn, memory sharedX, const Epilogue& epilogue)
      : shape_(shape),
        nhwc_(nhwc),
        slices_(std::move(slices)),
        sharedSrcIn_(std::move(sharedSrcIn)),
        sharedX_(std::move(sharedX)),
        epilogue_(epilogue),
        stream_(cpuEngine()) {
    for (size_t i = 0; i < slices_.size(); ++i) streams_.emplace_back(cpuEngine());
    const Slice& first = slices_.front();
    bool epilogueAfter = false;
    for (const Slice& slice : slices_) epilogueAfter |= unfusedWork(slice);
    // "onednn.brgconv:avx512_core.via_nhwc", "onednn.x64:gemm:jit+epilogue", ...
    tactic = "onednn." + first.impl;
    if (!first.via.empty()) tactic += ".via_" + first.via;
    if (first.winogradFallback) tactic += ".no_winograd";
    if (epilogueAfter) tactic += "+epilogue";
    if (nhwc) layout = "nhwc";
  }

  Status run(const ExecutionContext& context) const override {
    Pointers p;
    p.x = context.data<float>(*inputs[0]);
    p.y = context.data<float>(*outputs[0]);
    p.bias = inputs.size() > 2 && inputs[2] ? context.data<float>(*inputs[2]) : nullptr;
    p.residual = inputs.size() > 3 && inputs[3] ? context.data<float>(*inputs[3]) : nullptr;
    SingleOmpThread oneThread;
    if (sharedSrcIn_) {
      Status status = guarded([&] {
        sharedX_.set_data_handle(p.x);
        sharedSrcIn_->primitive.execute(stream_, sharedSrcIn_->args);
        stream_.wait();
      });
      if (!status.isOk()) return status;
    }
    if (slices_.size() == 1) return runSlice(0, p);
    std::mutex mutex;
    Status failed = Status::ok();
    context.pool().parallelFor(static_cast<int64_t>(slices_.size()), 1,
                               [&](int64_t begin, int64_t end) {
                                 SingleOmpThread sliceThread;
                                 for (int64_t i = begin; i < end; ++i) {
                                   Status status = runSlice(static_cast<size_t>(i), p);
                                   if (status.isOk()) continue;
                                   std::lock_guard<std::mutex> lock(mutex);
                                   failed = status;
                                 }
                               });
    return failed;
  }

 private:
  struct Pointers {
    float *x, *y, *bias, *residual;
  };

  // Whether kiln's epilogue has work after this slice's primitive.
  bool unfusedWork(const Slice& slice) const {
    return !slice.fused && (slice.bias || slice.residual || !epilogue_.empty());
  }

  template <typename Fn>
  Status guarded(const Fn& fn) const {
    try {
      fn();
      return Status::ok();
    } catch (const dnnl::error& error) {
      return internalError("{}: oneDNN convolution failed: {}", node->describe(), error.what());
    }
  }

  Status runSlice(size_t index, const Pointers& p) const {
    const Slice& slice = slices_[index];
    const dnnl::stream& stream = streams_[index];
    Status status = guarded([&] {
      const auto point = [](const std::optional<View>& view, float* base) {
        if (view) view->data.set_data_handle(base + view->offset);
      };
      point(slice.x, p.x);
      point(slice.y, p.y);
      point(slice.residual, p.residual);
      point(slice.bias, p.bias);
      if (slice.srcIn) slice.srcIn->primitive.execute(stream, slice.srcIn->args);
      if (slice.residualIn) slice.residualIn->primitive.execute(stream, slice.residualIn->args);
      slice.conv.execute(stream, slice.convArgs);
      if (slice.dstOut) slice.dstOut->primitive.execute(stream, slice.dstOut->args);
    });
    if (!status.isOk() || !unfusedWork(slice)) return status;
    finish(slice.range, p);
    return Status::ok();
  }

  // Bias, residual and activation on the bare primitive's output, the slice's part of it.
  void finish(const SliceRange& r, const Pointers& p) const {
    const ConvShape& s = shape_;
    if (nhwc_) {
      // The slice's channels of whole pixels of its rows: rows of outCount floats, a pixel apart.
      const int64_t offset =
          ((r.imageFirst * s.outHeight + r.outRowFirst) * s.outWidth) * s.outChannels + r.outFirst;
      finishRows(p.y + offset, p.residual ? p.residual + offset : nullptr,
                 r.images * r.outRows * s.outWidth, r.outCount, s.outChannels,
                 p.bias ? p.bias + r.outFirst : nullptr, false, epilogue_);
      return;
    }
    // Each of the slice's channels of each image: its rows' run of one plane.
    for (int64_t n = r.imageFirst; n < r.imageFirst + r.images; ++n) {
      const int64_t offset =
          (n * s.outChannels + r.outFirst) * s.pixels() + r.outRowFirst * s.outWidth;
      finishRows(p.y + offset, p.residual ? p.residual + offset : nullptr, r.outCount,
                 r.outRows * s.outWidth, s.pixels(), p.bias ? p.bias + r.outFirst : nullptr, true,
                 epilogue_);
    }
  }

  ConvShape shape_;
  bool nhwc_;
  std::vector<Slice> slices_;
  std::optional<Reorder> sharedSrcIn_;  // NCHW input -> the source format every slice reads
  memory sharedX_;                      // its view of the input
  Epilogue epilogue_;
  mutable dnnl::stream stream_;        // the shared reorder's (wait() is not const)
  std::vector<dnnl::stream> streams_;  // one per slice
};

// The step, or null where oneDNN has no primitive for one of its slices.
std::unique_ptr<Step> createStep(const ConvShape& s, const OnednnWindow& window,
                                 const OnednnChoice& choice, int threads, const Epilogue& epilogue,
                                 const ir::Tensor& weights) {
  const bool byChannels = choice.split == "channels" || (choice.split == "auto" && !choice.nhwc);
  const std::vector<SliceRange> ranges = choice.split == "none"
                                             ? std::vector<SliceRange>{wholeRange(s, window)}
                                         : byChannels ? channelSlices(s, window, threads)
                                                      : rowSlices(s, window, threads);
  // NCHW channel slices of an ungrouped convolution all read every input channel: one reorder of
  // the input serves them, where the first slice's primitive wants another format than NCHW.
  std::optional<memory> sharedSrc;
  std::optional<Reorder> sharedSrcIn;
  memory sharedX;
  if (!choice.nhwc && byChannels && s.group == 1 && ranges.size() > 1) {
    const std::optional<SliceDescription> d = describeSlice(s, ranges.front(), window, choice);
    if (!d) return nullptr;
    const memory::desc plain = choice.plain({s.batch, s.channels, s.height, s.width});
    if (d->pd.src_desc() != plain) {
      size_t scratchpadBytes = 0;
      sharedX = memory(plain, cpuEngine(), DNNL_MEMORY_NONE);
      sharedSrc = memory(d->pd.src_desc(), cpuEngine());
      sharedSrcIn = makeReorder(sharedX, *sharedSrc, scratchpadBytes);
      if (scratchpadBytes > 0) {
        sharedSrcIn->args[DNNL_ARG_SCRATCHPAD] = scratchpadOf(scratchpadBytes);
      }
    }
  }
  std::vector<Slice> slices;
  for (const SliceRange& range : ranges) {
    std::optional<Slice> slice = createSlice(s, range, window, choice, weights,
                                             slices.empty() ? nullptr : &slices.back(), sharedSrc);
    if (!slice) return nullptr;
    slices.push_back(std::move(*slice));
  }
  auto step = std::make_unique<OnednnConvStep>(
      s, choice.nhwc, std::move(slices), std::move(sharedSrcIn), std::move(sharedX), epilogue);
  if (choice.plainWeights) step->tactic += ".weights_plain";
  if (choice.split != "auto") {
    step->tactic += ".split_" + choice.split + "_x" + std::to_string(ranges.size());
  }
  return step;
}

}  // namespace

std::unique_ptr<Step> makeOnednnConvStep(const ir::Node& node, const knobs::Route& route) {
  const bool kiln = node.domain == ir::kKilnDomain;
  const bool nhwc = kiln && node.opType == "NhwcConv";
  if (!nhwc && !(kiln && node.opType == "FusedConv") &&
      !(node.domain.empty() && node.opType == "Conv")) {
    return nullptr;
  }
  if (route.value(kConvSource, &node) != "onednn") return nullptr;
  const std::optional<ConvShape> shape = ConvShape::fromNode(node, nhwc);
  const std::optional<Epilogue> epilogue = Epilogue::fromNode(node);
  std::optional<std::vector<EltwiseOp>> activation = activationOps(node);
  const ir::Value* weights = node.input(1);
  if (!shape || !epilogue || !activation || !weights->constant) return nullptr;
  if (shape->batch == 0 || shape->pixels() == 0) return nullptr;
  const std::optional<OnednnWindow> window = windowOf(node, *shape, nhwc);
  if (!window) return nullptr;
  const OnednnChoice choice{
      .winograd = route.value(kOnednnAlgo, &node) == "winograd",
      .blocked = route.value(kOnednnLayout, &node) == "blocked" ||
                 (route.value(kOnednnLayout, &node) == "auto" && !nhwc),
      .postops = route.value(kOnednnPostops, &node) == "on",
      .split = route.value(kOnednnSplit, &node),
      .plainWeights = route.value(kOnednnWeights, &node) == "plain",
      .nhwc = nhwc,
      .hasBias = node.input(2) != nullptr,
      .hasResidual = node.input(3) != nullptr,
      .activation = std::move(*activation),
  };
  SingleOmpThread oneThread;
  try {
    return createStep(*shape, *window, choice, planThreads(route), *epilogue, *weights->constant);
  } catch (const dnnl::error&) {
    return nullptr;  // oneDNN refused the shape: kiln's own kernels take it
  }
}

}  // namespace kiln::cpu

#else  // !KILN_HAVE_ONEDNN

namespace kiln::cpu {

std::unique_ptr<Step> makeOnednnConvStep(const ir::Node&, const knobs::Route&) { return nullptr; }

}  // namespace kiln::cpu

#endif
