// MatrixProduct (gemm_steps.h): a strided batch of row-major products through cuBLASLt or kiln's
// native kernel, with the epilogue fused where the chosen source computes it exactly.
//
// cuBLASLt is column-major, so the row-major product C = op(A) · op(B) is computed as its
// transpose C^T = op(B)^T · op(A)^T: the row-major [m, n] C is the column-major [n, m] matrix D
// with leading dimension n, kiln's B is cuBLASLt's A and kiln's A is cuBLASLt's B (each
// row-major matrix is its own transpose in column-major order, so the transposes flip nothing but
// the roles). A bias along the columns of row-major C is then a bias along D's rows, which is
// what cuBLASLt's BIAS epilogue adds (its vector has D's row count, n); a full [m, n] bias is
// cuBLASLt's C matrix with beta = its scale. Math is CUBLAS_COMPUTE_32F: fp32 products and sums,
// never TF32 unless cuda.precision=tf32 allows it (CUBLAS_COMPUTE_32F_FAST_TF32), with scale type
// CUDA_R_32F (alpha, beta and the epilogue in float) for every storage type: A/B/C/D all
// CUDA_R_32F, all CUDA_R_16F or all CUDA_R_16BF, or CUDA_R_16F / CUDA_R_16BF A and B with
// CUDA_R_32F C and D (attention's float32 scores), the combinations cuBLASLt's table lists for
// CUBLAS_COMPUTE_32F. The BIAS epilogue's vector has D's type.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/backends/cuda/kernels/gemm_steps.h"

namespace kiln::cuda {

namespace {

// An algorithm's opaque bytes as hex: what the timing cache checks a recorded choice against.
std::string algoHex(const cublasLtMatmulAlgo_t& algo) {
  std::string hex;
  for (uint64_t word : algo.data) hex += fmt::format("{:016x}", word);
  return hex;
}
constexpr int64_t kAlignment = 256;  // arena, weights and workspace ranges

int64_t alignUp(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// The largest power of two up to 256 that divides the matrix's address (256 for a buffer not
// known yet: workspace ranges are 256-aligned) and, in a batch, every entry's offset.
uint32_t alignmentOf(const void* pointer, int64_t strideElements, GemmType type, int64_t batch) {
  uint64_t bits = pointer ? static_cast<uint64_t>(reinterpret_cast<uintptr_t>(pointer)) : 256;
  if (batch > 1 && strideElements != 0) {
    bits |= static_cast<uint64_t>(strideElements) * static_cast<uint64_t>(gemmTypeBytes(type));
  }
  uint32_t alignment = 256;
  while (alignment > 1 && bits % alignment != 0) alignment /= 2;
  return alignment;
}

// Elements a batch of `batch` matrices, each `rows` stored rows `pitch` apart and the matrices
// `stride` apart, spans.
int64_t spanOf(int64_t rows, int64_t pitch, int64_t stride, int64_t batch) {
  return rows * pitch + (batch > 1 ? (batch - 1) * stride : 0);
}

Status ltStatus(cublasStatus_t status, std::string_view what) { return cublasStatus(status, what); }

cudaDataType_t ltTypeOf(GemmType type) {
  switch (type) {
    case kGemmFloat16:
      return CUDA_R_16F;
    case kGemmBFloat16:
      return CUDA_R_16BF;
    case kGemmFloat32:
      break;
  }
  return CUDA_R_32F;
}

const char* nameOf(GemmType type) {
  return type == kGemmFloat16 ? "fp16" : type == kGemmBFloat16 ? "bf16" : "fp32";
}

}  // namespace

std::optional<GemmType> gemmTypeOf(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kFloat32:
      return kGemmFloat32;
    case ir::DType::kFloat16:
      return kGemmFloat16;
    case ir::DType::kBFloat16:
      return kGemmBFloat16;
    default:
      return std::nullopt;
  }
}

bool cublasLtCanTake(const ProductShape& shape) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  auto fits = [](int64_t v) { return v > 0 && v <= kMax; };
  return fits(shape.m) && fits(shape.n) && fits(shape.k) && fits(shape.batch) &&
         fits(shape.pitchA()) && fits(shape.pitchB()) && fits(shape.pitchC());
}

