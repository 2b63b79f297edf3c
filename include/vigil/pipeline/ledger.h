// vigil/pipeline/ledger.h — the stream ledger: the one owner of a frame's identity and delivery state.
//
// Per stream the ledger owns: the run, the next seq (sources deliver pictures; the ledger numbers them),
// the epoch (granted by the aggregator: Admit), the rule state (RuleEngine), pending progress and drop
// marks, the outbox of unacknowledged messages (one transport::Outbox for all streams, drained by a
// transport::Courier over the configured links), the acknowledged cursor and the high-water mark of
// assigned seqs. docs/architecture.md ("The stream ledger") has the picture.
//
// Life of an edge with a ledger:
//   1. Open(): takes the state store (a state_dir is locked for one edge process) and loads each stream's
//      record. ResumedStreams() names the (stream, run) pairs that can resume, for the Hello.
//   2. Admit(welcome) with the aggregator's first Welcome (granted epoch + what it stored of each resumed
//      run) decides per stream (Resume()):
//      - no record, or another source: a new run, run id = the granted epoch, seq from 0;
//      - a replayable source (file, image folder) resumes its run: pictures are numbered by their
//        position (0, 1, … in the input, looping included), and those with seq ≤ the acknowledged cursor
//        (the larger of the persisted one and the Welcome's contiguous_through) are skipped (decoded and
//        discarded: `Number` returns false);
//      - a live source resumes its run and numbers new pictures after the larger of the persisted
//        high-water mark and the Welcome's highest stored seq, never skipping a picture; the seqs from
//        the acknowledged prefix up to there are reported once as a kLost range (rule "lost_on_restart"):
//        the aggregator stores those it does not have, so what the dead instance numbered and never
//        delivered is accounted, not left as a gap. resume().lost (and counters().lost_on_restart) count
//        the part above the highest stored seq, which is certainly lost. A hot standby that holds mirrored
//        pictures of the run (LedgerStream::mirrored) re-processes those above the acknowledged cursor
//        instead (resume().replay: the caller feeds them, in seq order, before the source's new pictures;
//        Record takes them like any frame), and only the seqs it has no picture for are reported lost.
//      Later Welcomes (reconnects) only update the epoch.
//   3. Reader threads call Number() for each decoded picture and Dropped() for a numbered picture that will
//      not be processed (live queue overflow, a failed batch): drops travel as kDropped marks.
//   4. The worker calls Record() per processed frame: rules → an event (one message) or a progress mark
//      (coalesced into seq ranges) → the outbox. A replayable stream waits for room in the outbox (it must
//      lose nothing and may run at the aggregator's pace); a live stream never waits: when the outbox is
//      full its frame becomes a drop mark (reason "backpressure"), held in the ledger until there is room.
//   5. Tick() (periodically, any thread) publishes marks older than the flush interval. OnAck() (the
//      courier's thread) advances the acknowledged cursor.
//   6. One background writer persists the records (batched: at most one write per persist_interval, each
//      a whole-state atomic write: StateStore), never on a reader or inference thread. The high-water mark
//      is persisted lazily: after a process crash the seqs assigned in the last persist_interval that never
//      reached the aggregator are numbered again by the next instance — harmless, as nothing outside the
//      dead process ever saw them.
//
// Time comes through a Clock (common/clock.h): mark ages and the flush interval use clock->SteadyNs(),
// publish timestamps clock->WallNs().
// Thread-safety: every method is thread-safe (one mutex; the per-frame work under it is small).
// Errors: Open returns the store's errors (FailedPrecondition when the state_dir is held by another
// process, DataLoss for a malformed state file).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/detect/detection.h"
#include "vigil/pipeline/rules.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"

