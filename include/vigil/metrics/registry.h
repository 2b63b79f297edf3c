// vigil/metrics/registry.h — counters, gauges and fixed-bucket histograms, rendered in the Prometheus
// text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
//   metrics::Registry reg;
//   metrics::Counter& drops = reg.GetCounter("vigil_frames_dropped_total", "Frames dropped", {{"reason",
//   "queue_full"}}); metrics::Histogram& lat = reg.GetHistogram("vigil_stage_seconds", "Stage latency",
//   metrics::LatencyBuckets(),
//                                              {{"stage", "inference"}});
//   drops.Inc();  lat.Observe(0.012);  std::string text = reg.Render();
//
// Conventions (Prometheus): latencies in seconds (`_seconds`), counters end in `_total`, a histogram
// named N renders N_bucket{le="…"} (cumulative counts, last bucket le="+Inf"), N_sum and N_count.
//
// A metric is identified by its name and its label set (names sorted); Get* returns the same object
// for the same identity, creating it on first use. Returned references stay valid for the registry's
// lifetime (metrics are never removed). Label values are free text (escaped when rendered).
// REQUIRES (programming errors, abort with a message): metric and label names match
// [a-zA-Z_:][a-zA-Z0-9_:]* / [a-zA-Z_][a-zA-Z0-9_]*; one name has one type (and for a histogram one
// bucket layout) throughout; histogram bounds are finite and strictly increasing.
//
// Thread-safety: everything is thread-safe. Updating a metric is lock-free (atomics); Get* and Render
// take the registry's mutex. Hot paths should keep the reference rather than call Get* per event.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace vigil::metrics {

using Labels = std::map<std::string, std::string>;  // label name → value

// A monotonically increasing value (events, bytes, seconds spent).
class Counter {
 public:
  // Adds v; v < 0 is ignored (a counter never decreases).
  void Inc(double v = 1) {
    if (v > 0) value_.fetch_add(v, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (queue depth, connected edges, frames per second).
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Inc(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Dec(double v = 1) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets with upper bounds `bounds` (inclusive: v ≤ bound) plus +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;        // upper bounds, without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 counts; the last is the +Inf bucket = count
    double sum = 0;
  };
  // Not atomic across buckets: an Observe racing with Snapshot may be seen in some fields only.
  Snapshot Snap() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// Bucket upper bounds in seconds for per-stage and end-to-end latencies: 0.5 ms … 10 s.
std::vector<double> LatencyBuckets();

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter& GetCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& GetGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& GetHistogram(std::string_view name, std::string_view help, const std::vector<double>& bounds,
                          const Labels& labels = {});

  // `hook` runs at the start of every Render (on the rendering thread, without the registry's lock),
  // to sample values that are cheaper to read than to track (queue depths, stats of other modules).
  void AddCollectHook(std::function<void()> hook);

  // All metrics in text format 0.0.4, families sorted by name, series by label set. Serve it with
  // Content-Type kContentType.
  std::string Render() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Family;
  Family& GetFamily(std::string_view name, std::string_view help, int type, const std::vector<double>* bounds,
                    const Labels& labels);  // REQUIRES: mu_ held

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;  // GUARDED_BY(mu_)
  mutable std::mutex hooks_mu_;
  std::vector<std::function<void()>> hooks_;  // GUARDED_BY(hooks_mu_)
};

}  // namespace vigil::metrics
