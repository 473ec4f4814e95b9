// Reference kernels for the shape and data-layout ops.
//
// The data-movement kernels copy elements as bytes, so they serve every dtype alike; output
// shapes come from shape inference, and each kernel re-reads only what says where elements go.
#include <algorithm>
#include <array>
#include <cstring>

#include "kiln/ir/ops/slice.h"
#include "kiln/reference/kernel.h"
#include "kiln/reference/kernels/broadcast.h"

namespace kiln::reference {

namespace {

// Calls fn(flat, index) for every element of `shape` in row-major order.
template <typename Fn>
void forEachIndex(const Shape& shape, Fn&& fn) {
  const int64_t total = shape.elementCount();
  std::vector<int64_t> index(shape.rank(), 0);
  for (int64_t flat = 0; flat < total; ++flat) {
    fn(flat, index);
    for (size_t axis = shape.rank(); axis-- > 0;) {
      if (++index[axis] < shape[axis]) break;
      index[axis] = 0;
    }
  }
}

// Fills `out` element by element: sourceOf(index) is the flat index into `in` that the output
// element at `index` copies.
template <typename SourceFn>
void gatherElements(const Tensor& in, Tensor& out, SourceFn&& sourceOf) {
  const size_t size = ir::dtypeSize(in.dtype());
  const std::byte* src = in.rawData();
  std::byte* dst = out.mutableRawData();
  forEachIndex(out.shape(), [&](int64_t flat, const std::vector<int64_t>& index) {
    std::memcpy(dst + flat * size, src + sourceOf(index) * size, size);
  });
}

// Reshape, Flatten, Squeeze and Unsqueeze: the same elements in the same order.
Status runCopy(KernelContext& ctx) {
  std::memcpy(ctx.output(0).mutableRawData(), ctx.input(0).rawData(), ctx.input(0).byteSize());
  return Status::ok();
}

Status runConstant(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  const auto& [name, attribute] = *node.attributes.begin();
  Tensor& out = ctx.output(0);
  if (name == "value") {
    const Tensor& value = std::get<Tensor>(attribute.value);
    std::memcpy(out.mutableRawData(), value.rawData(), value.byteSize());
  } else if (name == "value_float") {
    out.mutableData<float>()[0] = std::get<float>(attribute.value);
  } else if (name == "value_int") {
    out.mutableData<int64_t>()[0] = std::get<int64_t>(attribute.value);
  } else if (name == "value_floats") {
    const auto& v = std::get<std::vector<float>>(attribute.value);
    std::copy(v.begin(), v.end(), out.mutableData<float>().begin());
  } else if (name == "value_ints") {
    const auto& v = std::get<std::vector<int64_t>>(attribute.value);
    std::copy(v.begin(), v.end(), out.mutableData<int64_t>().begin());
  } else {
    return ctx.unsupportedHere("attribute '{}' is not supported", name);
  }
  return Status::ok();
}

Status runTranspose(KernelContext& ctx) {
  const Tensor& in = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> reversed(rank);
  for (int64_t i = 0; i < rank; ++i) reversed[i] = rank - 1 - i;
  KILN_ASSIGN_OR_RETURN(auto perm, ctx.node().getInts("perm", reversed));
  const std::vector<int64_t> strides = in.shape().strides();
  gatherElements(in, ctx.output(0), [&](const std::vector<int64_t>& index) {
    int64_t source = 0;
    for (int64_t a = 0; a < rank; ++a) source += index[a] * strides[perm[a]];
    return source;
  });
  return Status::ok();
}

Status runConcat(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 0));
  if (axis < 0) axis += static_cast<int64_t>(out.rank());
  int64_t outer = 1, inner = 1;
  for (int64_t a = 0; a < static_cast<int64_t>(out.rank()); ++a) {
    if (a < axis) outer *= out.shape()[a];
    if (a > axis) inner *= out.shape()[a];
  }
  // Each outer row of the output is the inputs' rows (along the axis) one after another.
  const size_t size = ir::dtypeSize(out.dtype());
  const int64_t outRow = out.shape()[axis] * inner;
  int64_t offset = 0;
  for (size_t k = 0; k < ctx.inputCount(); ++k) {
    const Tensor& in = ctx.input(k);
    const int64_t inRow = in.shape()[axis] * inner;
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(out.mutableRawData() + (o * outRow + offset) * size,
                  in.rawData() + o * inRow * size, inRow * size);
    }
    offset += inRow;
  }
  return Status::ok();
}

