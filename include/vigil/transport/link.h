// vigil/transport/link.h — one way to reach the aggregator: the framed protocol over TCP, TLS or UCX
// connections, or over a Unix socket with reports through a GPU ring (cuda_ipc.h).
//
// A Link carries sessions. Open() connects, runs the authenticated handshake (Hello, Challenge, Auth:
// auth.h; cuda_ipc then maps the offered ring and answers RingAccept) and waits for the aggregator's answer; then
// Send() writes messages in the order given and Receive() returns what the aggregator sends back (Acks,
// Rejects, Heartbeat echoes). A Link knows nothing of ordering across sessions, retransmission or which
// link to use: the Courier (courier.h) and the Outbox (outbox.h) above it do that, so switching links
// loses and reorders nothing.
//
// The link stamps every Report it sends with the session's edge id (the Hello's), epoch (the Welcome's)
// and link_seq (consecutive from 0 per session: the aggregator takes only the next one, protocol.h). A message whose rows live in device memory (OutboxMessage::device) is sent from there by a
// link that can; the TCP link downloads the rows into its own staging buffer.
//
// Thread-safety: Open, then Send from one thread while Receive runs on another; Close from any thread
// at any time (it makes blocked and later Send/Receive calls fail promptly with Unavailable). Open may be
// called again after Close or a failure to start a new session.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

class Link {
 public:
  virtual ~Link() = default;
  // The link's kind as the config names it: "tcp", "ucx", "cuda_ipc", "memory" (tests).
  virtual std::string_view kind() const = 0;
  // What it reaches, for logs: "tcp://agg:7400".
  virtual std::string target() const = 0;
  // What carries the open session underneath (Connection::transports(): for UCX "tcp", "posix,sysv",
  // "rc_mlx5"...); "" when none is open or the link is a plain socket.
  virtual std::string transports() const = 0;

  // Connects within `timeout`, sends `hello` (with a fresh nonce the link draws), answers the Challenge
  // (cuda_ipc: maps the ring offered next; a ring it cannot map fails with Unavailable, nothing granted) and
  // waits (up to `timeout` in all) for the Welcome.
  // Errors: Unavailable (cannot connect, the connection broke, no answer in time), Unauthenticated (the
  // aggregator refused our proof — wrong or missing key —, or could not prove it knows our key: a
  // man in the middle or a misconfigured aggregator; the message says which), PermissionDenied
  // (Reject kFenced: another instance holds a newer epoch; the message says so), FailedPrecondition
  // (any other Reject of the Hello: version, protocol; the message quotes the aggregator), InvalidArgument
  // (`hello` fails ValidateHello; nothing is sent).
  virtual StatusOr<Welcome> Open(const Hello& hello, std::chrono::milliseconds timeout) = 0;
  // Sends `messages` in order on the open session, stamped with its edge id and epoch.
  // Errors: Unavailable / DeadlineExceeded (the session is lost: the caller closes it and opens another),
  // Internal (a device payload failed to download, or its rows fail ValidateReportFields; the message names the
  // message id; nothing of this call was sent and the session is still usable).
  virtual Status Send(std::span<const OutboxMessage* const> messages, std::chrono::milliseconds timeout) = 0;
  virtual Status SendHeartbeat(int64_t sent_ns, std::chrono::milliseconds timeout) = 0;
  // Sends one message outside the outbox — a Snapshot or SourceStates — on the open session (cuda_ipc: on its
  // Unix socket, not through the ring). From the thread that calls Send. REQUIRES: `m` is one of those and valid
  // (ValidateSnapshot / ValidateSourceStates). Errors: as Send's Unavailable / DeadlineExceeded (the session is lost).
  virtual Status SendAside(const Message& m, std::chrono::milliseconds timeout) = 0;
  // The next message from the aggregator (Ack, Reject or Heartbeat), or nullopt when nothing arrived
  // within `timeout`. Errors: Unavailable (the session is lost), InvalidArgument/DataLoss (the aggregator
  // sent something that does not decode, or a message type it may not send: the session is unusable).
  virtual StatusOr<std::optional<Message>> Receive(std::chrono::milliseconds timeout) = 0;
  // Ends the session. Idempotent.
  virtual void Close() = 0;
};

struct LinkOptions {
  std::string kind = "tcp";  // kind(): "tcp" (TLS or not), "ucx", "cuda_ipc" (a ring offered before the Welcome:
                             // cuda_ipc.h; use MakeCudaIpcLink)
  // The edge's pre-shared key (raw bytes, auth.h). With a key, the aggregator must prove it knows it
  // (a Challenge without a valid proof fails Open with Unauthenticated); without one, Auth carries no
  // proof and only an aggregator running without authentication admits the edge.
  std::string key;
  // cuda_ipc: the CUDA device the edge writes ring slots from; -1 = the ring's own GPU.
  int ring_device = -1;
  // cuda_ipc on a GPU ring: how long (µs) the edge's resident publisher kernel keeps polling for the next
  // slot after its last (no kernel launch per slot while reports keep coming; one block of one SM; a CUDA
  // call of the edge that synchronises the whole device waits up to this long after the last report).
  // 0: one kernel launch per slot. Default: 200.
  uint32_t ring_linger_us = 200;
};

// The framed link: protocol frames (protocol.h) over connections made by `dialer` — MakeTcpDialer,
// MakeTlsDialer (tls.h), MakeUcxDialer (ucx.h), or a test's fault-injecting one.
std::unique_ptr<Link> MakeFramedLink(std::shared_ptr<Dialer> dialer, LinkOptions options);
inline std::unique_ptr<Link> MakeTcpLink(std::shared_ptr<Dialer> dialer, std::string key = {}) {
  return MakeFramedLink(std::move(dialer), LinkOptions{"tcp", std::move(key)});
}

}  // namespace vigil::transport
