// Shape inference for kiln.Attention (attention.h) and the geometry its kernels share.
#include "kiln/ir/ops/attention.h"

#include <string>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

template <typename... Args>
Status nodeError(const Node& node, fmt::format_string<Args...> format, Args&&... args) {
  return invalidInput("{}: {}", node.describe(), fmt::format(format, std::forward<Args>(args)...));
}

// A 0/1 flag attribute.
Result<bool> flagAttribute(const Node& node, const char* name) {
  KILN_ASSIGN_OR_RETURN(int64_t value, node.getInt(name, 0));
  if (value != 0 && value != 1)
    return nodeError(node, "attribute {} is {}; it must be 0 or 1", name, value);
  return value == 1;
}

// The mask's element offsets for each flat batch index, and its row and column strides, with
// numpy broadcasting of `mask` against the scores' shape `scores` (which it must not change).
Status placeMask(const Node& node, const Shape& mask, const Shape& scores,
                 AttentionGeometry& geometry) {
  const size_t rank = scores.rank();
  if (mask.rank() > rank) {
    return nodeError(node, "mask {} has a higher rank than the scores {}", mask.toString(),
                     scores.toString());
  }
  // The mask's strides aligned to the scores' axes from the right, 0 where it broadcasts.
  std::vector<int64_t> strides(rank, 0);
  int64_t stride = 1;
  for (size_t i = 0; i < mask.rank(); ++i) {
    const size_t m = mask.rank() - 1 - i;
    const size_t s = rank - 1 - i;
    if (mask[m] != 1 && mask[m] != scores[s]) {
      return nodeError(node,
                       "mask {} does not broadcast to the scores {} (Q's rows by K's columns): "
                       "axis {} is {}, which must be 1 or {}",
                       mask.toString(), scores.toString(), m, mask[m], scores[s]);
    }
    if (mask[m] != 1) strides[s] = stride;
    stride *= mask[m];
  }
  geometry.hasMask = true;
  geometry.maskRowStride = strides[rank - 2];
  geometry.maskColumnStride = strides[rank - 1];
  geometry.maskBatchOffsets.assign(static_cast<size_t>(geometry.batch), 0);
  const size_t batchRank = rank - 2;
  std::vector<int64_t> index(batchRank, 0);
  for (int64_t b = 0; b < geometry.batch; ++b) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < batchRank; ++axis) offset += index[axis] * strides[axis];
    geometry.maskBatchOffsets[static_cast<size_t>(b)] = offset;
    for (size_t axis = batchRank; axis-- > 0;) {
      if (++index[axis] < scores[axis]) break;
      index[axis] = 0;
    }
  }
  return Status::ok();
}

Status inferAttention(InferContext& ctx) {
  const Node& node = ctx.node();
  const DType dtype = ctx.inputType(0);
  if (!isFloating(dtype)) {
    return ctx.error("Q has dtype {}; Attention takes floating-point tensors", dtypeName(dtype));
  }
  static const char* const kRoles[] = {"Q", "K", "V", "mask"};
  for (size_t i = 1; i < ctx.inputCount(); ++i) {
    if (ctx.hasInput(i) && ctx.inputType(i) != dtype) {
      return ctx.error("{} has dtype {}, but Q has {}; they must match", kRoles[i],
                       dtypeName(ctx.inputType(i)), dtypeName(dtype));
    }
  }
  KILN_ASSIGN_OR_RETURN(AttentionGeometry geometry, attentionGeometry(node));
  ctx.setOutput(0, dtype, geometry.output);
  return Status::ok();
}

}  // namespace

