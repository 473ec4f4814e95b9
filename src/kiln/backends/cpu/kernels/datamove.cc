// Data movement on the CPU for every dtype (elements moved by size): the copies (Reshape,
// Flatten, Squeeze, Unsqueeze, Identity, inference Dropout), Concat, Split, Slice, Expand, Tile,
// Pad and kiln.ChannelShuffle as planned strided boxes or per-axis tables (datamove.h), Where over
// a merged broadcast walk, and Cast between float32, int64, int32 and bool. Gather and Resize live
// in gather.cc and resize.cc; this file holds the family's knob and factory.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kiln/backends/cpu/kernels/datamove.h"
#include "kiln/backends/node_constants.h"
#include "kiln/ir/op_schema.h"

namespace kiln::cpu {

const knobs::Knob kDataMoveImpl = knobs::declareKnob({
    .name = "cpu.datamove.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "Concat, Split, Slice, Gather, Pad, Expand, Tile, Where, Cast, Resize, "
            "kiln.ChannelShuffle and the copying shape ops: planned strided copies, or the "
            "reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kCopyChunk = knobs::declareKnob({
    .name = "cpu.copy.chunk",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"64", "256", "1024", "4096"},
    .defaultValue = "64",
    .help = "KiB of copying (Concat, Split, Slice, Expand, Tile, Pad, the copying shape ops) a "
            "thread takes at least: a copy smaller than two of these runs on one thread; smaller "
            "chunks spread copies of small tensors over the threads, each reading what it wrote "
            "last (the other core's cache otherwise) at the cost of waking them. 64 measured "
            "best on the 2-core development machine at 2 threads: SqueezeNet 1.1 3.26 and 3.29 "
            "against 3.32 and 3.39 ms with 4096, ShuffleNetV2 1.98 and 2.05 against 2.17 and "
            "2.08, MobileNetV3-Small level (bench/cpu/results/2026-12-04-copy-chunk.md)",
    .backends = {"cpu"},
    .perNode = true,
});

namespace datamove {

namespace {

// One unit of parallel copy work: big enough to amortise the unit's bookkeeping, small enough
// that a few units make a chunk.
constexpr int64_t kUnitBytes = 16 * 1024;

template <typename T>
void copyRowAs(const std::byte* src, std::byte* dst, int64_t n, int64_t srcStride,
               int64_t dstStride) {
  const T* x = reinterpret_cast<const T*>(src);
  T* y = reinterpret_cast<T*>(dst);
  if (srcStride == 0 && dstStride == 1) {
    std::fill_n(y, n, *x);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i * dstStride] = x[i * srcStride];
}

// Copies n elements of `size` bytes with the given element strides.
void copyRow(const std::byte* src, std::byte* dst, int64_t n, int64_t srcStride, int64_t dstStride,
             size_t size) {
  if (srcStride == 1 && dstStride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * size);
    return;
  }
  switch (size) {
    case 1:
      return copyRowAs<uint8_t>(src, dst, n, srcStride, dstStride);
    case 2:
      return copyRowAs<uint16_t>(src, dst, n, srcStride, dstStride);
    case 4:
      return copyRowAs<uint32_t>(src, dst, n, srcStride, dstStride);
    case 8:
      return copyRowAs<uint64_t>(src, dst, n, srcStride, dstStride);
    default:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + i * dstStride * static_cast<int64_t>(size),
                    src + i * srcStride * static_cast<int64_t>(size), size);
      }
  }
}

template <typename T>
void gatherRowAs(const std::byte* src, std::byte* dst, const int64_t* offsets, int64_t n) {
  const T* x = reinterpret_cast<const T*>(src);
  T* y = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = x[offsets[i]];
}

// dst[i] = src[offsets[i]] for n elements of `size` bytes.
void gatherRow(const std::byte* src, std::byte* dst, const int64_t* offsets, int64_t n,
               size_t size) {
  switch (size) {
    case 1:
      return gatherRowAs<uint8_t>(src, dst, offsets, n);
    case 2:
      return gatherRowAs<uint16_t>(src, dst, offsets, n);
    case 4:
      return gatherRowAs<uint32_t>(src, dst, offsets, n);
    case 8:
      return gatherRowAs<uint64_t>(src, dst, offsets, n);
    default:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + i * static_cast<int64_t>(size),
                    src + offsets[i] * static_cast<int64_t>(size), size);
      }
  }
}

}  // namespace

CopyBox simplifyBox(CopyBox box) {
  CopyBox merged = box;
  merged.dims.clear();
  merged.src.clear();
  merged.dst.clear();
  for (size_t a = 0; a < box.dims.size(); ++a) {
    const int64_t dim = box.dims[a];
    if (dim == 0) {
      merged.dims = {0};
      merged.src = {1};
      merged.dst = {1};
      return merged;
    }
    if (dim == 1) continue;  // moves nothing along it
    // The previous axis continues into this one when one step along it is `dim` steps along
    // this one, in both source and destination.
    if (!merged.dims.empty() && merged.src.back() == box.src[a] * dim &&
        merged.dst.back() == box.dst[a] * dim) {
      merged.dims.back() *= dim;
      merged.src.back() = box.src[a];
      merged.dst.back() = box.dst[a];
      continue;
    }
    merged.dims.push_back(dim);
    merged.src.push_back(box.src[a]);
    merged.dst.push_back(box.dst[a]);
  }
  if (merged.dims.empty()) {  // a single element
    merged.dims = {1};
    merged.src = {1};
    merged.dst = {1};
  }
  return merged;
}

