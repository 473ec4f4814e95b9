// The CUDA backend's data-movement steps: copies (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
// inference Dropout), strided views (Transpose, Slice, Expand, DepthToSpace, SpaceToDepth),
// Concat, Split, per-axis tables (Pad, Tile, nearest Resize), the index-driven ops (Gather,
// GatherElements, GatherND, ScatterND, ScatterElements, the scatters with reductions too), Trilu,
// and the interpolating Resize.
// Where elements go is worked out here, on the host, at lowering: the kernels (datamove.h) only
// follow strides and tables. Every dtype is served (elements move as raw bytes; scatter
// reductions compute in each element type), except that interpolation needs float32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "kiln/backends/cuda/kernels/datamove.h"
#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/backends/node_constants.h"
#include "kiln/ir/ops/slice.h"
#include "kiln/reference/kernels/resize.h"

namespace kiln::cuda {

const knobs::Knob kTiledTranspose = knobs::declareKnob({
    .name = "cuda.transpose.tiled",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "Transpose, DepthToSpace and SpaceToDepth that move the innermost axis go through "
            "32x32 shared-memory tiles (coalesced reads and writes), instead of the strided gather",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kCopyBlock = knobs::declareKnob({
    .name = "cuda.copy.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the strided gather (Transpose, Slice, Expand, Pad and the "
            "other views that are not one contiguous run or a tiled transpose) and of the "
            "Concat and Split copies",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kTransposeTileRows = knobs::declareKnob({
    .name = "cuda.transpose.tile_rows",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"8", "4", "16", "32"},
    .defaultValue = "8",
    .help = "thread rows of the tiled transpose's 32x32 tile (cuda.transpose.tiled): each "
            "thread moves 32 / rows elements each way (8: 256-thread blocks, 4 elements a "
            "thread; 32: a thread an element)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kConcatImpl = knobs::declareKnob({
    .name = "cuda.concat.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"kernel", "copies"},
    .defaultValue = "kernel",
    .help = "Concat as one kernel that finds each output element's part (a thread an element, "
            "cuda.copy.block threads a block), or as one strided 2D copy a part "
            "(cudaMemcpy2DAsync: a copy node each in a CUDA graph)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kSplitImpl = knobs::declareKnob({
    .name = "cuda.split.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"kernel", "copies"},
    .defaultValue = "kernel",
    .help = "Split as one kernel that finds each input element's part (a thread an element, "
            "cuda.copy.block threads a block), or as one strided 2D copy a part "
            "(cudaMemcpy2DAsync)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kTableBlock = knobs::declareKnob({
    .name = "cuda.table.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the per-axis table gather that runs Pad, Tile and nearest "
            "Resize (a thread an output element)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGatherBlock = knobs::declareKnob({
    .name = "cuda.gather.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the Gather, GatherElements and GatherND kernels (a thread an "
            "output element: an embedding lookup, say)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGatherVector = knobs::declareKnob({
    .name = "cuda.gather.vector",
    .kind = knobs::KnobKind::kBool,
    // On: Swin-T b8 fp16 1.1352 against 1.1762 ms off, GPT-2 0.9976x (H100, 2026-12-07,
    // bench/gpu/results/2026-12-07-rows.md).
    .defaultValue = "on",
    .help = "Gather moves each run of elements after the gathered axis as the widest words (4, 8 "
            "or 16 bytes) that divide its bytes, a thread a word (on), or a thread an element "
            "(off); the same bytes either way (a row gather: an embedding lookup, Swin's "
            "windows as composed by graph.compose_row_moves)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kScatterBlock = knobs::declareKnob({
    .name = "cuda.scatter.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the ScatterElements and ScatterND kernels, with or without a "
            "reduction",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kTriluBlock = knobs::declareKnob({
    .name = "cuda.trilu.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the Trilu kernel (a causal mask built at run time, say), a "
            "thread an element",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kResizeBlock = knobs::declareKnob({
    .name = "cuda.resize.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the interpolating Resize kernels (linear, cubic; the bilinear "
            "two-axis kernel of an image upsampling too), a thread an output element",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

using ir::DType;

// The tiled transpose is chosen only where both tiled axes have at least this many elements.
constexpr int64_t kMinTileExtent = 8;

int elementSizeOf(DType dtype) { return static_cast<int>(ir::dtypeSize(dtype)); }

using backends::constantInts;

bool isIndexType(DType dtype) { return dtype == DType::kInt64 || dtype == DType::kInt32; }

// A scatter node's reduction attribute: nullopt for 'none' (or the old Scatter, which has none),
// the reduction otherwise; false where the attribute is unreadable or unknown.
bool readScatterReduction(const ir::Node& node, std::optional<ScatterReduction>& reduction) {
  auto name = node.getString("reduction", "none");
  if (!name.isOk()) return false;
  reduction.reset();
  if (*name == "none") return true;
  if (*name == "add") {
    reduction = ScatterReduction::kAdd;
  } else if (*name == "mul") {
    reduction = ScatterReduction::kMul;
  } else if (*name == "max") {
    reduction = ScatterReduction::kMax;
  } else if (*name == "min") {
    reduction = ScatterReduction::kMin;
  } else {
    return false;
  }
  return true;
}

// Whether every index of a constant indices value lies in [-size, size) (the reference refuses
// the others; runtime indices are not known here).
bool constantIndicesInRange(const ir::Value* indices, int64_t size) {
  if (!indices->constant) return true;
  for (int64_t i = 0; i < indices->constant->elementCount(); ++i) {
    const int64_t index = indices->constant->elementAsInt64(i);
    if (index < -size || index >= size) return false;
  }
  return true;
}

// Copies host data the step keeps (so it outlives the copy) into device memory the plan keeps.
template <typename T>
Result<T*> upload(PrepareContext& context, const std::vector<T>& host, std::string_view what) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
  KILN_ASSIGN_OR_RETURN(std::byte * device, context.allocate(std::max<int64_t>(bytes, 1), what));
  if (bytes > 0) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), static_cast<size_t>(bytes),
                                    cudaMemcpyHostToDevice, context.context.stream));
  }
  return reinterpret_cast<T*>(device);
}

// --- Copies ------------------------------------------------------------------------------------

// Output 0 is `bytes` of input 0 from `srcByteOffset` on: a device-to-device copy.
class CopyStep final : public Step {
 public:
  CopyStep(int64_t srcByteOffset, int64_t bytes) : srcByteOffset_(srcByteOffset), bytes_(bytes) {}

  Status enqueue(const Context& context) const override {
    if (bytes_ <= 0) return Status::ok();
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(context.address(*outputs[0]), context.address(*inputs[0]) + srcByteOffset_,
                        static_cast<size_t>(bytes_), cudaMemcpyDeviceToDevice, context.stream));
    return Status::ok();
  }

 private:
  int64_t srcByteOffset_;
  int64_t bytes_;
};

std::unique_ptr<Step> makeCopy(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (x->dtype != y->dtype || x->shape.elementCount() != y->shape.elementCount()) return nullptr;
  return std::make_unique<CopyStep>(0, x->shape.elementCount() * elementSizeOf(x->dtype));
}

// Dropout at inference keeps every element: a copy, unless the mask is asked for or training
// mode may be on (misc_steps.cc then writes the mask or checks the mode).
std::unique_ptr<Step> makeDropout(const ir::Node& node) {
  if (node.outputs.size() > 1 && node.outputs[1]) return nullptr;
  if (const ir::Value* training = node.input(2)) {
    if (!training->constant || training->constant->elementCount() != 1 ||
        training->constant->elementAsInt64(0) != 0) {
      return nullptr;
    }
  }
  return makeCopy(node);
}

// --- Strided views -----------------------------------------------------------------------------

// An output (row-major over `dims`) whose element at coordinates c is source element
// offset + sum c[a] * strides[a].
struct View {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

// The same view with size-1 axes dropped and neighbouring axes merged where the source walks
// them as one (the output always does); an empty output becomes a single 0-sized axis.
View simplify(const View& view) {
  View merged;
  merged.offset = view.offset;
  for (size_t a = 0; a < view.dims.size(); ++a) {
    const int64_t dim = view.dims[a];
    if (dim == 0) return View{{0}, {0}, 0};
    if (dim == 1) continue;
    if (!merged.dims.empty() && merged.strides.back() == view.strides[a] * dim) {
      merged.dims.back() *= dim;
      merged.strides.back() = view.strides[a];
      continue;
    }
    merged.dims.push_back(dim);
    merged.strides.push_back(view.strides[a]);
  }
  return merged;
}

class StridedStep final : public Step {
 public:
  StridedStep(StridedGather gather, int elementSize) : gather_(gather), elementSize_(elementSize) {}

  void setBlockThreads(int threads) { gather_.blockThreads = threads; }
  std::string detail() const override {
    return "strided rank " + std::to_string(gather_.rank) + ", " +
           std::to_string(gather_.blockThreads) + "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchStridedGather(gather_, context.address(*inputs[0]),
                                        context.address(*outputs[0]), elementSize_,
                                        context.stream));
    KILN_CUDA_CHECK_LAUNCH("the strided gather");
    return Status::ok();
  }

 private:
  StridedGather gather_;
  int elementSize_;
};

class TiledTransposeStep final : public Step {
 public:
  TiledTransposeStep(TiledTranspose transpose, int elementSize)
      : transpose_(transpose), elementSize_(elementSize) {}

  std::string detail() const override {
    return "32x32 tiles, " + std::to_string(transpose_.threadRows) + " thread rows";
  }

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchTiledTranspose(transpose_, context.address(*inputs[0]),
                                         context.address(*outputs[0]), elementSize_,
                                         context.stream));
    KILN_CUDA_CHECK_LAUNCH("the tiled transpose");
    return Status::ok();
  }

 private:
  TiledTranspose transpose_;
  int elementSize_;
};

// The tiled form of a simplified view, when it is a transpose of the innermost axis: the source-
// contiguous axis is not the output's last, which the source walks with a stride.
std::optional<TiledTranspose> tiledForm(const View& view) {
  const size_t rank = view.dims.size();
  if (rank < 2 || view.strides[rank - 1] == 1) return std::nullopt;
  std::optional<size_t> rowAxis;
  for (size_t a = 0; a + 1 < rank; ++a) {
    if (view.strides[a] == 1) rowAxis = a;
  }
  if (!rowAxis) return std::nullopt;
  for (int64_t stride : view.strides) {
    if (stride <= 0) return std::nullopt;  // transposes only: no broadcast or reversed axes
  }
  // A tile needs some extent both ways to pay for itself (a 3-channel NHWC output would leave
  // most of each tile's threads idle).
  if (view.dims[*rowAxis] < kMinTileExtent || view.dims[rank - 1] < kMinTileExtent) {
    return std::nullopt;
  }
  const std::vector<int64_t> outStrides = ir::Shape(view.dims).strides();
  TiledTranspose t;
  t.rows = view.dims[*rowAxis];
  t.cols = view.dims[rank - 1];
  t.srcColStride = view.strides[rank - 1];
  t.dstRowStride = outStrides[*rowAxis];
  t.srcOffset = view.offset;
  for (size_t a = 0; a + 1 < rank; ++a) {
    if (a == *rowAxis) continue;
    t.batchDims[t.batchRank] = view.dims[a];
    t.batchSrcStrides[t.batchRank] = view.strides[a];
    t.batchDstStrides[t.batchRank] = outStrides[a];
    ++t.batchRank;
  }
  return t;
}

// The step for a view of input 0: a plain copy where the view is one contiguous run, the tiled
// transpose (with `tileRows` thread rows a tile) where allowed (tileRows > 0) and it applies, else
// the strided gather; nullptr past kMaxMoveRank axes.
std::unique_ptr<Step> makeViewStep(const ir::Node& node, const View& view, int tileRows,
                                   const char* tactic) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (x->dtype != y->dtype) return nullptr;
  const int size = elementSizeOf(x->dtype);
  const View simple = simplify(view);
  std::unique_ptr<Step> step;
  if (simple.dims.empty() || (simple.dims.size() == 1 && simple.strides[0] == 1)) {
    const int64_t count = simple.dims.empty() ? 1 : simple.dims[0];
    step = std::make_unique<CopyStep>(simple.offset * size, count * size);
  } else if (simple.dims.size() > static_cast<size_t>(kMaxMoveRank)) {
    return nullptr;
  } else if (auto tiled = tileRows > 0 ? tiledForm(simple) : std::nullopt) {
    tiled->threadRows = tileRows;
    step = std::make_unique<TiledTransposeStep>(*tiled, size);
    step->tactic = "kiln.transpose.tiled";
    return step;
  } else {
    // Where the innermost axis is a contiguous run, move it in wider units (up to 8 bytes):
    // fewer threads, and fewer of the divisions that turn an index into coordinates
    // (attention's [B,S,H,D] -> [B,H,S,D] moves runs of D).
    const int64_t elements = x->shape.elementCount();
    int64_t widen = 1;
    while (simple.strides.back() == 1 && size * widen * 2 <= 8) {
      const int64_t next = widen * 2;
      bool fits =
          simple.dims.back() % next == 0 && simple.offset % next == 0 && elements % next == 0;
      for (size_t a = 0; a + 1 < simple.dims.size(); ++a) fits &= simple.strides[a] % next == 0;
      if (!fits) break;
      widen = next;
    }
    StridedGather gather;
    gather.rank = static_cast<int>(simple.dims.size());
    for (size_t a = 0; a < simple.dims.size(); ++a) {
      const bool last = a + 1 == simple.dims.size();
      gather.dims[a] = last ? simple.dims[a] / widen : simple.dims[a];
      gather.srcStrides[a] = last ? simple.strides[a] : simple.strides[a] / widen;
    }
    gather.srcOffset = simple.offset / widen;
    gather.srcElements = elements / widen;
    step = std::make_unique<StridedStep>(gather, size * static_cast<int>(widen));
  }
  step->tactic = tactic;
  return step;
}

