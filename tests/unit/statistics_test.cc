// Timing summaries.
#include "kiln/base/statistics.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(Statistics, SummarisesLikeNumpy) {
  // numpy.percentile([1,2,3,4,10], [50, 90, 99]) = 3, 7.6, 9.76
  TimingSummary s = summarize({10, 2, 4, 1, 3});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.mean, 4);
  EXPECT_NEAR(s.p90, 7.6, 1e-12);
  EXPECT_NEAR(s.p99, 9.76, 1e-12);
  EXPECT_NEAR(s.stddev, 3.5355339059327378, 1e-12);
}

TEST(Statistics, HandlesTinyInputs) {
  EXPECT_EQ(summarize({}).count, 0);
  TimingSummary one = summarize({2.5});
  EXPECT_DOUBLE_EQ(one.median, 2.5);
  EXPECT_DOUBLE_EQ(one.p99, 2.5);
  EXPECT_DOUBLE_EQ(one.stddev, 0);
}

}  // namespace
}  // namespace kiln
