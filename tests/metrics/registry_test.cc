#include "vigil/metrics/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace vigil::metrics {
namespace {

TEST(RegistryTest, RendersCountersGaugesAndHistogramsInTextFormat) {
  Registry reg;
  reg.GetCounter("vigil_frames_total", "Frames stored", {{"stream", "cam0"}}).Inc(3);
  reg.GetCounter("vigil_frames_total", "Frames stored", {{"stream", "cam0"}}).Inc();  // same series
  reg.GetCounter("vigil_frames_total", "Frames stored", {{"stream", "a\"b\\c\nd"}}).Inc(0.5);
  reg.GetGauge("vigil_queue_depth", "Queued reports").Set(7);
  reg.GetGauge("vigil_queue_depth", "Queued reports").Dec(2);
  Histogram& h =
      reg.GetHistogram("vigil_stage_seconds", "Stage latency\nin seconds", {0.01, 0.1, 1}, {{"stage", "decode"}});
  for (double v : {0.005, 0.01, 0.05, 0.5, 2.0}) h.Observe(v);

  // Hand-computed: buckets le=0.01 holds {0.005, 0.01} = 2, le=0.1 adds 0.05 → 3, le=1 adds 0.5 → 4,
  // +Inf adds 2.0 → 5; sum = 2.565. Within a histogram prometheus-cpp's serializer writes _count and _sum
  // before the buckets (text format 0.0.4 fixes no order inside a family); HELP is escaped by our layer.
  EXPECT_EQ(reg.Render(),
            "# HELP vigil_frames_total Frames stored\n"
            "# TYPE vigil_frames_total counter\n"
            "vigil_frames_total{stream=\"a\\\"b\\\\c\\nd\"} 0.5\n"
            "vigil_frames_total{stream=\"cam0\"} 4\n"
            "# HELP vigil_queue_depth Queued reports\n"
            "# TYPE vigil_queue_depth gauge\n"
            "vigil_queue_depth 5\n"
            "# HELP vigil_stage_seconds Stage latency\\nin seconds\n"
            "# TYPE vigil_stage_seconds histogram\n"
            "vigil_stage_seconds_count{stage=\"decode\"} 5\n"
            "vigil_stage_seconds_sum{stage=\"decode\"} 2.565\n"
            "vigil_stage_seconds_bucket{stage=\"decode\",le=\"0.01\"} 2\n"
            "vigil_stage_seconds_bucket{stage=\"decode\",le=\"0.1\"} 3\n"
            "vigil_stage_seconds_bucket{stage=\"decode\",le=\"1\"} 4\n"
            "vigil_stage_seconds_bucket{stage=\"decode\",le=\"+Inf\"} 5\n");
}

TEST(RegistryTest, CounterIgnoresNegativeIncrementsAndGaugeFormatsSpecialValues) {
  Registry reg;
  Counter& c = reg.GetCounter("c_total", "c");
  c.Inc(2);
  c.Inc(-5);
  EXPECT_EQ(c.Value(), 2);
  reg.GetGauge("g", "g", {{"k", "inf"}}).Set(std::numeric_limits<double>::infinity());
  reg.GetGauge("g", "g", {{"k", "nan"}}).Set(std::nan(""));
  reg.GetGauge("g", "g", {{"k", "small"}}).Set(1e-7);
  const std::string text = reg.Render();
  EXPECT_NE(text.find("g{k=\"inf\"} +Inf\n"), std::string::npos) << text;
  // prometheus-cpp 1.0.1 writes NaN as "Nan"; Prometheus (Go ParseFloat) and prometheus_client read
  // special values case-insensitively, so check that the value reads back as NaN.
  const size_t nan_at = text.find("g{k=\"nan\"} ");
  ASSERT_NE(nan_at, std::string::npos) << text;
  EXPECT_TRUE(std::isnan(std::strtod(text.c_str() + nan_at + 11, nullptr))) << text;
  EXPECT_NE(text.find("g{k=\"small\"} 1e-07\n"), std::string::npos) << text;
}

TEST(RegistryTest, HistogramMatchesAnIndependentCount) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(0, 12);
  const std::vector<double> bounds = LatencyBuckets();
  Histogram h(bounds);
  std::vector<double> values(1000);
  double sum = 0;
  for (double& v : values) {
    v = dist(rng);
    h.Observe(v);
    sum += v;
  }
  Histogram::Snapshot s = h.Snap();
  ASSERT_EQ(s.cumulative.size(), bounds.size() + 1);
  for (size_t i = 0; i < bounds.size(); ++i) {
    const auto expected = std::count_if(values.begin(), values.end(), [&](double v) { return v <= bounds[i]; });
    EXPECT_EQ(s.cumulative[i], static_cast<uint64_t>(expected)) << "le=" << bounds[i];
  }
  EXPECT_EQ(s.cumulative.back(), values.size());
  EXPECT_NEAR(s.sum, sum, 1e-9 * sum);
}

