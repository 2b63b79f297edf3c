// The same-host picture ring (replication/frame_ring.h): pictures arrive in order and bit for bit, only the
// holder of the current token maps a ring, a full ring refuses at once instead of blocking the primary, a bad
// slot is rejected and counted, and what a primary wrote survives it.
#include "vigil/replication/frame_ring.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "testing/eventually.h"

namespace vigil::replication {
namespace {

using std::chrono::milliseconds;
using testutil::Eventually;

std::string SocketPath(const std::string& name) {
  return StrCat(::testing::TempDir(), "/vigil-", ::getpid(), "-", name, ".sock");
}

// A picture whose every byte depends on (seq, position): a wrong row, offset or picture shows.
struct Picture {
  MirroredFrame meta;
  std::vector<uint8_t> bgr;
  size_t stride = 0;
};
Picture MakePicture(const std::string& stream, uint64_t seq, uint32_t w, uint32_t h, size_t pad) {
  Picture p;
  p.meta.stream = stream;
  p.meta.run = 7;
  p.meta.seq = seq;
  p.meta.capture_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(seq);
  p.meta.pts_ns = static_cast<int64_t>(seq) * 33'366'667;
  p.meta.width = w;
  p.meta.height = h;
  p.stride = size_t{w} * 3 + pad;
  p.bgr.resize(p.stride * h);
  for (size_t i = 0; i < p.bgr.size(); ++i) p.bgr[i] = static_cast<uint8_t>((i * 131 + seq * 17) >> 2);
  return p;
}

struct Received {
  std::mutex mu;
  std::vector<MirroredFrame> frames;
  size_t size() {
    std::lock_guard lock(mu);
    return frames.size();
  }
};

class FrameRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FramePublisherOptions o;
    o.socket = SocketPath(::testing::UnitTest::GetInstance()->current_test_info()->name());
    StatusOr<std::unique_ptr<FramePublisher>> p = FramePublisher::Listen(o);
    ASSERT_TRUE(p.ok()) << p.status();
    publisher_ = std::move(*p);
  }
  StatusOr<std::unique_ptr<FrameRing>> Connect(const std::string& token, uint32_t slots = 4,
                                               std::function<void(MirroredFrame&&)> on_frame = {},
                                               std::function<void(FrameRingOptions&)> more = {}) {
    FrameRingOptions o;
    o.socket = publisher_->socket();
    o.token = token;
    o.slots = slots;
    o.slot_bytes = 256 << 10;
    if (more) more(o);
    o.on_frame = on_frame ? std::move(on_frame) : [this](MirroredFrame&& f) {
      std::lock_guard lock(received_.mu);
      received_.frames.push_back(std::move(f));
    };
    return FrameRing::Connect(std::move(o), milliseconds(5000));
  }
  // Writes `p`, waiting while the ring is full (the standby's reader frees slots).
  Status WriteWaiting(const Picture& p) {
    Status st;
    EXPECT_TRUE(Eventually([&] {
      st = publisher_->Write(p.meta, p.bgr.data(), p.stride);
      return !absl::IsResourceExhausted(st);
    }));
    return st;
  }

  std::unique_ptr<FramePublisher> publisher_;
  Received received_;
};

