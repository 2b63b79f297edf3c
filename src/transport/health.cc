#include "vigil/transport/health.h"

#include <algorithm>

namespace vigil::transport {

SessionHealth::SessionHealth(Options options, int64_t now) : opt_(options), last_write_(now), last_heard_(now) {}

void SessionHealth::Oldest(uint64_t id, bool sent, int64_t now) {
  if (!sent) {
    oldest_since_ = -1;
    return;
  }
  if (oldest_since_ < 0 || id != oldest_id_) {
    oldest_id_ = id;
    oldest_since_ = now;
  }
}

SessionHealth::Verdict SessionHealth::Check(int64_t now) const {
  if (now - last_heard_ >= opt_.peer_timeout_ns) return Verdict::kPeerSilent;
  if (oldest_since_ >= 0 && now - oldest_since_ >= opt_.ack_timeout_ns) return Verdict::kAckOverdue;
  if (now - last_write_ >= opt_.heartbeat_interval_ns) return Verdict::kSendHeartbeat;
  return Verdict::kOk;
}

int64_t SessionHealth::NextCheck(int64_t now) const {
  int64_t next = std::min(last_heard_ + opt_.peer_timeout_ns, last_write_ + opt_.heartbeat_interval_ns);
  if (oldest_since_ >= 0) next = std::min(next, oldest_since_ + opt_.ack_timeout_ns);
  return std::max(now, next);
}

void FailbackSchedule::SessionStarted(size_t index, int64_t now) {
  index_ = index;
  next_ = now + interval_;
}

}  // namespace vigil::transport
