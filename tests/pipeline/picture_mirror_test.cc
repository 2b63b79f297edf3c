// The primary's mirroring of live pictures (picture_mirror.h) with a fake channel and a fake picture ring: which
// way takes a picture, the numbering under the order lock, the unpaired keep and its flush, and "stored" (the
// Ack's cursor) observed by every way. No process, no socket, no sleep.
#include "vigil/pipeline/picture_mirror.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/video/jpeg.h"

namespace vigil::pipeline {
namespace {

// A PrimaryChannel that records what it is handed. `order` (optional): checked held at every MirrorFrame.
class FakeChannel final : public replication::PrimaryChannel {
 public:
  uint16_t port() const override { return 0; }
  replication::PrimaryChannelStats stats() const override {
    MutexLock lock(mu_);
    replication::PrimaryChannelStats s;
    s.standby_connected = paired_;
    return s;
  }
  void PublishLedger(std::vector<replication::MirroredStream>) override {}
  bool MirrorFrame(replication::MirroredFrame frame) override {
    if (order != nullptr) {
      // The reader's numbering holds the order lock while it hands the picture over (TryLock fails).
      const bool free = order->TryLock();
      if (free) order->Unlock();
      EXPECT_FALSE(free) << "MirrorFrame outside the order lock";
    }
    MutexLock lock(mu_);
    frames_.push_back(std::move(frame));
    return true;
  }
  bool MirrorResult(replication::MirroredResult result) override {
    MutexLock lock(mu_);
    results_.push_back(std::move(result));
    return true;
  }
  void Acknowledge(const std::string& stream, uint64_t run, uint64_t through) override {
    MutexLock lock(mu_);
    acks_.push_back({stream, run, through});
  }
  void Finish(bool, std::string) override {}
  void Stop() override {}

  void set_paired(bool on) {
    MutexLock lock(mu_);
    paired_ = on;
  }
  std::vector<replication::MirroredFrame> frames() const {
    MutexLock lock(mu_);
    return frames_;
  }
  std::vector<replication::MirroredResult> results() const {
    MutexLock lock(mu_);
    return results_;
  }
  struct Ack {
    std::string stream;
    uint64_t run, through;
  };
  std::vector<Ack> acks() const {
    MutexLock lock(mu_);
    return acks_;
  }
  Mutex* order = nullptr;

 private:
  mutable Mutex mu_;
  bool paired_ VIGIL_GUARDED_BY(mu_) = false;
  std::vector<replication::MirroredFrame> frames_ VIGIL_GUARDED_BY(mu_);
  std::vector<replication::MirroredResult> results_ VIGIL_GUARDED_BY(mu_);
  std::vector<Ack> acks_ VIGIL_GUARDED_BY(mu_);
};

// A FramePublisher in host memory: records (stream, seq, first pixel byte) of each write; `full` refuses them.
class FakeRing final : public replication::FramePublisher {
 public:
  const std::string& socket() const override { return socket_; }
  std::string NewToken() override { return "t"; }
  bool active() const override { return active_; }
  Status Write(const replication::MirroredFrame& frame, const uint8_t* bgr, size_t) override {
    if (full) return absl::ResourceExhaustedError("every slot unread");
    written.push_back({frame.stream, frame.seq, bgr[0]});
    return absl::OkStatus();
  }
  Status WriteDevice(const replication::MirroredFrame&, const DevicePicture&) override {
    return absl::FailedPreconditionError("host ring");
  }
  bool in_gpu_memory() const override { return false; }
  size_t slot_capacity() const override { return active_ ? capacity : 0; }
  replication::FramePublisherStats stats() const override {
    replication::FramePublisherStats s;
    s.active = active_;
    s.sessions = active_ ? 1 : 0;
    return s;
  }
  void CorruptNextSlotsForTesting(int) override {}

