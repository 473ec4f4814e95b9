// Gemm, MatMul and kiln.FusedGemm on the GPU, in float32, float16 or bfloat16 (every input and the
// output of one type; sums in float32): each node becomes one MatrixProduct (gemm_steps.h), from
// cuBLASLt or kiln's native kernel as cuda.gemm.source says.
//
//   - Gemm (and FusedGemm, whose A may be batched [..., K] with transA=0: its rows are contiguous,
//     so it is one [rows, K] product): alpha scales the product, C is the epilogue's bias
//     broadcast over [M, N] with scale beta, FusedGemm's activation follows.
//   - MatMul: numpy broadcasting. A 2-D (or 1-D) right operand, or one whose batch dimensions are
//     all 1, folds the left operand's batch into M (one product); equal batch dimensions make a
//     strided batch; a left operand whose batch dimensions are all 1 (or absent) is shared by
//     every batch entry (stride 0). Other broadcasts (some dimensions of each side 1) are left to
//     the next factory.
//
// Tactics: MatrixProduct::tactic() ("cublaslt", "cublaslt.timed", "native", with "+epilogue"
// when kiln's epilogue kernel runs after the product).
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/cuda/kernels/gemm_steps.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/backends/cuda/precision.h"
#include "kiln/ir/op_schema.h"

