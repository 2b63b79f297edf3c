// Internal to src/transport: the UCX link's parts (ucx.h), shared by its files:
//   ucx.cc            the address/wire-up helpers (options, transports, shared memory), the counters,
//                     PrepareUcxEnvironment and GetUcxCounters;
//   ucx_worker.cc     Worker: the UCP context and worker, its progress thread, endpoints' creation and close;
//   ucx_messages.cc   Worker: what the progress thread sends and receives (data, control, rows, rendezvous);
//   ucx_listener.cc   the listener/accept side (Worker::Listen, UcxListen, the Listener);
//   ucx_connection.cc the user's side: the Connection (Read, Write, WriteReport, Shutdown) and the Dialer.
//
// Layout: a Worker owns a UCP context, a UCP worker and the progress thread that makes every UCP call
// (UCP workers are not thread-safe in UCS_THREAD_MODE_SINGLE). A ConnState is one endpoint's state,
// shared by the progress thread (UCX callbacks) and the user threads (Read/Write) under its mutex. A
// UcxConnection is the user's handle: it keeps its Worker and ConnState alive.
//
// Wire format, all in active messages sent with UCP_AM_SEND_FLAG_REPLY (so the receiver learns the
// endpoint): kDataAm carries a DataHeader (sequence number) and up to max_message_bytes of the byte
// stream; kControlAm carries a ControlHeader only: kHello (our receive window; the first message each side
// sends: receiving it means the endpoint is connected), kCredit (bytes our Read drained so far),
// kFin (number of data messages we sent: no more follow), kFinAck (all of them are in memory here);
// kRowsAm (WriteReport) carries a RowsHeader (the same sequence numbers as kDataAm) followed by a Report
// frame encoded without rows in its header, and the detection rows as its data, sent from where they live
// (UCS_MEMORY_TYPE_CUDA for GPU memory: UCX's CUDA transports move them); the receiver checks the rows and
// puts one ordinary Report frame into the byte stream in their place.
//
// Thread-safety: as stated per member below; a Worker's UCP calls are all made by its progress thread.
// Ownership: a Worker owns its UCP context, worker, listener and progress thread, and every ConnState while
// the state is in its endpoint table; a UcxConnection (ucx_connection.cc) keeps its Worker and ConnState alive.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vigil/common/deadline.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/device_memory.h"
#include "vigil/transport/protocol.h"
#include "vigil/transport/ucx.h"

