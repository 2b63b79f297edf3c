#include "vigil/transport/protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

namespace vigil::transport {
namespace {

std::string Message_(const Status& s) { return std::string(s.message()); }

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A frame built independently of AppendFrame, from the layout documented in protocol.h.
std::string MakeFrame(uint8_t type, const std::string& body, uint8_t version = kProtocolVersion) {
  std::string f = "VGIL";
  f.push_back(static_cast<char>(version));
  f.push_back(static_cast<char>(type));
  PutLe(&f, 0, 2);
  PutLe(&f, body.size(), 4);
  PutLe(&f, Crc32(body, Crc32(f)), 4);
  return f + body;
}

Report RandomReport(std::mt19937_64& rng) {
  Report r;
  r.edge = "edge-" + std::to_string(rng() % 100);
  r.stream = "cam/" + std::to_string(rng() % 1000);
  r.run = rng();
  r.epoch = rng();
  r.seq_first = rng() >> 1;
  r.kind = static_cast<ReportKind>(1 + rng() % 4);  // event, progress, dropped, lost
  r.seq_last = r.kind == ReportKind::kEvent ? r.seq_first : r.seq_first + rng() % 100;
  r.severity = static_cast<Severity>(rng() % 4);
  r.capture_ns = static_cast<int64_t>(rng());
  r.pts_ns = -static_cast<int64_t>(rng() % 1000000);
  r.publish_ns = static_cast<int64_t>(rng() >> 2);
  r.width = static_cast<uint32_t>(rng() % 4000);
  r.height = static_cast<uint32_t>(rng() % 3000);
  if (r.kind == ReportKind::kEvent) {
    r.rule = "person-in-zone";
    std::uniform_real_distribution<float> u(0, 1000);
    for (uint64_t i = rng() % 5; i > 0; --i) {
      r.detections.push_back({u(rng), u(rng), u(rng), u(rng), u(rng) / 1000, static_cast<float>(rng() % 80)});
    }
  } else if (r.kind == ReportKind::kDropped) {
    r.rule = "queue_full";
  } else if (r.kind == ReportKind::kLost) {
    r.rule = "lost_on_restart";
  }
  return r;
}

TEST(ProtocolTest, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);  // CRC-32/ISO-HDLC check value
  EXPECT_EQ(Crc32(""), 0u);
  EXPECT_EQ(Crc32("6789", Crc32("12345")), 0xCBF43926u);  // incremental
}

TEST(ProtocolTest, HeartbeatFrameHasTheDocumentedBytes) {
  const std::string f = EncodeFrame(Heartbeat{0x0102030405060708});
  const std::string body("\x08\x07\x06\x05\x04\x03\x02\x01", 8);
  EXPECT_EQ(f, MakeFrame(5, body));
  ASSERT_EQ(f.size(), 24u);
  EXPECT_EQ(f.substr(0, 12), std::string("VGIL\x04\x05\x00\x00\x08\x00\x00\x00", 12));
}

TEST(ProtocolTest, ReportFieldOrderMatchesTheDocumentedLayout) {
  Report r;
  r.edge = "e";
  r.stream = "s";
  r.run = 2;
  r.seq_first = r.seq_last = 3;
  r.epoch = 4;
  r.link_seq = 9;
  r.kind = ReportKind::kEvent;
  r.severity = Severity::kCritical;
  r.capture_ns = 5;
  r.pts_ns = -1;
  r.publish_ns = 6;
  r.width = 640;
  r.height = 480;
  r.rule = "r";
  r.detections.push_back({1.0f, 2.0f, 3.0f, 4.0f, 0.5f, 7.0f});
  std::string body;
  auto str = [&](const std::string& s) {
    PutLe(&body, s.size(), 2);
    body += s;
  };
  str("e");
  str("s");
  PutLe(&body, 2, 8);
  PutLe(&body, 3, 8);
  PutLe(&body, 3, 8);
  PutLe(&body, 4, 8);
  PutLe(&body, 9, 8);  // link_seq
  PutLe(&body, 1, 1);  // event
  PutLe(&body, 3, 1);  // critical
  PutLe(&body, 5, 8);
  PutLe(&body, ~uint64_t{0}, 8);  // -1
  PutLe(&body, 6, 8);
  PutLe(&body, 640, 4);
  PutLe(&body, 480, 4);
  str("r");
  PutLe(&body, 1, 4);  // one detection: x1, y1, x2, y2, score, class as f32
  for (uint32_t bits : {0x3F800000u, 0x40000000u, 0x40400000u, 0x40800000u, 0x3F000000u, 0x40E00000u}) {
    PutLe(&body, bits, 4);
  }
  ASSERT_EQ(body.size(), 2 + 1 + 2 + 1 + 8 * 5 + 1 + 1 + 8 * 3 + 4 + 4 + 2 + 1 + 4 + 24u);
  EXPECT_EQ(EncodeFrame(r), MakeFrame(2, body));
  StatusOr<Message> back = DecodeFrame(MakeFrame(2, body));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<Report>(*back), r);
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<Message> messages = {
      Hello{"edge-a", rng(), kProtocolVersion},
      Hello{"edge-b", 0, kProtocolVersion, kHelloPromote, {"person", "", "traffic light"},
            {{"cam0", 3}, {"cam/1", rng()}}, Nonce{1, 2, 3}},
      Welcome{rng() | 1, {}},
      Welcome{42, {{"cam0", 3, 99, 120}, {"cam/1", 7, -1, -1}}},
      Reject{RejectReason::kFenced, "", 0, 0, 0, 12, "edge-b holds epoch 12"},
      Reject{RejectReason::kUnsupportedVersion, "", 0, 0, 0, 0, "v3"},
      Ack{"cam0", rng(), rng(), 10, 19, 19},
      Ack{"cam1", 1, 1, 0, 0, -1},
      Reject{RejectReason::kStaleEpoch, "cam0", 1, 5, 5, 9, "epoch 3 < 9"},
      Heartbeat{static_cast<int64_t>(rng())},
      Snapshot{"cam0", rng(), 17, -1, 0, 0, 1920, 1080, 640, 360, std::string("\xFF\xD8\xFF\xE0jfif", 8)},
      Snapshot{"cam/1", 3, rng() >> 1, 4, 100, 50, 30, 60, 30, 60, std::string(70000, '\xFF').replace(1, 1, "\xD8")},
      SourceStates{{{"cam0", SourceState::kStreaming}, {"cam/1", SourceState::kReconnecting}, {"f", SourceState::kEnded}}},
      SourceStates{},
  };
  for (int i = 0; i < 200; ++i) messages.push_back(RandomReport(rng));
  std::string stream;
  for (const Message& m : messages) {
    StatusOr<Message> back = DecodeFrame(EncodeFrame(m));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, m);
    AppendFrame(m, &stream);
  }
  // The same messages through the incremental decoder, fed in random-sized pieces.
  FrameDecoder d;
  size_t pos = 0, got = 0;
  while (pos < stream.size()) {
    const size_t n = std::min<size_t>(stream.size() - pos, 1 + rng() % 97);
    d.Feed(std::string_view(stream).substr(pos, n));
    pos += n;
    for (;;) {
      StatusOr<std::optional<Message>> m = d.Next();
      ASSERT_TRUE(m.ok()) << m.status();
      if (!*m) break;
      ASSERT_LT(got, messages.size());
      EXPECT_EQ(**m, messages[got]);
      ++got;
    }
  }
  EXPECT_EQ(got, messages.size());
  EXPECT_EQ(d.pending(), 0u);
}