std::unique_ptr<Step> makeTranspose(const ir::Node& node, int tileRows) {
  const ir::Shape& in = node.inputs[0]->shape;
  const int64_t rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> reversed(rank);
  for (int64_t i = 0; i < rank; ++i) reversed[i] = rank - 1 - i;
  auto perm = node.getInts("perm", reversed);
  if (!perm.isOk() || static_cast<int64_t>(perm->size()) != rank) return nullptr;
  const std::vector<int64_t> strides = in.strides();
  View view;
  for (int64_t p : *perm) {
    if (p < 0 || p >= rank) return nullptr;
    view.dims.push_back(in[p]);
    view.strides.push_back(strides[p]);
  }
  if (ir::Shape(view.dims) != node.outputs[0]->shape) return nullptr;
  return makeViewStep(node, view, tileRows, "kiln.transpose");
}

// DepthToSpace: the output [N, C', H*b, W*b] seen as [N, C', H, b, W, b] reads the input
// channel (i*b + j)*C' + c (DCR) or c*b*b + i*b + j (CRD) at (h, w).
std::unique_ptr<Step> makeDepthToSpace(const ir::Node& node, int tileRows) {
  const ir::Shape& in = node.inputs[0]->shape;
  auto block = node.getInt("blocksize", 0);
  auto mode = node.getString("mode", "DCR");
  if (in.rank() != 4 || !block.isOk() || *block <= 0 || !mode.isOk()) return nullptr;
  if (*mode != "DCR" && *mode != "CRD") return nullptr;
  const int64_t b = *block;
  if (in[1] % (b * b) != 0) return nullptr;
  const int64_t outChannels = in[1] / (b * b);
  const std::vector<int64_t> s = in.strides();
  View view;
  view.dims = {in[0], outChannels, in[2], b, in[3], b};
  if (*mode == "DCR") {
    view.strides = {s[0], s[1], s[2], b * outChannels * s[1], s[3], outChannels * s[1]};
  } else {
    view.strides = {s[0], b * b * s[1], s[2], b * s[1], s[3], s[1]};
  }
  if (ir::Shape({in[0], outChannels, in[2] * b, in[3] * b}) != node.outputs[0]->shape) {
    return nullptr;
  }
  return makeViewStep(node, view, tileRows, "kiln.transpose");
}