namespace {

// A dense operand [..., rows, cols], batch entries one after another.
AttentionOperand denseOperand(int64_t rows, int64_t cols) {
  return {.outerStride = rows * cols, .rowStride = cols};
}

// The plain form: Q [..., Sq, D], K' [..., D, Skv] or K [..., Skv, D], V [..., Skv, Dv].
Status plainGeometry(const Node& node, AttentionGeometry& geometry) {
  for (size_t i = 0; i < 3; ++i) {
    if (!node.input(i)) return nodeError(node, "input {} (Q, K, V) is required", i);
  }
  const Shape& q = node.inputs[0]->shape;
  const Shape& k = node.inputs[1]->shape;
  const Shape& v = node.inputs[2]->shape;
  const std::string kForm =
      geometry.transposeK ? "[..., Skv, D] (transpose_k=1)" : "[..., D, Skv] (transpose_k=0)";
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank()) {
    return nodeError(node,
                     "Q {}, K {} and V {} must have one rank of at least 2: Q [..., Sq, D], K {}, "
                     "V [..., Skv, Dv]",
                     q.toString(), k.toString(), v.toString(), kForm);
  }
  const size_t rank = q.rank();
  for (size_t axis = 0; axis + 2 < rank; ++axis) {
    if (k[axis] != q[axis] || v[axis] != q[axis]) {
      return nodeError(node, "Q {}, K {} and V {} must have the same batch dimensions",
                       q.toString(), k.toString(), v.toString());
    }
    geometry.batch *= q[axis];
  }
  geometry.sq = q[rank - 2];
  geometry.d = q[rank - 1];
  geometry.skv = geometry.transposeK ? k[rank - 2] : k[rank - 1];
  const int64_t kDepth = geometry.transposeK ? k[rank - 1] : k[rank - 2];
  if (kDepth != geometry.d) {
    return nodeError(node, "Q {} has depth D={}, but K {} in the form {} has D={}", q.toString(),
                     geometry.d, k.toString(), kForm, kDepth);
  }
  if (v[rank - 2] != geometry.skv) {
    return nodeError(node, "K {} gives Skv={} keys, but V {} has {} rows", k.toString(),
                     geometry.skv, v.toString(), v[rank - 2]);
  }
  geometry.dv = v[rank - 1];
  geometry.q = denseOperand(geometry.sq, geometry.d);
  geometry.k = geometry.transposeK ? denseOperand(geometry.skv, geometry.d)
                                   : denseOperand(geometry.d, geometry.skv);
  geometry.v = denseOperand(geometry.skv, geometry.dv);
  geometry.y = denseOperand(geometry.sq, geometry.dv);
  std::vector<int64_t> dims = q.dims();
  dims.back() = geometry.dv;
  geometry.output = Shape(std::move(dims));
  return Status::ok();
}