TEST(RegistryTest, ConcurrentUpdatesAreAllCounted) {
  Registry reg;
  constexpr int kThreads = 4, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&reg, t] {
      Counter& c = reg.GetCounter("n_total", "n");
      Histogram& h = reg.GetHistogram("h_seconds", "h", {1.0});
      Gauge& g = reg.GetGauge("g", "g", {{"thread", std::to_string(t % 2)}});
      for (int i = 0; i < kPerThread; ++i) {
        c.Inc();
        h.Observe(i % 2 == 0 ? 0.5 : 2.0);
        g.Inc();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(reg.GetCounter("n_total", "n").Value(), kThreads * kPerThread);
  Histogram::Snapshot s = reg.GetHistogram("h_seconds", "h", {1.0}).Snap();
  EXPECT_EQ(s.cumulative[0], uint64_t{kThreads * kPerThread / 2});
  EXPECT_EQ(s.cumulative[1], uint64_t{kThreads * kPerThread});
  EXPECT_EQ(reg.GetGauge("g", "g", {{"thread", "0"}}).Value(), 2 * kPerThread);
}

TEST(RegistryTest, CollectHooksRunBeforeRendering) {
  Registry reg;
  int depth = 0;
  reg.AddCollectHook([&] { reg.GetGauge("depth", "queue depth").Set(++depth); });
  EXPECT_NE(reg.Render().find("depth 1\n"), std::string::npos);
  EXPECT_NE(reg.Render().find("depth 2\n"), std::string::npos);
}

TEST(RegistryTest, GetReturnsTheSameHandleForTheSameIdentity) {
  Registry reg;
  Counter& a = reg.GetCounter("x_total", "x", {{"b", "1"}, {"a", "2"}});
  EXPECT_EQ(&a, &reg.GetCounter("x_total", "x", {{"a", "2"}, {"b", "1"}}));
  EXPECT_NE(&a, &reg.GetCounter("x_total", "x", {{"a", "2"}, {"b", "3"}}));
  Histogram& h = reg.GetHistogram("h_seconds", "h", LatencyBuckets(), {{"stage", "decode"}});
  EXPECT_EQ(&h, &reg.GetHistogram("h_seconds", "h", LatencyBuckets(), {{"stage", "decode"}}));
  Gauge& g = reg.GetGauge("g", "g");
  EXPECT_EQ(&g, &reg.GetGauge("g", "g"));
  a.Inc(2);
  EXPECT_EQ(reg.GetCounter("x_total", "x", {{"a", "2"}, {"b", "1"}}).Value(), 2);
}

TEST(RegistryTest, SeriesAndFamiliesRenderSortedAndHelpIsEscaped) {
  Registry reg;
  for (int i = 99; i >= 0; --i) reg.GetCounter("z_total", "z", {{"stream", "cam" + std::to_string(i)}}).Inc(i);
  reg.GetGauge("a_gauge", "back\\slash").Set(1);
  const std::string text = reg.Render();
  EXPECT_EQ(text.rfind("# HELP a_gauge back\\\\slash\n# TYPE a_gauge gauge\na_gauge 1\n", 0), 0u) << text;
  std::vector<std::string> streams;
  for (size_t at = text.find("z_total{"); at != std::string::npos; at = text.find("z_total{", at + 1)) {
    streams.push_back(text.substr(at, text.find('}', at) - at));
  }
  ASSERT_EQ(streams.size(), 100u);
  EXPECT_TRUE(std::is_sorted(streams.begin(), streams.end()));
  EXPECT_NE(text.find("z_total{stream=\"cam42\"} 42\n"), std::string::npos);
}

TEST(RegistryTest, HistogramCountsNaNInTheInfBucket) {
  Registry reg;
  Histogram& h = reg.GetHistogram("h_seconds", "h", {1.0});
  h.Observe(0.5);
  h.Observe(std::nan(""));
  const Histogram::Snapshot s = h.Snap();
  EXPECT_EQ(s.bounds, std::vector<double>{1.0});
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(RegistryDeathTest, ProgrammingErrorsAbortWithAMessage) {
  Registry reg;
  reg.GetCounter("x_total", "x");
  EXPECT_DEATH(reg.GetGauge("x_total", "x"), "'x_total' is a counter, asked for as a gauge");
  EXPECT_DEATH(reg.GetCounter("bad-name", "x"), "invalid metric name 'bad-name'");
  EXPECT_DEATH(reg.GetCounter("y_total", "x", {{"le", "1"}}), "invalid label name 'le'");
  EXPECT_DEATH(Histogram({1.0, 1.0}), "strictly increasing");
  EXPECT_DEATH(reg.GetHistogram("h_seconds", "h", {1.0, std::nan("")}), "strictly increasing");
  reg.GetHistogram("h_seconds", "h", {1.0});
  EXPECT_DEATH(reg.GetHistogram("h_seconds", "h", {2.0}), "'h_seconds' asked for with other bounds");
  EXPECT_DEATH(reg.GetCounter("z_total", "x", {{"bad-label", "1"}}), "invalid label name 'bad-label'");
}

}  // namespace
}  // namespace vigil::metrics