// SpaceToDepth: the output [N, C*b*b, H/b, W/b] seen as [N, b, b, C, H/b, W/b] reads the input
// at (c, h*b + i, w*b + j).
std::unique_ptr<Step> makeSpaceToDepth(const ir::Node& node, int tileRows) {
  const ir::Shape& in = node.inputs[0]->shape;
  auto block = node.getInt("blocksize", 0);
  if (in.rank() != 4 || !block.isOk() || *block <= 0) return nullptr;
  const int64_t b = *block;
  if (in[2] % b != 0 || in[3] % b != 0) return nullptr;
  const std::vector<int64_t> s = in.strides();
  View view;
  view.dims = {in[0], b, b, in[1], in[2] / b, in[3] / b};
  view.strides = {s[0], s[2], s[3], s[1], b * s[2], b * s[3]};
  if (ir::Shape({in[0], in[1] * b * b, in[2] / b, in[3] / b}) != node.outputs[0]->shape) {
    return nullptr;
  }
  return makeViewStep(node, view, tileRows, "kiln.transpose");
}

// Slice: the first element along each axis after ONNX's clamping, then `step` apart; the output
// shape (from inference) gives the counts.
std::unique_ptr<Step> makeSlice(const ir::Node& node) {
  const ir::Shape& in = node.inputs[0]->shape;
  const ir::Shape& out = node.outputs[0]->shape;
  const int64_t rank = static_cast<int64_t>(in.rank());
  if (out.rank() != in.rank()) return nullptr;
  std::vector<int64_t> starts, axes, steps;
  if (node.opsetVersion < 10) {
    auto s = node.getInts("starts");
    auto a = node.getInts("axes", {});
    if (!s.isOk() || !a.isOk()) return nullptr;
    starts = *s;
    axes = *a;
  } else {
    auto s = constantInts(node, 1);
    if (!s || !constantInts(node, 2)) return nullptr;  // runtime starts or ends
    starts = *s;
    if (node.hasInput(3)) {
      auto a = constantInts(node, 3);
      if (!a) return nullptr;
      axes = *a;
    }
    if (node.hasInput(4)) {
      auto st = constantInts(node, 4);
      if (!st) return nullptr;
      steps = *st;
    }
  }
  for (size_t i = axes.size(); i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  steps.resize(starts.size(), 1);
  if (axes.size() != starts.size()) return nullptr;
  std::vector<int64_t> start(rank, 0), step(rank, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    auto axis = ir::normalizeAxis(axes[i], rank);
    if (!axis.isOk() || steps[i] == 0) return nullptr;
    start[*axis] = ir::sliceFirst(starts[i], steps[i], in[*axis]);
    step[*axis] = steps[i];
  }
  const std::vector<int64_t> strides = in.strides();
  View view;
  view.dims = out.dims();
  for (int64_t a = 0; a < rank; ++a) {
    // Along an axis of one element (or none) the step is never taken; it may be huge.
    view.strides.push_back(out[a] > 1 ? step[a] * strides[a] : 0);
    if (out[a] > 0) view.offset += start[a] * strides[a];
    // The last element read must lie inside the axis (the inferred shape guarantees it).
    const int64_t last = start[a] + (out[a] > 0 ? (out[a] - 1) * step[a] : 0);
    if (out[a] > 0 && (last < 0 || last >= in[a])) return nullptr;
  }
  return makeViewStep(node, view, false, "kiln.slice");
}

// Expand: the input broadcast to the output, stride 0 along the broadcast axes.
std::unique_ptr<Step> makeExpand(const ir::Node& node) {
  const ir::Shape& in = node.inputs[0]->shape;
  const ir::Shape& out = node.outputs[0]->shape;
  if (in.rank() > out.rank()) return nullptr;
  const size_t lead = out.rank() - in.rank();
  const std::vector<int64_t> strides = in.strides();
  View view;
  view.dims = out.dims();
  view.strides.assign(out.rank(), 0);
  for (size_t a = 0; a < in.rank(); ++a) {
    if (in[a] != 1 && in[a] != out[lead + a]) return nullptr;
    view.strides[lead + a] = in[a] == 1 ? 0 : strides[a];
  }
  return makeViewStep(node, view, false, "kiln.expand");
}

// --- Concat and Split --------------------------------------------------------------------------

// Concat (parts are the inputs) and Split (parts are the outputs): the part pointers and their
// row offsets go to device memory in prepare(), when the buffers' addresses are known.
class SegmentedStep final : public Step {
 public:
  SegmentedStep(bool split, int64_t outer, std::vector<int64_t> starts, int elementSize)
      : split_(split), outer_(outer), starts_(std::move(starts)), elementSize_(elementSize) {}

  bool split() const { return split_; }
  void setBlockThreads(int threads) { copy_.blockThreads = threads; }
  // Each part as one strided 2D copy instead of the kernel (cuda.concat.impl, cuda.split.impl),
  // where the rows' pitch fits what cudaMemcpy2DAsync takes.
  void useCopies() {
    copies_ = starts_.back() * elementSize_ <= std::numeric_limits<int32_t>::max();
  }
  std::string detail() const override {
    return std::to_string(starts_.size() - 1) + " parts, " +
           (copies_ ? std::string("a 2D copy a part")
                    : std::to_string(copy_.blockThreads) + "-thread blocks");
  }

  Status prepare(PrepareContext& context) override {
    if (copies_) return Status::ok();
    const auto& parts = split_ ? outputs : inputs;
    pointers_.clear();
    for (const auto& part : parts) pointers_.push_back(context.context.address(*part));
    KILN_ASSIGN_OR_RETURN(copy_.starts, upload(context, starts_, "concat/split offsets"));
    KILN_ASSIGN_OR_RETURN(std::byte * *devicePointers,
                          upload(context, pointers_, "concat/split pointers"));
    copy_.parts = reinterpret_cast<void* const*>(devicePointers);
    copy_.outer = outer_;
    copy_.rowWidth = starts_.back();
    copy_.count = static_cast<int>(pointers_.size());
    return Status::ok();
  }

  Status enqueue(const Context& context) const override {
    if (copies_) return enqueueCopies(context);
    if (split_) {
      KILN_CUDA_CHECK(
          launchSplit(copy_, context.address(*inputs[0]), elementSize_, context.stream));
    } else {
      KILN_CUDA_CHECK(
          launchConcat(copy_, context.address(*outputs[0]), elementSize_, context.stream));
    }
    KILN_CUDA_CHECK_LAUNCH(split_ ? "the split" : "the concat");
    return Status::ok();
  }

 private:
  // Part k is `outer` rows of (starts[k + 1] - starts[k]) elements, dense; in the big tensor its
  // rows start at starts[k] and lie starts.back() elements apart.
  Status enqueueCopies(const Context& context) const {
    const auto& parts = split_ ? outputs : inputs;
    std::byte* big = context.address(split_ ? *inputs[0] : *outputs[0]);
    const auto pitch = static_cast<size_t>(starts_.back() * elementSize_);
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto width = static_cast<size_t>((starts_[k + 1] - starts_[k]) * elementSize_);
      if (width == 0 || outer_ == 0) continue;
      std::byte* inBig = big + starts_[k] * elementSize_;
      std::byte* part = context.address(*parts[k]);
      const auto rows = static_cast<size_t>(outer_);
      if (split_) {
        KILN_CUDA_CHECK(cudaMemcpy2DAsync(part, width, inBig, pitch, width, rows,
                                          cudaMemcpyDeviceToDevice, context.stream));
      } else {
        KILN_CUDA_CHECK(cudaMemcpy2DAsync(inBig, pitch, part, width, width, rows,
                                          cudaMemcpyDeviceToDevice, context.stream));
      }
    }
    return Status::ok();
  }

  bool split_;
  bool copies_ = false;
  int64_t outer_;
  std::vector<int64_t> starts_;       // count + 1 row offsets, in elements
  std::vector<std::byte*> pointers_;  // host copies of what the device tables hold
  int elementSize_;
  SegmentedCopy copy_;
};

