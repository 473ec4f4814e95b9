// Reference kernels for the reduction ops: the Reduce* family, ArgMax/ArgMin, Softmax/LogSoftmax/
// Hardmax, TopK and CumSum.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kiln/reference/kernel.h"

namespace kiln::reference {

namespace {

template <typename T>
constexpr bool kIsFloating = std::is_floating_point_v<T> || std::is_same_v<T, ir::Float16> ||
                             std::is_same_v<T, ir::BFloat16>;

// Floating inputs are computed on in double: exact for every float type kiln has, and it makes
// float32 sums accumulate in double.
template <typename T>
std::vector<double> asDoubles(std::span<const T> values) {
  std::vector<double> result(values.size());
  for (size_t i = 0; i < values.size(); ++i) result[i] = ir::convertElement<double>(values[i]);
  return result;
}

// Narrows a double-domain result (L2, LogSum, LogSumExp of integers) to an integer type. The
// spec leaves out-of-range results undefined; kiln saturates and maps NaN to 0 rather than
// invoke C++'s undefined float-to-integer conversion.
template <typename T>
T saturate(double value) {
  if (std::isnan(value)) return T{0};
  if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) {
    return std::numeric_limits<T>::lowest();
  }
  if (value >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  return static_cast<T>(value);
}

Result<int64_t> resolveAxis(const KernelContext& ctx, int64_t axis, int64_t rank) {
  auto normalized = ir::normalizeAxis(axis, rank);
  if (!normalized.isOk()) return ctx.error("{}", normalized.status().message());
  return *normalized;
}

// A tensor seen as [outer, length, inner]: `outer * inner` lines of `length` elements each.
struct Lines {
  int64_t outer = 1;
  int64_t length = 1;
  int64_t inner = 1;

  // Flat indices of the elements of line (o, i), in order along the line.
  std::vector<int64_t> line(int64_t o, int64_t i) const {
    std::vector<int64_t> indices(length);
    for (int64_t j = 0; j < length; ++j) indices[j] = (o * length + j) * inner + i;
    return indices;
  }
};

int64_t product(const Shape& shape, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t axis = begin; axis < end; ++axis) result *= shape[axis];
  return result;
}

// The lines along `axis`.
Lines linesAlong(const Shape& shape, int64_t axis) {
  const size_t a = static_cast<size_t>(axis);
  return {product(shape, 0, a), shape[a], product(shape, a + 1, shape.rank())};
}

// The rows of the 2-D matrix [d0 * ... * d(axis-1), d(axis) * ... * d(n-1)].
Lines rowsFrom(const Shape& shape, int64_t axis) {
  const size_t a = static_cast<size_t>(axis);
  return {product(shape, 0, a), product(shape, a, shape.rank()), 1};
}

// Calls fn(indices) for every line.
template <typename Fn>
void forEachLine(const Lines& lines, Fn&& fn) {
  for (int64_t o = 0; o < lines.outer; ++o) {
    for (int64_t i = 0; i < lines.inner; ++i) fn(lines.line(o, i));
  }
}

// Whether `candidate` displaces `best` as the running maximum (or minimum). NaN beats every
// number, as in numpy's argmax/argmin; ties go to the later element only when asked.
template <typename V>
bool displaces(V candidate, V best, bool isMax, bool onTie) {
  if constexpr (std::is_floating_point_v<V>) {
    if (std::isnan(best)) return onTie && std::isnan(candidate);
    if (std::isnan(candidate)) return true;
  }
  if (candidate == best) return onTie;
  return isMax ? candidate > best : candidate < best;
}

// Position along `indices` of the maximum (or minimum) of `values`.
template <typename Values>
int64_t extremeIndex(const Values& values, const std::vector<int64_t>& indices, bool isMax,
                     bool lastOnTie) {
  int64_t best = 0;
  for (size_t j = 1; j < indices.size(); ++j) {
    if (displaces(values[indices[j]], values[indices[best]], isMax, lastOnTie)) {
      best = static_cast<int64_t>(j);
    }
  }
  return best;
}

// --- Reduce* ---------------------------------------------------------------------------------

enum class Reduction { kSum, kMean, kProd, kSumSquare, kL1, kL2, kLogSum, kLogSumExp, kMax, kMin };

Reduction reductionOf(const std::string& opType) {
  if (opType == "ReduceMean") return Reduction::kMean;
  if (opType == "ReduceProd") return Reduction::kProd;
  if (opType == "ReduceSumSquare") return Reduction::kSumSquare;
  if (opType == "ReduceL1") return Reduction::kL1;
  if (opType == "ReduceL2") return Reduction::kL2;
  if (opType == "ReduceLogSum") return Reduction::kLogSum;
  if (opType == "ReduceLogSumExp") return Reduction::kLogSumExp;
  if (opType == "ReduceMax") return Reduction::kMax;
  if (opType == "ReduceMin") return Reduction::kMin;
  return Reduction::kSum;
}

// The reduced axes, resolved as shape inference did (which validated them): from the attribute
// before the opset where axes became an input, then from the input; empty axes mean all axes,
// or none with noop_with_empty_axes.
Result<std::vector<bool>> reducedAxes(const KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  const int64_t rank = static_cast<int64_t>(ctx.input(0).rank());
  const int axesInputSince = node.opType == "ReduceSum" ? 13 : 18;
  std::vector<int64_t> axes;
  bool noop = false;
  if (ctx.opset() < axesInputSince) {
    KILN_ASSIGN_OR_RETURN(axes, node.getInts("axes"));
  } else {
    if (const Tensor* input = ctx.optionalInput(1)) axes = input->toInt64Vector();
    KILN_ASSIGN_OR_RETURN(int64_t flag, node.getInt("noop_with_empty_axes", 0));
    noop = flag != 0;
  }
  if (axes.empty()) return std::vector<bool>(rank, !noop);
  std::vector<bool> reduced(rank, false);
  for (int64_t axis : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t normalized, resolveAxis(ctx, axis, rank));
    reduced[normalized] = true;
  }
  return reduced;
}

