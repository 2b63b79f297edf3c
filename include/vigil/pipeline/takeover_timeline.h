// vigil/pipeline/takeover_timeline.h — where a hot standby's takeover spends its time (issue 17).
//
// A takeover's goal is measured from the old primary's last contact to the aggregator storing the first frame
// the new primary processed. This records when each step on that path happened, so a slow takeover names its step:
//   decided   the standby's failure detector (or the primary's Finished) decided
//   drained   the picture ring drained and the standby's wait returned
//   serving   this node serves the replication channel (and the picture ring) as the new primary
//   ledger    the stream ledger (state dir) is open
//   welcomed  the aggregator's Welcome arrived (this node's epoch issued)
//   durable   the Welcome applied and its state write done (a new run's pictures are numbered only from then;
//             a resumed run's already from the Welcome)
//   resumed   the streams resumed (the warm sources' gate opened)
//   fed       the first picture (a mirrored one processed again, or a camera's) went to inference
//   detected  the first inference batch completed
//   stored    the aggregator acknowledged (stored) the report of the first frame this node processed
// and, apart from that path (a takeover with mirrored results, replication.mirror_results):
//   republished         the first of the old primary's own results re-published by this node
//   republished_stored  the aggregator stored it: from here on the detections flow again, before any picture
//                       of this node's own is processed
// Times are steady-clock nanoseconds (SteadyNs); a phase not reached stays 0 and reads as "-".
//
// Thread-safety: Mark from any thread (the first mark of a phase wins; later ones are ignored); Start, Format
// and Seconds from any thread. Errors: none. Ownership: a value type.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace vigil::pipeline {

class TakeoverTimeline {
 public:
  enum Phase : size_t { kDecided, kDrained, kServing, kLedger, kWelcomed, kDurable, kResumed, kFed, kDetected,
                        kStored, kRepublished, kRepublishedStored, kPhases };
  static const char* Name(Phase p);

  // The old primary's last contact: the origin. Marks before Start are ignored.
  void Start(int64_t contact_ns);
  bool started() const { return contact_ns_.load(std::memory_order_acquire) != 0; }
  // Records `p` at `now_ns` if it was not recorded yet; true when this call recorded it.
  bool Mark(Phase p, int64_t now_ns);
  // Seconds from the contact to `p`; nullopt when `p` was not reached (or before Start).
  std::optional<double> Seconds(Phase p) const;
  // "decided 0, drained 1, serving 12, …, stored 63" in milliseconds after the contact (one decimal), "-" for
  // a phase not reached.
  std::string Format() const;

 private:
  std::atomic<int64_t> contact_ns_{0};
  std::array<std::atomic<int64_t>, kPhases> at_{};
};

}  // namespace vigil::pipeline