TEST_F(FrameRingTest, PicturesArriveInOrderBitForBit) {
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken());
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_TRUE(publisher_->active());
  std::vector<Picture> sent;
  for (uint64_t seq = 0; seq < 24; ++seq) {
    // Sizes and row padding vary, so a slot's leftovers from a larger picture would show.
    sent.push_back(MakePicture(seq % 2 ? "cam-b" : "cam-a", 100 + seq, 64 + 8 * (seq % 5), 48 - (seq % 3), seq % 4));
    ASSERT_TRUE(WriteWaiting(sent.back()).ok());
  }
  ASSERT_TRUE(Eventually([&] { return received_.size() == sent.size(); }));
  for (size_t i = 0; i < sent.size(); ++i) {
    const MirroredFrame& got = received_.frames[i];
    const Picture& want = sent[i];
    EXPECT_EQ(got.stream, want.meta.stream) << i;
    EXPECT_EQ(got.run, 7u);
    EXPECT_EQ(got.seq, want.meta.seq);
    EXPECT_EQ(got.capture_ns, want.meta.capture_ns);
    EXPECT_EQ(got.pts_ns, want.meta.pts_ns);
    EXPECT_EQ(got.width, want.meta.width);
    EXPECT_EQ(got.height, want.meta.height);
    EXPECT_EQ(got.stride, want.stride);
    EXPECT_TRUE(got.jpeg.empty());
    EXPECT_EQ(got.bgr, want.bgr) << "picture " << i;
  }
  EXPECT_EQ((*ring)->stats().received, 24u);
  EXPECT_EQ((*ring)->stats().rejected, 0u);
  EXPECT_EQ(publisher_->stats().written, 24u);
  EXPECT_EQ(publisher_->stats().sessions, 1u);
}

TEST_F(FrameRingTest, OnlyTheCurrentTokenMapsARing) {
  const std::string token = publisher_->NewToken();
  ASSERT_EQ(token.size(), kFrameTokenBytes);
  std::string wrong = token;
  wrong[5] ^= 1;
  StatusOr<std::unique_ptr<FrameRing>> bad = Connect(wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsUnavailable(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("wrong token"), std::string_view::npos) << bad.status();
  EXPECT_FALSE(publisher_->active());
  EXPECT_EQ(publisher_->stats().refused, 1u);
  const Picture p = MakePicture("cam", 1, 8, 8, 0);
  EXPECT_TRUE(absl::IsUnavailable(publisher_->Write(p.meta, p.bgr.data(), p.stride)));

  // The right token maps; a new pairing's token ends that session and the old token no longer works.
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(token);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_TRUE(publisher_->active());
  const std::string next = publisher_->NewToken();
  EXPECT_NE(next, token);
  EXPECT_FALSE(publisher_->active());
  EXPECT_TRUE(absl::IsUnavailable(publisher_->Write(p.meta, p.bgr.data(), p.stride)));
  EXPECT_FALSE(Connect(token).ok());
  EXPECT_TRUE(Connect(next).ok());
}

TEST_F(FrameRingTest, AFullRingRefusesAtOnceAndNothingIsLostAfter) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<uint64_t> seqs;
  // The standby's reader stalls in its callback: no slot is freed.
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken(), 4, [&](MirroredFrame&& f) {
    std::unique_lock lock(mu);
    seqs.push_back(f.seq);
    cv.wait(lock, [&] { return release; });
  });
  ASSERT_TRUE(ring.ok()) << ring.status();
  // 4 slots: the first is being read (stalled), 3 more wait; then the ring is full for every further picture.
  uint64_t written = 0, full = 0;
  for (uint64_t seq = 0; seq < 10; ++seq) {
    const Picture p = MakePicture("cam", seq, 16, 16, 0);
    Status st = publisher_->Write(p.meta, p.bgr.data(), p.stride);
    if (st.ok()) {
      ++written;
    } else {
      EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
      ++full;
    }
  }
  EXPECT_EQ(written, 4u);
  EXPECT_EQ(full, 6u);
  EXPECT_EQ(publisher_->stats().ring_full, 6u);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  ASSERT_TRUE(Eventually([&] { return (*ring)->stats().received == 4; }));
  std::lock_guard lock(mu);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1, 2, 3}));
}

