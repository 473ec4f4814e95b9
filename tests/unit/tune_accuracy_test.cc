// The tuner's accuracy eligibility: metric parsing, every metric on small hand-made tensors
// (values chosen to be exact in float32, losses worked out by hand), the per-output decision
// with non-finite values, --accuracy-threshold parsing, and the merge over reference pairs.
#include "kiln/tune/accuracy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace kiln::tune {
namespace {

using ir::Shape;
using ir::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor vec(const std::vector<float>& values) {
  return Tensor::fromVector<float>(Shape{static_cast<int64_t>(values.size())}, values);
}

double loss(Metric metric, const std::vector<float>& out, const std::vector<float>& ref,
            double atol = 0, double rtol = 0) {
  return computeLoss(metric, vec(out), vec(ref), atol, rtol);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- parseMetric ----------------------------------------------------------------------------

TEST(TuneAccuracy, ParsesMetricNamesCaseInsensitively) {
  const std::vector<std::pair<std::string, Metric>> cases{
      {"l0", Metric::kL0},     {"L0", Metric::kL0},     {"l1", Metric::kL1},
      {"l2", Metric::kL2},     {"L2", Metric::kL2},     {"linf", Metric::kLinf},
      {"lInf", Metric::kLinf}, {"LINF", Metric::kLinf}, {"cos", Metric::kCos},
      {"Cos", Metric::kCos}};
  for (const auto& [text, metric] : cases) {
    Result<Metric> parsed = parseMetric(text);
    ASSERT_TRUE(parsed.isOk()) << text << ": " << parsed.status().message();
    EXPECT_EQ(*parsed, metric) << text;
  }
  EXPECT_STREQ(metricName(Metric::kL0), "l0");
  EXPECT_STREQ(metricName(Metric::kL1), "l1");
  EXPECT_STREQ(metricName(Metric::kL2), "l2");
  EXPECT_STREQ(metricName(Metric::kLinf), "linf");
  EXPECT_STREQ(metricName(Metric::kCos), "cos");
}

TEST(TuneAccuracy, UnknownMetricListsTheAllowedOnes) {
  for (const std::string text : {"l3", "", "cosine", "inf", " l1"}) {
    Result<Metric> parsed = parseMetric(text);
    ASSERT_FALSE(parsed.isOk()) << "'" << text << "' accepted";
    const std::string& message = parsed.status().message();
    for (const char* allowed : {"l0", "l1", "l2", "linf", "cos"}) {
      EXPECT_TRUE(contains(message, allowed)) << message;
    }
    EXPECT_TRUE(contains(message, "'" + text + "'")) << message;
  }
}

// ---- metrics --------------------------------------------------------------------------------

// out - ref: 1 - 1.5 = -0.5, 2 - 2 = 0, 3 - 2 = 1, 4 - 4.25 = -0.25.
const std::vector<float> kOut{1, 2, 3, 4};
const std::vector<float> kRef{1.5f, 2, 2, 4.25f};

TEST(TuneAccuracy, L1IsMeanAbsoluteDifference) {
  EXPECT_DOUBLE_EQ(loss(Metric::kL1, kOut, kRef), (0.5 + 0 + 1 + 0.25) / 4);  // 0.4375
  EXPECT_DOUBLE_EQ(loss(Metric::kL1, kOut, kOut), 0);
}

TEST(TuneAccuracy, L2IsMeanSquaredDifference) {
  EXPECT_DOUBLE_EQ(loss(Metric::kL2, kOut, kRef), (0.25 + 0 + 1 + 0.0625) / 4);  // 0.328125
  EXPECT_DOUBLE_EQ(loss(Metric::kL2, {3}, {1}), 4);  // squared, not its root
}

TEST(TuneAccuracy, LinfIsLargestAbsoluteDifference) {
  EXPECT_DOUBLE_EQ(loss(Metric::kLinf, kOut, kRef), 1);
  EXPECT_DOUBLE_EQ(loss(Metric::kLinf, {-7, 0}, {1, 0}), 8);
  EXPECT_DOUBLE_EQ(loss(Metric::kLinf, kOut, kOut), 0);
}

TEST(TuneAccuracy, L0CountsElementsOutsideAtolPlusRtol) {
  // atol only: |diff| 0.5 and 1 exceed 0.25; 0.25 itself is exactly at the tolerance: inside.
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, kOut, kRef, 0.25, 0), 2.0 / 4);
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, kOut, kRef, 0.2, 0), 3.0 / 4);
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, kOut, kRef, 1, 0), 0);
  // rtol only, relative to |ref|: 0.5 > 0.375, 0 <= 0.5, 1 > 0.5, 0.25 <= 1.0625.
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, kOut, kRef, 0, 0.25), 2.0 / 4);
  // Exactly at rtol * |ref| (2.5 against 2 with rtol 0.25) is inside.
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, {2.5f}, {2}, 0, 0.25), 0);
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, {2.5625f}, {2}, 0, 0.25), 1);
  // Both: tolerance 0.5 + 0.25 * |-4| = 1.5, against the reference's magnitude, not the output's.
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, {-2.5f}, {-4}, 0.5, 0.25), 0);
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, {-2.4375f}, {-4}, 0.5, 0.25), 1);
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, {-4}, {-2.5f}, 0.5, 0.25), 1);  // 1.5 > 0.5 + 0.625
  // Zero tolerance: any difference counts, equality does not.
  EXPECT_DOUBLE_EQ(loss(Metric::kL0, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5.5f}, 0, 0), 1.0 / 5);
}