// The parts of Concat's output or Split's input along `axis`: their row offsets (part k's rows
// are dims[k][axis] * inner elements), or nullopt if a part does not fit.
std::optional<std::vector<int64_t>> segmentStarts(const ir::Value* big,
                                                  const std::vector<ir::Value*>& parts,
                                                  size_t axis) {
  const ir::Shape& shape = big->shape;
  const int64_t inner = product(shape.dims(), axis + 1, shape.rank());
  std::vector<int64_t> starts = {0};
  for (const ir::Value* part : parts) {
    if (!part || part->dtype != big->dtype || part->shape.rank() != shape.rank()) {
      return std::nullopt;
    }
    for (size_t a = 0; a < shape.rank(); ++a) {
      if (a != axis && part->shape[a] != shape[a]) return std::nullopt;
    }
    starts.push_back(starts.back() + part->shape[axis] * inner);
  }
  if (starts.back() != shape[axis] * inner) return std::nullopt;
  return starts;
}

std::unique_ptr<Step> makeConcatOrSplit(const ir::Node& node, bool split) {
  const ir::Value* big = split ? node.inputs[0] : node.outputs[0];
  const std::vector<ir::Value*>& parts = split ? node.outputs : node.inputs;
  const int64_t rank = static_cast<int64_t>(big->shape.rank());
  auto rawAxis = node.getInt("axis", 0);
  if (rank == 0 || !rawAxis.isOk()) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const size_t a = static_cast<size_t>(*axis);
  auto starts = segmentStarts(big, parts, a);
  if (!starts || parts.empty()) return nullptr;
  const int64_t outer = product(big->shape.dims(), 0, a);
  auto step =
      std::make_unique<SegmentedStep>(split, outer, std::move(*starts), elementSizeOf(big->dtype));
  step->tactic = split ? "kiln.split" : "kiln.concat";
  return step;
}

// --- Per-axis tables: Pad, Tile, nearest Resize ------------------------------------------------

class AxisTableStep final : public Step {
 public:
  // tables[a][o]: the source offset of output coordinate o along axis a, or -1 for the fill,
  // which is `fill`'s low bytes, or the element input `fillInput` holds at run time (>= 0).
  AxisTableStep(const std::vector<std::vector<int64_t>>& tables, const std::vector<int64_t>& dims,
                uint64_t fill, int fillInput, int elementSize)
      : fillInput_(fillInput), elementSize_(elementSize) {
    gather_.rank = static_cast<int>(dims.size());
    gather_.fill = fill;
    for (size_t a = 0; a < tables.size(); ++a) {
      gather_.dims[a] = dims[a];
      gather_.tableStart[a] = static_cast<int64_t>(flat_.size());
      flat_.insert(flat_.end(), tables[a].begin(), tables[a].end());
    }
  }

  void setBlockThreads(int threads) { gather_.blockThreads = threads; }
  std::string detail() const override {
    return std::to_string(gather_.blockThreads) + "-thread blocks";
  }

  Status prepare(PrepareContext& context) override {
    KILN_ASSIGN_OR_RETURN(gather_.tables, upload(context, flat_, "axis tables"));
    return Status::ok();
  }

  Status enqueue(const Context& context) const override {
    AxisTableGather gather = gather_;
    if (fillInput_ >= 0) gather.fillDevice = context.address(*inputs[fillInput_]);
    KILN_CUDA_CHECK(launchAxisTableGather(gather, context.address(*inputs[0]),
                                          context.address(*outputs[0]), elementSize_,
                                          context.stream));
    KILN_CUDA_CHECK_LAUNCH("the axis-table gather");
    return Status::ok();
  }

 private:
  std::vector<int64_t> flat_;  // every axis's table, one after another
  int fillInput_;
  int elementSize_;
  AxisTableGather gather_;
};

uint64_t bytesOf(const ir::Tensor& scalar) {
  uint64_t bits = 0;
  std::memcpy(&bits, scalar.rawData(), std::min<size_t>(sizeof(bits), scalar.byteSize()));
  return bits;
}

int64_t floorMod(int64_t value, int64_t modulus) {
  const int64_t r = value % modulus;
  return r < 0 ? r + modulus : r;
}

std::unique_ptr<Step> makeAxisTableStep(const std::vector<std::vector<int64_t>>& tables,
                                        const ir::Value* y, uint64_t fill, int fillInput,
                                        const char* tactic) {
  if (y->shape.rank() > static_cast<size_t>(kMaxMoveRank)) return nullptr;
  auto step = std::make_unique<AxisTableStep>(tables, y->shape.dims(), fill, fillInput,
                                              elementSizeOf(y->dtype));
  step->tactic = tactic;
  return step;
}

std::unique_ptr<Step> makePad(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const size_t rank = x->shape.rank();
  auto mode = node.getString("mode", "constant");
  if (!mode.isOk() || x->dtype != y->dtype || y->shape.rank() != rank) return nullptr;
  if (*mode != "constant" && *mode != "edge" && *mode != "reflect" && *mode != "wrap") {
    return nullptr;
  }
  // [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}] over every axis.
  auto amounts = backends::padAmounts(node, rank);
  if (!amounts) return nullptr;
  const std::vector<int64_t>& pads = *amounts;
  ir::Tensor fill(x->dtype, ir::Shape{});  // zero
  int fillInput = -1;                      // or the runtime input that holds it
  if (node.opsetVersion < 11) {
    auto value = node.getFloat("value", 0.0f);
    if (!value.isOk()) return nullptr;
    fill = ir::Tensor::scalar<float>(*value).castTo(x->dtype);
  } else {
    if (const ir::Value* value = node.input(2)) {
      // As the reference: a one-element value is the fill, an empty one leaves zero.
      if (value->dtype != x->dtype) return nullptr;
      if (value->shape.elementCount() == 1) {
        if (value->constant) {
          fill = *value->constant;
        } else {
          fillInput = 2;
        }
      }
    }
  }
  const std::vector<int64_t> strides = x->shape.strides();
  std::vector<std::vector<int64_t>> tables(rank);
  for (size_t a = 0; a < rank; ++a) {
    // Negative pads crop first; the mode then pads what is left, as the reference does.
    const int64_t padBefore = std::max<int64_t>(0, pads[a]);
    const int64_t cropBefore = std::max<int64_t>(0, -pads[a]);
    const int64_t kept = x->shape[a] - cropBefore - std::max<int64_t>(0, -pads[a + rank]);
    if (y->shape[a] != x->shape[a] + pads[a] + pads[a + rank]) return nullptr;
    if (*mode != "constant" && kept <= 0 && y->shape[a] > 0) return nullptr;
    for (int64_t o = 0; o < y->shape[a]; ++o) {
      const int64_t p = o - padBefore;
      int64_t source = p;
      if (p < 0 || p >= kept) {
        if (*mode == "constant") {
          source = -1;
        } else if (*mode == "edge") {
          source = std::clamp<int64_t>(p, 0, kept - 1);
        } else if (*mode == "wrap") {
          source = floorMod(p, kept);
        } else if (kept == 1) {
          source = 0;
        } else {  // reflect without repeating the edge: period 2 * (kept - 1)
          const int64_t period = 2 * (kept - 1);
          const int64_t m = floorMod(p, period);
          source = m < kept ? m : period - m;
        }
      }
      tables[a].push_back(source < 0 ? -1 : (cropBefore + source) * strides[a]);
    }
  }
  return makeAxisTableStep(tables, y, bytesOf(fill), fillInput, "kiln.pad");
}

std::unique_ptr<Step> makeTile(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const size_t rank = x->shape.rank();
  if (x->dtype != y->dtype || y->shape.rank() != rank) return nullptr;
  const std::vector<int64_t> strides = x->shape.strides();
  std::vector<std::vector<int64_t>> tables(rank);
  for (size_t a = 0; a < rank; ++a) {
    if (y->shape[a] > 0 && x->shape[a] == 0) return nullptr;
    for (int64_t o = 0; o < y->shape[a]; ++o) {
      tables[a].push_back(o % x->shape[a] * strides[a]);
    }
  }
  return makeAxisTableStep(tables, y, 0, -1, "kiln.tile");
}

// --- Resize ------------------------------------------------------------------------------------
// The host works out, per output axis and coordinate, which input elements contribute and with
// what weights, exactly as the reference kernel (indexing_resize.cc) does; the kernels apply it.

using reference::resize::AxisSample;
using reference::resize::Interpolation;
using reference::resize::ResizeSettings;
using reference::resize::Rounding;
using reference::resize::sampleAxis;
using reference::resize::Transform;

