// Reference kernel for Pad: every output element is either copied from the data (mapped back
// per axis according to the mode) or, in constant mode outside the data, the constant value.
#include <algorithm>

#include "kiln/reference/kernels/indexing.h"

namespace kiln::reference {

namespace {

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

Result<PadMode> readPadMode(const KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.node().getString("mode", "constant"));
  if (mode == "constant") return PadMode::kConstant;
  if (mode == "reflect") return PadMode::kReflect;
  if (mode == "edge") return PadMode::kEdge;
  if (mode == "wrap") return PadMode::kWrap;
  return ctx.error("unknown mode '{}'", mode);
}

// [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}] over every axis of the data.
Result<std::vector<int64_t>> readPads(const KernelContext& ctx) {
  const int64_t rank = static_cast<int64_t>(ctx.input(0).rank());
  if (ctx.opset() < 11) {
    const char* name = ctx.node().hasAttribute("paddings") ? "paddings" : "pads";
    return ctx.node().getInts(name);
  }
  const std::vector<int64_t> pads = ctx.input(1).toInt64Vector();
  if (!ctx.hasInput(3)) return pads;
  const std::vector<int64_t> axes = ctx.input(3).toInt64Vector();
  const size_t count = axes.size();
  std::vector<int64_t> full(2 * rank, 0);
  for (size_t i = 0; i < count; ++i) {
    const int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
    full[axis] = pads[i];
    full[axis + rank] = pads[i + count];
  }
  return full;
}

// The padding value as a one-element tensor of the data's dtype.
Result<Tensor> readPadValue(const KernelContext& ctx) {
  const DType dtype = ctx.input(0).dtype();
  if (ctx.opset() < 11) {
    KILN_ASSIGN_OR_RETURN(float value, ctx.node().getFloat("value", 0.0f));
    return Tensor::scalar<float>(value).castTo(dtype);
  }
  const Tensor* given = ctx.optionalInput(2);
  if (given && given->elementCount() == 1) return *given;
  return Tensor(dtype, Shape{});  // zero-filled
}

int64_t floorMod(int64_t value, int64_t modulus) {
  const int64_t r = value % modulus;
  return r < 0 ? r + modulus : r;
}

// Maps position `p` relative to the start of `kept` data elements back into [0, kept), or -1
// where constant mode fills.
int64_t sourcePosition(PadMode mode, int64_t p, int64_t kept) {
  if (p >= 0 && p < kept) return p;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kEdge:
      return std::clamp<int64_t>(p, 0, kept - 1);
    case PadMode::kWrap:
      return floorMod(p, kept);
    case PadMode::kReflect: {
      // Reflection without repeating the edge is periodic with period 2 * (kept - 1).
      if (kept == 1) return 0;
      const int64_t period = 2 * (kept - 1);
      const int64_t m = floorMod(p, period);
      return m < kept ? m : period - m;
    }
  }
  return -1;
}

}  // namespace

Status runPad(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(PadMode mode, readPadMode(ctx));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, readPads(ctx));
  KILN_ASSIGN_OR_RETURN(Tensor fill, readPadValue(ctx));
  const size_t rank = data.rank();
  const std::vector<int64_t> strides = data.shape().strides();
  // Negative pads crop first; the mode then pads what is left, as ONNX Runtime does.
  std::vector<int64_t> padBefore(rank), cropBefore(rank), kept(rank);
  for (size_t i = 0; i < rank; ++i) {
    padBefore[i] = std::max<int64_t>(0, pads[i]);
    cropBefore[i] = std::max<int64_t>(0, -pads[i]);
    kept[i] = data.shape()[i] - cropBefore[i] - std::max<int64_t>(0, -pads[i + rank]);
  }
  forEachIndex(out.shape(), [&](int64_t flat, const std::vector<int64_t>& coords) {
    int64_t source = 0;
    for (size_t i = 0; i < rank; ++i) {
      const int64_t p = sourcePosition(mode, coords[i] - padBefore[i], kept[i]);
      if (p < 0) {
        copyElement(fill, 0, out, flat);
        return;
      }
      source += (cropBefore[i] + p) * strides[i];
    }
    copyElement(data, source, out, flat);
  });
  return Status::ok();
}

}  // namespace kiln::reference