// The reader takes complete slots together: not before half the ring is complete (or the oldest complete one
// waited batch_hold: 10 s here, so not in this test), then all of them; Drain takes every complete slot at once.
TEST_F(FrameRingTest, TheReaderTakesHalfARingAtOnceAndDrainTakesEverything) {
  StatusOr<std::unique_ptr<FrameRing>> ring =
      Connect(publisher_->NewToken(), 8, {}, [](FrameRingOptions& o) { o.batch_hold = std::chrono::seconds(10); });
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<Picture> sent;
  for (uint64_t seq = 0; seq < 3; ++seq) {
    sent.push_back(MakePicture("cam", seq, 16, 16, 0));
    ASSERT_TRUE(publisher_->Write(sent.back().meta, sent.back().bgr.data(), sent.back().stride).ok());
  }
  std::this_thread::sleep_for(milliseconds(50));  // the reader polls every 0.5 ms: it had its chances
  EXPECT_EQ((*ring)->stats().received, 0u) << "3 of 8 slots complete, held";
  (*ring)->Drain();
  EXPECT_EQ((*ring)->stats().received, 3u) << "Drain takes what is complete, hold or not";
  for (uint64_t seq = 3; seq < 7; ++seq) {
    sent.push_back(MakePicture("cam", seq, 16, 16, 0));
    ASSERT_TRUE(publisher_->Write(sent.back().meta, sent.back().bgr.data(), sent.back().stride).ok());
  }
  ASSERT_TRUE(Eventually([&] { return (*ring)->stats().received == 7; })) << "4 of 8 complete: taken together";
  ASSERT_EQ(received_.size(), 7u);
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(received_.frames[i].seq, sent[i].meta.seq);
    EXPECT_EQ(received_.frames[i].bgr, sent[i].bgr) << i;
  }
}

// A picture the standby does not want (acknowledged meanwhile) is released uncopied, counted, and its slot is
// free for the next: more pictures than slots go through.
TEST_F(FrameRingTest, AnUnwantedPictureIsReleasedUncopiedAndCounted) {
  std::mutex mu;
  std::vector<uint64_t> asked;
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken(), 4, {}, [&](FrameRingOptions& o) {
    o.batch_hold = milliseconds(0);
    o.wanted = [&](const MirroredFrame& f) {
      EXPECT_EQ(f.stream, "cam");
      EXPECT_EQ(f.run, 7u);
      EXPECT_EQ(f.width, 16u);
      EXPECT_TRUE(f.bgr.empty()) << "asked before the pixels are copied";
      std::lock_guard lock(mu);
      asked.push_back(f.seq);
      return f.seq % 2 == 0;
    };
  });
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<Picture> sent;
  for (uint64_t seq = 0; seq < 10; ++seq) {
    sent.push_back(MakePicture("cam", seq, 16, 16, 0));
    ASSERT_TRUE(WriteWaiting(sent.back()).ok());
  }
  ASSERT_TRUE(Eventually([&] { return (*ring)->stats().received + (*ring)->stats().unwanted == 10; }));
  EXPECT_EQ((*ring)->stats().received, 5u);
  EXPECT_EQ((*ring)->stats().unwanted, 5u);
  EXPECT_EQ((*ring)->stats().bytes, 5u * sent[0].bgr.size());
  ASSERT_EQ(received_.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(received_.frames[i].seq, 2 * i);
    EXPECT_EQ(received_.frames[i].bgr, sent[2 * i].bgr) << i;
  }
  std::lock_guard lock(mu);
  EXPECT_EQ(asked, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(FrameRingTest, ABadSlotIsRejectedAndCountedTheNextArrives) {
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken());
  ASSERT_TRUE(ring.ok()) << ring.status();
  publisher_->CorruptNextSlotsForTesting(1);
  const Picture a = MakePicture("cam", 1, 16, 16, 0), b = MakePicture("cam", 2, 16, 16, 0);
  ASSERT_TRUE(WriteWaiting(a).ok());
  ASSERT_TRUE(WriteWaiting(b).ok());
  ASSERT_TRUE(Eventually([&] { return (*ring)->stats().received + (*ring)->stats().rejected == 2; }));
  EXPECT_EQ((*ring)->stats().rejected, 1u);
  ASSERT_EQ(received_.size(), 1u);
  EXPECT_EQ(received_.frames[0].seq, 2u);
  EXPECT_EQ(received_.frames[0].bgr, b.bgr);
}

