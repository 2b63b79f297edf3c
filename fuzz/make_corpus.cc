// Writes the seed corpus of vigil_protocol_fuzz: one valid frame of every message type (every Report kind, severity
// and Reject reason, a Hello of another protocol version, Challenge and Auth with and without a proof), a frame of
// every Message alternative default-constructed (so a type added to Message gets a seed with its type byte),
// concatenations (the v3 handshake), truncations, and frames one byte past a decoder rule (Reject reason 7 and 0,
// proof lengths 31, 33 and 1, a proof one byte short, an unknown Hello flag), which must not decode. Usage:
// vigil_protocol_corpus DIR (files seed-NNN; scripts/fuzz.sh corpus renames them by content hash into
// fuzz/corpus/protocol). Fails when a Message alternative has no seed that decodes: add one below when adding a
// message type.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "vigil/transport/protocol.h"

namespace vigil::transport {
namespace {

std::vector<Message> ValidMessages() {
  std::vector<Message> v;
  Hello hello;
  hello.edge = "edge-a";
  hello.class_names = {"person", "car", "forklift"};
  hello.streams = {{"cam/1", 1}, {"cam/2", 7}};
  for (size_t i = 0; i < kNonceBytes; ++i) hello.nonce[i] = static_cast<uint8_t>(0xA0 + i);
  v.push_back(hello);
  Hello promote = hello;
  promote.epoch = 7;
  promote.flags = kHelloPromote;
  promote.class_names.clear();
  promote.nonce.fill(0xFF);
  v.push_back(promote);
  Hello zero_nonce = hello;  // a nonce of zeros still decodes: the decoder does not judge randomness
  zero_nonce.nonce = {};
  zero_nonce.streams.clear();
  v.push_back(zero_nonce);
  Hello other_version;  // stops after protocol_version: the receiver answers kUnsupportedVersion
  other_version.edge = "edge-old";
  other_version.protocol_version = 1;
  v.push_back(other_version);

  v.push_back(Welcome{.epoch = 8, .streams = {{"cam/1", 1, -1, -1}, {"cam/2", 7, 41, 57}}});

  Report event;
  event.edge = "edge-a";
  event.stream = "cam/1";
  event.run = 1;
  event.seq_first = event.seq_last = 42;
  event.epoch = 8;
  event.link_seq = 0;  // the session's first report
  event.kind = ReportKind::kEvent;
  event.severity = Severity::kWarning;
  event.capture_ns = 1700000000123456789;
  event.pts_ns = 1400000000;
  event.publish_ns = 1700000000133456789;
  event.width = 1920;
  event.height = 1080;
  event.rule = "person-in-zone";
  event.detections = {{10.5f, 20, 110.25f, 220, 0.91f, 0}, {300, 400, 500, 700, 0.55f, 2}, {0, 0, 1, 1, 0.25f, 1}};
  v.push_back(event);
  Report progress = event;
  progress.kind = ReportKind::kProgress;
  progress.severity = Severity::kNone;
  progress.seq_first = 43;
  progress.seq_last = 99;
  progress.link_seq = 1;
  progress.rule.clear();
  progress.detections.clear();
  v.push_back(progress);
  Report dropped = progress;
  dropped.kind = ReportKind::kDropped;
  dropped.seq_first = dropped.seq_last = 100;
  dropped.rule = "queue_full";
  dropped.link_seq = 2;
  dropped.severity = Severity::kInfo;
  v.push_back(dropped);
  Report lost = progress;
  lost.kind = ReportKind::kLost;
  lost.seq_first = 101;
  lost.seq_last = 120;
  lost.rule = "lost_on_restart";
  lost.link_seq = 0x0123456789ABCDEF;  // every byte of the field distinct
  v.push_back(lost);
  Report critical = event;
  critical.stream = "cam/2";
  critical.severity = Severity::kCritical;
  critical.detections.resize(1);
  critical.link_seq = ~uint64_t{0};
  v.push_back(critical);

  v.push_back(Ack{.stream = "cam/1", .run = 1, .epoch = 8, .seq_first = 42, .seq_last = 42, .contiguous_through = 42});
  v.push_back(Reject{.reason = RejectReason::kStaleEpoch, .stream = "cam/1", .run = 1, .seq_first = 43,
                     .seq_last = 99, .epoch = 9, .detail = "epoch 8 is not current (9)"});
  v.push_back(Reject{.reason = RejectReason::kInvalid, .stream = "cam/1", .run = 1, .seq_first = 7, .seq_last = 7,
                     .epoch = 8, .detail = "an event covers exactly one frame"});
  // Connection-level Rejects (empty stream).
  v.push_back(Reject{.reason = RejectReason::kFenced, .epoch = 9, .detail = "a newer session holds edge-a"});
  v.push_back(Reject{.reason = RejectReason::kUnsupportedVersion, .detail = "protocol version 1"});
  v.push_back(Reject{.reason = RejectReason::kProtocolError, .detail = "bad magic"});
  v.push_back(Reject{.reason = RejectReason::kUnauthenticated, .detail = "Auth does not prove the key of edge-a"});
  v.push_back(Heartbeat{.sent_ns = 1700000000200000000});

  // Authentication: the aggregator's Challenge and the edge's Auth, each with a proof (HMAC-SHA256, 32
  // bytes) and without (no key on that side).
  Challenge challenge;
  for (size_t i = 0; i < kNonceBytes; ++i) challenge.nonce[i] = static_cast<uint8_t>(0x11 * (i % 16));
  for (size_t i = 0; i < kProofBytes; ++i) challenge.proof.push_back(static_cast<char>(0xC0 + i));
  v.push_back(challenge);
  Challenge unauthenticated = challenge;
  unauthenticated.proof.clear();
  v.push_back(unauthenticated);
  Auth auth;
  for (size_t i = 0; i < kProofBytes; ++i) auth.proof.push_back(static_cast<char>(0x5A ^ i));
  v.push_back(auth);
  v.push_back(Auth{});
  // cuda_ipc: the ring offer after the Welcome (and one that says why there is none), the edge's accept.
  v.push_back(RingOffer{.memory = "cuda", .device = "0000:17:00.0", .handle = std::string(64, '\x5a'),
                        .control = "/vigil-ring-0123456789abcdef-ctl", .slots = 64, .slot_bytes = 65536});
  v.push_back(RingOffer{.error = "cuda:3: no such device"});
  v.push_back(RingAccept{});
  // Snapshots: a frame picture and a crop (a tiny JPEG-looking body: the decoder checks the start of image only).
  v.push_back(Snapshot{.stream = "cam/1", .run = 1, .seq = 42, .box = -1, .x = 0, .y = 0, .width = 1920,
                       .height = 1080, .out_width = 640, .out_height = 360,
                       .jpeg = std::string("\xFF\xD8\xFF\xE0\x00\x10JFIF\x00\xFF\xD9", 14)});
  v.push_back(Snapshot{.stream = "cam/1", .run = 1, .seq = 42, .box = 2, .x = 300, .y = 400, .width = 200,
                       .height = 300, .out_width = 200, .out_height = 300,
                       .jpeg = std::string("\xFF\xD8\xFF\xDB\xFF\xD9", 6)});
  v.push_back(SourceStates{{{"cam/1", SourceState::kStreaming}, {"cam/2", SourceState::kReconnecting},
                            {"file", SourceState::kEnded}}});
  return v;
}

// The frame of the n-th message of type T in `v`.
template <typename T>
std::string Nth(const std::vector<Message>& v, size_t n) {
  for (const Message& m : v) {
    if (std::holds_alternative<T>(m) && n-- == 0) return EncodeFrame(m);
  }
  std::fprintf(stderr, "make_corpus: ValidMessages() lacks the message Nth asks for\n");
  std::exit(1);
}

// The frame of the Reject with `reason` in `v`.
std::string RejectFrame(const std::vector<Message>& v, RejectReason reason) {
  for (const Message& m : v) {
    if (const Reject* r = std::get_if<Reject>(&m); r && r->reason == reason) return EncodeFrame(m);
  }
  std::fprintf(stderr, "make_corpus: ValidMessages() lacks a Reject with reason %s\n", ToString(reason).data());
  std::exit(1);
}

uint32_t BodyLength(const std::string& frame) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(frame[8 + i])) << (8 * i);
  return v;
}

