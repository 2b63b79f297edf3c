#include "vigil/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace vigil::metrics {
namespace {

enum Type { kCounter, kGauge, kHistogram };
constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};

[[noreturn]] void Fatal(const std::string& msg) {
  std::fprintf(stderr, "vigil metrics: %s\n", msg.c_str());
  std::abort();
}

bool ValidName(std::string_view s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':') ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Shortest text that reads back as `v` (Prometheus accepts Go's float syntax: +Inf, -Inf, NaN).
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

void AppendEscaped(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
}

// {a="x",b="y"} with `extra` (le) last; "" for no labels.
std::string FormatLabels(const Labels& labels, std::string_view extra_name = {}, std::string_view extra_value = {}) {
  std::string out;
  auto add = [&](std::string_view name, std::string_view value) {
    out += out.empty() ? "{" : ",";
    out += name;
    out += "=\"";
    AppendEscaped(out, value, true);
    out += '"';
  };
  for (const auto& [name, value] : labels) add(name, value);
  if (!extra_name.empty()) add(extra_name, extra_value);
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

// ---- Histogram ----------------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i] > bounds_[i - 1]))) {
      Fatal("histogram bounds must be finite and strictly increasing");
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t i = std::isnan(v)
                       ? bounds_.size()
                       : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LatencyBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

// ---- Registry -----------------------------------------------------------------------------------

struct Registry::Family {
  int type = kCounter;
  std::string help;
  std::vector<double> bounds;  // histograms only
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::GetFamily(std::string_view name, std::string_view help, int type,
                                      const std::vector<double>* bounds, const Labels& labels) {
  if (!ValidName(name, true)) Fatal("invalid metric name '" + std::string(name) + "'");
  for (const auto& [label, value] : labels) {
    if (!ValidName(label, false) || label == "le") Fatal("invalid label name '" + label + "' on " + std::string(name));
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto f = std::make_unique<Family>();
    f->type = type;
    f->help = std::string(help);
    if (bounds != nullptr) f->bounds = *bounds;
    it = families_.emplace(std::string(name), std::move(f)).first;
  }
  Family& f = *it->second;
  if (f.type != type) {
    Fatal("metric '" + std::string(name) + "' is a " + kTypeNames[f.type] + ", asked for as a " + kTypeNames[type]);
  }
  if (bounds != nullptr && f.bounds != *bounds) {
    Fatal("histogram '" + std::string(name) + "' asked for with other bounds");
  }
  return f;
}

Counter& Registry::GetCounter(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mu_);
  auto& slot = GetFamily(name, help, kCounter, nullptr, labels).counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::GetGauge(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mu_);
  auto& slot = GetFamily(name, help, kGauge, nullptr, labels).gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::GetHistogram(std::string_view name, std::string_view help, const std::vector<double>& bounds,
                                  const Labels& labels) {
  std::lock_guard lock(mu_);
  Family& f = GetFamily(name, help, kHistogram, &bounds, labels);
  auto& slot = f.histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

void Registry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard lock(hooks_mu_);
  hooks_.push_back(std::move(hook));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard lock(hooks_mu_);
    hooks = hooks_;
  }
  for (const auto& hook : hooks) hook();

  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " ";
    AppendEscaped(out, f->help, false);
    out += "\n# TYPE " + name + " " + kTypeNames[f->type] + "\n";
    for (const auto& [labels, c] : f->counters) {
      out += name + FormatLabels(labels) + " " + FormatValue(c->Value()) + "\n";
    }
    for (const auto& [labels, g] : f->gauges) out += name + FormatLabels(labels) + " " + FormatValue(g->Value()) + "\n";
    for (const auto& [labels, h] : f->histograms) {
      const Histogram::Snapshot s = h->Snap();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        const std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
        out += name + "_bucket" + FormatLabels(labels, "le", le) + " " + std::to_string(s.cumulative[i]) + "\n";
      }
      out += name + "_sum" + FormatLabels(labels) + " " + FormatValue(s.sum) + "\n";
      out += name + "_count" + FormatLabels(labels) + " " + std::to_string(s.cumulative.back()) + "\n";
    }
  }
  return out;
}

}  // namespace vigil::metrics
