// Effects of the CUDA attention knobs (kernels/attention_steps.cc): kiln.Attention as the unfused
// products around a softmax, or as the fused flash kernel, and the unfused softmax's launch.
// Lowering names the kernel in the step's tactic and the launch in its detail, so the difference
// shows without a GPU; outputs are compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "graph_sketch.h"
#include "kiln/ir/op_schema.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// One kiln.Attention over [1, 2, 40, 64] heads with K [1, 2, 70, 64] (transpose_k) and a
// per-key mask, made float16 by the base route.
ir::Graph attentionHeads() {
  GraphSketch g;
  g.output(g.node("Attention",
                  {g.input("q", {1, 2, 40, 64}), g.input("k", {1, 2, 70, 64}),
                   g.input("v", {1, 2, 70, 64}), g.weight("mask", {1, 1, 1, 70}, 2.0f)},
                  {{"scale", ir::Attribute{0.125f}}, {"transpose_k", ir::Attribute{int64_t{1}}}},
                  "attn", ir::kKilnDomain));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.attention.kernel",
    .value = "unfused",
    .shows = "a float16 kiln.Attention over 70 keys, fused by default, runs as two cuBLASLt "
             "products around a softmax over float32 scores instead",
    .backend = "cuda",
    .graph = attentionHeads,
    .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("attn").tactic, "kiln.attention.flash");
          EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.unfused");
        },
});

[[maybe_unused]] const int kFlashWarpEffects = [] {
  for (const char* warps : {"2", "8"}) {
    const int rows = std::stoi(warps) * 16;
    registerKnobEffect({
        .knob = "cuda.attention.flash.warps",
        .value = warps,
        .shows = std::string("the flash kernel's CTAs are ") + warps + " warps (" +
                 std::to_string(rows) +
                 " query rows) instead of 4 (64 rows), with the same "
                 "result: each warp's rows are computed alike",
        .backend = "cuda",
        .graph = attentionHeads,
        .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
        .expect =
            [warps, rows](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("attn").detail, "4 warps, 64 query rows a CTA");
              EXPECT_EQ(
                  changed.layer("attn").detail,
                  std::string(warps) + " warps, " + std::to_string(rows) + " query rows a CTA");
              EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.flash");
            },
    });
  }
  return 0;
}();

// GPT-2's causal attention at 130 queries and keys: a constant [1, 1, 130, 130] mask, -inf above
// the diagonal.
ir::Graph causalAttention() {
  constexpr int64_t kLength = 130;
  std::vector<float> mask(static_cast<size_t>(kLength * kLength), 0.0f);
  for (int64_t i = 0; i < kLength; ++i) {
    for (int64_t j = i + 1; j < kLength; ++j) {
      mask[static_cast<size_t>(i * kLength + j)] = -std::numeric_limits<float>::infinity();
    }
  }
  GraphSketch g;
  g.output(g.node(
      "Attention",
      {g.input("q", {1, 2, kLength, 64}), g.input("k", {1, 2, kLength, 64}),
       g.input("v", {1, 2, kLength, 64}),
       g.constant("mask", ir::Tensor::fromVector<float>(ir::Shape{1, 1, kLength, kLength}, mask))},
      {{"scale", ir::Attribute{0.125f}}, {"transpose_k", ir::Attribute{int64_t{1}}}}, "attn",
      ir::kKilnDomain));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.attention.flash.skip_masked",
    .value = "off",
    .shows = "under a constant causal mask the flash kernel walks all 9 key tiles of its 3 query "
             "blocks instead of the 6 the mask leaves a key in",
    .backend = "cuda",
    .graph = causalAttention,
    // Split keys off (the default, pinned): they would split the ranges differently on each side.
    .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off -cuda.attention.flash.split=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("attn").tactic, "kiln.attention.flash");
          EXPECT_EQ(base.layer("attn").detail,
                    "4 warps, 64 query rows a CTA, 6 of 9 key tiles walked (the rest masked)");
          EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.flash");
          EXPECT_EQ(changed.layer("attn").detail, "4 warps, 64 query rows a CTA");
        },
});

// cuda.attention.flash.split (off by default) on the causal graph: its 3 query blocks walk 1, 2
// and 3 key tiles, in 6 CTAs (2 heads), fewer than any GPU's SMs, so auto splits the 3-tile
// block in two.
struct FlashSplitEffect {
  const char* value;
  const char* changed;  // added to the step's detail
  const char* shows;
};

[[maybe_unused]] const int kFlashSplitEffects = [] {
  const std::string masked =
      "4 warps, 64 query rows a CTA, 6 of 9 key tiles walked (the rest masked)";
  for (const FlashSplitEffect& e : std::vector<FlashSplitEffect>{
           {"auto",
            ", keys split over 4 CTAs an entry (at most 2 tiles each; 2 parts merged into 1 of "
            "the 3 blocks)",
            "the causal graph's 6 CTAs leave most SMs idle, so its 3-tile query block walks its "
            "keys in two CTAs whose parts a combine kernel merges"},
           {"1",
            ", keys split over 6 CTAs an entry (at most 1 tile each; 5 parts merged into 2 of "
            "the 3 blocks)",
            "every key tile of the causal graph's 2- and 3-tile query blocks gets its own CTA"},
       }) {
    registerKnobEffect({
        .knob = "cuda.attention.flash.split",
        .value = e.value,
        .shows = e.shows,
        .backend = "cuda",
        .graph = causalAttention,
        .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
        .tolerance = 1e-2,
        .expect =
            [masked, e](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("attn").detail, masked);
              EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.flash");
              EXPECT_EQ(changed.layer("attn").detail, masked + e.changed);
            },
    });
  }
  return 0;
}();

