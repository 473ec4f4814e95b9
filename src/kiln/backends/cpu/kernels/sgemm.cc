// The GEMM entry point: OpenBLAS's sgemm, or kiln's native packed SGEMM.
//
// The native product is the classic blocked design: for each block of kc rows of op(B) and nc of
// its columns, pack the block into slivers of nr columns (k-major); for each block of mc rows of
// op(A), pack it into slivers of mr rows; then run the micro-kernel over every (mr x nr) tile, the
// B sliver staying in L1 while the A block streams from L2. When a task has few rows, each B
// sliver serves few tiles and copying it costs more than it saves: float32 kernels then read
// B's rows in place (only a ragged last sliver is packed). Threads split C into a grid of
// rectangles (one per task, edges on sliver boundaries); each task runs the whole blocked loop
// over its rectangle with its own packing buffers, so tasks share nothing but read-only inputs.
// Every element of C is summed in the same order whatever the split: results do not depend on
// the thread count.
#include "kiln/backends/cpu/kernels/sgemm.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "kiln/backends/cpu/kernels/sgemm_kernels.h"
#include "kiln/base/status.h"

namespace kiln::cpu {

using sgemm_detail::MicroKernel;
using sgemm_detail::Packing;
using sgemm_detail::TileArgs;

namespace {

constexpr int64_t kAlignment = 64;
// Tasks of at most this many row slivers read B in place (see NativeJob::run).
constexpr int64_t kDirectBRows = 4;
// A task below this many multiply-adds costs more to hand to another thread than it saves.
constexpr int64_t kMinTaskMacs = 96 * 1024;

std::byte* allocateAligned(int64_t bytes) {
  const size_t rounded =
      static_cast<size_t>((std::max<int64_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded));
  KILN_CHECK(p != nullptr);
  return p;
}

// A per-thread packing buffer that only grows: the pool's threads live as long as their plan, so
// steady-state runs allocate nothing.
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  void* words(int64_t count) {
    if (count > capacity_) {
      std::free(data_);
      data_ = allocateAligned(count * 4);
      capacity_ = count;
    }
    return data_;
  }

 private:
  std::byte* data_ = nullptr;
  int64_t capacity_ = 0;
};

thread_local Scratch packedA, packedB;

bool cpuSupports(GemmKernel kernel) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  switch (kernel) {
    case GemmKernel::kAuto:
    case GemmKernel::kPortable:
      return true;
    case GemmKernel::kAvx2:
      return avx2;
    case GemmKernel::kAvx512:
      return avx512;
    case GemmKernel::kAvx512Bf16:
      return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return kernel == GemmKernel::kAuto || kernel == GemmKernel::kPortable;
#endif
}

// The micro-kernel and packing a (resolved) kernel family runs a precision with.
struct NativeConfig {
  const MicroKernel* kernel = nullptr;
  Packing packing = Packing::kFp32;
  int64_t kc = kDefaultGemmKc;

