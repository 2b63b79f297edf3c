// vigil/transport/link.h — one way to reach the aggregator (TCP today; UCX and CUDA IPC later).
//
// A Link carries sessions. Open() connects, sends the Hello and waits for the aggregator's answer; then
// Send() writes messages in the order given and Receive() returns what the aggregator sends back (Acks,
// Rejects, Heartbeat echoes). A Link knows nothing of ordering across sessions, retransmission or which
// link to use: the Courier (courier.h) and the Outbox (outbox.h) above it do that, so switching links
// loses and reorders nothing.
//
// The link stamps every Report it sends with the session's edge id (the Hello's) and epoch (the
// Welcome's). A message whose rows live in device memory (OutboxMessage::device) is sent from there by a
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

  // Connects within `timeout`, sends `hello`, and waits (up to `timeout`) for the Welcome.
  // Errors: Unavailable (cannot connect, the connection broke, no answer in time), PermissionDenied
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
  // The next message from the aggregator (Ack, Reject or Heartbeat), or nullopt when nothing arrived
  // within `timeout`. Errors: Unavailable (the session is lost), InvalidArgument/DataLoss (the aggregator
  // sent something that does not decode, or a message type it may not send: the session is unusable).
  virtual StatusOr<std::optional<Message>> Receive(std::chrono::milliseconds timeout) = 0;
  // Ends the session. Idempotent.
  virtual void Close() = 0;
};

// The TCP link: sessions over connections made by `dialer` (MakeTcpDialer(host, port), or a test's
// fault-injecting one). Protocol frames as protocol.h lays them out.
std::unique_ptr<Link> MakeTcpLink(std::shared_ptr<Dialer> dialer);

}  // namespace vigil::transport
