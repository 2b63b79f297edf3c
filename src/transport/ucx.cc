// UCX implementation of connection.h (ucx.h): UCP active messages over client-server endpoints.
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
#include "vigil/transport/ucx.h"

#include "vigil/transport/device_memory.h"
#include "sockaddr.h"
#include "vigil/common/mutex.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <thread>
#include <unordered_map>
#include <vector>

namespace vigil::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using net::AddrInfoPtr;
using net::FormatAddress;
using net::Resolve;

constexpr unsigned kDataAm = 1;
constexpr unsigned kControlAm = 2;
constexpr unsigned kRowsAm = 3;
constexpr uint32_t kWireVersion = 2;  // 2: kRowsAm
// How long a destructor waits for ucp_ep_close_nbx to complete, and a stopping worker for its endpoints.
constexpr milliseconds kCloseTimeout{2000};
// UCX reports a refused or unreachable client-server connection as "Endpoint is not connected".
constexpr std::string_view kNotConnected = "cannot connect (nobody listening there, or unreachable)";

std::atomic<int64_t> g_workers{0};
std::atomic<int64_t> g_endpoints{0};
std::atomic<int64_t> g_registrations{0};
std::atomic<uint64_t> g_rendezvous{0};
std::atomic<uint64_t> g_out_of_order{0};
std::atomic<int64_t> g_cuda_workers{0};
std::atomic<uint64_t> g_rows_sent{0}, g_rows_sent_from_device{0}, g_rows_received{0}, g_rows_into_device{0},
    g_rows_rejected{0};

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
constexpr size_t kRowBytes = sizeof(ReportDetection);

std::string UcsError(ucs_status_t st) { return ucs_status_string(st); }


socklen_t SockaddrLen(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}


Status ValidateOptions(const UcxOptions& o) {
  if (o.max_message_bytes == 0 || o.send_buffers < 1 || o.receive_window_bytes == 0) {
    return absl::InvalidArgumentError(StrCat("UcxOptions: max_message_bytes (", o.max_message_bytes,
                                             "), send_buffers (", o.send_buffers, ") and receive_window_bytes (",
                                             o.receive_window_bytes, ") must be at least 1"));
  }
  if (o.receive_device >= 0 && !device_memory::Available()) {
    return absl::InvalidArgumentError(StrCat("UcxOptions: receive_device cuda:", o.receive_device,
                                             ": this vigil was built without CUDA (use -1, host memory)"));
  }
  return absl::OkStatus();
}

// The transport names of the endpoint's lanes, in lane order, without repeats ("tcp", "sysv,tcp").
std::string EndpointTransports(ucp_ep_h ep) {
  std::vector<std::string> names;
  auto add = [&names](std::string name) {
    if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  };
#if UCP_API_VERSION >= UCP_VERSION(1, 14)
  ucp_transport_entry_t entries[32];
  ucp_ep_attr_t attr{};
  attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
  attr.transports.entries = entries;
  attr.transports.num_entries = 32;
  attr.transports.entry_size = sizeof(ucp_transport_entry_t);
  if (ucp_ep_query(ep, &attr) == UCS_OK) {
    for (unsigned i = 0; i < attr.transports.num_entries; ++i) {
      if (entries[i].transport_name != nullptr) add(entries[i].transport_name);
    }
  }
#else
  // UCX 1.13: parse ucp_ep_print_info. A connected endpoint over loopback prints, e.g.,
  //   #                 lane[0]: cm rdmacm
  //   #                 lane[1]:  1:tcp/lo.0 md[0]   -> md[0]/tcp/sysdev[255] rma_bw#0 am am_bw#0 wireup
  //   #                 lane[2]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive
  // Lane "cm" is the connection manager (its name is printed from a priority list, not the CM in use);
  // every other lane reads "<resource index>:<transport>/<device>.<path index>".
  char* text = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&text, &size);
  if (f == nullptr) return {};
  ucp_ep_print_info(ep, f);
  ::fclose(f);
  std::string_view rest(text, size);
  for (size_t pos; (pos = rest.find("lane[")) != std::string_view::npos;) {
    rest.remove_prefix(pos);
    std::string_view line = rest.substr(0, rest.find('\n'));
    rest.remove_prefix(line.size());
    const size_t colon = line.find("]:");
    if (colon == std::string_view::npos) continue;
    std::string_view res = line.substr(colon + 2);
    res.remove_prefix(std::min(res.size(), res.find_first_not_of(' ')));
    res = res.substr(0, res.find(' '));  // "1:tcp/lo.0", or "cm"
    const size_t idx = res.find(':'), slash = res.find('/');
    if (idx == std::string_view::npos || slash == std::string_view::npos || slash < idx) continue;
    add(std::string(res.substr(idx + 1, slash - idx - 1)));
  }
  ::free(text);
#endif
  std::string out;
  for (const std::string& n : names) out += out.empty() ? n : "," + n;
  return out;
}