namespace kiln::cuda {

const knobs::Knob kGemmSource = knobs::declareKnob({
    .name = "cuda.gemm.source",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"cublaslt", "native"},
    .defaultValue = "cublaslt",
    .help = "matrix products (Gemm, MatMul, FusedGemm, Attention's two products): cuBLASLt with "
            "fp32 compute (empty sums and sizes beyond int32 still run kiln's kernel), or kiln's "
            "own tiled GEMM kernel",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmAlgo = knobs::declareKnob({
    .name = "cuda.gemm.algo",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"heuristic", "timed"},
    .defaultValue = "heuristic",
    .help = "cuBLASLt algorithm choice: the one its heuristics rank first, or the fastest of up "
            "to eight of them, timed on the step's buffers when the plan is prepared",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmEpilogue = knobs::declareKnob({
    .name = "cuda.gemm.epilogue",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fused", "separate"},
    .defaultValue = "fused",
    .help = "bias and activation of a matrix product: inside cuBLASLt's epilogue where it "
            "computes them exactly (or in the native kernel's stores), or all in kiln's epilogue "
            "kernel after the bare product",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmWorkspace = knobs::declareKnob({
    .name = "cuda.gemm.workspace",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"32", "0", "4", "128"},
    .defaultValue = "32",
    .help = "MiB of scratch a cuBLASLt algorithm may ask for: its heuristics offer only "
            "algorithms within it (0 rules out split-K reductions in workspace; more admits "
            "wider splits)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmCandidates = knobs::declareKnob({
    .name = "cuda.gemm.candidates",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"8", "2", "4", "16"},
    .defaultValue = "8",
    .help = "how many of cuBLASLt's algorithms cuda.gemm.algo=timed times, in its heuristics' "
            "order (more: a longer build and a better chance of the fastest)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmTimingRuns = knobs::declareKnob({
    .name = "cuda.gemm.timing_runs",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"3", "1", "10"},
    .defaultValue = "3",
    .help = "timed runs of each cuBLASLt algorithm under cuda.gemm.algo=timed, after one "
            "untimed run (more: less noise in the choice, a longer build)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmSplitK = knobs::declareKnob({
    .name = "cuda.gemm.split_k",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"allow", "deny"},
    .defaultValue = "allow",
    .help = "cuBLASLt algorithms that split the sum over k across blocks and reduce the parts "
            "(in place or in workspace): allowed where the heuristics offer them, or passed "
            "over, so each output is one block's sequential sum",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmGeluEpilogue = knobs::declareKnob({
    .name = "cuda.gemm.gelu_epilogue",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"exact", "tanh"},
    .defaultValue = "exact",
    .help = "a matrix product followed by GELU (erf form, as transformers' feed-forward layers "
            "export it): the activation in kiln's epilogue kernel, exact, or inside cuBLASLt's "
            "GELU epilogue, which computes the tanh approximation (no extra pass over the "
            "output)",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kGemmAlgoRank = knobs::declareKnob({
    .name = "cuda.gemm.algo_rank",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"0", "1", "2", "3"},
    .defaultValue = "0",
    .help = "under cuda.gemm.algo=heuristic, which of cuBLASLt's algorithms (in its heuristics' "
            "order) a product takes: the first, or the second, third or fourth (the last it "
            "offers where it offers fewer)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmEpilogueBlock = knobs::declareKnob({
    .name = "cuda.gemm.epilogue.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of kiln's GEMM epilogue kernel (the bias and activation cuBLASLt "
            "does not compute: all of them with cuda.gemm.epilogue=separate), a 16-byte pack of "
            "a row a thread",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmFoldBatch = knobs::declareKnob({
    .name = "cuda.gemm.fold_batch",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "a MatMul whose right operand is one matrix (a projection of [batch, rows, K] "
            "activations) folds the left operand's batch into its rows: one [batch * rows, K] "
            "product; off runs it as a strided batch of products sharing the right matrix",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kGemmNativeBelow = knobs::declareKnob({
    .name = "cuda.gemm.native_below",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"0", "16384", "262144"},
    .defaultValue = "0",
    .help = "products of fewer multiply-adds (m n k, times the batch) than this run kiln's tiled "
            "kernel instead of cuBLASLt, whose per-call cost can outweigh tiny problems (the "
            "fully connected layers of squeeze-excite blocks); 0: none",
    .backends = {"cuda"},
    .perNode = true,
});

ProductOptions productOptionsFor(const ir::Node& node, const knobs::Route& route) {
  ProductOptions options;
  options.source = route.value(kGemmSource, &node) == "native" ? ProductSource::kNative
                                                               : ProductSource::kCublasLt;
  options.algorithm = route.value(kGemmAlgo, &node) == "timed" ? AlgorithmChoice::kTimed
                                                               : AlgorithmChoice::kHeuristic;
  options.fuseEpilogue = route.value(kGemmEpilogue, &node) == "fused";
  options.tf32 = allowsTf32(node, route);
  options.maxWorkspace = uint64_t{std::stoul(route.value(kGemmWorkspace, &node))} << 20;
  options.candidates = std::stoi(route.value(kGemmCandidates, &node));
  options.timingRuns = std::stoi(route.value(kGemmTimingRuns, &node));
  options.splitK = route.value(kGemmSplitK, &node) == "allow";
  options.geluAsTanh = route.value(kGemmGeluEpilogue, &node) == "tanh";
  options.algoRank = std::stoi(route.value(kGemmAlgoRank, &node));
  options.nativeBelow = std::stod(route.value(kGemmNativeBelow, &node));
  options.epilogueBlock = std::stoi(route.value(kGemmEpilogueBlock, &node));
  return options;
}

namespace {

// What a node asks for: the product, its epilogue, and which input (if any) is the bias.
struct ProductProblem {
  ProductShape shape;
  GemmEpilogue epilogue;
  int biasInput = -1;
};

// The storage type the node's one output and all its inputs share, if it is one the products
// take.
std::optional<GemmType> sharedType(const ir::Node& node) {
  if (node.outputs.size() != 1 || !node.outputs[0]) return std::nullopt;
  const ir::DType dtype = node.outputs[0]->dtype;
  for (const ir::Value* v : node.inputs) {
    if (v && v->dtype != dtype) return std::nullopt;
  }
  return gemmTypeOf(dtype);
}

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t i = begin; i < end; ++i) result *= dims[i];
  return result;
}

// FusedGemm's `activation` attributes (fused.cc) as the epilogue's; nullopt for an unknown one
// or a malformed parameter.
std::optional<GemmEpilogue> readActivation(const ir::Node& node) {
  GemmEpilogue epilogue;
  if (!node.hasAttribute("activation")) return epilogue;
  auto name = node.getString("activation", "");
  if (!name.isOk()) return std::nullopt;
  struct Entry {
    const char* name;
    GemmActivation activation;
    float alpha, beta;  // the ONNX op's defaults
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  static const Entry kEntries[] = {
      {"Relu", kGemmActivationRelu, 0, 0},
      {"LeakyRelu", kGemmActivationLeakyRelu, 0.01f, 0},
      {"Clip", kGemmActivationClip, -kInf, kInf},
      {"Sigmoid", kGemmActivationSigmoid, 0, 0},
      {"HardSigmoid", kGemmActivationHardSigmoid, 0.2f, 0.5f},
      {"HardSwish", kGemmActivationHardSwish, 0, 0},
      {"Tanh", kGemmActivationTanh, 0, 0},
      {"Gelu", kGemmActivationGelu, 0, 0},
      {"GeluTanh", kGemmActivationGeluTanh, 0, 0},
      {"Silu", kGemmActivationSilu, 0, 0},
  };
  for (const Entry& entry : kEntries) {
    if (*name != entry.name) continue;
    auto alpha = node.getFloat("activation_alpha", entry.alpha);
    auto beta = node.getFloat("activation_beta", entry.beta);
    if (!alpha.isOk() || !beta.isOk()) return std::nullopt;
    epilogue.activation = entry.activation;
    epilogue.activationAlpha = *alpha;
    epilogue.activationBeta = *beta;
    return epilogue;
  }
  return std::nullopt;
}

// Gemm and FusedGemm: Y [..., N] = activation(alpha * op(A) · op(B) + beta * C).
std::optional<ProductProblem> readGemm(const ir::Node& node, bool fused) {
  auto transA = node.getInt("transA", 0), transB = node.getInt("transB", 0);
  auto alpha = node.getFloat("alpha", 1.0f), beta = node.getFloat("beta", 1.0f);
  if (!transA.isOk() || !transB.isOk() || !alpha.isOk() || !beta.isOk()) return std::nullopt;
  const ir::Value* a = node.input(0);
  const ir::Value* b = node.input(1);
  const ir::Value* y = node.outputs[0];
  if (!a || !b || node.inputs.size() > 3) return std::nullopt;
  const size_t rank = a->shape.rank();
  if (b->shape.rank() != 2 || rank < 2 || (rank > 2 && (!fused || *transA != 0))) {
    return std::nullopt;
  }
  ProductProblem p;
  if (fused) {
    std::optional<GemmEpilogue> epilogue = readActivation(node);
    if (!epilogue) return std::nullopt;
    p.epilogue = *epilogue;
  }
  ProductShape& s = p.shape;
  s.transA = *transA != 0;
  s.transB = *transB != 0;
  s.alpha = *alpha;
  const auto& yDims = y->shape.dims();
  if (yDims.empty()) return std::nullopt;
  s.n = yDims.back();
  s.m = product(yDims, 0, yDims.size() - 1);  // a batched A's rows fold into M
  s.k = s.transA ? a->shape[0] : a->shape[rank - 1];
  if ((s.transB ? b->shape[1] : b->shape[0]) != s.k ||
      (s.transB ? b->shape[0] : b->shape[1]) != s.n) {
    return std::nullopt;
  }
  if (const ir::Value* c = node.input(2)) {
    // C broadcast (unidirectionally) over [M, N]: stride 0 along its axes of extent 1.
    const ir::Shape& cs = c->shape;
    GemmEpilogue& e = p.epilogue;
    if (cs.rank() == 1) {
      if (cs[0] != 1 && cs[0] != s.n) return std::nullopt;
      e.biasColumnStride = cs[0] == 1 ? 0 : 1;
    } else if (cs.rank() == 2) {
      if (rank > 2 || (cs[0] != 1 && cs[0] != s.m) || (cs[1] != 1 && cs[1] != s.n)) {
        return std::nullopt;
      }
      e.biasRowStride = cs[0] == 1 ? 0 : cs[1];
      e.biasColumnStride = cs[1] == 1 ? 0 : 1;
    } else if (cs.rank() != 0) {
      return std::nullopt;
    }
    e.biasScale = *beta;
    p.biasInput = 2;
  }
  return p;
}

// MatMul with numpy promotion of 1-D operands and broadcasting of batch dimensions.
std::optional<ProductProblem> readMatMul(const ir::Node& node, bool foldBatch) {
  const ir::Value* a = node.input(0);
  const ir::Value* b = node.input(1);
  if (!a || !b || node.inputs.size() != 2) return std::nullopt;
  std::vector<int64_t> aDims = a->shape.dims();
  std::vector<int64_t> bDims = b->shape.dims();
  if (aDims.empty() || bDims.empty()) return std::nullopt;
  if (aDims.size() == 1) aDims.insert(aDims.begin(), 1);
  if (bDims.size() == 1) bDims.push_back(1);
  ProductProblem p;
  ProductShape& s = p.shape;
  s.m = aDims[aDims.size() - 2];
  s.k = aDims.back();
  s.n = bDims.back();
  if (bDims[bDims.size() - 2] != s.k) return std::nullopt;
  const std::vector<int64_t> aBatch(aDims.begin(), aDims.end() - 2);
  const std::vector<int64_t> bBatch(bDims.begin(), bDims.end() - 2);
  const int64_t aEntries = product(aBatch, 0, aBatch.size());
  const int64_t bEntries = product(bBatch, 0, bBatch.size());
  const bool aShared = aEntries == 1;  // all batch dimensions 1 (or none)
  const bool bShared = bEntries == 1;
  if (bShared && (foldBatch || aEntries == 1)) {
    // One right matrix: the left operand's rows, batch included, are one [rows, K] matrix.
    s.m *= aEntries;
    return p;
  }
  if (bShared) {
    // cuda.gemm.fold_batch=off: a strided batch, every entry multiplying the same right matrix.
    s.batch = aEntries;
    s.strideA = s.m * s.k;
    s.strideC = s.m * s.n;
    return p;  // strideB 0
  }
  s.batch = bEntries;
  s.strideB = s.k * s.n;
  s.strideC = s.m * s.n;
  if (aShared) return p;  // strideA 0: every entry multiplies the same left matrix
  // Both batched: only the same batch dimensions (after numpy's left padding with 1s).
  const size_t batchRank = std::max(aBatch.size(), bBatch.size());
  for (size_t i = 0; i < batchRank; ++i) {
    const int64_t ad = i + aBatch.size() >= batchRank ? aBatch[i + aBatch.size() - batchRank] : 1;
    const int64_t bd = i + bBatch.size() >= batchRank ? bBatch[i + bBatch.size() - batchRank] : 1;
    if (ad != bd) return std::nullopt;
  }
  s.strideA = s.m * s.k;
  return p;
}

class ProductStep final : public Step {
 public:
  ProductStep(const ProductProblem& problem, const ProductOptions& options)
      : product_(problem.shape, options, problem.epilogue, problem.biasInput >= 0),
        biasInput_(problem.biasInput) {
    tactic = product_.tactic();
  }

  Status prepare(PrepareContext& prepare) override {
    const Context& c = prepare.context;
    KILN_RETURN_IF_ERROR(product_.prepare(prepare, c.address(*inputs[0]), c.address(*inputs[1]),
                                          c.address(*outputs[0]), bias(c)));
    tactic = product_.tactic();
    return Status::ok();
  }

  int64_t workspaceBytes() const override { return product_.workspaceBytes(); }
  std::string detail() const override { return product_.detail(); }

  Status enqueue(const Context& context) const override {
    return product_.enqueue(context, context.workspace, context.workspaceBytes,
                            context.address(*inputs[0]), context.address(*inputs[1]),
                            context.address(*outputs[0]), bias(context));
  }

 private:
  const void* bias(const Context& context) const {
    if (biasInput_ < 0) return nullptr;
    return context.address(*inputs[static_cast<size_t>(biasInput_)]);
  }

  MatrixProduct product_;
  int biasInput_;
};

std::unique_ptr<Step> makeProductStep(const ir::Node& node, const knobs::Route& route) {
  const bool fused = node.domain == ir::kKilnDomain && node.opType == "FusedGemm";
  const bool onnx = node.domain.empty() && (node.opType == "Gemm" || node.opType == "MatMul");
  if (!fused && !onnx) return nullptr;
  const std::optional<GemmType> type = sharedType(node);
  if (!type) return nullptr;
  std::optional<ProductProblem> problem =
      node.opType == "MatMul" ? readMatMul(node, route.value(kGemmFoldBatch, &node) == "on")
                              : readGemm(node, fused);
  if (!problem) return nullptr;
  problem->shape.inputType = *type;
  problem->shape.outputType = *type;
  return std::make_unique<ProductStep>(*problem, productOptionsFor(node, route));
}

const int kRegistered = registerStepFactory(kRankGemm, "gemm", makeProductStep);

}  // namespace
}  // namespace kiln::cuda