// `frame` with its body replaced by `body`, body_length and CRC rewritten to match.
std::string WithBody(const std::string& frame, const std::string& body) {
  std::string f = frame.substr(0, kHeaderBytes);
  for (int i = 0; i < 4; ++i) f[8 + i] = static_cast<char>((body.size() >> (8 * i)) & 0xFF);
  const uint32_t crc = Crc32(body, Crc32(std::string_view(f).substr(0, 12)));
  for (int i = 0; i < 4; ++i) f[12 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
  return f + body;
}

// `frame` with body byte `at` set to `value`.
std::string WithBodyByte(const std::string& frame, size_t at, uint8_t value) {
  std::string body = frame.substr(kHeaderBytes, BodyLength(frame));
  body.at(at) = static_cast<char>(value);
  return WithBody(frame, body);
}

// `frame` with the proof at body offset `at` (u8 length, bytes) replaced by `length` bytes of proof, so that
// only the length rule is wrong, not the byte count.
std::string WithProofLength(const std::string& frame, size_t at, size_t length) {
  std::string body = frame.substr(kHeaderBytes, BodyLength(frame)).substr(0, at);
  body.push_back(static_cast<char>(length));
  body.append(length, '\x5A');
  return WithBody(frame, body);
}

// One frame per Message alternative, default-constructed (several do not decode: empty ids, epoch 0).
template <size_t... I>
std::vector<std::string> DefaultFrames(std::index_sequence<I...>) {
  return {EncodeFrame(Message(std::in_place_index<I>))...};
}

}  // namespace
}  // namespace vigil::transport