TEST(ProtocolTest, EveryCorruptedByteIsDetected) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Report r = RandomReport(rng);
  r.kind = ReportKind::kEvent;
  r.seq_last = r.seq_first;
  r.detections.push_back({1, 2, 3, 4, 0.9f, 2});
  const std::string frame = EncodeFrame(r);
  for (size_t i = 0; i < frame.size(); ++i) {
    std::string bad = frame;
    bad[i] = static_cast<char>(bad[i] ^ (1 + rng() % 255));
    StatusOr<Message> m = DecodeFrame(bad);
    EXPECT_FALSE(m.ok()) << "byte " << i << " changed and not detected";
  }
}

TEST(ProtocolTest, TruncatedFramesAreNamed) {
  const std::string frame = EncodeFrame(Ack{"cam0", 1, 2, 3, 4, 4});
  for (size_t n = 0; n < frame.size(); ++n) {
    StatusOr<Message> m = DecodeFrame(frame.substr(0, n));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(Message_(m.status()).find("truncated"), std::string::npos) << m.status();
  }
  EXPECT_EQ(Message_(DecodeFrame(frame.substr(0, 5)).status()), "frame truncated: 5 bytes, a header needs 16");
  EXPECT_EQ(Message_(DecodeFrame(frame.substr(0, 20)).status()),
            StrCat("frame truncated: the header says ", frame.size() - 16, " body bytes, 4 present"));
  EXPECT_EQ(Message_(DecodeFrame(frame + "x").status()), "frame: 1 bytes after the frame");
}

