// Internal: the edge's writer of a cuda_ipc ring (cuda_ipc.h), used by the framed link (framed_link.cc)
// for a session whose aggregator offered a ring.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ring.h"
#include "vigil/common/deadline.h"
#include "vigil/common/status.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

class RingWriter {
 public:
  // Maps the ring of `offer` (an offer with `error` fails: Unavailable quoting it). `device`: the CUDA
  // device the edge writes from (-1: the ring's GPU); `linger_us`: as ring::MapRing. Errors: Unavailable,
  // InvalidArgument (malformed offer).
  static StatusOr<std::unique_ptr<RingWriter>> Open(const RingOffer& offer, int device, uint32_t linger_us);
  ~RingWriter();  // drains the stream, unmaps

  // Writes `messages` in order, stamped with edge, epoch and consecutive link_seq from *link_seq (advanced
  // for what was written). Errors: Internal (a device payload failed to download or validate: nothing of
  // this call was written), DeadlineExceeded (no free slot before `deadline`), Unavailable (Abort, the
  // aggregator is gone, or a CUDA error: the session is lost).
  Status Write(std::span<const OutboxMessage* const> messages, std::string_view edge, uint64_t epoch,
               uint64_t* link_seq, Deadline deadline);
  // Makes a Write waiting for a slot fail promptly. Thread-safe.
  void Abort() { aborted_.store(true); }
  std::string transports() const { return mapping_->transports(); }

 private:
  RingWriter() = default;
  Status Acquire(Deadline deadline, bool* waited);
  Status Publish(uint32_t kind, uint32_t payload_bytes, uint32_t rows, uint32_t used);
  size_t offset() const { return static_cast<size_t>(seq_ % slots_) * slot_bytes_; }
  // The slot at `offset` in the host mirror (the CPU writes a slot's host part there).
  char* mirror(size_t offset) const { return control_->data() + ring::MirrorOffset(slots_) + offset; }

  std::unique_ptr<ring::SharedMemory> control_;  // the shared block: control, signals, host mirror
  const DevicePayload* device_ = nullptr;        // rows for the next Publish (a device report)
  std::unique_ptr<ring::RingMapping> mapping_;
  uint32_t slots_ = 0, slot_bytes_ = 0;
  uint64_t seq_ = 0;        // the next slot to publish
  uint32_t fill_ = 0;       // bytes staged in slot seq_ (a kind-1 slot being filled); 0 = none open
  std::vector<std::shared_ptr<const void>> keep_;  // per slot: device rows kept alive until the slot is reused
  std::atomic<bool> aborted_{false};
  std::string out_;                               // encoded host frames of one Write
  std::vector<ReportDetection> staging_rows_;     // device rows downloaded for encoding
};

}  // namespace vigil::transport