// cuBLASLt's descriptors of one product, in the transposed (column-major) problem.
struct MatrixProduct::Lt {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t x = nullptr;  // cuBLASLt's A: kiln's B
  cublasLtMatrixLayout_t y = nullptr;  // cuBLASLt's B: kiln's A
  cublasLtMatrixLayout_t d = nullptr;  // C and D: kiln's C
  cublasLtMatmulAlgo_t algo{};
  const void* biasPointer = nullptr;  // in `operation` (BIAS epilogue)
  // The alignments the algorithm was chosen for (A, B, C, D of the transposed problem).
  uint32_t alignX = 256, alignY = 256, alignC = 256, alignD = 256;

  Lt() = default;
  ~Lt() { reset(); }
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;

  void reset() {
    if (operation) cublasLtMatmulDescDestroy(operation);
    for (cublasLtMatrixLayout_t layout : {x, y, d}) {
      if (layout) cublasLtMatrixLayoutDestroy(layout);
    }
    operation = nullptr;
    x = y = d = nullptr;
  }

  // A column-major layout of `rows` x `cols` elements of `type` (leading dimension `ld`), batched.
  static Status layout(cublasLtMatrixLayout_t* out, GemmType type, int64_t rows, int64_t cols,
                       int64_t ld, int64_t batch, int64_t stride) {
    KILN_RETURN_IF_ERROR(
        ltStatus(cublasLtMatrixLayoutCreate(out, ltTypeOf(type), static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), ld),
                 "cublasLtMatrixLayoutCreate"));
    if (batch <= 1) return Status::ok();
    const int32_t count = static_cast<int32_t>(batch);
    KILN_RETURN_IF_ERROR(
        ltStatus(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)),
                 "setting CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT"));
    return ltStatus(cublasLtMatrixLayoutSetAttribute(
                        *out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
                    "setting CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET");
  }

  Status setBias(const void* bias) {
    KILN_RETURN_IF_ERROR(
        ltStatus(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)),
                 "setting CUBLASLT_MATMUL_DESC_BIAS_POINTER"));
    biasPointer = bias;
    return Status::ok();
  }

  // Descriptors for `shape` (TF32 math if `tf32` and the operands are float32) with cuBLASLt
  // epilogue `epilogue` (its bias pointer `bias`, of D's type).
  Status build(const ProductShape& s, bool tf32, cublasLtEpilogue_t epilogue, const void* bias) {
    reset();
    const bool fastTf32 = tf32 && s.inputType == kGemmFloat32;
    const cublasComputeType_t compute =
        fastTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    KILN_RETURN_IF_ERROR(ltStatus(cublasLtMatmulDescCreate(&operation, compute, CUDA_R_32F),
                                  "cublasLtMatmulDescCreate"));
    const int32_t opX = s.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t opY = s.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_RETURN_IF_ERROR(ltStatus(
        cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA, &opX, sizeof(opX)),
        "setting CUBLASLT_MATMUL_DESC_TRANSA"));
    KILN_RETURN_IF_ERROR(ltStatus(
        cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSB, &opY, sizeof(opY)),
        "setting CUBLASLT_MATMUL_DESC_TRANSB"));
    const uint32_t mode = epilogue;
    KILN_RETURN_IF_ERROR(
        ltStatus(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &mode,
                                                sizeof(mode)),
                 "setting CUBLASLT_MATMUL_DESC_EPILOGUE"));
    if (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
        epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) {
      if (s.outputType != kGemmFloat32) {
        // D's type is cuBLASLt's default for the vector; said for the reduced types so that it
        // is never a guess.
        const int32_t biasType = ltTypeOf(s.outputType);
        KILN_RETURN_IF_ERROR(
            ltStatus(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &biasType, sizeof(biasType)),
                     "setting CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE"));
      }
      KILN_RETURN_IF_ERROR(setBias(bias));
    }
    // Kiln's B: stored [k, n] row-major = column-major [n, k] (ld: its pitch, n when dense), or,
    // transposed, [n, k] row-major = column-major [k, n] read transposed.
    const GemmType in = s.inputType;
    if (s.transB) {
      KILN_RETURN_IF_ERROR(layout(&x, in, s.k, s.n, s.pitchB(), s.batch, s.strideB));
    } else {
      KILN_RETURN_IF_ERROR(layout(&x, in, s.n, s.k, s.pitchB(), s.batch, s.strideB));
    }
    // Kiln's A: [m, k] row-major = column-major [k, m]; transposed, column-major [m, k].
    if (s.transA) {
      KILN_RETURN_IF_ERROR(layout(&y, in, s.m, s.k, s.pitchA(), s.batch, s.strideA));
    } else {
      KILN_RETURN_IF_ERROR(layout(&y, in, s.k, s.m, s.pitchA(), s.batch, s.strideA));
    }
    return layout(&d, s.outputType, s.n, s.m, s.pitchC(), s.batch, s.strideC);
  }

  // Up to `count` algorithms within `options`' workspace and reduction schemes, best first by
  // cuBLASLt's heuristics; empty (with `why` said) when cuBLASLt has none for these descriptors.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates(cublasLtHandle_t handle, int count,
                                                          const ProductOptions& options,
                                                          std::string& why) const {
    cublasLtMatmulPreference_t preference = nullptr;
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
    int returned = 0;
    cublasStatus_t status = cublasLtMatmulPreferenceCreate(&preference);
    auto setPreference = [&](cublasLtMatmulPreferenceAttributes_t attribute, const void* value,
                             size_t bytes) {
      if (status == CUBLAS_STATUS_SUCCESS) {
        status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, bytes);
      }
    };
    const uint64_t maxWorkspace = options.maxWorkspace;
    setPreference(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &maxWorkspace, sizeof(maxWorkspace));
    if (!options.splitK) {
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE;
      setPreference(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
    }
    setPreference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignX, sizeof(alignX));
    setPreference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alignY, sizeof(alignY));
    setPreference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignC, sizeof(alignC));
    setPreference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignD, sizeof(alignD));
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulAlgoGetHeuristic(handle, operation, x, y, d, d, preference, count,
                                              results.data(), &returned);
    }
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS) {
      why += fmt::format("{}; ", cublasStatus(status, "the cuBLASLt heuristics").message());
      return {};
    }
    std::vector<cublasLtMatmulHeuristicResult_t> usable;
    for (int i = 0; i < returned; ++i) {
      const auto& result = results[static_cast<size_t>(i)];
      if (result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= maxWorkspace) {
        usable.push_back(result);
      }
    }
    if (usable.empty()) why += "no cuBLASLt algorithm; ";
    return usable;
  }

  cublasStatus_t matmul(cublasLtHandle_t handle, cudaStream_t stream,
                        const cublasLtMatmulAlgo_t& algorithm, float alpha, float beta,
                        const void* kilnA, const void* kilnB, const void* cMatrix, void* out,
                        void* workspace, size_t workspaceBytes) const {
    return cublasLtMatmul(handle, operation, &alpha, kilnB, x, kilnA, y, &beta, cMatrix, d, out, d,
                          &algorithm, workspace, workspaceBytes, stream);
  }
};