BoxCopier::BoxCopier(std::vector<CopyBox> boxes, size_t elementSize, int64_t chunkBytes)
    : elementSize_(elementSize) {
  const int64_t size = static_cast<int64_t>(elementSize);
  firstUnit_.push_back(0);
  int64_t totalBytes = 0;
  for (CopyBox& raw : boxes) {
    CopyBox box = simplifyBox(std::move(raw));
    if (box.dims[0] == 0) continue;  // empty
    Plan plan;
    const size_t rank = box.dims.size();
    plan.inner = box.dims[rank - 1];
    for (size_t a = 0; a + 1 < rank; ++a) plan.rows *= box.dims[a];
    const int64_t rowBytes = plan.inner * size;
    if (rowBytes > kUnitBytes) {
      plan.colsPerUnit = std::max<int64_t>(1, kUnitBytes / size);
      plan.colBlocks = (plan.inner + plan.colsPerUnit - 1) / plan.colsPerUnit;
      plan.units = plan.rows * plan.colBlocks;
    } else {
      plan.colsPerUnit = plan.inner;
      plan.rowsPerUnit = std::max<int64_t>(1, kUnitBytes / std::max<int64_t>(rowBytes, 1));
      plan.units = (plan.rows + plan.rowsPerUnit - 1) / plan.rowsPerUnit;
    }
    totalBytes += plan.rows * rowBytes;
    firstUnit_.push_back(firstUnit_.back() + plan.units);
    boxes_.push_back(std::move(box));
    plans_.push_back(plan);
  }
  const int64_t units = firstUnit_.back();
  unitBytes_ = units > 0 ? totalBytes / units : 0;
  grain_ = grainFor(unitBytes_, chunkBytes);
}

void BoxCopier::runUnits(const CopyBox& box, const Plan& plan, const std::byte* src, std::byte* dst,
                         int64_t begin, int64_t end) const {
  const size_t rank = box.dims.size();
  const int64_t size = static_cast<int64_t>(elementSize_);
  const int64_t innerSrc = box.src[rank - 1], innerDst = box.dst[rank - 1];
  // Source and destination element offsets of the first element of row `row`, and its
  // coordinates along the outer axes.
  std::vector<int64_t> index(rank - 1, 0);
  auto rowStart = [&](int64_t row, int64_t& s, int64_t& d) {
    s = box.srcOffset;
    d = box.dstOffset;
    for (size_t a = rank - 1; a-- > 0;) {
      index[a] = row % box.dims[a];
      row /= box.dims[a];
      s += index[a] * box.src[a];
      d += index[a] * box.dst[a];
    }
  };
  int64_t s = 0, d = 0;
  if (plan.colBlocks > 1) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t row = unit / plan.colBlocks;
      const int64_t c0 = unit % plan.colBlocks * plan.colsPerUnit;
      const int64_t c1 = std::min(plan.inner, c0 + plan.colsPerUnit);
      rowStart(row, s, d);
      copyRow(src + (s + c0 * innerSrc) * size, dst + (d + c0 * innerDst) * size, c1 - c0, innerSrc,
              innerDst, elementSize_);
    }
    return;
  }
  const int64_t r0 = begin * plan.rowsPerUnit;
  const int64_t r1 = std::min(plan.rows, end * plan.rowsPerUnit);
  rowStart(r0, s, d);
  for (int64_t row = r0; row < r1; ++row) {
    copyRow(src + s * size, dst + d * size, plan.inner, innerSrc, innerDst, elementSize_);
    for (size_t a = rank - 1; a-- > 0;) {
      s += box.src[a];
      d += box.dst[a];
      if (++index[a] < box.dims[a]) break;
      s -= box.src[a] * box.dims[a];
      d -= box.dst[a] * box.dims[a];
      index[a] = 0;
    }
  }
}

void BoxCopier::run(const ExecutionContext& context,
                    const std::vector<std::optional<BufferRef>>& inputs,
                    const std::vector<std::optional<BufferRef>>& outputs) const {
  const int64_t total = firstUnit_.back();
  if (total == 0) return;
  context.pool().parallelFor(total, grain_, [&](int64_t begin, int64_t end) {
    size_t b = static_cast<size_t>(std::upper_bound(firstUnit_.begin(), firstUnit_.end(), begin) -
                                   firstUnit_.begin() - 1);
    while (begin < end) {
      const int64_t boxEnd = std::min(end, firstUnit_[b + 1]);
      const CopyBox& box = boxes_[b];
      runUnits(box, plans_[b], context.address(*inputs[box.input]),
               context.address(*outputs[box.output]), begin - firstUnit_[b],
               boxEnd - firstUnit_[b]);
      begin = boxEnd;
      ++b;
    }
  });
}

AxisGather::AxisGather(std::vector<std::vector<int64_t>> offsets, size_t elementSize,
                       int64_t chunkBytes)
    : offsets_(std::move(offsets)), elementSize_(elementSize), chunkBytes_(chunkBytes) {
  KILN_CHECK(!offsets_.empty());
  rows_ = 1;
  for (size_t a = 0; a + 1 < offsets_.size(); ++a) {
    rows_ *= static_cast<int64_t>(offsets_[a].size());
  }
  const std::vector<int64_t>& inner = offsets_.back();
  inner_ = static_cast<int64_t>(inner.size());
  contiguousInner_ = true;
  for (size_t i = 1; i < inner.size(); ++i) {
    if (inner[i] != inner[0] + static_cast<int64_t>(i)) contiguousInner_ = false;
  }
}