Status runSplit(KernelContext& ctx) {
  const Tensor& in = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 0));
  if (axis < 0) axis += static_cast<int64_t>(in.rank());
  int64_t outer = 1, inner = 1;
  for (int64_t a = 0; a < static_cast<int64_t>(in.rank()); ++a) {
    if (a < axis) outer *= in.shape()[a];
    if (a > axis) inner *= in.shape()[a];
  }
  // The inverse of Concat: each outer row of the input is the outputs' rows in turn; the
  // outputs' shapes carry the split sizes.
  const size_t size = ir::dtypeSize(in.dtype());
  const int64_t inRow = in.shape()[axis] * inner;
  int64_t offset = 0;
  for (size_t k = 0; k < ctx.outputCount(); ++k) {
    Tensor& out = ctx.output(k);
    const int64_t outRow = out.shape()[axis] * inner;
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(out.mutableRawData() + o * outRow * size,
                  in.rawData() + (o * inRow + offset) * size, outRow * size);
    }
    offset += outRow;
  }
  return Status::ok();
}

// Slice's starts, axes and steps, from attributes (before opset 10) or inputs; the ends only
// decide lengths, which the output shape already has.
struct SliceOrigin {
  std::vector<int64_t> starts, axes, steps;
};

Result<SliceOrigin> sliceOrigin(const KernelContext& ctx) {
  SliceOrigin origin;
  const ir::Node& node = ctx.node();
  if (ctx.opset() < 10) {
    KILN_ASSIGN_OR_RETURN(origin.starts, node.getInts("starts"));
    KILN_ASSIGN_OR_RETURN(origin.axes, node.getInts("axes"));
  } else {
    origin.starts = ctx.input(1).toInt64Vector();
    if (ctx.hasInput(3)) origin.axes = ctx.input(3).toInt64Vector();
    if (ctx.hasInput(4)) origin.steps = ctx.input(4).toInt64Vector();
  }
  // Default axes are 0..n-1; steps default to 1.
  for (size_t i = origin.axes.size(); i < origin.starts.size(); ++i) {
    origin.axes.push_back(static_cast<int64_t>(i));
  }
  origin.steps.resize(origin.starts.size(), 1);
  return origin;
}

Status runSlice(KernelContext& ctx) {
  const Tensor& in = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(in.rank());
  KILN_ASSIGN_OR_RETURN(SliceOrigin origin, sliceOrigin(ctx));
  std::vector<int64_t> start(rank, 0), step(rank, 1);
  for (size_t i = 0; i < origin.axes.size(); ++i) {
    const int64_t axis = origin.axes[i] < 0 ? origin.axes[i] + rank : origin.axes[i];
    const int64_t dim = in.shape()[axis];
    step[axis] = origin.steps[i];
    start[axis] = ir::sliceFirst(origin.starts[i], origin.steps[i], dim);
  }
  const std::vector<int64_t> strides = in.shape().strides();
  gatherElements(in, ctx.output(0), [&](const std::vector<int64_t>& index) {
    int64_t source = 0;
    for (int64_t a = 0; a < rank; ++a) source += (start[a] + index[a] * step[a]) * strides[a];
    return source;
  });
  return Status::ok();
}

Status runExpand(KernelContext& ctx) {
  const Tensor& in = ctx.input(0);
  Tensor& out = ctx.output(0);
  const size_t size = ir::dtypeSize(in.dtype());
  forEachBroadcastIndex<1>(
      out.shape(), {in.shape()}, [&](int64_t flat, const std::array<int64_t, 1>& source) {
        std::memcpy(out.mutableRawData() + flat * size, in.rawData() + source[0] * size, size);
      });
  return Status::ok();
}

