#include "vigil/common/deadline.h"
#include "vigil/transport/outbox.h"

#include <algorithm>

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;

// The field rules of a message before the link stamps edge and epoch.
Status ValidateMessage(const Report& report, const std::optional<DevicePayload>& device) {
  VIGIL_RETURN_IF_ERROR(ValidateReportFields(report));
  if (!device) return absl::OkStatus();
  auto bad = [&](std::string reason) {
    return absl::InvalidArgumentError(StrCat("report ", report.stream, " run ", report.run, " seq ", report.seq_first,
                                             "..", report.seq_last, ": device payload: ", reason));
  };
  if (!report.detections.empty() && report.detections.size() != device->count) {
    return bad(StrCat(report.detections.size(), " host rows beside ", device->count, " device rows (a host copy must be "
                      "the same rows)"));
  }
  if (device->count > kMaxDetections) return bad(StrCat(device->count, " rows, more than ", kMaxDetections));
  if (device->count > 0 && report.kind != ReportKind::kEvent) {
    return bad(StrCat("a ", ToString(report.kind), " report carries no detections"));
  }
  if (device->count > 0 && !device->download) return bad("no download function");
  return absl::OkStatus();
}

}  // namespace

Outbox::Outbox(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

StatusOr<uint64_t> Outbox::Push(Report report, milliseconds wait, std::optional<DevicePayload> device) {
  VIGIL_RETURN_IF_ERROR(ValidateMessage(report, device));
  report.edge.clear();  // stamped by the link from its session
  report.epoch = 0;
  auto msg = std::make_shared<OutboxMessage>();
  msg->report = std::move(report);
  msg->device = std::move(device);
  MutexLock lock(mu_);
  const Deadline deadline = Deadline::After(wait);
  while (!closed_ && pending_.size() >= capacity_ && cv_.WaitUntil(lock, deadline)) {
  }
  if (!closed_ && pending_.size() >= capacity_) {
    ++stats_.backpressure;
    return absl::ResourceExhaustedError(StrCat("outbox full: ", pending_.size(), " messages held (capacity ",
                                               capacity_, "), none acknowledged within ", wait.count(), " ms"));
  }
  if (closed_) return absl::CancelledError("outbox closed");
  msg->id = next_id_++;
  pending_.push_back(std::move(msg));
  done_.push_back(false);
  ++stats_.pushed;
  ++stats_.pending;
  cv_.NotifyAll();
  return pending_.back()->id;
}

std::vector<std::shared_ptr<const OutboxMessage>> Outbox::PendingFrom(uint64_t from_id, size_t max) const {
  std::vector<std::shared_ptr<const OutboxMessage>> out;
  MutexLock lock(mu_);
  if (pending_.empty()) return out;
  const uint64_t front = pending_.front()->id;
  for (size_t i = from_id > front ? from_id - front : 0; i < pending_.size() && out.size() < max; ++i) {
    if (!done_[i]) out.push_back(pending_[i]);
  }
  return out;
}

uint64_t Outbox::front_id() const {
  MutexLock lock(mu_);
  return FrontIdLocked();
}

uint64_t Outbox::next_id() const {
  MutexLock lock(mu_);
  return next_id_;
}

size_t Outbox::FindPending(const std::string& stream, uint64_t run, uint64_t seq_first) const {
  size_t i = 0;
  for (; i < pending_.size(); ++i) {
    const Report& r = pending_[i]->report;
    if (!done_[i] && r.seq_first == seq_first && r.run == run && r.stream == stream) break;
  }
  return i;
}

bool Outbox::IsPending(const std::string& stream, uint64_t run, uint64_t seq_first) const {
  MutexLock lock(mu_);
  return FindPending(stream, run, seq_first) < pending_.size();
}

bool Outbox::Complete(const std::string& stream, uint64_t run, uint64_t seq_first, bool acked) {
  MutexLock lock(mu_);
  const size_t i = FindPending(stream, run, seq_first);
  if (i == pending_.size()) return false;  // already completed (a duplicate ack after a re-send)
  done_[i] = true;
  --stats_.pending;
  ++(acked ? stats_.acked : stats_.rejected);
  while (!pending_.empty() && done_.front()) {
    pending_.pop_front();
    done_.pop_front();
  }
  cv_.NotifyAll();
  return true;
}

bool Outbox::WaitBeyond(uint64_t id, milliseconds timeout) const {
  MutexLock lock(mu_);
  const Deadline deadline = Deadline::After(timeout);
  while (!closed_ && next_id_ <= id && cv_.WaitUntil(lock, deadline)) {
  }
  return next_id_ > id;
}

bool Outbox::WaitEmpty(milliseconds timeout) const {
  MutexLock lock(mu_);
  const Deadline deadline = Deadline::After(timeout);
  while (stats_.pending != 0 && cv_.WaitUntil(lock, deadline)) {
  }
  return stats_.pending == 0;
}

bool Outbox::WaitCompleted(uint64_t id, milliseconds timeout) const {
  MutexLock lock(mu_);
  const Deadline deadline = Deadline::After(timeout);
  while (!closed_ && FrontIdLocked() < id && cv_.WaitUntil(lock, deadline)) {
  }
  return FrontIdLocked() >= id;
}

void Outbox::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  cv_.NotifyAll();
}

bool Outbox::closed() const {
  MutexLock lock(mu_);
  return closed_;
}

OutboxStats Outbox::Stats() const {
  MutexLock lock(mu_);
  return stats_;
}

}  // namespace vigil::transport