void AxisGather::run(const std::byte* src, std::byte* dst, ThreadPool& pool) const {
  if (rows_ == 0 || inner_ == 0) return;
  const size_t rank = offsets_.size();
  const int64_t size = static_cast<int64_t>(elementSize_);
  const int64_t rowBytes = inner_ * size;
  const std::vector<int64_t>& inner = offsets_.back();
  pool.parallelFor(rows_, grainFor(rowBytes, chunkBytes_), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(rank - 1, 0);
    int64_t base = 0;
    int64_t row = begin;
    for (size_t a = rank - 1; a-- > 0;) {
      const int64_t extent = static_cast<int64_t>(offsets_[a].size());
      index[a] = row % extent;
      row /= extent;
      base += offsets_[a][static_cast<size_t>(index[a])];
    }
    for (int64_t r = begin; r < end; ++r) {
      std::byte* out = dst + r * rowBytes;
      if (contiguousInner_) {
        std::memcpy(out, src + (base + inner[0]) * size, static_cast<size_t>(rowBytes));
      } else {
        gatherRow(src + base * size, out, inner.data(), inner_, elementSize_);
      }
      for (size_t a = rank - 1; a-- > 0;) {
        const std::vector<int64_t>& table = offsets_[a];
        base -= table[static_cast<size_t>(index[a])];
        if (++index[a] < static_cast<int64_t>(table.size())) {
          base += table[static_cast<size_t>(index[a])];
          break;
        }
        index[a] = 0;
        base += table[0];
      }
    }
  });
}

namespace {

// --- Box-copy ops ------------------------------------------------------------------------------

class BoxCopyStep : public Step {
 public:
  explicit BoxCopyStep(BoxCopier copier) : copier_(std::move(copier)) {}

  void setChunkBytes(int64_t chunkBytes) { copier_.setChunkBytes(chunkBytes); }

  Status run(const ExecutionContext& context) const override {
    copier_.run(context, inputs, outputs);
    return Status::ok();
  }

 private:
  BoxCopier copier_;
};

size_t elementSizeOf(const ir::Value* value) { return ir::dtypeSize(value->dtype); }

// The whole of input 0 into output 0.
std::unique_ptr<Step> makeCopy(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const int64_t count = x->shape.elementCount();
  if (count != node.outputs[0]->shape.elementCount()) return nullptr;
  CopyBox box{.dims = {count}, .src = {1}, .dst = {1}};
  return std::make_unique<BoxCopyStep>(BoxCopier({box}, elementSizeOf(x)));
}

// Dropout at inference keeps every element: a copy, unless the mask is asked for or training
// mode may be on.
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

Result<int64_t> axisOf(const ir::Node& node, int64_t rank, int64_t defaultAxis = 0) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, node.getInt("axis", defaultAxis));
  return ir::normalizeAxis(axis, rank);
}

std::unique_ptr<Step> makeConcat(const ir::Node& node) {
  const ir::Value* y = node.outputs[0];
  auto axis = axisOf(node, static_cast<int64_t>(y->shape.rank()));
  if (!axis.isOk()) return nullptr;
  const size_t a = static_cast<size_t>(*axis);
  const std::vector<int64_t> outStrides = y->shape.strides();
  std::vector<CopyBox> boxes;
  int64_t offset = 0;
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    const ir::Value* x = node.inputs[k];
    if (!x || x->dtype != y->dtype || x->shape.rank() != y->shape.rank()) return nullptr;
    boxes.push_back({.input = static_cast<int>(k),
                     .dims = x->shape.dims(),
                     .src = x->shape.strides(),
                     .dst = outStrides,
                     .dstOffset = offset * outStrides[a]});
    offset += x->shape[a];
  }
  if (offset != y->shape[a]) return nullptr;
  return std::make_unique<BoxCopyStep>(BoxCopier(std::move(boxes), elementSizeOf(y)));
}

std::unique_ptr<Step> makeSplit(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  auto axis = axisOf(node, static_cast<int64_t>(x->shape.rank()));
  if (!axis.isOk()) return nullptr;
  const size_t a = static_cast<size_t>(*axis);
  const std::vector<int64_t> inStrides = x->shape.strides();
  std::vector<CopyBox> boxes;
  int64_t offset = 0;
  for (size_t k = 0; k < node.outputs.size(); ++k) {
    const ir::Value* y = node.outputs[k];
    if (!y || y->dtype != x->dtype || y->shape.rank() != x->shape.rank()) return nullptr;
    boxes.push_back({.output = static_cast<int>(k),
                     .dims = y->shape.dims(),
                     .src = inStrides,
                     .dst = y->shape.strides(),
                     .srcOffset = offset * inStrides[a]});
    offset += y->shape[a];
  }
  if (offset != x->shape[a]) return nullptr;
  return std::make_unique<BoxCopyStep>(BoxCopier(std::move(boxes), elementSizeOf(x)));
}

using backends::constantInts;

