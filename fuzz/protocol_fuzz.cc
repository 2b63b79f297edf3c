// libFuzzer target for the report protocol's decoders (vigil/transport/protocol.h): FrameDecoder fed in
// chunks, DecodeFrame on the whole input, and the invariants the decoder promises for every message it
// hands out. Built by -DVIGIL_FUZZ=ON with clang (scripts/fuzz.sh); seeds in fuzz/corpus/protocol.
//
// Invariants checked (a violation aborts through __builtin_trap, so libFuzzer keeps the input):
//  - FrameDecoder's result does not depend on how the bytes arrive: the messages, the outcome (needs more
//    bytes, or the error code) and, when it needs more, pending() are the same fed in chunks or at once.
//  - DecodeFrame succeeds exactly when the stream holds one frame and nothing else, with that message.
//  - Every decoded message round-trips: DecodeFrame(EncodeFrame(m)) == m.
//  - What DecodeBody checks before handing a message out: a Report passes ValidateReport; a Hello of this
//    protocol version passes ValidateHello (one of another version stops after its version field, for the
//    receiver to refuse, so its later fields keep their defaults: no flags, a zero nonce, no classes or
//    streams); a Welcome has epoch ≥ 1 and -1 ≤ contiguous_through ≤ highest_seq; a Reject has a known
//    reason, 1..6 (kStaleEpoch..kUnauthenticated; 0 and 7 do not decode); a Challenge's and an Auth's proof
//    is empty or kProofBytes (32). Ack and Heartbeat have no such rules and get the round trip; CheckDecoded
//    has no catch-all, so a message type added to Message does not compile here until its rules are written.
//
// The input is a byte stream of frames. A mutated body with a stale CRC or body_length would stop at those
// checks and never reach the body decoders, so:
//  - LLVMFuzzerCustomMutator mutates, 3 times in 4, the body of one complete frame (libFuzzer's own
//    mutations, LLVMFuzzerMutate, or one byte set to a value below 8, as u8 enum fields hold, or to 31..33,
//    around a proof_length) and rewrites that frame's body_length and CRC; else the raw bytes.
//  - Before decoding, the CRC field of each complete frame is rewritten to match its bytes, except for 1
//    input in 16 (chosen from the input's first bytes), which keeps the CRC mismatch path covered.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "vigil/transport/protocol.h"

