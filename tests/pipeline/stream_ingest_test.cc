// The edge's stream ingest (stream_ingest.h) on synthetic sources, a real ledger on an in-memory store and a
// recording FrameIntake in place of the worker pool: what is read, numbered and handed over, in which order, what
// a refused or discarded frame becomes, and save_frames. No process, no model.
#include "vigil/pipeline/stream_ingest.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vigil/common/mutex.h"

namespace vigil::pipeline {
namespace {

using std::chrono::milliseconds;

// Records what the ingest hands over; refuses everything once `refuse` is set.
class RecordingIntake final : public FrameIntake {
 public:
  explicit RecordingIntake(bool refuse = false) : refuse_(refuse) {}
  bool Push(size_t stream, video::Frame frame) override {
    MutexLock lock(mu_);
    if (refuse_) return false;
    pushed_.emplace_back(stream, frame.seq);
    runs_.push_back(frame.run);
    return true;
  }
  void Close() override {
    MutexLock lock(mu_);
    ++closed_;
  }
  std::vector<uint64_t> Seqs(size_t stream) const {
    MutexLock lock(mu_);
    std::vector<uint64_t> out;
    for (const auto& [s, seq] : pushed_) {
      if (s == stream) out.push_back(seq);
    }
    return out;
  }
  std::vector<uint64_t> runs() const {
    MutexLock lock(mu_);
    return runs_;
  }
  int closed() const {
    MutexLock lock(mu_);
    return closed_;
  }

 private:
  mutable Mutex mu_;
  const bool refuse_;
  std::vector<std::pair<size_t, uint64_t>> pushed_ VIGIL_GUARDED_BY(mu_);
  std::vector<uint64_t> runs_ VIGIL_GUARDED_BY(mu_);
  int closed_ VIGIL_GUARDED_BY(mu_) = 0;
};

StreamConfig Stream(const std::string& id, const std::string& uri) {
  StreamConfig s;
  s.id = id;
  s.source = uri;
  return s;
}

struct Fixture {
  metrics::Registry reg;
  HealthWatch health{HealthWatchOptions{"e1", &reg, SystemClock(), {}}};
  TakeoverController takeover{"e1", reg};
  PrimaryMirror mirror{PrimaryMirrorOptions{ReplicationConfig{}, &reg, SystemClock(), {}}};
  RecordingIntake intake;
  std::vector<StreamConfig> streams;
  std::unique_ptr<StreamLedger> ledger;
  std::unique_ptr<StreamIngest> ingest;