std::unique_ptr<Step> makeSlice(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  std::vector<int64_t> starts, axes, steps;
  if (node.opsetVersion < 10) {
    auto s = node.getInts("starts");
    auto a = node.getInts("axes", {});
    if (!s.isOk() || !a.isOk()) return nullptr;
    starts = *s;
    axes = *a;
  } else {
    auto s = constantInts(node, 1);
    if (!s) return nullptr;
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
  // Per axis: the first element read and the step, clamped as ONNX says (the output's shape,
  // from inference, already holds each axis's length).
  std::vector<int64_t> first(static_cast<size_t>(rank), 0), step(static_cast<size_t>(rank), 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    auto axis = ir::normalizeAxis(axes[i], rank);
    if (!axis.isOk() || steps[i] == 0) return nullptr;
    const size_t a = static_cast<size_t>(*axis);
    const int64_t dim = x->shape[a];
    int64_t start = starts[i];
    if (start < 0) start += dim;
    step[a] = steps[i];
    first[a] = dim == 0       ? 0
               : steps[i] > 0 ? std::clamp<int64_t>(start, 0, dim)
                              : std::clamp<int64_t>(start, 0, dim - 1);
  }
  const std::vector<int64_t> inStrides = x->shape.strides();
  CopyBox box{.dims = y->shape.dims(), .src = inStrides, .dst = y->shape.strides()};
  for (size_t a = 0; a < static_cast<size_t>(rank); ++a) {
    box.src[a] = inStrides[a] * step[a];
    box.srcOffset += first[a] * inStrides[a];
  }
  return std::make_unique<BoxCopyStep>(BoxCopier({box}, elementSizeOf(x)));
}

// Input strides seen from the output's axes under numpy broadcasting: 0 where the input has
// extent 1 or lacks the axis.
std::vector<int64_t> broadcastStrides(const ir::Shape& input, const ir::Shape& output) {
  std::vector<int64_t> strides(output.rank(), 0);
  const std::vector<int64_t> own = input.strides();
  const size_t lead = output.rank() - input.rank();
  for (size_t i = 0; i < input.rank(); ++i) strides[lead + i] = input[i] == 1 ? 0 : own[i];
  return strides;
}

std::unique_ptr<Step> makeExpand(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (x->shape.rank() > y->shape.rank()) return nullptr;
  CopyBox box{.dims = y->shape.dims(),
              .src = broadcastStrides(x->shape, y->shape),
              .dst = y->shape.strides()};
  return std::make_unique<BoxCopyStep>(BoxCopier({box}, elementSizeOf(x)));
}

// Tile reads output axis a of extent repeat*dim as [repeat, dim] with source strides [0, stride].
std::unique_ptr<Step> makeTile(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const size_t rank = x->shape.rank();
  if (y->shape.rank() != rank) return nullptr;
  const std::vector<int64_t> inStrides = x->shape.strides();
  const std::vector<int64_t> outStrides = y->shape.strides();
  CopyBox box;
  for (size_t a = 0; a < rank; ++a) {
    const int64_t dim = x->shape[a];
    if (dim == 0) {
      if (y->shape[a] != 0) return nullptr;
      box.dims = {0};
      box.src = box.dst = {1};
      break;
    }
    if (y->shape[a] % dim != 0) return nullptr;
    box.dims.insert(box.dims.end(), {y->shape[a] / dim, dim});
    box.src.insert(box.src.end(), {0, inStrides[a]});
    box.dst.insert(box.dst.end(), {dim * outStrides[a], outStrides[a]});
  }
  return std::make_unique<BoxCopyStep>(BoxCopier({box}, elementSizeOf(x)));
}

// --- Pad ---------------------------------------------------------------------------------------

// Constant mode: the output is filled with the value, then the kept part of the data is copied
// in as one box. The other modes map every output coordinate back into the data, per axis.
class PadStep : public Step {
 public:
  PadStep(std::vector<std::byte> fill, BoxCopier interior)
      : fill_(std::move(fill)), interior_(std::move(interior)) {
    fillIsZero_ =
        std::all_of(fill_.begin(), fill_.end(), [](std::byte b) { return b == std::byte{0}; });
  }
  explicit PadStep(AxisGather gather) : gather_(std::move(gather)), mapped_(true) {}

  Status run(const ExecutionContext& context) const override {
    if (mapped_) {
      gather_.run(context.address(*inputs[0]), context.address(*outputs[0]), context.pool());
      return Status::ok();
    }
    std::byte* y = context.address(*outputs[0]);
    const int64_t size = static_cast<int64_t>(fill_.size());
    context.pool().parallelFor(
        outputs[0]->shape.elementCount(), grainFor(size), [&](int64_t begin, int64_t end) {
          if (fillIsZero_) {
            std::memset(y + begin * size, 0, static_cast<size_t>((end - begin) * size));
          } else {
            copyRow(fill_.data(), y + begin * size, end - begin, 0, 1, fill_.size());
          }
        });
    interior_.run(context, inputs, outputs);
    return Status::ok();
  }

 private:
  std::vector<std::byte> fill_;
  bool fillIsZero_ = false;
  BoxCopier interior_;
  AxisGather gather_;
  bool mapped_ = false;
};

int64_t floorMod(int64_t value, int64_t modulus) {
  const int64_t r = value % modulus;
  return r < 0 ? r + modulus : r;
}

std::unique_ptr<Step> makePad(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const size_t rank = x->shape.rank();
  if (rank == 0) return nullptr;
  auto mode = node.getString("mode", "constant");
  if (!mode.isOk()) return nullptr;
  // [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}] over every axis.
  auto amounts = backends::padAmounts(node, rank);
  if (!amounts) return nullptr;
  const std::vector<int64_t>& pads = *amounts;
  ir::Tensor fillValue(x->dtype, ir::Shape{});  // zero
  if (node.opsetVersion < 11) {
    auto value = node.getFloat("value", 0.0f);
    if (!value.isOk()) return nullptr;
    fillValue = ir::Tensor::scalar<float>(*value).castTo(x->dtype);
  } else {
    if (const ir::Value* value = node.input(2)) {
      if (!value->constant || value->dtype != x->dtype) return nullptr;
      if (value->constant->elementCount() == 1) fillValue = *value->constant;
    }
  }
  // Negative pads crop first; the mode then pads what is left.
  std::vector<int64_t> padBefore(rank), cropBefore(rank), kept(rank);
  for (size_t a = 0; a < rank; ++a) {
    padBefore[a] = std::max<int64_t>(0, pads[a]);
    cropBefore[a] = std::max<int64_t>(0, -pads[a]);
    kept[a] = x->shape[a] - cropBefore[a] - std::max<int64_t>(0, -pads[a + rank]);
  }
  const std::vector<int64_t> inStrides = x->shape.strides();
  const size_t size = elementSizeOf(x);
  if (*mode == "constant") {
    CopyBox box{.dims = kept, .src = inStrides, .dst = y->shape.strides()};
    for (size_t a = 0; a < rank; ++a) {
      if (kept[a] <= 0) box.dims[a] = 0;  // nothing of the data survives: all fill
      box.srcOffset += cropBefore[a] * inStrides[a];
      box.dstOffset += padBefore[a] * box.dst[a];
    }
    std::vector<std::byte> fill(size);
    std::memcpy(fill.data(), fillValue.rawData(), size);
    return std::make_unique<PadStep>(std::move(fill), BoxCopier({box}, size));
  }
  if (*mode != "edge" && *mode != "reflect" && *mode != "wrap") return nullptr;
  std::vector<std::vector<int64_t>> offsets(rank);
  for (size_t a = 0; a < rank; ++a) {
    if (kept[a] <= 0) return nullptr;
    for (int64_t o = 0; o < y->shape[a]; ++o) {
      const int64_t p = o - padBefore[a];
      int64_t source = p;
      if (p < 0 || p >= kept[a]) {
        if (*mode == "edge") {
          source = std::clamp<int64_t>(p, 0, kept[a] - 1);
        } else if (*mode == "wrap") {
          source = floorMod(p, kept[a]);
        } else if (kept[a] == 1) {
          source = 0;
        } else {  // reflect without repeating the edge: period 2 * (kept - 1)
          const int64_t period = 2 * (kept[a] - 1);
          const int64_t m = floorMod(p, period);
          source = m < kept[a] ? m : period - m;
        }
      }
      offsets[a].push_back((cropBefore[a] + source) * inStrides[a]);
    }
  }
  return std::make_unique<PadStep>(AxisGather(std::move(offsets), size));
}

// --- Where -------------------------------------------------------------------------------------

// One row of Where: each operand advances by 0 (broadcast) or 1 element per output element.
// Every stride pattern is its own instantiation, and the body is a select of two unconditional
// loads over fixed blocks of 16, which the compiler vectorises at -O2 (an unknown trip count or
// a load under the condition keeps it scalar). The output never overlaps an operand: distinct
// values get distinct buffers.
template <typename T, int kC, int kX, int kY>
void whereRow(const uint8_t* __restrict c, const T* __restrict x, const T* __restrict y,
              T* __restrict out, int64_t n) {
  constexpr int64_t kBlock = 16;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const uint8_t* cb = c + i * kC;
    const T* xb = x + i * kX;
    const T* yb = y + i * kY;
    T* ob = out + i;
    for (int64_t j = 0; j < kBlock; ++j) {
      const T a = xb[j * kX], b = yb[j * kY];
      ob[j] = cb[j * kC] ? a : b;
    }
  }
  for (; i < n; ++i) out[i] = c[i * kC] ? x[i * kX] : y[i * kY];
}

