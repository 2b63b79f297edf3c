// vigil/transport/cuda_ipc.h — the cuda_ipc link: an edge and an aggregator on one host exchange reports
// through a ring of result slots in the aggregator's GPU memory.
//
// Control channel: a Unix-domain socket (unix_socket.h; only processes of this host, peer uid checked with
// SO_PEERCRED) carrying the ordinary protocol (protocol.h): Hello → Challenge → Auth → RingOffer → RingAccept
// → Welcome, then Heartbeats, Acks and Rejects. After a valid Auth — so only an authenticated edge ever
// learns a handle — and before deciding on the Hello, the aggregator offers a ring (RingOffer): `slots`
// slots of `slot_bytes` bytes allocated for this session on
// its GPU (`device: cuda:N`, exported with cudaIpcGetMemHandle; `device: host`: none, for machines without a
// GPU and the CPU tests) and a shared-memory block with the control words and a host mirror of the slots.
// The edge maps both once (cudaIpcOpenMemHandle: same GPU, or another GPU with peer access) and answers
// RingAccept; only then is the session admitted (an edge that cannot use the ring hangs up: no epoch is
// granted and no session of it on another link is superseded). After the Welcome it writes its Reports into slots: the CPU writes a slot's host part (header,
// frames) into the mirror, and a kernel on the edge's own CUDA stream — resident while reports keep coming
// (LinkOptions::ring_linger_us), so no launch per slot — copies it into the GPU ring, copies device rows
// (OutboxMessage::device) into the ring and the mirror, and then, after a system-wide fence, writes the
// slot's sequence word: no host synchronisation per message on the edge. The aggregator's reader
// thread polls the sequence words from the host (spinning 100 µs after traffic, then sleeping in growing
// steps up to 200 µs; socket data wakes it at once), copies each complete slot out of the mirror, checks it
// (slot header, frame magic, length and CRC; for device rows: at most kMaxDetections rows, finite boxes and
// scores, integral class ids below the number of classes the Hello named) before anything of it is used, and
// releases the slot. A slot that fails is counted (`slots_rejected`), logged, and ends the session: nothing of
// it is stored, and the edge re-sends it on its next session. The edge waits for a free slot when all are in
// use (flow control).
//
// Failure: either side's death is seen on the socket (and by heartbeats): the edge unmaps the ring and the
// courier falls back to its next link; the aggregator frees the ring when the session ends (the edge's
// mapping keeps the GPU memory valid until it closes it, so a dying aggregator cannot fault the edge's CUDA
// context). A RingOffer that carries an error (no GPU, allocation failed) or a ring the edge cannot map
// (no such GPU here, no peer access, a container without --ipc=host) fails Link::Open with Unavailable
// naming the reason: the courier uses its next link and probes this one again later.
//
// Thread-safety: as Link and Listener.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/link.h"

namespace vigil::transport {

struct CudaIpcListenOptions {
  std::string path;                  // the Unix socket, e.g. /run/vigil/aggregator.sock
  std::string device = "cuda:0";     // where rings live: "cuda:N" or "host"
  uint32_t slots = 64;               // per session; ≥ 2. Default: 64
  uint32_t slot_bytes = 64 << 10;    // 4 KiB .. 16 MiB − 1; a larger report spans slots. Default: 64 KiB
  std::vector<uid_t> allow_uids;     // empty = this process's uid only
};

// Listens on options.path; Listener::kind() is "cuda_ipc". Errors: as UnixListener::Listen, and
// InvalidArgument (slots, slot_bytes, device spelled wrong). A ring that cannot be allocated is not an
// error here: that session's edge is offered the reason and falls back.
StatusOr<std::unique_ptr<Listener>> CudaIpcListen(CudaIpcListenOptions options);

// The edge's side: the framed protocol over MakeUnixDialer(path), reports through the offered ring.
// `device`: the CUDA device the edge writes from (-1: the ring's own GPU); `key`: as LinkOptions::key;
// `linger_us`: as LinkOptions::ring_linger_us (0: a kernel launch per slot).
std::unique_ptr<Link> MakeCudaIpcLink(std::string path, std::string key, int device = -1, uint32_t linger_us = 200);

// Whether rings can be made on `device` ("host", "cuda:N") in this process: allocates and exports a small
// one and frees it. Errors: as a ring offer's (InvalidArgument, Unimplemented without CUDA, Unavailable:
// no such GPU). The aggregator checks its config with it at start.
Status CheckRingDevice(const std::string& device);

// Process-wide counters (metrics), both sides.
struct CudaIpcCounters {
  // aggregator
  uint64_t rings_offered = 0;        // sessions offered a ring
  uint64_t ring_failures = 0;        // sessions whose ring could not be set up (offered an error)
  uint64_t slots_received = 0;       // slots taken, checked and released
  uint64_t slots_rejected = 0;       // slots that failed a check (the session ended; nothing stored)
  uint64_t device_reports = 0;       // of the slots taken: reports whose rows came from device memory
  uint64_t bytes_received = 0;       // slot bytes copied to the host
  // edge
  uint64_t rings_mapped = 0;         // rings opened
  uint64_t map_failures = 0;         // offers the edge could not map (or that carried an error)
  uint64_t slots_written = 0;        // slots published
  uint64_t device_rows_sent = 0;     // reports sent from device memory without a host copy
  uint64_t slot_waits = 0;           // Sends that found every slot in use and waited
  uint64_t publisher_launches = 0;   // launches of the resident publisher kernel (GPU rings; ≪ slots under load)
};
CudaIpcCounters GetCudaIpcCounters();

// Test hook: the next `n` slots this process publishes get one payload byte flipped after they are
// written (the aggregator must reject and count them).
void CorruptNextRingSlotsForTesting(int n);

}  // namespace vigil::transport
