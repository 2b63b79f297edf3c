// Socket addresses for the transport module's connections (TCP and UCX's socket-address endpoints).
// Private to src/transport. Thread-safe (getaddrinfo/getnameinfo are).
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

#include "vigil/common/status.h"

namespace vigil::transport::net {

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// host:port for a stream socket, in resolver order (IPv4 or IPv6); `passive` for a listener (host "" =
// all IPv4 interfaces). Errors: InvalidArgument naming the host and the resolver's reason.
StatusOr<AddrInfoPtr> Resolve(const std::string& host, uint16_t port, bool passive);

// "1.2.3.4:5" or "[::1]:5" (numeric); "?" when it cannot be formatted.
std::string FormatAddress(const sockaddr* sa, socklen_t len);

}  // namespace vigil::transport::net
