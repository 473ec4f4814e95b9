// Matrix products (MatMul, Gemm, kiln.FusedGemm) in float32 or bfloat16, through sgemm() (OpenBLAS,
// or kiln's native packed SGEMM; sgemm.h).
//
// MatMul with a 2-D right operand runs as one product over all of the left operand's batch rows
// ([..., M, K] is contiguous as [batch*M, K]); batched right operands run one product per batch
// entry, with numpy broadcasting of the batch dimensions, spread over the threads together.
// A constant right operand (a weight) of a native product is packed once at build time.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/cpu/kernels/epilogue.h"
#include "kiln/backends/cpu/kernels/sgemm.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"

namespace kiln::cpu {

const knobs::Knob kGemmSource = knobs::declareKnob({
    .name = "cpu.gemm.source",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"blas", "native", "reference"},
    .defaultValue = "native",
    .help = "tactic source for MatMul, Gemm and the GEMM of convolutions: kiln's packed native "
            "SGEMM, OpenBLAS sgemm, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmPrecision = knobs::declareKnob({
    .name = "cpu.gemm.precision",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fp32", "bf16"},
    .defaultValue = "fp32",
    .help = "MatMul/Gemm arithmetic: float32, or operands rounded to bfloat16 with float32 sums "
            "(always on the native kernels; vdpbf16ps where the CPU has AVX512_BF16)",
    .backends = {"cpu"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kGemmKc = knobs::declareKnob({
    .name = "cpu.gemm.kc",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"128", "256", "384", "512"},
    .defaultValue = std::to_string(kDefaultGemmKc),
    .help = "depth (k) of the native SGEMM's packed panels: the B sliver kept in L1 per tile",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmPrepack = knobs::declareKnob({
    .name = "cpu.gemm.prepack",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "pack a native GEMM's constant right operand (its weights) once at build time "
            "instead of on every run",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmKernel = knobs::declareKnob({
    .name = "cpu.gemm.kernel",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "avx512", "avx2", "portable"},
    .defaultValue = "auto",
    .help = "micro-kernel of the native SGEMM: auto takes the best this CPU runs; avx512 forces "
            "the AVX-512 kernel (bf16 products emulated on float32 FMAs); avx2 forces the AVX2 "
            "kernel; portable forces the plain C++ kernel; a kernel the CPU lacks falls back to "
            "auto, and the tactic says so",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmBlockA = knobs::declareKnob({
    .name = "cpu.gemm.block_a",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"96", "192", "384", "768"},
    .defaultValue = std::to_string(kDefaultGemmBlockAKiB),
    .help = "KiB of packed A per block of the native SGEMM, which sets its mc rows: 96 and 192 "
            "fit smaller L2 caches; 384 fills most of a 512 KiB+ L2; 768 suits a 1 MiB+ L2",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmBlockB = knobs::declareKnob({
    .name = "cpu.gemm.block_b",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1024", "4096", "16384"},
    .defaultValue = std::to_string(kDefaultGemmBlockBKiB),
    .help = "KiB of packed B per block of the native SGEMM, which sets its nc columns: 1024 "
            "keeps a block in a small shared cache; 4096 suits a mid-sized one; 16384 packs "
            "wider blocks for a large one",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmSplit = knobs::declareKnob({
    .name = "cpu.gemm.split",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "rows", "columns"},
    .defaultValue = "auto",
    .help = "how a native product divides among threads: auto picks the grid of row and column "
            "bands of least cost; rows cuts only along m (each task packs all of B); columns "
            "cuts only along n (each task packs all of A)",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kGemmEpilogue = knobs::declareKnob({
    .name = "cpu.gemm.epilogue",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"after", "tiles"},
    .defaultValue = "after",
    .help = "where a native FusedGemm applies its activation: after runs it over the whole "
            "output once the product is done; tiles runs it on each block of C as soon as the "
            "block is final, while it is still in cache",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

GemmKernel gemmKernelNamed(const std::string& name) {
  if (name == "avx512") return GemmKernel::kAvx512;
  if (name == "avx2") return GemmKernel::kAvx2;
  if (name == "portable") return GemmKernel::kPortable;
  return GemmKernel::kAuto;
}

GemmSplit gemmSplitNamed(const std::string& name) {
  if (name == "rows") return GemmSplit::kRows;
  if (name == "columns") return GemmSplit::kColumns;
  return GemmSplit::kAuto;
}

}  // namespace

GemmSource gemmSourceFor(const ir::Node& node, const knobs::Route& route) {
  return route.value(kGemmSource, &node) == "native" ? GemmSource::kNative : GemmSource::kBlas;
}

GemmOptions gemmOptionsFor(const ir::Node& node, const knobs::Route& route) {
  const GemmKernel kernel = gemmKernelNamed(route.value(kGemmKernel, &node));
  return {
      .source = gemmSourceFor(node, route),
      .precision = route.value(kGemmPrecision, &node) == "bf16" ? GemmPrecision::kBf16
                                                                : GemmPrecision::kFp32,
      .kc = std::stoll(route.value(kGemmKc, &node)),
      // A kernel this CPU lacks runs as auto; the step's tactic names the one it asked for.
      .kernel = gemmKernelSupported(kernel) ? kernel : GemmKernel::kAuto,
      .blockAKiB = std::stoll(route.value(kGemmBlockA, &node)),
      .blockBKiB = std::stoll(route.value(kGemmBlockB, &node)),
      .split = gemmSplitNamed(route.value(kGemmSplit, &node)),
  };
}

namespace {

bool allFloat32(const ir::Node& node) {
  for (const ir::Value* v : node.inputs) {
    if (v && v->dtype != ir::DType::kFloat32) return false;
  }
  for (const ir::Value* v : node.outputs) {
    if (v && v->dtype != ir::DType::kFloat32) return false;
  }
  return true;
}

// Runs `count` elements of `data` through the epilogue, split over the pool (it is elementwise).
void applyEpilogue(const Epilogue& epilogue, float* data, int64_t count, ThreadPool& pool) {
  if (epilogue.empty()) return;
  pool.parallelFor(count, /*grain=*/16384, [&](int64_t begin, int64_t end) {
    epilogue.apply(data + begin, end - begin, nullptr);
  });
}

// How a step multiplies: its GEMM options and, for a constant right operand of a native
// product, that operand packed at build time.
struct GemmPlan {
  GemmOptions options;
  std::optional<PackedGemmB> packedB;

  void run(const GemmArgs& args, ThreadPool& pool) const {
    if (packedB) {
      sgemm(args, *packedB, pool);
    } else {
      sgemm(options, args, pool);
    }
  }
};

class MatMulStep : public Step {
 public:
  explicit MatMulStep(GemmPlan plan) : plan_(std::move(plan)) {}

  Status run(const ExecutionContext& context) const override {
    const BufferRef& a = *inputs[0];
    const BufferRef& b = *inputs[1];
    const BufferRef& y = *outputs[0];
    // 1-D operands are promoted as numpy does; the output's shape already says the result.
    const int64_t k = a.shape.rank() == 1 ? a.shape[0] : a.shape[a.shape.rank() - 1];
    const int64_t n = b.shape.rank() == 1 ? 1 : b.shape[b.shape.rank() - 1];
    const float* A = context.data<float>(a);
    const float* B = context.data<float>(b);
    float* Y = context.data<float>(y);
    if (b.shape.rank() <= 2) {
      const int64_t rows = a.shape.elementCount() / std::max<int64_t>(k, 1);
      plan_.run({.m = rows, .n = n, .k = k, .a = A, .lda = k, .b = B, .ldb = n, .c = Y, .ldc = n},
                context.pool());
      return Status::ok();
    }
    // Batched right operand: walk the output's batch dimensions with broadcasting.
    const int64_t m = a.shape.rank() == 1 ? 1 : a.shape[a.shape.rank() - 2];
    const size_t batchRank = y.shape.rank() - 2;
    const ir::Shape batch(
        std::vector<int64_t>(y.shape.dims().begin(), y.shape.dims().begin() + batchRank));
    const auto offsetOf = [&](const ir::Shape& operand, const std::vector<int64_t>& index,
                              int64_t matrix) {
      const size_t rank = operand.rank() >= 2 ? operand.rank() - 2 : 0;
      int64_t offset = 0, stride = matrix;
      for (size_t d = rank; d-- > 0;) {
        const int64_t dim = operand[d];
        offset += (dim == 1 ? 0 : index[batchRank - rank + d]) * stride;
        stride *= dim;
      }
      return offset;
    };
    std::vector<int64_t> index(batchRank, 0);
    entries_.clear();
    for (int64_t entry = 0; entry < batch.elementCount(); ++entry) {
      entries_.push_back({.m = m,
                          .n = n,
                          .k = k,
                          .a = A + offsetOf(a.shape, index, m * k),
                          .lda = k,
                          .b = B + offsetOf(b.shape, index, k * n),
                          .ldb = n,
                          .c = Y + entry * m * n,
                          .ldc = n});
      for (size_t d = batchRank; d-- > 0;) {
        if (++index[d] < batch[d]) break;
        index[d] = 0;
      }
    }
    sgemmBatch(plan_.options, entries_, context.pool());
    return Status::ok();
  }

 private:
  GemmPlan plan_;
  mutable std::vector<GemmArgs> entries_;  // per-run scratch; a plan runs on one thread at a time
};

// Gemm, and kiln's FusedGemm (Gemm + activation, whose A may be batched [..., K]: the batch
// rows are contiguous, so they run as one [rows, K] product).
class GemmStep : public Step {
 public:
  // With `epilogueInTiles` the native product runs the epilogue on each block of C it finishes.
  GemmStep(bool transA, bool transB, float alpha, float beta, Epilogue epilogue,
           bool epilogueInTiles, GemmPlan plan)
      : transA_(transA),
        transB_(transB),
        alpha_(alpha),
        beta_(beta),
        epilogue_(epilogue),
        epilogueInTiles_(epilogueInTiles),
        plan_(std::move(plan)) {}

  Status run(const ExecutionContext& context) const override {
    const BufferRef& a = *inputs[0];
    const BufferRef& y = *outputs[0];
    const int64_t n = y.shape[y.shape.rank() - 1];
    const int64_t m = y.shape.elementCount() / std::max<int64_t>(n, 1);
    const int64_t k = transA_ ? a.shape[0] : a.shape[a.shape.rank() - 1];
    float* Y = context.data<float>(y);
    float beta = 0.0f;
    if (inputs.size() > 2 && inputs[2] && beta_ != 0.0f) {
      // C broadcasts to [M, N]; the product then accumulates onto it.
      const BufferRef& c = *inputs[2];
      broadcastC(context.data<float>(c), c.shape, m, n, Y, context.pool());
      beta = beta_;
    }
    plan_.run({.transA = transA_,
               .transB = transB_,
               .m = m,
               .n = n,
               .k = k,
               .alpha = alpha_,
               .a = context.data<float>(a),
               .lda = transA_ ? m : k,
               .b = context.data<float>(*inputs[1]),
               .ldb = transB_ ? k : n,
               .beta = beta,
               .c = Y,
               .ldc = n,
               .epilogue = epilogueInTiles_ ? &epilogue_ : nullptr},
              context.pool());
    if (!epilogueInTiles_) applyEpilogue(epilogue_, Y, m * n, context.pool());
    return Status::ok();
  }

 private:
  static void broadcastC(const float* C, const ir::Shape& shape, int64_t m, int64_t n, float* Y,
                         ThreadPool& pool) {
    const int64_t rows = shape.rank() == 2 ? shape[0] : 1;
    const int64_t cols = shape.rank() >= 1 ? shape[shape.rank() - 1] : 1;
    pool.parallelFor(m, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t i = begin; i < end; ++i) {
                         const float* src = C + (rows == 1 ? 0 : i) * cols;
                         float* dst = Y + i * n;
                         if (cols == n) {
                           std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
                         } else {
                           std::fill(dst, dst + n, src[0]);
                         }
                       }
                     });
  }

  bool transA_, transB_;
  float alpha_, beta_;
  Epilogue epilogue_;
  bool epilogueInTiles_;
  GemmPlan plan_;
};

// The options the route gives `node`, with its right operand packed when it is a constant 2-D
// matrix of a native product and cpu.gemm.prepack is on. `rows`/`cols` are op(B)'s shape.
GemmPlan planFor(const ir::Node& node, const knobs::Route& route, bool transB, int64_t rows,
                 int64_t cols) {
  GemmPlan plan{.options = gemmOptionsFor(node, route)};
  const ir::Value* b = node.inputs[1];
  if (plan.options.native() && route.isOn(kGemmPrepack, &node) && b->constant &&
      b->shape.rank() <= 2) {
    plan.packedB.emplace(plan.options, transB, rows, cols, b->constant->data<float>().data(),
                         transB ? rows : cols);
  }
  return plan;
}

// "native.sgemm.kc256" plus each scheduling choice that is not the default, in knob order
// ("native.sgemm.kc256.avx2.a96k.b1024k.rows.prepacked"); a kernel this CPU lacks shows as
// "auto-no-avx512".
std::string tacticOf(const GemmPlan& plan, const std::string& requestedKernel) {
  const GemmOptions& o = plan.options;
  if (!o.native()) return "blas.sgemm";
  std::string tactic = "native.sgemm.kc" + std::to_string(o.kc);
  if (requestedKernel != "auto") {
    tactic += o.kernel == GemmKernel::kAuto ? ".auto-no-" + requestedKernel : "." + requestedKernel;
  }
  if (o.blockAKiB != kDefaultGemmBlockAKiB) tactic += ".a" + std::to_string(o.blockAKiB) + "k";
  if (o.blockBKiB != kDefaultGemmBlockBKiB) tactic += ".b" + std::to_string(o.blockBKiB) + "k";
  if (o.split == GemmSplit::kRows) tactic += ".rows";
  if (o.split == GemmSplit::kColumns) tactic += ".columns";
  return tactic + (plan.packedB ? ".prepacked" : "");
}

}  // namespace

std::unique_ptr<Step> makeGemmStep(const ir::Node& node, const knobs::Route& route) {
  const bool fused = node.domain == ir::kKilnDomain && node.opType == "FusedGemm";
  if ((!node.domain.empty() && !fused) || !allFloat32(node)) return nullptr;
  if (route.value(kGemmSource, &node) == "reference") return nullptr;
  std::unique_ptr<Step> step;
  std::string tactic, precision;
  // Records the plan's choices before a step takes it.
  const auto describe = [&](const GemmPlan& plan) {
    tactic = tacticOf(plan, route.value(kGemmKernel, &node));
    precision = plan.options.precision == GemmPrecision::kBf16 ? "bf16" : "fp32";
  };
  if (node.opType == "MatMul") {
    // A vector left operand against a batched right one changes the output's rank in a way
    // the batch walk does not follow; the reference kernel takes that rare case.
    const ir::Shape& a = node.inputs[0]->shape;
    const ir::Shape& b = node.inputs[1]->shape;
    if (a.rank() < 2 && b.rank() > 2) return nullptr;
    const int64_t k = b.rank() == 1 ? b[0] : b[b.rank() - 2];
    GemmPlan plan = planFor(node, route, /*transB=*/false, k, b.rank() == 1 ? 1 : b[b.rank() - 1]);
    describe(plan);
    step = std::make_unique<MatMulStep>(std::move(plan));
  } else if (node.opType == "Gemm" || fused) {
    auto transA = node.getInt("transA", 0), transB = node.getInt("transB", 0);
    auto alpha = node.getFloat("alpha", 1.0f), beta = node.getFloat("beta", 1.0f);
    std::optional<Epilogue> epilogue = Epilogue::fromNode(node);
    if (!transA.isOk() || !transB.isOk() || !alpha.isOk() || !beta.isOk() || !epilogue) {
      return nullptr;
    }
    const ir::Shape& b = node.inputs[1]->shape;
    if (b.rank() != 2) return nullptr;
    GemmPlan plan =
        planFor(node, route, *transB != 0, b[*transB != 0 ? 1 : 0], b[*transB != 0 ? 0 : 1]);
    describe(plan);
    const bool inTiles =
        plan.options.native() && !epilogue->empty() && route.value(kGemmEpilogue, &node) == "tiles";
    if (inTiles) tactic += ".epilogue-tiles";
    step = std::make_unique<GemmStep>(*transA != 0, *transB != 0, *alpha, *beta, *epilogue, inTiles,
                                      std::move(plan));
  } else {
    return nullptr;
  }
  step->tactic = tactic;
  step->precision = precision;
  return step;
}

}  // namespace kiln::cpu