namespace vigil::transport::ucx {

using std::chrono::milliseconds;

inline constexpr unsigned kDataAm = 1;
inline constexpr unsigned kControlAm = 2;
inline constexpr unsigned kRowsAm = 3;
inline constexpr uint32_t kWireVersion = 2;  // 2: kRowsAm
// How long a destructor waits for ucp_ep_close_nbx to complete, and a stopping worker for its endpoints.
inline constexpr milliseconds kCloseTimeout{2000};
// UCX reports a refused or unreachable client-server connection as "Endpoint is not connected".
inline constexpr std::string_view kNotConnected = "cannot connect (nobody listening there, or unreachable)";

// The counters GetUcxCounters reads (ucx.cc), updated from any thread.
extern std::atomic<int64_t> g_workers;
extern std::atomic<int64_t> g_endpoints;
extern std::atomic<int64_t> g_registrations;
extern std::atomic<uint64_t> g_rendezvous;
extern std::atomic<uint64_t> g_out_of_order;
extern std::atomic<int64_t> g_cuda_workers;
extern std::atomic<uint64_t> g_rows_sent, g_rows_sent_from_device, g_rows_received, g_rows_into_device,
    g_rows_rejected;

enum class ControlType : uint32_t { kHello = 1, kCredit = 2, kFin = 3, kFinAck = 4 };

struct DataHeader {
  uint64_t seq;
};
struct ControlHeader {
  uint32_t type;
  uint32_t version;
  uint64_t value;
};
struct RowsHeader {
  uint64_t seq;          // in the data messages' sequence
  uint32_t rows;         // detection rows in the message's data (24 bytes each)
  uint32_t frame_bytes;  // the Report frame without rows that follows this header
};
inline constexpr size_t kRowBytes = sizeof(ReportDetection);

// Address/wire-up helpers (ucx.cc). Thread-safe.
std::string UcsError(ucs_status_t st);
// The length of the address in `ss` (IPv4 or IPv6).
socklen_t SockaddrLen(const sockaddr_storage& ss);
// OK, or InvalidArgument naming the option out of range (or receive_device in a build without CUDA).
Status ValidateOptions(const UcxOptions& o);
// The transport names of the endpoint's lanes, in lane order, without repeats ("tcp", "sysv,tcp").
// Progress thread (it queries the endpoint).
std::string EndpointTransports(ucp_ep_h ep);
// Whether UCX may pick a posix/sysv transport under `tls` (else UCX_TLS from the environment, else all).
bool MayUseSharedMemory(std::string tls);

class Worker;
struct ConnState;

// One pre-registered send buffer. `header` lives here because UCX 1.13 reads an AM header until the send
// completes (UCP_AM_SEND_FLAG_COPY_HEADER arrived in 1.14).
struct SendSlot {
  ConnState* conn = nullptr;
  char* data = nullptr;
  size_t len = 0;
  DataHeader header{};
  size_t index = 0;  // in conn->slots; conn->slot_busy[index] says whether UCX has it
};

// A received data message (or one whose rendezvous data is still coming).
struct Chunk {
  std::unique_ptr<char[]> bytes;
  size_t size = 0;
  size_t offset = 0;   // drained by Read
  bool ready = false;  // the bytes are all here
  size_t wire = 0;     // bytes the sender counted against our window (credited once drained)
  // A rows message (kRowsAm): until it is ready, `bytes` holds the rows and `frame` the Report frame without
  // them; ready, `bytes` is the whole Report frame.
  bool is_rows = false;
  uint32_t rows = 0;
  std::string frame;
  std::unique_ptr<device_memory::Buffer> device;  // rendezvous into GPU memory (UcxOptions::receive_device)
};

struct ConnState {
  ConnState(Worker* w, std::string peer_address, const UcxOptions& o)
      : worker(w), peer(std::move(peer_address)), options(o) {}
  ~ConnState() { std::free(buffers); }

  Worker* const worker;  // outlives the state while the state is in the worker's table
  const std::string peer;
  const UcxOptions options;

  // Progress thread only:
  ucp_ep_h ep = nullptr;
  ucp_mem_h memh = nullptr;
  bool close_started = false;
  bool close_done = false;
  int inflight = 0;             // UCX requests that point into this state (sends, receives, close)
  bool awaiting_accept = false; // accepted by the listener, not yet connected (no Hello yet)
  bool fin_ack_sent = false;
  bool transports_known = false;
  std::vector<std::unique_ptr<device_memory::Buffer>> free_row_buffers;  // receive_device buffers to reuse

  // Written before the state is shared, then only read:
  char* buffers = nullptr;  // send_buffers × max_message_bytes, registered as `memh`
  std::vector<SendSlot> slots;

  mutable Mutex mu;
  CondVar cv;  // any change below: Read, Write, Dial and close wait on it
  Status failure VIGIL_GUARDED_BY(mu);  // why the endpoint failed; OK while it works
  bool shut VIGIL_GUARDED_BY(mu) = false;       // Shutdown called
  bool connected VIGIL_GUARDED_BY(mu) = false;  // the peer's Hello arrived
  bool closed VIGIL_GUARDED_BY(mu) = false;     // endpoint closed and registration released
  std::string transports VIGIL_GUARDED_BY(mu);
  // Sending side.
  std::vector<bool> slot_busy VIGIL_GUARDED_BY(mu);  // per slot: handed to UCX (or about to be)
  uint64_t next_send_seq VIGIL_GUARDED_BY(mu) = 0;
  uint64_t sent_bytes VIGIL_GUARDED_BY(mu) = 0;
  uint64_t peer_window VIGIL_GUARDED_BY(mu) = 0;    // from the peer's Hello
  uint64_t peer_consumed VIGIL_GUARDED_BY(mu) = 0;  // from the peer's latest Credit
  bool fin_sent VIGIL_GUARDED_BY(mu) = false;
  bool fin_acked VIGIL_GUARDED_BY(mu) = false;
  // Receiving side.
  std::map<uint64_t, Chunk> rx VIGIL_GUARDED_BY(mu);  // by sequence number; erased once drained
  uint64_t next_read_seq VIGIL_GUARDED_BY(mu) = 0;
  uint64_t next_arrival_seq VIGIL_GUARDED_BY(mu) = 0;   // one past the highest sequence number arrived
  uint64_t consumed VIGIL_GUARDED_BY(mu) = 0;           // bytes drained by Read
  uint64_t consumed_reported VIGIL_GUARDED_BY(mu) = 0;  // the last Credit sent
  bool peer_fin VIGIL_GUARDED_BY(mu) = false;
  uint64_t peer_fin_count VIGIL_GUARDED_BY(mu) = 0;  // data messages the peer sent in all