MatrixProduct::MatrixProduct(const ProductShape& shape, const ProductOptions& options,
                             const GemmEpilogue& epilogue, bool hasBias)
    : shape_(shape), options_(options), epilogue_(epilogue), hasBias_(hasBias) {
  const bool bare = !hasBias && epilogue.activation == kGemmActivationNone;
  KILN_CHECK(shape.batch <= 1 || bare);
  KILN_CHECK(shape.pitchC() == shape.n || bare);  // the epilogue kernel takes dense rows
  epilogue_.bias = nullptr;
  epilogue_.blockThreads = options.epilogueBlock;
  // The native kernel takes float C from reduced A and B, or all of one type.
  KILN_CHECK(shape.outputType == kGemmFloat32 || shape.outputType == shape.inputType);
  const double macs = static_cast<double>(shape.m) * static_cast<double>(shape.n) *
                      static_cast<double>(shape.k) *
                      static_cast<double>(std::max<int64_t>(shape.batch, 1));
  useLt_ = options.source == ProductSource::kCublasLt && cublasLtCanTake(shape) &&
           macs >= options.nativeBelow;
  planFusion(useLt_);
  detail_ = useLt_ ? "cuBLASLt (algorithm chosen at prepare; " + preferenceText() + ")"
                   : fmt::format("kiln's tiled GEMM kernel (m={} n={} k={} batch={}{})", shape.m,
                                 shape.n, shape.k, std::max<int64_t>(shape.batch, 1),
                                 epilogueKernelRuns()
                                     ? fmt::format(", epilogue kernel of {}-thread blocks",
                                                   epilogue_.blockThreads)
                                     : "");
}

