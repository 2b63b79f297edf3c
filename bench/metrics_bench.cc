// metrics_bench.cc — Google Benchmark micro-benchmarks of the metrics module (metrics/registry.h).
//
// BM_HistogramObserve/threads:N: one shared histogram with LatencyBuckets() (as the edge's per-stage
// histograms are shared by its threads), each thread calling Observe on a cached handle with values
// spread over all buckets. Time is wall time per Observe as one thread sees it (UseRealTime).
// BM_Render1000Series: Registry::Render (collect hook + text exposition) of a registry holding 1,000
// series: 10 counter families × 50 streams (500), 4 gauge families × 100 streams (400) and
// 2 histogram families × 50 streams with LatencyBuckets() (100 series, 17 lines each); every series
// has a non-zero value. Counter "bytes" = size of the text.
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "vigil/metrics/registry.h"

namespace vigil::metrics {
namespace {

std::vector<double> SpreadValues() {
  std::vector<double> values;
  for (int i = 0; i < 1024; ++i) values.push_back(0.0002 * (1 + (i * 7919) % 60000));  // 0.2 ms … 12 s
  return values;
}

Registry& SharedRegistry() {
  static Registry* reg = new Registry;
  return *reg;
}

void BM_HistogramObserve(benchmark::State& state) {
  Histogram& h = SharedRegistry().GetHistogram("bench_stage_seconds", "Stage latency", LatencyBuckets(),
                                               {{"stage", "inference"}});
  const std::vector<double> values = SpreadValues();
  size_t i = static_cast<size_t>(state.thread_index()) * 512;
  for (auto _ : state) {
    h.Observe(values[i++ & 1023]);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HistogramObserve)->Threads(1)->Threads(2)->UseRealTime();

void BM_Render1000Series(benchmark::State& state) {
  Registry reg;
  const std::vector<double> values = SpreadValues();
  int series = 0;
  for (int f = 0; f < 10; ++f) {
    for (int s = 0; s < 50; ++s, ++series) {
      reg.GetCounter("bench_counter_" + std::to_string(f) + "_total", "A counter family",
                     {{"stream", "cam" + std::to_string(s)}, {"edge", "edge-1"}})
          .Inc(1000 + s);
    }
  }
  for (int f = 0; f < 4; ++f) {
    for (int s = 0; s < 100; ++s, ++series) {
      reg.GetGauge("bench_gauge_" + std::to_string(f), "A gauge family", {{"stream", "cam" + std::to_string(s)}})
          .Set(0.25 * s);
    }
  }
  for (int f = 0; f < 2; ++f) {
    for (int s = 0; s < 50; ++s, ++series) {
      Histogram& h = reg.GetHistogram("bench_hist_" + std::to_string(f) + "_seconds", "A histogram family",
                                      LatencyBuckets(), {{"stream", "cam" + std::to_string(s)}});
      for (int k = 0; k < 100; ++k) h.Observe(values[(s * 100 + k) & 1023]);
    }
  }
  Gauge& hooked = reg.GetGauge("bench_hooked", "Set by a collect hook");
  reg.AddCollectHook([&hooked] { hooked.Inc(); });
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = reg.Render();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["series"] = series;
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Render1000Series)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vigil::metrics

BENCHMARK_MAIN();