Status runTile(KernelContext& ctx) {
  const Tensor& in = ctx.input(0);
  const std::vector<int64_t> strides = in.shape().strides();
  // A non-empty output means every input dimension is non-zero, so the modulo is defined.
  gatherElements(in, ctx.output(0), [&](const std::vector<int64_t>& index) {
    int64_t source = 0;
    for (size_t a = 0; a < index.size(); ++a) source += index[a] % in.shape()[a] * strides[a];
    return source;
  });
  return Status::ok();
}

Status runShape(KernelContext& ctx) {
  const Shape& shape = ctx.input(0).shape();
  const int64_t rank = static_cast<int64_t>(shape.rank());
  int64_t start = 0;
  if (ctx.opset() >= 15) {
    KILN_ASSIGN_OR_RETURN(start, ctx.node().getInt("start", 0));
    if (start < 0) start += rank;
    start = std::clamp<int64_t>(start, 0, rank);
  }
  auto out = ctx.output(0).mutableData<int64_t>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = shape[start + i];
  return Status::ok();
}

Status runSize(KernelContext& ctx) {
  ctx.output(0).mutableData<int64_t>()[0] = ctx.input(0).elementCount();
  return Status::ok();
}

Status runConstantOfShape(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  auto it = ctx.node().attributes.find("value");
  if (it == ctx.node().attributes.end()) return Status::ok();  // float zeros, as allocated
  const Tensor& value = std::get<Tensor>(it->second.value);
  const size_t size = value.byteSize();
  for (int64_t i = 0; i < out.elementCount(); ++i) {
    std::memcpy(out.mutableRawData() + i * size, value.rawData(), size);
  }
  return Status::ok();
}

Status runRange(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  return ir::visitDType(out.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const double start = ctx.input(0).elementAsDouble(0);
      const double delta = ctx.input(2).elementAsDouble(0);
      auto values = out.mutableData<T>();
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] = static_cast<T>(start + static_cast<double>(i) * delta);
      }
      return Status::ok();
    } else if constexpr (std::is_same_v<T, int16_t> || std::is_same_v<T, int32_t> ||
                         std::is_same_v<T, int64_t>) {
      // Every value lies between start and limit, so int64 arithmetic cannot overflow.
      const int64_t start = ctx.input(0).elementAsInt64(0);
      const int64_t delta = ctx.input(2).elementAsInt64(0);
      auto values = out.mutableData<T>();
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] = static_cast<T>(start + static_cast<int64_t>(i) * delta);
      }
      return Status::ok();
    } else {
      return ctx.error("takes float, double, int16, int32 or int64, got {}",
                       ir::dtypeName(out.dtype()));
    }
  });
}

Status runEyeLike(KernelContext& ctx) {
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t k, ctx.node().getInt("k", 0));
  const int64_t rows = out.shape()[0], cols = out.shape()[1];
  // A diagonal entirely outside the matrix leaves the zeros; checking first keeps r + k in range.
  if (k >= cols || k <= -rows) return Status::ok();
  ir::visitDType(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto values = out.mutableData<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t c = r + k;
      if (c >= 0 && c < cols) values[r * cols + c] = ir::convertElement<T>(1);
    }
  });
  return Status::ok();
}

}  // namespace

void registerShapeKernels(KernelRegistry& registry) {
  registry.add("Constant", runConstant);
  registry.add("Reshape", runCopy);
  registry.add("Flatten", runCopy);
  registry.add("Squeeze", runCopy);
  registry.add("Unsqueeze", runCopy);
  registry.add("Transpose", runTranspose);
  registry.add("Concat", runConcat);
  registry.add("Split", runSplit);
  registry.add("Slice", runSlice);
  registry.add("Expand", runExpand);
  registry.add("Tile", runTile);
  registry.add("Shape", runShape);
  registry.add("Size", runSize);
  registry.add("ConstantOfShape", runConstantOfShape);
  registry.add("Range", runRange);
  registry.add("EyeLike", runEyeLike);
}

}  // namespace kiln::reference