// Which output element each input element reduces into, and how many input elements each
// output element gathers (0 when a reduced axis is empty: the "empty set" cases).
struct ReductionPlan {
  std::vector<int64_t> target;
  int64_t outputCount = 1;
  int64_t groupSize = 1;
};

ReductionPlan planReduction(const Shape& input, const std::vector<bool>& reduced) {
  ReductionPlan plan;
  const size_t rank = input.rank();
  // Output strides with the reduced axes contributing nothing.
  std::vector<int64_t> outputStrides(rank, 0);
  for (size_t axis = rank; axis-- > 0;) {
    if (reduced[axis]) {
      plan.groupSize *= input[axis];
    } else {
      outputStrides[axis] = plan.outputCount;
      plan.outputCount *= input[axis];
    }
  }
  const std::vector<int64_t> inputStrides = input.strides();
  plan.target.resize(static_cast<size_t>(input.elementCount()));
  for (size_t i = 0; i < plan.target.size(); ++i) {
    int64_t target = 0;
    for (size_t axis = 0; axis < rank; ++axis) {
      const int64_t coordinate = static_cast<int64_t>(i) / inputStrides[axis] % input[axis];
      target += coordinate * outputStrides[axis];
    }
    plan.target[i] = target;
  }
  return plan;
}

// Max or Min over doubles; NaN propagates as in numpy; the empty set gives -inf / +inf.
std::vector<double> extremum(bool isMax, const std::vector<double>& values,
                             const ReductionPlan& plan) {
  const double infinity = std::numeric_limits<double>::infinity();
  std::vector<double> result(plan.outputCount, isMax ? -infinity : infinity);
  for (size_t i = 0; i < values.size(); ++i) {
    double& best = result[plan.target[i]];
    if (!std::isnan(best) && displaces(values[i], best, isMax, false)) best = values[i];
  }
  return result;
}

// log(sum(exp(x))), shifted by the maximum so large inputs do not overflow. The empty set and
// all -inf give -inf; +inf and NaN pass through.
std::vector<double> logSumExp(const std::vector<double>& values, const ReductionPlan& plan) {
  const std::vector<double> shift = extremum(true, values, plan);
  std::vector<double> sums(plan.outputCount, 0.0);
  for (size_t i = 0; i < values.size(); ++i) {
    const double s = shift[plan.target[i]];
    if (std::isfinite(s)) sums[plan.target[i]] += std::exp(values[i] - s);
  }
  std::vector<double> result(plan.outputCount);
  for (size_t o = 0; o < result.size(); ++o) {
    result[o] = std::isfinite(shift[o]) ? shift[o] + std::log(sums[o]) : shift[o];
  }
  return result;
}