// Whether UCX may pick a posix/sysv transport under `tls` (else UCX_TLS from the environment, else all).
bool MayUseSharedMemory(std::string tls) {
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env != nullptr ? env : "all";
  }
  if (tls.starts_with('^')) return true;  // an exclusion list
  for (const char* name : {"all", "sm", "shm", "mm", "posix", "sysv"}) {
    size_t pos = 0;
    while ((pos = tls.find(name, pos)) != std::string::npos) {
      const size_t end = pos + std::strlen(name);
      if ((pos == 0 || tls[pos - 1] == ',') && (end == tls.size() || tls[end] == ',')) return true;
      pos = end;
    }
  }
  return false;
}

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
  static StatusOr<std::shared_ptr<Worker>> Start(const UcxOptions& options) {
    std::shared_ptr<Worker> w(new Worker(options));
    auto started = std::make_shared<std::promise<Status>>();
    std::future<Status> result = started->get_future();
    w->thread_ = std::thread([raw = w.get(), started] { raw->Run(started.get()); });
    Status st = result.get();
    if (!st.ok()) {
      w->thread_.join();  // the thread has cleaned up and ended: ~Worker has nothing to stop
      return st;
    }
    return w;
  }

  ~Worker() {
    if (!thread_.joinable()) return;
    Post([this] {
      stopping_ = true;
      stop_deadline_ = Clock::now() + kCloseTimeout;
      StopListening();
      for (auto& [ep, conn] : eps_) BeginClose(conn, /*force=*/true);
    });
    thread_.join();
  }

  // Runs `fn` on the progress thread (never call from it). Any thread.
  void Post(std::function<void()> fn) VIGIL_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    commands_.push_back(std::move(fn));
    // Documented safe from any thread in any thread mode. Under mu_: the stop command may run and the
    // thread destroy the worker as soon as the command is queued, so Cleanup takes mu_ first.
    if (!destroyed_) ucp_worker_signal(worker_);
  }

  // Runs `fn` on the progress thread and waits for its result. Not from the progress thread.
  template <typename T>
  T Call(std::function<T()> fn) {
    auto done = std::make_shared<std::promise<T>>();
    std::future<T> result = done->get_future();
    Post([done, &fn] { done->set_value(fn()); });
    return result.get();
  }

  // Progress thread: connects `conn` to `addr` (client side) and sends the Hello.
  Status Connect(const std::shared_ptr<ConnState>& conn, const sockaddr_storage& addr) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = SockaddrLen(addr);
    VIGIL_RETURN_IF_ERROR(Register(conn.get()));
    return CreateEndpoint(conn, &p);
  }

  // Progress thread: listens on `addr`; connected endpoints go to `queue`. Returns the bound address.
  StatusOr<sockaddr_storage> Listen(const sockaddr_storage& addr, std::shared_ptr<AcceptQueue> queue) {
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = SockaddrLen(addr);
    p.conn_handler.cb = &Worker::OnConnRequest;
    p.conn_handler.arg = this;
    ucs_status_t st = ucp_listener_create(worker_, &p, &listener_);
    if (st != UCS_OK) {
      listener_ = nullptr;
      // The tcp connection manager reports a bind() that failed with EADDRINUSE as UCS_ERR_BUSY.
      if (st == UCS_ERR_BUSY) return absl::UnavailableError(StrCat("Address already in use (UCX: ", UcsError(st), ")"));
      return absl::UnavailableError(UcsError(st));
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(listener_, &attr);
    if (st != UCS_OK) {
      StopListening();
      return absl::UnavailableError(StrCat("ucp_listener_query: ", UcsError(st)));
    }
    accept_queue_ = std::move(queue);
    return attr.sockaddr;
  }

  // Progress thread: stops accepting; endpoints not yet handed to Accept are closed.
  void StopListening() {
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    accept_queue_.reset();
    for (auto& [ep, conn] : eps_) {
      if (conn->awaiting_accept) BeginClose(conn, /*force=*/true);
    }
  }

  // Progress thread: starts closing the endpoint (once). The state is released (registration unmapped,
  // `closed` set) when the close and every request pointing into it have completed.
  void BeginClose(const std::shared_ptr<ConnState>& conn, bool force) {
    if (conn->ep == nullptr || conn->close_started) return;
    conn->close_started = true;
    conn->awaiting_accept = false;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      auto* c = static_cast<ConnState*>(user_data);
      c->close_done = true;
      --c->inflight;
      ucp_request_free(request);
    };
    p.user_data = conn.get();
    ucs_status_ptr_t r = ucp_ep_close_nbx(conn->ep, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      conn->close_done = true;
    } else {
      ++conn->inflight;
    }
    closing_.push_back(conn);
  }

  // Progress thread: sends a control message (header only).
  void SendControl(ConnState* conn, ControlType type, uint64_t value) {
    if (conn->ep == nullptr || conn->close_started) return;
    struct Pending {
      ConnState* conn;
      ControlHeader header;
    };
    auto* m = new Pending{conn, {static_cast<uint32_t>(type), kWireVersion, value}};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    p.cb.send = [](void* request, ucs_status_t st, void* user_data) {
      auto* pending = static_cast<Pending*>(user_data);
      --pending->conn->inflight;
      Completed(pending->conn, st, "sending a control message");
      delete pending;
      ucp_request_free(request);
    };
    p.user_data = m;
    ucs_status_ptr_t r = ucp_am_send_nbx(conn->ep, kControlAm, &m->header, sizeof m->header, nullptr, 0, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      ++conn->inflight;
      return;
    }
    Completed(conn, UCS_PTR_STATUS(r), "sending a control message");
    delete m;
  }

  // Progress thread: sends the data in `slot` (filled by Write).
  void SendData(SendSlot* slot) {
    ConnState* conn = slot->conn;
    if (conn->ep == nullptr || conn->close_started) {  // the connection is gone; its reader sees why
      MutexLock lock(conn->mu);
      conn->slot_busy[slot->index] = false;
      conn->cv.NotifyAll();
      return;
    }
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    p.memh = conn->memh;  // the pool is registered once: UCX skips registering the buffer per send
    p.cb.send = [](void* request, ucs_status_t st, void* user_data) {
      auto* s = static_cast<SendSlot*>(user_data);
      --s->conn->inflight;
      DataSent(s, st);
      ucp_request_free(request);
    };
    p.user_data = slot;
    ucs_status_ptr_t r =
        ucp_am_send_nbx(conn->ep, kDataAm, &slot->header, sizeof slot->header, slot->data, slot->len, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      ++conn->inflight;
      return;
    }
    DataSent(slot, UCS_PTR_STATUS(r));
  }

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
  void SendRows(std::shared_ptr<PendingRows> m) {
    ConnState* conn = m->conn;
    if (conn->ep == nullptr || conn->close_started) return;  // the connection is gone; its reader sees why
    if (m->device >= 0 && m->device != current_device_) {
      Status st = device_memory::Use(m->device);
      if (!st.ok()) {
        MutexLock lock(conn->mu);
        conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": sending rows: ", st.message())));
        return;
      }
      current_device_ = m->device;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    p.memory_type = m->device >= 0 ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    p.cb.send = [](void* request, ucs_status_t st, void* user_data) {
      auto* pending = static_cast<std::shared_ptr<PendingRows>*>(user_data);
      --(*pending)->conn->inflight;
      Completed((*pending)->conn, st, "sending rows");
      delete pending;
      ucp_request_free(request);
    };
    auto* held = new std::shared_ptr<PendingRows>(m);
    p.user_data = held;
    ucs_status_ptr_t r =
        ucp_am_send_nbx(conn->ep, kRowsAm, m->header.data(), m->header.size(), m->rows, m->row_bytes, &p);
    ++g_rows_sent;
    if (m->device >= 0) ++g_rows_sent_from_device;
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      ++conn->inflight;
      return;
    }
    Completed(conn, UCS_PTR_STATUS(r), "sending rows");
    delete held;
  }

 private:
  explicit Worker(const UcxOptions& options) : options_(options) {}

  // The progress thread: init, loop, cleanup.
  void Run(std::promise<Status>* started) {
    Status st = Init();
    if (!st.ok()) {
      Cleanup();
      started->set_value(st);
      return;
    }
    ++g_workers;
    if (cuda_memory_) ++g_cuda_workers;
    started->set_value(absl::OkStatus());
    Loop();
    Cleanup();
    if (cuda_memory_) --g_cuda_workers;
    --g_workers;
  }

  Status Init() {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return absl::UnavailableError(StrCat("UCX: reading the configuration: ", UcsError(st)));
    if (!options_.tls.empty()) st = ucp_config_modify(config, "TLS", options_.tls.c_str());
    // Best effort: a UCX without this setting (or with it on by default) still works. Only where shared
    // memory may be used: UCX warns "invalid configuration" when no transport reads it.
    if (options_.shared_memory_error_handling && MayUseSharedMemory(options_.tls)) {
      (void)ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
    }
    if (st == UCS_OK && options_.rendezvous_threshold_bytes > 0) {
      st = ucp_config_modify(config, "RNDV_THRESH", std::to_string(options_.rendezvous_threshold_bytes).c_str());
    }
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::UnavailableError(StrCat("UCX: configuration (tls '", options_.tls, "'): ", UcsError(st)));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "vigil";
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) {
      context_ = nullptr;
      return absl::UnavailableError(StrCat("UCX: ucp_init (tls '", options_.tls, "'): ", UcsError(st)));
    }
    ucp_context_attr_t ca{};
    ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(context_, &ca) == UCS_OK) {
      cuda_memory_ = (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0 && device_memory::Available();
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only this thread calls UCP (ucp_worker_signal excepted)
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) {
      worker_ = nullptr;
      return absl::UnavailableError(StrCat("UCX: ucp_worker_create: ", UcsError(st)));
    }
    st = ucp_worker_get_efd(worker_, &efd_);
    if (st != UCS_OK) return absl::UnavailableError(StrCat("UCX: ucp_worker_get_efd: ", UcsError(st)));
    ucp_worker_attr_t wa{};
    wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    if (ucp_worker_query(worker_, &wa) == UCS_OK) max_am_header_ = wa.max_am_header;
    for (unsigned id : {kDataAm, kControlAm, kRowsAm}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.flags = UCP_AM_FLAG_WHOLE_MSG;
      hp.cb = id == kDataAm ? &Worker::OnDataAm : id == kRowsAm ? &Worker::OnRowsAm : &Worker::OnControlAm;
      hp.arg = this;
      st = ucp_worker_set_am_recv_handler(worker_, &hp);
      if (st != UCS_OK) return absl::UnavailableError(StrCat("UCX: ucp_worker_set_am_recv_handler: ", UcsError(st)));
    }
    return absl::OkStatus();
  }

  void Cleanup() {
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    // Endpoints whose close did not finish in time: destroying the worker cancels what is left of them;
    // only then may their send buffers be unregistered.
    std::vector<std::shared_ptr<ConnState>> left;
    for (auto& [ep, conn] : eps_) left.push_back(conn);
    eps_.clear();
    closing_.clear();
    {
      MutexLock lock(mu_);  // no Post is signalling the worker now, and none will
      destroyed_ = true;
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    for (auto& conn : left) Release(conn.get());
    if (context_ != nullptr) ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
  }

  void Loop() {
    for (;;) {
      RunCommands();
      while (ucp_worker_progress(worker_) != 0) RunDeferred();
      RunDeferred();
      Sweep();
      if (stopping_ && (eps_.empty() || Clock::now() > stop_deadline_)) return;
      {
        MutexLock lock(mu_);
        if (!commands_.empty()) continue;
      }
      const ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
      {
        MutexLock lock(mu_);  // a command posted before the arm: its signal may have been drained
        if (!commands_.empty()) continue;
      }
      // Not armed (an interface without events): poll briefly rather than sleep through its events.
      const int wait_ms = st != UCS_OK ? 1 : stopping_ ? 10 : -1;
      pollfd pfd{efd_, POLLIN, 0};
      ::poll(&pfd, 1, wait_ms);  // EINTR: loop anyway
    }
  }

  void RunCommands() {
    std::vector<std::function<void()>> batch;
    {
      MutexLock lock(mu_);
      batch.swap(commands_);
    }
    for (auto& fn : batch) fn();
  }

  // Work that UCX callbacks leave for after ucp_worker_progress returns (no UCP calls inside them).
  void RunDeferred() {
    while (!deferred_.empty()) {
      std::vector<std::function<void()>> batch;
      batch.swap(deferred_);
      for (auto& fn : batch) fn();
    }
  }

  // Releases the states whose close finished and that no UCX request points into.
  void Sweep() {
    for (auto it = closing_.begin(); it != closing_.end();) {
      ConnState* c = it->get();
      if (!c->close_done || c->inflight > 0) {
        ++it;
        continue;
      }
      eps_.erase(c->ep);
      Release(c);
      it = closing_.erase(it);
    }
  }

  // Unregisters the send buffers and marks the state closed.
  void Release(ConnState* c) {
    if (c->memh != nullptr) {
      ucp_mem_unmap(context_, c->memh);
      c->memh = nullptr;
      --g_registrations;
    }
    if (c->ep != nullptr) --g_endpoints;
    c->ep = nullptr;
    MutexLock lock(c->mu);
    c->closed = true;
    c->FailLocked(absl::UnavailableError(StrCat(c->peer, ": connection closed")));
  }

  // Allocates and registers the connection's send buffers (once: every message reuses them).
  Status Register(ConnState* conn) {
    const UcxOptions& o = conn->options;
    const size_t bytes = o.max_message_bytes * static_cast<size_t>(o.send_buffers);
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    conn->buffers = static_cast<char*>(std::aligned_alloc(4096, rounded));
    if (conn->buffers == nullptr) return absl::ResourceExhaustedError(StrCat("cannot allocate ", rounded, " bytes"));
    for (int i = 0; i < o.send_buffers; ++i) {
      SendSlot s;
      s.conn = conn;
      s.data = conn->buffers + static_cast<size_t>(i) * o.max_message_bytes;
      s.index = static_cast<size_t>(i);
      conn->slots.push_back(s);
    }
    {
      MutexLock lock(conn->mu);  // not shared yet: the lock is for the analysis
      conn->slot_busy.assign(conn->slots.size(), false);
    }
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = conn->buffers;
    mp.length = rounded;
    const ucs_status_t st = ucp_mem_map(context_, &mp, &conn->memh);
    if (st != UCS_OK) {
      conn->memh = nullptr;
      return absl::UnavailableError(StrCat("ucp_mem_map of ", rounded, " bytes: ", UcsError(st)));
    }
    ++g_registrations;
    return absl::OkStatus();
  }

  // Creates the endpoint (its send buffers registered) and sends our Hello.
  Status CreateEndpoint(const std::shared_ptr<ConnState>& conn, ucp_ep_params_t* p) {
    p->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p->err_mode = UCP_ERR_HANDLING_MODE_PEER;  // requests fail (and OnEndpointError runs) when the peer dies
    p->err_handler.cb = &Worker::OnEndpointError;
    p->err_handler.arg = conn.get();
    const ucs_status_t st = ucp_ep_create(worker_, p, &conn->ep);
    if (st != UCS_OK) {
      conn->ep = nullptr;
      ucp_mem_unmap(context_, conn->memh);
      conn->memh = nullptr;
      --g_registrations;
      return absl::UnavailableError(StrCat("ucp_ep_create: ", UcsError(st)));
    }
    ++g_endpoints;
    eps_[conn->ep] = conn;
    SendControl(conn.get(), ControlType::kHello, conn->options.receive_window_bytes);
    return absl::OkStatus();
  }

  ConnState* Find(const ucp_am_recv_param_t* param) {
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return nullptr;
    auto it = eps_.find(param->reply_ep);
    return it == eps_.end() || it->second->close_started ? nullptr : it->second.get();
  }

  // Progress thread: a UCX request of `conn` finished with `st`.
  static void Completed(ConnState* conn, ucs_status_t st, std::string_view what) {
    if (st == UCS_OK || st == UCS_ERR_CANCELED) return;
    MutexLock lock(conn->mu);
    conn->FailLocked(
        absl::UnavailableError(StrCat(conn->peer, ": ", conn->connected ? what : kNotConnected, ": ", UcsError(st))));
  }

  static void DataSent(SendSlot* slot, ucs_status_t st) {
    Completed(slot->conn, st, "sending data");
    MutexLock lock(slot->conn->mu);
    slot->conn->slot_busy[slot->index] = false;
    slot->conn->cv.NotifyAll();
  }

  // The peer's endpoint failed or went away: fail the connection now, close the endpoint after progress
  // returns (UCX asks for ucp_ep_close_nbx, FORCE, on an endpoint in error).
  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* conn = static_cast<ConnState*>(arg);
    {
      MutexLock lock(conn->mu);
      conn->FailLocked(absl::UnavailableError(
          StrCat(conn->peer, ": ", conn->connected ? "UCX endpoint error" : kNotConnected, ": ", UcsError(st))));
    }
    Worker* w = conn->worker;
    auto it = w->eps_.find(conn->ep);
    if (it == w->eps_.end()) return;
    std::shared_ptr<ConnState> keep = it->second;
    w->deferred_.push_back([w, keep] { w->BeginClose(keep, /*force=*/true); });
  }

  static void OnConnRequest(ucp_conn_request_h request, void* arg) {
    auto* w = static_cast<Worker*>(arg);
    if (w->listener_ == nullptr) return;
    if (w->stopping_) {
      ucp_listener_reject(w->listener_, request);
      return;
    }
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string peer = "?";
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      peer = FormatAddress(reinterpret_cast<const sockaddr*>(&attr.client_address), SockaddrLen(attr.client_address));
    }
    auto conn = std::make_shared<ConnState>(w, std::move(peer), w->options_);
    conn->awaiting_accept = true;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = request;
    if (!w->Register(conn.get()).ok()) {
      ucp_listener_reject(w->listener_, request);  // the client's error handler fires (UCS_ERR_REJECTED)
      return;
    }
    // A failed ucp_ep_create has consumed the request: the client learns it from its error handler.
    (void)w->CreateEndpoint(conn, &p);
  }

  static ucs_status_t OnControlAm(void* arg, const void* header, size_t header_length, void*, size_t,
                                  const ucp_am_recv_param_t* param) {
    auto* w = static_cast<Worker*>(arg);
    ConnState* conn = w->Find(param);
    if (conn == nullptr || header_length != sizeof(ControlHeader)) return UCS_OK;
    ControlHeader h;
    std::memcpy(&h, header, sizeof h);
    // Known before Dial/Accept return (they wait for `connected`), so transports() answers at once.
    if (static_cast<ControlType>(h.type) == ControlType::kHello) UpdateTransports(conn);
    MutexLock lock(conn->mu);
    if (h.version != kWireVersion) {
      conn->FailLocked(absl::UnavailableError(
          StrCat(conn->peer, ": the peer speaks vigil UCX wire version ", h.version, ", this is ", kWireVersion)));
      return UCS_OK;
    }
    switch (static_cast<ControlType>(h.type)) {
      case ControlType::kHello: {
        conn->peer_window = h.value;
        conn->connected = true;
        conn->cv.NotifyAll();
        lock.Unlock();
        if (conn->awaiting_accept) {
          conn->awaiting_accept = false;
          std::shared_ptr<ConnState> keep = w->eps_[conn->ep];
          if (w->accept_queue_) {
            MutexLock qlock(w->accept_queue_->mu);
            w->accept_queue_->ready.push_back(std::move(keep));
            w->accept_queue_->cv.NotifyAll();
          } else {
            w->deferred_.push_back([w, keep] { w->BeginClose(keep, true); });
          }
        }
        return UCS_OK;  // (conn->mu released)
      }
      case ControlType::kCredit:
        conn->peer_consumed = std::max(conn->peer_consumed, h.value);
        conn->cv.NotifyAll();
        break;
      case ControlType::kFin:
        conn->peer_fin = true;
        conn->peer_fin_count = h.value;
        conn->cv.NotifyAll();
        w->MaybeAckFinLocked(conn);
        break;
      case ControlType::kFinAck:
        conn->fin_acked = true;
        conn->cv.NotifyAll();
        break;
    }
    return UCS_OK;
  }

  // Caches the endpoint's transports once its lanes are known (a client endpoint shows only its
  // connection-manager lane until the wireup completes).
  static void UpdateTransports(ConnState* conn) {
    if (conn->transports_known) return;
    std::string t = EndpointTransports(conn->ep);
    if (t.empty()) return;
    conn->transports_known = true;
    MutexLock lock(conn->mu);
    conn->transports = std::move(t);
  }

  // Progress thread. Acknowledges the peer's FIN once everything before it is in memory (then the peer may
  // close: nothing is still to be fetched from it).
  void MaybeAckFinLocked(ConnState* conn) VIGIL_REQUIRES(conn->mu) {
    if (conn->fin_ack_sent || !conn->AllBeforeFinArrivedLocked()) return;
    conn->fin_ack_sent = true;
    std::shared_ptr<ConnState> keep = eps_[conn->ep];
    deferred_.push_back([this, keep] { SendControl(keep.get(), ControlType::kFinAck, 0); });
  }

  // The chunk for data message `seq` (either kind), or null when it arrived before (the connection then
  // fails).
  static Chunk* NewChunkLocked(ConnState* conn, uint64_t seq) VIGIL_REQUIRES(conn->mu) {
    if (seq < conn->next_read_seq || conn->rx.count(seq) != 0) {
      conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": data message ", seq, " arrived twice")));
      return nullptr;
    }
    if (seq != conn->next_arrival_seq) ++g_out_of_order;
    conn->next_arrival_seq = std::max(conn->next_arrival_seq, seq + 1);
    return &conn->rx[seq];
  }

  static ucs_status_t OnDataAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* w = static_cast<Worker*>(arg);
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    ConnState* conn = w->Find(param);
    if (conn == nullptr || header_length != sizeof(DataHeader)) return UCS_OK;  // a rendezvous is dropped too
    DataHeader h;
    std::memcpy(&h, header, sizeof h);
    UpdateTransports(conn);
    MutexLock lock(conn->mu);
    Chunk* chunk = NewChunkLocked(conn, h.seq);
    if (chunk == nullptr) return UCS_OK;
    Chunk& c = *chunk;
    c.size = length;
    c.wire = length;
    c.bytes.reset(new char[std::max<size_t>(length, 1)]);
    if (!rndv) {
      std::memcpy(c.bytes.get(), data, length);
      c.ready = true;
      conn->cv.NotifyAll();
      if (conn->peer_fin) w->MaybeAckFinLocked(conn);
      return UCS_OK;
    }
    // Rendezvous: fetch the data into the chunk once progress returns. The chunk keeps its place in the
    // sequence meanwhile, so bytes that arrive later by eager messages are not read before it.
    std::shared_ptr<ConnState> keep = w->eps_[conn->ep];
    w->deferred_.push_back([w, keep, seq = h.seq, desc = data] { w->ReceiveRendezvous(keep, seq, desc); });
    return UCS_INPROGRESS;
  }

  static ucs_status_t OnRowsAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* w = static_cast<Worker*>(arg);
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    ConnState* conn = w->Find(param);
    if (conn == nullptr) return UCS_OK;
    RowsHeader h{};
    std::string malformed;
    if (header_length < sizeof h) {
      malformed = StrCat("a header of ", header_length, " bytes");
    } else {
      std::memcpy(&h, header, sizeof h);
      if (header_length != sizeof h + h.frame_bytes) {
        malformed = StrCat("a header of ", header_length, " bytes announcing a frame of ", h.frame_bytes);
      } else if (h.rows > kMaxDetections) {
        malformed = StrCat(h.rows, " rows, more than ", kMaxDetections);
      } else if (length != h.rows * kRowBytes) {
        malformed = StrCat(length, " bytes of data for ", h.rows, " rows");
      }
    }
    UpdateTransports(conn);
    MutexLock lock(conn->mu);
    if (!malformed.empty()) {
      ++g_rows_rejected;
      conn->FailLocked(absl::DataLossError(StrCat(conn->peer, ": a malformed rows message: ", malformed)));
      return UCS_OK;
    }
    Chunk* chunk = NewChunkLocked(conn, h.seq);
    if (chunk == nullptr) return UCS_OK;
    Chunk& c = *chunk;
    c.is_rows = true;
    c.rows = h.rows;
    c.frame.assign(static_cast<const char*>(header) + sizeof h, h.frame_bytes);
    c.size = length;
    c.wire = h.frame_bytes + length;
    c.bytes.reset(new char[std::max<size_t>(length, 1)]);
    if (!rndv) {
      std::memcpy(c.bytes.get(), data, length);
      w->FinishRowsLocked(conn, h.seq, c);
      return UCS_OK;
    }
    std::shared_ptr<ConnState> keep = w->eps_[conn->ep];
    w->deferred_.push_back([w, keep, seq = h.seq, desc = data] { w->ReceiveRendezvous(keep, seq, desc); });
    return UCS_INPROGRESS;
  }

  // Progress thread. The rows of chunk `seq` are in c.bytes (host): checks them and makes the chunk one Report
  // frame (ready), or fails the connection (nothing of it is read).
  void FinishRowsLocked(ConnState* conn, uint64_t seq, Chunk& c) VIGIL_REQUIRES(conn->mu) {
    auto reject = [&](const auto& why) {
      conn->mu.AssertHeld();  // run right here, under the caller's lock
      ++g_rows_rejected;
      conn->FailLocked(absl::DataLossError(StrCat(conn->peer, ": rows message ", seq, " rejected: ", why)));
    };
    StatusOr<Message> m = DecodeFrame(c.frame);
    if (!m.ok()) return reject(m.status().message());
    Report* r = std::get_if<Report>(&*m);
    if (r == nullptr || !r->detections.empty()) return reject("its frame is not a Report without rows");
    r->detections.resize(c.rows);
    if (c.rows > 0) std::memcpy(r->detections.data(), c.bytes.get(), c.rows * kRowBytes);
    Status valid = ValidateReport(*r);  // finite boxes and scores, integral class ids, an event's rows
    if (!valid.ok()) return reject(valid.message());
    std::string out;
    AppendFrame(*r, &out);
    c.bytes.reset(new char[out.size()]);
    std::memcpy(c.bytes.get(), out.data(), out.size());
    c.size = out.size();
    c.frame.clear();
    c.ready = true;
    ++g_rows_received;
    conn->cv.NotifyAll();
    if (conn->peer_fin) MaybeAckFinLocked(conn);
  }

  void ReceiveRendezvous(const std::shared_ptr<ConnState>& conn, uint64_t seq, void* desc) {
    char* buf = nullptr;
    size_t size = 0;
    bool into_device = false;
    {
      MutexLock lock(conn->mu);
      auto it = conn->rx.find(seq);
      if (it != conn->rx.end()) {
        buf = it->second.bytes.get();
        size = it->second.size;
        into_device = it->second.is_rows && conn->options.receive_device >= 0 && size > 0;
      }
    }
    if (buf == nullptr || conn->ep == nullptr || conn->close_started) {
      ucp_am_data_release(worker_, desc);
      return;
    }
    ucs_memory_type_t memory_type = UCS_MEMORY_TYPE_HOST;
    if (into_device) {  // rows into GPU memory; copied to the host for storage when they are all here
      std::unique_ptr<device_memory::Buffer> dev;
      if (!conn->free_row_buffers.empty()) {
        dev = std::move(conn->free_row_buffers.back());
        conn->free_row_buffers.pop_back();
      } else {
        StatusOr<std::unique_ptr<device_memory::Buffer>> made =
            device_memory::Allocate(conn->options.receive_device, kMaxDetections * kRowBytes);
        if (!made.ok()) {
          ucp_am_data_release(worker_, desc);
          MutexLock lock(conn->mu);
          conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": receiving rows: ", made.status().message())));
          return;
        }
        dev = std::move(*made);
      }
      current_device_ = conn->options.receive_device;  // Allocate made it current
      buf = static_cast<char*>(dev->data());
      memory_type = UCS_MEMORY_TYPE_CUDA;
      MutexLock lock(conn->mu);
      conn->rx[seq].device = std::move(dev);
    }
    struct Pending {
      ConnState* conn;
      uint64_t seq;
    };
    auto* pending = new Pending{conn.get(), seq};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = memory_type;
    p.cb.recv_am = [](void* request, ucs_status_t st, size_t, void* user_data) {
      auto* pend = static_cast<Pending*>(user_data);
      --pend->conn->inflight;
      pend->conn->worker->RendezvousDone(pend->conn, pend->seq, st);
      delete pend;
      ucp_request_free(request);
    };
    p.user_data = pending;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, desc, buf, size, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      ++conn->inflight;
      return;
    }
    RendezvousDone(conn.get(), seq, UCS_PTR_STATUS(r));
    delete pending;
  }

  void RendezvousDone(ConnState* conn, uint64_t seq, ucs_status_t st) {
    Completed(conn, st, "receiving rendezvous data");
    if (st != UCS_OK) return;
    ++g_rendezvous;
    MutexLock lock(conn->mu);
    auto it = conn->rx.find(seq);
    if (it == conn->rx.end()) return;
    Chunk& c = it->second;
    if (!c.is_rows) {
      c.ready = true;
      conn->cv.NotifyAll();
      if (conn->peer_fin) MaybeAckFinLocked(conn);
      return;
    }
    if (c.device) {
      Status copied = device_memory::CopyToHost(c.bytes.get(), c.device->data(), c.size, c.device->device());
      conn->free_row_buffers.push_back(std::move(c.device));
      if (!copied.ok()) {
        conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": receiving rows: ", copied.message())));
        return;
      }
      ++g_rows_into_device;
    }
    FinishRowsLocked(conn, seq, c);
  }

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
  Clock::time_point stop_deadline_;
  bool cuda_memory_ = false;  // the context takes UCS_MEMORY_TYPE_CUDA (and this build has CUDA)
  size_t max_am_header_ = 0;  // ucp_worker_query: the largest active-message header
  int current_device_ = -2;   // the CUDA device made current on the progress thread (-2: none yet)
};