template <typename T>
using WhereRowFn = void (*)(const uint8_t*, const T*, const T*, T*, int64_t);

template <typename T>
WhereRowFn<T> whereRowFor(int64_t c, int64_t x, int64_t y) {
  const int pattern = (c ? 4 : 0) | (x ? 2 : 0) | (y ? 1 : 0);
  switch (pattern) {
    case 0:
      return whereRow<T, 0, 0, 0>;
    case 1:
      return whereRow<T, 0, 0, 1>;
    case 2:
      return whereRow<T, 0, 1, 0>;
    case 3:
      return whereRow<T, 0, 1, 1>;
    case 4:
      return whereRow<T, 1, 0, 0>;
    case 5:
      return whereRow<T, 1, 0, 1>;
    case 6:
      return whereRow<T, 1, 1, 0>;
    default:
      return whereRow<T, 1, 1, 1>;
  }
}

// Where's three operands broadcast to the output as merged axes with per-operand element
// strides (0 along broadcast axes; after merging, the last axis's strides are 0 or 1); rows of
// the last axis are spread over the pool.
class WhereStep : public Step {
 public:
  WhereStep(std::vector<int64_t> dims, std::array<std::vector<int64_t>, 3> strides, size_t size)
      : dims_(std::move(dims)), strides_(std::move(strides)), size_(size) {}

  Status run(const ExecutionContext& context) const override {
    switch (size_) {
      case 1:
        return runAs<uint8_t>(context);
      case 2:
        return runAs<uint16_t>(context);
      case 4:
        return runAs<uint32_t>(context);
      default:
        return runAs<uint64_t>(context);
    }
  }

