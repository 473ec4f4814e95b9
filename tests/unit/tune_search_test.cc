// The tuner's search expansion over real knobs of the global registry: the first phase of fast,
// full and mixed searches (counts, order, baseline first, no duplicates) and mixed search's second
// phase planned from synthetic trial records (which knobs combine, what is left to measure).
// Expected route texts are spelled out here by hand (sorted tokens, defaults left out), not
// produced by the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "kiln/knobs/route_expression.h"
#include "kiln/tune/store.h"
#include "kiln/tune/timing.h"
#include "kiln/tune/tuner.h"

namespace kiln::tune {
namespace {

// Canonical route text: the tokens sorted, joined by spaces ("" for the default route).
std::string text(std::vector<std::string> tokens) {
  std::sort(tokens.begin(), tokens.end());
  std::string joined;
  for (const auto& token : tokens) joined += (joined.empty() ? "" : " ") + token;
  return joined;
}

knobs::RouteExpression parse(const std::string& expression) {
  Result<knobs::RouteExpression> parsed = knobs::parseRouteExpression(expression);
  EXPECT_TRUE(parsed.isOk()) << expression << ": " << parsed.status().message();
  return parsed.isOk() ? std::move(parsed).value() : knobs::RouteExpression();
}

std::vector<std::string> firstPhase(const std::string& expression, SearchMode mode) {
  Result<std::vector<std::string>> routes = firstPhaseRoutes(parse(expression), mode);
  EXPECT_TRUE(routes.isOk()) << routes.status().message();
  return routes.isOk() ? *routes : std::vector<std::string>{};
}

void expectDistinct(const std::vector<std::string>& routes) {
  const std::set<std::string> unique(routes.begin(), routes.end());
  EXPECT_EQ(unique.size(), routes.size()) << "duplicate routes";
}

TEST(TuneSearch, KnobsUsedHereAreDeclaredAsAssumed) {
  // The expected routes below rely on these declarations.
  const auto& registry = knobs::KnobRegistry::global();
  const auto expectKnob = [&](const std::string& name, const std::string& defaultValue,
                              const std::string& allowed) {
    const knobs::KnobSpec* spec = registry.find(name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(spec->defaultValue, defaultValue) << name;
    EXPECT_EQ(spec->allowedText(), allowed) << name;
  };
  expectKnob("fusion.conv_act", "on", "off|on");
  expectKnob("cpu.conv.algo", "auto", "auto|im2col|direct|pointwise|depthwise|reference");
  expectKnob("cpu.gemm.kc", "256", "128|256|384|512");
  expectKnob("graph.layout", "nhwc", "nchw|nhwc");
  ASSERT_NE(registry.find("cpu.threads"), nullptr);
  EXPECT_EQ(registry.find("cpu.threads")->defaultValue, "0");
  EXPECT_TRUE(registry.find("fusion.conv_act")->perNode);
}

// ---- fast -----------------------------------------------------------------------------------

TEST(TuneSearch, FastOneBoolKnob) {
  EXPECT_EQ(firstPhase("-fusion.conv_act=[on|off]", SearchMode::kFast),
            (std::vector<std::string>{"", "-fusion.conv_act=off"}));
  // The values' order does not move the baseline from the front.
  EXPECT_EQ(firstPhase("-fusion.conv_act=[off|on]", SearchMode::kFast),
            (std::vector<std::string>{"", "-fusion.conv_act=off"}));
}

TEST(TuneSearch, FastIsBaselinePlusOneChangeAtATime) {
  // 1 + (2-1) + (3-1) + (4-1) = 7, the pinned thread count in every route.
  const std::vector<std::string> routes = firstPhase(
      "-cpu.threads=1 -fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col|direct] "
      "-cpu.gemm.kc=*",
      SearchMode::kFast);
  const std::string pin = "-cpu.threads=1";
  const std::vector<std::string> expected{
      pin,
      text({pin, "-fusion.conv_act=off"}),
      text({pin, "-cpu.conv.algo=im2col"}),
      text({pin, "-cpu.conv.algo=direct"}),
      text({pin, "-cpu.gemm.kc=128"}),
      text({pin, "-cpu.gemm.kc=384"}),
      text({pin, "-cpu.gemm.kc=512"}),
  };
  EXPECT_EQ(routes, expected);
  expectDistinct(routes);
  EXPECT_EQ(routes.front(), parse("-cpu.threads=1").pinned.canonicalText());
}

TEST(TuneSearch, FastCountsForSeveralExpressions) {
  struct Case {
    std::string expression;
    size_t count;
  };
  const std::vector<Case> cases{
      {"-graph.layout=[nchw|nhwc]", 1 + 1},
      {"-cpu.conv.algo=*", 1 + 5},
      {"-cpu.conv.algo=* -cpu.gemm.kc=* -graph.layout=* -fusion.conv_act=*", 1 + 5 + 3 + 1 + 1},
      {"-cpu.gemm.kc=[256]", 1},              // only the baseline value: nothing to change
      {"-cpu.gemm.kc=[128|256|128]", 1 + 1},  // a repeated value counts once
      {"-cpu.threads=[1..4]", 1 + 4},  // 0 (the default) is not in the range: every value is new
      {"-cpu.threads=[0..3] -graph.layout=*", 1 + 3 + 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expression);
    const std::vector<std::string> routes = firstPhase(c.expression, SearchMode::kFast);
    EXPECT_EQ(routes.size(), c.count);
    expectDistinct(routes);
    ASSERT_FALSE(routes.empty());
    EXPECT_EQ(routes.front(), "");
    // Mixed search starts with exactly the fast routes.
    EXPECT_EQ(firstPhase(c.expression, SearchMode::kMixed), routes);
  }
}

TEST(TuneSearch, FastAxisWithoutItsBaselineValueAddsEveryValue) {
  // cpu.conv.algo's default (auto) is not listed: both values are changes, 1 + 2.
  EXPECT_EQ(firstPhase("-cpu.conv.algo=[im2col|direct]", SearchMode::kFast),
            (std::vector<std::string>{"", "-cpu.conv.algo=im2col", "-cpu.conv.algo=direct"}));
  // A pinned value moves the baseline: with graph.layout pinned to nchw, cpu.gemm.kc=[128|256]
  // still has its default 256 as baseline, so 1 + 1.
  const std::string pin = "-graph.layout=nchw";
  EXPECT_EQ(firstPhase("-graph.layout=nchw -cpu.gemm.kc=[128|256] -cpu.conv.algo=[im2col|direct]",
                       SearchMode::kFast),
            (std::vector<std::string>{pin, text({pin, "-cpu.gemm.kc=128"}),
                                      text({pin, "-cpu.conv.algo=im2col"}),
                                      text({pin, "-cpu.conv.algo=direct"})}));
  // Pinned to a non-default value, a bool axis's baseline is that value.
  EXPECT_EQ(firstPhase("-cpu.threads=2 -fusion.conv_act=[on|off]", SearchMode::kFast),
            (std::vector<std::string>{"-cpu.threads=2", "-cpu.threads=2 -fusion.conv_act=off"}));
}

TEST(TuneSearch, FastPerNodeAxesCountLikeOthers) {
  // The per-node value equal to the global one is the baseline itself: 1 + 1.
  EXPECT_EQ(firstPhase("-fusion.conv_act@conv*=[on|off]", SearchMode::kFast),
            (std::vector<std::string>{"", "-fusion.conv_act@conv*=off"}));
  // With a global axis too: 1 + 1 + 1 + 2.
  const std::vector<std::string> routes =
      firstPhase("-fusion.conv_act@conv*=[on|off] -graph.layout=[nchw|nhwc] -cpu.threads=[0..2]",
                 SearchMode::kFast);
  EXPECT_EQ(routes,
            (std::vector<std::string>{"", "-fusion.conv_act@conv*=off", "-graph.layout=nchw",
                                      "-cpu.threads=1", "-cpu.threads=2"}));
  // The same knob per node and globally are two axes.
  const std::vector<std::string> both =
      firstPhase("-fusion.conv_act=[on|off] -fusion.conv_act@conv*=[on|off]", SearchMode::kFast);
  EXPECT_EQ(both,
            (std::vector<std::string>{"", "-fusion.conv_act=off", "-fusion.conv_act@conv*=off"}));
}

// ---- full -----------------------------------------------------------------------------------

TEST(TuneSearch, FullIsTheWholeProductWithTheBaselineOnceAndFirst) {
  const std::vector<std::string> routes = firstPhase(
      "-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col|direct] "
      "-cpu.gemm.kc=[128|256]",
      SearchMode::kFull);
  // Every combination, written out independently.
  std::set<std::string> expected;
  for (const std::string fusion : {"", "-fusion.conv_act=off"}) {
    for (const std::string algo : {"", "-cpu.conv.algo=im2col", "-cpu.conv.algo=direct"}) {
      for (const std::string kc : {"-cpu.gemm.kc=128", ""}) {
        std::vector<std::string> tokens;
        for (const auto& t : {fusion, algo, kc}) {
          if (!t.empty()) tokens.push_back(t);
        }
        expected.insert(text(tokens));
      }
    }
  }
  ASSERT_EQ(expected.size(), 2u * 3u * 2u);
  EXPECT_EQ(routes.size(), 12u);
  expectDistinct(routes);
  EXPECT_EQ(std::set<std::string>(routes.begin(), routes.end()), expected);
  ASSERT_FALSE(routes.empty());
  EXPECT_EQ(routes.front(), "");
  EXPECT_EQ(std::count(routes.begin(), routes.end(), ""), 1);
}

TEST(TuneSearch, FullCountsForSeveralExpressions) {
  struct Case {
    std::string expression;
    std::string baseline;
    size_t count;
  };
  const std::vector<Case> cases{
      {"-graph.layout=* -cpu.gemm.kc=*", "", 2 * 4},
      {"-cpu.threads=2 -graph.layout=* -cpu.gemm.kc=*", "-cpu.threads=2", 2 * 4},
      {"-cpu.conv.algo=* -cpu.gemm.kc=* -graph.layout=* -fusion.conv_act=*", "", 6 * 4 * 2 * 2},
      {"-cpu.threads=[0..2] -cpu.gemm.kc=[256|512]", "", 3 * 2},
      {"-cpu.gemm.kc=[256]", "", 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expression);
    const std::vector<std::string> routes = firstPhase(c.expression, SearchMode::kFull);
    EXPECT_EQ(routes.size(), c.count);
    expectDistinct(routes);
    ASSERT_FALSE(routes.empty());
    EXPECT_EQ(routes.front(), c.baseline);
    EXPECT_EQ(std::count(routes.begin(), routes.end(), c.baseline), 1);
    Result<uint64_t> count = parse(c.expression).fullCount(1000);
    ASSERT_TRUE(count.isOk());
    EXPECT_EQ(*count, c.count);
  }
}

TEST(TuneSearch, FullWithoutTheBaselineInTheProductStillMeasuresTheBaseline) {
  // The product of [im2col|direct] x [on|off] does not contain the default route; the baseline
  // is what every candidate is compared with, so it is measured too: 2 * 2 + 1.
  const std::vector<std::string> routes =
      firstPhase("-cpu.conv.algo=[im2col|direct] -fusion.conv_act=[on|off]", SearchMode::kFull);
  EXPECT_EQ(routes, (std::vector<std::string>{
                        "",
                        "-cpu.conv.algo=im2col",
                        "-cpu.conv.algo=im2col -fusion.conv_act=off",
                        "-cpu.conv.algo=direct",
                        "-cpu.conv.algo=direct -fusion.conv_act=off",
                    }));
}

// Regression (found in review; was a bug in src/kiln/knobs/route_expression.cc, expandProduct, the
// inner loop): a per-node axis's value equal to the knob's baseline value is set explicitly
// ("-fusion.conv_act@conv*=on" while fusion.conv_act is on everywhere), which is the baseline route
// under another name. Fast search (expandFast) and mixed's second phase (planSecondPhase) treat
// that value as "no setting", full search does not, so a full search measures the default route
// twice (and every other combination with the no-op per-node setting twice): Π nᵢ + 1 trials
// instead of Π nᵢ, here 5 instead of 4, and 2x the routes for each such axis in larger products.
// Fix: in expandProduct, for an axis with a selector, push `route` unchanged when value ==
// expression.baselineValue(axis).
TEST(TuneSearch, FullPerNodeAxisAtItsBaselineValueIsTheBaselineRoute) {
  const std::vector<std::string> routes =
      firstPhase("-fusion.conv_act@conv*=[on|off] -graph.layout=[nchw|nhwc]", SearchMode::kFull);
  EXPECT_EQ(routes.size(), 2u * 2u);
  expectDistinct(routes);
  EXPECT_EQ(std::set<std::string>(routes.begin(), routes.end()),
            (std::set<std::string>{"", "-graph.layout=nchw", "-fusion.conv_act@conv*=off",
                                   "-fusion.conv_act@conv*=off -graph.layout=nchw"}));
}

// ---- mixed: the second phase ----------------------------------------------------------------

// 100 samples around `centre` ms: centre + 0.002 * (k - 49.5) for k = 0..99 (±0.1 ms, symmetric),
// in an order scrambled by `scramble` (coprime with 100).
std::vector<double> samplesAround(double centre, int scramble = 37) {
  std::vector<double> samples;
  for (int i = 0; i < 100; ++i) samples.push_back(centre + 0.002 * ((i * scramble) % 100 - 49.5));
  return samples;
}

TrialRecord okRecord(const std::string& route, double centreMs, int phase = 1) {
  TrialRecord record;
  record.phase = phase;
  record.route = route;
  record.status = TrialStatus::kOk;
  record.timing = analyzeTimings(samplesAround(centreMs));
  return record;
}

TrialRecord failedRecord(const std::string& route, TrialStatus status, double centreMs = 0,
                         int phase = 1) {
  TrialRecord record;
  record.phase = phase;
  record.route = route;
  record.status = status;
  record.message = trialStatusName(status);
  if (centreMs > 0) record.timing = analyzeTimings(samplesAround(centreMs));
  return record;
}

std::vector<TrialRecord> numbered(std::vector<TrialRecord> records) {
  for (size_t i = 0; i < records.size(); ++i) records[i].iteration = static_cast<int64_t>(i);
  return records;
}

constexpr double kBase = 10.0;  // the default route's median, ms
constexpr double kGain = 8.0;   // a significant gain
constexpr double kSame = 10.0;  // no gain

TEST(TuneSearch, SyntheticTimingsAreAsIntended) {
  // The premise of the tests below, checked directly: 8 ms is significantly faster than 10 ms at
  // this noise, another 10 ms is not, and neither direction of equal medians is.
  const TrialTiming base = analyzeTimings(samplesAround(kBase));
  const TrialTiming gain = analyzeTimings(samplesAround(kGain));
  const TrialTiming same = analyzeTimings(samplesAround(kSame, 43));
  EXPECT_TRUE(significantlyFaster(gain, base));
  EXPECT_FALSE(significantlyFaster(same, base));
  EXPECT_FALSE(significantlyFaster(base, same));
  EXPECT_NEAR(base.summary.median, kBase, 1e-9);
}

TEST(TuneSearch, TwoSignificantKnobsCombineIntoTheOneNewRoute) {
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col|direct]");
  const auto records = numbered({okRecord("", kBase), okRecord("-fusion.conv_act=off", kGain),
                                 okRecord("-cpu.conv.algo=im2col", kGain),
                                 okRecord("-cpu.conv.algo=direct", kSame)});
  const SecondPhase plan = planSecondPhase(expression, records);
  EXPECT_EQ(plan.routes, (std::vector<std::string>{"-cpu.conv.algo=im2col -fusion.conv_act=off"}));
  EXPECT_EQ(plan.knobs,
            (std::vector<std::string>{"fusion.conv_act=[on|off]", "cpu.conv.algo=[auto|im2col]"}));
}

TEST(TuneSearch, GainsBelowTheMinimumAreNamedAndNotCombined) {
  // graph.layout's 1% is significant at this noise, but below a 2% minimum: the product is
  // over the two large gains, and the note names the small one.
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col] -graph.layout=[nhwc|nchw]");
  const auto records =
      numbered({okRecord("", kBase), okRecord("-fusion.conv_act=off", kGain),
                okRecord("-cpu.conv.algo=im2col", 9.0), okRecord("-graph.layout=nchw", 9.9)});
  ASSERT_TRUE(significantlyFaster(*records[3].timing, *records[0].timing));
  const SecondPhase plan = planSecondPhase(expression, records, 0.0, 0.02);
  EXPECT_EQ(plan.routes, (std::vector<std::string>{"-cpu.conv.algo=im2col -fusion.conv_act=off"}));
  EXPECT_EQ(plan.knobs,
            (std::vector<std::string>{"fusion.conv_act=[on|off]", "cpu.conv.algo=[auto|im2col]"}));
  EXPECT_EQ(plan.note,
            "1 significant gain below the 2.00% minimum left out: graph.layout=nchw (1.00%)");
  // No minimum: all three combine (2 x 2 x 2, less the four routes phase one measured).
  EXPECT_EQ(planSecondPhase(expression, records, 0.0, 0.0).routes.size(), 4u);
  // Only small gains: nothing to combine, and the note says why.
  const auto smallOnly = numbered({okRecord("", kBase), okRecord("-graph.layout=nchw", 9.9)});
  const SecondPhase none = planSecondPhase(expression, smallOnly, 0.0, 0.02);
  EXPECT_TRUE(none.routes.empty());
  EXPECT_EQ(none.note,
            "no knob's one-off change was a significant gain of at least 2.00%; 1 significant "
            "gain below the 2.00% minimum left out: graph.layout=nchw (1.00%)");
}

TEST(TuneSearch, SecondPhaseKeepsThePinnedSettings) {
  const knobs::RouteExpression expression =
      parse("-cpu.threads=1 -graph.layout=[nchw|nhwc] -cpu.gemm.kc=[256|512]");
  const auto records = numbered({okRecord("-cpu.threads=1", kBase),
                                 okRecord("-cpu.threads=1 -graph.layout=nchw", kGain),
                                 okRecord("-cpu.gemm.kc=512 -cpu.threads=1", kGain)});
  const SecondPhase plan = planSecondPhase(expression, records);
  EXPECT_EQ(plan.routes,
            (std::vector<std::string>{"-cpu.gemm.kc=512 -cpu.threads=1 -graph.layout=nchw"}));
  EXPECT_TRUE(plan.note.empty()) << plan.note;
}

TEST(TuneSearch, PerNodeAxesCombineLikeOthers) {
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act@conv*=[on|off] -graph.layout=[nchw|nhwc]");
  const auto records = numbered({okRecord("", kBase), okRecord("-fusion.conv_act@conv*=off", kGain),
                                 okRecord("-graph.layout=nchw", kGain)});
  const SecondPhase plan = planSecondPhase(expression, records);
  EXPECT_EQ(plan.routes,
            (std::vector<std::string>{"-fusion.conv_act@conv*=off -graph.layout=nchw"}));
  EXPECT_EQ(plan.knobs, (std::vector<std::string>{"fusion.conv_act@conv*=[on|off]",
                                                  "graph.layout=[nhwc|nchw]"}));
}

// Four axes; three have significant values (cpu.conv.algo two of them), the rest do not: a
// value with no gain, a fast one that failed accuracy, a crash.
const char* kFourAxes =
    "-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col|direct|pointwise] "
    "-cpu.gemm.kc=[128|256|384|512] -graph.layout=[nchw|nhwc]";

std::vector<TrialRecord> fourAxesPhaseOne() {
  return numbered({
      okRecord("", kBase),
      okRecord("-fusion.conv_act=off", kGain),
      okRecord("-cpu.conv.algo=im2col", kGain),
      okRecord("-cpu.conv.algo=direct", kGain),
      okRecord("-cpu.conv.algo=pointwise", kSame),
      okRecord("-cpu.gemm.kc=128", kSame),
      failedRecord("-cpu.gemm.kc=384", TrialStatus::kAccuracyFail, 5.0),  // fast, but wrong
      okRecord("-cpu.gemm.kc=512", kGain),
      failedRecord("-graph.layout=nchw", TrialStatus::kCrash),
  });
}

// The 2 x 3 x 2 combinations with at least two knobs off their baseline (the 1 + 4 others were
// measured in phase one), written out independently.
std::set<std::string> fourAxesExpectedSecondPhase() {
  std::set<std::string> expected;
  for (const std::string fusion : {"", "-fusion.conv_act=off"}) {
    for (const std::string algo : {"", "-cpu.conv.algo=im2col", "-cpu.conv.algo=direct"}) {
      for (const std::string kc : {"", "-cpu.gemm.kc=512"}) {
        std::vector<std::string> tokens;
        for (const auto& t : {fusion, algo, kc}) {
          if (!t.empty()) tokens.push_back(t);
        }
        if (tokens.size() >= 2) expected.insert(text(tokens));
      }
    }
  }
  return expected;
}

TEST(TuneSearch, ThreeSignificantKnobsCombineIntoTheProductLessMeasured) {
  const std::vector<TrialRecord> records = fourAxesPhaseOne();
  const SecondPhase plan = planSecondPhase(parse(kFourAxes), records);
  const std::set<std::string> expected = fourAxesExpectedSecondPhase();
  ASSERT_EQ(expected.size(), 2u * 3u * 2u - 5u);
  EXPECT_EQ(plan.routes.size(), 7u);
  expectDistinct(plan.routes);
  EXPECT_EQ(std::set<std::string>(plan.routes.begin(), plan.routes.end()), expected);
  for (const auto& route : plan.routes) {
    for (const auto& record : records) EXPECT_NE(route, record.route) << "measured again";
    EXPECT_EQ(route.find("graph.layout"), std::string::npos) << route;
    EXPECT_EQ(route.find("pointwise"), std::string::npos) << route;
    EXPECT_EQ(route.find("kc=384"), std::string::npos) << route;  // accuracy-fail: no gain
    EXPECT_EQ(route.find("kc=128"), std::string::npos) << route;
  }
  EXPECT_EQ(plan.knobs, (std::vector<std::string>{"fusion.conv_act=[on|off]",
                                                  "cpu.conv.algo=[auto|im2col|direct]",
                                                  "cpu.gemm.kc=[256|512]"}));
  EXPECT_TRUE(plan.note.empty()) << plan.note;
  // Deterministic: a continued run plans the same routes in the same order.
  EXPECT_EQ(planSecondPhase(parse(kFourAxes), records).routes, plan.routes);
}

// --mixed-max-routes: the product takes values largest gain first while it stays within the
// bound (the measured routes count), and names the rest.
TEST(TuneSearch, SecondPhaseStaysWithinItsRouteBound) {
  const auto records = numbered({
      okRecord("", kBase), okRecord("-fusion.conv_act=off", 8.0),  // 20%
      okRecord("-cpu.conv.algo=im2col", 9.0),                      // 10%
      okRecord("-cpu.conv.algo=direct", 8.5),                      // 15%
      okRecord("-cpu.gemm.kc=512", 7.0),                           // 30%
  });
  // Bound 6: kc=512 (2 routes), then fusion.conv_act=off (4); cpu.conv.algo's values would make
  // 8 and are left out.
  const SecondPhase plan = planSecondPhase(parse(kFourAxes), records, 0.0, 0.0, 6);
  EXPECT_EQ(plan.routes, (std::vector<std::string>{"-cpu.gemm.kc=512 -fusion.conv_act=off"}));
  EXPECT_EQ(plan.knobs,
            (std::vector<std::string>{"fusion.conv_act=[on|off]", "cpu.gemm.kc=[256|512]"}));
  EXPECT_EQ(plan.note,
            "2 significant gains left out to keep the product within 6 routes: "
            "cpu.conv.algo=direct (15.00%), cpu.conv.algo=im2col (10.00%)");
  // Bound 8: cpu.conv.algo=direct fits too (2 x 2 x 2); im2col would make 12.
  const SecondPhase eight = planSecondPhase(parse(kFourAxes), records, 0.0, 0.0, 8);
  EXPECT_EQ(eight.knobs,
            (std::vector<std::string>{"fusion.conv_act=[on|off]", "cpu.conv.algo=[auto|direct]",
                                      "cpu.gemm.kc=[256|512]"}));
  EXPECT_EQ(eight.routes.size(), 8u - 4u);
  // A bound the whole product fits in (2 x 3 x 2 = 12), and no bound: the same plan.
  const SecondPhase whole = planSecondPhase(parse(kFourAxes), records, 0.0, 0.0, 12);
  EXPECT_EQ(whole.routes, planSecondPhase(parse(kFourAxes), records, 0.0, 0.0, 0).routes);
  EXPECT_EQ(whole.routes.size(), 12u - 5u);
  EXPECT_TRUE(whole.note.empty()) << whole.note;
}

TEST(TuneSearch, RoutesRecordedByAnInterruptedSecondPhaseAreNotPlannedAgain) {
  std::vector<TrialRecord> records = fourAxesPhaseOne();
  // The first run measured three phase-two routes (one of them crashed) before it stopped.
  const std::vector<std::string> done{"-cpu.conv.algo=im2col -fusion.conv_act=off",
                                      "-cpu.gemm.kc=512 -fusion.conv_act=off",
                                      "-cpu.conv.algo=direct -cpu.gemm.kc=512"};
  records.push_back(okRecord(done[0], 7.0, 2));
  records.push_back(failedRecord(done[1], TrialStatus::kCrash, 0, 2));
  records.push_back(okRecord(done[2], 6.5, 2));
  records = numbered(records);
  const SecondPhase plan = planSecondPhase(parse(kFourAxes), records);
  std::set<std::string> expected = fourAxesExpectedSecondPhase();
  for (const auto& route : done) ASSERT_EQ(expected.erase(route), 1u) << route;
  EXPECT_EQ(plan.routes.size(), 4u);
  EXPECT_EQ(std::set<std::string>(plan.routes.begin(), plan.routes.end()), expected);
  // What remains keeps the order of the uninterrupted plan.
  std::vector<std::string> full = planSecondPhase(parse(kFourAxes), fourAxesPhaseOne()).routes;
  full.erase(std::remove_if(full.begin(), full.end(),
                            [&](const std::string& r) {
                              return std::find(done.begin(), done.end(), r) != done.end();
                            }),
             full.end());
  EXPECT_EQ(plan.routes, full);
}

TEST(TuneSearch, NoSignificantKnobMeansNoSecondPhase) {
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col|direct]");
  const auto records =
      numbered({okRecord("", kBase), okRecord("-fusion.conv_act=off", kSame),
                okRecord("-cpu.conv.algo=im2col", 10.05), okRecord("-cpu.conv.algo=direct", 12.0)});
  const SecondPhase plan = planSecondPhase(expression, records);
  EXPECT_TRUE(plan.routes.empty());
  EXPECT_TRUE(plan.knobs.empty());
  EXPECT_FALSE(plan.note.empty());
}