TEST(TuneAccuracy, CosIsOneMinusCosineSimilarity) {
  EXPECT_DOUBLE_EQ(loss(Metric::kCos, {3, 4}, {3, 4}), 0);           // identical
  EXPECT_NEAR(loss(Metric::kCos, kOut, kOut), 0, 1e-15);             // identical
  EXPECT_NEAR(loss(Metric::kCos, {2, 4, 6}, {1, 2, 3}), 0, 1e-15);   // scale does not count
  EXPECT_DOUBLE_EQ(loss(Metric::kCos, {0, 0, 0}, {0, 0, 0}), 0);     // both zero: identical
  EXPECT_DOUBLE_EQ(loss(Metric::kCos, {0, 0, 0}, {1, 2, 3}), 1);     // one zero
  EXPECT_DOUBLE_EQ(loss(Metric::kCos, {1, 2, 3}, {0, 0, 0}), 1);     // the other zero
  EXPECT_DOUBLE_EQ(loss(Metric::kCos, {1, 0}, {0, 1}), 1);           // orthogonal
  EXPECT_DOUBLE_EQ(loss(Metric::kCos, {1, 2, 3}, {-1, -2, -3}), 2);  // opposite
  // {1,2,2}·{2,1,2} = 8, both norms 3: 1 - 8/9.
  EXPECT_NEAR(loss(Metric::kCos, {1, 2, 2}, {2, 1, 2}), 1.0 / 9, 1e-15);
  // {1,0}·{1,1} = 1, norms 1 and √2.
  EXPECT_NEAR(loss(Metric::kCos, {1, 0}, {1, 1}), 1 - 1 / std::sqrt(2.0), 1e-15);
  // Equal elements still count in the norms: {1,1,5} against {1,1,-5}: 1+1-25 = -23 over 27.
  EXPECT_NEAR(loss(Metric::kCos, {1, 1, 5}, {1, 1, -5}), 1 + 23.0 / 27, 1e-15);
}

