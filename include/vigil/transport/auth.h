// vigil/transport/auth.h — who may talk to whom: pre-shared keys with an HMAC-SHA256 challenge and response
// (mutual: each side proves it knows the edge's key), and CIDR allow-lists for every listener.
//
// Handshake (protocol.h, version 3), K = the edge's key, H = SHA-256 of the Hello frame as sent:
//   edge → Hello{edge, ..., nonce Ne}
//   aggregator → Challenge{nonce Na, proof Pa = HMAC-SHA256(K, "vigil-v3 aggregator" ‖ H ‖ Ne ‖ Na)}
//   edge checks Pa, → Auth{proof Pe = HMAC-SHA256(K, "vigil-v3 edge" ‖ H ‖ Na ‖ Ne)}
//   aggregator checks Pe, then decides on the Hello (Welcome or Reject).
// Both nonces are fresh random bytes per connection, so neither a recorded Challenge nor a recorded Hello +
// Auth is accepted again; H binds the proofs to the Hello's content (edge id, epoch, flags, streams), so a
// man in the middle cannot rewrite it (e.g. set kHelloPromote). The labels differ per direction, so one
// side's proof is never valid as the other's. What follows the handshake is integrity-protected only by
// TLS (tls.h) where it is configured: over a plain TCP or UCX link an active attacker on the path could
// still inject frames after the handshake.
//
// An aggregator that has no key for the edge id answers a Challenge with a random proof (so a prober
// cannot tell which edge ids exist) and refuses the Auth; the reason (unknown edge, wrong key, no proof) is
// counted and logged at the aggregator only. Keys are never logged.
//
// Thread-safety: the functions are pure (RandomNonce draws from OpenSSL's CSPRNG, which is thread-safe);
// KeyStore and AllowList are immutable after construction.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

inline constexpr size_t kMinKeyBytes = 16;  // 128 bits; `openssl rand -hex 32` makes a 256-bit key

// Fresh random bytes from OpenSSL's CSPRNG (RAND_bytes). Aborts if the CSPRNG fails (no entropy: nothing
// secure can be done).
Nonce RandomNonce();

// A new 256-bit key from the CSPRNG, written as 64 hex digits (what a keys file and a key_file hold).
std::string NewKeyHex();

// The proofs of the handshake above; `key` is the raw key (bytes, not hex).
std::string AggregatorProof(std::string_view key, const Hello& hello, const Nonce& aggregator_nonce);
std::string EdgeProof(std::string_view key, const Hello& hello, const Nonce& aggregator_nonce);
// Constant-time comparison (CRYPTO_memcmp): false when the sizes differ.
bool ProofMatches(std::string_view expected, std::string_view got);

// A key written as hex (whitespace around it ignored), at least kMinKeyBytes bytes. `what` names where it
// came from in errors ("key_file /etc/vigil/edge.key"); the key itself is never in a message.
StatusOr<std::string> ParseHexKey(std::string_view text, std::string_view what);
// Reads a key file (hex). Errors: NotFound / PermissionDenied naming the path, InvalidArgument (not hex,
// too short). Logs a warning when the file is readable by group or others.
StatusOr<std::string> ReadKeyFile(const std::string& path);

// Edge id → key, read from a YAML mapping file:   cam-edge-1: 9f86d081884c7d65...   (hex, one per edge).
class KeyStore {
 public:
  KeyStore() = default;
  explicit KeyStore(std::map<std::string, std::string, std::less<>> keys) : keys_(std::move(keys)) {}
  // Errors: NotFound, InvalidArgument naming the file and the edge id whose key is bad (never the key).
  static StatusOr<KeyStore> Load(const std::string& path);
  // The key of `edge`, nullptr when it has none.
  const std::string* Find(std::string_view edge) const;
  size_t size() const { return keys_.size(); }

 private:
  std::map<std::string, std::string, std::less<>> keys_;
};

// A list of IPv4/IPv6 networks in CIDR notation ("127.0.0.1/32", "10.0.0.0/8", "::1/128"; a bare address
// means /32 or /128). IPv4-mapped IPv6 peers (::ffff:a.b.c.d) match IPv4 networks.
class AllowList {
 public:
  // Errors: InvalidArgument naming the entry and why ("10.0.0.0/33: prefix over 32").
  static StatusOr<AllowList> Parse(const std::vector<std::string>& cidrs);
  // Whether `peer` — an address as Connection::peer() writes it ("1.2.3.4:5", "[::1]:5") or a bare
  // address — is in one of the networks. An address that does not parse is not allowed.
  bool Allows(std::string_view peer) const;
  const std::vector<std::string>& entries() const { return text_; }

 private:
  struct Net {
    bool v6 = false;
    uint8_t addr[16] = {};
    int prefix = 0;
  };
  std::vector<Net> nets_;
  std::vector<std::string> text_;
};

}  // namespace vigil::transport
