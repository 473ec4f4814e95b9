// Gather on the CPU, for every data dtype and int32/int64 indices, constant or runtime, along
// any axis: the output is [outer, indices, inner], and each (outer, index) row is one memcpy of
// `inner` elements (one element when gathering along the last axis). Runtime indices are checked
// and normalised first, with the reference kernel's error for one out of range.
#include <cstring>

#include "kiln/backends/cpu/kernels/datamove.h"
#include "kiln/reference/kernels/indexing.h"

namespace kiln::cpu::datamove {

namespace {

class GatherStep : public Step {
 public:
  GatherStep(int64_t outer, int64_t axisSize, int64_t inner, int64_t axis, size_t elementSize,
             std::vector<int64_t> constantPositions)
      : outer_(outer),
        axisSize_(axisSize),
        inner_(inner),
        axis_(axis),
        elementSize_(elementSize),
        positions_(std::move(constantPositions)),
        constantIndices_(!positions_.empty()) {}

  Status run(const ExecutionContext& context) const override {
    const BufferRef& indices = *inputs[1];
    const int64_t count = indices.shape.elementCount();
    if (!constantIndices_) KILN_RETURN_IF_ERROR(readIndices(context, indices, count));
    const std::byte* data = context.address(*inputs[0]);
    std::byte* out = context.address(*outputs[0]);
    const int64_t size = static_cast<int64_t>(elementSize_);
    const int64_t rowBytes = inner_ * size;
    context.pool().parallelFor(outer_ * count, grainFor(rowBytes), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t o = row / count, j = row % count;
        const std::byte* from =
            data + (o * axisSize_ + positions_[static_cast<size_t>(j)]) * rowBytes;
        std::byte* to = out + row * rowBytes;
        switch (rowBytes) {  // single elements of the common sizes without a memcpy call
          case 4:
            std::memcpy(to, from, 4);
            break;
          case 8:
            std::memcpy(to, from, 8);
            break;
          default:
            std::memcpy(to, from, static_cast<size_t>(rowBytes));
        }
      }
    });
    return Status::ok();
  }

 private:
  // Reads, checks and normalises runtime indices into positions_, as the reference does: the
  // first index out of [-axisSize, axisSize) is an error naming where it sits.
  Status readIndices(const ExecutionContext& context, const BufferRef& indices,
                     int64_t count) const {
    positions_.resize(static_cast<size_t>(count));
    const bool wide = indices.dtype == ir::DType::kInt64;
    const int64_t* i64 = wide ? context.data<int64_t>(indices) : nullptr;
    const int32_t* i32 = wide ? nullptr : context.data<int32_t>(indices);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t index = wide ? i64[j] : i32[j];
      if (index < -axisSize_ || index >= axisSize_) {
        return invalidInput(
            "{}: index {} at indices{} is out of range [-{}, {}) for axis {} of data",
            node->describe(), index, reference::formatCoords(indices.shape, j), axisSize_,
            axisSize_, axis_);
      }
      positions_[static_cast<size_t>(j)] = index < 0 ? index + axisSize_ : index;
    }
    return Status::ok();
  }

  int64_t outer_, axisSize_, inner_, axis_;
  size_t elementSize_;
  mutable std::vector<int64_t> positions_;  // normalised indices (runtime ones: per run)
  bool constantIndices_;
};

}  // namespace

std::unique_ptr<Step> makeGatherStep(const ir::Node& node) {
  if (node.inputs.size() != 2 || !node.inputs[1]) return nullptr;
  const ir::Value* data = node.inputs[0];
  const ir::Value* indices = node.inputs[1];
  if (indices->dtype != ir::DType::kInt64 && indices->dtype != ir::DType::kInt32) return nullptr;
  const int64_t rank = static_cast<int64_t>(data->shape.rank());
  auto axisAttr = node.getInt("axis", 0);
  if (!axisAttr.isOk()) return nullptr;
  auto axis = ir::normalizeAxis(*axisAttr, rank);
  if (!axis.isOk()) return nullptr;
  const auto& dims = data->shape.dims();
  int64_t outer = 1, inner = 1;
  for (int64_t a = 0; a < rank; ++a) {
    if (a < *axis) outer *= dims[static_cast<size_t>(a)];
    if (a > *axis) inner *= dims[static_cast<size_t>(a)];
  }
  const int64_t axisSize = dims[static_cast<size_t>(*axis)];
  const int64_t count = indices->shape.elementCount();
  if (count == 0 || outer == 0 || inner == 0) return nullptr;  // nothing to move
  std::vector<int64_t> positions;
  if (indices->constant) {
    // Constant indices are checked once here; one out of range is left to the reference kernel,
    // which reports it when the plan runs.
    for (int64_t index : indices->constant->toInt64Vector()) {
      if (index < -axisSize || index >= axisSize) return nullptr;
      positions.push_back(index < 0 ? index + axisSize : index);
    }
  }
  return std::make_unique<GatherStep>(outer, axisSize, inner, *axis, ir::dtypeSize(data->dtype),
                                      std::move(positions));
}

}  // namespace kiln::cpu::datamove