TEST(ProtocolTest, HeaderErrorsAreClear) {
  const std::string hb = EncodeFrame(Heartbeat{1});
  StatusOr<Message> m = DecodeFrame("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(Message_(m.status()),
            "frame: bad magic 0x20544547 (expected 0x4C494756 'VGIL'): not a vigil report stream");

  m = DecodeFrame(MakeFrame(5, hb.substr(16), 1));  // a version 1 frame
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message_(m.status()), "frame: protocol version 1 not supported (this side speaks 4)");
  // The incremental decoder says the same at the first header.
  FrameDecoder d;
  d.Feed(MakeFrame(2, "anything", 1));
  EXPECT_EQ(d.Next().status().code(), absl::StatusCode::kUnimplemented);

  std::string crc = hb;
  crc[20] ^= 1;
  m = DecodeFrame(crc);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Message_(m.status()).starts_with("frame: CRC-32 mismatch")) << m.status();

  std::string huge = hb.substr(0, 16);
  huge[8] = huge[9] = huge[10] = huge[11] = '\x7F';
  m = DecodeFrame(huge);
  EXPECT_EQ(Message_(m.status()), "frame: body length 2139062143 exceeds the limit 1048576");

  m = DecodeFrame(MakeFrame(13, ""));
  EXPECT_EQ(Message_(m.status()), "frame: unknown message type 13");
  m = DecodeFrame(MakeFrame(9, ""));  // RingOffer with no body
  EXPECT_EQ(Message_(m.status()), "RingOffer body: field 'memory' truncated (needs 2 bytes, 0 left)");
}

TEST(ProtocolTest, MalformedBodiesWithValidChecksumsAreRejected) {
  // A Report cut after the edge id: the decoder names the missing field.
  std::string body;
  PutLe(&body, 1, 2);
  body += "e";
  PutLe(&body, 10, 2);
  body += "cam";
  StatusOr<Message> m = DecodeFrame(MakeFrame(2, body));
  EXPECT_EQ(Message_(m.status()), "Report body: field 'stream' truncated (needs 10 bytes, 3 left)");

  // A hostile detection count fails before any allocation.
  Report r;
  r.edge = "e";
  r.stream = "s";
  std::string frame = EncodeFrame(r);
  std::string rb = frame.substr(16);
  rb.replace(rb.size() - 4, 4, std::string("\x00\xCA\x9A\x3B", 4));  // 1e9
  m = DecodeFrame(MakeFrame(2, rb));
  EXPECT_EQ(Message_(m.status()), "Report body: detection_count 1000000000 does not fit the 0 bytes left");

  // Field rules are checked after decoding: encode seq 4..5, then swap the two fields in the body.
  r.seq_first = 4;
  r.seq_last = 5;
  std::string ib = EncodeFrame(r).substr(16);
  // edge (2+1 bytes) + stream (2+1) + run (8): seq_first at offset 14, seq_last at 22
  std::swap_ranges(ib.begin() + 14, ib.begin() + 22, ib.begin() + 22);
  m = DecodeFrame(MakeFrame(2, ib));
  EXPECT_EQ(Message_(m.status()), "Report body: report e/s run 0 seq 5..4: seq_first > seq_last");

  m = DecodeFrame(MakeFrame(1, EncodeFrame(Hello{"", 1, kProtocolVersion}).substr(16)));
  EXPECT_EQ(Message_(m.status()), "Hello body: Hello of edge '': edge id must be 1..65535 bytes");

  m = DecodeFrame(MakeFrame(5, std::string(9, '\0')));
  EXPECT_EQ(Message_(m.status()), "Heartbeat body: 1 unexpected bytes after the last field");
}

