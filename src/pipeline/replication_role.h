// Internal: an edge's replication role (edge_config.h `replication:`, issue 16) around RunEdge.
//
// Primary: the replication channel (replication/channel.h) listens; every state the ledger persists is
// also published to the paired standby (MirroringStore wraps the state_dir store), and every live picture it
// numbers is mirrored (edge.cc, replication.mirror_frames).
// Standby: pairs with the primary (retrying until it answers; a refusal — another model, streams or rules —
// is an error), keeps the primary's ledger records in its own state_dir, and returns when the primary is
// judged gone: the stream ended (its process died: at once) or its heartbeats stopped (the failure
// detector). RunEdge then runs this process as the edge from those records; the aggregator's new epoch
// fences the old primary if it is still alive.
// Thread-safety: RunStandby blocks its caller; the store's Save runs on the ledger's writer thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/replication/channel.h"
#include "vigil/replication/frame_ring.h"
#include "vigil/replication/pair.h"

namespace vigil::pipeline {

// The pair digest of `config` (PairTextsOf). Errors: ComputePairDigest's, naming the model file.
StatusOr<replication::PairDigest> PairDigestOf(const EdgeConfig& config);

// The primary's channel for `config.replication`; `frames` (not owned, outlives the channel; may be null): the
// picture ring offered to each paired standby with a fresh token. Errors: PrimaryChannel::Start's.
StatusOr<std::unique_ptr<replication::PrimaryChannel>> StartPrimaryChannel(const EdgeConfig& config,
                                                                           const replication::PairDigest& digest,
                                                                           replication::FramePublisher* frames = nullptr);

// The primary's same-host picture ring for `config.replication` (mirror_via shm): its socket at mirror_socket
// or <state_dir>/frames.sock, made absolute. Errors: FramePublisher::Listen's, naming the path.
StatusOr<std::unique_ptr<replication::FramePublisher>> ListenForFrameRing(const EdgeConfig& config);

// `inner` whose every successful Save is also published on `channel` (not owned; outlives the store), under
// `order` (not owned; may be null): the lock under which the edge numbers a live picture and queues it on the
// channel, so that a state counting a mirrored picture goes out after it (channel.h "Frame mirroring").
std::unique_ptr<StateStore> MirroringStore(std::unique_ptr<StateStore> inner, replication::PrimaryChannel* channel,
                                           Mutex* order);

struct Takeover {
  std::string reason;        // why the primary was judged gone
  int64_t last_contact_ns;   // steady clock: the last heartbeat answer or the stream's end
  int64_t decided_ns;        // steady clock: when the standby decided to take over
  uint64_t ledger_states = 0;  // mirrored ledger states received
};

// Whether the peer's channel answers as a primary that would pair with this node (asked once, for about a
// second: a node restarting after its peer took over). Errors: FailedPrecondition when the peer refuses
// (another model, streams or rules; another standby paired), this side's TLS files.
StatusOr<bool> PeerIsPrimary(const EdgeConfig& config, const replication::PairDigest& digest);

// Pairs with the primary, keeps its mirrored ledger in this node's state_dir and waits until the primary is
// judged gone. `on_mirrored` (may be empty) gets every mirrored ledger state after it was saved, on the state
// writer's thread (mirrored_ledger_writer.h; a state replaced by a newer one before it was saved is skipped; a warm
// standby's readers follow the cursors in it); `on_frame` (may be empty) every mirrored live picture, on the
// channel's reader thread, in the order sent (a MirrorWindow keeps them); both must be quick.
// With mirror_via shm and a primary that offers a picture ring, the standby creates and hands it the ring
// (frame_ring.h; on failure, logged, pictures keep coming over the channel): `on_frame` then also gets the ring's
// pictures, on the ring's thread, and at the takeover every picture the primary wrote is read before this
// returns. `on_result` (may be empty) gets every mirrored result (the primary's detections of a processed picture),
// on the channel's reader thread. `frame_wanted` (may be empty): asked by the ring before it copies a picture's
// pixels (FrameRingOptions::wanted: false skips one the aggregator acknowledged meanwhile).
// Errors: FailedPrecondition (the primary refused to pair: the message says what differs), the state_dir's
// errors, Cancelled (`stop` became true before a takeover, or the primary finished every stream: nothing to
// take over). A primary stopped on purpose (Finished without streams_done) is taken over at once.
StatusOr<Takeover> RunStandby(const EdgeConfig& config, const replication::PairDigest& digest,
                              const std::atomic<bool>& stop,
                              std::function<void(const std::vector<StreamRecord>&)> on_mirrored = {},
                              std::function<void(replication::MirroredFrame&&)> on_frame = {},
                              std::function<void(replication::MirroredResult&&)> on_result = {},
                              std::function<bool(const replication::MirroredFrame&)> frame_wanted = {});

}  // namespace vigil::pipeline