  int mr() const { return kernel->mr; }
  int nr() const { return kernel->nr; }
  // Rows of a packed sliver for `k` elements of depth.
  int64_t depth(int64_t k) const {
    switch (packing) {
      case Packing::kFp32:
        return k;
      case Packing::kBf16Emulated:
        return (k + 1) / 2 * 2;
      case Packing::kBf16Pairs:
        return (k + 1) / 2;
    }
    return k;
  }
};

const MicroKernel& microKernel(GemmKernel kernel) {
#if defined(__x86_64__) || defined(__i386__)
  static const MicroKernel avx512Bf16 = sgemm_detail::avx512Bf16Kernel();
  static const MicroKernel avx512 = sgemm_detail::avx512Kernel();
  static const MicroKernel avx2 = sgemm_detail::avx2Kernel();
#endif
  static const MicroKernel portable = sgemm_detail::portableKernel();
  switch (kernel) {
#if defined(__x86_64__) || defined(__i386__)
    case GemmKernel::kAvx512Bf16:
      return avx512Bf16;
    case GemmKernel::kAvx512:
      return avx512;
    case GemmKernel::kAvx2:
      return avx2;
#endif
    default:
      return portable;
  }
}

NativeConfig nativeConfig(GemmKernel kernel, GemmPrecision precision, int64_t kc) {
  KILN_CHECK(kernel != GemmKernel::kAuto && cpuSupports(kernel));
  KILN_CHECK(kc >= 2 && kc % 2 == 0);  // bfloat16 pairs never straddle two panels
  NativeConfig config;
  config.kc = kc;
  if (precision == GemmPrecision::kFp32) {
    config.kernel = &microKernel(kernel == GemmKernel::kAvx512Bf16 ? GemmKernel::kAvx512 : kernel);
    config.packing = Packing::kFp32;
  } else if (kernel == GemmKernel::kAvx512Bf16) {
    config.kernel = &microKernel(kernel);
    config.packing = Packing::kBf16Pairs;
  } else {
    config.kernel = &microKernel(kernel);
    config.packing = Packing::kBf16Emulated;
  }
  return config;
}

// bfloat16 bits of x: round to nearest even, NaN kept quiet, subnormals flushed to signed zero
// (AVX512_BF16 reads bfloat16 subnormals as zero; flushing them here keeps the emulation and
// the hardware bit-identical).
inline uint16_t bf16Bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  const auto bits = static_cast<uint16_t>(u >> 16);
  return (bits & 0x7f80u) == 0 ? static_cast<uint16_t>(bits & 0x8000u) : bits;
}

inline float bf16Round(float x) { return std::bit_cast<float>(uint32_t{bf16Bits(x)} << 16); }

// A strided view of one operand: element (lane, k) at data[lane * laneStride + k * depthStride],
// where lanes are A's rows or B's columns.
struct OperandView {
  const float* data;
  int64_t laneStride, depthStride;
  float at(int64_t lane, int64_t k) const { return data[lane * laneStride + k * depthStride]; }
};

// Packs `valid` lanes (of `lanes`, the rest zero) and `k` elements of depth from `src`, whose
// element (0, 0) is the sliver's first, into dst ([depth][lanes], layout per `packing`).
void packSliver(const NativeConfig& config, const OperandView& src, int valid, int lanes, int64_t k,
                void* dst) {
  switch (config.packing) {
    case Packing::kFp32: {
      auto* out = static_cast<float*>(dst);
      if (src.depthStride == 1 && src.laneStride != 1 && config.kernel->packContiguousDepth) {
        config.kernel->packContiguousDepth(src.data, src.laneStride, valid, lanes, k, out);
        return;
      }
      if (src.laneStride == 1) {
        for (int64_t d = 0; d < k; ++d, out += lanes) {
          std::memcpy(out, src.data + d * src.depthStride, static_cast<size_t>(valid) * 4);
          std::fill(out + valid, out + lanes, 0.0f);
        }
        return;
      }
      if (valid < lanes) std::fill(out, out + k * lanes, 0.0f);
      for (int l = 0; l < valid; ++l) {
        const float* in = src.data + l * src.laneStride;
        for (int64_t d = 0; d < k; ++d) out[d * lanes + l] = in[d * src.depthStride];
      }
      return;
    }
    case Packing::kBf16Emulated: {
      // Position d ^ 1: each pair lands odd element first, for a kernel that sums in order.
      auto* out = static_cast<float*>(dst);
      const int64_t depth = (k + 1) / 2 * 2;
      if (valid < lanes || depth != k) std::fill(out, out + depth * lanes, 0.0f);
      for (int l = 0; l < valid; ++l) {
        for (int64_t d = 0; d < k; ++d) out[(d ^ 1) * lanes + l] = bf16Round(src.at(l, d));
      }
      return;
    }
    case Packing::kBf16Pairs: {
      auto* out = static_cast<uint32_t*>(dst);
      const int64_t pairs = (k + 1) / 2;
      if (valid < lanes) std::fill(out, out + pairs * lanes, 0u);
      for (int l = 0; l < valid; ++l) {
        for (int64_t p = 0; p < pairs; ++p) {
          const uint32_t low = bf16Bits(src.at(l, 2 * p));
          const uint32_t high = 2 * p + 1 < k ? bf16Bits(src.at(l, 2 * p + 1)) : 0u;
          out[p * lanes + l] = low | high << 16;
        }
      }
      return;
    }
  }
}