MatrixProduct::~MatrixProduct() { delete lt_; }

std::string MatrixProduct::preferenceText() const {
  return fmt::format(
      "m={} n={} k={} batch={}, workspace within {} MiB, split-K {}{}{}", shape_.m, shape_.n,
      shape_.k, std::max<int64_t>(shape_.batch, 1), options_.maxWorkspace >> 20,
      options_.splitK ? "allowed" : "denied",
      options_.algorithm == AlgorithmChoice::kTimed
          ? fmt::format(", up to {} timed {} runs each", options_.candidates, options_.timingRuns)
      : options_.algoRank > 0 ? fmt::format(", the heuristics' number {}", options_.algoRank + 1)
                              : "",
      epilogueKernelRuns()
          ? fmt::format(", epilogue kernel of {}-thread blocks", epilogue_.blockThreads)
          : "");
}

void MatrixProduct::planFusion(bool useLt) {
  biasPlace_ = BiasPlace::kEpilogueKernel;
  fuseActivation_ = false;
  if (!options_.fuseEpilogue) return;
  if (!useLt) {
    biasPlace_ = BiasPlace::kNativeStores;
    fuseActivation_ = true;
    return;
  }
  const int64_t m = shape_.m, n = shape_.n;
  const GemmEpilogue& e = epilogue_;
  const bool alongColumns = n == 1 || e.biasColumnStride == 1;
  const bool vector = alongColumns && (m == 1 || e.biasRowStride == 0);
  const bool matrix = alongColumns && (m == 1 || e.biasRowStride == n);
  if (hasBias_) {
    // cuBLASLt's BIAS adds the vector unscaled; its C matrix is scaled by beta, and not read at
    // all when beta is 0 (kiln's 0 * C still turns an infinite C into NaN: the kernel does it).
    if (e.biasScale == 1.0f && vector) {
      biasPlace_ = BiasPlace::kLtVector;
    } else if (e.biasScale != 0.0f && matrix) {
      biasPlace_ = BiasPlace::kLtMatrix;
    } else {
      return;  // the bias goes to the kernel, and the activation after it
    }
  }
  // cuBLASLt's RELU is max(x, 0); its GELU is the tanh approximation, not kiln's erf form (which
  // it takes only where cuda.gemm.gelu_epilogue=tanh allows the approximation).
  fuseActivation_ = e.activation == kGemmActivationRelu ||
                    e.activation == kGemmActivationGeluTanh ||
                    (e.activation == kGemmActivationGelu && options_.geluAsTanh);
}

bool MatrixProduct::epilogueKernelRuns() const {
  return (hasBias_ && biasPlace_ == BiasPlace::kEpilogueKernel) ||
         (epilogue_.activation != kGemmActivationNone && !fuseActivation_);
}

GemmEpilogue MatrixProduct::remainingEpilogue(const void* bias) const {
  GemmEpilogue rest = epilogue_;
  rest.bias = hasBias_ && biasPlace_ == BiasPlace::kEpilogueKernel ? bias : nullptr;
  if (fuseActivation_) rest.activation = kGemmActivationNone;
  return rest;
}

std::string MatrixProduct::tactic() const {
  std::string name = !useLt_                                         ? "native"
                     : options_.algorithm == AlgorithmChoice::kTimed ? "cublaslt.timed"
                                                                     : "cublaslt";
  if (epilogueKernelRuns()) name += "+epilogue";
  return name;
}

Status MatrixProduct::prepare(PrepareContext& context, const void* a, const void* b, void* c,
                              const void* bias) {
  if (!useLt_) return Status::ok();
  if (!lt_) lt_ = new Lt();
  return prepareLt(context, a, b, c, bias);
}

