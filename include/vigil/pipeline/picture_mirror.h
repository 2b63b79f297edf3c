// vigil/pipeline/picture_mirror.h — a primary edge's mirroring of its live pictures (and their detections) to
// the hot standby (edge_config.h `replication:` mirror_frames / mirror_results / mirror_via; issue 16, 17, 41).
//
// A live picture reaches the standby one of three ways, tried in this order for each picture a reader numbers:
//   RingMirror     raw, through the same-host picture ring (replication/frame_ring.h FramePublisher), while a
//                  standby has one mapped and the picture fits its slots (a GPU picture device to device into a
//                  ring in GPU memory; else downloaded first);
//   ChannelMirror  as a JPEG of jpeg_quality over the replication channel (replication/channel.h PrimaryChannel),
//                  while a standby is paired; the channel keeps it until the aggregator stored it;
//   UnpairedKeep   raw (one copy, no encode; a GPU picture device to device, packed NV12), while no standby is
//                  paired: at most mirror_window per stream, until stored. A standby that pairs gets those still
//                  unstored within one Periodic (on the flush thread: ring, else JPEG over the channel).
// Each way is a PictureMirror: Prepare (outside any lock: encode, download, copy) says whether it takes the
// picture now; Hand (under the order lock, right after the ledger numbered the picture) hands it over; HandKept
// offers it a kept picture (the flush); Stored tells it what the aggregator stored.
//
// Ordering: the ledger's mirrored states (MirroringStore in replication_role.h) are published under order();
// a picture is numbered and handed over under the same lock, so no ledger state that counts a seq reaches the
// standby before that seq's picture (replication/channel.h "Frame mirroring").
// "Stored" is decided once, by the aggregator's Ack (its contiguous_through for (stream, run)): the edge passes it
// to Stored, which each way observes (the channel's retained pictures and results are acknowledged, kept raw
// pictures dropped) and the flush skips kept pictures it covers. (Kept pictures are all numbered after the
// Welcome's cursor — the ledger numbers live pictures after it and replays only seqs the aggregator lacks — so
// the Acks alone cover them.)
//
// Ownership: the Edge owns the PrimaryMirror (made at the start of Run); the mirror owns its three ways, the
// kept pictures, the order lock and the flush thread. The channel and the ring are not owned (set by RunEdge
// when this node is or becomes the primary; they outlive the mirror). Metric handles are looked up in the
// registry given (it outlives the mirror).
// Threads: Number on the streams' reader threads; Stored on the courier's reader thread; MirrorResult on the
// pool's sink thread; Periodic and Join on Run's thread; HandKept on the flush thread Periodic starts (one at a
// time). Every method is thread-safe; AddStream only before the readers start.
// Metrics (per stream): vigil_edge_mirror_frames_total, _mirror_bytes_total, _mirror_frames_skipped_total,
// _mirror_unpaired_evicted_total, _mirror_results_total; vigil_edge_stage_seconds{stage="mirror"} (what the
// mirroring costs a reader); sampled in Periodic: vigil_edge_mirror_ring_mapped, _ring_sessions_total,
// _ring_refused_total, _mirror_retained_frames, _retained_bytes, _frames_evicted_total, _results_evicted_total.
// Errors: none returned; a picture that cannot be mirrored is counted (skipped) and its failure logged once per
// stream. A standby that takes over reports a picture it never got as lost_on_restart.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <absl/functional/function_ref.h>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/detect/detector.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/replication/channel.h"
#include "vigil/replication/frame_ring.h"
#include "vigil/video/frame.h"

