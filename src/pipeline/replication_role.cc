// An edge's replication role (replication_role.h).
#include "replication_role.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/pipeline/mirrored_ledger_writer.h"
#include "vigil/replication/failure_detector.h"
#include "vigil/video/source.h"

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

replication::ChannelTls TlsOf(const ReplicationConfig& r) { return {r.cert_file, r.key_file, r.ca_file}; }

std::vector<replication::MirroredStream> ToMirrored(const std::vector<StreamRecord>& records) {
  std::vector<replication::MirroredStream> out;
  for (const StreamRecord& r : records) out.push_back({r.stream, r.source, r.run, r.acked_through, r.next_seq});
  return out;
}

std::vector<StreamRecord> FromMirrored(const std::vector<replication::MirroredStream>& streams) {
  std::vector<StreamRecord> out;
  for (const replication::MirroredStream& s : streams) {
    out.push_back({s.stream, s.source, s.run, s.acked_through, s.next_seq});
  }
  return out;
}

class Mirroring final : public StateStore {
 public:
  Mirroring(std::unique_ptr<StateStore> inner, replication::PrimaryChannel* channel, Mutex* order)
      : inner_(std::move(inner)), channel_(channel), order_(order) {}
  StatusOr<std::vector<StreamRecord>> Load() override { return inner_->Load(); }
  Status Save(const std::vector<StreamRecord>& records) override {
    Status st = inner_->Save(records);
    if (!st.ok()) return st;
    std::vector<replication::MirroredStream> streams = ToMirrored(records);
    if (order_ != nullptr) {
      MutexLock lock(*order_);
      channel_->PublishLedger(std::move(streams));
    } else {
      channel_->PublishLedger(std::move(streams));
    }
    return st;
  }
  std::string where() const override { return inner_->where(); }

 private:
  std::unique_ptr<StateStore> inner_;
  replication::PrimaryChannel* channel_;
  Mutex* order_;
};

}  // namespace

StatusOr<replication::PairDigest> PairDigestOf(const EdgeConfig& config) {
  const PairTexts t = PairTextsOf(config);
  return replication::ComputePairDigest({t.model_path, t.settings, t.streams, t.rules});
}

StatusOr<std::unique_ptr<replication::FramePublisher>> ListenForFrameRing(const EdgeConfig& config) {
  std::string path = config.replication.mirror_socket;
  std::error_code ec;
  if (path.empty()) {  // in the state_dir, which the edge creates anyway (the ledger opens it later)
    const std::filesystem::path dir = std::filesystem::absolute(config.state_dir, ec).lexically_normal();
    std::filesystem::create_directories(dir, ec);
    path = (dir / "frames.sock").string();
  } else {  // offered to the standby as it is: a path relative to this process's directory would not reach it
    path = std::filesystem::absolute(path, ec).lexically_normal().string();
  }
  replication::FramePublisherOptions o;
  o.socket = path;
  StatusOr<std::unique_ptr<replication::FramePublisher>> p = replication::FramePublisher::Listen(o);
  if (!p.ok()) {
    return Status(p.status().code(),
                  StrCat("replication.mirror_socket '", path, "' (the picture ring): ", p.status().message()));
  }
  return p;
}

StatusOr<std::unique_ptr<replication::PrimaryChannel>> StartPrimaryChannel(const EdgeConfig& config,
                                                                           const replication::PairDigest& digest,
                                                                           replication::FramePublisher* frames) {
  replication::PrimaryChannelOptions o;
  o.listen = config.replication.listen;
  o.tls = TlsOf(config.replication);
  o.edge = config.edge;
  o.node = config.replication.node;
  o.digest = digest;
  // The unacknowledged pictures of every live stream, as many as the standby's window holds per stream.
  size_t live = 0;
  for (const StreamConfig& sc : config.streams) live += video::IsLiveUri(sc.source) ? 1 : 0;
  o.max_retained_frames = std::max<size_t>(1, live * static_cast<size_t>(config.replication.mirror_window));
  o.max_retained_results = o.max_retained_frames;
  if (frames != nullptr) {
    o.frames_offer = [frames] { return replication::FramesOffer{frames->socket(), frames->NewToken()}; };
  }
  return replication::PrimaryChannel::Start(std::move(o));
}