// Sum, Mean, Prod, SumSquare, L1, L2 and LogSum over doubles. The empty set gives 0 (Sum,
// SumSquare, L1, L2), 1 (Prod), NaN (Mean) and -inf (LogSum).
std::vector<double> accumulate(Reduction kind, const std::vector<double>& values,
                               const ReductionPlan& plan) {
  std::vector<double> result(plan.outputCount, kind == Reduction::kProd ? 1.0 : 0.0);
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    double& acc = result[plan.target[i]];
    switch (kind) {
      case Reduction::kProd:
        acc *= x;
        break;
      case Reduction::kSumSquare:
      case Reduction::kL2:
        acc += x * x;
        break;
      case Reduction::kL1:
        acc += std::fabs(x);
        break;
      default:
        acc += x;
        break;
    }
  }
  for (double& acc : result) {
    if (kind == Reduction::kMean) acc /= static_cast<double>(plan.groupSize);
    if (kind == Reduction::kL2) acc = std::sqrt(acc);
    if (kind == Reduction::kLogSum) acc = std::log(acc);
  }
  return result;
}

std::vector<double> reduceDoubles(Reduction kind, const std::vector<double>& values,
                                  const ReductionPlan& plan) {
  if (kind == Reduction::kMax || kind == Reduction::kMin) {
    return extremum(kind == Reduction::kMax, values, plan);
  }
  if (kind == Reduction::kLogSumExp) return logSumExp(values, plan);
  return accumulate(kind, values, plan);
}

// Max or Min of an integer or bool type; the empty set gives the type's lowest / highest value.
template <typename T>
void integerExtremum(bool isMax, std::span<const T> in, const ReductionPlan& plan,
                     std::span<T> out) {
  std::fill(out.begin(), out.end(),
            isMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
  for (size_t i = 0; i < in.size(); ++i) {
    T& best = out[plan.target[i]];
    if (isMax ? in[i] > best : in[i] < best) best = in[i];
  }
}

// Sum, Mean, Prod, SumSquare and L1 of an integer type wrap around like numpy's integer
// arithmetic: accumulate modulo 2^64 (well defined in uint64), then narrow. Mean divides the
// narrowed sum, truncating toward zero; the mean of the empty set is 0.
template <typename T>
void integerAccumulate(Reduction kind, std::span<const T> in, const ReductionPlan& plan,
                       std::span<T> out) {
  std::vector<uint64_t> result(plan.outputCount, kind == Reduction::kProd ? 1 : 0);
  for (size_t i = 0; i < in.size(); ++i) {
    uint64_t x = static_cast<uint64_t>(in[i]);
    uint64_t& acc = result[plan.target[i]];
    switch (kind) {
      case Reduction::kProd:
        acc *= x;
        break;
      case Reduction::kSumSquare:
        acc += x * x;
        break;
      case Reduction::kL1:
        if constexpr (std::is_signed_v<T>) {
          if (in[i] < 0) x = 0 - x;
        }
        acc += x;
        break;
      default:
        acc += x;
        break;
    }
  }
  using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
  for (size_t o = 0; o < out.size(); ++o) {
    const T value = static_cast<T>(result[o]);
    if (kind != Reduction::kMean) {
      out[o] = value;
    } else if (plan.groupSize > 0) {
      out[o] = static_cast<T>(static_cast<Wide>(value) / static_cast<Wide>(plan.groupSize));
    } else {
      out[o] = T{0};
    }
  }
}

template <typename T>
Status reduceTyped(const KernelContext& ctx, Reduction kind, const ReductionPlan& plan,
                   Tensor& output) {
  std::span<const T> in = ctx.input(0).data<T>();
  std::span<T> out = output.mutableData<T>();
  const bool isExtremum = kind == Reduction::kMax || kind == Reduction::kMin;
  if constexpr (kIsFloating<T>) {
    const std::vector<double> result = reduceDoubles(kind, asDoubles(in), plan);
    for (size_t o = 0; o < out.size(); ++o) out[o] = ir::convertElement<T>(result[o]);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!isExtremum) return ctx.unsupportedHere("bool input is only reduced by ReduceMax/Min");
    integerExtremum<T>(kind == Reduction::kMax, in, plan, out);
  } else if (isExtremum) {
    integerExtremum<T>(kind == Reduction::kMax, in, plan, out);
  } else if (kind == Reduction::kL2 || kind == Reduction::kLogSum ||
             kind == Reduction::kLogSumExp) {
    const std::vector<double> result = reduceDoubles(kind, asDoubles(in), plan);
    for (size_t o = 0; o < out.size(); ++o) out[o] = saturate<T>(result[o]);
  } else {
    integerAccumulate<T>(kind, in, plan, out);
  }
  return Status::ok();
}

