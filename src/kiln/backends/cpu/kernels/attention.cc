// kiln.Attention in float32 (src/kiln/ir/ops/attention.h), one block of query rows at a time:
// for each (batch entry, block of rows of Q), the block's scores scale * Q_blk · K' go through
// sgemm() into a per-chunk scratch [rows, Skv], the mask is added and each row softmaxed in place
// (max-subtracted), and the probabilities multiply V straight into the output. The whole [Sq, Skv]
// score matrix never exists: a block's scores stay in cache between the two products.
//
// Blocks are spread over the plan's threads (each chunk of blocks with its own scratch); the
// products inside a block run on the calling thread (BLAS set to one thread meanwhile), since
// parallelFor does not nest. Each element's arithmetic does not depend on the split.

// Loops written for the vectoriser (see fast_math.h); before the includes on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno", \
                     "fp-contract=off")
#endif

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/sgemm.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/attention.h"

namespace kiln::cpu {

const knobs::Knob kAttentionImpl = knobs::declareKnob({
    .name = "cpu.attention.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "kiln.Attention: blocks of query rows through sgemm with the masked softmax between "
            "the two products (float32), or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

// 2026-12-03, 2 threads, attention layers summed (three 2 s runs, shared machine): vit_tiny
// (Skv 197) auto 3.52-3.95 ms, 32 3.43-3.64, 64 3.36-3.48, 128 3.48-3.53, 256 3.54-3.60;
// bert_mini (Skv 128) auto 1.55-1.61, 32 1.64-1.83, 64 1.58-1.77, 256 1.58-1.64: within noise
// on vit_tiny, auto best on bert_mini.
const knobs::Knob kAttentionBlockRows = knobs::declareKnob({
    .name = "cpu.attention.block_rows",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "16", "32", "64", "128", "256"},
    .defaultValue = "auto",
    .help = "auto: kiln.Attention takes blocks of up to 16-128 query rows, as many as keep a "
            "block's scores within 256 KiB; 16: blocks of at most 16 rows; 32: of at most 32 rows; "
            "64: of at most 64 rows; 128: of at most 128 rows; 256: of at most 256 rows",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

// Query rows per block, at most: as many as keep a block's scores ([rows, Skv] floats) within
// 256 KiB, so that they stay in L2 between the two products, from 16 to 128. Larger blocks pack K'
// and V fewer times (once per block); on bert_mini's and vit_tiny's heads (Skv 128 and 197) 128
// rows ran 5-10% faster than 64 and 25-35% faster than 16 or 32 (one thread).
int64_t blockRowsFor(int64_t skv) {
  constexpr int64_t kScoreFloats = 64 * 1024;
  return std::clamp<int64_t>(kScoreFloats / std::max<int64_t>(skv, 1), 16, 128);
}

// Lanes of the row loops below: a fixed trip count the vectoriser maps onto vector registers.
constexpr int64_t kLanes = 16;

// One row of scores, in place: + mask, softmax (max-subtracted), NaN to 0 if asked. The row is
// `width` scores in a buffer of `padded` floats (a multiple of kLanes); the padding is set to
// -inf, whose exponential is 0, so that every loop after the mask runs over whole vectors with
// no remainder. The mask's column stride is 1 or 0 (a mask broadcast along the keys). The row is
// the block's scratch, so it never overlaps the mask (__restrict lets the mask Add vectorise).
// The kLanes partial maxima and sums are the same whatever the vector width, so every version
// (KILN_ELTWISE_CLONES) computes the same bits.
KILN_ELTWISE_CLONES void softmaxRow(float* __restrict row, int64_t width, int64_t padded,
                                    const float* __restrict mask, int64_t maskStride,
                                    bool nanToZero) {
  const int64_t full = width / kLanes * kLanes;
  if (mask && maskStride == 1) {
    for (int64_t j = 0; j < full; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) row[j + l] += mask[j + l];
    }
    for (int64_t j = full; j < width; ++j) row[j] += mask[j];
  } else if (mask) {
    const float m = mask[0];
    for (int64_t j = 0; j < full; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) row[j + l] += m;
    }
    for (int64_t j = full; j < width; ++j) row[j] += m;
  }
  for (int64_t j = width; j < padded; ++j) row[j] = -std::numeric_limits<float>::infinity();

  float lanes[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lanes[l] = row[l];
  for (int64_t j = kLanes; j < padded; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = row[j + l] > lanes[l] ? row[j + l] : lanes[l];
  }
  float max = lanes[0];
  for (int64_t l = 1; l < kLanes; ++l) max = lanes[l] > max ? lanes[l] : max;

  // Subtracting the maximum keeps exp from overflowing; it cancels out of the result. A row of
  // -inf gives NaN (-inf - -inf), as the unfused Softmax and the reference kernel do.
  for (int64_t l = 0; l < kLanes; ++l) lanes[l] = 0.0f;
  for (int64_t j = 0; j < padded; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const float e = fastExp(row[j + l] - max);
      row[j + l] = e;
      lanes[l] += e;
    }
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];

  const float inverse = 1.0f / sum;
  if (nanToZero) {
    for (int64_t j = 0; j < padded; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float p = row[j + l] * inverse;
        row[j + l] = p != p ? 0.0f : p;
      }
    }
  } else {
    for (int64_t j = 0; j < padded; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) row[j + l] *= inverse;
    }
  }
}