 private:
  template <typename T>
  Status runAs(const ExecutionContext& context) const {
    const uint8_t* c = context.data<uint8_t>(*inputs[0]);
    const T* x = context.data<T>(*inputs[1]);
    const T* y = context.data<T>(*inputs[2]);
    T* out = context.data<T>(*outputs[0]);
    const size_t rank = dims_.size();
    const int64_t width = dims_[rank - 1];
    const int64_t rows = outputs[0]->shape.elementCount() / width;
    const WhereRowFn<T> row =
        whereRowFor<T>(strides_[0][rank - 1], strides_[1][rank - 1], strides_[2][rank - 1]);
    context.pool().parallelFor(
        rows, grainFor(width * static_cast<int64_t>(sizeof(T)), kComputeChunkBytes),
        [&](int64_t begin, int64_t end) {
          std::vector<int64_t> index(rank - 1, 0);
          std::array<int64_t, 3> offset{};
          int64_t rest = begin;
          for (size_t a = rank - 1; a-- > 0;) {
            index[a] = rest % dims_[a];
            rest /= dims_[a];
            for (size_t k = 0; k < 3; ++k) offset[k] += index[a] * strides_[k][a];
          }
          for (int64_t r = begin; r < end; ++r) {
            row(c + offset[0], x + offset[1], y + offset[2], out + r * width, width);
            for (size_t a = rank - 1; a-- > 0;) {
              for (size_t k = 0; k < 3; ++k) offset[k] += strides_[k][a];
              if (++index[a] < dims_[a]) break;
              for (size_t k = 0; k < 3; ++k) offset[k] -= strides_[k][a] * dims_[a];
              index[a] = 0;
            }
          }
        });
    return Status::ok();
  }

  std::vector<int64_t> dims_;
  std::array<std::vector<int64_t>, 3> strides_;
  size_t size_;
};

std::unique_ptr<Step> makeWhere(const ir::Node& node) {
  if (node.inputs.size() != 3 || !node.inputs[1] || !node.inputs[2]) return nullptr;
  if (node.inputs[0]->dtype != ir::DType::kBool) return nullptr;
  const ir::Shape& out = node.outputs[0]->shape;
  std::array<std::vector<int64_t>, 3> operandStrides;
  for (size_t k = 0; k < 3; ++k) {
    if (node.inputs[k]->shape.rank() > out.rank()) return nullptr;
    operandStrides[k] = broadcastStrides(node.inputs[k]->shape, out);
  }
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, 3> strides;
  for (size_t a = 0; a < out.rank(); ++a) {
    if (out[a] == 0) return nullptr;  // nothing to do; the reference handles it
    if (out[a] == 1) continue;
    bool continues = !dims.empty();
    for (size_t k = 0; k < 3 && continues; ++k) {
      continues = strides[k].back() == operandStrides[k][a] * out[a];
    }
    if (continues) {
      dims.back() *= out[a];
      for (size_t k = 0; k < 3; ++k) strides[k].back() = operandStrides[k][a];
      continue;
    }
    dims.push_back(out[a]);
    for (size_t k = 0; k < 3; ++k) strides[k].push_back(operandStrides[k][a]);
  }
  if (dims.empty()) {
    dims = {1};
    for (auto& s : strides) s = {0};
  }
  return std::make_unique<WhereStep>(std::move(dims), std::move(strides),
                                     elementSizeOf(node.outputs[0]));
}

// --- Cast --------------------------------------------------------------------------------------

// numpy's astype, as the reference kernel gives it: floating to integer truncates, saturating
// out-of-range values and mapping NaN to 0; anything nonzero (NaN too) is true.
template <typename From, typename To>
To convertElement(From value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != From{0};
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    const double v = value;
    if (std::isnan(v)) return To{0};
    if (v <= static_cast<double>(std::numeric_limits<To>::lowest())) {
      return std::numeric_limits<To>::lowest();
    }
    if (v >= static_cast<double>(std::numeric_limits<To>::max())) {
      return std::numeric_limits<To>::max();
    }
    return static_cast<To>(v);
  } else {
    return static_cast<To>(value);
  }
}

using ConvertFn = void (*)(const std::byte*, std::byte*, int64_t, int64_t);

template <typename From, typename To>
void convertRange(const std::byte* src, std::byte* dst, int64_t begin, int64_t end) {
  const From* x = reinterpret_cast<const From*>(src);
  To* y = reinterpret_cast<To*>(dst);
  for (int64_t i = begin; i < end; ++i) y[i] = convertElement<From, To>(x[i]);
}

template <typename From>
ConvertFn converterTo(ir::DType to) {
  switch (to) {
    case ir::DType::kFloat32:
      return convertRange<From, float>;
    case ir::DType::kInt64:
      return convertRange<From, int64_t>;
    case ir::DType::kInt32:
      return convertRange<From, int32_t>;
    case ir::DType::kBool:
      return convertRange<From, bool>;
    default:
      return nullptr;
  }
}

ConvertFn converter(ir::DType from, ir::DType to) {
  switch (from) {
    case ir::DType::kFloat32:
      return converterTo<float>(to);
    case ir::DType::kInt64:
      return converterTo<int64_t>(to);
    case ir::DType::kInt32:
      return converterTo<int32_t>(to);
    case ir::DType::kBool:
      return converterTo<bool>(to);
    default:
      return nullptr;
  }
}

