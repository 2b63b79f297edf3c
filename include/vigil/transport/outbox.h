// vigil/transport/outbox.h — the edge's ordered window of unacknowledged messages.
//
// The stream ledger (pipeline/ledger.h) owns one Outbox; a Courier (courier.h) drains it over whichever
// Link is up. The Outbox is the retransmit window: a message stays until the aggregator acknowledges (or
// refuses) it, so a session that breaks — on any link — loses nothing: the next session re-sends every
// message still pending, in publish order. Ordering and the window live here, above the links, so a
// switch between links neither loses nor reorders anything.
//
// A message is typed: a Report header plus its detection rows, which live in host memory
// (Report::detections), in device memory (DevicePayload: a link that can send device memory sends it
// from there; one that cannot calls `download` into its own staging buffer), or in both (a DevicePayload
// with a host copy of the same rows in Report::detections: a link that cannot send device memory sends the
// host copy, with no download). Edge id and epoch are stamped by the link from its session, not stored here.
//
// Thread-safety: every method is thread-safe. Push may block (see there); WaitEmpty and WaitBeyond block
// up to their timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

// Detection rows that live in device memory: `count` rows of the ReportDetection layout.
struct DevicePayload {
  uint32_t count = 0;
  int device = -1;                  // CUDA device ordinal; -1: the rows are in host memory (a producer
                                    // without a GPU, the CPU tests), sent like device rows where a link can
  const void* device_rows = nullptr;  // count × 24 bytes in device memory (valid while keepalive lives)
  // Waits for the rows' ready event and copies them to `dst` (host, count rows). Set by the producer.
  std::function<Status(ReportDetection* dst)> download;
  // A cudaEvent_t recorded after the rows were written (a link copying device to device waits on it on
  // its own stream), or null when they are complete already.
  void* ready_event = nullptr;
  std::shared_ptr<const void> keepalive;  // keeps the device memory alive until the message completes
};

struct OutboxMessage {
  uint64_t id = 0;  // publish order: consecutive from 0 in one Outbox
  Report report;    // edge and epoch left empty (the link stamps them); detections on the host, or empty
  std::optional<DevicePayload> device;  // rows in device memory (report.detections: empty, or a host copy)
};

struct OutboxStats {
  uint64_t pushed = 0;        // messages accepted
  uint64_t acked = 0;         // completed by an Ack
  uint64_t rejected = 0;      // completed by a Reject (never stored)
  uint64_t backpressure = 0;  // Push calls that found no room within their wait
  uint64_t pending = 0;       // messages waiting for an ack now
};

class Outbox {
 public:
  // REQUIRES: capacity ≥ 1 (messages held at most).
  explicit Outbox(size_t capacity);

  // Appends `report` (and its device rows). Waits up to `wait` for room while `capacity` messages are
  // held (pending, or completed behind an older pending one). Errors: InvalidArgument (ValidateReportFields
  // fails, edge/epoch are not checked; or `device` has rows on a report that is not an event, more than
  // kMaxDetections rows, no `download`, or host detections of another count), ResourceExhausted (still full
  // after `wait`, counted), Cancelled (after Close). Returns the message's id. Clears edge and epoch.
  StatusOr<uint64_t> Push(Report report, std::chrono::milliseconds wait,
                          std::optional<DevicePayload> device = std::nullopt) VIGIL_EXCLUDES(mu_);

  // The pending messages with id ≥ from_id, oldest first, at most `max` of them. Shared pointers: a
  // completed message stays valid for the caller that is sending it.
  std::vector<std::shared_ptr<const OutboxMessage>> PendingFrom(uint64_t from_id, size_t max) const VIGIL_EXCLUDES(mu_);
  // Id of the oldest pending message (= next_id() when none is pending).
  uint64_t front_id() const VIGIL_EXCLUDES(mu_);
  // Id the next Push gets.
  uint64_t next_id() const VIGIL_EXCLUDES(mu_);

  // Completes the oldest pending message of (stream, run) whose seq_first is `seq_first` (acked: true for
  // an Ack, false for a Reject). false when there is none (an Ack for a message already completed).
  bool Complete(const std::string& stream, uint64_t run, uint64_t seq_first, bool acked) VIGIL_EXCLUDES(mu_);
  // Whether Complete(stream, run, seq_first, …) would find a pending message now.
  bool IsPending(const std::string& stream, uint64_t run, uint64_t seq_first) const VIGIL_EXCLUDES(mu_);

  // Waits until a message with id ≥ id exists (or Close, or the timeout); true when one does.
  bool WaitBeyond(uint64_t id, std::chrono::milliseconds timeout) const VIGIL_EXCLUDES(mu_);
  // Waits until nothing is pending; false when the timeout passed first.
  bool WaitEmpty(std::chrono::milliseconds timeout) const VIGIL_EXCLUDES(mu_);
  // Waits until every message with id < `id` is completed (acked or rejected), whatever was pushed after
  // them; false when the timeout passed first or the outbox was closed with one still pending.
  bool WaitCompleted(uint64_t id, std::chrono::milliseconds timeout) const VIGIL_EXCLUDES(mu_);
  // Makes Push fail with Cancelled and wakes every waiter. Pending messages stay readable. Idempotent.
  void Close() VIGIL_EXCLUDES(mu_);
  bool closed() const VIGIL_EXCLUDES(mu_);

  OutboxStats Stats() const VIGIL_EXCLUDES(mu_);

 private:
  // Index in pending_ of the matching message not yet done; pending_.size() when none.
  size_t FindPending(const std::string& stream, uint64_t run, uint64_t seq_first) const VIGIL_REQUIRES(mu_);
  // front_id() with the lock held.
  uint64_t FrontIdLocked() const VIGIL_REQUIRES(mu_) { return pending_.empty() ? next_id_ : pending_.front()->id; }

  const size_t capacity_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  std::deque<std::shared_ptr<OutboxMessage>> pending_ VIGIL_GUARDED_BY(mu_);  // ascending id; done ones leave from the front
  std::deque<bool> done_ VIGIL_GUARDED_BY(mu_);                               // parallel to pending_
  uint64_t next_id_ VIGIL_GUARDED_BY(mu_) = 0;
  bool closed_ VIGIL_GUARDED_BY(mu_) = false;
  OutboxStats stats_ VIGIL_GUARDED_BY(mu_);
};

}  // namespace vigil::transport