namespace vigil::pipeline {

// A ring's picture in GPU memory (MirroredFrame::gpu, packed NV12) as a device Frame: the planes stay where they
// are (the frame holds them); copy_to_host lets video::DownloadBgr read them. Identity and times: the caller's.
video::Frame FrameOfGpu(const replication::MirroredFrame& m);
// A raw picture (MirroredFrame::bgr, rows of `stride`) as a host Frame of unpadded rows.
video::Frame FrameOfRaw(const replication::MirroredFrame& m);

// What the ways share: the order lock, the channel and ring (not owned), the per-stream counters. Owned by the
// PrimaryMirror; the ways refer to it.
struct MirrorShared {
  struct Stream {
    std::string id;
    metrics::Counter* mirrored = nullptr;          // pictures handed to the standby
    metrics::Counter* mirrored_bytes = nullptr;    // … their bytes (JPEG, or raw pixels into the ring)
    metrics::Counter* skipped = nullptr;           // not mirrored: did not encode, copy or fit
    metrics::Counter* unpaired_evicted = nullptr;  // kept while unpaired, dropped for room unstored
    metrics::Counter* results_mirrored = nullptr;  // detections handed to the channel
    std::atomic<bool> error_logged{false};         // a mirroring failure said once
    std::atomic<bool> ring_size_logged{false};     // "does not fit the ring's slots" said once
  };
  ReplicationConfig config;
  Clock* clock = SystemClock();
  Mutex order;  // a picture's numbering + hand-over against the ledger's mirrored states (see above)
  std::atomic<replication::PrimaryChannel*> channel{nullptr};
  std::atomic<replication::FramePublisher*> ring{nullptr};
  std::deque<Stream> streams;  // complete before the readers start (AddStream)
  metrics::Histogram* stage = nullptr;  // vigil_edge_stage_seconds{stage="mirror"}
};

// One way a live picture reaches the standby (above). Implementations: RingMirror, ChannelMirror, UnpairedKeep.
class PictureMirror {
 public:
  // A picture as this way hands it over (Prepare fills it; the caller sets picture.run and .seq).
  struct Prepared {
    replication::MirroredFrame picture;  // identity and times; the pixels this way carries (jpeg, bgr or gpu)
    const video::Frame* raw = nullptr;   // RingMirror: the picture to write (the reader's, or `downloaded`)
    video::Frame downloaded;             // RingMirror: a GPU picture downloaded for a ring in host memory
  };
  virtual ~PictureMirror() = default;
  // Reader thread, no lock held: whether this way takes stream `index`'s live picture `f` now; true fills `out`
  // (which must not move until Hand). A picture this way wanted but could not prepare is counted (skipped) and
  // false returned: the next way is tried.
  virtual bool Prepare(size_t index, const video::Frame& f, Prepared* out) = 0;
  // Under MirrorShared::order, the picture numbered (`p.picture.run`, `.seq` set; `f` alive): hands it over and
  // counts it.
  virtual void Hand(size_t index, Prepared& p) = 0;
  // The flush thread, no lock held: a picture kept while no standby was paired. true: taken (handed over,
  // counted, or kept again); false: the next way is offered it.
  virtual bool HandKept(size_t index, const replication::MirroredFrame& m) = 0;
  // The aggregator stored stream `id`'s run `run` through seq `through` (and its earlier runs).
  virtual void Stored(const std::string& /*id*/, uint64_t /*run*/, uint64_t /*through*/) {}
};

class RingMirror final : public PictureMirror {
 public:
  explicit RingMirror(MirrorShared& shared) : shared_(shared) {}
  bool Prepare(size_t index, const video::Frame& f, Prepared* out) override;
  void Hand(size_t index, Prepared& p) override;
  bool HandKept(size_t index, const replication::MirroredFrame& m) override;

 private:
  // Writes `m` (seq and run set) — host pixels `bgr` or `device` (a ring in GPU memory) — and counts the outcome.
  void Write(size_t index, const replication::MirroredFrame& m, const uint8_t* bgr, size_t stride,
             const video::DeviceFrame* device);
  MirrorShared& shared_;
};

class ChannelMirror final : public PictureMirror {
 public:
  explicit ChannelMirror(MirrorShared& shared) : shared_(shared) {}
  bool Prepare(size_t index, const video::Frame& f, Prepared* out) override;
  void Hand(size_t index, Prepared& p) override;
  bool HandKept(size_t index, const replication::MirroredFrame& m) override;
  void Stored(const std::string& id, uint64_t run, uint64_t through) override;

 private:
  MirrorShared& shared_;
};

class UnpairedKeep final : public PictureMirror {
 public:
  explicit UnpairedKeep(MirrorShared& shared) : shared_(shared) {}
  bool Prepare(size_t index, const video::Frame& f, Prepared* out) override;
  void Hand(size_t index, Prepared& p) override VIGIL_EXCLUDES(mu_);
  bool HandKept(size_t index, const replication::MirroredFrame& m) override VIGIL_EXCLUDES(mu_);
  void Stored(const std::string& id, uint64_t run, uint64_t through) override VIGIL_EXCLUDES(mu_);
  // Keeps `m` (no bound: a takeover's replayed pictures).
  void Keep(size_t index, replication::MirroredFrame m) VIGIL_EXCLUDES(mu_);
  // Takes every kept picture, per stream in seq order (streams with none left out).
  std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> TakeAll() VIGIL_EXCLUDES(mu_);
  size_t kept(size_t index) const VIGIL_EXCLUDES(mu_);

