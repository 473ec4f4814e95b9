// Knob declarations, route parsing and validation, canonical text, per-node resolution, and
// route-expression expansion, on a registry of test knobs.
#include <gtest/gtest.h>

#include "kiln/knobs/knob.h"
#include "kiln/knobs/route.h"
#include "kiln/knobs/route_expression.h"

namespace kiln::knobs {
namespace {

KnobRegistry makeRegistry() {
  KnobRegistry r;
  EXPECT_TRUE(r.add({.name = "fusion.conv_act",
                     .kind = KnobKind::kBool,
                     .defaultValue = "on",
                     .help = "fuse conv and activation",
                     .perNode = true})
                  .isOk());
  EXPECT_TRUE(r.add({.name = "cpu.conv.algo",
                     .kind = KnobKind::kEnum,
                     .choices = {"auto", "im2col", "direct"},
                     .defaultValue = "auto",
                     .help = "convolution algorithm",
                     .backends = {"cpu"},
                     .perNode = true})
                  .isOk());
  EXPECT_TRUE(r.add({.name = "cpu.threads",
                     .kind = KnobKind::kInt,
                     .minValue = 1,
                     .maxValue = 16,
                     .defaultValue = "1",
                     .help = "threads"})
                  .isOk());
  return r;
}

TEST(KnobRegistry, RejectsBadDeclarations) {
  KnobRegistry r = makeRegistry();
  EXPECT_FALSE(r.add({.name = "NoDots", .defaultValue = "on", .help = "x"}).isOk());
  EXPECT_FALSE(r.add({.name = "fusion.conv_act", .defaultValue = "on", .help = "x"}).isOk());
  EXPECT_FALSE(r.add({.name = "a.b", .defaultValue = "maybe", .help = "x"}).isOk());
  EXPECT_FALSE(r.add({.name = "a.c", .defaultValue = "on"}).isOk());  // no help
  EXPECT_EQ(r.find("cpu.threads")->allowedText(), "1..16");
  EXPECT_EQ(r.find("cpu.conv.algo")->allowedText(), "auto|im2col|direct");
}

TEST(Route, ParsesAndCanonicalises) {
  KnobRegistry r = makeRegistry();
  auto route = Route::parse("-cpu.threads=2   -fusion.conv_act=false -cpu.conv.algo=auto", r);
  ASSERT_TRUE(route.isOk()) << route.status().message();
  // Sorted, bool spelled canonically, the default (algo=auto) left out.
  EXPECT_EQ(route->canonicalText(), "-cpu.threads=2 -fusion.conv_act=off");
  auto same = Route::parse("-fusion.conv_act=0 -cpu.threads=2", r);
  EXPECT_EQ(same->canonicalText(), route->canonicalText());
  EXPECT_EQ(same->hash(), route->hash());
  EXPECT_EQ(Route(r).canonicalText(), "");
  EXPECT_NE(Route(r).hash(), route->hash());
  EXPECT_EQ(stableHash(""), "cbf29ce484222325");  // FNV-1a offset basis: the hash is stable
}

TEST(Route, SaysWhatIsWrong) {
  KnobRegistry r = makeRegistry();
  EXPECT_EQ(Route::parse("-cpu.thread=2", r).status().message(),
            "unknown knob 'cpu.thread'; did you mean 'cpu.threads'?");
  EXPECT_EQ(Route::parse("-cpu.threads=0", r).status().message(),
            "knob 'cpu.threads' does not allow the value '0' (allowed: 1..16)");
  EXPECT_EQ(Route::parse("-cpu.conv.algo=winograd", r).status().message(),
            "knob 'cpu.conv.algo' does not allow the value 'winograd' (allowed: "
            "auto|im2col|direct)");
  EXPECT_EQ(Route::parse("-cpu.threads=2 -cpu.threads=4", r).status().message(),
            "knob 'cpu.threads' is given twice");
  EXPECT_EQ(Route::parse("-cpu.threads@conv*=2", r).status().message(),
            "knob 'cpu.threads' applies to the whole graph and cannot be set per node (@conv*)");
  EXPECT_EQ(Route::parse("cpu.threads=2", r).status().message(),
            "route token 'cpu.threads=2' must look like -knob=value or -knob@nodes=value");
}

ir::Graph twoConvGraph() {
  ir::Graph graph;
  for (const char* name : {"stem.conv", "head.conv"}) {
    ir::Node* node = graph.addNode("Conv");
    node->name = name;
  }
  return graph;
}

TEST(Route, ResolvesPerNodeSettings) {
  KnobRegistry r = makeRegistry();
  ir::Graph graph = twoConvGraph();
  auto route = Route::parse("-cpu.conv.algo=im2col -cpu.conv.algo@head.*=direct", r);
  ASSERT_TRUE(route.isOk()) << route.status().message();
  ASSERT_TRUE(route->checkSelectors(graph).isOk());
  const Knob algo("cpu.conv.algo");
  EXPECT_EQ(route->value(algo, graph.nodes()[0].get()), "im2col");
  EXPECT_EQ(route->value(algo, graph.nodes()[1].get()), "direct");
  EXPECT_EQ(route->value(algo), "im2col");
  EXPECT_EQ(route->canonicalText(), "-cpu.conv.algo=im2col -cpu.conv.algo@head.*=direct");
}

TEST(Route, ChecksSelectorsAgainstTheGraph) {
  KnobRegistry r = makeRegistry();
  ir::Graph graph = twoConvGraph();
  auto none = Route::parse("-fusion.conv_act@body.*=off", r);
  EXPECT_EQ(none->checkSelectors(graph).message(),
            "-fusion.conv_act@body.*: the selector matches no node of the graph");
  auto clash = Route::parse("-fusion.conv_act@*.conv=off -fusion.conv_act@head.*=on", r);
  EXPECT_EQ(clash->checkSelectors(graph).message(),
            "node 'head.conv' matches both -fusion.conv_act@*.conv=off and "
            "-fusion.conv_act@head.*=on");
}

TEST(RouteExpression, FastIsBaselinePlusOneChangeAtATime) {
  KnobRegistry r = makeRegistry();
  auto expression = parseRouteExpression(
      "-fusion.conv_act=* -cpu.conv.algo=[auto|im2col|direct] "
      "-cpu.threads=[1..4]",
      r);
  ASSERT_TRUE(expression.isOk()) << expression.status().message();
  ASSERT_EQ(expression->axes.size(), 3u);
  // 1 + (2-1) + (3-1) + (4-1)
  std::vector<Route> routes = expandFast(*expression);
  ASSERT_EQ(routes.size(), 7u);
  EXPECT_EQ(routes[0].canonicalText(), "");
  EXPECT_EQ(routes[1].canonicalText(), "-fusion.conv_act=off");
  EXPECT_EQ(routes[2].canonicalText(), "-cpu.conv.algo=im2col");
  EXPECT_EQ(routes[6].canonicalText(), "-cpu.threads=4");
  EXPECT_EQ(expandProduct(*expression, expression->axes).size(), 24u);
  EXPECT_EQ(expression->fullCount(1000).value(), 24u);
  EXPECT_FALSE(expression->fullCount(10).isOk());
}

TEST(RouteExpression, PinnedKnobsMoveTheBaseline) {
  KnobRegistry r = makeRegistry();
  auto expression = parseRouteExpression(
      "# a route file: one token a line\n-cpu.threads=2\n-cpu.conv.algo=[im2col|direct]\n", r);
  ASSERT_TRUE(expression.isOk()) << expression.status().message();
  std::vector<Route> routes = expandFast(*expression);
  // The baseline algo is the default (auto), which the axis omits: both values are changes.
  ASSERT_EQ(routes.size(), 3u);
  EXPECT_EQ(routes[0].canonicalText(), "-cpu.threads=2");
  EXPECT_EQ(routes[2].canonicalText(), "-cpu.conv.algo=direct -cpu.threads=2");
}

TEST(RouteExpression, ExpandsPerNodeAxes) {
  KnobRegistry r = makeRegistry();
  auto expression = parseRouteExpression("-fusion.conv_act@head.*=[on|off]", r);
  ASSERT_TRUE(expression.isOk()) << expression.status().message();
  std::vector<Route> routes = expandFast(*expression);
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[1].canonicalText(), "-fusion.conv_act@head.*=off");
}

TEST(RouteExpression, SaysWhatIsWrong) {
  KnobRegistry r = makeRegistry();
  EXPECT_EQ(parseRouteExpression("-cpu.threads=[1..4] -cpu.threads=2", r).status().message(),
            "knob 'cpu.threads' is given twice");
  EXPECT_EQ(parseRouteExpression("-cpu.conv.algo=[1..3]", r).status().message(),
            "knob 'cpu.conv.algo' is not an integer knob; a range '[1..3]' does not apply");
  EXPECT_EQ(parseRouteExpression("-cpu.threads=[8..2]", r).status().message(),
            "knob 'cpu.threads': range '[8..2]' is empty");
  EXPECT_EQ(parseRouteExpression("-fusion.conv_ac=*", r).status().message(),
            "unknown knob 'fusion.conv_ac'; did you mean 'fusion.conv_act'?");
  EXPECT_EQ(parseRouteExpression("-cpu.conv.algo=[im2col|fft]", r).status().message(),
            "knob 'cpu.conv.algo' does not allow the value 'fft' (allowed: auto|im2col|direct)");
}

}  // namespace
}  // namespace kiln::knobs
