// Reference kernels for Gemm, MatMul and Einsum: float types accumulate in double, integers in
// wrapping 64-bit arithmetic.
#include <array>

#include "kiln/ir/op_schema.h"
#include "kiln/reference/kernels/broadcast.h"
#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

namespace {

template <typename T>
void gemm(const Tensor& a, const Tensor& b, const Tensor* c, bool transA, bool transB, double alpha,
          double beta, Tensor& y) {
  using Acc = AccumulatorOf<T>;
  const int64_t m = y.shape()[0];
  const int64_t n = y.shape()[1];
  const int64_t k = transA ? a.shape()[0] : a.shape()[1];
  auto as = a.data<T>();
  auto bs = b.data<T>();
  auto out = y.mutableData<T>();
  // C's element for each output position, under unidirectional broadcasting.
  std::vector<Acc> bias(static_cast<size_t>(m * n), Acc{});
  if (c) {
    auto cs = c->data<T>();
    forEachBroadcastIndex<1>(y.shape(), {c->shape()},
                             [&](int64_t o, const std::array<int64_t, 1>& in) {
                               bias[static_cast<size_t>(o)] = widen(cs[static_cast<size_t>(in[0])]);
                             });
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      Acc sum{};
      for (int64_t p = 0; p < k; ++p) {
        const int64_t aIndex = transA ? p * m + i : i * k + p;
        const int64_t bIndex = transB ? j * k + p : p * n + j;
        sum += widen(as[static_cast<size_t>(aIndex)]) * widen(bs[static_cast<size_t>(bIndex)]);
      }
      const size_t o = static_cast<size_t>(i * n + j);
      if constexpr (kFloatLike<T>) {
        out[o] = narrow<T>(alpha * sum + beta * bias[o]);
      } else {
        out[o] = narrow<T>(sum + bias[o]);  // alpha = beta = 1, checked by the caller
      }
    }
  }
}