std::optional<Interpolation> interpolationOf(const std::string& mode) {
  if (mode == "nearest") return Interpolation::kNearest;
  if (mode == "linear" || mode == "bilinear") return Interpolation::kLinear;
  if (mode == "cubic") return Interpolation::kCubic;
  return std::nullopt;
}

std::optional<Transform> transformOf(const std::string& name) {
  static const std::pair<const char*, Transform> kTable[] = {
      {"half_pixel", Transform::kHalfPixel},
      {"half_pixel_symmetric", Transform::kHalfPixelSymmetric},
      {"pytorch_half_pixel", Transform::kPytorchHalfPixel},
      {"align_corners", Transform::kAlignCorners},
      {"asymmetric", Transform::kAsymmetric},
      {"tf_half_pixel_for_nn", Transform::kTfHalfPixelForNn},
      {"tf_crop_and_resize", Transform::kTfCropAndResize},
  };
  for (const auto& [text, transform] : kTable) {
    if (name == text) return transform;
  }
  return std::nullopt;
}

std::optional<Rounding> roundingOf(const std::string& name) {
  if (name == "round_prefer_floor") return Rounding::kRoundPreferFloor;
  if (name == "round_prefer_ceil") return Rounding::kRoundPreferCeil;
  if (name == "floor") return Rounding::kFloor;
  if (name == "ceil") return Rounding::kCeil;
  return std::nullopt;
}

// A constant input's values as doubles; nullopt where absent, runtime, or empty.
std::optional<std::vector<double>> constantDoubles(const ir::Node& node, size_t input) {
  const ir::Value* value = node.input(input);
  if (!value || !value->constant || value->constant->elementCount() == 0) return std::nullopt;
  std::vector<double> values;
  for (int64_t i = 0; i < value->constant->elementCount(); ++i) {
    values.push_back(value->constant->elementAsDouble(i));
  }
  return values;
}

// Upsample and opset-10 Resize: asymmetric coordinates, legacy nearest rounding.
std::optional<ResizeSettings> legacyResizeSettings(const ir::Node& node) {
  ResizeSettings settings;
  auto mode = node.getString("mode", "nearest");
  if (!mode.isOk()) return std::nullopt;
  auto interpolation = interpolationOf(*mode);
  if (!interpolation || *interpolation == Interpolation::kCubic) return std::nullopt;
  settings.mode = *interpolation;
  if (node.opType == "Upsample" && node.opsetVersion < 9) {
    auto scales = node.getFloats("scales");
    if (!scales.isOk()) return std::nullopt;
    settings.scales.assign(scales->begin(), scales->end());
  } else {
    auto scales = constantDoubles(node, 1);
    if (!scales) return std::nullopt;
    settings.scales = *scales;
  }
  return settings;
}

// Resize from opset 11: attributes, then scales (given, or from the sizes) and roi per axis.
std::optional<ResizeSettings> modernResizeSettings(const ir::Node& node) {
  ResizeSettings settings;
  auto mode = node.getString("mode", "nearest");
  auto transform = node.getString("coordinate_transformation_mode", "half_pixel");
  auto rounding = node.getString("nearest_mode", "round_prefer_floor");
  auto cubicA = node.getFloat("cubic_coeff_a", -0.75f);
  auto exclude = node.getInt("exclude_outside", 0);
  auto extrapolation = node.getFloat("extrapolation_value", 0.0f);
  auto antialias = node.getInt("antialias", 0);
  auto policy = node.getString("keep_aspect_ratio_policy", "stretch");
  if (!mode.isOk() || !transform.isOk() || !rounding.isOk() || !cubicA.isOk() || !exclude.isOk() ||
      !extrapolation.isOk() || !antialias.isOk() || !policy.isOk()) {
    return std::nullopt;
  }
  auto interpolation = interpolationOf(*mode);
  auto transformKind = transformOf(*transform);
  auto roundingKind = roundingOf(*rounding);
  if (!interpolation || !transformKind || !roundingKind) return std::nullopt;
  settings.mode = *interpolation;
  settings.transform = *transformKind;
  settings.rounding = *roundingKind;
  settings.cubicA = *cubicA;
  settings.excludeOutside = *exclude != 0;
  settings.extrapolationValue = *extrapolation;
  settings.antialias = node.opsetVersion >= 18 && *antialias != 0;

  const ir::Shape& in = node.inputs[0]->shape;
  const ir::Shape& out = node.outputs[0]->shape;
  const int64_t rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> axes;
  if (node.opsetVersion >= 18 && node.hasAttribute("axes")) {
    auto given = node.getInts("axes");
    if (!given.isOk()) return std::nullopt;
    for (int64_t axis : *given) {
      auto normalized = ir::normalizeAxis(axis, rank);
      if (!normalized.isOk()) return std::nullopt;
      axes.push_back(*normalized);
    }
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  settings.scales.assign(rank, 1.0);
  settings.roiStart.assign(rank, 0.0);
  settings.roiEnd.assign(rank, 1.0);
  if (settings.transform == Transform::kTfCropAndResize) {
    // The crop box changes which elements are read: it must be known here.
    auto roi = constantDoubles(node, 1);
    if (!roi) return std::nullopt;
    if (roi->size() == 2 * axes.size()) {
      for (size_t i = 0; i < axes.size(); ++i) {
        settings.roiStart[axes[i]] = (*roi)[i];
        settings.roiEnd[axes[i]] = (*roi)[axes.size() + i];
      }
    }
  }
  const ir::Value* scalesValue = node.input(2);
  if (scalesValue && scalesValue->shape.elementCount() > 0) {
    auto scales = constantDoubles(node, 2);
    if (!scales || scales->size() < axes.size()) return std::nullopt;
    for (size_t i = 0; i < axes.size(); ++i) settings.scales[axes[i]] = (*scales)[i];
    return settings;
  }
  if (node.opsetVersion < 18 || *policy == "stretch") {
    for (int64_t axis : axes) {
      if (in[axis] == 0) return std::nullopt;
      settings.scales[axis] = static_cast<double>(out[axis]) / static_cast<double>(in[axis]);
    }
    return settings;
  }
  // One scale for every resized axis: the output sizes were rounded from it.
  auto sizes = constantInts(node, 3);
  if (!sizes || sizes->size() != axes.size() || axes.empty()) return std::nullopt;
  for (int64_t axis : axes) {
    if (in[axis] == 0) return std::nullopt;
  }
  double scale = static_cast<double>((*sizes)[0]) / static_cast<double>(in[axes[0]]);
  for (size_t i = 1; i < axes.size(); ++i) {
    const double ratio = static_cast<double>((*sizes)[i]) / static_cast<double>(in[axes[i]]);
    scale = *policy == "not_larger" ? std::min(scale, ratio) : std::max(scale, ratio);
  }
  for (int64_t axis : axes) settings.scales[axis] = scale;
  return settings;
}

// An axis whose every sample reads one element with weight exactly 1 (the others exactly 0),
// e.g. an axis Resize leaves alone: one tap serves it. (The reference also multiplies the
// zero-weight neighbours, which differs only where such a neighbour is infinite or NaN.)
bool collapsible(const std::vector<AxisSample>& samples) {
  for (const AxisSample& sample : samples) {
    if (sample.outside) continue;
    int ones = 0;
    for (double w : sample.weight) {
      if (w == 1.0) {
        ++ones;
      } else if (w != 0.0) {
        return false;
      }
    }
    if (ones != 1) return false;
  }
  return true;
}

// Whether `tables` take ResizeTables::twoAxesLinear's kernel, filling in its walk if so.
bool twoAxesLinear(ResizeTables& tables, const std::vector<int64_t>& offsets,
                   const std::vector<float>& weights, const ir::Shape& input,
                   const ir::Shape& output) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (output.elementCount() >= kLimit || input.elementCount() >= kLimit) return false;
  for (int64_t offset : offsets) {
    if (offset < 0) return false;  // outside the crop
  }
  const std::vector<int64_t> strides = input.strides();
  int first = -1;
  for (int a = 0; a < tables.rank; ++a) {
    const auto axis = static_cast<size_t>(a);
    if (tables.taps[a] == 2) {
      if (first >= 0 && a != first + 1) return false;
      if (first < 0) first = a;
      continue;
    }
    // Any other axis must copy: one tap of weight 1 at the output's own coordinate.
    if (tables.taps[a] != 1 || input[axis] != output[axis]) return false;
    for (int64_t coord = 0; coord < output[axis]; ++coord) {
      const auto at = static_cast<size_t>(tables.tableStart[a] + coord);
      if (offsets[at] != coord * strides[axis] || weights[at] != 1.0f) return false;
    }
  }
  if (first < 0 || first + 1 >= tables.rank || tables.taps[first + 1] != 2) return false;
  tables.axis = first;
  tables.inner = 1;
  for (int a = first + 2; a < tables.rank; ++a) tables.inner *= output[static_cast<size_t>(a)];
  tables.inputPlane =
      input[static_cast<size_t>(first)] * input[static_cast<size_t>(first) + 1] * tables.inner;
  return true;
}