class UcxConnection final : public Connection {
 public:
  UcxConnection(std::shared_ptr<Worker> worker, std::shared_ptr<ConnState> conn)
      : worker_(std::move(worker)), c_(std::move(conn)) {}

  ~UcxConnection() override {
    Shutdown();
    MutexLock lock(c_->mu);
    // Wait until the peer has everything we wrote (it acknowledged our FIN), unless it cannot read any
    // more anyway (it sent its own FIN, or failed), or we wrote nothing. (CondVar deadlines.)
    const bool wrote = c_->next_send_seq > 0;
    const auto linger_until = Clock::now() + c_->options.linger;
    while (wrote && !c_->fin_acked && !c_->peer_fin && c_->failure.ok() && !c_->closed &&
           c_->cv.WaitUntil(lock, linger_until)) {
    }
    const bool force = !c_->failure.ok() || (wrote && !c_->fin_acked && !c_->peer_fin);
    lock.Unlock();
    worker_->Post([w = worker_.get(), c = c_, force] { w->BeginClose(c, force); });
    lock.Lock();
    const auto close_until = Clock::now() + kCloseTimeout;
    while (!c_->closed && c_->cv.WaitUntil(lock, close_until)) {
    }
    // Past the timeout the worker still owns the state and releases it when UCX finishes (or when the
    // worker stops, which for a dialed connection is right after this).
  }

