// The CUDA backend's steps for the ops of no other family (misc.h's kernels): CumSum (constant or
// runtime axis), Einsum (every equation the reference plans), OneHot, TopK, EyeLike, Dropout with
// its mask output or a training_mode input, and ConstantOfShape and Range where they were not
// folded into constants at build time. Every factory reads the node's attributes and shapes into
// the kernel's geometry here, and refuses (nullptr: the host runs it) what the reference would
// refuse or compute otherwise.
//
// An Einsum of two float32 (float16, bfloat16) operands that is one strided batch of matrix
// products (every label a batch, row, column or summed label, each group one evenly strided run
// in every tensor, no diagonals, no label summed within one operand) runs as a MatrixProduct
// (gemm_steps.h: cuBLASLt or kiln's GEMM, float32 sums) unless cuda.einsum.impl says native;
// every other equation runs kiln's einsum kernel (double sums, as the reference).
//
// Tactics: "kiln.cumsum", "kiln.einsum", the product's ("cublaslt", "native", ...) for Einsum
// as a product, "kiln.one_hot", "kiln.topk", "kiln.eye_like", "kiln.dropout" (a copy and an
// all-true mask), "kiln.dropout.checked" (the same, after reading a runtime training_mode on the
// host: not capturable), "kiln.fill", "kiln.range".
#include <algorithm>
#include <cstring>
#include <optional>

#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/gemm_steps.h"
#include "kiln/backends/cuda/kernels/misc.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/ir/ops/neural.h"