TEST(TuneSearch, OneSignificantKnobMeansNoSecondPhase) {
  // cpu.conv.algo has two significant values, but there is no second knob to combine with.
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col|direct]");
  const auto records = numbered({okRecord("", kBase), okRecord("-fusion.conv_act=off", kSame),
                                 okRecord("-cpu.conv.algo=im2col", kGain),
                                 okRecord("-cpu.conv.algo=direct", kGain)});
  const SecondPhase plan = planSecondPhase(expression, records);
  EXPECT_TRUE(plan.routes.empty()) << plan.routes.front();
  EXPECT_EQ(plan.knobs, (std::vector<std::string>{"cpu.conv.algo=[auto|im2col|direct]"}));
  EXPECT_FALSE(plan.note.empty());
}

TEST(TuneSearch, AccuracyFailureIsNeverASignificantGain) {
  // Without the accuracy failure this is the two-knob case with one new route.
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col]");
  const auto records =
      numbered({okRecord("", kBase), okRecord("-fusion.conv_act=off", kGain),
                failedRecord("-cpu.conv.algo=im2col", TrialStatus::kAccuracyFail, 2.0)});
  const SecondPhase plan = planSecondPhase(expression, records);
  EXPECT_TRUE(plan.routes.empty()) << plan.routes.front();
  EXPECT_EQ(plan.knobs, (std::vector<std::string>{"fusion.conv_act=[on|off]"}));
  EXPECT_FALSE(plan.note.empty());
}

TEST(TuneSearch, NoSecondPhaseWithoutAnEligibleBaseline) {
  const knobs::RouteExpression expression =
      parse("-fusion.conv_act=[on|off] -cpu.conv.algo=[auto|im2col]");
  const std::vector<TrialRecord> gains{okRecord("-fusion.conv_act=off", kGain),
                                       okRecord("-cpu.conv.algo=im2col", kGain)};
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    std::vector<TrialRecord> records = gains;
    if (variant == 0) records.push_back(failedRecord("", TrialStatus::kCrash));
    if (variant == 1) records.push_back(failedRecord("", TrialStatus::kAccuracyFail, kBase));
    if (variant == 2) records.push_back(failedRecord("", TrialStatus::kTimeout));
    // variant 3: the baseline was never recorded.
    const SecondPhase plan = planSecondPhase(expression, numbered(records));
    EXPECT_TRUE(plan.routes.empty());
    EXPECT_TRUE(plan.knobs.empty());
    EXPECT_FALSE(plan.note.empty());
  }
}

}  // namespace
}  // namespace kiln::tune