OperandView viewA(const GemmArgs& g) {
  return g.transA ? OperandView{g.a, 1, g.lda} : OperandView{g.a, g.lda, 1};
}
OperandView viewB(const GemmArgs& g) {
  return g.transB ? OperandView{g.b, g.ldb, 1} : OperandView{g.b, 1, g.ldb};
}

// Packs lanes [lane0, lane0 + count) and depth [k0, k0 + k) of `view` as consecutive slivers of
// `lanes` lanes; `total` is the operand's lane count (lanes past it are zero).
void packPanel(const NativeConfig& config, const OperandView& view, int lanes, int64_t lane0,
               int64_t count, int64_t total, int64_t k0, int64_t k, void* dst) {
  const int64_t sliverWords = config.depth(k) * lanes;
  auto* out = static_cast<uint32_t*>(dst);
  for (int64_t s = 0; s * lanes < count; ++s, out += sliverWords) {
    const int64_t first = lane0 + s * lanes;
    const OperandView sliver{view.data + first * view.laneStride + k0 * view.depthStride,
                             view.laneStride, view.depthStride};
    const int valid = static_cast<int>(std::min<int64_t>(lanes, total - first));
    packSliver(config, sliver, valid, lanes, k, out);
  }
}

int64_t roundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Runs g's epilogue (if any) over C[rows [r0, r1), cols [c0, c1)].
void applyEpilogue(const GemmArgs& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (!g.epilogue || g.epilogue->empty()) return;
  for (int64_t i = r0; i < r1; ++i) g.epilogue->apply(g.c + i * g.ldc + c0, c1 - c0, nullptr);
}

// One native product, with its blocking and split; B either packed on the fly or prepacked.
struct NativeJob {
  NativeConfig config;
  GemmArgs args;
  const uint32_t* prepacked = nullptr;  // PackedGemmB's words, or null
  GemmSplit split = GemmSplit::kAuto;
  int64_t mc = 0, nc = 0;

  // mc rows of packed A fill the options' A block (most of L2, leaving room for the B sliver and
  // C); nc columns of packed B fill its B block (shared-cache sized).
  NativeJob(const NativeConfig& c, const GemmOptions& options, const GemmArgs& g,
            const uint32_t* packedB)
      : config(c), args(g), prepacked(packedB), split(options.split) {
    const int64_t mr = config.mr(), nr = config.nr();
    const int64_t depth = config.depth(config.kc);
    mc = std::max(mr, options.blockAKiB * 1024 / (depth * 4) / mr * mr);
    nc = std::max(nr, options.blockBKiB * 1024 / (depth * 4) / nr * nr);
  }

  // Words before panel `pc` (a multiple of kc) of the prepacked B: full panels over padded n.
  int64_t prepackedOffset(int64_t pc) const {
    return pc / config.kc * config.depth(config.kc) * roundUp(args.n, config.nr());
  }