class AttentionStep : public Step {
 public:
  // `maxRows`: rows a block holds at most (cpu.attention.block_rows), 0 for blockRowsFor().
  AttentionStep(ir::AttentionGeometry geometry, GemmSource source, int64_t maxRows)
      : g_(std::move(geometry)), source_(source) {
    // Rows split evenly over the fewest blocks of at most maxRows rows. The split depends on the
    // shapes alone, not on the thread count.
    if (maxRows <= 0) maxRows = blockRowsFor(g_.skv);
    const int64_t blocks = std::max<int64_t>(1, (g_.sq + maxRows - 1) / maxRows);
    blocksPerBatch_ = g_.sq == 0 ? 0 : blocks;
    blockRows_ = g_.sq == 0 ? 0 : (g_.sq + blocks - 1) / blocks;
    // Rows of the scratch are padded to whole vectors of kLanes floats (see softmaxRow).
    ldScores_ = std::max<int64_t>(kLanes, (g_.skv + kLanes - 1) / kLanes * kLanes);
  }

  Status run(const ExecutionContext& context) const override {
    const int64_t items = g_.batch * blocksPerBatch_;
    ThreadPool& pool = context.pool();
    const int64_t chunks = pool.chunkCount(items, 1);
    while (static_cast<int64_t>(scratch_.size()) < chunks) {
      scratch_.push_back(std::make_unique<ChunkScratch>(blockRows_ * ldScores_));
    }
    // The packed heads form reads K and V from input 0 too.
    const float* q = context.data<float>(*inputs[0]);
    const Operands operands{
        .q = q,
        .k = g_.packed ? q : context.data<float>(*inputs[1]),
        .v = g_.packed ? q : context.data<float>(*inputs[2]),
        .mask = g_.hasMask ? context.data<float>(*inputs[3]) : nullptr,
        .y = context.data<float>(*outputs[0]),
    };
    // The blocks' products run inside the pool's chunks: OpenBLAS must not start its own threads
    // from each of them (and, with one thread per block whatever the pool's size, each block's
    // arithmetic is the same on any number of threads).
    const bool serialBlas = source_ == GemmSource::kBlas && pool.size() > 1;
    if (serialBlas) openblas_set_num_threads(1);
    pool.parallelFor(chunks, 1, [&](int64_t first, int64_t last) {
      for (int64_t chunk = first; chunk < last; ++chunk) {
        ChunkScratch& scratch = *scratch_[static_cast<size_t>(chunk)];
        for (int64_t item = chunk * items / chunks; item < (chunk + 1) * items / chunks; ++item) {
          runBlock(operands, item, scratch);
        }
      }
    });
    if (serialBlas) openblas_set_num_threads(pool.size());
    return Status::ok();
  }