  Status Write(std::string_view bytes, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    MutexLock lock(c_->mu);
    while (!bytes.empty()) {
      if (c_->shut) return absl::UnavailableError(StrCat(c_->peer, ": connection shut down"));
      if (!c_->failure.ok()) return c_->failure;
      if (c_->peer_fin) return absl::UnavailableError(StrCat(c_->peer, ": peer closed the connection"));
      const uint64_t unconsumed = c_->sent_bytes - c_->peer_consumed;
      const uint64_t credit = c_->peer_window > unconsumed ? c_->peer_window - unconsumed : 0;
      SendSlot* slot = nullptr;
      for (SendSlot& s : c_->slots) {
        if (!c_->slot_busy[s.index]) {
          slot = &s;
          break;
        }
      }
      if (credit > 0 && slot != nullptr) {
        const size_t n = std::min<uint64_t>({bytes.size(), c_->options.max_message_bytes, credit});
        std::memcpy(slot->data, bytes.data(), n);
        slot->len = n;
        c_->slot_busy[slot->index] = true;
        slot->header.seq = c_->next_send_seq++;
        c_->sent_bytes += n;
        bytes.remove_prefix(n);
        // Posted under the lock: commands run in order, so sends reach UCX in sequence order and a FIN
        // (Shutdown) never overtakes them.
        worker_->Post([w = worker_.get(), keep = c_, slot] { w->SendData(slot); });
        continue;
      }
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            StrCat(c_->peer, ": send blocked for ", timeout.count(), " ms (the peer is not reading)"));
      }
      c_->cv.WaitUntil(lock, deadline);
    }
    return absl::OkStatus();
  }

  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    MutexLock lock(c_->mu);
    for (;;) {
      if (c_->shut) return absl::UnavailableError(StrCat(c_->peer, ": connection shut down"));
      size_t n = 0;
      uint64_t drained = 0;  // wire bytes of the chunks drained completely (a rows chunk grew into a frame)
      for (auto it = c_->rx.begin(); n < max && it != c_->rx.end() && it->first == c_->next_read_seq &&
                                     it->second.ready;) {
        Chunk& ch = it->second;
        const size_t take = std::min(max - n, ch.size - ch.offset);
        std::memcpy(buf + n, ch.bytes.get() + ch.offset, take);
        n += take;
        ch.offset += take;
        if (ch.offset < ch.size) break;
        drained += ch.wire;
        it = c_->rx.erase(it);
        ++c_->next_read_seq;
      }
      if (n > 0) {
        c_->consumed += drained;
        const uint64_t threshold = std::max<uint64_t>(1, c_->options.receive_window_bytes / 4);
        if (c_->consumed - c_->consumed_reported >= threshold) {
          c_->consumed_reported = c_->consumed;
          worker_->Post([w = worker_.get(), keep = c_, total = c_->consumed] {
            w->SendControl(keep.get(), ControlType::kCredit, total);
          });
        }
        return n;
      }
      if (c_->peer_fin && c_->next_read_seq >= c_->peer_fin_count) {
        return absl::UnavailableError(StrCat(c_->peer, ": peer closed the connection"));
      }
      if (!c_->failure.ok()) return c_->failure;
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(StrCat(c_->peer, ": nothing received for ", timeout.count(), " ms"));
      }
      c_->cv.WaitUntil(lock, deadline);
    }
  }

  void Shutdown() override {
    MutexLock lock(c_->mu);
    if (c_->shut) return;
    c_->shut = true;
    c_->cv.NotifyAll();
    if (c_->fin_sent || !c_->failure.ok()) return;
    c_->fin_sent = true;
    worker_->Post([w = worker_.get(), keep = c_, count = c_->next_send_seq] {
      w->SendControl(keep.get(), ControlType::kFin, count);
    });
  }

  std::string peer() const override { return c_->peer; }

  std::string transports() const override {
    MutexLock lock(c_->mu);
    return c_->transports;
  }

  bool takes_rows_from(int device) const override { return device < 0 || worker_->cuda_memory(); }

  Status WriteReport(std::string_view frame, const DevicePayload& rows, milliseconds timeout) override {
    if (!takes_rows_from(rows.device)) {
      return absl::UnimplementedError(StrCat(c_->peer, ": this UCX has no CUDA memory transports (rows on cuda:",
                                             rows.device, " go another way)"));
    }
    if (sizeof(RowsHeader) + frame.size() > worker_->max_am_header()) {
      return absl::OutOfRangeError(StrCat(c_->peer, ": a report header of ", frame.size(),
                                          " bytes is more than UCX takes beside rows (", worker_->max_am_header(),
                                          ")"));
    }
    if (rows.count > kMaxDetections || (rows.count > 0 && rows.device_rows == nullptr)) {
      return absl::InvalidArgumentError(StrCat(c_->peer, ": ", rows.count, " rows at ", rows.device_rows));
    }
    if (rows.device >= 0) VIGIL_RETURN_IF_ERROR(device_memory::WaitReady(rows.ready_event));
    const auto deadline = Clock::now() + timeout;
    auto m = std::make_shared<Worker::PendingRows>();
    m->conn = c_.get();
    m->rows = rows.device_rows;
    m->row_bytes = rows.count * kRowBytes;
    m->device = rows.device;
    m->keepalive = rows.keepalive;
    RowsHeader h{0, rows.count, static_cast<uint32_t>(frame.size())};
    const uint64_t wire = frame.size() + m->row_bytes;
    MutexLock lock(c_->mu);
    for (;;) {
      if (c_->shut) return absl::UnavailableError(StrCat(c_->peer, ": connection shut down"));
      if (!c_->failure.ok()) return c_->failure;
      if (c_->peer_fin) return absl::UnavailableError(StrCat(c_->peer, ": peer closed the connection"));
      const uint64_t unconsumed = c_->sent_bytes - c_->peer_consumed;
      // All at once (a message is not split); a message larger than the whole window goes when it is empty.
      if (unconsumed == 0 || (c_->peer_window > unconsumed && c_->peer_window - unconsumed >= wire)) break;
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            StrCat(c_->peer, ": send blocked for ", timeout.count(), " ms (the peer is not reading)"));
      }
      c_->cv.WaitUntil(lock, deadline);
    }
    h.seq = c_->next_send_seq++;
    c_->sent_bytes += wire;
    m->header.assign(reinterpret_cast<const char*>(&h), sizeof h);
    m->header.append(frame);
    // Posted under the lock, as Write's: in sequence order, never after a FIN.
    worker_->Post([w = worker_.get(), keep = c_, m] { w->SendRows(m); });
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<Worker> worker_;
  const std::shared_ptr<ConnState> c_;
};