namespace vigil::pipeline {

// What the ledger persists per stream.
struct StreamRecord {
  std::string stream;  // stream id
  std::string source;  // the source it was read from; another source starts a new run
  uint64_t run = 0;
  std::optional<uint64_t> acked_through;  // the aggregator confirmed 0..acked_through stored
  uint64_t next_seq = 0;                  // high-water mark: seqs below it were assigned
  bool operator==(const StreamRecord&) const = default;
};

// Where the records live. Save writes the whole state atomically (a crash leaves the old or the new).
// Thread-safety: one thread at a time (the ledger's writer, or Open).
class StateStore {
 public:
  virtual ~StateStore() = default;
  virtual StatusOr<std::vector<StreamRecord>> Load() = 0;
  virtual Status Save(const std::vector<StreamRecord>& records) = 0;
  virtual std::string where() const = 0;  // for messages
};

// The state_dir store:
//   <dir>/lock     flock(LOCK_EX | LOCK_NB) held while the store lives (holds the owner's pid as text):
//                  a second edge on the same dir gets FailedPrecondition naming the dir and that pid
//   <dir>/ledger.json  {"version": 1, "streams": [{"stream", "source", "run", "acked_through" (or null),
//                  "next_seq"}]}, written to ledger.json.tmp, fsync'ed, renamed, and the directory fsync'ed
// A dir written by an older vigil (streams/<id>.state files, no ledger.json) is read once and carried over.
// Errors: Internal / PermissionDenied naming the path and the OS reason; DataLoss for a malformed file.
StatusOr<std::unique_ptr<StateStore>> OpenStateDir(const std::string& dir);

// An in-memory store for tests: `records` outlives stores (a restart = a new store on the same records);
// `saves` counts Save calls. Read and write them under `mu` (the store takes it in Load and Save).
struct MemoryState {
  Mutex mu;
  std::vector<StreamRecord> records VIGIL_GUARDED_BY(mu);
  int saves VIGIL_GUARDED_BY(mu) = 0;
};
std::unique_ptr<StateStore> MakeMemoryStateStore(std::shared_ptr<MemoryState> state);

// A hot standby's mirrored live pictures of one run: their seqs, ascending (pipeline/mirror_window.h).
struct MirroredSeqs {
  uint64_t run = 0;
  std::vector<uint64_t> seqs;
};

struct LedgerStream {
  std::string id;
  std::string source;  // as configured (run identity)
  bool live = false;   // a network source: numbered after the high-water mark, never waits on the outbox
  RuleEngine rules;
  std::optional<MirroredSeqs> mirrored;  // live only: pictures this node can process again at a resume
};

struct LedgerOptions {
  Clock* clock = SystemClock();
  std::unique_ptr<StateStore> store;                    // required
  size_t max_outbox = 4096;                             // messages held until acked. Default: 4096
  std::chrono::milliseconds progress_flush{500};        // oldest age of a pending mark. Default: 500 ms
  std::chrono::milliseconds persist_interval{100};      // at most one state write per interval. Default: 100 ms
  std::chrono::milliseconds replayable_wait{3600000};   // a file stream's wait for room per message. Default: 1 h
};

// How a stream starts, decided at the first Admit.
struct StreamResume {
  enum Kind { kNewRun, kResumeReplayable, kResumeLive } kind = kNewRun;
  uint64_t run = 0;
  std::optional<uint64_t> skip_through;  // replayable: pictures with seq ≤ this are skipped
  uint64_t first_seq = 0;                // live: the first seq this instance assigns
  uint64_t lost = 0;                     // live: seqs assigned above the highest stored one (lost for sure)
  std::vector<uint64_t> replay;          // live: mirrored seqs to process again, ascending, all < first_seq
};

// The rows of a frame that reached the worker.
struct FrameInfo {
  uint64_t seq = 0;
  int64_t capture_ns = 0;  // CLOCK_REALTIME ns
  int64_t pts_ns = 0;
  uint32_t width = 0, height = 0;
};

struct LedgerCounters {
  uint64_t events = 0, progress_marks = 0, dropped = 0, lost_on_restart = 0, skipped_resume = 0;
  uint64_t backpressure_drops = 0;  // live frames whose report found the outbox full
  uint64_t persist_failures = 0;    // state writes that failed (retried at the next interval)
  uint64_t not_numbered = 0;        // pictures refused by Number (before admission, or runs not yet durable)
  uint64_t replayed = 0;            // mirrored pictures a resume processes again (StreamResume::replay)
};

class StreamLedger {
 public:
  static StatusOr<std::unique_ptr<StreamLedger>> Open(LedgerOptions options, std::vector<LedgerStream> streams);
  ~StreamLedger();  // Close()