// The heads form (num_heads = H): Q [B, Sq, H * D], K [B, Skv, H * D], V [B, Skv, H * Dv], or
// packed, Q [B, S, 3 * H * D] alone.
Status headsGeometry(const Node& node, int64_t heads, AttentionGeometry& geometry) {
  if (!geometry.transposeK) {
    return nodeError(node, "num_heads={} needs transpose_k=1 (K [B, Skv, H * D])", heads);
  }
  if (!node.input(0)) return nodeError(node, "input 0 (Q) is required");
  const Shape& q = node.inputs[0]->shape;
  geometry.heads = heads;
  geometry.packed = !node.input(1) && !node.input(2);
  if (!geometry.packed && (!node.input(1) || !node.input(2))) {
    return nodeError(node, "num_heads={}: K and V are both given or both omitted (packed Q)",
                     heads);
  }
  if (q.rank() != 3) {
    return nodeError(node, "num_heads={}: Q {} must be [B, S, columns]", heads, q.toString());
  }
  const int64_t b = q[0];
  geometry.batch = b * heads;
  geometry.sq = q[1];
  if (geometry.packed) {
    if (q[2] % (3 * heads) != 0) {
      return nodeError(node,
                       "num_heads={} packed (K and V omitted): Q {} must have 3 * H * D columns, "
                       "{} is not a multiple of {}",
                       heads, q.toString(), q[2], 3 * heads);
    }
    geometry.d = geometry.dv = q[2] / (3 * heads);
    geometry.skv = geometry.sq;
    const int64_t width = q[2];
    const int64_t e = heads * geometry.d;
    const AttentionOperand column{
        .outerStride = geometry.sq * width, .headStride = geometry.d, .rowStride = width};
    geometry.q = column;
    geometry.k = column;
    geometry.k.base = e;
    geometry.v = column;
    geometry.v.base = 2 * e;
  } else {
    const Shape& k = node.inputs[1]->shape;
    const Shape& v = node.inputs[2]->shape;
    if (k.rank() != 3 || v.rank() != 3 || k[0] != b || v[0] != b || k[1] != v[1]) {
      return nodeError(node,
                       "num_heads={}: Q {}, K {} and V {} must be [B, Sq, H * D], [B, Skv, H * D] "
                       "and [B, Skv, H * Dv]",
                       heads, q.toString(), k.toString(), v.toString());
    }
    if (q[2] % heads != 0 || v[2] % heads != 0 || k[2] != q[2]) {
      return nodeError(node,
                       "num_heads={}: Q {} and K {} must have the same H * D columns and V {} "
                       "H * Dv, whole multiples of H",
                       heads, q.toString(), k.toString(), v.toString());
    }
    geometry.d = q[2] / heads;
    geometry.dv = v[2] / heads;
    geometry.skv = k[1];
    geometry.q = {.outerStride = geometry.sq * q[2], .headStride = geometry.d, .rowStride = q[2]};
    geometry.k = {.outerStride = geometry.skv * k[2], .headStride = geometry.d, .rowStride = k[2]};
    geometry.v = {.outerStride = geometry.skv * v[2], .headStride = geometry.dv, .rowStride = v[2]};
  }
  const int64_t yColumns = heads * geometry.dv;
  geometry.y = {
      .outerStride = geometry.sq * yColumns, .headStride = geometry.dv, .rowStride = yColumns};
  geometry.output = Shape({b, geometry.sq, yColumns});
  return Status::ok();
}

}  // namespace

Result<AttentionGeometry> attentionGeometry(const Node& node) {
  AttentionGeometry geometry;
  KILN_ASSIGN_OR_RETURN(geometry.scale, node.getFloat("scale", 1.0f));
  KILN_ASSIGN_OR_RETURN(geometry.transposeK, flagAttribute(node, "transpose_k"));
  KILN_ASSIGN_OR_RETURN(geometry.nanToZero, flagAttribute(node, "nan_to_zero"));
  KILN_ASSIGN_OR_RETURN(const int64_t heads, node.getInt("num_heads", 0));
  if (heads < 0) return nodeError(node, "attribute num_heads is {}; it must be positive", heads);
  if (heads == 0) {
    KILN_RETURN_IF_ERROR(plainGeometry(node, geometry));
  } else {
    KILN_RETURN_IF_ERROR(headsGeometry(node, heads, geometry));
  }
  if (node.hasInput(3)) {
    // The scores: [..., Sq, Skv], or [B, H, Sq, Skv] in the heads form.
    std::vector<int64_t> scores;
    if (heads == 0) {
      scores = node.inputs[0]->shape.dims();
      scores.back() = geometry.skv;
    } else {
      scores = {geometry.batch / heads, heads, geometry.sq, geometry.skv};
    }
    KILN_RETURN_IF_ERROR(
        placeMask(node, node.inputs[3]->shape, Shape(std::move(scores)), geometry));
  }
  return geometry;
}

void registerAttentionSchemas(OpRegistry& registry) {
  registry.add({.opType = "Attention",
                .domain = kKilnDomain,
                // K and V may be omitted in the packed heads form; attentionGeometry says which
                // inputs each form needs.
                .minInputs = 1,
                .maxInputs = 4,
                .infer = inferAttention});
}

}  // namespace kiln::ir