TEST_F(FrameRingTest, APictureLargerThanASlotIsRefusedNamed) {
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken());
  ASSERT_TRUE(ring.ok()) << ring.status();
  const Picture big = MakePicture("cam", 1, 320, 300, 0);  // 288,000 bytes > a 256 KiB slot
  Status st = publisher_->Write(big.meta, big.bgr.data(), big.stride);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("320x300"), std::string_view::npos) << st;
  EXPECT_EQ(publisher_->stats().too_large, 1u);
  Picture bad_stride = MakePicture("cam", 2, 16, 16, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(publisher_->Write(bad_stride.meta, bad_stride.bgr.data(), 16)));
  EXPECT_EQ(publisher_->stats().written, 0u);
}

TEST_F(FrameRingTest, WhatThePrimaryWroteOutlivesIt) {
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken(), 8);
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<Picture> sent;
  for (uint64_t seq = 0; seq < 5; ++seq) {
    sent.push_back(MakePicture("cam", seq, 32, 24, 0));
    ASSERT_TRUE(WriteWaiting(sent.back()).ok());
  }
  publisher_.reset();  // the primary gone (its mapping too)
  (*ring)->Drain();    // the takeover's drain: every slot written is read now, on this thread
  ASSERT_EQ(received_.size(), 5u);
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(received_.frames[i].bgr, sent[i].bgr);
}

TEST_F(FrameRingTest, TheStandbyGoneEndsTheSession) {
  StatusOr<std::unique_ptr<FrameRing>> ring = Connect(publisher_->NewToken());
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_TRUE(publisher_->active());
  ring->reset();
  const Picture p = MakePicture("cam", 1, 8, 8, 0);
  // Either the closed word or the socket's end tells the primary: its writes stop, not block.
  ASSERT_TRUE(Eventually([&] { return absl::IsUnavailable(publisher_->Write(p.meta, p.bgr.data(), p.stride)); }));
  EXPECT_TRUE(Eventually([&] { return !publisher_->active(); }));
}

TEST(FrameRingOptions, BadOptionsAreRefusedNamed) {
  FrameRingOptions o;
  o.socket = SocketPath("nobody");
  o.token = std::string(kFrameTokenBytes, 'x');
  o.slots = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(FrameRing::Connect(o, milliseconds(100)).status()));
  o.slots = 4;
  o.slot_bytes = 1000;
  EXPECT_TRUE(absl::IsInvalidArgument(FrameRing::Connect(o, milliseconds(100)).status()));
  o.slot_bytes = 1 << 20;
  o.batch_hold = milliseconds(-1);
  StatusOr<std::unique_ptr<FrameRing>> hold = FrameRing::Connect(o, milliseconds(100));
  EXPECT_TRUE(absl::IsInvalidArgument(hold.status())) << hold.status();
  EXPECT_NE(hold.status().message().find("batch_hold"), std::string_view::npos) << hold.status();
  o.batch_hold = milliseconds(20);
  o.token = "short";
  EXPECT_TRUE(absl::IsInvalidArgument(FrameRing::Connect(o, milliseconds(100)).status()));
  o.token = std::string(kFrameTokenBytes, 'x');
  StatusOr<std::unique_ptr<FrameRing>> none = FrameRing::Connect(o, milliseconds(100));  // nobody listens there
  EXPECT_TRUE(absl::IsUnavailable(none.status())) << none.status();
  o.memory = "gpu";
  EXPECT_TRUE(absl::IsInvalidArgument(FrameRing::Connect(o, milliseconds(100)).status()));
  o.memory = "cuda:99";  // no such GPU (or no CUDA in this build): said before anything is dialled
  StatusOr<std::unique_ptr<FrameRing>> gpu = FrameRing::Connect(o, milliseconds(100));
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find("cuda"), std::string_view::npos) << gpu.status();
}

}  // namespace
}  // namespace vigil::replication
