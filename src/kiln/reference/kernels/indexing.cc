// Reference kernels for the indexing ops: Gather, GatherElements, GatherND, Trilu, OneHot,
// DepthToSpace, SpaceToDepth, and the registration of the whole family (Scatter*, Pad and
// Resize live in indexing_*.cc).
#include "kiln/reference/kernels/indexing.h"

#include <cmath>

namespace kiln::reference {

std::string formatCoords(const Shape& shape, int64_t flat) {
  std::vector<int64_t> coords(shape.rank());
  for (size_t axis = shape.rank(); axis-- > 0;) {
    coords[axis] = shape[axis] == 0 ? 0 : flat % shape[axis];
    flat = shape[axis] == 0 ? 0 : flat / shape[axis];
  }
  return fmt::format("[{}]", fmt::join(coords, ","));
}

Result<int64_t> checkedIndex(const KernelContext& ctx, const Tensor& indices, int64_t position,
                             int64_t size, int64_t axis) {
  const int64_t index = indices.elementAsInt64(position);
  if (index < -size || index >= size) {
    return ctx.error("index {} at indices{} is out of range [-{}, {}) for axis {} of data", index,
                     formatCoords(indices.shape(), position), size, size, axis);
  }
  return index < 0 ? index + size : index;
}

namespace {

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t i = begin; i < end; ++i) result *= dims[i];
  return result;
}

Status runGather(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.node().getInt("axis", 0));
  const int64_t rank = static_cast<int64_t>(data.rank());
  const int64_t axis = axisAttr < 0 ? axisAttr + rank : axisAttr;
  const auto& dims = data.shape().dims();
  const int64_t outer = product(dims, 0, axis);
  const int64_t axisSize = dims[axis];
  const int64_t inner = product(dims, axis + 1, dims.size());
  const int64_t count = indices.elementCount();
  std::vector<int64_t> positions(count);
  for (int64_t j = 0; j < count; ++j) {
    KILN_ASSIGN_OR_RETURN(positions[j], checkedIndex(ctx, indices, j, axisSize, axis));
  }
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t t = 0; t < inner; ++t) {
        copyElement(data, (o * axisSize + positions[j]) * inner + t, out,
                    (o * count + j) * inner + t);
      }
    }
  }
  return Status::ok();
}

Status runGatherElements(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.node().getInt("axis", 0));
  const int64_t rank = static_cast<int64_t>(data.rank());
  const int64_t axis = axisAttr < 0 ? axisAttr + rank : axisAttr;
  return forEachAxisIndex(ctx, data, indices, axis, [&](int64_t flat, int64_t source) {
    copyElement(data, source, out, flat);
  });
}

Status runGatherND(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t batchDims, ctx.node().getInt("batch_dims", 0));
  const auto& dataDims = data.shape().dims();
  const auto& indexDims = indices.shape().dims();
  const int64_t k = indexDims.back();
  const std::vector<int64_t> strides = data.shape().strides();
  // Each row of `indices` (its last axis) picks one slice of `sliceSize` elements; rows are
  // grouped by batch, and each batch indexes its own block of data.
  const int64_t sliceSize = product(dataDims, batchDims + k, dataDims.size());
  const int64_t rows = product(indexDims, 0, indexDims.size() - 1);
  const int64_t rowsPerBatch = product(indexDims, batchDims, indexDims.size() - 1);
  const int64_t batchBlock = product(dataDims, batchDims, dataDims.size());
  for (int64_t row = 0; row < rows; ++row) {
    int64_t source = (row / rowsPerBatch) * batchBlock;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t axis = batchDims + j;
      KILN_ASSIGN_OR_RETURN(int64_t index,
                            checkedIndex(ctx, indices, row * k + j, dataDims[axis], axis));
      source += index * strides[axis];
    }
    for (int64_t t = 0; t < sliceSize; ++t) {
      copyElement(data, source + t, out, row * sliceSize + t);
    }
  }
  return Status::ok();
}