  size_t size() const;                   // streams, in the order given
  const std::string& stream_id(size_t i) const;
  transport::Outbox& outbox();

  // (stream, run) pairs with a record whose source is still the configured one, for the Hello.
  std::vector<transport::HelloStream> ResumedStreams() const;
  // Applies a Welcome (see the header comment). The first call decides runs and numbering.
  void Admit(const transport::Welcome& welcome);
  bool admitted() const;
  // Waits until Admit has run, or `timeout`, or Close. True when admitted.
  bool WaitAdmitted(std::chrono::milliseconds timeout) const;
  uint64_t epoch() const;  // 0 before Admit
  StreamResume resume(size_t stream) const;  // REQUIRES: admitted()

  // Reader thread of `stream`: numbers the picture (sets seq; the caller copies run). `position`: a replayable
  // picture's position in its input (the Source's seq: frames kept from the input's start, across a looped
  // file's passes), which becomes its seq — so a source that did not start at the input's start (a hot
  // standby's, read up to the mirrored cursor before the takeover) numbers as one that did; ignored for a
  // live stream, whose seqs continue the ledger's own count. false: skip it — a replayable stream's picture
  // at or before its cursor (counted in skipped_resume), or a picture before admission or before the new runs
  // were written to the store (counted in not_numbered; a replayable stream waits for that write instead,
  // until CancelWaits or Close).
  bool Number(size_t stream, uint64_t position, uint64_t* seq);
  // A numbered picture will not be processed: a drop mark with `reason` (queue_full, detect_error, …).
  void Dropped(size_t stream, uint64_t seq, std::string_view reason);
  // A message the link could not send and the courier gave up (Reject kInvalid: e.g. its device rows did
  // not download): its frames are reported again as one drop mark (reason "invalid_report") instead of
  // being left as a gap. Ignored for another run or a mark (which carries no rows).
  void Refused(const transport::Reject& reject);
  // Worker: the processed frame's detections (source pixels) through the stream's rules; an event or a
  // progress mark goes to the outbox (see 4. above). Frames of a stream come in seq order.
  struct Recorded {
    Verdict verdict;
    int published = 0;  // messages handed to the outbox by this call (an event, a finished mark range)
  };
  // `device_rows` (optional): the same detections kept in device memory (a GPU detector's DeviceRows); an
  // event that carries every detection of the frame (its rules narrowed none away) then goes out with them
  // as a DevicePayload beside its host rows, so a link that sends device memory sends them from there.
  Recorded Record(size_t stream, const FrameInfo& frame, std::span<const detect::Detection> detections,
                  const detect::DeviceRows* device_rows = nullptr);
  // Publishes pending marks older than progress_flush (force: all of them) and held drop marks when the
  // outbox has room.
  void Tick(bool force = false);
  // The courier's acks: advances (stream, run)'s acknowledged cursor.
  void OnAck(const transport::Ack& ack);
  // The acknowledged cursor of `stream`'s current run.
  std::optional<uint64_t> acked_through(size_t stream) const;
  uint64_t run(size_t stream) const;

  LedgerCounters counters(size_t stream) const;
  // Writes the state now (and waits for it). Errors: the store's.
  Status Persist();
  // Ends every wait of a replayable stream (Record's wait for room, Number's wait for durable runs) at once:
  // for a stop. A file's frame whose report is given up this way lies after the acknowledged cursor and is
  // read again by the next start. Idempotent.
  void CancelWaits();
  // Stops the writer after a last write; the outbox is closed. Idempotent.
  void Close();

 private:
  struct Stream;
  struct Impl;
  explicit StreamLedger(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vigil::pipeline