class CastStep : public Step {
 public:
  CastStep(ConvertFn convert, int64_t bytesPerElement)
      : convert_(convert), bytesPerElement_(bytesPerElement) {}

  Status run(const ExecutionContext& context) const override {
    const std::byte* x = context.address(*inputs[0]);
    std::byte* y = context.address(*outputs[0]);
    context.pool().parallelFor(outputs[0]->shape.elementCount(),
                               grainFor(bytesPerElement_, kComputeChunkBytes),
                               [&](int64_t begin, int64_t end) { convert_(x, y, begin, end); });
    return Status::ok();
  }

 private:
  ConvertFn convert_;
  int64_t bytesPerElement_;  // read and written
};

std::unique_ptr<Step> makeCast(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (x->shape.elementCount() != y->shape.elementCount()) return nullptr;
  if (x->dtype == y->dtype) return makeCopy(node);
  ConvertFn convert = converter(x->dtype, y->dtype);
  if (!convert) return nullptr;
  return std::make_unique<CastStep>(
      convert, static_cast<int64_t>(ir::dtypeSize(x->dtype) + ir::dtypeSize(y->dtype)));
}

// One run of a channel shuffle: `count` consecutive channels of one input, from channel `src`,
// written to one output every `groups`-th channel from channel `dst` (all per outer index).
struct ShuffleRun {
  int input = 0, output = 0;
  int64_t count = 0, src = 0, dst = 0;
};

// Output channels j = q * groups + r of one residue r read the consecutive source channels
// r * (C / groups) + q; the runs cut that where an input or an output ends.
std::vector<ShuffleRun> shuffleRuns(const std::vector<std::pair<int, int64_t>>& source,
                                    int64_t groups, int64_t part) {
  const auto channels = static_cast<int64_t>(source.size());
  const int64_t perGroup = channels / groups;
  std::vector<ShuffleRun> runs;
  for (int64_t r = 0; r < groups; ++r) {
    for (int64_t q = 0; q < perGroup;) {
      const auto [input, c0] = source[static_cast<size_t>(r * perGroup + q)];
      const int64_t j0 = q * groups + r;
      int64_t count = 1;
      while (q + count < perGroup &&
             source[static_cast<size_t>(r * perGroup + q + count)].first == input &&
             ((q + count) * groups + r) / part == j0 / part) {
        ++count;
      }
      runs.push_back({input, static_cast<int>(j0 / part), count, c0, j0 % part});
      q += count;
    }
  }
  return runs;
}

// A float32 channel shuffle of contiguous channels (nothing after the axis: NHWC's): per outer
// index, each output row is written from its runs; with two groups, the two runs that fill one
// output's even and odd channels are interleaved in one loop, which vectorises.
class ChannelShuffleStep : public Step {
 public:
  ChannelShuffleStep(std::vector<ShuffleRun> runs, std::vector<int64_t> widths, int64_t outer,
                     int64_t part, int64_t groups)
      : runs_(std::move(runs)),
        widths_(std::move(widths)),
        outer_(outer),
        part_(part),
        groups_(groups) {
    // Pairs (r = 0, r = 1) of equal runs that fill the same output's channels dst, dst + 1, ...
    for (size_t i = 0; groups_ == 2 && i < runs_.size(); ++i) {
      for (size_t k = 0; k < runs_.size(); ++k) {
        const ShuffleRun &even = runs_[i], &odd = runs_[k];
        if (even.dst % 2 == 0 && odd.output == even.output && odd.dst == even.dst + 1 &&
            odd.count == even.count) {
          pairs_.emplace_back(i, k);
        }
      }
    }
    std::vector<bool> paired(runs_.size(), false);
    for (const auto& [even, odd] : pairs_) paired[even] = paired[odd] = true;
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (!paired[i]) single_.push_back(i);
    }
  }

  Status run(const ExecutionContext& context) const override {
    std::vector<const float*> in;
    for (const auto& ref : inputs) in.push_back(context.data<float>(*ref));
    std::vector<float*> out;
    for (const auto& ref : outputs) out.push_back(context.data<float>(*ref));
    const int64_t rowWork = std::max<int64_t>(1, part_ * static_cast<int64_t>(outputs.size()));
    context.pool().parallelFor(
        outer_, std::max<int64_t>(1, kCopyChunkBytes / 4 / rowWork), [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) {
            for (const auto& [i, k] : pairs_) {
              const ShuffleRun &even = runs_[i], &odd = runs_[k];
              interleave(in[static_cast<size_t>(even.input)] +
                             o * widths_[static_cast<size_t>(even.input)] + even.src,
                         in[static_cast<size_t>(odd.input)] +
                             o * widths_[static_cast<size_t>(odd.input)] + odd.src,
                         out[static_cast<size_t>(even.output)] + o * part_ + even.dst, even.count);
            }
            for (size_t i : single_) {
              const ShuffleRun& r = runs_[i];
              const float* __restrict src = in[static_cast<size_t>(r.input)] +
                                            o * widths_[static_cast<size_t>(r.input)] + r.src;
              float* __restrict dst = out[static_cast<size_t>(r.output)] + o * part_ + r.dst;
              for (int64_t q = 0; q < r.count; ++q) dst[q * groups_] = src[q];
            }
          }
        });
    return Status::ok();
  }

 private:
  static void interleave(const float* __restrict even, const float* __restrict odd,
                         float* __restrict dst, int64_t count) {
    for (int64_t q = 0; q < count; ++q) {
      dst[2 * q] = even[q];
      dst[2 * q + 1] = odd[q];
    }
  }

  std::vector<ShuffleRun> runs_;
  std::vector<int64_t> widths_;  // channels of each input
  int64_t outer_, part_, groups_;
  std::vector<std::pair<size_t, size_t>> pairs_;
  std::vector<size_t> single_;
};

