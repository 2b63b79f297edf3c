// UCX implementation of connection.h (ucx.h): UCP active messages over client-server endpoints. The parts,
// their layout and the wire format: ucx_worker.h. Here: the address/wire-up helpers, the counters,
// PrepareUcxEnvironment and GetUcxCounters.
#include "vigil/transport/ucx.h"

#include <stdio.h>

#include <algorithm>
#include <cstring>

#include "transport/ucx_worker.h"

namespace vigil::transport {
namespace ucx {

std::atomic<int64_t> g_workers{0};
std::atomic<int64_t> g_endpoints{0};
std::atomic<int64_t> g_registrations{0};
std::atomic<uint64_t> g_rendezvous{0};
std::atomic<uint64_t> g_out_of_order{0};
std::atomic<int64_t> g_cuda_workers{0};
std::atomic<uint64_t> g_rows_sent{0}, g_rows_sent_from_device{0}, g_rows_received{0}, g_rows_into_device{0},
    g_rows_rejected{0};

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

}  // namespace ucx

void PrepareUcxEnvironment() {
  // UCX reads its connection manager's settings from the environment only (ucp_config_modify does not
  // reach them in 1.13).
  setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
}

UcxCounters GetUcxCounters() {
  UcxCounters c;
  c.workers = ucx::g_workers.load();
  c.endpoints = ucx::g_endpoints.load();
  c.registrations = ucx::g_registrations.load();
  c.rendezvous_messages = ucx::g_rendezvous.load();
  c.out_of_order_messages = ucx::g_out_of_order.load();
  c.cuda_memory_workers = ucx::g_cuda_workers.load();
  c.rows_messages_sent = ucx::g_rows_sent.load();
  c.rows_messages_sent_from_device = ucx::g_rows_sent_from_device.load();
  c.rows_messages_received = ucx::g_rows_received.load();
  c.rows_received_into_device = ucx::g_rows_into_device.load();
  c.rows_messages_rejected = ucx::g_rows_rejected.load();
  return c;
}

}  // namespace vigil::transport
