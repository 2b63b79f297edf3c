#include "aggregator/live_feed.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include "vigil/common/deadline.h"

namespace vigil::aggregator {

using nlohmann::json;

void LiveFeed::EventsStored() {
  MutexLock lock(mu_);
  ++version_;
  changed_.NotifyAll();
}

void LiveFeed::PublishDecisions(const std::vector<EventDecision>& decisions, const DecisionResult& decided,
                                int64_t at_ns) {
  MutexLock lock(mu_);
  bool any = false;
  for (size_t i = 0; i < decisions.size() && i < decided.applied.size(); ++i) {
    if (!decided.applied[i]) continue;
    const EventDecision& d = decisions[i];
    json labels = json::array();
    for (const DetectionUpdate& u : d.detections) {
      labels.push_back({{"index", u.index}, {"label", u.label}, {"second_label", u.second_label},
                        {"second_score", u.second_score}});
    }
    const json j = {{"key", StrCat(d.edge, "/", d.stream, "/", d.run, "/", d.seq)},
                    {"edge", d.edge},
                    {"stream", d.stream},
                    {"run", d.run},
                    {"seq", d.seq},
                    {"state", ToString(d.state)},
                    {"state_reason", d.reason},
                    {"decided_ns", at_ns},
                    {"detections", std::move(labels)}};
    // Client-supplied text (edge ids, labels) may be invalid UTF-8: replaced, never thrown on.
    decided_.emplace_back(++decided_seq_, j.dump(-1, ' ', false, json::error_handler_t::replace));
    if (decided_.size() > kMaxDecided) decided_.pop_front();
    any = true;
  }
  if (any) {
    ++version_;
    changed_.NotifyAll();
  }
}

void LiveFeed::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  changed_.NotifyAll();
}

uint64_t LiveFeed::decided_seq() const {
  MutexLock lock(mu_);
  return decided_seq_;
}

std::optional<uint64_t> LiveFeed::Version() const {
  MutexLock lock(mu_);
  if (closed_) return std::nullopt;
  return version_;
}

void LiveFeed::AppendDecisions(uint64_t* cursor, std::string* out) const {
  MutexLock lock(mu_);
  for (const auto& [n, body] : decided_) {
    if (n <= *cursor) continue;
    *out += StrCat("event: state\ndata: ", body, "\n\n");
    *cursor = n;
  }
}

LiveFeed::Wake LiveFeed::WaitForChange(uint64_t seen, int64_t timeout_ns) {
  // From the Clock seam's steady time (SystemClock()'s origin is the Deadline's).
  const Deadline deadline = Deadline::AtSteadyNs(clock_->SteadyNs() + timeout_ns);
  MutexLock lock(mu_);
  while (!closed_ && version_ == seen) {
    if (!changed_.WaitUntil(lock, deadline)) break;
  }
  if (closed_) return Wake::kClosed;
  return version_ == seen ? Wake::kTimeout : Wake::kChanged;
}

}  // namespace vigil::aggregator