// Counts that cannot fit the bytes that follow fail before the decoder reserves anything for them
// (a 2^32 - 1 count of 24-byte rows would otherwise ask for ~100 GB).
TEST(ProtocolTest, HostileCountsAreRejectedBeforeAllocating) {
  Report r;
  r.edge = "e";
  r.stream = "s";
  std::string rb = EncodeFrame(r).substr(16);
  rb.replace(rb.size() - 4, 4, std::string("\xFF\xFF\xFF\xFF", 4));
  EXPECT_EQ(Message_(DecodeFrame(MakeFrame(2, rb)).status()),
            "Report body: detection_count 4294967295 does not fit the 0 bytes left");
  rb.replace(rb.size() - 4, 4, std::string("\x11\x27\x00\x00", 4));  // 10001 > kMaxDetections
  rb += std::string(10001 * 24, '\0');
  EXPECT_EQ(Message_(DecodeFrame(MakeFrame(2, rb)).status()),
            "Report body: detection_count 10001 does not fit the 240024 bytes left");

  // Hello: class_count, then stream_count.
  std::string hb = EncodeFrame(Hello{"e", 1, kProtocolVersion}).substr(16);  // ..., u8 flags, u32 0, u32 0
  std::string classes = hb;
  classes.replace(classes.size() - 8, 4, std::string("\xFF\xFF\xFF\x7F", 4));
  EXPECT_EQ(Message_(DecodeFrame(MakeFrame(1, classes)).status()),
            "Hello body: class_count 2147483647 does not fit the 4 bytes left");
  std::string streams = hb;
  streams.replace(streams.size() - 4, 4, std::string("\x00\x00\x00\x01", 4));
  EXPECT_EQ(Message_(DecodeFrame(MakeFrame(1, streams)).status()),
            "Hello body: stream_count 16777216 does not fit the 0 bytes left");

  std::string wb = EncodeFrame(Welcome{1, {}}).substr(16);  // u64 epoch, u32 0
  wb.replace(8, 4, std::string("\xFF\xFF\x00\x00", 4));
  wb += std::string(100, '\0');
  EXPECT_EQ(Message_(DecodeFrame(MakeFrame(6, wb)).status()),
            "Welcome body: stream_count 65535 does not fit the 100 bytes left");
}

TEST(ProtocolTest, WelcomeWithEpochZeroIsRefused) {
  EXPECT_EQ(Message_(DecodeFrame(EncodeFrame(Welcome{0, {}})).status()), "Welcome body: epoch 0 (epochs start at 1)");
}

TEST(ProtocolTest, AReportFrameIsStampedWithTheSessionsIdentityAndTheGivenRows) {
  Report r;  // as the Outbox holds it: no edge id, no epoch
  r.stream = "cam";
  r.run = 4;
  r.seq_first = r.seq_last = 9;
  r.kind = ReportKind::kEvent;
  r.detections = {{1, 2, 3, 4, 0.5f, 7}};  // ignored: the rows given below are sent
  EXPECT_EQ(Message_(ValidateReport(r)), "report /cam run 4 seq 9..9: empty edge or stream id");
  EXPECT_TRUE(ValidateReportFields(r).ok());
  const std::vector<ReportDetection> rows = {{10, 20, 30, 40, 0.9f, 2}, {5, 6, 7, 8, 0.4f, 0}};
  std::string frame;
  AppendReportFrame(r, "edge-1", 12, 77, rows, &frame);
  StatusOr<Message> m = DecodeFrame(frame);
  ASSERT_TRUE(m.ok()) << m.status();
  Report want = r;
  want.edge = "edge-1";
  want.epoch = 12;
  want.link_seq = 77;
  want.detections = rows;
  EXPECT_EQ(std::get<Report>(*m), want);
  Report anonymous = r;
  anonymous.stream.clear();
  EXPECT_FALSE(ValidateReportFields(anonymous).ok());
}

