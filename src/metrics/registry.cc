// The metrics module over prometheus-cpp core: vigil keeps its API (handles, Value/Snap, collect
// hooks, abort on programming errors) and checks what prometheus-cpp would otherwise throw for; the
// metrics, their families and the text exposition are prometheus-cpp's.
#include "vigil/metrics/registry.h"

#include <prometheus/check_names.h>
#include <prometheus/family.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <unordered_map>

#include "vigil/common/mutex.h"

namespace vigil::metrics {
namespace {

enum Type { kCounter, kGauge, kHistogram };
constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};

[[noreturn]] void Fatal(const std::string& msg) {
  std::fprintf(stderr, "vigil metrics: %s\n", msg.c_str());
  std::abort();
}

void CheckBounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      Fatal("histogram bounds must be finite and strictly increasing");
    }
  }
}

// prometheus-cpp 1.0.1's TextSerializer writes HELP verbatim (label values it escapes): escape `\`
// and newline here, as text format 0.0.4 asks, so that a multi-line help stays one line.
std::string EscapeHelp(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---- Histogram ----------------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds) : h_(nullptr), bounds_(bounds.size()) {
  CheckBounds(bounds);
  owned_ = std::make_unique<prometheus::Histogram>(bounds);
  h_ = owned_.get();
}

Histogram::~Histogram() = default;

void Histogram::ObserveNaN() {
  // lower_bound would put NaN (which compares false with everything) in the first bucket.
  std::vector<double> increments(bounds_ + 1, 0.0);
  increments.back() = 1;
  h_->ObserveMultiple(increments, std::nan(""));
}

Histogram::Snapshot Histogram::Snap() const {
  const prometheus::ClientMetric m = h_->Collect();
  Snapshot s;
  for (const auto& b : m.histogram.bucket) {
    if (std::isfinite(b.upper_bound)) s.bounds.push_back(b.upper_bound);
    s.cumulative.push_back(b.cumulative_count);
  }
  s.sum = m.histogram.sample_sum;
  return s;
}

std::vector<double> LatencyBuckets() {
  return {0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10};
}

// ---- Registry -----------------------------------------------------------------------------------

struct Registry::Impl {
  struct Family {
    Type type;
    std::vector<double> bounds;  // histograms only
    void* family;                // prometheus::Family<Counter|Gauge|Histogram>*, by `type`
  };

  // Looks up or creates `name`'s family. REQUIRES: mu held.
  template <typename T>
  prometheus::Family<T>& GetFamily(std::string_view name, std::string_view help, Type type,
                                   const std::vector<double>* bounds, const Labels& labels) VIGIL_REQUIRES(mu) {
    if (!prometheus::CheckMetricName(std::string(name))) Fatal("invalid metric name '" + std::string(name) + "'");
    for (const auto& [label, value] : labels) {
      if (!prometheus::CheckLabelName(label) || label == "le") {
        Fatal("invalid label name '" + label + "' on " + std::string(name));
      }
    }
    auto it = families.find(name);
    if (it == families.end()) {
      if (bounds != nullptr) CheckBounds(*bounds);
      prometheus::Family<T>* f = nullptr;
      try {
        f = &prometheus::detail::Builder<T>().Name(std::string(name)).Help(EscapeHelp(help)).Register(registry);
      } catch (const std::exception& e) {
        Fatal("metric '" + std::string(name) + "': " + e.what());
      }
      it = families.emplace(std::string(name), Family{type, bounds ? *bounds : std::vector<double>{}, f}).first;
    }
    const Family& f = it->second;
    if (f.type != type) {
      Fatal("metric '" + std::string(name) + "' is a " + kTypeNames[f.type] + ", asked for as a " + kTypeNames[type]);
    }
    if (bounds != nullptr && f.bounds != *bounds) {
      Fatal("histogram '" + std::string(name) + "' asked for with other bounds");
    }
    return *static_cast<prometheus::Family<T>*>(f.family);
  }

  // The handle on `metric`, created on first use. REQUIRES: mu held.
  template <typename Handle, typename Metric, typename... Args>
  static Handle& HandleOf(std::unordered_map<const Metric*, std::unique_ptr<Handle>>& handles, Metric& metric,
                          Args... args) {
    auto& slot = handles[&metric];
    if (!slot) slot.reset(new Handle(metric, args...));
    return *slot;
  }

  prometheus::Registry registry;  // Merge: one family per name

  Mutex mu;
  std::map<std::string, Family, std::less<>> families VIGIL_GUARDED_BY(mu);
  std::unordered_map<const prometheus::Counter*, std::unique_ptr<Counter>> counters VIGIL_GUARDED_BY(mu);
  std::unordered_map<const prometheus::Gauge*, std::unique_ptr<Gauge>> gauges VIGIL_GUARDED_BY(mu);
  std::unordered_map<const prometheus::Histogram*, std::unique_ptr<Histogram>> histograms VIGIL_GUARDED_BY(mu);

  mutable Mutex hooks_mu;
  std::vector<std::function<void()>> hooks VIGIL_GUARDED_BY(hooks_mu);
};

Registry::Registry() : impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;

Counter& Registry::GetCounter(std::string_view name, std::string_view help, const Labels& labels) {
  MutexLock lock(impl_->mu);
  auto& family = impl_->GetFamily<prometheus::Counter>(name, help, kCounter, nullptr, labels);
  return Impl::HandleOf(impl_->counters, family.Add(labels));
}

Gauge& Registry::GetGauge(std::string_view name, std::string_view help, const Labels& labels) {
  MutexLock lock(impl_->mu);
  auto& family = impl_->GetFamily<prometheus::Gauge>(name, help, kGauge, nullptr, labels);
  return Impl::HandleOf(impl_->gauges, family.Add(labels));
}

Histogram& Registry::GetHistogram(std::string_view name, std::string_view help, const std::vector<double>& bounds,
                                  const Labels& labels) {
  MutexLock lock(impl_->mu);
  auto& family = impl_->GetFamily<prometheus::Histogram>(name, help, kHistogram, &bounds, labels);
  return Impl::HandleOf(impl_->histograms, family.Add(labels, bounds), bounds.size());
}

void Registry::AddCollectHook(std::function<void()> hook) {
  MutexLock lock(impl_->hooks_mu);
  impl_->hooks.push_back(std::move(hook));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> hooks;
  {
    MutexLock lock(impl_->hooks_mu);
    hooks = impl_->hooks;
  }
  for (const auto& hook : hooks) hook();

  // prometheus-cpp collects families by type in creation order and series in hash order: sort both
  // so that a scrape reads the same from one time to the next.
  std::vector<prometheus::MetricFamily> families = impl_->registry.Collect();
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) { return a.name < b.name; });
  for (prometheus::MetricFamily& f : families) {
    std::sort(f.metric.begin(), f.metric.end(),
              [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) { return a.label < b.label; });
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace vigil::metrics