class ResizeInterpolateStep final : public Step {
 public:
  ResizeInterpolateStep(ResizeTables tables, ElementType type, std::vector<int64_t> offsets,
                        std::vector<float> weights)
      : tables_(tables), type_(type), offsets_(std::move(offsets)), weights_(std::move(weights)) {}

  void setBlockThreads(int threads) { tables_.blockThreads = threads; }
  std::string detail() const override {
    return std::to_string(tables_.blockThreads) + "-thread blocks";
  }

  Status prepare(PrepareContext& context) override {
    KILN_ASSIGN_OR_RETURN(tables_.offsets, upload(context, offsets_, "resize offsets"));
    KILN_ASSIGN_OR_RETURN(tables_.weights, upload(context, weights_, "resize weights"));
    return Status::ok();
  }

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchResizeInterpolate(tables_, type_, context.address(*inputs[0]),
                                            context.address(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the interpolating resize");
    return Status::ok();
  }

 private:
  ResizeTables tables_;
  ElementType type_;
  std::vector<int64_t> offsets_;
  std::vector<float> weights_;
};

std::unique_ptr<Step> makeResize(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const size_t rank = x->shape.rank();
  if (rank == 0 || rank > static_cast<size_t>(kMaxMoveRank) || y->shape.rank() != rank ||
      x->dtype != y->dtype) {
    return nullptr;
  }
  const bool legacy = node.opType == "Upsample" || node.opsetVersion < 11;
  std::optional<ResizeSettings> settings =
      legacy ? legacyResizeSettings(node) : modernResizeSettings(node);
  if (!settings || settings->scales.size() != rank) return nullptr;
  for (double scale : settings->scales) {
    if (!(scale > 0) || !std::isfinite(scale)) return nullptr;
  }
  const bool nearest = settings->mode == Interpolation::kNearest;
  // Interpolation sums in float32: float32, float16 and bfloat16 data (integers round in the
  // reference).
  const bool floating =
      x->dtype == DType::kFloat32 || x->dtype == DType::kFloat16 || x->dtype == DType::kBFloat16;
  if (!nearest && !floating) return nullptr;
  const std::vector<int64_t> strides = x->shape.strides();
  std::vector<std::vector<AxisSample>> samples(rank);
  for (size_t a = 0; a < rank; ++a) {
    if (y->shape[a] > 0 && x->shape[a] == 0) return nullptr;
    for (int64_t o = 0; o < y->shape[a]; ++o) {
      samples[a].push_back(sampleAxis(*settings, a, o, x->shape[a], y->shape[a]));
    }
  }
  if (nearest) {
    std::vector<std::vector<int64_t>> tables(rank);
    for (size_t a = 0; a < rank; ++a) {
      for (const AxisSample& sample : samples[a]) {
        tables[a].push_back(sample.outside ? -1 : sample.index[0] * strides[a]);
      }
    }
    const ir::Tensor fill =
        ir::Tensor::scalar<float>(settings->extrapolationValue).castTo(x->dtype);
    return makeAxisTableStep(tables, y, bytesOf(fill), -1, "kiln.resize.nearest");
  }
  ResizeTables tables;
  tables.rank = static_cast<int>(rank);
  tables.extrapolation = settings->extrapolationValue;
  std::vector<int64_t> offsets;
  std::vector<float> weights;
  for (size_t a = 0; a < rank; ++a) {
    const bool single = collapsible(samples[a]);
    int64_t taps = 0;
    for (const AxisSample& sample : samples[a]) {
      if (!sample.outside) taps = single ? 1 : static_cast<int64_t>(sample.weight.size());
    }
    taps = std::max<int64_t>(taps, 1);
    tables.dims[a] = y->shape[a];
    tables.taps[a] = taps;
    tables.tableStart[a] = static_cast<int64_t>(offsets.size());
    for (const AxisSample& sample : samples[a]) {
      if (sample.outside) {
        offsets.push_back(-1);
        weights.push_back(0.0f);
        offsets.insert(offsets.end(), taps - 1, 0);
        weights.insert(weights.end(), taps - 1, 0.0f);
        continue;
      }
      if (single) {
        for (size_t k = 0; k < sample.weight.size(); ++k) {
          if (sample.weight[k] != 1.0) continue;
          offsets.push_back(sample.index[k] * strides[a]);
          weights.push_back(1.0f);
        }
        continue;
      }
      if (static_cast<int64_t>(sample.weight.size()) != taps) return nullptr;
      for (size_t k = 0; k < sample.weight.size(); ++k) {
        offsets.push_back(sample.index[k] * strides[a]);
        weights.push_back(static_cast<float>(sample.weight[k]));
      }
    }
  }
  tables.twoAxesLinear = twoAxesLinear(tables, offsets, weights, x->shape, y->shape);
  const bool twoAxes = tables.twoAxesLinear;
  auto step = std::make_unique<ResizeInterpolateStep>(tables, *elementTypeOf(x->dtype),
                                                      std::move(offsets), std::move(weights));
  step->tactic = twoAxes ? "kiln.resize.two_axes" : "kiln.resize.interpolate";
  return step;
}

// --- Gather family -----------------------------------------------------------------------------

class GatherStep final : public Step {
 public:
  GatherStep(GatherGeometry geometry, bool indices64, int elementSize)
      : geometry_(geometry), indices64_(indices64), elementSize_(elementSize) {}

  void setBlockThreads(int threads) { geometry_.blockThreads = threads; }
  void setWords(bool on) { geometry_.words = on; }
  std::string detail() const override {
    const int word = gatherWordBytes(geometry_, elementSize_);
    const std::string blocks = std::to_string(geometry_.blockThreads) + "-thread blocks";
    return word > elementSize_ ? std::to_string(word) + "-byte words, " + blocks : blocks;
  }

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchGather(geometry_, context.address(*inputs[0]),
                                 context.address(*inputs[1]), indices64_,
                                 context.address(*outputs[0]), elementSize_, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the gather");
    return Status::ok();
  }

 private:
  GatherGeometry geometry_;
  bool indices64_;
  int elementSize_;
};

std::unique_ptr<Step> makeGather(const ir::Node& node) {
  const ir::Value* data = node.inputs[0];
  const ir::Value* indices = node.input(1);
  const ir::Value* out = node.outputs[0];
  if (!indices || !isIndexType(indices->dtype) || data->dtype != out->dtype) return nullptr;
  const int64_t rank = static_cast<int64_t>(data->shape.rank());
  auto rawAxis = node.getInt("axis", 0);
  if (rank == 0 || !rawAxis.isOk()) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const auto& dims = data->shape.dims();
  GatherGeometry geometry;
  geometry.outer = product(dims, 0, static_cast<size_t>(*axis));
  geometry.axisSize = dims[*axis];
  geometry.indexCount = indices->shape.elementCount();
  geometry.inner = product(dims, static_cast<size_t>(*axis) + 1, dims.size());
  if (!constantIndicesInRange(indices, geometry.axisSize)) return nullptr;
  if (geometry.outer * geometry.indexCount * geometry.inner != out->shape.elementCount()) {
    return nullptr;
  }
  // One constant index (a scalar, as torch's select exports): a strided view of the data, one
  // contiguous copy where outer is 1 (ViT's and Swin's q, k, v from the packed projection).
  if (indices->constant && geometry.indexCount == 1 && geometry.axisSize > 0) {
    int64_t index = indices->constant->elementAsInt64(0);
    if (index < 0) index += geometry.axisSize;
    View view;
    view.dims = {geometry.outer, geometry.inner};
    view.strides = {geometry.axisSize * geometry.inner, 1};
    view.offset = index * geometry.inner;
    return makeViewStep(node, view, false, "kiln.gather.view");
  }
  auto step = std::make_unique<GatherStep>(geometry, indices->dtype == DType::kInt64,
                                           elementSizeOf(data->dtype));
  step->tactic = "kiln.gather";
  return step;
}

// GatherElements, and ScatterElements (and the older Scatter), with or without a reduction.
class ElementIndexingStep final : public Step {
 public:
  ElementIndexingStep(ElementIndexing indexing, bool scatter, bool indices64, DType dtype,
                      std::optional<ScatterReduction> reduction)
      : indexing_(indexing),
        scatter_(scatter),
        indices64_(indices64),
        elementSize_(elementSizeOf(dtype)),
        type_(elementTypeOf(dtype).value_or(ElementType::kFloat32)),
        reduction_(reduction) {}