namespace kiln::cuda {

const knobs::Knob kEinsumImpl = knobs::declareKnob({
    .name = "cuda.einsum.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"gemm", "native"},
    .defaultValue = "gemm",
    .help = "Einsum equations that are one batch of matrix products of two float operands run "
            "as a matrix product (cuda.gemm.source's kernels, float32 sums), or, with native, "
            "in kiln's einsum kernel (double sums, as the reference) like every other equation",
    .backends = {"cuda"},
    // Only the sums' precision and order differ: not a numerics change beyond rounding.
    .perNode = true,
});

const knobs::Knob kEinsumBlock = knobs::declareKnob({
    .name = "cuda.einsum.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of kiln's einsum kernel (the equations that are not one batch of "
            "matrix products, and all of them with cuda.einsum.impl=native), a thread an output "
            "element",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kOneHotBlock = knobs::declareKnob({
    .name = "cuda.onehot.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the OneHot kernel, a thread an output element",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kCumSumKernel = knobs::declareKnob({
    .name = "cuda.cumsum.kernel",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "lines"},
    .defaultValue = "auto",
    .help = "CumSum along the innermost axis: a warp a line, its lanes summing chunks and "
            "combining them with shuffles (auto), or a thread a line walking it in order (lines; "
            "what every other axis takes). Same sums, other order",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

using ir::DType;

// The element type of a number (not bool) dtype.
std::optional<ElementType> numericTypeOf(DType dtype) {
  if (dtype == DType::kBool) return std::nullopt;
  return elementTypeOf(dtype);
}

int elementSizeOf(DType dtype) { return static_cast<int>(ir::dtypeSize(dtype)); }

// The bytes of `value` converted to `dtype` (as the reference's convertElement), in the low
// bytes of a word.
uint64_t patternOf(DType dtype, double value) {
  uint64_t pattern = 0;
  ir::visitDType(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T element = ir::convertElement<T>(value);
    static_assert(sizeof(T) <= sizeof(pattern));
    std::memcpy(&pattern, &element, sizeof(T));
  });
  return pattern;
}

// --- CumSum ------------------------------------------------------------------------------------

class CumSumStep final : public Step {
 public:
  CumSumStep(CumSumParams params, ElementType type, bool runtimeAxis)
      : params_(params), type_(type), runtimeAxis_(runtimeAxis) {}

  std::string detail() const override {
    const bool warpLines =
        !runtimeAxis_ && params_.axis == params_.rank - 1 && !params_.threadLines;
    return warpLines ? "a warp a line" : "a thread a line";
  }

  Status enqueue(const Context& context) const override {
    CumSumParams params = params_;
    if (runtimeAxis_) params.axisDevice = context.address(*inputs[1]);
    KILN_CUDA_CHECK(launchCumSum(params, type_, context.address(*inputs[0]),
                                 context.address(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("cumsum");
    return Status::ok();
  }

 private:
  CumSumParams params_;
  ElementType type_;
  bool runtimeAxis_;
};

std::unique_ptr<Step> makeCumSum(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* axis = node.input(1);
  const ir::Value* y = node.outputs[0];
  const auto type = numericTypeOf(x->dtype);
  if (!type || !axis || y->dtype != x->dtype || y->shape != x->shape) return nullptr;
  if (axis->dtype != DType::kInt64 && axis->dtype != DType::kInt32) return nullptr;
  if (axis->shape.elementCount() != 1) return nullptr;
  auto exclusive = node.getInt("exclusive", 0);
  auto reverse = node.getInt("reverse", 0);
  if (!exclusive.isOk() || !reverse.isOk()) return nullptr;
  const auto& dims = x->shape.dims();
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (rank == 0) return nullptr;
  CumSumParams params;
  params.exclusive = *exclusive != 0;
  params.reverse = *reverse != 0;
  params.threadLines = route.value(kCumSumKernel, &node) == "lines";
  params.axis64 = axis->dtype == DType::kInt64;
  const bool runtimeAxis = !axis->constant;
  if (runtimeAxis) {
    // Every axis stays: which one is summed along is known only on the device.
    if (rank > kMaxMiscRank) return nullptr;
    params.rank = static_cast<int>(rank);
    for (int64_t a = 0; a < rank; ++a) params.dims[a] = dims[a];
  } else {
    auto a = ir::normalizeAxis(axis->constant->elementAsInt64(0), rank);
    if (!a.isOk()) return nullptr;
    // [outer, length, inner], or [outer, length] where the axis is innermost.
    const size_t at = static_cast<size_t>(*a);
    const int64_t inner = product(dims, at + 1, dims.size());
    params.dims[0] = product(dims, 0, at);
    params.dims[1] = dims[at];
    params.dims[2] = inner;
    params.rank = inner == 1 ? 2 : 3;
    params.axis = 1;
  }
  auto step = std::make_unique<CumSumStep>(params, *type, runtimeAxis);
  step->tactic = "kiln.cumsum";
  return step;
}

// --- Einsum ------------------------------------------------------------------------------------

class EinsumStep final : public Step {
 public:
  EinsumStep(EinsumParams params, ElementType type) : params_(params), type_(type) {}

  std::string detail() const override {
    return std::to_string(params_.blockThreads) + "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    EinsumParams params = params_;
    for (int k = 0; k < params.operands; ++k) {
      params.data[k] = context.address(*inputs[static_cast<size_t>(k)]);
    }
    KILN_CUDA_CHECK(launchEinsum(params, type_, context.address(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("einsum");
    return Status::ok();
  }

 private:
  EinsumParams params_;
  ElementType type_;
};

// --- Einsum as a matrix product ----------------------------------------------------------------

// A group of labels seen as one axis of a tensor: the product of their sizes, and the stride of
// the innermost (0 for an empty group, where any stride serves).
struct Run {
  int64_t extent = 1;
  int64_t stride = 0;
};

// The run `labels` (outermost first) form in a tensor with per-label `strides`; nullopt where
// they are not one evenly strided run there.
std::optional<Run> runOf(const std::vector<size_t>& labels, const std::vector<int64_t>& sizes,
                         const std::vector<int64_t>& strides) {
  Run run;
  for (size_t i = 0; i < labels.size(); ++i) {
    const size_t label = labels[i];
    if (i > 0 && strides[labels[i - 1]] != strides[label] * sizes[label]) return std::nullopt;
    run.extent *= sizes[label];
    run.stride = strides[label];
  }
  return run;
}

// The matrix product an Einsum is (operand `rowOperand` gives op(A), the other op(B)), where it
// is one; see the file comment.
struct EinsumProduct {
  ProductShape shape;
  size_t rowOperand = 0;
};

// Element strides of a tensor's matrix [rows, cols] from its runs: whether it is stored
// transposed, and its pitch; nullopt where neither layout is dense along a row.
std::optional<std::pair<bool, int64_t>> matrixLayout(const Run& rows, const Run& cols) {
  // Row-major [rows, cols]: columns adjacent, rows `pitch` apart.
  if (cols.extent == 1 || cols.stride == 1) {
    const int64_t pitch = rows.extent == 1 ? cols.extent : rows.stride;
    if (pitch >= cols.extent) return std::make_pair(false, pitch);
  }
  // Stored [cols, rows]: rows adjacent.
  if (rows.extent == 1 || rows.stride == 1) {
    const int64_t pitch = cols.extent == 1 ? rows.extent : cols.stride;
    if (pitch >= rows.extent) return std::make_pair(true, pitch);
  }
  return std::nullopt;
}

std::optional<EinsumProduct> einsumAsProduct(const ir::Node& node, const ir::EinsumPlan& plan) {
  if (node.inputs.size() != 2) return std::nullopt;
  const std::vector<int64_t>& sizes = plan.labelSizes;
  const size_t labelCount = sizes.size();
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return std::nullopt;
  // No diagonals: each operand's axes longer than 1 are as many as its labels longer than 1.
  for (size_t k = 0; k < 2; ++k) {
    const auto& dims = node.inputs[k]->shape.dims();
    const auto axes = std::count_if(dims.begin(), dims.end(), [](int64_t d) { return d > 1; });
    int64_t labels = 0;
    for (size_t l = 0; l < labelCount; ++l) labels += sizes[l] > 1 && plan.operandStrides[k][l];
    if (axes != labels) return std::nullopt;
  }
  // The output's strides per label (dense, row-major over the output labels).
  std::vector<int64_t> outStrides(labelCount, 0);
  int64_t stride = 1;
  for (size_t a = plan.outputLabels.size(); a-- > 0;) {
    outStrides[plan.outputLabels[a]] = stride;
    stride *= sizes[plan.outputLabels[a]];
  }
  // Labels longer than 1 by where they appear; size-1 labels move nothing.
  const auto& s0 = plan.operandStrides[0];
  const auto& s1 = plan.operandStrides[1];
  std::vector<size_t> batch, rows, cols, summed;
  for (size_t label : plan.outputLabels) {
    if (sizes[label] == 1) continue;
    const bool in0 = s0[label] != 0, in1 = s1[label] != 0;
    (in0 && in1 ? batch : in0 ? rows : cols).push_back(label);
  }
  for (size_t label : plan.summedLabels) {
    if (sizes[label] == 1) continue;
    if (s0[label] == 0 || s1[label] == 0) return std::nullopt;  // summed within one operand
    summed.push_back(label);
  }
  // Output [batch, rows, cols] with cols adjacent, or [batch, cols, rows] (then the product is
  // the transposed one, with the operands swapped).
  auto outRows = runOf(rows, sizes, outStrides), outCols = runOf(cols, sizes, outStrides);
  if (!outRows || !outCols) return std::nullopt;
  EinsumProduct product;
  if (!(outCols->extent == 1 || outCols->stride == 1)) {
    std::swap(rows, cols);
    std::swap(outRows, outCols);
    product.rowOperand = 1;
    if (!(outCols->extent == 1 || outCols->stride == 1)) return std::nullopt;
  }
  const auto& sa = plan.operandStrides[product.rowOperand];
  const auto& sb = plan.operandStrides[1 - product.rowOperand];
  std::sort(summed.begin(), summed.end(), [&](size_t x, size_t y) { return sa[x] > sa[y]; });
  auto aBatch = runOf(batch, sizes, sa), bBatch = runOf(batch, sizes, sb);
  auto outBatch = runOf(batch, sizes, outStrides);
  auto aRows = runOf(rows, sizes, sa), aSum = runOf(summed, sizes, sa);
  auto bSum = runOf(summed, sizes, sb), bCols = runOf(cols, sizes, sb);
  if (!aBatch || !bBatch || !outBatch || !aRows || !aSum || !bSum || !bCols) return std::nullopt;
  const int64_t m = outRows->extent, n = outCols->extent, k = aSum->extent;
  // The batch outermost in every tensor, its matrices dense blocks after one another.
  if (outBatch->extent > 1 &&
      (aBatch->stride != m * k || bBatch->stride != k * n || outBatch->stride != m * n)) {
    return std::nullopt;
  }
  auto a = matrixLayout(*aRows, *aSum);
  auto b = matrixLayout(*bSum, *bCols);
  const int64_t ldc = m == 1 ? n : outRows->stride;
  if (!a || !b || ldc < n) return std::nullopt;
  ProductShape& shape = product.shape;
  shape.m = m;
  shape.n = n;
  shape.k = k;
  shape.transA = a->first;
  shape.lda = a->second;
  shape.transB = b->first;
  shape.ldb = b->second;
  shape.ldc = ldc;
  shape.batch = outBatch->extent;
  if (shape.batch > 1) {
    shape.strideA = aBatch->stride;
    shape.strideB = bBatch->stride;
    shape.strideC = outBatch->stride;
  }
  return product;
}

class EinsumProductStep final : public Step {
 public:
  EinsumProductStep(const EinsumProduct& product, const ProductOptions& options)
      : product_(product.shape, options, GemmEpilogue{}, false), rowOperand_(product.rowOperand) {
    tactic = product_.tactic();
  }

  Status prepare(PrepareContext& prepare) override {
    const Context& c = prepare.context;
    KILN_RETURN_IF_ERROR(product_.prepare(prepare, a(c), b(c), c.address(*outputs[0]), nullptr));
    tactic = product_.tactic();
    return Status::ok();
  }

  int64_t workspaceBytes() const override { return product_.workspaceBytes(); }

  Status enqueue(const Context& context) const override {
    return product_.enqueue(context, context.workspace, context.workspaceBytes, a(context),
                            b(context), context.address(*outputs[0]), nullptr);
  }

 private:
  const void* a(const Context& context) const { return context.address(*inputs[rowOperand_]); }
  const void* b(const Context& context) const { return context.address(*inputs[1 - rowOperand_]); }

  MatrixProduct product_;
  size_t rowOperand_;
};

std::unique_ptr<Step> makeEinsum(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* y = node.outputs[0];
  const auto type = numericTypeOf(y->dtype);
  if (!type || node.inputs.size() > static_cast<size_t>(kMaxEinsumOperands)) return nullptr;
  std::vector<ir::Shape> shapes;
  for (const ir::Value* input : node.inputs) {
    if (!input || input->dtype != y->dtype) return nullptr;
    shapes.push_back(input->shape);
  }
  auto plan = ir::planEinsum(node, shapes);
  if (!plan.isOk() || plan->outputShape != y->shape) return nullptr;
  if (plan->outputLabels.size() > static_cast<size_t>(kMaxEinsumLabels) ||
      plan->summedLabels.size() > static_cast<size_t>(kMaxEinsumLabels)) {
    return nullptr;
  }
  if (route.value(kEinsumImpl, &node) == "gemm") {
    const std::optional<GemmType> gemmType = gemmTypeOf(y->dtype);
    std::optional<EinsumProduct> product = gemmType ? einsumAsProduct(node, *plan) : std::nullopt;
    if (product) {
      product->shape.inputType = *gemmType;
      product->shape.outputType = *gemmType;
      ProductOptions options = productOptionsFor(node, route);
      options.tf32 = false;  // cuda.precision leaves Einsum in float32 (precision.cc)
      return std::make_unique<EinsumProductStep>(*product, options);
    }
  }
  EinsumParams params;
  params.operands = static_cast<int>(node.inputs.size());
  params.outputRank = static_cast<int>(plan->outputLabels.size());
  params.summedRank = static_cast<int>(plan->summedLabels.size());
  for (int a = 0; a < params.outputRank; ++a) {
    const size_t label = plan->outputLabels[static_cast<size_t>(a)];
    params.outputExtents[a] = plan->labelSizes[label];
    for (int k = 0; k < params.operands; ++k) {
      params.outputStrides[k][a] = plan->operandStrides[static_cast<size_t>(k)][label];
    }
  }
  for (int a = 0; a < params.summedRank; ++a) {
    const size_t label = plan->summedLabels[static_cast<size_t>(a)];
    params.summedExtents[a] = plan->labelSizes[label];
    for (int k = 0; k < params.operands; ++k) {
      params.summedStrides[k][a] = plan->operandStrides[static_cast<size_t>(k)][label];
    }
  }
  params.blockThreads = std::stoi(route.value(kEinsumBlock, &node));
  auto step = std::make_unique<EinsumStep>(params, *type);
  step->tactic = "kiln.einsum";
  return step;
}

// --- OneHot ------------------------------------------------------------------------------------

class OneHotStep final : public Step {
 public:
  OneHotStep(OneHotParams params, ElementType indexType, int elementSize)
      : params_(params), indexType_(indexType), elementSize_(elementSize) {}

  std::string detail() const override {
    return std::to_string(params_.blockThreads) + "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchOneHot(params_, indexType_, context.address(*inputs[0]),
                                 context.address(*inputs[2]), context.address(*outputs[0]),
                                 elementSize_, context.stream));
    KILN_CUDA_CHECK_LAUNCH("one-hot");
    return Status::ok();
  }

 private:
  OneHotParams params_;
  ElementType indexType_;
  int elementSize_;
};

std::unique_ptr<Step> makeOneHot(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* indices = node.inputs[0];
  const ir::Value* values = node.input(2);
  const ir::Value* y = node.outputs[0];
  const auto indexType = numericTypeOf(indices->dtype);
  if (!indexType || !values || values->dtype != y->dtype || values->shape.elementCount() != 2) {
    return nullptr;
  }
  const auto& dims = y->shape.dims();
  const int64_t rank = static_cast<int64_t>(dims.size());
  auto rawAxis = node.getInt("axis", -1);
  if (!rawAxis.isOk() || rank != static_cast<int64_t>(indices->shape.rank()) + 1) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const size_t at = static_cast<size_t>(*axis);
  OneHotParams params;
  params.outer = product(dims, 0, at);
  params.depth = dims[at];
  params.inner = product(dims, at + 1, dims.size());
  params.negativeFromBack = node.opsetVersion >= 11;
  if (params.outer * params.inner != indices->shape.elementCount()) return nullptr;
  params.blockThreads = std::stoi(route.value(kOneHotBlock, &node));
  auto step = std::make_unique<OneHotStep>(params, *indexType, elementSizeOf(y->dtype));
  step->tactic = "kiln.one_hot";
  return step;
}

// --- TopK --------------------------------------------------------------------------------------

class TopKStep final : public Step {
 public:
  TopKStep(TopKParams params, ElementType type) : params_(params), type_(type) {}

  Status enqueue(const Context& context) const override {
    void* values = outputs[0] ? context.address(*outputs[0]) : nullptr;
    int64_t* indices =
        outputs.size() > 1 && outputs[1] ? context.data<int64_t>(*outputs[1]) : nullptr;
    KILN_CUDA_CHECK(
        launchTopK(params_, type_, context.address(*inputs[0]), values, indices, context.stream));
    KILN_CUDA_CHECK_LAUNCH("topk");
    return Status::ok();
  }

 private:
  TopKParams params_;
  ElementType type_;
};

std::unique_ptr<Step> makeTopK(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* values = node.outputs[0];
  const ir::Value* indices = node.outputs.size() > 1 ? node.outputs[1] : nullptr;
  const auto type = numericTypeOf(x->dtype);
  if (!type || values->dtype != x->dtype) return nullptr;
  if (indices && (indices->dtype != DType::kInt64 || indices->shape != values->shape)) {
    return nullptr;
  }
  const auto& dims = x->shape.dims();
  const int64_t rank = static_cast<int64_t>(dims.size());
  auto rawAxis = node.getInt("axis", -1);
  auto largest = node.opsetVersion >= 11 ? node.getInt("largest", 1) : Result<int64_t>(1);
  if (rank == 0 || !rawAxis.isOk() || !largest.isOk()) return nullptr;
  if (values->shape.rank() != dims.size()) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const size_t at = static_cast<size_t>(*axis);
  TopKParams params;
  params.outer = product(dims, 0, at);
  params.n = dims[at];
  params.inner = product(dims, at + 1, dims.size());
  // `sorted` = 0 leaves the order open; the sorted order serves it, as in the reference.
  params.k = values->shape[at];
  params.largest = *largest != 0;
  if (params.k > params.n ||
      params.outer * params.k * params.inner != values->shape.elementCount()) {
    return nullptr;
  }
  auto step = std::make_unique<TopKStep>(params, *type);
  step->tactic = "kiln.topk";
  return step;
}

// --- EyeLike -----------------------------------------------------------------------------------

class EyeLikeStep final : public Step {
 public:
  EyeLikeStep(int64_t rows, int64_t cols, int64_t k, uint64_t one, int elementSize)
      : rows_(rows), cols_(cols), k_(k), one_(one), elementSize_(elementSize) {}

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchEyeLike(context.address(*outputs[0]), rows_, cols_, k_, one_,
                                  elementSize_, context.stream));
    KILN_CUDA_CHECK_LAUNCH("eye-like");
    return Status::ok();
  }

 private:
  int64_t rows_, cols_, k_;
  uint64_t one_;
  int elementSize_;
};

std::unique_ptr<Step> makeEyeLike(const ir::Node& node) {
  const ir::Value* y = node.outputs[0];
  auto k = node.getInt("k", 0);
  if (y->shape.rank() != 2 || !k.isOk()) return nullptr;
  auto step = std::make_unique<EyeLikeStep>(y->shape[0], y->shape[1], *k, patternOf(y->dtype, 1.0),
                                            elementSizeOf(y->dtype));
  step->tactic = "kiln.eye_like";
  return step;
}

// --- Dropout -----------------------------------------------------------------------------------

// Inference Dropout: the output is the input, the mask (where asked for) all ones of its type
// (true). With a runtime training_mode, each run first reads it (and the ratio) back to the host
// and refuses training with a nonzero ratio, as the reference does, instead of masking at random.
class DropoutStep final : public Step {
 public:
  DropoutStep(uint64_t maskOne, bool checkTraining)
      : maskOne_(maskOne), checkTraining_(checkTraining) {}

  Status enqueue(const Context& context) const override {
    if (checkTraining_) KILN_RETURN_IF_ERROR(checkTraining(context));
    if (outputs[0]->bytes() > 0) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(context.address(*outputs[0]), context.address(*inputs[0]),
                                      static_cast<size_t>(outputs[0]->bytes()),
                                      cudaMemcpyDeviceToDevice, context.stream));
    }
    if (outputs.size() > 1 && outputs[1]) {
      const int size = elementSizeOf(outputs[1]->dtype);
      KILN_CUDA_CHECK(launchFill(context.address(*outputs[1]), outputs[1]->elements(), maskOne_,
                                 size, context.stream));
      KILN_CUDA_CHECK_LAUNCH("dropout's mask");
    }
    return Status::ok();
  }

  bool capturable() const override { return !checkTraining_; }

 private:
  // A one-element input's value, read back from the device.
  static Result<double> readScalar(const Context& context, const BufferRef& ref) {
    if (ref.constant) return ref.constant->elementAsDouble(0);
    ir::Tensor host(ref.dtype, ref.shape);
    KILN_CUDA_CHECK(cudaMemcpyAsync(host.mutableRawData(), context.address(ref),
                                    static_cast<size_t>(ref.bytes()), cudaMemcpyDeviceToHost,
                                    context.stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(context.stream));
    return host.elementAsDouble(0);
  }

  Status checkTraining(const Context& context) const {
    KILN_ASSIGN_OR_RETURN(double training, readScalar(context, *inputs[2]));
    if (training == 0) return Status::ok();
    double ratio = 0.5;  // the default where the input is omitted
    if (inputs.size() > 1 && inputs[1]) {
      KILN_ASSIGN_OR_RETURN(ratio, readScalar(context, *inputs[1]));
    }
    if (ratio == 0) return Status::ok();
    return unsupported(
        "{}: training-mode Dropout with a nonzero ratio (random masking) is not supported",
        node->describe());
  }

  uint64_t maskOne_;
  bool checkTraining_;
};

std::unique_ptr<Step> makeDropout(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const ir::Value* mask = node.outputs.size() > 1 ? node.outputs[1] : nullptr;
  if (y->dtype != x->dtype || y->shape.elementCount() != x->shape.elementCount()) return nullptr;
  if (mask && mask->shape.elementCount() != x->shape.elementCount()) return nullptr;
  bool checkTraining = false;
  if (const ir::Value* training = node.input(2)) {
    if (training->dtype != DType::kBool || training->shape.elementCount() != 1) return nullptr;
    const ir::Value* ratio = node.input(1);
    if (!training->constant) {
      checkTraining = true;
    } else if (training->constant->elementAsDouble(0) != 0) {
      // Training mode: an identity only with ratio 0; a known nonzero ratio is the reference's
      // refusal, left to it.
      if (!ratio) return nullptr;
      if (!ratio->constant) {
        checkTraining = true;
      } else if (ratio->constant->elementAsDouble(0) != 0) {
        return nullptr;
      }
    }
  }
  const uint64_t maskOne = mask ? patternOf(mask->dtype, 1.0) : 0;
  auto step = std::make_unique<DropoutStep>(maskOne, checkTraining);
  step->tactic = checkTraining ? "kiln.dropout.checked" : "kiln.dropout";
  return step;
}

// --- ConstantOfShape and Range (where not folded at build time) ----------------------------------

class FillStep final : public Step {
 public:
  explicit FillStep(uint64_t pattern) : pattern_(pattern) {}

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchFill(context.address(*outputs[0]), outputs[0]->elements(), pattern_,
                               elementSizeOf(outputs[0]->dtype), context.stream));
    KILN_CUDA_CHECK_LAUNCH("fill");
    return Status::ok();
  }

 private:
  uint64_t pattern_;
};

std::unique_ptr<Step> makeConstantOfShape(const ir::Node& node) {
  const ir::Value* y = node.outputs[0];
  uint64_t pattern = 0;  // float zeros where the value attribute is absent
  if (node.hasAttribute("value")) {
    auto value = node.getTensor("value");
    if (!value.isOk() || value->elementCount() != 1 || value->dtype() != y->dtype) return nullptr;
    std::memcpy(&pattern, value->rawData(), value->byteSize());
  }
  auto step = std::make_unique<FillStep>(pattern);
  step->tactic = "kiln.fill";
  return step;
}

class RangeStep final : public Step {
 public:
  RangeStep(RangeParams params, ElementType type) : params_(params), type_(type) {}

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchRange(params_, type_, context.address(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("range");
    return Status::ok();
  }

 private:
  RangeParams params_;
  ElementType type_;
};

std::unique_ptr<Step> makeRange(const ir::Node& node) {
  const ir::Value* start = node.input(0);
  const ir::Value* delta = node.input(2);
  const ir::Value* y = node.outputs[0];
  // Shape inference needs every input constant (the output's length depends on them).
  if (!start || !delta || !start->constant || !delta->constant) return nullptr;
  const auto type = numericTypeOf(y->dtype);
  if (!type || y->shape.rank() != 1) return nullptr;
  if (*type != ElementType::kFloat32 && *type != ElementType::kFloat64 &&
      *type != ElementType::kInt16 && *type != ElementType::kInt32 &&
      *type != ElementType::kInt64) {
    return nullptr;
  }
  RangeParams params;
  params.count = y->shape.elementCount();
  params.start = start->constant->elementAsDouble(0);
  params.delta = delta->constant->elementAsDouble(0);
  params.startInt = start->constant->elementAsInt64(0);
  params.deltaInt = delta->constant->elementAsInt64(0);
  auto step = std::make_unique<RangeStep>(params, *type);
  step->tactic = "kiln.range";
  return step;
}

// --- The factory -------------------------------------------------------------------------------

std::unique_ptr<Step> makeMiscStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.outputs.empty() || !node.outputs[0]) return nullptr;
  for (const ir::Value* output : node.outputs) {
    if (output && output->constant) return nullptr;
  }
  const std::string& op = node.opType;
  if (op == "ConstantOfShape") return makeConstantOfShape(node);
  if (op == "Range") return makeRange(node);
  if (node.inputs.empty() || !node.inputs[0]) return nullptr;
  if (op == "CumSum") return makeCumSum(node, route);
  if (op == "Einsum") return makeEinsum(node, route);
  if (op == "OneHot") return makeOneHot(node, route);
  if (op == "TopK") return makeTopK(node);
  if (op == "EyeLike") return makeEyeLike(node);
  if (op == "Dropout") return makeDropout(node);
  return nullptr;
}

const int kRegistered = registerStepFactory(kRankMisc, "misc", makeMiscStep);

}  // namespace
}  // namespace kiln::cuda