namespace vigil::transport {
namespace {

[[noreturn]] void Violated(const char* what, int line) {
  std::fprintf(stderr, "protocol_fuzz.cc:%d: invariant violated: %s\n", line, what);
  __builtin_trap();
}
#define FUZZ_CHECK(cond)                    \
  do {                                      \
    if (!(cond)) Violated(#cond, __LINE__); \
  } while (0)

uint32_t LoadLe32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

void StoreLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

// The offsets of the complete frames of `data`, walking them by their body_length fields.
std::vector<size_t> FrameOffsets(std::string_view data) {
  std::vector<size_t> frames;
  size_t at = 0;
  while (data.size() - at >= kHeaderBytes) {
    const uint32_t length = LoadLe32(data, at + 8);
    if (length > kMaxBodyBytes || data.size() - at - kHeaderBytes < length) break;
    frames.push_back(at);
    at += kHeaderBytes + length;
  }
  return frames;
}

// Rewrites the CRC field of the complete frame at `at` in `data` to match its bytes.
void FixCrc(char* data, size_t at) {
  const std::string_view frame(data + at, kHeaderBytes + LoadLe32(std::string_view(data + at, kHeaderBytes), 8));
  StoreLe32(data + at + 12, Crc32(frame.substr(kHeaderBytes), Crc32(frame.substr(0, 12))));
}

// splitmix64: chunk sizes from a seed.
uint64_t NextRandom(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The size of the next chunk to feed: single bytes, sizes around the 16-byte header, small and large pieces,
// or all that is left.
size_t NextChunk(uint64_t* s, size_t left) {
  const uint64_t r = NextRandom(s);
  size_t n = left;
  switch (r % 8) {
    case 0: n = 1; break;
    case 1: n = 1 + (r >> 8) % 4; break;
    case 2: n = kHeaderBytes - 1 + (r >> 8) % 3; break;
    case 3: case 4: n = 1 + (r >> 8) % 64; break;
    case 5: case 6: n = 1 + (r >> 8) % 4096; break;
    default: break;
  }
  return n < left ? n : left;
}

struct StreamOutcome {
  std::vector<Message> messages;
  absl::StatusCode end = absl::StatusCode::kOk;  // kOk: the decoder needs more bytes
  size_t pending = 0;                            // pending() at the end
};

// Feeds `data` to one FrameDecoder (in chunks when `seed` is set, else at once), calling Next() after
// each chunk until it needs more bytes or fails.
StreamOutcome DecodeStream(std::string_view data, uint64_t* seed) {
  FrameDecoder d;
  StreamOutcome o;
  size_t fed = 0;
  for (;;) {
    for (;;) {
      StatusOr<std::optional<Message>> next = d.Next();
      if (!next.ok()) {
        o.end = next.status().code();
        FUZZ_CHECK(o.end != absl::StatusCode::kOk);
        o.pending = d.pending();
        return o;
      }
      if (!next->has_value()) break;
      o.messages.push_back(std::move(**next));
      FUZZ_CHECK(o.messages.size() * kHeaderBytes <= fed);  // each frame consumes at least a header
    }
    if (fed == data.size()) break;
    const size_t n = seed ? NextChunk(seed, data.size() - fed) : data.size() - fed;
    d.Feed(data.substr(fed, n));
    fed += n;
  }
  o.pending = d.pending();
  FUZZ_CHECK(o.pending <= data.size());
  return o;
}

// The rules DecodeBody applies before it hands a message out (protocol.cc), per type. A message type whose
// decoder refuses more than a malformed body gets an overload here.
struct CheckDecoded {
  void operator()(const Report& r) const { FUZZ_CHECK(ValidateReport(r).ok()); }
  void operator()(const Hello& h) const {
    if (h.protocol_version == kProtocolVersion) {
      FUZZ_CHECK(ValidateHello(h).ok());
    } else {  // decoding stopped after protocol_version
      FUZZ_CHECK(h.flags == 0 && h.nonce == Nonce{} && h.class_names.empty() && h.streams.empty());
    }
  }
  void operator()(const Welcome& w) const {
    FUZZ_CHECK(w.epoch >= 1);
    for (const WelcomeStream& s : w.streams) {
      FUZZ_CHECK(s.contiguous_through >= -1 && s.highest_seq >= s.contiguous_through);
    }
  }
  void operator()(const Reject& r) const {
    const auto reason = static_cast<uint8_t>(r.reason);
    FUZZ_CHECK(reason >= static_cast<uint8_t>(RejectReason::kStaleEpoch) &&
               reason <= static_cast<uint8_t>(RejectReason::kUnauthenticated));
    FUZZ_CHECK(ToString(r.reason) != "unknown");
  }
  void operator()(const Challenge& c) const { FUZZ_CHECK(c.proof.empty() || c.proof.size() == kProofBytes); }
  void operator()(const Auth& a) const { FUZZ_CHECK(a.proof.empty() || a.proof.size() == kProofBytes); }
  void operator()(const Ack&) const {}        // no decoder-side rules
  void operator()(const Heartbeat&) const {}  // no decoder-side rules
  void operator()(const RingOffer&) const {}  // no decoder-side rules (the edge checks an offer: cuda_ipc.cc)
  void operator()(const RingAccept&) const {}
  void operator()(const Snapshot& s) const { FUZZ_CHECK(ValidateSnapshot(s).ok()); }
  void operator()(const SourceStates& s) const { FUZZ_CHECK(ValidateSourceStates(s).ok()); }
};

void CheckMessage(const Message& m) {
  std::visit(CheckDecoded{}, m);
  const std::string frame = EncodeFrame(m);
  StatusOr<Message> again = DecodeFrame(frame);
  if (!again.ok()) std::fprintf(stderr, "re-encoded message does not decode: %s\n", again.status().ToString().c_str());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->index() == m.index());
  FUZZ_CHECK(*again == m);
}

}  // namespace
}  // namespace vigil::transport

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  using namespace vigil::transport;
  std::minstd_rand rng(seed);
  const std::vector<size_t> frames = FrameOffsets(std::string_view(reinterpret_cast<const char*>(data), size));
  if (frames.empty() || rng() % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  const size_t at = frames[rng() % frames.size()];
  const size_t body = at + kHeaderBytes;
  const size_t length = LoadLe32(std::string_view(reinterpret_cast<const char*>(data), size), at + 8);
  const size_t tail = size - body - length;
  // The body may grow to `room` bytes: at most twice its size per mutation (libFuzzer's -len_control, which
  // grows inputs gradually, does not apply to a custom mutator's output), within max_size and kMaxBodyBytes.
  const size_t room = std::min({max_size - (size - length), kMaxBodyBytes, std::max<size_t>(2 * length, 64)});
  if (room == 0) return LLVMFuzzerMutate(data, size, max_size);
  if (length > 0 && rng() % 8 == 0) {
    // A byte of the body to a value at a u8 field's bounds: below 8 for the enums (kind, severity, Hello flags,
    // reason: 7 is the first invalid one), 31..33 for proof_length (0 or 32).
    const uint8_t value =
        static_cast<uint8_t>(rng() % 4 == 0 ? kProofBytes - 1 + rng() % 3 : rng() % 8);
    data[body + rng() % length] = value;
    FixCrc(reinterpret_cast<char*>(data), at);
    return size;
  }
  std::string mutated(reinterpret_cast<const char*>(data) + body, length);
  if (mutated.empty()) mutated.push_back(static_cast<char>(rng()));  // LLVMFuzzerMutate needs a byte
  const size_t start = mutated.size();
  mutated.resize(room);
  const size_t n = LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(mutated.data()), start, room);
  std::memmove(data + body + n, data + body + length, tail);
  std::memcpy(data + body, mutated.data(), n);
  StoreLe32(reinterpret_cast<char*>(data) + at + 8, static_cast<uint32_t>(n));
  FixCrc(reinterpret_cast<char*>(data), at);
  return size - length + n;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vigil::transport;
  std::string input(reinterpret_cast<const char*>(data), size);