  bool scatter() const { return scatter_; }
  void setBlockThreads(int threads) { indexing_.blockThreads = threads; }
  std::string detail() const override {
    return std::to_string(indexing_.blockThreads) + "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    std::byte* out = context.address(*outputs[0]);
    if (!scatter_) {
      KILN_CUDA_CHECK(launchGatherElements(indexing_, context.address(*inputs[0]),
                                           context.address(*inputs[1]), indices64_, out,
                                           elementSize_, context.stream));
      KILN_CUDA_CHECK_LAUNCH("the element gather");
      return Status::ok();
    }
    if (outputs[0]->bytes() > 0) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(out, context.address(*inputs[0]),
                                      static_cast<size_t>(outputs[0]->bytes()),
                                      cudaMemcpyDeviceToDevice, context.stream));
    }
    if (reduction_) {
      KILN_CUDA_CHECK(launchScatterElementsReduce(
          indexing_, *reduction_, type_, context.address(*inputs[1]), indices64_,
          context.address(*inputs[2]), out, context.stream));
    } else {
      KILN_CUDA_CHECK(launchScatterElements(indexing_, context.address(*inputs[1]), indices64_,
                                            context.address(*inputs[2]), out, elementSize_,
                                            context.stream));
    }
    KILN_CUDA_CHECK_LAUNCH("the element scatter");
    return Status::ok();
  }

 private:
  ElementIndexing indexing_;
  bool scatter_;
  bool indices64_;
  int elementSize_;
  ElementType type_;
  std::optional<ScatterReduction> reduction_;
};

std::unique_ptr<Step> makeElementIndexing(const ir::Node& node, bool scatter) {
  const ir::Value* data = node.inputs[0];
  const ir::Value* indices = node.input(1);
  const ir::Value* out = node.outputs[0];
  if (!indices || !isIndexType(indices->dtype) || data->dtype != out->dtype) return nullptr;
  const size_t rank = data->shape.rank();
  if (rank == 0 || rank > static_cast<size_t>(kMaxMoveRank) || indices->shape.rank() != rank) {
    return nullptr;
  }
  std::optional<ScatterReduction> reduction;
  if (scatter) {
    const ir::Value* updates = node.input(2);
    if (!updates || updates->dtype != data->dtype || updates->shape != indices->shape ||
        !readScatterReduction(node, reduction) || out->shape != data->shape) {
      return nullptr;
    }
  } else if (out->shape != indices->shape) {
    return nullptr;
  }
  auto rawAxis = node.getInt("axis", 0);
  if (!rawAxis.isOk()) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, static_cast<int64_t>(rank));
  if (!axis.isOk()) return nullptr;
  ElementIndexing indexing;
  indexing.rank = static_cast<int>(rank);
  indexing.axis = static_cast<int>(*axis);
  indexing.axisSize = data->shape[*axis];
  const std::vector<int64_t> strides = data->shape.strides();
  for (size_t a = 0; a < rank; ++a) {
    // Off the axis, every index position must exist in data (inference checks it too).
    if (static_cast<int64_t>(a) != *axis && indices->shape[a] > data->shape[a]) return nullptr;
    indexing.indexDims[a] = indices->shape[a];
    indexing.dataStrides[a] = strides[a];
  }
  if (!constantIndicesInRange(indices, indexing.axisSize)) return nullptr;
  auto step = std::make_unique<ElementIndexingStep>(
      indexing, scatter, indices->dtype == DType::kInt64, data->dtype, reduction);
  step->tactic = !scatter    ? "kiln.gather_elements"
                 : reduction ? "kiln.scatter_elements.reduce"
                             : "kiln.scatter_elements";
  return step;
}

// GatherND, and ScatterND with or without a reduction.
class NdIndexingStep final : public Step {
 public:
  NdIndexingStep(NdIndexing indexing, bool scatter, bool indices64, DType dtype,
                 std::optional<ScatterReduction> reduction)
      : indexing_(indexing),
        scatter_(scatter),
        indices64_(indices64),
        elementSize_(elementSizeOf(dtype)),
        type_(elementTypeOf(dtype).value_or(ElementType::kFloat32)),
        reduction_(reduction) {}

  bool scatter() const { return scatter_; }
  void setBlockThreads(int threads) { indexing_.blockThreads = threads; }
  std::string detail() const override {
    return std::to_string(indexing_.blockThreads) + "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    std::byte* out = context.address(*outputs[0]);
    if (!scatter_) {
      KILN_CUDA_CHECK(launchGatherND(indexing_, context.address(*inputs[0]),
                                     context.address(*inputs[1]), indices64_, out, elementSize_,
                                     context.stream));
      KILN_CUDA_CHECK_LAUNCH("the nd gather");
      return Status::ok();
    }
    if (outputs[0]->bytes() > 0) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(out, context.address(*inputs[0]),
                                      static_cast<size_t>(outputs[0]->bytes()),
                                      cudaMemcpyDeviceToDevice, context.stream));
    }
    if (reduction_) {
      KILN_CUDA_CHECK(launchScatterNDReduce(indexing_, *reduction_, type_,
                                            context.address(*inputs[1]), indices64_,
                                            context.address(*inputs[2]), out, context.stream));
    } else {
      KILN_CUDA_CHECK(launchScatterND(indexing_, context.address(*inputs[1]), indices64_,
                                      context.address(*inputs[2]), out, elementSize_,
                                      context.stream));
    }
    KILN_CUDA_CHECK_LAUNCH("the nd scatter");
    return Status::ok();
  }

 private:
  NdIndexing indexing_;
  bool scatter_;
  bool indices64_;
  int elementSize_;
  ElementType type_;
  std::optional<ScatterReduction> reduction_;
};

// Whether every row of a constant indices value (k indices each) addresses data dims[first..].
bool constantNdIndicesInRange(const ir::Value* indices, const std::vector<int64_t>& dims,
                              size_t first, int64_t k) {
  if (!indices->constant) return true;
  const int64_t count = indices->constant->elementCount();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t size = dims[first + static_cast<size_t>(i % k)];
    const int64_t index = indices->constant->elementAsInt64(i);
    if (index < -size || index >= size) return false;
  }
  return true;
}