class UcxDialer final : public Dialer {
 public:
  UcxDialer(std::string host, uint16_t port, UcxOptions options)
      : host_(std::move(host)), port_(port), options_(std::move(options)) {}

  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    VIGIL_RETURN_IF_ERROR(ValidateOptions(options_));
    const auto deadline = Clock::now() + timeout;
    VIGIL_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host_, port_, false));
    StatusOr<std::shared_ptr<Worker>> started = Worker::Start(options_);
    if (!started.ok()) return Annotate(started.status(), StrCat("connect to ", target()));
    std::shared_ptr<Worker> worker = *std::move(started);
    std::string last_error = "no address";
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      sockaddr_storage addr{};
      std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
      auto conn = std::make_shared<ConnState>(worker.get(), FormatAddress(a->ai_addr, a->ai_addrlen), options_);
      Status st = worker->Call<Status>([&] { return worker->Connect(conn, addr); });
      if (!st.ok()) {
        last_error = StrCat(conn->peer, ": ", st.message());
        continue;
      }
      MutexLock lock(conn->mu);
      while (!conn->connected && conn->failure.ok() && conn->cv.WaitUntil(lock, deadline)) {
      }
      if (conn->connected && conn->failure.ok()) {
        lock.Unlock();
        return std::unique_ptr<Connection>(new UcxConnection(std::move(worker), std::move(conn)));
      }
      last_error = conn->failure.ok() ? StrCat(conn->peer, ": no answer within ", timeout.count(), " ms")
                                      : std::string(conn->failure.message());
      lock.Unlock();
      worker->Post([w = worker.get(), conn] { w->BeginClose(conn, /*force=*/true); });
      if (Clock::now() >= deadline) break;
    }
    return absl::UnavailableError(StrCat("connect to ", target(), ": ", last_error));
  }

  std::string target() const override { return StrCat("ucx://", host_, ":", port_); }

 private:
  const std::string host_;
  const uint16_t port_;
  const UcxOptions options_;
};