  // Records the first failure and wakes every waiter.
  void FailLocked(Status why) VIGIL_REQUIRES(mu) {
    if (failure.ok()) failure = std::move(why);
    cv.NotifyAll();
  }
  // Every data message the peer sent before its FIN is here, in memory.
  bool AllBeforeFinArrivedLocked() const VIGIL_REQUIRES(mu) {
    if (!peer_fin) return false;
    uint64_t seq = next_read_seq;
    for (auto it = rx.lower_bound(seq); seq < peer_fin_count; ++seq, ++it) {
      if (it == rx.end() || it->first != seq || !it->second.ready) return false;
    }
    return true;
  }
};

// Where a listener's connected endpoints wait for Accept.
struct AcceptQueue {
  Mutex mu;
  CondVar cv;
  std::deque<std::shared_ptr<ConnState>> ready VIGIL_GUARDED_BY(mu);
};

// A UCP context + worker and the thread that makes every UCP call on them.
class Worker {
 public:
  // Starts the progress thread, which creates the context and worker. Errors: Unavailable.
  static StatusOr<std::shared_ptr<Worker>> Start(const UcxOptions& options);
  // Stops the progress thread: the listener goes, every endpoint is closed (FORCE), waiting up to
  // kCloseTimeout for them. Not from the progress thread.
  ~Worker();

  // Runs `fn` on the progress thread (never call from it). Any thread.
  void Post(std::function<void()> fn) VIGIL_EXCLUDES(mu_);

  // Runs `fn` on the progress thread and waits for its result. Not from the progress thread.
  template <typename T>
  T Call(std::function<T()> fn) {
    auto done = std::make_shared<std::promise<T>>();
    std::future<T> result = done->get_future();
    Post([done, &fn] { done->set_value(fn()); });
    return result.get();
  }

  // Progress thread: connects `conn` to `addr` (client side) and sends the Hello.
  Status Connect(const std::shared_ptr<ConnState>& conn, const sockaddr_storage& addr);

  // Progress thread: listens on `addr`; connected endpoints go to `queue`. Returns the bound address
  // (ucx_listener.cc).
  StatusOr<sockaddr_storage> Listen(const sockaddr_storage& addr, std::shared_ptr<AcceptQueue> queue);

  // Progress thread: stops accepting; endpoints not yet handed to Accept are closed (ucx_listener.cc).
  void StopListening();

  // Progress thread: starts closing the endpoint (once). The state is released (registration unmapped,
  // `closed` set) when the close and every request pointing into it have completed.
  void BeginClose(const std::shared_ptr<ConnState>& conn, bool force);

  // Progress thread: sends a control message (header only) (ucx_messages.cc).
  void SendControl(ConnState* conn, ControlType type, uint64_t value);

  // Progress thread: sends the data in `slot` (filled by Write) (ucx_messages.cc).
  void SendData(SendSlot* slot);

  ucp_context_h context() const { return context_; }
  // Set before Start returns, constant afterwards: any thread.
  bool cuda_memory() const { return cuda_memory_; }
  size_t max_am_header() const { return max_am_header_; }

  // Progress thread: sends a rows message (WriteReport).
  struct PendingRows {
    ConnState* conn = nullptr;
    std::string header;  // RowsHeader + the frame; UCX 1.13 reads a header until the send completes
    const void* rows = nullptr;
    size_t row_bytes = 0;
    int device = -1;
    std::shared_ptr<const void> keepalive;
  };
  void SendRows(std::shared_ptr<PendingRows> m);

 private:
  explicit Worker(const UcxOptions& options) : options_(options) {}