// kiln.Attention over [1, heads, queries, 64] queries and [1, heads, keys, 64] keys and values
// (transpose_k), unmasked, float32 until a route says otherwise.
std::function<ir::Graph()> plainAttention(int64_t heads, int64_t queries, int64_t keys) {
  return [=] {
    GraphSketch g;
    g.output(g.node("Attention",
                    {g.input("q", {1, heads, queries, 64}), g.input("k", {1, heads, keys, 64}),
                     g.input("v", {1, heads, keys, 64})},
                    {{"scale", ir::Attribute{0.125f}}, {"transpose_k", ir::Attribute{int64_t{1}}}},
                    "attn", ir::kKilnDomain));
    return g.take();
  };
}

// 48 heads of 130 queries against 130 keys (3 key tiles) unmasked: 144 CTAs, not fewer than an
// H100's or H200's 132 SMs, so auto would leave the keys whole.
KILN_KNOB_EFFECT({
    .knob = "cuda.attention.flash.split",
    .value = "2",
    .shows = "48 heads' 144 query blocks fill the GPU (auto would leave them whole), and 2 splits "
             "each block's 3 key tiles in two CTAs anyway",
    .backend = "cuda",
    .graph = plainAttention(48, 130, 130),
    .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
    .tolerance = 1e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("attn").detail, "4 warps, 64 query rows a CTA");
          EXPECT_EQ(changed.layer("attn").detail,
                    "4 warps, 64 query rows a CTA, keys split over 6 CTAs an entry (at most 2 "
                    "tiles each; 6 parts merged into 3 of the 3 blocks)");
        },
});

// 40 queries against 330 keys (6 key tiles, the last partial): one query block a head.
KILN_KNOB_EFFECT({
    .knob = "cuda.attention.flash.split",
    .value = "4",
    .shows = "a query block over 6 key tiles walks them in two CTAs of 3 instead of one",
    .backend = "cuda",
    .graph = plainAttention(2, 40, 330),
    .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
    .tolerance = 1e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("attn").detail, "4 warps, 64 query rows a CTA");
          EXPECT_EQ(changed.layer("attn").detail,
                    "4 warps, 64 query rows a CTA, keys split over 2 CTAs an entry (at most 3 "
                    "tiles each; 2 parts merged into 1 of the 1 blocks)");
        },
});

[[maybe_unused]] const int kFlashMinKeyEffects = [] {
  for (const char* keys : {"128", "512"}) {
    registerKnobEffect({
        .knob = "cuda.attention.flash_min_keys",
        .value = keys,
        .shows = std::string("a float16 kiln.Attention over 70 keys, fewer than ") + keys +
                 ", runs unfused instead of through the flash kernel",
        .backend = "cuda",
        .graph = attentionHeads,
        .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
        .tolerance = 2e-2,
        .expect =
            [](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("attn").tactic, "kiln.attention.flash");
              EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.unfused");
            },
    });
  }
  return 0;
}();

struct SoftmaxLaunch {
  const char* knob;
  const char* value;
  int64_t keys;
  const char* base;  // the softmax's launch in the base build's detail
  const char* changed;
};

[[maybe_unused]] const int kSoftmaxLaunchEffects = [] {
  for (const SoftmaxLaunch& e :
       std::vector<SoftmaxLaunch>{{"cuda.attention.softmax.warp_rows", "2", 70,
                                   "a warp a row, 4 rows a block", "a warp a row, 2 rows a block"},
                                  {"cuda.attention.softmax.warp_rows", "8", 70,
                                   "a warp a row, 4 rows a block", "a warp a row, 8 rows a block"},
                                  {"cuda.attention.softmax.block_threads", "128", 1100,
                                   "a 512-thread block a row", "a 128-thread block a row"},
                                  {"cuda.attention.softmax.block_threads", "256", 1100,
                                   "a 512-thread block a row", "a 256-thread block a row"}}) {
    const std::string base = std::string("; softmax: ") + e.base + ";";
    const std::string changed = std::string("; softmax: ") + e.changed + ";";
    registerKnobEffect({
        .knob = e.knob,
        .value = e.value,
        .shows = "the unfused attention's softmax over " + std::to_string(e.keys) +
                 " keys launches as \"" + e.changed + "\" instead of \"" + e.base + "\"",
        .backend = "cuda",
        .graph = plainAttention(2, 40, e.keys),
        .expect =
            [base, changed](const BuildSnapshot& before, const BuildSnapshot& after) {
              EXPECT_EQ(after.layer("attn").tactic, "kiln.attention.unfused");
              const std::string& was = before.layer("attn").detail;
              const std::string& now = after.layer("attn").detail;
              EXPECT_NE(was.find(base), std::string::npos) << was;
              EXPECT_NE(now.find(changed), std::string::npos) << now;
            },
    });
  }
  return 0;
}();

}  // namespace
}  // namespace kiln::testing
#endif  // KILN_HAVE_CUDA
