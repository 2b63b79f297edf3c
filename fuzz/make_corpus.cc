// Writes the seed corpus of vigil_protocol_fuzz: one valid frame of every message type (every Report kind,
// severity and Reject reason, a Hello of another protocol version), a frame of
// every Message alternative default-constructed (so a type added to Message gets a seed with its type
// byte), concatenations and truncations. Usage: vigil_protocol_corpus DIR (files seed-NNN; scripts/fuzz.sh
// corpus renames them by content hash into fuzz/corpus/protocol). Fails when a Message alternative has no
// seed that decodes: add one below when adding a message type.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
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
  v.push_back(hello);
  Hello promote = hello;
  promote.epoch = 7;
  promote.flags = kHelloPromote;
  promote.class_names.clear();
  v.push_back(promote);
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
  progress.rule.clear();
  progress.detections.clear();
  v.push_back(progress);
  Report dropped = progress;
  dropped.kind = ReportKind::kDropped;
  dropped.seq_first = dropped.seq_last = 100;
  dropped.rule = "queue_full";
  dropped.severity = Severity::kInfo;
  v.push_back(dropped);
  Report lost = progress;
  lost.kind = ReportKind::kLost;
  lost.seq_first = 101;
  lost.seq_last = 120;
  lost.rule = "lost_on_restart";
  v.push_back(lost);
  Report critical = event;
  critical.stream = "cam/2";
  critical.severity = Severity::kCritical;
  critical.detections.resize(1);
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
  v.push_back(Heartbeat{.sent_ns = 1700000000200000000});
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
  // Concatenations: a session's exchange in both directions, and every valid frame in one stream.
  const std::string hello = Nth<Hello>(valid, 0), welcome = Nth<Welcome>(valid, 0), event = Nth<Report>(valid, 0),
                    progress = Nth<Report>(valid, 1), ack = Nth<Ack>(valid, 0), beat = Nth<Heartbeat>(valid, 0);
  seeds.push_back(hello + event + progress + beat);
  seeds.push_back(welcome + ack + ack + beat);
  seeds.push_back(all);
  // Truncations: inside the header, inside a body, a frame followed by part of the next.
  seeds.push_back(event.substr(0, kHeaderBytes - 6));
  seeds.push_back(event.substr(0, event.size() / 2));
  seeds.push_back(hello + welcome.substr(0, kHeaderBytes + 5));
  seeds.push_back(all.substr(0, all.size() - 3));

  // Every alternative needs a seed that decodes to it.
  std::vector<bool> covered(std::variant_size_v<Message>);
  for (const std::string& s : seeds) {
    if (vigil::StatusOr<Message> m = DecodeFrame(s); m.ok()) covered[m->index()] = true;
  }
  int status = 0;
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