 private:
  MirrorShared& shared_;
  mutable Mutex mu_;  // taken after shared_.order where both are held (Hand)
  std::vector<std::deque<replication::MirroredFrame>> kept_ VIGIL_GUARDED_BY(mu_);  // per stream, seq order
};

struct PrimaryMirrorOptions {
  ReplicationConfig config;                 // mirror_frames, mirror_results, jpeg_quality, mirror_window
  metrics::Registry* registry = nullptr;    // required; outlives the mirror
  Clock* clock = SystemClock();             // the mirroring stage's times. Default: the system clock
  std::function<bool()> stopping;           // the flush stops when true (may be empty)
};

// The primary's mirroring (above): the Edge's one interface to it.
class PrimaryMirror {
 public:
  explicit PrimaryMirror(PrimaryMirrorOptions options);
  ~PrimaryMirror();  // joins the flush thread
  PrimaryMirror(const PrimaryMirror&) = delete;
  PrimaryMirror& operator=(const PrimaryMirror&) = delete;

  // The channel to mirror on and the ring (not owned; either may stay null): set when this node is or becomes
  // the primary, before the ledger opens. Any thread.
  void set_channel(replication::PrimaryChannel* channel) { shared_.channel.store(channel); }
  void set_ring(replication::FramePublisher* ring) { shared_.ring.store(ring); }
  replication::PrimaryChannel* channel() const { return shared_.channel.load(); }
  // The lock the ledger's mirrored states are published under (MirroringStore).
  Mutex* order() { return &shared_.order; }

  // Adds stream `id` (its counters); index = the number of streams added before. Before the readers start.
  size_t AddStream(const std::string& id);

  // A reader's picture `f` of stream `index` (live or not; `run` its run): numbered by `number` (the ledger's
  // Number: false refuses the picture) and, a live one of a primary that mirrors, handed to the standby the first
  // way that takes it. Sets f.seq and f.run. false: `number` refused it (nothing handed over).
  bool Number(size_t index, bool live, uint64_t run, video::Frame& f, absl::FunctionRef<bool(uint64_t*)> number);
  // A processed live frame's detections for the standby (replication.mirror_results, a channel set).
  void MirrorResult(size_t index, bool live, uint64_t run, const FrameInfo& info,
                    std::span<const detect::Detection> dets);
  // A takeover's replayed pictures of stream `index` (those with pixels), kept for this node's own standby like
  // its own (with mirror_frames and a channel).
  void KeepTakenOver(size_t index, const std::vector<replication::MirroredFrame>& frames);
  // The aggregator stored stream `id`'s run `run` through `through` (an Ack's contiguous_through ≥ 0).
  void Stored(const std::string& id, uint64_t run, uint64_t through) VIGIL_EXCLUDES(stored_mu_);
  // Run's thread, every ~100 ms: a standby just paired gets the kept pictures (the flush thread, one at a time);
  // the ring's and the channel's gauges and counters.
  void Periodic();
  // Waits for the flush thread (Run's thread).
  void Join();

  UnpairedKeep& keep() { return keep_; }  // tests

 private:
  void FlushKept(std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> kept);  // flush thread
  bool IsStored(size_t index, const replication::MirroredFrame& m) const VIGIL_EXCLUDES(stored_mu_);

  MirrorShared shared_;
  metrics::Registry& reg_;
  std::function<bool()> stopping_;
  RingMirror ring_{shared_};
  ChannelMirror channel_{shared_};
  UnpairedKeep keep_{shared_};
  PictureMirror* ways_[3] = {&ring_, &channel_, &keep_};
  mutable Mutex stored_mu_;
  // Per stream: the (run, seq) the aggregator stored through, from the Acks (Stored).
  std::vector<std::optional<std::pair<uint64_t, uint64_t>>> stored_ VIGIL_GUARDED_BY(stored_mu_);
  std::thread flush_;                      // Run's thread only (Periodic, Join)
  std::atomic<bool> flush_running_{false};
  uint64_t ring_sessions_seen_ = 0, ring_refused_seen_ = 0;  // Periodic's thread
  uint64_t frames_evicted_seen_ = 0, results_evicted_seen_ = 0;  // Periodic's thread
};

}  // namespace vigil::pipeline
