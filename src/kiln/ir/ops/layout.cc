// Shape inference for kiln's NHWC ops (layout.h). Each runs the inference of the op it stands
// for on an NCHW view of its inputs, so its shapes, attribute checks and errors are that op's
// own; only the 4-D layouts are checked here.
#include "kiln/ir/ops/layout.h"

#include <cstring>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

struct NhwcOp {
  const char* nhwc;  // in kiln's domain
  const char* base;
  const char* baseDomain;
  int maxInputs;
};

constexpr NhwcOp kNhwcOps[] = {
    {"NhwcConv", "FusedConv", kKilnDomain, 4},
    {"NhwcMaxPool", "MaxPool", "", 1},
    {"NhwcAveragePool", "AveragePool", "", 1},
    {"NhwcGlobalAveragePool", "GlobalAveragePool", "", 1},
    {"NhwcGlobalMaxPool", "GlobalMaxPool", "", 1},
};

// Inputs in NHWC (X, and NhwcConv's residual) and NhwcConv's [kH, kW, C/group, M] weights.
bool isActivationInput(bool conv, size_t input) { return input == 0 || (conv && input == 3); }

Status inferNhwc(const InferFn& base, bool conv, InferContext& ctx) {
  const Node& node = ctx.node();
  Node view = node;
  std::vector<Value> values(node.inputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.inputs[i]) continue;
    const bool activation = isActivationInput(conv, i);
    if ((activation || (conv && i == 1)) && ctx.inputRank(i) != 4) {
      return ctx.error("input {} has shape {}; {} takes 4-D {} tensors", i,
                       ctx.inputShape(i).toString(), node.opType,
                       activation ? "[N, H, W, C]" : "[kH, kW, C/group, M]");
    }
    values[i] = *node.inputs[i];
    values[i].constant.reset();  // the base op reads shapes here, never values
    if (activation) values[i].shape = permuteShape(values[i].shape, kNhwcToNchw);
    if (conv && i == 1) values[i].shape = permuteShape(values[i].shape, kHwioToOihw);
    view.inputs[i] = &values[i];
  }
  InferContext inner(view);
  KILN_RETURN_IF_ERROR(base(inner));
  const InferContext::OutputType& out = inner.outputs()[0];
  ctx.setOutput(0, out.dtype, permuteShape(out.shape, kNchwToNhwc));
  return Status::ok();
}

}  // namespace

std::string nhwcOpFor(const std::string& opType) {
  if (opType == "Conv") return "NhwcConv";
  for (const NhwcOp& op : kNhwcOps) {
    if (opType == op.base) return op.nhwc;
  }
  return "";
}

std::string opForNhwc(const std::string& opType) {
  for (const NhwcOp& op : kNhwcOps) {
    if (opType == op.nhwc) return op.base;
  }
  return "";
}

Shape permuteShape(const Shape& shape, const std::vector<int64_t>& perm) {
  std::vector<int64_t> dims(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) dims[i] = shape[static_cast<size_t>(perm[i])];
  return Shape(std::move(dims));
}

Tensor permuteTensor(const Tensor& tensor, const std::vector<int64_t>& perm) {
  const Shape& in = tensor.shape();
  Tensor out(tensor.dtype(), permuteShape(in, perm));
  const size_t rank = perm.size();
  const size_t size = dtypeSize(tensor.dtype());
  const std::vector<int64_t> inStrides = in.strides();
  // Walk the output in order; `source` follows the matching input element.
  std::vector<int64_t> index(rank, 0);
  const std::byte* src = tensor.rawData();
  std::byte* dst = out.mutableRawData();
  for (int64_t i = 0; i < out.elementCount(); ++i) {
    int64_t source = 0;
    for (size_t d = 0; d < rank; ++d) source += index[d] * inStrides[static_cast<size_t>(perm[d])];
    std::memcpy(dst + static_cast<size_t>(i) * size, src + static_cast<size_t>(source) * size,
                size);
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < out.shape()[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// kiln.ChannelShuffle (layout.h): inputs alike but along `axis`, groups and the output count
// dividing the channels.
Status inferChannelShuffle(InferContext& ctx) {
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    if (!ctx.hasInput(i)) return ctx.error("input {} is missing: every input is required", i);
  }
  const int64_t rank = ctx.inputRank(0);
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t groups, ctx.node().getInt("groups", 0));
  if (rawAxis < -rank || rawAxis >= rank) {
    return ctx.error("axis {} is out of range for rank {}", rawAxis, rank);
  }
  const size_t axis = static_cast<size_t>(rawAxis < 0 ? rawAxis + rank : rawAxis);
  int64_t channels = 0;
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    const Shape& shape = ctx.inputShape(i);
    if (ctx.inputType(i) != ctx.inputType(0) || ctx.inputRank(i) != rank) {
      return ctx.error("input {} is {} {}, input 0 {} {}: they must differ only along axis {}", i,
                       dtypeName(ctx.inputType(i)), shape.toString(), dtypeName(ctx.inputType(0)),
                       ctx.inputShape(0).toString(), axis);
    }
    for (size_t d = 0; d < shape.rank(); ++d) {
      if (d != axis && shape[d] != ctx.inputShape(0)[d]) {
        return ctx.error("input {} {} and input 0 {} differ along axis {}, not only along axis {}",
                         i, shape.toString(), ctx.inputShape(0).toString(), d, axis);
      }
    }
    channels += shape[axis];
  }
  const auto outputs = static_cast<int64_t>(ctx.outputCount());
  if (groups < 1 || channels % groups != 0) {
    return ctx.error("groups {} must be positive and divide the {} channels", groups, channels);
  }
  if (channels % outputs != 0) {
    return ctx.error("{} outputs must divide the {} channels", outputs, channels);
  }
  Shape shape = ctx.inputShape(0);
  std::vector<int64_t> dims = shape.dims();
  dims[axis] = channels / outputs;
  for (size_t o = 0; o < ctx.outputCount(); ++o) ctx.setOutput(o, ctx.inputType(0), Shape(dims));
  return Status::ok();
}

void registerLayoutSchemas(OpRegistry& registry) {
  registry.add({.opType = "ChannelShuffle",
                .domain = kKilnDomain,
                .maxInputs = 1 << 20,
                .maxOutputs = 1 << 20,
                .infer = inferChannelShuffle});
  for (const NhwcOp& op : kNhwcOps) {
    const OpSchema* base = registry.find(op.baseDomain, op.base);
    KILN_CHECK(base != nullptr);  // the base families register first (OpRegistry::instance)
    const bool conv = std::string_view(op.nhwc) == "NhwcConv";
    registry.add({.opType = op.nhwc,
                  .domain = kKilnDomain,
                  .minInputs = conv ? 2 : 1,
                  .maxInputs = op.maxInputs,
                  .infer = [infer = base->infer, conv](InferContext& ctx) {
                    return inferNhwc(infer, conv, ctx);
                  }});
  }
}

}  // namespace kiln::ir
