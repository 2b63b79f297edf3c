// vigil/metrics/registry.h — counters, gauges and fixed-bucket histograms, rendered in the Prometheus
// text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/).
// A thin layer over prometheus-cpp core (Debian prometheus-cpp-dev 1.0.1): the metrics are its
// Counter, Gauge and Histogram in its Family/Registry, and the text comes from its TextSerializer.
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
// for the same identity, creating it on first use (one prometheus::Family per name, one series per
// label set). Returned references stay valid for the registry's lifetime (metrics are never
// removed); callers keep them as handles. Label values are free text (escaped when rendered).
// REQUIRES (programming errors, abort with a message): metric and label names match
// [a-zA-Z_:][a-zA-Z0-9_:]* / [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__" (reserved); no label
// is named "le"; one name has one type (and for a histogram one bucket layout) throughout; histogram
// bounds are finite and strictly increasing.
//
// Thread-safety: everything is thread-safe. Counter and Gauge updates are lock-free (atomics); a
// histogram observation takes that histogram's mutex (prometheus-cpp), so Snap() and the rendered
// buckets, _sum and _count of one series are always consistent. Get* take the registry's mutex;
// Render takes prometheus-cpp's registry and family mutexes. Hot paths keep the reference rather
// than call Get* per event.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vigil::metrics {

using Labels = std::map<std::string, std::string>;  // label name → value

class Registry;

// A monotonically increasing value (events, bytes, seconds spent). A handle on a prometheus::Counter.
class Counter {
 public:
  // Adds v; v < 0 (and NaN) is ignored (a counter never decreases).
  void Inc(double v = 1) {
    if (v > 0) c_->Increment(v);
  }
  double Value() const { return c_->Value(); }

 private:
  friend class Registry;
  explicit Counter(prometheus::Counter& c) : c_(&c) {}
  prometheus::Counter* c_;
};

// A value that goes up and down (queue depth, connected edges, frames per second). A handle on a
// prometheus::Gauge.
class Gauge {
 public:
  void Set(double v) { g_->Set(v); }
  void Inc(double v = 1) { g_->Increment(v); }
  void Dec(double v = 1) { g_->Decrement(v); }
  double Value() const { return g_->Value(); }

 private:
  friend class Registry;
  explicit Gauge(prometheus::Gauge& g) : g_(&g) {}
  prometheus::Gauge* g_;
};

// Observations counted into fixed buckets with upper bounds `bounds` (inclusive: v ≤ bound) plus +Inf.
// A handle on a prometheus::Histogram (one owned by a Registry, or by this object when constructed
// directly, outside any registry).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // NaN is counted in the +Inf bucket (and makes _sum NaN).
  void Observe(double v) {
    if (std::isnan(v)) {
      ObserveNaN();
    } else {
      h_->Observe(v);
    }
  }

  struct Snapshot {
    std::vector<double> bounds;        // upper bounds, without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 counts; the last is the +Inf bucket = count
    double sum = 0;
  };
  // Consistent across buckets and sum (taken under the histogram's mutex).
  Snapshot Snap() const;

 private:
  friend class Registry;
  Histogram(prometheus::Histogram& h, size_t bounds) : h_(&h), bounds_(bounds) {}
  void ObserveNaN();

  std::unique_ptr<prometheus::Histogram> owned_;  // only when constructed directly
  prometheus::Histogram* h_;
  size_t bounds_;  // number of finite upper bounds
};

// Bucket upper bounds in seconds for per-stage and end-to-end latencies: 0.5 ms … 10 s, fine between 1 and
// 100 ms (real-time budgets live there: a p99 read off the buckets is then within a few ms).
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

  // All metrics in text format 0.0.4 (prometheus::TextSerializer), families sorted by name, series by
  // label set. Serve it with Content-Type kContentType.
  std::string Render() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::metrics