  explicit Fixture(std::vector<StreamConfig> configured, bool refuse = false) : intake(refuse), streams(std::move(configured)) {
    StreamIngestOptions o;
    o.edge = "e1";
    o.streams = streams;
    o.max_batch = 2;
    o.registry = &reg;
    o.mirror = &mirror;
    o.takeover = &takeover;
    o.health = &health;
    o.intake = &intake;
    ingest = std::make_unique<StreamIngest>(std::move(o));
  }
  // Opens the streams and a ledger for them, admitted with epoch 7.
  void OpenAndAdmit() {
    ASSERT_TRUE(ingest->Open(std::vector<StreamDecode>(streams.size())).ok());
    LedgerOptions lo;
    lo.store = MakeMemoryStateStore(std::make_shared<MemoryState>());
    lo.replayable_wait = milliseconds(0);
    std::vector<LedgerStream> specs;
    for (const StreamConfig& sc : streams) {
      specs.push_back({sc.id, sc.source, video::IsLiveUri(sc.source), *RuleEngine::Create({}, {"thing"}), std::nullopt});
    }
    ledger = std::move(*StreamLedger::Open(std::move(lo), std::move(specs)));
    ledger->Admit({7, {}});
    ingest->set_ledger(ledger.get());
    ingest->Admitted(nullptr);
  }
  std::vector<transport::Report> Pending() {
    ledger->Tick(/*force=*/true);
    std::vector<transport::Report> out;
    for (const auto& m : ledger->outbox().PendingFrom(0, 1000)) out.push_back(m->report);
    return out;
  }
};

TEST(StreamIngest, FilesAreNumberedAndHandedOverInOrderThenTheIntakeCloses) {
  Fixture f({Stream("a", "synthetic:32x24?frames=5"), Stream("b", "synthetic:48x16?frames=3")});
  f.OpenAndAdmit();
  ASSERT_TRUE(f.ingest->any_open());
  const std::vector<video::Source::Probe> probed = f.ingest->Probes();
  ASSERT_EQ(probed.size(), 2u);
  EXPECT_EQ(probed[0].width, 32);
  EXPECT_EQ(probed[1].height, 16);
  EXPECT_FALSE(f.ingest->live(0));
  EXPECT_EQ(f.ingest->run(1), 7u);
  f.ingest->StartReaders();
  EXPECT_EQ(f.ingest->Activate(), 2);
  f.ingest->StartFeeders();
  f.ingest->JoinFeeders();
  EXPECT_EQ(f.intake.Seqs(0), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(f.intake.Seqs(1), (std::vector<uint64_t>{0, 1, 2}));
  for (uint64_t run : f.intake.runs()) EXPECT_EQ(run, 7u);
  EXPECT_EQ(f.intake.closed(), 1) << "closed once, by the last feeder";
  EXPECT_EQ(f.ingest->metrics(0).errors().Value(), 0);
}

TEST(StreamIngest, AStreamThatDoesNotOpenIsCountedAndFeedsNothing) {
  Fixture f({Stream("bad", "synthetic:not-a-size")});
  f.OpenAndAdmit();
  EXPECT_FALSE(f.ingest->any_open());
  EXPECT_EQ(f.ingest->metrics(0).errors().Value(), 1);
  f.ingest->StartReaders();
  EXPECT_EQ(f.ingest->reader(0), nullptr);
  EXPECT_EQ(f.ingest->Activate(), 0);
  f.ingest->StartFeeders();
  f.ingest->JoinFeeders();
  EXPECT_EQ(f.intake.closed(), 0) << "the edge closes an intake no feeder will close";
}

TEST(StreamIngest, ALiveFrameTheIntakeRefusesBecomesAShutdownDropMark) {
  Fixture f({Stream("cam", "synthetic:32x24?fps=200&live=1")}, /*refuse=*/true);
  f.OpenAndAdmit();
  ASSERT_TRUE(f.ingest->live(0));
  f.ingest->StartReaders();
  EXPECT_EQ(f.ingest->Activate(), 1);
  f.ingest->StartFeeders();
  f.ingest->JoinFeeders();
  EXPECT_EQ(f.intake.closed(), 1);
  const double dropped = f.ingest->metrics(0).dropped("shutdown").Value();
  EXPECT_GE(dropped, 1) << "the refused frame, and what its reader still held";
  uint64_t marked = 0;
  for (const transport::Report& r : f.Pending()) {
    EXPECT_EQ(r.kind, transport::ReportKind::kDropped);
    EXPECT_EQ(r.rule, "shutdown");
    marked += r.seq_last - r.seq_first + 1;
  }
  EXPECT_EQ(static_cast<double>(marked), dropped) << "every counted drop travels as a mark";
}

TEST(StreamIngest, AStopsDiscardedFramesAreMarkedForLiveStreamsOnly) {
  Fixture f({Stream("file", "synthetic:32x24?frames=5"), Stream("cam", "synthetic:32x24?fps=25&live=1")});
  f.OpenAndAdmit();
  uint64_t seq = 0;
  ASSERT_TRUE(f.ledger->Number(0, 0, &seq));
  ASSERT_TRUE(f.ledger->Number(1, 0, &seq));
  f.ingest->DropQueued(0, 0);  // a file's frame is read again after a restart
  f.ingest->DropQueued(1, seq);
  EXPECT_EQ(f.ingest->metrics(0).dropped("shutdown").Value(), 0);
  EXPECT_EQ(f.ingest->metrics(1).dropped("shutdown").Value(), 1);
  const std::vector<transport::Report> out = f.Pending();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].stream, "cam");
  EXPECT_EQ(out[0].kind, transport::ReportKind::kDropped);
}

TEST(StreamIngest, SaveFramesWritesTheHostPicturesOfItsStreams) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("vigil_ingest_" + std::to_string(::getpid())) / "frames";
  std::filesystem::remove_all(dir.parent_path());
  StreamConfig saved = Stream("a", "synthetic:4x2?frames=1");
  saved.save_frames = dir.string();
  Fixture f({saved, Stream("b", "synthetic:4x2?frames=1")});
  f.OpenAndAdmit();
  EXPECT_TRUE(std::filesystem::is_directory(dir)) << "Open creates the folder";
  std::vector<WorkItem> batch(2);
  for (size_t i = 0; i < 2; ++i) {
    batch[i].stream = i;
    batch[i].frame.seq = 7;
    batch[i].frame.width = 4;
    batch[i].frame.height = 2;
    batch[i].frame.stride = 12;
    batch[i].frame.bgr.assign(24, 200);
  }
  f.ingest->SaveFrames(batch);
  EXPECT_TRUE(std::filesystem::exists(dir / "000007.npy"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir.parent_path());
}

TEST(StreamIngest, FollowMirroredBeforeAGateExistsDoesNothing) {
  Fixture f({Stream("a", "synthetic:32x24?frames=5")});
  f.ingest->FollowMirrored({{"a", "synthetic:32x24?frames=5", 7, 3, 4}});
  f.OpenAndAdmit();
  f.ingest->StartReaders();
  f.ingest->Activate();
  f.ingest->StartFeeders();
  f.ingest->JoinFeeders();
  EXPECT_EQ(f.intake.Seqs(0), (std::vector<uint64_t>{0, 1, 2, 3, 4})) << "no gate: nothing is discarded";
}

}  // namespace
}  // namespace vigil::pipeline
