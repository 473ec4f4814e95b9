// kiln.Attention (src/kiln/ir/ops/attention.h) on the GPU, unfused: the scores
// scale * Q · K' of every batch entry as one strided-batch MatrixProduct into float32 scores in
// the workspace, the masked row softmax (attention.cu) into the probabilities P, then P · V as a
// second batched product into the output. Both products follow the node's cuda.gemm.source and
// cuda.gemm.algo; they have no epilogue. Every attribute (scale, transpose_k, nan_to_zero) and
// mask shape the reference takes. Tactic "kiln.attention.unfused".
//
// Q, K, V, the mask and the output are float32, float16 or bfloat16 (all one type). In float32 the
// softmax works in place (P is the scores). In float16 / bfloat16 both products take the reduced
// operands with float32 accumulation (cuBLASLt's CUBLAS_COMPUTE_32F); the first writes float32
// scores, so the softmax sees the sums unrounded, and writes P in the reduced type, in its own
// range of the workspace, for the second.
//
// The rows of the scores and of P are padded to 16 bytes (4 floats, 8 halves), so that every row
// cuBLASLt writes or reads starts 16-byte aligned whatever Skv is (ViT's 197, Swin's 49), as its
// fastest tensor-core kernels want.
//
// Fused (cuda.attention.kernel=flash, the default):
// flash_attention.cu's one kernel, which keeps the scores in shared memory and never writes them,
// for float16 / bfloat16 nodes with D == Dv in {32, 64, 128} and at least one query and one key.
// Tactic "kiln.attention.flash". Any other node asked for flash takes the unfused tactic.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/backends/cuda/kernels/attention.h"
#include "kiln/backends/cuda/kernels/flash_attention.h"
#include "kiln/backends/cuda/kernels/gemm_steps.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/attention.h"

namespace kiln::cuda {

const knobs::Knob kAttentionKernel = knobs::declareKnob({
    .name = "cuda.attention.kernel",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"flash", "unfused"},
    .defaultValue = "flash",
    .help = "kiln.Attention as one fused kernel that keeps the scores on chip (flash; float16 / "
            "bfloat16 with head size 32, 64 or 128, other nodes stay unfused), or as two cuBLASLt "
            "products around a softmax over float32 scores in the workspace (unfused)",
    .backends = {"cuda"},
    .perNode = true,
    // flash rounds the unnormalised probabilities to the storage type and sums them in another
    // order.
    .changesNumerics = true,
});