// kiln.ChannelShuffle (src/kiln/ir/ops/layout.h): one step, one pass over the data, instead of
// the Concat, Transpose and Split copies it replaces. Contiguous float32 channels take
// ChannelShuffleStep; otherwise each run is a box [outer, run, inner] read densely and written
// every groups-th channel.
std::unique_ptr<Step> makeChannelShuffle(const ir::Node& node) {
  const ir::Value* first = node.inputs[0];
  const int64_t rank = static_cast<int64_t>(first->shape.rank());
  auto axis = axisOf(node, rank, 1);
  auto groups = node.getInt("groups", 0);
  if (!axis.isOk() || !groups.isOk() || *groups < 1) return nullptr;
  const size_t a = static_cast<size_t>(*axis);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= first->shape[d];
  for (size_t d = a + 1; d < first->shape.rank(); ++d) inner *= first->shape[d];
  // Each channel of the inputs' concatenation: its input, and its channel there.
  std::vector<std::pair<int, int64_t>> source;
  std::vector<int64_t> widths;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.inputs[i] || node.inputs[i]->dtype != first->dtype) return nullptr;
    widths.push_back(node.inputs[i]->shape[a]);
    for (int64_t c = 0; c < widths.back(); ++c) source.emplace_back(static_cast<int>(i), c);
  }
  const auto channels = static_cast<int64_t>(source.size());
  const auto outputs = static_cast<int64_t>(node.outputs.size());
  if (channels % *groups != 0 || channels % outputs != 0) return nullptr;
  for (const ir::Value* y : node.outputs) {
    if (!y) return nullptr;
  }
  const int64_t part = channels / outputs, g = *groups;
  std::vector<ShuffleRun> runs = shuffleRuns(source, g, part);
  if (inner == 1 && first->dtype == ir::DType::kFloat32) {
    return std::make_unique<ChannelShuffleStep>(std::move(runs), std::move(widths), outer, part, g);
  }
  std::vector<CopyBox> boxes;
  for (const ShuffleRun& r : runs) {
    boxes.push_back({.input = r.input,
                     .output = r.output,
                     .dims = {outer, r.count, inner},
                     .src = {widths[static_cast<size_t>(r.input)] * inner, inner, 1},
                     .dst = {part * inner, g * inner, 1},
                     .srcOffset = r.src * inner,
                     .dstOffset = r.dst * inner});
  }
  return std::make_unique<BoxCopyStep>(BoxCopier(std::move(boxes), elementSizeOf(first)));
}

}  // namespace
}  // namespace datamove

std::unique_ptr<Step> makeDataMoveStep(const ir::Node& node, const knobs::Route& route) {
  using namespace datamove;
  if (node.domain == ir::kKilnDomain && node.opType == "ChannelShuffle" && !node.inputs.empty() &&
      node.inputs[0] && route.value(kDataMoveImpl, &node) == "fast") {
    std::unique_ptr<Step> step = makeChannelShuffle(node);
    if (step) step->tactic = "fast.channel_shuffle";
    return step;
  }
  if (!node.domain.empty() || node.inputs.empty() || !node.inputs[0]) return nullptr;
  if (node.outputs.empty() || !node.outputs[0]) return nullptr;
  if (route.value(kDataMoveImpl, &node) != "fast") return nullptr;
  struct Entry {
    const char* op;
    std::unique_ptr<Step> (*make)(const ir::Node&);
    const char* tactic;
  };
  static const Entry kEntries[] = {
      {"Reshape", makeCopy, "fast.copy"},        {"Flatten", makeCopy, "fast.copy"},
      {"Squeeze", makeCopy, "fast.copy"},        {"Unsqueeze", makeCopy, "fast.copy"},
      {"Identity", makeCopy, "fast.copy"},       {"Dropout", makeDropout, "fast.copy"},
      {"Concat", makeConcat, "fast.concat"},     {"Split", makeSplit, "fast.split"},
      {"Slice", makeSlice, "fast.slice"},        {"Expand", makeExpand, "fast.expand"},
      {"Tile", makeTile, "fast.tile"},           {"Pad", makePad, "fast.pad"},
      {"Where", makeWhere, "fast.where"},        {"Cast", makeCast, "fast.cast"},
      {"CastLike", makeCast, "fast.cast"},       {"Gather", makeGatherStep, "fast.gather"},
      {"Resize", makeResizeStep, "fast.resize"},
  };
  for (const Entry& entry : kEntries) {
    if (node.opType != entry.op) continue;
    std::unique_ptr<Step> step = entry.make(node);
    if (step && step->tactic.empty()) step->tactic = entry.tactic;
    if (auto* copy = dynamic_cast<BoxCopyStep*>(step.get())) {
      const std::string& chunk = route.value(kCopyChunk, &node);
      copy->setChunkBytes(std::stoll(chunk) * 1024);
      if (chunk != "64") step->tactic += ".chunk" + chunk + "k";
    }
    return step;
  }
  return nullptr;
}

}  // namespace kiln::cpu