Status runReduce(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<bool> reduced, reducedAxes(ctx));
  const ReductionPlan plan = planReduction(ctx.input(0).shape(), reduced);
  Tensor& output = ctx.output(0);
  if (output.elementCount() != plan.outputCount) {
    return internalError("{}: reduction gives {} elements, the output has {}",
                         ctx.node().describe(), plan.outputCount, output.elementCount());
  }
  const Reduction kind = reductionOf(ctx.node().opType);
  return ir::visitDType(ctx.input(0).dtype(), [&](auto tag) {
    return reduceTyped<decltype(tag)>(ctx, kind, plan, output);
  });
}

// --- ArgMax / ArgMin -------------------------------------------------------------------------

template <typename Values>
void argExtreme(const Values& values, const Lines& lines, bool isMax, bool lastOnTie,
                std::span<int64_t> out) {
  // The output, with or without the kept axis, lists the lines in (outer, inner) order.
  size_t o = 0;
  forEachLine(lines, [&](const std::vector<int64_t>& indices) {
    out[o++] = extremeIndex(values, indices, isMax, lastOnTie);
  });
}

Status runArgReduce(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  const Tensor& input = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, node.getInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, resolveAxis(ctx, rawAxis, input.rank()));
  KILN_ASSIGN_OR_RETURN(int64_t lastIndex,
                        ctx.opset() >= 12 ? node.getInt("select_last_index", 0) : 0);
  const Lines lines = linesAlong(input.shape(), axis);
  std::span<int64_t> out = ctx.output(0).mutableData<int64_t>();
  if (lines.length == 0) return Status::ok();  // inference allowed this only for empty outputs
  const bool isMax = node.opType == "ArgMax";
  return ir::visitDType(input.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (kIsFloating<T>) {
      argExtreme(asDoubles(input.data<T>()), lines, isMax, lastIndex != 0, out);
    } else if constexpr (std::is_same_v<T, bool>) {
      return ctx.unsupportedHere("bool input is not supported");
    } else {
      argExtreme(input.data<T>(), lines, isMax, lastIndex != 0, out);
    }
    return Status::ok();
  });
}

// --- Softmax / LogSoftmax / Hardmax ----------------------------------------------------------

enum class Normalizer { kSoftmax, kLogSoftmax, kHardmax };

// Normalises one line of `values` in place.
void normalizeLine(Normalizer kind, std::vector<double>& values,
                   const std::vector<int64_t>& indices) {
  if (indices.empty()) return;
  if (kind == Normalizer::kHardmax) {
    const int64_t best = extremeIndex(values, indices, true, false);
    for (size_t j = 0; j < indices.size(); ++j) {
      values[indices[j]] = static_cast<int64_t>(j) == best ? 1.0 : 0.0;
    }
    return;
  }
  // Subtracting the maximum keeps exp from overflowing; it cancels out of the result.
  double max = values[indices[0]];
  for (int64_t index : indices) max = std::max(max, values[index]);
  double sum = 0;
  for (int64_t index : indices) sum += std::exp(values[index] - max);
  for (int64_t index : indices) {
    const double shifted = values[index] - max;
    values[index] =
        kind == Normalizer::kSoftmax ? std::exp(shifted) / sum : shifted - std::log(sum);
  }
}

Status runSoftmaxLike(KernelContext& ctx) {
  const Tensor& input = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(input.rank());
  Lines lines;
  if (ctx.opset() >= 13) {
    KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
    KILN_ASSIGN_OR_RETURN(int64_t axis, resolveAxis(ctx, rawAxis, rank));
    lines = linesAlong(input.shape(), axis);
  } else {
    KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 1));
    if (axis < -rank || axis > rank) return ctx.error("axis {} is out of range", axis);
    lines = rowsFrom(input.shape(), axis < 0 ? axis + rank : axis);
  }
  const std::string& op = ctx.node().opType;
  const Normalizer kind = op == "Softmax"      ? Normalizer::kSoftmax
                          : op == "LogSoftmax" ? Normalizer::kLogSoftmax
                                               : Normalizer::kHardmax;
  return ir::visitDType(input.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (!kIsFloating<T>) {
      return ctx.unsupportedHere("{} input is not supported", ir::dtypeName(input.dtype()));
    } else {
      std::vector<double> values = asDoubles(input.data<T>());
      forEachLine(lines, [&](const std::vector<int64_t>& indices) {
        normalizeLine(kind, values, indices);
      });
      std::span<T> out = ctx.output(0).mutableData<T>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = ir::convertElement<T>(values[i]);
      return Status::ok();
    }
  });
}

// --- TopK ------------------------------------------------------------------------------------