  // ucx_worker.cc: the progress thread (init, loop, cleanup) and the endpoints' lifecycle.
  void Run(std::promise<Status>* started);
  Status Init();
  void Cleanup();
  void Loop();
  void RunCommands();
  // Work that UCX callbacks leave for after ucp_worker_progress returns (no UCP calls inside them).
  void RunDeferred();
  // Releases the states whose close finished and that no UCX request points into.
  void Sweep();
  // Unregisters the send buffers and marks the state closed.
  void Release(ConnState* c);
  // Allocates and registers the connection's send buffers (once: every message reuses them).
  Status Register(ConnState* conn);
  // Creates the endpoint (its send buffers registered) and sends our Hello.
  Status CreateEndpoint(const std::shared_ptr<ConnState>& conn, ucp_ep_params_t* p);
  // The peer's endpoint failed or went away: fail the connection now, close the endpoint after progress
  // returns (UCX asks for ucp_ep_close_nbx, FORCE, on an endpoint in error).
  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t st);

  // ucx_listener.cc: a client's connection request.
  static void OnConnRequest(ucp_conn_request_h request, void* arg);

  // ucx_messages.cc: the active messages' handlers and what they leave for after progress returns.
  // The connection of the message's reply endpoint, or null (unknown, or closing).
  ConnState* Find(const ucp_am_recv_param_t* param);
  // Progress thread: a UCX request of `conn` finished with `st`.
  static void Completed(ConnState* conn, ucs_status_t st, std::string_view what);
  static void DataSent(SendSlot* slot, ucs_status_t st);
  static ucs_status_t OnControlAm(void* arg, const void* header, size_t header_length, void*, size_t,
                                  const ucp_am_recv_param_t* param);
  // Caches the endpoint's transports once its lanes are known (a client endpoint shows only its
  // connection-manager lane until the wireup completes).
  static void UpdateTransports(ConnState* conn);
  // Progress thread. Acknowledges the peer's FIN once everything before it is in memory (then the peer may
  // close: nothing is still to be fetched from it).
  void MaybeAckFinLocked(ConnState* conn) VIGIL_REQUIRES(conn->mu);
  // The chunk for data message `seq` (either kind), or null when it arrived before (the connection then
  // fails).
  static Chunk* NewChunkLocked(ConnState* conn, uint64_t seq) VIGIL_REQUIRES(conn->mu);
  static ucs_status_t OnDataAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  static ucs_status_t OnRowsAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  // Progress thread. The rows of chunk `seq` are in c.bytes (host): checks them and makes the chunk one Report
  // frame (ready), or fails the connection (nothing of it is read).
  void FinishRowsLocked(ConnState* conn, uint64_t seq, Chunk& c) VIGIL_REQUIRES(conn->mu);
  // Progress thread: fetches a rendezvous message's data into its chunk (rows into GPU memory when
  // receive_device is set).
  void ReceiveRendezvous(const std::shared_ptr<ConnState>& conn, uint64_t seq, void* desc);
  void RendezvousDone(ConnState* conn, uint64_t seq, ucs_status_t st);

  const UcxOptions options_;
  std::thread thread_;
  Mutex mu_;
  std::vector<std::function<void()>> commands_ VIGIL_GUARDED_BY(mu_);
  bool destroyed_ VIGIL_GUARDED_BY(mu_) = false;  // the UCP worker is gone
  // Progress thread only (set up before the thread reports it started, torn down after its loop):
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  ucp_listener_h listener_ = nullptr;
  std::shared_ptr<AcceptQueue> accept_queue_;
  std::unordered_map<ucp_ep_h, std::shared_ptr<ConnState>> eps_;  // every endpoint until released
  std::vector<std::shared_ptr<ConnState>> closing_;                // closing, not yet released
  std::vector<std::function<void()>> deferred_;
  bool stopping_ = false;
  Deadline stop_deadline_ = Deadline::Never();
  bool cuda_memory_ = false;  // the context takes UCS_MEMORY_TYPE_CUDA (and this build has CUDA)
  size_t max_am_header_ = 0;  // ucp_worker_query: the largest active-message header
  int current_device_ = -2;   // the CUDA device made current on the progress thread (-2: none yet)
};

// The user's handle on a connected endpoint (ucx_connection.cc): keeps `worker` and `conn` alive.
std::unique_ptr<Connection> MakeConnection(std::shared_ptr<Worker> worker, std::shared_ptr<ConnState> conn);

}  // namespace vigil::transport::ucx