TEST(ProtocolTest, ValidateReportRules) {
  Report r;
  r.edge = "e";
  r.stream = "s";
  EXPECT_TRUE(ValidateReport(r).ok());
  Report event = r;
  event.kind = ReportKind::kEvent;
  event.seq_last = 1;
  EXPECT_EQ(Message_(ValidateReport(event)), "report e/s run 0 seq 0..1: an event covers exactly one frame");
  event.seq_last = 0;
  EXPECT_TRUE(ValidateReport(event).ok());
  Report progress = r;
  progress.detections.push_back({});
  EXPECT_EQ(Message_(ValidateReport(progress)), "report e/s run 0 seq 0..0: a progress report carries no detections");
  Report dropped = progress;
  dropped.kind = ReportKind::kDropped;
  EXPECT_EQ(Message_(ValidateReport(dropped)), "report e/s run 0 seq 0..0: a dropped report carries no detections");
  dropped.detections.clear();
  dropped.seq_last = 9;
  dropped.rule = "backpressure";
  EXPECT_TRUE(ValidateReport(dropped).ok());
  // Ids and rules are text: UTF-8 (the stores keep them as text), no NUL.
  Report text = r;
  text.stream = "Tor \xc3\xb6stlich \xe2\x86\x92 \xf0\x9f\x9a\xaa";  // "Tor östlich → 🚪"
  EXPECT_TRUE(ValidateReport(text).ok());
  for (const std::string& bad : {std::string("cam\xff"), std::string("cam\0x", 5), std::string("\xc0\xaf"),
                                std::string("\xed\xa0\x80"), std::string("\xe2\x86")}) {
    text.stream = bad;
    EXPECT_TRUE(Message_(ValidateReport(text)).ends_with("edge id, stream id and rule must be UTF-8 text without NUL bytes"))
        << ValidateReport(text);
  }
  Report lost = dropped;
  lost.kind = ReportKind::kLost;
  EXPECT_TRUE(ValidateReport(lost).ok());
  Report unknown = r;
  unknown.kind = static_cast<ReportKind>(9);
  EXPECT_EQ(Message_(ValidateReport(unknown)), "report e/s run 0 seq 0..0: unknown kind 9");
  Report severity = r;
  severity.severity = static_cast<Severity>(4);
  EXPECT_EQ(Message_(ValidateReport(severity)), "report e/s run 0 seq 0..0: unknown severity 4");
  Report backwards = r;
  backwards.seq_first = 2;
  backwards.seq_last = 1;
  EXPECT_EQ(Message_(ValidateReport(backwards)), "report e/s run 0 seq 2..1: seq_first > seq_last");

  Report nan = event;
  nan.detections.push_back({0, 0, 1, 1, std::nanf(""), 0});
  EXPECT_EQ(Message_(ValidateReport(nan)),
            "report e/s run 0 seq 0..0: a detection has a non-finite score or coordinate");
  Report inf = event;
  inf.detections.push_back({0, 0, INFINITY, 1, 0.5f, 0});
  EXPECT_FALSE(ValidateReport(inf).ok());
  // Class ids: integers in [0, 2^24), as the float column of the DetectionTensor holds them exactly.
  for (float c : {0.0f, 1.0f, 79.0f, 16777215.0f}) {
    Report ok = event;
    ok.detections.push_back({0, 0, 1, 1, 0.5f, c});
    EXPECT_TRUE(ValidateReport(ok).ok()) << c;
  }
  for (float c : {-1.0f, 2.5f, 16777216.0f, std::nanf(""), INFINITY}) {
    Report bad = event;
    bad.detections.push_back({0, 0, 1, 1, 0.5f, c});
    EXPECT_TRUE(Message_(ValidateReport(bad)).ends_with(", not an integer in [0, 2^24)")) << c;
  }
  Report too_many = event;
  too_many.detections.resize(kMaxDetections + 1);
  EXPECT_EQ(Message_(ValidateReport(too_many)), "report e/s run 0 seq 0..0: 10001 detections, more than 10000");
  Report anonymous = r;
  anonymous.stream.clear();
  EXPECT_EQ(Message_(ValidateReport(anonymous)), "report e/ run 0 seq 0..0: empty edge or stream id");
  Report long_rule = r;
  long_rule.rule.assign(65536, 'x');
  EXPECT_EQ(Message_(ValidateReport(long_rule)), "report e/s run 0 seq 0..0: string over 65535 bytes");
}

