#include "vigil/transport/auth.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace vigil::transport {
namespace {

std::string Sha256(std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), out, &n, EVP_sha256(), nullptr) != 1) std::abort();
  return std::string(reinterpret_cast<const char*>(out), n);
}

// HMAC-SHA256(key, label ‖ H(hello) ‖ first ‖ second).
std::string Proof(std::string_view key, std::string_view label, const Hello& hello, const Nonce& first,
                  const Nonce& second) {
  std::string msg(label);
  msg += Sha256(EncodeFrame(hello));
  msg.append(reinterpret_cast<const char*>(first.data()), first.size());
  msg.append(reinterpret_cast<const char*>(second.data()), second.size());
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
           msg.size(), out, &n) == nullptr) {
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out), n);
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

void WarnIfShared(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    spdlog::warn("{}: a secret readable by group or others (mode {:o}); chmod 600 it", path, st.st_mode & 0777);
  }
}

StatusOr<std::string> ReadSmallFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = StrCat(what, " ", path, ": cannot read: ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Nonce RandomNonce() {
  Nonce n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    spdlog::critical("OpenSSL RAND_bytes failed: no secure random numbers");
    std::abort();
  }
  return n;
}

std::string NewKeyHex() {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : RandomNonce()) {
    hex += kDigits[b >> 4];
    hex += kDigits[b & 15];
  }
  return hex;
}

std::string AggregatorProof(std::string_view key, const Hello& hello, const Nonce& aggregator_nonce) {
  return Proof(key, "vigil-v3 aggregator", hello, hello.nonce, aggregator_nonce);
}

std::string EdgeProof(std::string_view key, const Hello& hello, const Nonce& aggregator_nonce) {
  return Proof(key, "vigil-v3 edge", hello, aggregator_nonce, hello.nonce);
}

bool ProofMatches(std::string_view expected, std::string_view got) {
  return expected.size() == got.size() && !expected.empty() &&
         CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

StatusOr<std::string> ParseHexKey(std::string_view text, std::string_view what) {
  text = Trim(text);
  if (text.size() % 2 != 0) return absl::InvalidArgumentError(StrCat(what, ": a key is an even number of hex digits"));
  std::string key;
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = HexDigit(text[i]), lo = HexDigit(text[i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(StrCat(what, ": not a hex key (character ", i + (hi < 0 ? 0 : 1) + 1, ")"));
    }
    key.push_back(static_cast<char>(hi * 16 + lo));
  }
  if (key.size() < kMinKeyBytes) {
    return absl::InvalidArgumentError(StrCat(what, ": a key needs at least ", kMinKeyBytes, " bytes (",
                                             2 * kMinKeyBytes, " hex digits), this one has ", key.size(),
                                             "; make one with `openssl rand -hex 32`"));
  }
  return key;
}

StatusOr<std::string> ReadKeyFile(const std::string& path) {
  VIGIL_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "key_file"));
  WarnIfShared(path);
  return ParseHexKey(text, StrCat("key_file ", path));
}

StatusOr<KeyStore> KeyStore::Load(const std::string& path) {
  VIGIL_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "keys_file"));
  WarnIfShared(path);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // The message quotes a position, not the content (the file holds secrets).
    return absl::InvalidArgumentError(StrCat("keys_file ", path, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": not YAML"));
  }
  if (root.IsNull()) return KeyStore();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(StrCat("keys_file ", path, ": expected a mapping `edge-id: hex key`"));
  }
  std::map<std::string, std::string, std::less<>> keys;
  for (const auto& kv : root) {
    if (!kv.first.IsScalar() || !kv.second.IsScalar()) {
      return absl::InvalidArgumentError(StrCat("keys_file ", path, ":", kv.first.Mark().line + 1,
                                               ": expected `edge-id: hex key`"));
    }
    const std::string edge = kv.first.Scalar();
    VIGIL_ASSIGN_OR_RETURN(std::string key,
                           ParseHexKey(kv.second.Scalar(), StrCat("keys_file ", path, ": edge '", edge, "'")));
    if (!keys.emplace(edge, std::move(key)).second) {
      return absl::InvalidArgumentError(StrCat("keys_file ", path, ": edge '", edge, "' listed twice"));
    }
  }
  return KeyStore(std::move(keys));
}