  // The chunk plan and the CRC fix-up come from the first bytes (header and start of the first body), so
  // different frames and most mutations of the first frame get different splits.
  uint64_t seed = 0xCBF29CE484222325ull;  // FNV-1a
  for (size_t i = 0; i < size && i < 32; ++i) seed = (seed ^ data[i]) * 0x100000001B3ull;
  seed ^= size;
  if (seed % 16 != 0) {
    for (size_t at : FrameOffsets(input)) FixCrc(input.data(), at);
  }

  const StreamOutcome whole = DecodeStream(input, nullptr);
  const StreamOutcome chunked = DecodeStream(input, &seed);
  FUZZ_CHECK(whole.end == chunked.end);
  FUZZ_CHECK(whole.messages == chunked.messages);
  if (whole.end == absl::StatusCode::kOk) FUZZ_CHECK(whole.pending == chunked.pending);

  const vigil::StatusOr<Message> one = DecodeFrame(input);
  const bool one_frame = whole.messages.size() == 1 && whole.end == absl::StatusCode::kOk && whole.pending == 0;
  FUZZ_CHECK(one.ok() == one_frame);
  if (one.ok()) FUZZ_CHECK(*one == whole.messages[0]);

  for (const Message& m : whole.messages) CheckMessage(m);
  return 0;
}