int main(int argc, char** argv) {
  using namespace vigil::transport;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::vector<Message> valid = ValidMessages();
  std::vector<std::string> seeds;
  std::string all;
  for (const Message& m : valid) {
    seeds.push_back(EncodeFrame(m));
    all += seeds.back();
  }
  for (std::string& f : DefaultFrames(std::make_index_sequence<std::variant_size_v<Message>>())) {
    seeds.push_back(std::move(f));
  }
  // Concatenations: a session's exchange in both directions (Hello, Challenge, Auth, Welcome, then reports),
  // a refused handshake, and every valid frame in one stream.
  const std::string hello = Nth<Hello>(valid, 0), welcome = Nth<Welcome>(valid, 0), event = Nth<Report>(valid, 0),
                    progress = Nth<Report>(valid, 1), ack = Nth<Ack>(valid, 0), beat = Nth<Heartbeat>(valid, 0),
                    challenge = Nth<Challenge>(valid, 0), auth = Nth<Auth>(valid, 0),
                    unauthenticated = RejectFrame(valid, RejectReason::kUnauthenticated);
  seeds.push_back(hello + auth + event + progress + beat);
  seeds.push_back(challenge + welcome + ack + ack + beat);
  seeds.push_back(challenge + unauthenticated);
  seeds.push_back(all);
  // Truncations: inside the header, inside a body, a frame followed by part of the next.
  seeds.push_back(event.substr(0, kHeaderBytes - 6));
  seeds.push_back(event.substr(0, event.size() / 2));
  seeds.push_back(hello + welcome.substr(0, kHeaderBytes + 5));
  seeds.push_back(all.substr(0, all.size() - 3));

  int status = 0;
  // Frames one byte past a decoder rule, CRC intact: each must fail to decode (the generator checks it, so
  // a rule that moves, as the Reject reasons did when kUnauthenticated came, is noticed here).
  const std::vector<std::string> invalid = {
      WithBodyByte(unauthenticated, 0, static_cast<uint8_t>(RejectReason::kUnauthenticated) + 1),  // reason 7
      WithBodyByte(unauthenticated, 0, 0),                                                          // reason 0
      WithProofLength(challenge, kNonceBytes, kProofBytes - 1),
      WithProofLength(challenge, kNonceBytes, kProofBytes + 1),
      WithProofLength(auth, 0, 1),
      WithBody(challenge, challenge.substr(kHeaderBytes, challenge.size() - kHeaderBytes - 1)),  // proof short
      // flags, after edge (u16 length + bytes), epoch and protocol_version
      WithBodyByte(hello, 2 + std::get<Hello>(valid[0]).edge.size() + 8 + 2, kHelloPromote << 1),
  };
  for (const std::string& f : invalid) {
    if (DecodeFrame(f).ok()) {
      std::fprintf(stderr, "make_corpus: invalid seed %zu decodes: its rule moved\n", seeds.size());
      status = 1;
    }
    seeds.push_back(f);
  }

  // Every alternative needs a seed that decodes to it.
  std::vector<bool> covered(std::variant_size_v<Message>);
  for (const std::string& s : seeds) {
    if (vigil::StatusOr<Message> m = DecodeFrame(s); m.ok()) covered[m->index()] = true;
  }
  for (size_t i = 0; i < covered.size(); ++i) {
    if (!covered[i]) {
      std::fprintf(stderr, "make_corpus: no seed decodes to Message alternative %zu: add one to ValidMessages()\n", i);
      status = 1;
    }
  }
  for (size_t i = 0; i < seeds.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/seed-%03zu", i);
    std::ofstream out(argv[1] + std::string(name), std::ios::binary);
    out << seeds[i];
    if (!out.flush()) {
      std::fprintf(stderr, "make_corpus: cannot write %s%s\n", argv[1], name);
      return 1;
    }
  }
  std::printf("make_corpus: %zu seeds in %s\n", seeds.size(), argv[1]);
  return status;
}