std::unique_ptr<Step> makeNdIndexing(const ir::Node& node, bool scatter) {
  const ir::Value* data = node.inputs[0];
  const ir::Value* indices = node.input(1);
  const ir::Value* out = node.outputs[0];
  if (!indices || !isIndexType(indices->dtype) || data->dtype != out->dtype) return nullptr;
  const auto& dataDims = data->shape.dims();
  const auto& indexDims = indices->shape.dims();
  if (dataDims.empty() || indexDims.empty()) return nullptr;
  auto batchDims = scatter ? Result<int64_t>(int64_t{0}) : node.getInt("batch_dims", 0);
  if (!batchDims.isOk()) return nullptr;
  const int64_t b = *batchDims;
  const int64_t k = indexDims.back();
  const int64_t r = static_cast<int64_t>(dataDims.size());
  if (b < 0 || k < 1 || k > kMaxMoveRank || b + k > r) return nullptr;
  if (static_cast<int64_t>(indexDims.size()) <= b) return nullptr;
  const std::vector<int64_t> strides = data->shape.strides();
  NdIndexing indexing;
  indexing.k = static_cast<int>(k);
  indexing.rows = product(indexDims, 0, indexDims.size() - 1);
  indexing.sliceSize = product(dataDims, static_cast<size_t>(b + k), dataDims.size());
  for (int64_t j = 0; j < k; ++j) {
    indexing.dims[j] = dataDims[b + j];
    indexing.strides[j] = strides[b + j];
  }
  std::optional<ScatterReduction> reduction;
  if (scatter) {
    const ir::Value* updates = node.input(2);
    if (!updates || updates->dtype != data->dtype || !readScatterReduction(node, reduction) ||
        out->shape != data->shape ||
        updates->shape.elementCount() != indexing.rows * indexing.sliceSize) {
      return nullptr;
    }
    indexing.rowsPerBatch = std::max<int64_t>(1, indexing.rows);
    indexing.batchBlock = 0;
  } else {
    for (int64_t i = 0; i < b; ++i) {
      if (dataDims[i] != indexDims[i]) return nullptr;
    }
    indexing.rowsPerBatch =
        std::max<int64_t>(1, product(indexDims, static_cast<size_t>(b), indexDims.size() - 1));
    indexing.batchBlock = product(dataDims, static_cast<size_t>(b), dataDims.size());
    if (out->shape.elementCount() != indexing.rows * indexing.sliceSize) return nullptr;
  }
  if (!constantNdIndicesInRange(indices, dataDims, static_cast<size_t>(b), k)) return nullptr;
  auto step = std::make_unique<NdIndexingStep>(indexing, scatter, indices->dtype == DType::kInt64,
                                               data->dtype, reduction);
  step->tactic = !scatter    ? "kiln.gather_nd"
                 : reduction ? "kiln.scatter_nd.reduce"
                             : "kiln.scatter_nd";
  return step;
}

// --- Trilu -------------------------------------------------------------------------------------

class TriluStep final : public Step {
 public:
  TriluStep(bool upper, int64_t k, bool runtimeK, int64_t rows, int64_t cols, int elementSize)
      : upper_(upper),
        k_(k),
        runtimeK_(runtimeK),
        rows_(rows),
        cols_(cols),
        elementSize_(elementSize) {}

  void setBlockThreads(int threads) { blockThreads_ = threads; }
  std::string detail() const override { return std::to_string(blockThreads_) + "-thread blocks"; }

  Status enqueue(const Context& context) const override {
    const int64_t* kDevice = runtimeK_ ? context.data<int64_t>(*inputs[1]) : nullptr;
    KILN_CUDA_CHECK(launchTrilu(context.address(*inputs[0]), context.address(*outputs[0]),
                                outputs[0]->elements(), rows_, cols_, upper_, k_, kDevice,
                                elementSize_, blockThreads_, context.stream));
    KILN_CUDA_CHECK_LAUNCH("trilu");
    return Status::ok();
  }

 private:
  bool upper_;
  int64_t k_;
  bool runtimeK_;
  int64_t rows_, cols_;
  int elementSize_;
  int blockThreads_ = 256;
};

std::unique_ptr<Step> makeTrilu(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const size_t rank = x->shape.rank();
  auto upper = node.getInt("upper", 1);
  if (rank < 2 || !upper.isOk() || x->dtype != y->dtype || x->shape != y->shape) return nullptr;
  int64_t k = 0;
  bool runtimeK = false;
  if (const ir::Value* kValue = node.input(1)) {
    if (kValue->dtype != DType::kInt64 || kValue->shape.elementCount() != 1) return nullptr;
    if (kValue->constant) {
      k = kValue->constant->elementAsInt64(0);
    } else {
      runtimeK = true;
    }
  }
  auto step = std::make_unique<TriluStep>(*upper != 0, k, runtimeK, x->shape[rank - 2],
                                          x->shape[rank - 1], elementSizeOf(x->dtype));
  step->tactic = "kiln.trilu";
  return step;
}

// --- The factory -------------------------------------------------------------------------------

std::unique_ptr<Step> makeMoveStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.inputs.empty() || !node.inputs[0]) return nullptr;
  if (node.outputs.empty() || !node.outputs[0]) return nullptr;
  for (const ir::Value* output : node.outputs) {
    if (output && output->constant) return nullptr;
  }
  const std::string& op = node.opType;
  const int tiled = route.value(kTiledTranspose, &node) == "on"
                        ? std::stoi(route.value(kTransposeTileRows, &node))
                        : 0;
  std::unique_ptr<Step> step;
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" ||
      op == "Identity") {
    step = makeCopy(node);
  } else if (op == "Dropout") {
    step = makeDropout(node);
  } else if (op == "Transpose") {
    return makeTranspose(node, tiled);
  } else if (op == "DepthToSpace") {
    return makeDepthToSpace(node, tiled);
  } else if (op == "SpaceToDepth") {
    return makeSpaceToDepth(node, tiled);
  } else if (op == "Slice") {
    return makeSlice(node);
  } else if (op == "Expand") {
    return makeExpand(node);
  } else if (op == "Concat") {
    return makeConcatOrSplit(node, false);
  } else if (op == "Split") {
    return makeConcatOrSplit(node, true);
  } else if (op == "Pad") {
    return makePad(node);
  } else if (op == "Tile") {
    return makeTile(node);
  } else if (op == "Resize" || op == "Upsample") {
    return makeResize(node);
  } else if (op == "Gather") {
    return makeGather(node);
  } else if (op == "GatherElements") {
    return makeElementIndexing(node, false);
  } else if (op == "ScatterElements" || op == "Scatter") {
    return makeElementIndexing(node, true);
  } else if (op == "GatherND") {
    return makeNdIndexing(node, false);
  } else if (op == "ScatterND") {
    return makeNdIndexing(node, true);
  } else if (op == "Trilu") {
    return makeTrilu(node);
  }
  if (step) step->tactic = "kiln.copy";
  return step;
}

// The step, with its launch from the route: cuda.copy.block for the strided gather and the Concat
// and Split kernels (or cuda.concat.impl / cuda.split.impl's copies), cuda.table.block,
// cuda.gather.block (and cuda.gather.vector), cuda.scatter.block and cuda.resize.block for the
// others.
std::unique_ptr<Step> makeDataMoveStep(const ir::Node& node, const knobs::Route& route) {
  std::unique_ptr<Step> step = makeMoveStep(node, route);
  if (!step) return step;
  auto threads = [&](const knobs::Knob& knob) { return std::stoi(route.value(knob, &node)); };
  if (auto* strided = dynamic_cast<StridedStep*>(step.get())) {
    strided->setBlockThreads(threads(kCopyBlock));
  } else if (auto* segmented = dynamic_cast<SegmentedStep*>(step.get())) {
    segmented->setBlockThreads(threads(kCopyBlock));
    if (route.value(segmented->split() ? kSplitImpl : kConcatImpl, &node) == "copies") {
      segmented->useCopies();
    }
  } else if (auto* table = dynamic_cast<AxisTableStep*>(step.get())) {
    table->setBlockThreads(threads(kTableBlock));
  } else if (auto* resize = dynamic_cast<ResizeInterpolateStep*>(step.get())) {
    resize->setBlockThreads(threads(kResizeBlock));
  } else if (auto* gather = dynamic_cast<GatherStep*>(step.get())) {
    gather->setBlockThreads(threads(kGatherBlock));
    gather->setWords(route.isOn(kGatherVector, &node));
  } else if (auto* elements = dynamic_cast<ElementIndexingStep*>(step.get())) {
    elements->setBlockThreads(threads(elements->scatter() ? kScatterBlock : kGatherBlock));
  } else if (auto* nd = dynamic_cast<NdIndexingStep*>(step.get())) {
    nd->setBlockThreads(threads(nd->scatter() ? kScatterBlock : kGatherBlock));
  } else if (auto* trilu = dynamic_cast<TriluStep*>(step.get())) {
    trilu->setBlockThreads(threads(kTriluBlock));
  }
  return step;
}

const int kRegistered = registerStepFactory(kRankDataMove, "datamove", makeDataMoveStep);

}  // namespace
}  // namespace kiln::cuda