  struct Written {
    std::string stream;
    uint64_t seq;
    uint8_t first;
  };
  std::vector<Written> written;  // the test's thread only (the flush is joined before reading)
  bool active_ = true;
  bool full = false;
  size_t capacity = 1 << 20;

 private:
  std::string socket_ = "fake.sock";
};

video::Frame Picture(uint8_t value, int width = 16, int height = 8) {
  video::Frame f;
  f.width = width;
  f.height = height;
  f.stride = width * 3;
  f.bgr.assign(static_cast<size_t>(f.stride) * height, value);
  f.capture_time_ns = 1000 + value;
  f.pts_ns = value;
  return f;
}

struct Fixture {
  explicit Fixture(int window = 4) {
    PrimaryMirrorOptions o;
    o.config.mirror_frames = true;
    o.config.mirror_results = true;
    o.config.mirror_window = window;
    o.registry = &registry;
    o.clock = &clock;
    mirror = std::make_unique<PrimaryMirror>(std::move(o));
    mirror->AddStream("cam");
    mirror->AddStream("file");
  }
  // Numbers `f` as the ledger would: seq = next, unless `refuse`.
  bool Number(size_t index, bool live, video::Frame& f, bool refuse = false) {
    return mirror->Number(index, live, /*run=*/7, f, [&](uint64_t* seq) {
      if (refuse) return false;
      *seq = next_seq++;
      return true;
    });
  }
  double Counter(const std::string& name, const std::string& stream) {
    return registry.GetCounter(name, "", {{"stream", stream}}).Value();
  }
  metrics::Registry registry;
  FakeClock clock;
  std::unique_ptr<PrimaryMirror> mirror;
  uint64_t next_seq = 0;
};

TEST(PictureMirror, WithoutAChannelPicturesAreOnlyNumbered) {
  Fixture t;
  video::Frame f = Picture(1);
  ASSERT_TRUE(t.Number(0, /*live=*/true, f));
  EXPECT_EQ(f.seq, 0u);
  EXPECT_EQ(f.run, 7u);
  EXPECT_EQ(t.mirror->keep().kept(0), 0u);
  EXPECT_EQ(t.Counter("vigil_edge_mirror_frames_total", "cam"), 0);
}

TEST(PictureMirror, ARefusedNumberHandsNothingOver) {
  Fixture t;
  FakeChannel ch;
  t.mirror->set_channel(&ch);  // unpaired: the keep would take it
  video::Frame f = Picture(1);
  f.seq = 42;
  EXPECT_FALSE(t.Number(0, true, f, /*refuse=*/true));
  EXPECT_EQ(f.seq, 42u);
  EXPECT_EQ(t.mirror->keep().kept(0), 0u);
}

TEST(PictureMirror, UnpairedLivePicturesAreKeptRawUpToTheWindow) {
  Fixture t(/*window=*/3);
  FakeChannel ch;
  t.mirror->set_channel(&ch);
  for (uint8_t v = 0; v < 5; ++v) {
    video::Frame f = Picture(v);
    ASSERT_TRUE(t.Number(0, true, f));
  }
  video::Frame file = Picture(9);
  ASSERT_TRUE(t.Number(1, /*live=*/false, file));  // a file's picture is never mirrored
  EXPECT_EQ(t.mirror->keep().kept(0), 3u);
  EXPECT_EQ(t.mirror->keep().kept(1), 0u);
  EXPECT_EQ(t.Counter("vigil_edge_mirror_unpaired_evicted_total", "cam"), 2);
  EXPECT_TRUE(ch.frames().empty());
}

TEST(PictureMirror, StoredIsObservedByTheKeepAndTheChannel) {
  Fixture t;
  FakeChannel ch;
  t.mirror->set_channel(&ch);
  for (uint8_t v = 0; v < 4; ++v) {
    video::Frame f = Picture(v);
    ASSERT_TRUE(t.Number(0, true, f));
  }
  t.mirror->Stored("cam", 7, 1);  // seqs 0 and 1 stored
  EXPECT_EQ(t.mirror->keep().kept(0), 2u);
  ASSERT_EQ(ch.acks().size(), 1u);
  EXPECT_EQ(ch.acks()[0].stream, "cam");
  EXPECT_EQ(ch.acks()[0].run, 7u);
  EXPECT_EQ(ch.acks()[0].through, 1u);
  t.mirror->Stored("cam", 8, 0);  // a newer run: every kept picture of run 7 is stored
  EXPECT_EQ(t.mirror->keep().kept(0), 0u);
}

TEST(PictureMirror, AStandbyThatPairsGetsTheKeptUnstoredPicturesThroughItsRing) {
  Fixture t;
  FakeChannel ch;
  FakeRing ring;
  ring.active_ = false;
  t.mirror->set_channel(&ch);
  t.mirror->set_ring(&ring);
  for (uint8_t v = 10; v < 14; ++v) {
    video::Frame f = Picture(v);
    ASSERT_TRUE(t.Number(0, true, f));  // seqs 0..3 kept
  }
  t.mirror->Periodic();  // unpaired: nothing flushed
  t.mirror->Join();
  EXPECT_EQ(t.mirror->keep().kept(0), 4u);
  t.mirror->Stored("cam", 7, 0);  // seq 0 stored meanwhile
  ring.active_ = true;
  ch.set_paired(true);
  t.mirror->Periodic();
  t.mirror->Join();
  ASSERT_EQ(ring.written.size(), 3u);
  EXPECT_EQ(ring.written[0].seq, 1u);
  EXPECT_EQ(ring.written[0].first, 11);
  EXPECT_EQ(ring.written[2].seq, 3u);
  EXPECT_EQ(t.mirror->keep().kept(0), 0u);
  EXPECT_EQ(t.Counter("vigil_edge_mirror_frames_total", "cam"), 3);
}

TEST(PictureMirror, AKeptPictureGoesToTheChannelOnlyWhileAStandbyIsPaired) {
  metrics::Registry registry;
  MirrorShared shared;
  MirrorShared::Stream& s = shared.streams.emplace_back();
  s.id = "cam";
  int n = 0;
  for (metrics::Counter** c : {&s.mirrored, &s.mirrored_bytes, &s.skipped, &s.unpaired_evicted, &s.results_mirrored}) {
    *c = &registry.GetCounter("c_total", "", {{"n", std::to_string(n++)}});
  }
  FakeChannel ch;
  ch.order = &shared.order;
  shared.channel.store(&ch);
  ChannelMirror channel(shared);
  UnpairedKeep keep(shared);
  replication::MirroredFrame m;
  m.stream = "cam";
  m.run = 7;
  m.seq = 3;
  m.jpeg = "a jpeg";  // as the channel's way kept it
  EXPECT_FALSE(channel.HandKept(0, m));  // the standby went away again: the next way (the keep) gets it
  EXPECT_TRUE(keep.HandKept(0, m));
  EXPECT_EQ(keep.kept(0), 1u);
  ch.set_paired(true);
  EXPECT_TRUE(channel.HandKept(0, m));
  ASSERT_EQ(ch.frames().size(), 1u);
  EXPECT_EQ(ch.frames()[0].seq, 3u);
  EXPECT_EQ(s.mirrored->Value(), 1);
}

TEST(PictureMirror, ARingTakesLivePicturesRawUnderTheOrderLock) {
  Fixture t;
  FakeChannel ch;
  ch.set_paired(true);
  FakeRing ring;
  t.mirror->set_channel(&ch);
  t.mirror->set_ring(&ring);
  video::Frame f = Picture(5);
  ASSERT_TRUE(t.Number(0, true, f));
  ASSERT_EQ(ring.written.size(), 1u);
  EXPECT_EQ(ring.written[0].stream, "cam");
  EXPECT_EQ(ring.written[0].seq, 0u);
  EXPECT_TRUE(ch.frames().empty());  // the ring took it: no JPEG
  EXPECT_EQ(t.Counter("vigil_edge_mirror_bytes_total", "cam"), 16 * 8 * 3);
  ring.full = true;  // the standby behind: skipped, not an error
  video::Frame g = Picture(6);
  ASSERT_TRUE(t.Number(0, true, g));
  EXPECT_EQ(t.Counter("vigil_edge_mirror_frames_skipped_total", "cam"), 1);
  EXPECT_EQ(t.Counter("vigil_edge_mirror_frames_total", "cam"), 1);
}

TEST(PictureMirror, APictureLargerThanTheRingsSlotsGoesOverTheChannel) {
  if (!video::JpegAvailable()) GTEST_SKIP() << "no libturbojpeg";
  Fixture t;
  FakeChannel ch;
  ch.set_paired(true);
  ch.order = t.mirror->order();
  FakeRing ring;
  ring.capacity = 16;  // smaller than any picture
  t.mirror->set_channel(&ch);
  t.mirror->set_ring(&ring);
  video::Frame f = Picture(5);
  ASSERT_TRUE(t.Number(0, true, f));
  EXPECT_TRUE(ring.written.empty());
  const std::vector<replication::MirroredFrame> sent = ch.frames();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].run, 7u);
  EXPECT_EQ(sent[0].seq, 0u);
  EXPECT_EQ(sent[0].width, 16u);
  EXPECT_EQ(sent[0].capture_ns, 1005);
  EXPECT_FALSE(sent[0].jpeg.empty());
  video::Frame back;
  ASSERT_TRUE(video::DecodeJpeg(sent[0].jpeg, &back).ok());
  EXPECT_EQ(back.width, 16);
  EXPECT_EQ(t.Counter("vigil_edge_mirror_bytes_total", "cam"), static_cast<double>(sent[0].jpeg.size()));
}