Status MatrixProduct::prepareLt(PrepareContext& prepare, const void* a, const void* b, void* c,
                                const void* bias) {
  const Context& context = prepare.context;
  const ProductShape& s = shape_;
  Lt& lt = *lt_;
  lt.alignX = alignmentOf(b, s.strideB, s.inputType, s.batch);
  lt.alignY = alignmentOf(a, s.strideA, s.inputType, s.batch);
  lt.alignD = alignmentOf(c, s.strideC, s.outputType, s.batch);
  const bool timed = options_.algorithm == AlgorithmChoice::kTimed;
  const int count = timed ? options_.candidates : options_.algoRank + 1;
  // Tiers: the epilogue as planned, then (if that had a fused part) the bare product with kiln's
  // epilogue kernel after it.
  std::string why;
  std::vector<cublasLtMatmulHeuristicResult_t> found;
  cublasLtEpilogue_t ltEpilogue = CUBLASLT_EPILOGUE_DEFAULT;
  for (int tier = 0; tier < 2 && found.empty(); ++tier) {
    if (tier == 1) {
      if (biasPlace_ == BiasPlace::kEpilogueKernel && !fuseActivation_) break;
      biasPlace_ = BiasPlace::kEpilogueKernel;
      fuseActivation_ = false;
    }
    const bool vectorBias = hasBias_ && biasPlace_ == BiasPlace::kLtVector;
    cublasLtEpilogue_t mode = CUBLASLT_EPILOGUE_DEFAULT;
    const bool gelu = epilogue_.activation == kGemmActivationGeluTanh ||
                      epilogue_.activation == kGemmActivationGelu;
    if (vectorBias) {
      mode = !fuseActivation_ ? CUBLASLT_EPILOGUE_BIAS
             : gelu           ? CUBLASLT_EPILOGUE_GELU_BIAS
                              : CUBLASLT_EPILOGUE_RELU_BIAS;
    } else if (fuseActivation_) {
      mode = gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_RELU;
    }
    lt.alignC =
        biasPlace_ == BiasPlace::kLtMatrix ? alignmentOf(bias, 0, s.outputType, 1) : lt.alignD;
    ltEpilogue = mode;
    const Status built = lt.build(s, options_.tf32, mode, vectorBias ? bias : nullptr);
    if (!built.isOk()) {
      why += built.message() + "; ";
      continue;
    }
    found = lt.candidates(context.cublasLt, count, options_, why);
  }
  if (found.empty()) {
    // No cuBLASLt algorithm at all: kiln's kernel computes the same product.
    delete lt_;
    lt_ = nullptr;
    useLt_ = false;
    planFusion(false);
    detail_ = fmt::format(
        "kiln's tiled GEMM kernel: cuBLASLt has no algorithm for m={} n={} k={} batch={} {}->{} "
        "({})",
        s.m, s.n, s.k, s.batch, nameOf(s.inputType), nameOf(s.outputType), why);
    return Status::ok();
  }

  size_t best = 0;
  // A timed choice: the timing cache's record of the candidate that won, when the heuristics
  // still offer that algorithm at that position (its bytes equal), is taken without timing.
  // The timing cache's key: everything the descriptors and the candidate list depend on.
  const bool timing = timed && found.size() > 1;
  const std::string key =
      !timing ? ""
              : fmt::format(
                    "cublaslt m={} n={} k={} batch={} trans={}{} pitch={},{},{} stride={},{},{} "
                    "types={}->{} tf32={} epilogue={} bias={} align={},{},{},{} candidates={} "
                    "workspace={} split_k={} runs={} act={}",
                    s.m, s.n, s.k, s.batch, s.transA ? "t" : "n", s.transB ? "t" : "n", s.pitchA(),
                    s.pitchB(), s.pitchC(), s.strideA, s.strideB, s.strideC, nameOf(s.inputType),
                    nameOf(s.outputType), options_.tf32, static_cast<int>(ltEpilogue),
                    static_cast<int>(biasPlace_), lt.alignX, lt.alignY, lt.alignC, lt.alignD, count,
                    options_.maxWorkspace, options_.splitK, options_.timingRuns,
                    static_cast<int>(epilogue_.activation));
  std::optional<size_t> recorded;
  if (auto record = timing ? prepare.cachedChoice(key) : std::nullopt) {
    const int64_t index = entryInt(*record, "index", -1);
    if (index >= 0 && index < static_cast<int64_t>(found.size()) &&
        entryString(*record, "algo") == algoHex(found[static_cast<size_t>(index)].algo)) {
      recorded = static_cast<size_t>(index);
      ++prepare.timingHits;
    } else {
      prepare.forgetChoice(key);
    }
  }
  if (!timed) {
    best = found.size() - 1;  // the algorithm of algoRank, or the last the heuristics gave
  } else if (recorded) {
    best = *recorded;
  } else if (found.size() > 1) {
    // Time each candidate on the step's buffers (scratch where a buffer is not known yet): one
    // untimed run, then kTimedRuns; a candidate that fails to run is passed over.
    std::vector<DeviceMemory> scratch;
    auto orScratch = [&](const void* pointer, int64_t elements,
                         GemmType type) -> Result<const void*> {
      if (pointer) return pointer;
      KILN_ASSIGN_OR_RETURN(
          DeviceMemory memory,
          DeviceMemory::allocate(elements * gemmTypeBytes(type), "timing cuBLASLt algorithms"));
      scratch.push_back(std::move(memory));
      return static_cast<const void*>(scratch.back().data());
    };
    const int64_t rowsA = s.transA ? s.k : s.m;
    const int64_t rowsB = s.transB ? s.n : s.k;
    KILN_ASSIGN_OR_RETURN(const void* ta,
                          orScratch(a, spanOf(rowsA, s.pitchA(), s.strideA, s.batch), s.inputType));
    KILN_ASSIGN_OR_RETURN(const void* tb,
                          orScratch(b, spanOf(rowsB, s.pitchB(), s.strideB, s.batch), s.inputType));
    KILN_ASSIGN_OR_RETURN(const void* tc,
                          orScratch(c, spanOf(s.m, s.pitchC(), s.strideC, s.batch), s.outputType));
    const void* tbias = bias;
    if (hasBias_ && !bias && biasPlace_ != BiasPlace::kEpilogueKernel) {
      KILN_ASSIGN_OR_RETURN(tbias, orScratch(nullptr, s.m * s.n, s.outputType));
    }
    if (biasPlace_ == BiasPlace::kLtVector && tbias != lt.biasPointer) {
      KILN_RETURN_IF_ERROR(lt.setBias(tbias));
    }
    size_t workspaceBytes = 0;
    for (const auto& result : found)
      workspaceBytes = std::max(workspaceBytes, result.workspaceSize);
    KILN_ASSIGN_OR_RETURN(
        DeviceMemory workspace,
        DeviceMemory::allocate(static_cast<int64_t>(workspaceBytes), "timing cuBLASLt algorithms"));
    KILN_ASSIGN_OR_RETURN(Event start, Event::create());
    KILN_ASSIGN_OR_RETURN(Event stop, Event::create());
    const bool matrixBias = biasPlace_ == BiasPlace::kLtMatrix;
    const float beta = matrixBias ? epilogue_.biasScale : 0.0f;
    void* out = const_cast<void*>(tc);
    const void* cMatrix = matrixBias ? tbias : out;
    double bestMs = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < found.size(); ++i) {
      auto run = [&] {
        return lt.matmul(context.cublasLt, context.stream, found[i].algo, s.alpha, beta, ta, tb,
                         cMatrix, out, workspace.data(), found[i].workspaceSize);
      };
      if (run() != CUBLAS_STATUS_SUCCESS) {
        // A failed launch leaves its error for the next cudaGetLastError, which would blame
        // another step's kernel: clear it here.
        cudaGetLastError();
        continue;
      }
      KILN_CUDA_CHECK(cudaEventRecord(start.get(), context.stream));
      bool ran = true;
      for (int r = 0; r < options_.timingRuns && ran; ++r) ran = run() == CUBLAS_STATUS_SUCCESS;
      KILN_CUDA_CHECK(cudaEventRecord(stop.get(), context.stream));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop.get()));
      if (!ran) {
        cudaGetLastError();
        continue;
      }
      KILN_ASSIGN_OR_RETURN(double ms, elapsedMs(start, stop));
      if (ms < bestMs) {
        bestMs = ms;
        best = i;
      }
    }
    // The scratch and workspace are freed on return: the runs must have finished with them.
    KILN_CUDA_CHECK(cudaStreamSynchronize(context.stream));
    prepare.recordChoice(
        key, {{"index", best}, {"algo", algoHex(found[best].algo)}, {"of", found.size()}});
  }
  lt.algo = found[best].algo;
  workspaceBytes_ = alignUp(static_cast<int64_t>(found[best].workspaceSize));
  int algoId = -1;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&lt.algo, CUBLASLT_ALGO_CONFIG_ID, &algoId, sizeof(algoId),
                                       &written);
  detail_ = fmt::format("cuBLASLt algorithm {} ({} of {} candidate(s){}), workspace {} bytes; {}",
                        algoId, best + 1, found.size(),
                        !timing    ? ""
                        : recorded ? ", timed before: from the timing cache"
                                   : ", timed",
                        workspaceBytes_, preferenceText());
  return Status::ok();
}