  // C[rows [r0, r1), cols [c0, c1)]; r0 and c0 on sliver boundaries.
  void run(int64_t r0, int64_t r1, int64_t c0, int64_t c1) const {
    const GemmArgs& g = args;
    const int mr = config.mr(), nr = config.nr();
    const OperandView a = viewA(g), b = viewB(g);
    // With few rows each B sliver is used by few tiles, so copying B into slivers costs more
    // than its contiguity saves: float32 kernels then read B's rows where they are.
    const bool direct =
        !prepacked && config.packing == Packing::kFp32 && !g.transB && r1 - r0 <= kDirectBRows * mr;
    uint32_t* edgeB = nullptr;
    for (int64_t jc = c0; jc < c1; jc += nc) {
      const int64_t ncur = std::min(nc, c1 - jc);
      for (int64_t pc = 0; pc < g.k; pc += config.kc) {
        const int64_t kcur = std::min(config.kc, g.k - pc);
        const int64_t depth = config.depth(kcur);
        // B's slivers: prepacked, packed here, or (direct) full slivers read in place and only
        // a ragged last one packed.
        const uint32_t* panelB;
        if (prepacked) {
          panelB = prepacked + prepackedOffset(pc) + jc / nr * depth * nr;
        } else if (direct) {
          const int64_t full = ncur / nr * nr;
          panelB = nullptr;
          if (full < ncur) {
            edgeB = static_cast<uint32_t*>(packedB.words(depth * nr));
            packPanel(config, b, nr, jc + full, ncur - full, g.n, pc, kcur, edgeB);
          }
        } else {
          void* buffer = packedB.words(roundUp(ncur, nr) * depth);
          packPanel(config, b, nr, jc, ncur, g.n, pc, kcur, buffer);
          panelB = static_cast<const uint32_t*>(buffer);
        }
        // The first panel applies beta; later ones add to C. With alpha == 1 the micro-kernel
        // starts from C's value, so the sum runs in k order across panels.
        const bool first = pc == 0;
        const bool last = pc + config.kc >= g.k;
        const float beta = first ? g.beta : 1.0f;
        const bool loadC = g.alpha == 1.0f && beta == 1.0f;
        for (int64_t ic = r0; ic < r1; ic += mc) {
          const int64_t mcur = std::min(mc, r1 - ic);
          auto* panelA = static_cast<uint32_t*>(packedA.words(roundUp(mcur, mr) * depth));
          packPanel(config, a, mr, ic, mcur, g.m, pc, kcur, panelA);
          for (int64_t jr = 0; jr < ncur; jr += nr) {
            const bool inPlace = direct && jr + nr <= ncur;
            TileArgs tile{.depth = depth,
                          .a = nullptr,
                          .b = inPlace  ? static_cast<const void*>(g.b + pc * g.ldb + jc + jr)
                               : direct ? static_cast<const void*>(edgeB)
                                        : panelB + jr / nr * depth * nr,
                          .ldb = inPlace ? g.ldb : nr,
                          .c = nullptr,
                          .ldc = g.ldc,
                          .cols = static_cast<int>(std::min<int64_t>(nr, ncur - jr)),
                          .loadC = loadC,
                          .alpha = g.alpha,
                          .beta = beta};
            for (int64_t ir = 0; ir < mcur; ir += mr) {
              tile.a = panelA + ir / mr * depth * mr;
              tile.c = g.c + (ic + ir) * g.ldc + jc + jr;
              config.kernel->tiles[std::min<int64_t>(mr, mcur - ir)](tile);
            }
          }
          // The block of C is final after the last panel: its epilogue runs while it is cached.
          if (last) applyEpilogue(g, ic, ic + mcur, jc, jc + ncur);
        }
      }
    }
  }
};

// How a product's C is cut among tasks: tm row bands by tn column bands, on sliver boundaries.
struct Split {
  int64_t tm = 1, tn = 1;
  int64_t tasks() const { return tm * tn; }
};

