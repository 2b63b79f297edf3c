// vigil/transport/ucx.h — UCX endpoints as Connections (connection.h), so the framed link and the
// receiver run over UCX unchanged.
//
// Wire: UCP active messages (UCP_FEATURE_AM) on endpoints made by UCX's client-server flow over a
// socket address (ucp_listener_create / ucp_ep_create with UCP_EP_PARAMS_FLAGS_CLIENT_SERVER; UCX's "tcp"
// connection manager carries the handshake), error handling UCP_ERR_HANDLING_MODE_PEER. Write() sends
// its bytes as one or more data messages of at most `max_message_bytes`; the receiving side appends each
// payload to the connection's byte queue and Read() drains it. Message boundaries are not kept (the
// report frames delimit themselves); order is: every data message carries a sequence number and the
// receiver hands bytes to Read() in sequence order. UCX delivers the active messages of one endpoint in
// the order sent over the single-lane tcp/shared-memory transports this was measured on (UcxCounters::
// out_of_order_messages stays 0 in the tests); the numbering keeps the byte stream exact if a transport
// or a rendezvous completion ever does not.
//
// Flow control: each side grants its peer `receive_window_bytes` of data that its Read() has not drained
// yet (small control messages return credit as Read drains), so a peer that stops reading makes Write
// block and fail with DeadlineExceeded, as with TCP, and a receiver's memory per connection stays bounded.
//
// Close: Shutdown() (or the destructor) sends a FIN after the last data message; the peer's Read returns
// what arrived before it, then Unavailable ("peer closed the connection"), and acknowledges it once all
// of it is in memory. The destructor waits up to `linger` for that acknowledgement, then closes the
// endpoint (ucp_ep_close_nbx: flush when the peer acknowledged, UCP_EP_CLOSE_FLAG_FORCE otherwise) and
// releases its memory registration. A peer that dies (process killed, host gone) fails the connection
// through UCX's error handler: Read and Write return Unavailable with UCX's reason; data already received
// is still returned first.
//
// transports(): the UCX transports the endpoint's lanes use, comma-separated, in lane order, as UCX names
// them ("tcp", "sysv,tcp", "rc_mlx5"). TCP under UCX is reported as "tcp": a caller that expected
// shared memory or RDMA should treat a "tcp"-only answer as degraded. UCX 1.13 has no transports field in
// ucp_ep_query, so the names come from parsing ucp_ep_print_info; UCX 1.14+ answers through
// UCP_EP_ATTR_FIELD_TRANSPORTS. Known once the endpoint is connected (after Dial / Accept return).
// Note: UCX 1.13 selects shared memory (posix/sysv) under peer error handling only with
// UCX_MM_ERROR_HANDLING=y (openucx/ucx#8477); `shared_memory_error_handling` sets it, otherwise two
// processes on one host talk over tcp loopback.
//
// Rows from device memory (Connection::WriteReport): a Report's detection rows travel as the data of their
// own active message, sent from where they live (UCS_MEMORY_TYPE_CUDA for GPU memory, so UCX's cuda_copy /
// cuda_ipc / GPUDirect RDMA transports move them without a host copy on our side), with the Report frame
// encoded without rows in the message's header. The receiver puts them — by rendezvous into GPU memory
// when `receive_device` is set, then one copy to the host for storage — back into one ordinary Report
// frame after ValidateReport, so the receiver above sees the same byte stream as from any link; rows that
// fail the check fail the connection with DataLoss (counted, nothing of them stored). takes_rows_from(d) is
// true for d = -1 (host rows) and, for a GPU, when the UCX library loaded has CUDA transports (Debian's
// 1.13 has none; PyPI libucx-cu13 has, selected with LD_LIBRARY_PATH: docs/architecture.md).
//
// Threading: one UCP worker per dialed connection and one per listener (shared by its accepted
// connections), each driven by its own progress thread that makes every UCP call; Read/Write/Shutdown
// post commands to it (ucp_worker_signal) and wait on condition variables. An idle worker sleeps in
// poll(2) on ucp_worker_get_efd after ucp_worker_arm, costing no CPU. Connection thread-safety is
// connection.h's: one thread may Read while another Writes; Shutdown from any thread.
// Ownership: a Connection owns its endpoint and registration; an accepted Connection shares its
// listener's worker, which lives until the listener and all its connections are gone.
//
// Without UCX (built with VIGIL_WITH_UCX=OFF or without Debian libucx-dev; VIGIL_HAVE_UCX undefined) the
// functions below exist and fail with Unimplemented, so a config that names "ucx" fails with that error.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"