TEST(ProtocolTest, SnapshotFieldOrderMatchesTheDocumentedLayout) {
  const std::string jpeg("\xFF\xD8\xFF\xD9", 4);
  std::string body;
  body += std::string("\x02\x00" "c0", 4);                         // stream
  body += std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8);  // run 7
  body += std::string("\x09\x00\x00\x00\x00\x00\x00\x00", 8);  // seq 9
  body += std::string("\x02\x00\x00\x00", 4);                    // box 2
  body += std::string("\x0a\x00\x00\x00\x14\x00\x00\x00", 8);  // x 10, y 20
  body += std::string("\x1e\x00\x00\x00\x28\x00\x00\x00", 8);  // width 30, height 40
  body += std::string("\x0f\x00\x00\x00\x14\x00\x00\x00", 8);  // out 15 x 20
  body += std::string("\x04\x00\x00\x00", 4) + jpeg;             // jpeg_length, jpeg
  const Snapshot s{"c0", 7, 9, 2, 10, 20, 30, 40, 15, 20, jpeg};
  EXPECT_EQ(EncodeFrame(s), MakeFrame(11, body));
  StatusOr<Message> back = DecodeFrame(MakeFrame(11, body));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<Snapshot>(*back), s);
  EXPECT_EQ(MessageName(*back), "Snapshot");
  // A jpeg_length beyond the body is named, not allocated.
  std::string hostile = body.substr(0, body.size() - 8) + std::string("\xff\xff\xff\x7f", 4);
  StatusOr<Message> m = DecodeFrame(MakeFrame(11, hostile));
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), testing::HasSubstr("jpeg_length 2147483647 does not fit"));
}

TEST(ProtocolTest, ValidateSnapshotRules) {
  const Snapshot good{"cam", 1, 2, -1, 0, 0, 640, 480, 320, 240, std::string("\xFF\xD8\xFF\xDB", 4)};
  EXPECT_TRUE(ValidateSnapshot(good).ok());
  auto reason = [&](auto mutate) {
    Snapshot s = good;
    mutate(s);
    Status st = ValidateSnapshot(s);
    return st.ok() ? std::string("OK") : std::string(st.message());
  };
  using testing::HasSubstr;
  EXPECT_THAT(reason([](Snapshot& s) { s.stream.clear(); }), HasSubstr("stream id must be 1..65535 bytes"));
  EXPECT_THAT(reason([](Snapshot& s) { s.stream = std::string("a\0b", 3); }), HasSubstr("without NUL"));
  EXPECT_THAT(reason([](Snapshot& s) { s.seq = kMaxSeq; }), HasSubstr("is not below 2^63"));
  EXPECT_THAT(reason([](Snapshot& s) { s.box = -2; }), HasSubstr("box -2 is neither -1"));
  EXPECT_THAT(reason([](Snapshot& s) { s.box = 10000; }), HasSubstr("box 10000 is neither -1"));
  EXPECT_THAT(reason([](Snapshot& s) { s.width = 0; }), HasSubstr("region 0x480"));
  EXPECT_THAT(reason([](Snapshot& s) { s.out_height = 70000; }), HasSubstr("picture 320x70000"));
  EXPECT_THAT(reason([](Snapshot& s) { s.jpeg.clear(); }), HasSubstr("0 JPEG bytes"));
  EXPECT_THAT(reason([](Snapshot& s) { s.jpeg = std::string(kMaxSnapshotBytes + 1, '\xFF'); }), HasSubstr("JPEG bytes, not 1.."));
  EXPECT_THAT(reason([](Snapshot& s) { s.jpeg = "\x89PNG"; }), HasSubstr("not a JPEG"));
  EXPECT_EQ(reason([](Snapshot& s) { s.box = 9999; }), "OK");
  // The largest snapshot fits a frame with the longest stream id.
  Snapshot big = good;
  big.stream = std::string(65535, 's');
  big.jpeg = std::string(kMaxSnapshotBytes, '\xFF');
  big.jpeg[1] = '\xD8';
  ASSERT_TRUE(ValidateSnapshot(big).ok());
  StatusOr<Message> back = DecodeFrame(EncodeFrame(big));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<Snapshot>(*back), big);
}

TEST(ProtocolTest, SourceStatesLayoutAndRules) {
  const SourceStates s{{{"c0", SourceState::kReconnecting}, {"c1", SourceState::kEnded}}};
  const std::string body("\x02\x00\x00\x00" "\x02\x00" "c0" "\x03" "\x02\x00" "c1" "\x04", 14);
  EXPECT_EQ(EncodeFrame(s), MakeFrame(12, body));
  StatusOr<Message> back = DecodeFrame(MakeFrame(12, body));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<SourceStates>(*back), s);
  EXPECT_EQ(ToString(SourceState::kReconnecting), "reconnecting");
  // A state past the last is named; a hostile count is refused before allocating.
  std::string bad = body;
  bad[13] = 7;
  StatusOr<Message> m = DecodeFrame(MakeFrame(12, bad));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("stream 'c1': unknown state 7"), std::string::npos) << m.status();
  m = DecodeFrame(MakeFrame(12, std::string("\xff\xff\x00\x00", 4)));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("count 65535 does not fit"), std::string::npos) << m.status();
  EXPECT_FALSE(ValidateSourceStates(SourceStates{{{"", SourceState::kIdle}}}).ok());
  EXPECT_FALSE(ValidateSourceStates(SourceStates{{{std::string("a\0", 2), SourceState::kIdle}}}).ok());
}

