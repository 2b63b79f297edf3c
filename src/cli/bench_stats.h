// bench_stats.h — latency summaries shared by the `bench` subcommands.
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include <sys/resource.h>

namespace vigil::cli {

// Milliseconds.
struct Latency {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, min = 0, max = 0;
};

// Nearest-rank percentiles (the smallest value with at least p % of the samples at or below it) of
// `ms`; all zero when `ms` is empty.
inline Latency Summarize(std::vector<double> ms) {
  Latency l;
  if (ms.empty()) return l;
  std::sort(ms.begin(), ms.end());
  auto rank = [&](double p) {
    const size_t k = static_cast<size_t>(std::max(1.0, std::ceil(p / 100.0 * static_cast<double>(ms.size()))));
    return ms[k - 1];
  };
  l.p50 = rank(50), l.p90 = rank(90), l.p99 = rank(99);
  for (double v : ms) l.mean += v;
  l.mean /= static_cast<double>(ms.size());
  l.min = ms.front(), l.max = ms.back();
  return l;
}

// User + system CPU time of the process so far, in ms: with one thread, the compute a run costs however
// busy the machine is; with more, their sum.
inline double ProcessCpuMs() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto ms = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_usec) / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

}  // namespace vigil::cli