Status runTrilu(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t upper, ctx.node().getInt("upper", 1));
  const int64_t k = ctx.hasInput(1) ? ctx.input(1).elementAsInt64(0) : 0;
  const size_t rank = x.rank();
  const std::vector<std::byte> zero(ir::dtypeSize(x.dtype()), std::byte{0});
  forEachIndex(x.shape(), [&](int64_t flat, const std::vector<int64_t>& coords) {
    const int64_t diagonal = coords[rank - 1] - coords[rank - 2];
    const bool keep = upper != 0 ? diagonal >= k : diagonal <= k;
    if (keep) {
      copyElement(x, flat, out, flat);
    } else {
      // Zero is all-zero bits in every kiln dtype.
      std::memcpy(out.mutableRawData() + flat * zero.size(), zero.data(), zero.size());
    }
  });
  return Status::ok();
}

Status runOneHot(KernelContext& ctx) {
  const Tensor& indices = ctx.input(0);
  const Tensor& values = ctx.input(2);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.node().getInt("axis", -1));
  const auto& dims = out.shape().dims();
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t axis = axisAttr < 0 ? axisAttr + rank : axisAttr;
  const int64_t depth = dims[axis];
  const int64_t outer = product(dims, 0, axis);
  const int64_t inner = product(dims, axis + 1, dims.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < inner; ++t) {
      // Float indices truncate toward zero; anything outside the valid range (negative ones
      // before opset 11, which added counting from the back) selects no class.
      const double raw = indices.elementAsDouble(o * inner + t);
      int64_t hot = -1;
      if (std::isfinite(raw) && std::fabs(raw) < static_cast<double>(depth) + 1) {
        hot = static_cast<int64_t>(std::trunc(raw));
        if (hot < 0 && ctx.opset() >= 11) hot += depth;
      }
      for (int64_t d = 0; d < depth; ++d) {
        copyElement(values, d == hot ? 1 : 0, out, (o * depth + d) * inner + t);
      }
    }
  }
  return Status::ok();
}

Status runDepthToSpace(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t block, ctx.node().getInt("blocksize", 1));
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.node().getString("mode", "DCR"));
  const Shape& in = x.shape();
  const int64_t channels = in[1], height = in[2], width = in[3];
  const int64_t outChannels = out.shape()[1];
  forEachIndex(out.shape(), [&](int64_t flat, const std::vector<int64_t>& coords) {
    const int64_t n = coords[0], c = coords[1];
    const int64_t i = coords[2] % block, j = coords[3] % block;
    // DCR splits channels as (block row, block column, channel), CRD as (channel, row, column).
    const int64_t source =
        mode == "CRD" ? c * block * block + i * block + j : (i * block + j) * outChannels + c;
    const int64_t h = coords[2] / block, w = coords[3] / block;
    copyElement(x, ((n * channels + source) * height + h) * width + w, out, flat);
  });
  return Status::ok();
}

Status runSpaceToDepth(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t block, ctx.node().getInt("blocksize", 1));
  const Shape& in = x.shape();
  const int64_t channels = in[1], height = in[2], width = in[3];
  forEachIndex(out.shape(), [&](int64_t flat, const std::vector<int64_t>& coords) {
    const int64_t n = coords[0];
    const int64_t offset = coords[1] / channels, c = coords[1] % channels;
    const int64_t y = coords[2] * block + offset / block;
    const int64_t x0 = coords[3] * block + offset % block;
    copyElement(x, ((n * channels + c) * height + y) * width + x0, out, flat);
  });
  return Status::ok();
}

}  // namespace

void registerIndexingKernels(KernelRegistry& registry) {
  registry.add("Gather", runGather);
  registry.add("GatherElements", runGatherElements);
  registry.add("GatherND", runGatherND);
  registry.add("ScatterND", runScatterND);
  registry.add("ScatterElements", runScatterElements);
  registry.add("Scatter", runScatterElements);
  registry.add("Pad", runPad);
  registry.add("Resize", runResize);
  registry.add("Upsample", runUpsample);
  registry.add("Trilu", runTrilu);
  registry.add("OneHot", runOneHot);
  registry.add("DepthToSpace", runDepthToSpace);
  registry.add("SpaceToDepth", runSpaceToDepth);
}

}  // namespace kiln::reference