Status runGemm(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  KILN_ASSIGN_OR_RETURN(int64_t transA, node.getInt("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t transB, node.getInt("transB", 0));
  KILN_ASSIGN_OR_RETURN(float alpha, node.getFloat("alpha", 1.0f));
  KILN_ASSIGN_OR_RETURN(float beta, node.getFloat("beta", 1.0f));
  const Tensor& a = ctx.input(0);
  if (!ir::isFloating(a.dtype()) && (alpha != 1.0f || beta != 1.0f)) {
    return ctx.unsupportedHere("integer Gemm with alpha={} and beta={} (only 1 and 1)", alpha,
                               beta);
  }
  const Tensor* c = ctx.optionalInput(2);
  Tensor& y = ctx.output(0);
  ir::visitDType(a.dtype(), [&](auto tag) {
    gemm<decltype(tag)>(a, ctx.input(1), c, transA != 0, transB != 0, alpha, beta, y);
  });
  return Status::ok();
}

// numpy matmul: vectors promoted to a row (A) or column (B), batch axes broadcast.
template <typename T>
void matmul(const Tensor& a, const Tensor& b, Tensor& y) {
  using Acc = AccumulatorOf<T>;
  std::vector<int64_t> aDims = a.shape().dims();
  std::vector<int64_t> bDims = b.shape().dims();
  if (aDims.size() == 1) aDims.insert(aDims.begin(), 1);
  if (bDims.size() == 1) bDims.push_back(1);
  const int64_t m = aDims[aDims.size() - 2];
  const int64_t k = aDims[aDims.size() - 1];
  const int64_t n = bDims[bDims.size() - 1];
  const Shape aBatch(std::vector<int64_t>(aDims.begin(), aDims.end() - 2));
  const Shape bBatch(std::vector<int64_t>(bDims.begin(), bDims.end() - 2));
  const Shape batch = ir::broadcastShapes(aBatch, bBatch).value();
  auto as = a.data<T>();
  auto bs = b.data<T>();
  auto out = y.mutableData<T>();
  forEachBroadcastIndex<2>(batch, {aBatch, bBatch},
                           [&](int64_t o, const std::array<int64_t, 2>& in) {
                             const int64_t aBase = in[0] * m * k;
                             const int64_t bBase = in[1] * k * n;
                             const int64_t outBase = o * m * n;
                             for (int64_t i = 0; i < m; ++i) {
                               for (int64_t j = 0; j < n; ++j) {
                                 Acc sum{};
                                 for (int64_t p = 0; p < k; ++p) {
                                   sum += widen(as[static_cast<size_t>(aBase + i * k + p)]) *
                                          widen(bs[static_cast<size_t>(bBase + p * n + j)]);
                                 }
                                 out[static_cast<size_t>(outBase + i * n + j)] = narrow<T>(sum);
                               }
                             }
                           });
}

Status runMatMul(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  Tensor& y = ctx.output(0);
  ir::visitDType(a.dtype(), [&](auto tag) { matmul<decltype(tag)>(a, ctx.input(1), y); });
  return Status::ok();
}

// Walks every combination of label values, output labels outermost, so each output element's
// terms are consecutive; the operands' offsets advance with the odometer.
template <typename T>
void einsum(const ir::EinsumPlan& plan, const std::vector<const Tensor*>& operands, Tensor& y) {
  using Acc = AccumulatorOf<T>;
  std::vector<size_t> order = plan.outputLabels;
  order.insert(order.end(), plan.summedLabels.begin(), plan.summedLabels.end());
  std::vector<int64_t> extent;
  for (size_t label : order) extent.push_back(plan.labelSizes[label]);
  int64_t terms = 1;
  for (size_t label : plan.summedLabels) terms *= plan.labelSizes[label];
  auto out = y.mutableData<T>();
  if (terms == 0 || out.empty()) return;  // every sum is empty: the output stays zero

  std::vector<std::span<const T>> data;
  for (const Tensor* operand : operands) data.push_back(operand->data<T>());
  std::vector<int64_t> counter(order.size(), 0);
  std::vector<int64_t> offsets(operands.size(), 0);
  Acc sum{};
  for (int64_t t = 0;; ++t) {
    Acc term = widen(data[0][static_cast<size_t>(offsets[0])]);
    for (size_t k = 1; k < data.size(); ++k)
      term *= widen(data[k][static_cast<size_t>(offsets[k])]);
    sum += term;
    if ((t + 1) % terms == 0) {
      out[static_cast<size_t>(t / terms)] = narrow<T>(sum);
      sum = Acc{};
    }
    size_t axis = order.size();
    while (axis-- > 0) {
      const size_t label = order[axis];
      ++counter[axis];
      for (size_t k = 0; k < offsets.size(); ++k) offsets[k] += plan.operandStrides[k][label];
      if (counter[axis] < extent[axis]) break;
      for (size_t k = 0; k < offsets.size(); ++k) {
        offsets[k] -= plan.operandStrides[k][label] * counter[axis];
      }
      counter[axis] = 0;
    }
    if (axis == static_cast<size_t>(-1)) break;  // the odometer wrapped: every term is done
  }
}

Status runEinsum(KernelContext& ctx) {
  std::vector<Shape> shapes;
  std::vector<const Tensor*> operands;
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    shapes.push_back(ctx.input(i).shape());
    operands.push_back(&ctx.input(i));
  }
  KILN_ASSIGN_OR_RETURN(ir::EinsumPlan plan, ir::planEinsum(ctx.node(), shapes));
  Tensor& y = ctx.output(0);
  ir::visitDType(y.dtype(), [&](auto tag) { einsum<decltype(tag)>(plan, operands, y); });
  return Status::ok();
}

}  // namespace

void registerLinearAlgebraKernels(KernelRegistry& registry) {
  registry.add("Gemm", runGemm);
  registry.add("MatMul", runMatMul);
  registry.add("Einsum", runEinsum);
}

}  // namespace kiln::reference