// Selection order for TopK: by value (descending for largest), NaN after every number, and
// stable, so equal values keep the lower index first as the ONNX reference does.
template <typename V>
bool selectedBefore(V a, V b, bool largest) {
  if constexpr (std::is_floating_point_v<V>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return largest ? a > b : a < b;
}

template <typename T, typename Values>
void topK(const Values& values, std::span<const T> in, const Lines& inLines, const Lines& outLines,
          bool largest, std::span<T> outValues, std::span<int64_t> outIndices) {
  for (int64_t o = 0; o < inLines.outer; ++o) {
    for (int64_t i = 0; i < inLines.inner; ++i) {
      const std::vector<int64_t> indices = inLines.line(o, i);
      std::vector<int64_t> order(indices.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return selectedBefore(values[indices[a]], values[indices[b]], largest);
      });
      const std::vector<int64_t> targets = outLines.line(o, i);
      for (size_t j = 0; j < targets.size(); ++j) {
        outValues[targets[j]] = in[indices[order[j]]];
        outIndices[targets[j]] = order[j];
      }
    }
  }
}

Status runTopK(KernelContext& ctx) {
  const Tensor& input = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, resolveAxis(ctx, rawAxis, input.rank()));
  KILN_ASSIGN_OR_RETURN(int64_t largest, ctx.opset() >= 11 ? ctx.node().getInt("largest", 1) : 1);
  // `sorted` = 0 leaves the order unspecified, so sorted output serves both.
  const Lines inLines = linesAlong(input.shape(), axis);
  const Lines outLines = linesAlong(ctx.output(0).shape(), axis);  // K along the axis
  std::span<int64_t> indices = ctx.output(1).mutableData<int64_t>();
  return ir::visitDType(input.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    std::span<const T> in = input.data<T>();
    std::span<T> values = ctx.output(0).mutableData<T>();
    if constexpr (kIsFloating<T>) {
      topK(asDoubles(in), in, inLines, outLines, largest != 0, values, indices);
    } else if constexpr (std::is_same_v<T, bool>) {
      return ctx.unsupportedHere("bool input is not supported");
    } else {
      topK(in, in, inLines, outLines, largest != 0, values, indices);
    }
    return Status::ok();
  });
}

// --- CumSum ----------------------------------------------------------------------------------

// Running sums along each line: floating types in double, integers modulo 2^64 (numpy's
// wrap-around) narrowed at each step.
template <typename T>
void cumulativeSum(std::span<const T> in, const Lines& lines, bool exclusive, bool reverse,
                   std::span<T> out) {
  using Acc = std::conditional_t<kIsFloating<T>, double, uint64_t>;
  forEachLine(lines, [&](std::vector<int64_t> indices) {
    if (reverse) std::reverse(indices.begin(), indices.end());
    Acc sum = 0;
    for (int64_t index : indices) {
      Acc x;
      if constexpr (kIsFloating<T>) {
        x = ir::convertElement<double>(in[index]);
      } else {
        x = static_cast<uint64_t>(in[index]);
      }
      if (exclusive) out[index] = ir::convertElement<T>(sum);
      sum += x;
      if (!exclusive) out[index] = ir::convertElement<T>(sum);
    }
  });
}

Status runCumSum(KernelContext& ctx) {
  const Tensor& input = ctx.input(0);
  const Tensor& axisTensor = ctx.input(1);
  if (axisTensor.elementCount() != 1) return ctx.error("axis must hold exactly one element");
  KILN_ASSIGN_OR_RETURN(int64_t axis, resolveAxis(ctx, axisTensor.elementAsInt64(0), input.rank()));
  KILN_ASSIGN_OR_RETURN(int64_t exclusive, ctx.node().getInt("exclusive", 0));
  KILN_ASSIGN_OR_RETURN(int64_t reverse, ctx.node().getInt("reverse", 0));
  const Lines lines = linesAlong(input.shape(), axis);
  return ir::visitDType(input.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return ctx.unsupportedHere("bool input is not supported");
    } else {
      cumulativeSum<T>(input.data<T>(), lines, exclusive != 0, reverse != 0,
                       ctx.output(0).mutableData<T>());
      return Status::ok();
    }
  });
}

}  // namespace

void registerReductionKernels(KernelRegistry& registry) {
  for (const char* op :
       {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}) {
    registry.add(op, runReduce);
  }
  registry.add("ArgMax", runArgReduce);
  registry.add("ArgMin", runArgReduce);
  registry.add("Softmax", runSoftmaxLike);
  registry.add("LogSoftmax", runSoftmaxLike);
  registry.add("Hardmax", runSoftmaxLike);
  registry.add("TopK", runTopK);
  registry.add("CumSum", runCumSum);
}

}  // namespace kiln::reference