 private:
  struct Operands {
    const float* q;
    const float* k;
    const float* v;
    const float* mask;
    float* y;
  };
  // What one chunk of blocks works in: its scores, and a pool of one thread (the chunk's own)
  // for the products.
  struct ChunkScratch {
    explicit ChunkScratch(int64_t floats) : scores(static_cast<size_t>(floats)), serial(1) {}
    std::vector<float> scores;
    ThreadPool serial;
  };

  void runBlock(const Operands& x, int64_t item, ChunkScratch& scratch) const {
    const int64_t b = item / blocksPerBatch_;
    const int64_t block = item % blocksPerBatch_;
    const int64_t r0 = block * blockRows_;
    const int64_t rows = std::min(blockRows_, g_.sq - r0);
    if (rows <= 0) return;
    float* scores = scratch.scores.data();
    sgemm(source_,
          {.transB = g_.transposeK,
           .m = rows,
           .n = g_.skv,
           .k = g_.d,
           .alpha = g_.scale,
           .a = x.q + g_.q.offset(b, g_.heads) + r0 * g_.q.rowStride,
           .lda = g_.q.rowStride,
           .b = x.k + g_.k.offset(b, g_.heads),
           .ldb = g_.k.rowStride,
           .c = scores,
           .ldc = ldScores_},
          scratch.serial);
    for (int64_t i = 0; i < rows; ++i) {
      const float* mask = x.mask ? x.mask + g_.maskBatchOffsets[static_cast<size_t>(b)] +
                                       (r0 + i) * g_.maskRowStride
                                 : nullptr;
      softmaxRow(scores + i * ldScores_, g_.skv, ldScores_, mask, g_.maskColumnStride,
                 g_.nanToZero);
    }
    sgemm(source_,
          {.m = rows,
           .n = g_.dv,
           .k = g_.skv,
           .a = scores,
           .lda = ldScores_,
           .b = x.v + g_.v.offset(b, g_.heads),
           .ldb = g_.v.rowStride,
           .c = x.y + g_.y.offset(b, g_.heads) + r0 * g_.y.rowStride,
           .ldc = g_.y.rowStride},
          scratch.serial);
  }

  const ir::AttentionGeometry g_;
  const GemmSource source_;
  int64_t blocksPerBatch_ = 0, blockRows_ = 0, ldScores_ = 0;
  mutable std::vector<std::unique_ptr<ChunkScratch>> scratch_;  // one per chunk, kept across runs
};

bool allFloat32(const ir::Node& node) {
  for (const ir::Value* v : node.inputs) {
    if (v && v->dtype != ir::DType::kFloat32) return false;
  }
  return node.outputs[0]->dtype == ir::DType::kFloat32;
}

}  // namespace

std::unique_ptr<Step> makeAttentionStep(const ir::Node& node, const knobs::Route& route) {
  if (node.domain != ir::kKilnDomain || node.opType != "Attention" || !allFloat32(node)) {
    return nullptr;
  }
  if (route.value(kAttentionImpl, &node) != "fast") return nullptr;
  auto geometry = ir::attentionGeometry(node);
  if (!geometry.isOk() || geometry->skv == 0) return nullptr;
  const std::string blockRows = route.value(kAttentionBlockRows, &node);
  auto step = std::make_unique<AttentionStep>(std::move(*geometry), gemmSourceFor(node, route),
                                              blockRows == "auto" ? 0 : std::stoll(blockRows));
  step->tactic = "fast.attention" + (blockRows == "auto" ? "" : ".r" + blockRows);
  return step;
}

}  // namespace kiln::cpu