class UcxListener final : public Listener {
 public:
  UcxListener(std::shared_ptr<Worker> worker, std::shared_ptr<AcceptQueue> queue, uint16_t port, std::string address)
      : worker_(std::move(worker)), queue_(std::move(queue)), port_(port), address_(std::move(address)) {}

  ~UcxListener() override {
    worker_->Call<bool>([w = worker_.get()] {
      w->StopListening();
      return true;
    });
    std::deque<std::shared_ptr<ConnState>> unaccepted;
    {
      MutexLock lock(queue_->mu);
      unaccepted.swap(queue_->ready);
    }
    for (auto& c : unaccepted) worker_->Post([w = worker_.get(), c] { w->BeginClose(c, /*force=*/true); });
  }

  std::string_view kind() const override { return "ucx"; }
  uint16_t port() const override { return port_; }
  const std::string& address() const override { return address_; }

  StatusOr<std::unique_ptr<Connection>> Accept(milliseconds timeout) override {
    MutexLock lock(queue_->mu);
    const auto deadline = Clock::now() + timeout;  // a CondVar deadline (as wait_for's)
    while (queue_->ready.empty() && queue_->cv.WaitUntil(lock, deadline)) {
    }
    if (queue_->ready.empty()) return absl::DeadlineExceededError("no connection");
    std::shared_ptr<ConnState> conn = std::move(queue_->ready.front());
    queue_->ready.pop_front();
    return std::unique_ptr<Connection>(new UcxConnection(worker_, std::move(conn)));
  }