Status MatrixProduct::runLt(const Context& context, std::byte* workspace, int64_t workspaceBytes,
                            const void* a, const void* b, void* c, const void* bias) const {
  const ProductShape& s = shape_;
  Lt& lt = *lt_;
  if (workspaceBytes < workspaceBytes_ || (workspaceBytes_ > 0 && !workspace)) {
    return internalError("the cuBLASLt product needs {} bytes of workspace, has {}",
                         workspaceBytes_, workspaceBytes);
  }
  const bool matrixBias = biasPlace_ == BiasPlace::kLtMatrix;
  // The algorithm was chosen for the alignments seen at prepare; the buffers do not move, but a
  // weaker one would make cuBLASLt fail or read out of bounds, so say so instead.
  if (alignmentOf(b, s.strideB, s.inputType, s.batch) < lt.alignX ||
      alignmentOf(a, s.strideA, s.inputType, s.batch) < lt.alignY ||
      alignmentOf(c, s.strideC, s.outputType, s.batch) < lt.alignD ||
      (matrixBias && alignmentOf(bias, 0, s.outputType, 1) < lt.alignC)) {
    return internalError("a cuBLASLt product's buffers are less aligned than at prepare");
  }
  if (hasBias_ && biasPlace_ == BiasPlace::kLtVector && bias != lt.biasPointer) {
    KILN_RETURN_IF_ERROR(lt.setBias(bias));
  }
  const float beta = matrixBias ? epilogue_.biasScale : 0.0f;
  KILN_CUBLAS_CHECK(lt.matmul(context.cublasLt, context.stream, lt.algo, s.alpha, beta, a, b,
                              matrixBias ? bias : c, c, workspaceBytes_ > 0 ? workspace : nullptr,
                              static_cast<size_t>(workspaceBytes_)));
  return Status::ok();
}