TEST(TuneAccuracy, MetricsReadOtherDtypesAsDouble) {
  const Tensor a = Tensor::fromVector<int64_t>(Shape{3}, {1, 5, -2});
  const Tensor b = Tensor::fromVector<int64_t>(Shape{3}, {1, 2, 2});
  EXPECT_DOUBLE_EQ(computeLoss(Metric::kL1, a, b, 0, 0), (0 + 3 + 4) / 3.0);
  EXPECT_DOUBLE_EQ(computeLoss(Metric::kLinf, a, b, 0, 0), 4);
  const Tensor c = Tensor::fromVector<double>(Shape{2}, {0.1, 0.2});
  const Tensor d = Tensor::fromVector<double>(Shape{2}, {0.1, 0.25});
  EXPECT_NEAR(computeLoss(Metric::kL2, c, d, 0, 0), 0.05 * 0.05 / 2, 1e-15);
}

// ---- compareOutputs -------------------------------------------------------------------------

AccuracySettings settingsWith(Metric metric, double threshold) {
  AccuracySettings settings;
  settings.metric = metric;
  settings.threshold = threshold;
  return settings;
}

TEST(TuneAccuracy, WithinThresholdPasses) {
  auto results = compareOutputs(settingsWith(Metric::kL1, 0.4375), {"y"}, {vec(kOut)}, {vec(kRef)});
  ASSERT_TRUE(results.isOk()) << results.status().message();
  ASSERT_EQ(results->size(), 1u);
  const OutputAccuracy& y = (*results)[0];
  EXPECT_EQ(y.output, "y");
  EXPECT_DOUBLE_EQ(y.loss, 0.4375);
  EXPECT_DOUBLE_EQ(y.threshold, 0.4375);
  EXPECT_TRUE(y.pass);  // exactly at the threshold is acceptable
  EXPECT_TRUE(y.note.empty()) << y.note;
}

TEST(TuneAccuracy, LossAboveThresholdFailsWithNote) {
  auto results = compareOutputs(settingsWith(Metric::kL1, 0.4), {"y"}, {vec(kOut)}, {vec(kRef)});
  ASSERT_TRUE(results.isOk()) << results.status().message();
  const OutputAccuracy& y = (*results)[0];
  EXPECT_FALSE(y.pass);
  EXPECT_DOUBLE_EQ(y.loss, 0.4375);
  EXPECT_DOUBLE_EQ(y.threshold, 0.4);
  EXPECT_TRUE(contains(y.note, "l1")) << y.note;
  EXPECT_TRUE(contains(y.note, "0.43")) << y.note;  // the loss, to 3 significant digits
  EXPECT_TRUE(contains(y.note, "0.4")) << y.note;
  EXPECT_TRUE(contains(y.note, "threshold")) << y.note;
}

TEST(TuneAccuracy, NaNWhereReferenceIsFiniteFails) {
  // The loss alone would pass (linf of the finite elements is 0, and the threshold is huge).
  for (Metric metric : {Metric::kL0, Metric::kL1, Metric::kL2, Metric::kLinf, Metric::kCos}) {
    SCOPED_TRACE(metricName(metric));
    auto results = compareOutputs(settingsWith(metric, 1e30), {"y"}, {vec({1, 2, 3, kNaN, 5})},
                                  {vec({1, 2, 3, 4, 5})});
    ASSERT_TRUE(results.isOk()) << results.status().message();
    const OutputAccuracy& y = (*results)[0];
    EXPECT_FALSE(y.pass);
    EXPECT_TRUE(contains(y.note, "NaN")) << y.note;
    EXPECT_TRUE(contains(y.note, "element 3")) << y.note;
  }
}

TEST(TuneAccuracy, InfWhereReferenceIsFiniteFails) {
  for (float inf : {kInf, -kInf}) {
    auto results = compareOutputs(settingsWith(Metric::kCos, 1e30), {"y"}, {vec({1, 2, inf})},
                                  {vec({1, 2, 3})});
    ASSERT_TRUE(results.isOk()) << results.status().message();
    const OutputAccuracy& y = (*results)[0];
    EXPECT_FALSE(y.pass);
    EXPECT_TRUE(contains(y.note, "Inf")) << y.note;
    EXPECT_TRUE(contains(y.note, "element 2")) << y.note;
  }
}