 private:
  const std::shared_ptr<Worker> worker_;
  const std::shared_ptr<AcceptQueue> queue_;
  const uint16_t port_;
  const std::string address_;
};

}  // namespace

std::unique_ptr<Dialer> MakeUcxDialer(std::string host, uint16_t port, UcxOptions options) {
  return std::make_unique<UcxDialer>(std::move(host), port, std::move(options));
}

StatusOr<std::unique_ptr<Listener>> UcxListen(const std::string& host, uint16_t port, UcxOptions options) {
  VIGIL_RETURN_IF_ERROR(ValidateOptions(options));
  const std::string where = StrCat(host.empty() ? "0.0.0.0" : host, ":", port);
  VIGIL_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, true));
  sockaddr_storage addr{};
  std::memcpy(&addr, addrs->ai_addr, addrs->ai_addrlen);
  StatusOr<std::shared_ptr<Worker>> started = Worker::Start(options);
  if (!started.ok()) return Annotate(started.status(), StrCat("listen on ", where));
  std::shared_ptr<Worker> worker = *std::move(started);
  auto queue = std::make_shared<AcceptQueue>();
  StatusOr<sockaddr_storage> bound =
      worker->Call<StatusOr<sockaddr_storage>>([&] { return worker->Listen(addr, queue); });
  if (!bound.ok()) return absl::UnavailableError(StrCat("listen on ", where, " (UCX): ", bound.status().message()));
  const uint16_t actual = ntohs(bound->ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&*bound)->sin6_port
                                                             : reinterpret_cast<sockaddr_in*>(&*bound)->sin_port);
  return std::unique_ptr<Listener>(new UcxListener(
      std::move(worker), std::move(queue), actual,
      FormatAddress(reinterpret_cast<const sockaddr*>(&*bound), SockaddrLen(*bound))));
}

void PrepareUcxEnvironment() {
  // UCX reads its connection manager's settings from the environment only (ucp_config_modify does not
  // reach them in 1.13).
  setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
}

UcxCounters GetUcxCounters() {
  UcxCounters c;
  c.workers = g_workers.load();
  c.endpoints = g_endpoints.load();
  c.registrations = g_registrations.load();
  c.rendezvous_messages = g_rendezvous.load();
  c.out_of_order_messages = g_out_of_order.load();
  c.cuda_memory_workers = g_cuda_workers.load();
  c.rows_messages_sent = g_rows_sent.load();
  c.rows_messages_sent_from_device = g_rows_sent_from_device.load();
  c.rows_messages_received = g_rows_received.load();
  c.rows_received_into_device = g_rows_into_device.load();
  c.rows_messages_rejected = g_rows_rejected.load();
  return c;
}

}  // namespace vigil::transport