std::unique_ptr<StateStore> MirroringStore(std::unique_ptr<StateStore> inner, replication::PrimaryChannel* channel,
                                           Mutex* order) {
  return std::make_unique<Mirroring>(std::move(inner), channel, order);
}

namespace {

// The standby side's channel options for `config` (callbacks left empty).
replication::StandbyChannelOptions StandbyOptionsOf(const EdgeConfig& config, const replication::PairDigest& digest) {
  const ReplicationConfig& rc = config.replication;
  replication::StandbyChannelOptions so;
  so.primary = rc.peer;
  so.tls = TlsOf(rc);
  so.edge = config.edge;
  so.node = rc.node;
  so.digest = digest;
  so.heartbeat_interval = milliseconds(rc.heartbeat_ms);
  return so;
}

}  // namespace

StatusOr<bool> PeerIsPrimary(const EdgeConfig& config, const replication::PairDigest& digest) {
  StatusOr<std::unique_ptr<replication::StandbyChannel>> ch =
      replication::StandbyChannel::Pair(StandbyOptionsOf(config, digest), milliseconds(1000));
  if (ch.ok()) {
    (*ch)->Stop();
    return true;
  }
  if (absl::IsUnavailable(ch.status()) || absl::IsCancelled(ch.status()) || absl::IsDeadlineExceeded(ch.status())) {
    return false;  // nobody answers there: this node is the primary
  }
  return ch.status();
}