const std::string* KeyStore::Find(std::string_view edge) const {
  auto it = keys_.find(edge);
  return it == keys_.end() ? nullptr : &it->second;
}

// ---- AllowList --------------------------------------------------------------------------------------

namespace {

// Parses a bare IPv4 or IPv6 address into 16 bytes (IPv4 in the first 4); IPv4-mapped IPv6 becomes IPv4.
bool ParseAddress(std::string_view text, bool* v6, uint8_t out[16]) {
  std::string s(text);
  std::memset(out, 0, 16);
  in_addr a4{};
  if (::inet_pton(AF_INET, s.c_str(), &a4) == 1) {
    *v6 = false;
    std::memcpy(out, &a4, 4);
    return true;
  }
  in6_addr a6{};
  if (::inet_pton(AF_INET6, s.c_str(), &a6) == 1) {
    static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a6.s6_addr, kMapped, 12) == 0) {
      *v6 = false;
      std::memcpy(out, a6.s6_addr + 12, 4);
      return true;
    }
    *v6 = true;
    std::memcpy(out, a6.s6_addr, 16);
    return true;
  }
  return false;
}

// "1.2.3.4:5" → "1.2.3.4"; "[::1]:5" → "::1"; a bare address stays.
std::string_view HostOf(std::string_view peer) {
  if (!peer.empty() && peer.front() == '[') {
    const size_t end = peer.find(']');
    return end == std::string_view::npos ? std::string_view() : peer.substr(1, end - 1);
  }
  const size_t colon = peer.find(':');
  if (colon != std::string_view::npos && peer.find(':', colon + 1) == std::string_view::npos) {
    return peer.substr(0, colon);  // exactly one colon: IPv4 with a port
  }
  return peer;  // a bare IPv4 or IPv6 address
}

}  // namespace

StatusOr<AllowList> AllowList::Parse(const std::vector<std::string>& cidrs) {
  AllowList list;
  for (const std::string& entry : cidrs) {
    auto bad = [&](std::string_view why) { return absl::InvalidArgumentError(StrCat("allow: '", entry, "': ", why)); };
    std::string_view text = Trim(entry);
    std::string_view addr = text;
    int prefix = -1;
    if (const size_t slash = text.find('/'); slash != std::string_view::npos) {
      addr = text.substr(0, slash);
      const std::string_view p = text.substr(slash + 1);
      if (p.empty() || p.size() > 3 || p.find_first_not_of("0123456789") != std::string_view::npos) {
        return bad("the prefix length is not a number");
      }
      prefix = std::atoi(std::string(p).c_str());
    }
    Net net;
    if (!ParseAddress(addr, &net.v6, net.addr)) return bad("not an IPv4 or IPv6 address");
    const int max = net.v6 ? 128 : 32;
    if (prefix > max) return bad(StrCat("prefix over ", max));
    net.prefix = prefix < 0 ? max : prefix;
    // Host bits set ("10.0.0.1/8") are most likely a typo for another network: refuse rather than guess.
    for (int bit = net.prefix; bit < max; ++bit) {
      if (net.addr[bit / 8] & (0x80 >> (bit % 8))) return bad(StrCat("host bits set past /", net.prefix));
    }
    list.nets_.push_back(net);
    list.text_.emplace_back(text);
  }
  return list;
}

bool AllowList::Allows(std::string_view peer) const {
  bool v6 = false;
  uint8_t a[16];
  if (!ParseAddress(HostOf(peer), &v6, a)) return false;
  for (const Net& n : nets_) {
    if (n.v6 != v6) continue;
    int bit = 0;
    for (; bit + 8 <= n.prefix; bit += 8) {
      if (a[bit / 8] != n.addr[bit / 8]) break;
    }
    if (bit + 8 <= n.prefix) continue;
    if (bit < n.prefix) {
      const uint8_t mask = static_cast<uint8_t>(0xFF << (8 - (n.prefix - bit)));
      if ((a[bit / 8] & mask) != (n.addr[bit / 8] & mask)) continue;
    }
    return true;
  }
  return false;
}

}  // namespace vigil::transport