const knobs::Knob kAttentionFlashMinKeys = knobs::declareKnob({
    .name = "cuda.attention.flash_min_keys",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1", "128", "512"},
    .defaultValue = "1",
    .help = "the fewest keys a kiln.Attention needs to take the flash kernel (cuda.attention."
            "kernel=flash); shorter ones (Swin's 49-key windows, say) run unfused",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kAttentionFlashWarps = knobs::declareKnob({
    .name = "cuda.attention.flash.warps",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"4", "2", "8"},
    .defaultValue = "4",
    .help = "warps a CTA of the flash attention kernel, each 16 query rows: 2 makes twice the "
            "CTAs of 4 (a short batch fills more SMs), 8 half as many (each staged key tile "
            "serves 128 rows)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kAttentionFlashSkipMasked = knobs::declareKnob({
    .name = "cuda.attention.flash.skip_masked",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "with a constant mask (GPT-2's causal one, say), a CTA of the flash kernel walks only "
            "the key tiles where the mask leaves some key to one of its query rows, its blocks "
            "with the most tiles launched first (on), or every tile (off). The same bits for "
            "finite scores; a NaN or infinite score under an all -inf tile no longer makes its "
            "row NaN",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kAttentionFlashSplit = knobs::declareKnob({
    .name = "cuda.attention.flash.split",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"off", "auto", "1", "2", "4"},
    // off until the kernel's GPU tests and timings have run (not yet: 2026-12-08).
    .defaultValue = "off",
    .help = "the most key tiles (64 keys each) one CTA of the flash kernel walks: a query block "
            "with more is split over several CTAs, whose partial rows a second kernel merges "
            "(split-KV). auto: 2 where the kernel would otherwise launch fewer CTAs than the GPU "
            "has SMs and some block walks more than 2 tiles (GPT-2's 96 causal blocks of up to "
            "8 tiles at batch 1), else off; off: every block's keys in one CTA",
    .backends = {"cuda"},
    .perNode = true,
    // The parts' sums are merged in another order, their probabilities rounded against their
    // own running maxima.
    .changesNumerics = true,
});

const knobs::Knob kAttentionSoftmaxWarpRows = knobs::declareKnob({
    .name = "cuda.attention.softmax.warp_rows",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"4", "2", "8"},
    .defaultValue = "4",
    .help = "unfused attention (cuda.attention.kernel=unfused, and the nodes flash does not take): "
            "rows of scores its softmax gives a block when each row of up to 1024 keys takes a "
            "warp",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kAttentionSoftmaxBlockThreads = knobs::declareKnob({
    .name = "cuda.attention.softmax.block_threads",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"512", "128", "256"},
    .defaultValue = "512",
    .help = "unfused attention: threads of the block its softmax gives each row of more than 1024 "
            "keys",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

// flash is the default wherever the kernel applies. Measured on the H200 (fp16, CUDA graph
// replay, whole models, 2026-12-03, with the attention_heads layout): GPT-2 b1 s512 (12 heads,
// 512 causal keys) 0.879 ms unfused against 0.667 ms flash; BERT-base b8 s128 0.859 against
// 0.760 ms. (The WMMA kernel this one replaced lost at 512 keys, 58 against 45 us a layer.)

constexpr int64_t kAlignment = 256;

int64_t alignUp(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Elements from one row of `skv` elements of `type` to the next: a whole number of 16 bytes.
int64_t rowPitch(int64_t skv, GemmType type) {
  const int64_t perPack = 16 / gemmTypeBytes(type);
  return (skv + perPack - 1) / perPack * perPack;
}

// The products run over `heads` batch entries at a time (all of them in the plain form, where
// heads is 1 and the entries are dense, one after another; one outer entry's H heads, a column
// block each, in the heads form). strideOf is an operand's step from one entry of a product's
// batch to the next.
int64_t productBatch(const ir::AttentionGeometry& g) { return g.heads == 1 ? g.batch : g.heads; }
int64_t productCount(const ir::AttentionGeometry& g) {
  return g.heads == 1 ? 1 : g.batch / g.heads;
}
int64_t strideOf(const ir::AttentionGeometry& g, const ir::AttentionOperand& o) {
  return g.heads == 1 ? o.outerStride : o.headStride;
}

// scores[b] = scale * Q[b] · K'[b]: Q [Sq, D]; K' [D, Skv] as stored, or K [Skv, D] transposed.
// The scores are float32 whatever the operands' type, dense in the workspace.
ProductShape scoresShape(const ir::AttentionGeometry& g, GemmType type) {
  return {.m = g.sq,
          .n = g.skv,
          .k = g.d,
          .transB = g.transposeK,
          .alpha = g.scale,
          .batch = productBatch(g),
          .strideA = strideOf(g, g.q),
          .strideB = strideOf(g, g.k),
          .strideC = g.sq * rowPitch(g.skv, kGemmFloat32),
          .inputType = type,
          .outputType = kGemmFloat32,
          .lda = g.q.rowStride,
          .ldb = g.k.rowStride,
          .ldc = rowPitch(g.skv, kGemmFloat32)};
}

// Y[b] = P[b] · V[b]: P [Sq, Skv], V [Skv, Dv].
ProductShape valuesShape(const ir::AttentionGeometry& g, GemmType type) {
  return {.m = g.sq,
          .n = g.dv,
          .k = g.skv,
          .batch = productBatch(g),
          .strideA = g.sq * rowPitch(g.skv, type),
          .strideB = strideOf(g, g.v),
          .strideC = strideOf(g, g.y),
          .inputType = type,
          .outputType = type,
          .lda = rowPitch(g.skv, type),
          .ldb = g.v.rowStride,
          .ldc = g.y.rowStride};
}

// Q, K and V's device addresses (the packed heads form's K and V are in input 0), each at its
// first matrix.
struct Operands {
  const std::byte* q;
  const std::byte* k;
  const std::byte* v;
  std::byte* y;
};

Operands operandsOf(const Context& c, const Step& step, const ir::AttentionGeometry& g) {
  const int64_t size = ir::dtypeSize(step.outputs[0]->dtype);
  const std::byte* q = c.address(*step.inputs[0]);
  const std::byte* k = g.packed ? q : c.address(*step.inputs[1]);
  const std::byte* v = g.packed ? q : c.address(*step.inputs[2]);
  return {q + g.q.base * size, k + g.k.base * size, v + g.v.base * size,
          c.address(*step.outputs[0]) + g.y.base * size};
}

// A copy of `host` in device memory the plan keeps (`what` names it in an allocation failure);
// null when `host` is empty.
template <typename E>
Result<const E*> uploadVector(PrepareContext& prepare, const std::vector<E>& host,
                              std::string_view what) {
  if (host.empty()) return static_cast<const E*>(nullptr);
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(E));
  KILN_ASSIGN_OR_RETURN(std::byte * device, prepare.allocate(bytes, what));
  KILN_CUDA_CHECK(
      cudaMemcpy(device, host.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
  return reinterpret_cast<const E*>(device);
}

// The mask's per-batch-entry offsets (AttentionGeometry::maskBatchOffsets) in device memory the
// plan keeps, for either tactic's kernel; null without a mask or batch entries.
Result<const int64_t*> uploadMaskOffsets(PrepareContext& prepare, const ir::AttentionGeometry& g) {
  if (!g.hasMask || g.batch <= 0) return static_cast<const int64_t*>(nullptr);
  return uploadVector(prepare, g.maskBatchOffsets, "kiln.Attention's mask offsets");
}

// The mask (input 3) as the kernels read it, with its offsets' device copy; none without one.
AttentionMask maskOf(const Context& c, const Step& step, const ir::AttentionGeometry& g,
                     const int64_t* deviceOffsets) {
  if (!g.hasMask) return {};
  return {.values = c.address(*step.inputs[3]),
          .batchOffsets = deviceOffsets,
          .rowStride = g.maskRowStride,
          .columnStride = g.maskColumnStride};
}

class AttentionStep final : public Step {
 public:
  AttentionStep(ir::AttentionGeometry geometry, GemmType type, const ProductOptions& options,
                int warpRows, int blockThreads)
      : g_(std::move(geometry)),
        type_(type),
        warpRows_(warpRows),
        blockThreads_(blockThreads),
        scores_(scoresShape(g_, type), options, GemmEpilogue{}, false),
        values_(valuesShape(g_, type), options, GemmEpilogue{}, false),
        scoresBytes_(alignUp(g_.batch * g_.sq * rowPitch(g_.skv, kGemmFloat32) *
                             static_cast<int64_t>(sizeof(float)))),
        probabilitiesBytes_(
            type == kGemmFloat32
                ? 0
                : alignUp(g_.batch * g_.sq * rowPitch(g_.skv, type) * gemmTypeBytes(type))) {
    tactic = "kiln.attention.unfused";
  }

  Status prepare(PrepareContext& prepare) override {
    const Context& c = prepare.context;
    KILN_ASSIGN_OR_RETURN(maskOffsets_, uploadMaskOffsets(prepare, g_));
    // The scores and probabilities live in the workspace, which does not exist yet: timing uses
    // scratch for them.
    const Operands x = operandsOf(c, *this, g_);
    KILN_RETURN_IF_ERROR(scores_.prepare(prepare, x.q, x.k, nullptr, nullptr));
    return values_.prepare(prepare, nullptr, x.v, x.y, nullptr);
  }

  std::string detail() const override {
    const std::string softmax = g_.skv <= 1024
                                    ? fmt::format("a warp a row, {} rows a block", warpRows_)
                                    : fmt::format("a {}-thread block a row", blockThreads_);
    return "scores: " + scores_.detail() + "; softmax: " + softmax +
           "; values: " + values_.detail();
  }

  // [scores (float32) | probabilities (reduced types only) | cuBLASLt's workspace].
  int64_t workspaceBytes() const override {
    return scoresBytes_ + probabilitiesBytes_ +
           std::max(scores_.workspaceBytes(), values_.workspaceBytes());
  }

  Status enqueue(const Context& context) const override {
    if (context.workspaceBytes < workspaceBytes()) {
      return internalError("kiln.Attention needs {} bytes of workspace, has {}", workspaceBytes(),
                           context.workspaceBytes);
    }
    float* scores = reinterpret_cast<float*>(context.workspace);
    void* probabilities =
        probabilitiesBytes_ > 0 ? static_cast<void*>(context.workspace + scoresBytes_) : scores;
    const int64_t ltOffset = scoresBytes_ + probabilitiesBytes_;
    std::byte* ltWorkspace = context.workspace ? context.workspace + ltOffset : nullptr;
    const int64_t ltBytes = context.workspaceBytes - ltOffset;
    // The heads form: one pair of products per outer batch entry, whose H heads are the
    // products' batch.
    const Operands x = operandsOf(context, *this, g_);
    const int64_t size = gemmTypeBytes(type_);
    const int64_t count = productCount(g_);
    const int64_t scoresStep = g_.heads * g_.sq * rowPitch(g_.skv, kGemmFloat32);
    const int64_t probabilitiesStep = g_.heads * g_.sq * rowPitch(g_.skv, type_);
    for (int64_t o = 0; o < count; ++o) {
      KILN_RETURN_IF_ERROR(
          scores_.enqueue(context, ltWorkspace, ltBytes, x.q + o * g_.q.outerStride * size,
                          x.k + o * g_.k.outerStride * size, scores + o * scoresStep, nullptr));
    }
    AttentionSoftmaxArgs softmax;
    softmax.scores = scores;
    softmax.probabilities = probabilities;
    softmax.type = type_;
    softmax.batch = g_.batch;
    softmax.sq = g_.sq;
    softmax.skv = g_.skv;
    softmax.scoresPitch = rowPitch(g_.skv, kGemmFloat32);
    softmax.probabilitiesPitch = rowPitch(g_.skv, type_);
    softmax.mask = maskOf(context, *this, g_, maskOffsets_);
    softmax.nanToZero = g_.nanToZero;
    softmax.warpRows = warpRows_;
    softmax.blockThreads = blockThreads_;
    KILN_RETURN_IF_ERROR(
        cudaStatus(launchAttentionSoftmax(softmax, context.stream), "the attention softmax"));
    for (int64_t o = 0; o < count; ++o) {
      KILN_RETURN_IF_ERROR(values_.enqueue(
          context, ltWorkspace, ltBytes,
          static_cast<std::byte*>(probabilities) + o * probabilitiesStep * size,
          x.v + o * g_.v.outerStride * size, x.y + o * g_.y.outerStride * size, nullptr));
    }
    return Status::ok();
  }

 private:
  const ir::AttentionGeometry g_;
  const GemmType type_;
  const int warpRows_;
  const int blockThreads_;
  MatrixProduct scores_;
  MatrixProduct values_;
  const int64_t scoresBytes_;
  const int64_t probabilitiesBytes_;
  const int64_t* maskOffsets_ = nullptr;  // device copy of g_.maskBatchOffsets
};

// FlashAttentionArgs::keyTiles for a constant mask of the node's type: for each block of
// `blockRows` query rows, the first and one past the last tile of kFlashKeyTile keys in which a
// row of the block, in some batch entry, has a key whose mask value is not -inf ({0, 0} where
// there is none). Empty where that leaves every tile to walk.
std::vector<int32_t> maskedKeyTiles(const ir::Tensor& mask, const ir::AttentionGeometry& g,
                                    int64_t blockRows) {
  const int64_t blocks = (g.sq + blockRows - 1) / blockRows;
  const int64_t tiles = (g.skv + kFlashKeyTile - 1) / kFlashKeyTile;
  std::vector<int64_t> entries = g.maskBatchOffsets;  // batch entries with the same mask once
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  std::vector<int32_t> range(static_cast<size_t>(2 * blocks), 0);
  int64_t walked = 0;
  for (int64_t block = 0; block < blocks; ++block) {
    int64_t first = tiles, last = -1;
    for (const int64_t entry : entries) {
      for (int64_t i = block * blockRows; i < std::min(g.sq, (block + 1) * blockRows); ++i) {
        for (int64_t j = 0; j < g.skv; ++j) {
          const double value =
              mask.elementAsDouble(entry + i * g.maskRowStride + j * g.maskColumnStride);
          if (std::isinf(value) && value < 0) continue;
          first = std::min(first, j / kFlashKeyTile);
          last = std::max(last, j / kFlashKeyTile);
        }
      }
    }
    if (last >= 0) {
      range[static_cast<size_t>(2 * block)] = static_cast<int32_t>(first);
      range[static_cast<size_t>(2 * block + 1)] = static_cast<int32_t>(last + 1);
      walked += last + 1 - first;
    }
  }
  if (walked == blocks * tiles) return {};
  return range;
}

// Split keys (cuda.attention.flash.split) on the host: FlashAttentionArgs::work and ::combine,
// and the slots of partial rows a batch entry needs. Empty where no block is split.
struct FlashSplit {
  std::vector<int32_t> work;     // {query block, first tile, end tile, slot} a CTA
  std::vector<int32_t> combine;  // {query block, first slot, slots} a split block
  int slots = 0;
  int maxTiles = 0;  // the most tiles a CTA walks
};

// Splits each query block's range of key tiles (keyTiles' pairs, or every tile of `tiles` without
// them) into as few parts of at most `maxTiles` tiles as it takes, of sizes differing by at most
// one; the work items longest first (stable, so in block order among equals).
FlashSplit splitKeyTiles(const std::vector<int32_t>& keyTiles, int64_t blocks, int64_t tiles,
                         int maxTiles) {
  FlashSplit split;
  std::vector<std::array<int32_t, 4>> items;
  for (int64_t block = 0; block < blocks; ++block) {
    const int32_t first = keyTiles.empty() ? 0 : keyTiles[static_cast<size_t>(2 * block)];
    const int32_t end = keyTiles.empty() ? static_cast<int32_t>(tiles)
                                         : keyTiles[static_cast<size_t>(2 * block + 1)];
    const int32_t length = end - first;
    const int32_t parts = std::max<int32_t>(1, (length + maxTiles - 1) / maxTiles);
    const auto id = static_cast<int32_t>(block);
    if (parts == 1) {
      items.push_back({id, first, end, -1});
      continue;
    }
    split.combine.insert(split.combine.end(), {id, split.slots, parts});
    int32_t from = first;
    for (int32_t p = 0; p < parts; ++p) {
      const int32_t size = length / parts + (p < length % parts ? 1 : 0);
      items.push_back({id, from, from + size, split.slots++});
      from += size;
    }
  }
  if (split.combine.empty()) return {};
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a[2] - a[1] > b[2] - b[1]; });
  for (const auto& item : items) {
    split.work.insert(split.work.end(), item.begin(), item.end());
    split.maxTiles = std::max(split.maxTiles, item[2] - item[1]);
  }
  return split;
}

// The fused kernel (flash_attention.h): one launch, or with split keys two (the flash kernel and
// the combine kernel) and a workspace for the partial rows.
class FlashAttentionStep final : public Step {
 public:
  // keyTiles: FlashAttentionArgs::keyTiles on the host (empty: every tile); split: the split of
  // the blocks' keys (empty: none).
  FlashAttentionStep(ir::AttentionGeometry geometry, GemmType type, int warps,
                     std::vector<int32_t> keyTiles, FlashSplit split)
      : g_(std::move(geometry)),
        type_(type),
        warps_(warps),
        keyTiles_(std::move(keyTiles)),
        split_(std::move(split)),
        partialBytes_(alignUp(g_.batch * split_.slots * warps_ * 16 * g_.d *
                              static_cast<int64_t>(sizeof(float)))) {
    tactic = "kiln.attention.flash";
  }

  std::string detail() const override {
    std::string text = fmt::format("{} warps, {} query rows a CTA", warps_, warps_ * 16);
    if (!keyTiles_.empty()) {
      int64_t walked = 0;
      for (size_t i = 0; i < keyTiles_.size(); i += 2) walked += keyTiles_[i + 1] - keyTiles_[i];
      const int64_t tiles = (g_.skv + kFlashKeyTile - 1) / kFlashKeyTile;
      text += fmt::format(", {} of {} key tiles walked (the rest masked)", walked,
                          tiles * static_cast<int64_t>(keyTiles_.size() / 2));
    }
    if (!split_.work.empty()) {
      const int64_t blocks = (g_.sq + warps_ * 16 - 1) / (warps_ * 16);
      text += fmt::format(
          ", keys split over {} CTAs an entry (at most {} {} each; {} parts merged into {} of "
          "the {} blocks)",
          split_.work.size() / 4, split_.maxTiles, split_.maxTiles == 1 ? "tile" : "tiles",
          split_.slots, split_.combine.size() / 3, blocks);
    }
    return text;
  }

  // [partial rows (float, d a row) | their maxima and sums (2 floats a row)], with split keys.
  int64_t workspaceBytes() const override {
    if (split_.work.empty()) return 0;
    return partialBytes_ +
           alignUp(g_.batch * split_.slots * warps_ * 16 * 2 * static_cast<int64_t>(sizeof(float)));
  }

  Status prepare(PrepareContext& prepare) override {
    KILN_ASSIGN_OR_RETURN(const DeviceInfo device, currentDevice());
    if (device.computeMajor < 8) {
      return internalError(
          "kiln.attention.flash needs compute capability 8.0 or newer, {} has "
          "{}.{}; use -cuda.attention.kernel=unfused",
          device.name, device.computeMajor, device.computeMinor);
    }
    KILN_ASSIGN_OR_RETURN(maskOffsets_, uploadMaskOffsets(prepare, g_));
    KILN_ASSIGN_OR_RETURN(deviceKeyTiles_,
                          uploadVector(prepare, keyTiles_, "the flash kernel's key tiles"));
    KILN_ASSIGN_OR_RETURN(deviceWork_,
                          uploadVector(prepare, split_.work, "the flash kernel's split keys"));
    KILN_ASSIGN_OR_RETURN(deviceCombine_,
                          uploadVector(prepare, split_.combine, "the flash kernel's split blocks"));
    return cudaStatus(configureFlashAttention(args(prepare.context)),
                      "the flash attention kernel's shared memory limit");
  }

  Status enqueue(const Context& context) const override {
    if (context.workspaceBytes < workspaceBytes()) {
      return internalError("kiln.Attention's split keys need {} bytes of workspace, have {}",
                           workspaceBytes(), context.workspaceBytes);
    }
    return cudaStatus(launchFlashAttention(args(context), context.stream),
                      "the flash attention kernel");
  }

 private:
  FlashAttentionArgs args(const Context& context) const {
    FlashAttentionArgs a;
    const Operands x = operandsOf(context, *this, g_);
    a.q = x.q;
    a.k = x.k;
    a.v = x.v;
    a.y = x.y;
    a.heads = g_.heads;
    auto layout = [](const ir::AttentionOperand& o) {
      return FlashOperand{
          .outerStride = o.outerStride, .headStride = o.headStride, .rowStride = o.rowStride};
    };
    a.qLayout = layout(g_.q);
    a.kLayout = layout(g_.k);
    a.vLayout = layout(g_.v);
    a.yLayout = layout(g_.y);
    a.type = type_;
    a.batch = g_.batch;
    a.sq = g_.sq;
    a.skv = g_.skv;
    a.d = g_.d;
    a.transposeK = g_.transposeK;
    a.scale = g_.scale;
    a.mask = maskOf(context, *this, g_, maskOffsets_);
    a.nanToZero = g_.nanToZero;
    a.warps = warps_;
    a.keyTiles = deviceKeyTiles_;
    if (!split_.work.empty()) {
      a.work = deviceWork_;
      a.works = static_cast<int>(split_.work.size() / 4);
      a.slots = split_.slots;
      a.partial = reinterpret_cast<float*>(context.workspace);
      a.partialStats =
          context.workspace ? reinterpret_cast<float*>(context.workspace + partialBytes_) : nullptr;
      a.combine = deviceCombine_;
      a.combines = static_cast<int>(split_.combine.size() / 3);
    }
    return a;
  }

  const ir::AttentionGeometry g_;
  const GemmType type_;
  const int warps_;
  const std::vector<int32_t> keyTiles_;
  const FlashSplit split_;
  const int64_t partialBytes_;
  const int64_t* maskOffsets_ = nullptr;     // device copy of g_.maskBatchOffsets
  const int32_t* deviceKeyTiles_ = nullptr;  // device copy of keyTiles_
  const int32_t* deviceWork_ = nullptr;      // device copy of split_.work
  const int32_t* deviceCombine_ = nullptr;   // device copy of split_.combine
};

// The most key tiles a CTA walks under cuda.attention.flash.split for this node, 0 for no split.
// auto: 2 where the unsplit kernel's CTAs (batch entries times query blocks) are fewer than the
// device's SMs (132 on an H100 or H200, taken without a device), so that the longest blocks,
// which set the kernel's time in a single wave, share their keys with otherwise idle SMs.
int splitTilesFor(const std::string& value, const ir::AttentionGeometry& g, int64_t blockRows) {
  if (value == "off") return 0;
  if (value != "auto") return std::stoi(value);
  constexpr int kAutoTiles = 2;
  constexpr int kReferenceSms = 132;
  const Result<DeviceInfo> device = currentDevice();
  const int64_t sms =
      device.isOk() && device->multiprocessors > 0 ? device->multiprocessors : kReferenceSms;
  const int64_t ctas = g.batch * ((g.sq + blockRows - 1) / blockRows);
  return ctas < sms ? kAutoTiles : 0;
}

// The storage type Q, K, V, the mask and the output share, if the products take it.
std::optional<GemmType> sharedType(const ir::Node& node) {
  if (node.outputs.size() != 1 || !node.outputs[0]) return std::nullopt;
  const ir::DType dtype = node.outputs[0]->dtype;
  for (const ir::Value* v : node.inputs) {
    if (v && v->dtype != dtype) return std::nullopt;
  }
  return gemmTypeOf(dtype);
}

std::unique_ptr<Step> makeAttentionStep(const ir::Node& node, const knobs::Route& route) {
  if (node.domain != ir::kKilnDomain || node.opType != "Attention") return nullptr;
  const std::optional<GemmType> type = sharedType(node);
  if (!type) return nullptr;
  auto geometry = ir::attentionGeometry(node);
  if (!geometry.isOk()) return nullptr;
  const ir::AttentionGeometry& g = *geometry;
  const std::string kernel = route.value(kAttentionKernel, &node);
  const bool flash = kernel == "flash";
  const int64_t minKeys = std::stoll(route.value(kAttentionFlashMinKeys, &node));
  if (flash && g.skv >= minKeys &&
      flashAttentionSupports(*type, g.d, g.dv, g.batch * g.sq, g.skv)) {
    const int warps = std::stoi(route.value(kAttentionFlashWarps, &node));
    std::vector<int32_t> keyTiles;
    const ir::Value* mask = node.input(3);
    if (g.hasMask && mask && mask->constant &&
        route.value(kAttentionFlashSkipMasked, &node) == "on") {
      keyTiles = maskedKeyTiles(*mask->constant, g, int64_t{warps} * 16);
    }
    const int64_t blockRows = int64_t{warps} * 16;
    FlashSplit split;
    if (const int tiles = splitTilesFor(route.value(kAttentionFlashSplit, &node), g, blockRows);
        tiles > 0) {
      split = splitKeyTiles(keyTiles, (g.sq + blockRows - 1) / blockRows,
                            (g.skv + kFlashKeyTile - 1) / kFlashKeyTile, tiles);
    }
    return std::make_unique<FlashAttentionStep>(std::move(*geometry), *type, warps,
                                                std::move(keyTiles), std::move(split));
  }
  return std::make_unique<AttentionStep>(
      std::move(*geometry), *type, productOptionsFor(node, route),
      std::stoi(route.value(kAttentionSoftmaxWarpRows, &node)),
      std::stoi(route.value(kAttentionSoftmaxBlockThreads, &node)));
}

const int kRegistered = registerStepFactory(kRankAttention, "attention", makeAttentionStep);

}  // namespace
}  // namespace kiln::cuda