TEST(TuneAccuracy, FiniteWhereReferenceIsNotFails) {
  auto results = compareOutputs(settingsWith(Metric::kLinf, 1e30), {"y"}, {vec({1, 2, 3})},
                                {vec({1, kInf, 3})});
  ASSERT_TRUE(results.isOk());
  EXPECT_FALSE((*results)[0].pass);
  EXPECT_TRUE(contains((*results)[0].note, "element 1")) << (*results)[0].note;
}

TEST(TuneAccuracy, MatchingNonFiniteValuesAreNotFailures) {
  for (Metric metric : {Metric::kL0, Metric::kL1, Metric::kL2, Metric::kLinf, Metric::kCos}) {
    SCOPED_TRACE(metricName(metric));
    // (A threshold of 1e-12, not 0: see IdenticalOutputsHaveZeroLossUnderEveryMetric.)
    auto results = compareOutputs(settingsWith(metric, 1e-12), {"y"}, {vec({1, kNaN, 3, kInf})},
                                  {vec({1, kNaN, 3, kInf})});
    ASSERT_TRUE(results.isOk()) << results.status().message();
    const OutputAccuracy& y = (*results)[0];
    EXPECT_TRUE(y.pass) << y.note;
    EXPECT_NEAR(y.loss, 0, 1e-15);
    // The same NaN, with a real difference elsewhere: judged by the loss of the rest.
    results = compareOutputs(settingsWith(metric, 1e30), {"y"}, {vec({1, kNaN, 3, 8})},
                             {vec({2, kNaN, 3, 4})});
    ASSERT_TRUE(results.isOk());
    EXPECT_TRUE((*results)[0].pass) << (*results)[0].note;
    EXPECT_TRUE(std::isfinite((*results)[0].loss));
  }
  // ...and the loss of the rest is the ordinary one: l1 over all 4 elements, linf the largest.
  auto l1 = compareOutputs(settingsWith(Metric::kL1, 1e30), {"y"}, {vec({1, kNaN, 3, 8})},
                           {vec({2, kNaN, 3, 4})});
  ASSERT_TRUE(l1.isOk());
  EXPECT_DOUBLE_EQ((*l1)[0].loss, (1 + 0 + 0 + 4) / 4.0);
  auto linf = compareOutputs(settingsWith(Metric::kLinf, 1e30), {"y"}, {vec({1, kNaN, 3, 8})},
                             {vec({2, kNaN, 3, 4})});
  ASSERT_TRUE(linf.isOk());
  EXPECT_DOUBLE_EQ((*linf)[0].loss, 4);
}

// Regression (found in review; was a bug in src/kiln/tune/accuracy.cc, computeLoss, the kCos case
// near the end): identical tensors get 1 - dot / (sqrt(|x|²) * sqrt(|r|²)), which is not exactly 0
// when the squared norm's square root is inexact: {1, 3} against itself has |x|² = 10, sqrt(10)²
// = 10.000000000000002, loss 2.2e-16. With --accuracy-threshold 0 (bit-exact outputs required) the
// default route itself then fails accuracy under the default metric (cos). Fix: return 0 when no
// element differed (track it in the loop, `x == r || both NaN` for every element), or compute the
// cosine as dot / sqrt(|x|² * |r|²), which is exact for identical tensors whose squared norm
// squares exactly.
TEST(TuneAccuracy, IdenticalOutputsHaveZeroLossUnderEveryMetric) {
  for (Metric metric : {Metric::kL0, Metric::kL1, Metric::kL2, Metric::kLinf, Metric::kCos}) {
    SCOPED_TRACE(metricName(metric));
    for (const std::vector<float>& values :
         {std::vector<float>{1, 3}, std::vector<float>{0.1f, -0.7f, 2.3f, 5},
          std::vector<float>{1, 2, 3, 4}}) {
      EXPECT_EQ(loss(metric, values, values), 0);
      auto results = compareOutputs(settingsWith(metric, 0), {"y"}, {vec(values)}, {vec(values)});
      ASSERT_TRUE(results.isOk());
      EXPECT_TRUE((*results)[0].pass) << (*results)[0].note;
    }
  }
}