// The split for at most `threads` tasks that minimises one task's cost (its share of the
// multiply-adds, plus packing its rows of A and, unless prepacked, its columns of B); a job's
// kRows or kColumns keeps the other dimension whole.
Split chooseSplit(const NativeJob& job, int64_t threads) {
  const GemmArgs& g = job.args;
  const int64_t mr = job.config.mr(), nr = job.config.nr();
  const int64_t rowSlivers = (g.m + mr - 1) / mr, colSlivers = (g.n + nr - 1) / nr;
  const int64_t byWork = std::max<int64_t>(1, g.m * g.n * g.k / kMinTaskMacs);
  threads = std::min(threads, byWork);
  Split best;
  double bestCost = -1;
  const int64_t maxTm = job.split == GemmSplit::kColumns ? 1 : std::min(threads, rowSlivers);
  const int64_t maxTn = job.split == GemmSplit::kRows ? 1 : colSlivers;
  for (int64_t tm = 1; tm <= maxTm; ++tm) {
    for (int64_t tn = 1; tm * tn <= threads && tn <= maxTn; ++tn) {
      const double rows = static_cast<double>((rowSlivers + tm - 1) / tm * mr);
      const double cols = static_cast<double>((colSlivers + tn - 1) / tn * nr);
      // Packing an element costs about as much as eight multiply-adds of a micro-kernel.
      const double cost = rows * cols + 8.0 * (rows + (job.prepacked ? 0.0 : cols));
      if (bestCost < 0 || cost < bestCost) {
        bestCost = cost;
        best = {tm, tn};
      }
    }
  }
  return best;
}

// Task `t` of `split`: its rectangle of C, balanced over slivers.
void runTask(const NativeJob& job, const Split& split, int64_t t) {
  const GemmArgs& g = job.args;
  const int64_t mr = job.config.mr(), nr = job.config.nr();
  const int64_t rowSlivers = (g.m + mr - 1) / mr, colSlivers = (g.n + nr - 1) / nr;
  const int64_t im = t / split.tn, jn = t % split.tn;
  const int64_t r0 = im * rowSlivers / split.tm * mr;
  const int64_t r1 = std::min(g.m, (im + 1) * rowSlivers / split.tm * mr);
  const int64_t c0 = jn * colSlivers / split.tn * nr;
  const int64_t c1 = std::min(g.n, (jn + 1) * colSlivers / split.tn * nr);
  if (r0 < r1 && c0 < c1) job.run(r0, r1, c0, c1);
}

// C = beta * C, for products without multiply-adds (k == 0 or alpha == 0), as BLAS does.
void scaleC(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* row = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) row[j] = g.beta == 0.0f ? 0.0f : g.beta * row[j];
  }
}

bool trivial(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0) return true;
  if (g.k <= 0 || g.alpha == 0.0f) {
    scaleC(g);
    applyEpilogue(g, 0, g.m, 0, g.n);
    return true;
  }
  return false;
}

void runNative(const std::vector<NativeJob>& jobs, ThreadPool& pool) {
  if (jobs.empty()) return;
  // Each product gets a share of the threads; more tasks than threads keeps the chunks even
  // when a batch does not divide among them.
  const int64_t threads = pool.size();
  const int64_t share = std::max<int64_t>(
      1, (2 * threads + static_cast<int64_t>(jobs.size()) - 1) / static_cast<int64_t>(jobs.size()));
  std::vector<Split> splits;
  std::vector<int64_t> firstTask;
  int64_t tasks = 0;
  for (const NativeJob& job : jobs) {
    splits.push_back(chooseSplit(job, jobs.size() == 1 ? threads : std::min(share, threads)));
    firstTask.push_back(tasks);
    tasks += splits.back().tasks();
  }
  pool.parallelFor(tasks, 1, [&](int64_t begin, int64_t end) {
    size_t j = static_cast<size_t>(std::upper_bound(firstTask.begin(), firstTask.end(), begin) -
                                   firstTask.begin() - 1);
    for (int64_t t = begin; t < end; ++t) {
      while (j + 1 < jobs.size() && t >= firstTask[j + 1]) ++j;
      runTask(jobs[j], splits[j], t - firstTask[j]);
    }
  });
}

void blasSgemm(const GemmArgs& g) {
  cblas_sgemm(CblasRowMajor, g.transA ? CblasTrans : CblasNoTrans,
              g.transB ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb,
              g.beta, g.c, g.ldc);
}

}  // namespace

bool gemmKernelSupported(GemmKernel kernel) { return cpuSupports(kernel); }