TEST(ProtocolTest, ValidateHelloRules) {
  Hello h{"edge-1", 0, kProtocolVersion, kHelloPromote, {"person", "car"}, {{"cam0", 1}}};
  EXPECT_TRUE(ValidateHello(h).ok());
  Hello anonymous = h;
  anonymous.edge.clear();
  EXPECT_EQ(Message_(ValidateHello(anonymous)), "Hello of edge '': edge id must be 1..65535 bytes");
  Hello flags = h;
  flags.flags = 2;
  EXPECT_EQ(Message_(ValidateHello(flags)), "Hello of edge 'edge-1': unknown flags 2");
  Hello stream = h;
  stream.streams.push_back({"", 1});
  EXPECT_EQ(Message_(ValidateHello(stream)), "Hello of edge 'edge-1': a stream id must be 1..65535 bytes");
  Hello classes = h;
  classes.class_names.resize(kMaxClasses + 1);
  EXPECT_EQ(Message_(ValidateHello(classes)), "Hello of edge 'edge-1': 65536 class names, more than 65535");
  Hello name = h;
  name.class_names.push_back(std::string(65536, 'c'));
  EXPECT_EQ(Message_(ValidateHello(name)), "Hello of edge 'edge-1': a class name over 65535 bytes");
  Hello latin1 = h;
  latin1.class_names.push_back("Stra\xdf" "e");  // ISO 8859-1, not UTF-8
  EXPECT_EQ(Message_(ValidateHello(latin1)), "Hello of edge 'edge-1': a class name is not UTF-8 text without NUL bytes");
  Hello nul_stream = h;
  nul_stream.streams.push_back({std::string("c\0", 2), 1});
  EXPECT_EQ(Message_(ValidateHello(nul_stream)), "Hello of edge 'edge-1': a stream id is not UTF-8 text without NUL bytes");
  Hello big = h;  // 20 names of 60000 bytes: each fits, the body does not
  big.class_names.assign(20, std::string(60000, 'c'));
  EXPECT_TRUE(Message_(ValidateHello(big)).ends_with("over the 1048576 limit")) << ValidateHello(big);
  // 40000 streams fit a Hello (~520 KB) but not the Welcome that lists them with their cursors (~1.2 MB).
  Hello streams = h;
  for (int i = 0; i < 40000; ++i) streams.streams.push_back({StrCat("cam", i), 1});
  EXPECT_TRUE(EncodeFrame(streams).size() < kMaxBodyBytes);
  EXPECT_TRUE(Message_(ValidateHello(streams)).starts_with("Hello of edge 'edge-1': its streams make a Welcome of "))
      << ValidateHello(streams);
  // A Hello that validates always encodes into a frame that decodes back.
  StatusOr<Message> back = DecodeFrame(EncodeFrame(h));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<Hello>(*back), h);
}

}  // namespace
}  // namespace vigil::transport

namespace vigil::transport {
namespace {

TEST(ProtocolTest, AReportNamesItsFirstFrameAsAFrameKey) {
  Report r;
  r.edge = "line-3";
  r.stream = "cam-7";
  r.run = 4;
  r.seq_first = 120;
  r.seq_last = 129;
  const FrameKey k = r.first_frame();
  EXPECT_EQ(k, (FrameKey{"line-3", "cam-7", 4, 120}));
  EXPECT_EQ(k.ToString(), "line-3/cam-7/4/120");
  Report next = r;
  next.seq_first = 130;
  EXPECT_LT(k, next.first_frame());
  EXPECT_TRUE(k.SameRun(next.first_frame()));
  next.run = 5;
  EXPECT_FALSE(k.SameRun(next.first_frame()));
}

}  // namespace
}  // namespace vigil::transport