TEST(TuneAccuracy, OppositeInfinitiesFail) {
  auto results =
      compareOutputs(settingsWith(Metric::kCos, 1e30), {"y"}, {vec({1, -kInf})}, {vec({1, kInf})});
  ASSERT_TRUE(results.isOk());
  EXPECT_FALSE((*results)[0].pass);
}

TEST(TuneAccuracy, EachOutputIsHeldToItsOwnThreshold) {
  AccuracySettings settings = settingsWith(Metric::kLinf, 1);
  ASSERT_TRUE(parseThresholds("1e-3,out:0.5", settings).isOk());
  EXPECT_DOUBLE_EQ(settings.threshold, 1e-3);
  ASSERT_EQ(settings.perOutput.size(), 1u);
  EXPECT_DOUBLE_EQ(settings.perOutput.at("out"), 0.5);
  EXPECT_DOUBLE_EQ(settings.thresholdFor("out"), 0.5);
  EXPECT_DOUBLE_EQ(settings.thresholdFor("other"), 1e-3);
  // The same difference (linf 0.25) in both outputs: only the one with a looser threshold passes.
  auto results = compareOutputs(settings, {"other", "out"}, {vec({1, 2}), vec({1, 2})},
                                {vec({1, 2.25f}), vec({1, 2.25f})});
  ASSERT_TRUE(results.isOk()) << results.status().message();
  ASSERT_EQ(results->size(), 2u);
  EXPECT_EQ((*results)[0].output, "other");
  EXPECT_DOUBLE_EQ((*results)[0].threshold, 1e-3);
  EXPECT_DOUBLE_EQ((*results)[0].loss, 0.25);
  EXPECT_FALSE((*results)[0].pass);
  EXPECT_EQ((*results)[1].output, "out");
  EXPECT_DOUBLE_EQ((*results)[1].threshold, 0.5);
  EXPECT_DOUBLE_EQ((*results)[1].loss, 0.25);
  EXPECT_TRUE((*results)[1].pass);
}

TEST(TuneAccuracy, ThresholdNamesSplitAtTheLastColon) {
  AccuracySettings settings;
  ASSERT_TRUE(parseThresholds("logits:0:0.1", settings).isOk());
  ASSERT_EQ(settings.perOutput.size(), 1u);
  EXPECT_DOUBLE_EQ(settings.perOutput.at("logits:0"), 0.1);
  EXPECT_DOUBLE_EQ(settings.threshold, 1e-5);  // untouched: no global entry
  AccuracySettings two;
  ASSERT_TRUE(parseThresholds("a:1,b:c:2,0.25", two).isOk());
  EXPECT_DOUBLE_EQ(two.threshold, 0.25);
  EXPECT_DOUBLE_EQ(two.perOutput.at("a"), 1);
  EXPECT_DOUBLE_EQ(two.perOutput.at("b:c"), 2);
  EXPECT_EQ(two.perOutput.size(), 2u);
  AccuracySettings zero;
  ASSERT_TRUE(parseThresholds("0", zero).isOk());
  EXPECT_DOUBLE_EQ(zero.threshold, 0);
}

TEST(TuneAccuracy, BadThresholdsAreErrors) {
  for (const std::string text : {"abc", "-1", "x:", "", ",", "out:-0.5", "1e-3x", "nan", "inf",
                                 ":0.5", "out:abc", "out:1,out:2"}) {
    AccuracySettings settings;
    EXPECT_FALSE(parseThresholds(text, settings).isOk()) << "'" << text << "' accepted";
  }
}