std::vector<GemmKernel> supportedGemmKernels() {
  std::vector<GemmKernel> kernels;
  for (GemmKernel k :
       {GemmKernel::kPortable, GemmKernel::kAvx2, GemmKernel::kAvx512, GemmKernel::kAvx512Bf16}) {
    if (cpuSupports(k)) kernels.push_back(k);
  }
  return kernels;
}

GemmKernel resolveGemmKernel(GemmKernel kernel) {
  if (kernel != GemmKernel::kAuto) return kernel;
  static const GemmKernel best = supportedGemmKernels().back();
  return best;
}

std::string gemmKernelName(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kAuto:
      return "auto";
    case GemmKernel::kPortable:
      return "portable";
    case GemmKernel::kAvx2:
      return "avx2";
    case GemmKernel::kAvx512:
      return "avx512";
    case GemmKernel::kAvx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

void sgemm(GemmSource source, const GemmArgs& args, ThreadPool& pool) {
  sgemm(GemmOptions{.source = source}, args, pool);
}

void sgemm(const GemmOptions& options, const GemmArgs& args, ThreadPool& pool) {
  sgemmBatch(options, {args}, pool);
}

void sgemmBatch(const GemmOptions& options, const std::vector<GemmArgs>& batch, ThreadPool& pool) {
  if (!options.native()) {
    // OpenBLAS runs its own threads (openblas_set_num_threads per plan run).
    for (const GemmArgs& g : batch) {
      blasSgemm(g);
      applyEpilogue(g, 0, g.m, 0, g.n);
    }
    return;
  }
  const NativeConfig config =
      nativeConfig(resolveGemmKernel(options.kernel), options.precision, options.kc);
  std::vector<NativeJob> jobs;
  jobs.reserve(batch.size());
  for (const GemmArgs& g : batch) {
    if (!trivial(g)) jobs.emplace_back(config, options, g, nullptr);
  }
  runNative(jobs, pool);
}

void PackedGemmB::Free::operator()(std::byte* p) const { std::free(p); }

PackedGemmB::PackedGemmB(const GemmOptions& options, bool transB, int64_t k, int64_t n,
                         const float* b, int64_t ldb)
    : k_(k),
      n_(n),
      kc_(options.kc),
      precision_(options.precision),
      kernel_(resolveGemmKernel(options.kernel)),
      options_(options) {
  options_.kernel = kernel_;
  const NativeConfig config = nativeConfig(kernel_, precision_, kc_);
  const int nr = config.nr();
  const int64_t paddedN = roundUp(n, nr);
  for (int64_t pc = 0; pc < k; pc += kc_) words_ += config.depth(std::min(kc_, k - pc)) * paddedN;
  data_.reset(allocateAligned(words_ * 4));
  const OperandView view = transB ? OperandView{b, ldb, 1} : OperandView{b, 1, ldb};
  auto* out = reinterpret_cast<uint32_t*>(data_.get());
  for (int64_t pc = 0; pc < k; pc += kc_) {
    const int64_t kcur = std::min(kc_, k - pc);
    packPanel(config, view, nr, 0, n, n, pc, kcur, out);
    out += config.depth(kcur) * paddedN;
  }
}

PackedGemmB::~PackedGemmB() = default;
PackedGemmB::PackedGemmB(PackedGemmB&&) noexcept = default;
PackedGemmB& PackedGemmB::operator=(PackedGemmB&&) noexcept = default;

int64_t PackedGemmB::bytes() const { return words_ * 4; }

void sgemm(const GemmArgs& args, const PackedGemmB& b, ThreadPool& pool) {
  KILN_CHECK(args.k == b.k() && args.n == b.n());
  if (trivial(args)) return;
  const NativeConfig config = nativeConfig(b.kernel(), b.precision(), b.kc());
  runNative({NativeJob(config, b.options(), args, reinterpret_cast<const uint32_t*>(b.data()))},
            pool);
}

}  // namespace kiln::cpu