StatusOr<Takeover> RunStandby(const EdgeConfig& config, const replication::PairDigest& digest,
                              const std::atomic<bool>& stop,
                              std::function<void(const std::vector<StreamRecord>&)> on_mirrored,
                              std::function<void(replication::MirroredFrame&&)> on_frame,
                              std::function<void(replication::MirroredResult&&)> on_result,
                              std::function<bool(const replication::MirroredFrame&)> frame_wanted) {
  const ReplicationConfig& rc = config.replication;
  // The standby's own state_dir, locked while it waits: the primary's records land here.
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<StateStore> store, OpenStateDir(config.state_dir));
  replication::FailureDetectorOptions fo;
  fo.mode = rc.phi ? replication::FailureDetectorOptions::Mode::kPhiAccrual
                   : replication::FailureDetectorOptions::Mode::kFixed;
  fo.interval_ns = static_cast<int64_t>(rc.heartbeat_ms) * 1'000'000;
  fo.misses = rc.misses;
  fo.phi_threshold = rc.phi ? rc.phi_threshold : fo.phi_threshold;
  fo.min_std_dev_ns = static_cast<int64_t>(rc.min_std_dev_ms) * 1'000'000;
  fo.acceptable_pause_ns = static_cast<int64_t>(rc.acceptable_pause_ms) * 1'000'000;
  VIGIL_RETURN_IF_ERROR(replication::ValidateFailureDetectorOptions(fo));

  struct Shared {
    Mutex mu;
    CondVar cv;
    std::optional<replication::FailureDetector> detector VIGIL_GUARDED_BY(mu);  // from pairing on
    bool ended VIGIL_GUARDED_BY(mu) = false;
    Status why VIGIL_GUARDED_BY(mu);
    int64_t last_contact VIGIL_GUARDED_BY(mu) = 0;
    uint64_t ledger_states VIGIL_GUARDED_BY(mu) = 0;
    std::optional<bool> finished VIGIL_GUARDED_BY(mu);  // the primary's Finished(streams_done)
    std::string finish_reason VIGIL_GUARDED_BY(mu);     // … and its reason (a step-down's)
  };
  auto shared = std::make_shared<Shared>();
  // The mirrored states go to the state_dir off the channel's reader thread (mirrored_ledger_writer.h): a slow
  // disk must not hold the heartbeat answers queued behind a state. Declared before every channel: it outlives them.
  MirroredLedgerWriter writer(store.get(), [on_mirrored](const std::vector<StreamRecord>& records, const Status& saved) {
    if (!saved.ok()) {
      spdlog::error("replication: cannot keep the primary's ledger: {}", std::string(saved.message()));
    } else if (on_mirrored) {
      on_mirrored(records);
    }
  });
  bool warned = false;
  for (;;) {
    if (stop.load()) return absl::CancelledError("stopped before a takeover");
    replication::StandbyChannelOptions so = StandbyOptionsOf(config, digest);
    so.on_heartbeat = [shared](int64_t at) {
      MutexLock lock(shared->mu);
      if (shared->detector) shared->detector->Heartbeat(at);
      shared->last_contact = std::max(shared->last_contact, at);
    };
    so.on_end = [shared](const Status& why) {
      {
        MutexLock lock(shared->mu);
        shared->ended = true;
        shared->why = why;
        shared->last_contact = std::max(shared->last_contact, SteadyNs());
      }
      shared->cv.NotifyAll();
    };
    so.on_finished = [shared](bool streams_done, const std::string& reason) {
      {
        MutexLock lock(shared->mu);
        shared->finished = streams_done;
        shared->finish_reason = reason;
        shared->last_contact = std::max(shared->last_contact, SteadyNs());  // the primary spoke: the takeover
                                                                           // is timed from its word
      }
      shared->cv.NotifyAll();
    };
    so.on_frame = on_frame;
    so.on_result = on_result;
    so.on_ledger = [shared, &writer](const std::vector<replication::MirroredStream>& streams) {
      writer.Offer(FromMirrored(streams));  // saved on the writer's thread: this one goes on reading heartbeats
      MutexLock lock(shared->mu);
      ++shared->ledger_states;
    };
    {
      MutexLock lock(shared->mu);
      shared->detector.emplace(fo, SteadyNs());
      shared->last_contact = SteadyNs();
    }
    StatusOr<std::unique_ptr<replication::StandbyChannel>> ch =
        replication::StandbyChannel::Pair(std::move(so), milliseconds(std::max(1000, 4 * rc.heartbeat_ms)));
    if (!ch.ok()) {
      if (absl::IsFailedPrecondition(ch.status()) || absl::IsNotFound(ch.status()) ||
          absl::IsInvalidArgument(ch.status())) {
        return ch.status();  // refused (another model, streams or rules), or this side's own configuration
      }
      if (!warned) {
        spdlog::warn("replication: standby '{}' waiting for its primary: {}", rc.node, std::string(ch.status().message()));
        warned = true;
      }
      std::this_thread::sleep_for(milliseconds(200));
      continue;
    }
    spdlog::info("replication: standby '{}' of edge '{}' paired with primary '{}'; mirroring its ledger into {}; "
                 "heartbeats every {} ms {}",
                 rc.node, config.edge, (*ch)->primary_node(), store->where(), rc.heartbeat_ms,
                 (*ch)->heartbeats_on_own_connection() ? "on a connection of their own"
                                                       : "on the mirroring stream (no connection of their own)");
    // The same-host picture ring (mirror_via shm), when the primary offers one.
    std::unique_ptr<replication::FrameRing> ring;
    if (rc.mirror_via == ReplicationConfig::MirrorVia::kShm && on_frame && !(*ch)->frames_offer().socket.empty()) {
      replication::FrameRingOptions ro;
      const int ro_slots = MirrorSlotsFor(config);
      ro.socket = (*ch)->frames_offer().socket;
      ro.token = (*ch)->frames_offer().token;
      ro.slots = static_cast<uint32_t>(ro_slots);
      ro.slot_bytes = static_cast<size_t>(rc.mirror_slot_mb) << 20;
      ro.memory = rc.mirror_memory;
      ro.on_frame = on_frame;
      ro.wanted = frame_wanted;
      StatusOr<std::unique_ptr<replication::FrameRing>> r = replication::FrameRing::Connect(std::move(ro), milliseconds(2000));
      if (r.ok()) {
        ring = std::move(*r);
        spdlog::info("replication: standby '{}' gets the primary's pictures raw through its ring ({} slots of {} MiB in "
                     "{} memory, offered over {})",
                     rc.node, ro_slots, rc.mirror_slot_mb, rc.mirror_memory, (*ch)->frames_offer().socket);
      } else {
        spdlog::warn("replication: standby '{}': no picture ring ({}); pictures come over the channel as JPEGs",
                     rc.node, std::string(r.status().message()));
      }
    } else if (rc.mirror_via != ReplicationConfig::MirrorVia::kShm && !(*ch)->frames_offer().socket.empty()) {
      spdlog::info("replication: the primary offers a picture ring; standby '{}' has mirror_via: channel, so pictures "
                   "come over the channel as JPEGs (mirror_via: shm on this node maps the ring)", rc.node);
    } else if (rc.mirror_via == ReplicationConfig::MirrorVia::kShm && on_frame) {
      spdlog::warn("replication: standby '{}': the primary offers no picture ring (its mirror_via is not shm); "
                   "pictures come over the channel as JPEGs", rc.node);
    }
    // Paired: wait for the stream's end or the detector's suspicion.
    Takeover t;
    {
      MutexLock lock(shared->mu);
      shared->detector.emplace(fo, SteadyNs());  // the peer counts as heard now
      int64_t due = 0;  // when this loop meant to run next (its wait's deadline): a later run is a local pause
      for (;;) {
        if (stop.load()) {
          lock.Unlock();
          (*ch)->Stop();
          return absl::CancelledError("stopped before a takeover");
        }
        const int64_t now = SteadyNs();
        if (due > 0) {
          if (const int64_t paused = shared->detector->Checked(due, now); paused > 0) {
            const uint64_t n = shared->detector->local_pauses();
            if (n == 1 || n % 100 == 0) {
              spdlog::warn("replication: standby '{}' was paused {} ms (its check ran late: this host is overloaded); "
                           "the primary is not judged on the silence it could not hear ({} such pause(s) so far)",
                           rc.node, paused / 1'000'000, n);
            }
          }
        }
        if (shared->finished && *shared->finished) {
          lock.Unlock();
          (*ch)->Stop();
          spdlog::info("replication: primary '{}' finished every stream: standby '{}' has nothing to take over",
                       (*ch)->primary_node(), rc.node);
          return absl::CancelledError("the primary finished every stream");
        }
        if (shared->finished) {
          t.reason = shared->finish_reason.empty() ? std::string("the primary was stopped (a switchover)")
                                                   : StrCat("the primary stepped down: ", shared->finish_reason);
          break;
        }
        if (shared->ended) {
          t.reason = StrCat("the replication stream ended (", shared->why.message(), ")");
          break;
        }
        if (shared->detector->Suspect(now)) {
          t.reason = StrCat("no heartbeat answer for ", (now - shared->last_contact) / 1'000'000, " ms (", rc.phi ? "phi" : "fixed",
                            " detector; ", shared->detector->local_pauses(), " local pause(s) of this standby)");
          break;
        }
        const int64_t at = std::min(shared->detector->SuspectAt(now), now + 10'000'000);  // ≤ 10 ms: stop is polled
        due = std::max<int64_t>(at, now + 100'000);
        shared->cv.WaitFor(lock, std::chrono::nanoseconds(due - now));
      }
      t.last_contact_ns = shared->last_contact;
    }
    (*ch)->Stop();
    t.decided_ns = SteadyNs();
    std::string ring_said;
    if (ring) {
      ring->Drain();  // every picture the primary wrote, before the window is taken
      const replication::FrameRingStats rs = ring->stats();
      ring.reset();
      ring_said = StrCat("; its picture ring: ", rs.received, " picture(s) copied, ", rs.unwanted,
                         " released uncopied (stored before they were read), ", rs.rejected, " rejected");
    }
    writer.Flush();  // the edge opens the state_dir next: the last state received is on disk first
    {
      MutexLock lock(shared->mu);
      t.ledger_states = shared->ledger_states;
    }
    spdlog::warn("replication: standby '{}' takes over edge '{}': {}; {} ledger state(s) mirrored{}", rc.node,
                 config.edge, t.reason, t.ledger_states, ring_said);
    return t;  // the store (and the state_dir's lock) go with this scope: the edge opens it next
  }
}

}  // namespace vigil::pipeline