TEST(PictureMirror, ResultsOfLiveFramesGoToTheChannel) {
  Fixture t;
  FakeChannel ch;
  const std::vector<detect::Detection> dets = {{1, 2, 3, 4, 0.5f, 2}};
  t.mirror->MirrorResult(0, true, 7, FrameInfo{3, 10, 20, 16, 8}, dets);  // no channel yet: nothing
  t.mirror->set_channel(&ch);
  t.mirror->MirrorResult(1, /*live=*/false, 7, FrameInfo{3, 10, 20, 16, 8}, dets);  // a file's: nothing
  t.mirror->MirrorResult(0, true, 7, FrameInfo{3, 10, 20, 16, 8}, dets);
  const std::vector<replication::MirroredResult> r = ch.results();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].stream, "cam");
  EXPECT_EQ(r[0].seq, 3u);
  ASSERT_EQ(r[0].detections.size(), 1u);
  EXPECT_EQ(r[0].detections[0].class_id, 2);
  EXPECT_EQ(t.Counter("vigil_edge_mirror_results_total", "cam"), 1);
}

TEST(PictureMirror, ATakeoversReplayedPicturesAreKeptForThisNodesStandby) {
  Fixture t;
  std::vector<replication::MirroredFrame> replay(3);
  for (size_t k = 0; k < replay.size(); ++k) {
    replay[k].stream = "cam";
    replay[k].run = 7;
    replay[k].seq = k;
    if (k != 1) replay[k].jpeg = "x";  // seq 1: a result without its picture
  }
  t.mirror->KeepTakenOver(0, replay);  // no channel: nothing kept
  EXPECT_EQ(t.mirror->keep().kept(0), 0u);
  FakeChannel ch;
  t.mirror->set_channel(&ch);
  t.mirror->KeepTakenOver(0, replay);
  EXPECT_EQ(t.mirror->keep().kept(0), 2u);
}

}  // namespace
}  // namespace vigil::pipeline