namespace vigil::transport {

struct UcxOptions {
  // UCX transports to consider (UCX_TLS for this context): "" = UCX's default (the UCX_TLS environment
  // variable, else all). E.g. "tcp", "sm,tcp", "rc,sm,tcp". The socket-address connection establishment
  // uses UCX's tcp connection manager whatever this says. Default: "".
  std::string tls;
  // A Write is split into active messages of at most this many bytes; also the size of each send
  // buffer. Messages above UCX's rendezvous threshold (8 KiB over tcp) go by rendezvous. ≥ 1.
  // Default: 256 KiB.
  size_t max_message_bytes = 256 << 10;
  // Send buffers per connection, registered once with ucp_mem_map and reused for every message (sent
  // with UCP_OP_ATTR_FIELD_MEMH); a Write waits for a free one. ≥ 1. Default: 4.
  int send_buffers = 4;
  // Bytes the peer may send that this side's Read has not drained yet (flow control). ≥ 1.
  // Default: 4 MiB.
  size_t receive_window_bytes = 4 << 20;
  // Sets UCX_MM_ERROR_HANDLING=y, so UCX may use posix/sysv shared memory under peer error handling (UCX
  // 1.13 otherwise uses tcp between processes of one host). Both sides should agree. Default: true.
  bool shared_memory_error_handling = true;
  // How long a closing connection waits for the peer to confirm it received everything written before
  // the endpoint is closed anyway. Default: 1 s.
  std::chrono::milliseconds linger{1000};
  // Receiving side: detection rows that come by rendezvous (WriteReport) land in this CUDA device's memory
  // and are copied to the host for storage; -1 = straight into host memory. Default: -1.
  int receive_device = -1;
  // UCX_RNDV_THRESH for this context: messages from this many bytes up go by rendezvous (the receiver
  // fetches the data, from GPU memory where the sender's rows live). 0 = UCX's default. Default: 0.
  size_t rendezvous_threshold_bytes = 0;
};

// Dials host:port (IPv4 or IPv6, resolver order) with UCX; target() is "ucx://host:port". Each Dial
// starts its own UCP context, worker and progress thread (tens of milliseconds). Dial errors:
// InvalidArgument (host does not resolve, invalid options), Unavailable (UCX cannot start, refused,
// unreachable, no answer within the timeout), Unimplemented (built without UCX).
// peer() of a dialed connection is the address dialed, "10.0.0.5:7400".
std::unique_ptr<Dialer> MakeUcxDialer(std::string host, uint16_t port, UcxOptions options = {});

// Listens on host:port with UCX (host "" = all IPv4 interfaces; port 0 = any free port, resolved with
// ucp_listener_query). kind() is "ucx". Accept returns a connection once its endpoint is connected (the
// client's first control message arrived); its peer() is the client's "ip:port" from the connection
// request (ucp_conn_request_query). Errors: InvalidArgument (host does not resolve, invalid options),
// Unavailable (UCX cannot start, or cannot listen there: the message names the address and UCX's
// reason), Unimplemented (built without UCX).
StatusOr<std::unique_ptr<Listener>> UcxListen(const std::string& host, uint16_t port, UcxOptions options = {});

// Call once at process start, before any thread runs (it may setenv): the UCX settings a listener needs
// that UCX reads only from the environment. Today UCX_TCP_CM_REUSEADDR=y unless the environment sets it:
// a listener restarted after its process was killed binds its port at once, although the connections the
// killed one closed wait in TIME_WAIT there (a port held by a live listener stays refused). Without it
// such a restart fails for a minute with "Address already in use". No-op without UCX.
void PrepareUcxEnvironment();

// Process-wide counts, for tests and metrics. The first three are live objects: after every Connection,
// Listener and Dialer is gone (and the peers' closes have completed) they return to 0.
struct UcxCounters {
  int64_t workers = 0;        // UCP contexts+workers with their progress threads
  int64_t endpoints = 0;      // ucp_ep_h not yet closed
  int64_t registrations = 0;  // ucp_mem_map'ed send-buffer pools not yet unmapped
  uint64_t rendezvous_messages = 0;   // data messages received through ucp_am_recv_data_nbx
  uint64_t out_of_order_messages = 0; // data messages that arrived before one sent earlier
  int64_t cuda_memory_workers = 0;    // live contexts whose UCX takes CUDA memory (UCS_MEMORY_TYPE_CUDA)
  uint64_t rows_messages_sent = 0;             // WriteReport messages posted
  uint64_t rows_messages_sent_from_device = 0;  // … of them with rows in GPU memory
  uint64_t rows_messages_received = 0;          // rows messages checked and made Report frames
  uint64_t rows_received_into_device = 0;       // … of them received into GPU memory (receive_device)
  uint64_t rows_messages_rejected = 0;          // malformed, or rows that fail ValidateReport
};
UcxCounters GetUcxCounters();

}  // namespace vigil::transport