TEST(TuneAccuracy, ShapeMismatchIsAnError) {
  const Tensor flat = vec({1, 2, 3, 4});
  const Tensor square = Tensor::fromVector<float>(Shape{2, 2}, {1, 2, 3, 4});
  auto results = compareOutputs(settingsWith(Metric::kCos, 1), {"y"}, {flat}, {square});
  ASSERT_FALSE(results.isOk());
  EXPECT_TRUE(contains(results.status().message(), "y")) << results.status().message();
  EXPECT_FALSE(
      compareOutputs(settingsWith(Metric::kCos, 1), {"y"}, {vec({1, 2})}, {vec({1, 2, 3})}).isOk());
}

TEST(TuneAccuracy, DtypeClassMismatchAndCountMismatchAreErrors) {
  const Tensor floats = vec({1, 2});
  const Tensor ints = Tensor::fromVector<int64_t>(Shape{2}, {1, 2});
  EXPECT_FALSE(compareOutputs(settingsWith(Metric::kL1, 1), {"y"}, {floats}, {ints}).isOk());
  EXPECT_FALSE(compareOutputs(settingsWith(Metric::kL1, 1), {"y", "z"}, {floats}, {floats}).isOk());
  EXPECT_FALSE(compareOutputs(settingsWith(Metric::kL1, 1), {"y"}, {floats}, {}).isOk());
}

// ---- mergeWorst -----------------------------------------------------------------------------

OutputAccuracy result(const std::string& name, double loss, bool pass, std::string note = "") {
  OutputAccuracy r;
  r.output = name;
  r.loss = loss;
  r.threshold = 0.5;
  r.pass = pass;
  r.note = std::move(note);
  return r;
}

TEST(TuneAccuracy, MergeIntoNothingCopies) {
  std::vector<OutputAccuracy> into;
  mergeWorst(into, {result("a", 0.25, true), result("b", 0.75, false, "too far")});
  ASSERT_EQ(into.size(), 2u);
  EXPECT_EQ(into[1].output, "b");
  EXPECT_DOUBLE_EQ(into[1].loss, 0.75);
  EXPECT_FALSE(into[1].pass);
  EXPECT_EQ(into[1].note, "too far");
}

TEST(TuneAccuracy, MergeKeepsWorstLossAndAnyFailure) {
  std::vector<OutputAccuracy> into{result("a", 0.1, true), result("b", 0.4, true),
                                   result("c", 0.2, false, "first failure"),
                                   result("d", 0.1, true)};
  mergeWorst(into, {result("a", 0.3, true), result("b", 0.2, true),
                    result("c", 0.1, false, "second failure"),
                    result("d", 0.05, false, "NaN at element 7 where the reference is finite")});
  EXPECT_DOUBLE_EQ(into[0].loss, 0.3);  // the larger
  EXPECT_TRUE(into[0].pass);
  EXPECT_DOUBLE_EQ(into[1].loss, 0.4);  // kept
  EXPECT_TRUE(into[1].pass);
  EXPECT_DOUBLE_EQ(into[2].loss, 0.2);
  EXPECT_FALSE(into[2].pass);
  EXPECT_EQ(into[2].note, "first failure");
  EXPECT_DOUBLE_EQ(into[3].loss, 0.1);  // a failure with a smaller loss still fails the output
  EXPECT_FALSE(into[3].pass);
  EXPECT_EQ(into[3].note, "NaN at element 7 where the reference is finite");
  // A NaN loss is the worst.
  mergeWorst(into, {result("a", std::nan(""), false, "nan"), result("b", 0, true),
                    result("c", 0, true), result("d", 0, true)});
  EXPECT_TRUE(std::isnan(into[0].loss));
  EXPECT_FALSE(into[0].pass);
  // ...and a later finite loss does not replace it.
  mergeWorst(into, {result("a", 9, true), result("b", 0, true), result("c", 0, true),
                    result("d", 0, true)});
  EXPECT_TRUE(std::isnan(into[0].loss)) << into[0].loss;
  EXPECT_FALSE(into[0].pass);
}

}  // namespace
}  // namespace kiln::tune