Status MatrixProduct::runNative(cudaStream_t stream, const void* a, const void* b, void* c,
                                const void* bias) const {
  const ProductShape& s = shape_;
  NativeGemmArgs args;
  args.m = s.m;
  args.n = s.n;
  args.k = s.k;
  args.transA = s.transA;
  args.transB = s.transB;
  args.alpha = s.alpha;
  args.inputType = s.inputType;
  args.outputType = s.outputType;
  args.a = a;
  args.lda = s.pitchA();
  args.strideA = s.strideA;
  args.b = b;
  args.ldb = s.pitchB();
  args.strideB = s.strideB;
  args.c = c;
  args.ldc = s.pitchC();
  args.strideC = s.strideC;
  args.batch = s.batch;
  args.epilogue = epilogue_;
  args.epilogue.bias = hasBias_ && biasPlace_ == BiasPlace::kNativeStores ? bias : nullptr;
  if (!fuseActivation_) args.epilogue.activation = kGemmActivationNone;
  return cudaStatus(launchNativeGemm(args, stream), "kiln's GEMM kernel");
}

Status MatrixProduct::enqueue(const Context& context, std::byte* workspace, int64_t workspaceBytes,
                              const void* a, const void* b, void* c, const void* bias) const {
  const ProductShape& s = shape_;
  if (s.m <= 0 || s.n <= 0 || s.batch <= 0) return Status::ok();  // nothing to store
  if (useLt_) {
    KILN_RETURN_IF_ERROR(runLt(context, workspace, workspaceBytes, a, b, c, bias));
  } else {
    KILN_RETURN_IF_ERROR(runNative(context.stream, a, b, c, bias));
  }
  if (!epilogueKernelRuns()) return Status::ok();
  return cudaStatus(
      launchGemmEpilogue(c, s.outputType, s.m, s.n, remainingEpilogue(bias), context.stream),
      "the GEMM epilogue kernel");
}

}  // namespace kiln::cuda
