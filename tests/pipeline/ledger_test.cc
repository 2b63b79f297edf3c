// The stream ledger through a fake clock and an in-memory state store (pipeline/ledger.h), the state_dir
// store on disk, and the ledger under a Courier over in-memory links (testing/memory_link.h).
#include "vigil/pipeline/ledger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "testing/memory_link.h"
#include "vigil/transport/courier.h"

namespace vigil::pipeline {
namespace {

using namespace std::chrono_literals;
using transport::Report;
using transport::ReportKind;

const std::vector<std::string> kNames = {"person", "bicycle", "car"};

RuleEngine PersonsOnly() {
  RulesConfig c;
  c.classes = {"person"};
  return *RuleEngine::Create(c, kNames);
}

struct Fixture {
  FakeClock clock;
  std::shared_ptr<MemoryState> state = std::make_shared<MemoryState>();

  std::unique_ptr<StreamLedger> Open(std::vector<LedgerStream> streams, size_t max_outbox = 64) {
    LedgerOptions o;
    o.clock = &clock;
    o.store = MakeMemoryStateStore(state);
    o.max_outbox = max_outbox;
    o.progress_flush = 500ms;
    o.persist_interval = 1h;  // the tests persist explicitly
    o.replayable_wait = 0ms;
    StatusOr<std::unique_ptr<StreamLedger>> l = StreamLedger::Open(std::move(o), std::move(streams));
    EXPECT_TRUE(l.ok()) << l.status();
    return std::move(*l);
  }
  void Seed(std::vector<StreamRecord> records) {
    MutexLock lock(state->mu);
    state->records = std::move(records);
  }
  std::vector<StreamRecord> Saved() {
    MutexLock lock(state->mu);
    return state->records;
  }
};

LedgerStream File(const std::string& id) { return {id, "/videos/" + id + ".mp4", false, PersonsOnly()}; }
LedgerStream Camera(const std::string& id) { return {id, "rtsp://10.0.0.1/" + id, true, PersonsOnly()}; }

std::vector<Report> Pending(StreamLedger& l) {
  std::vector<Report> out;
  for (const auto& m : l.outbox().PendingFrom(0, 1000)) out.push_back(m->report);
  return out;
}

FrameInfo Frame(uint64_t seq) { return {seq, 1000 + static_cast<int64_t>(seq), 40'000'000 * static_cast<int64_t>(seq), 640, 480}; }

const detect::Detection kPerson{10, 20, 30, 40, 0.9f, 0};
const detect::Detection kCar{1, 2, 3, 4, 0.8f, 2};

TEST(StreamLedger, NewRunsTakeTheGrantedEpochAndNumberFromZero) {
  Fixture f;
  auto l = f.Open({File("a"), Camera("b")});
  EXPECT_TRUE(l->ResumedStreams().empty());
  uint64_t seq = 99;
  EXPECT_FALSE(l->Number(0, 0, &seq)) << "nothing is numbered before the aggregator admits the edge";
  l->Admit({7, {}});
  EXPECT_EQ(l->epoch(), 7u);
  for (size_t i : {0u, 1u}) {
    EXPECT_EQ(l->run(i), 7u);
    EXPECT_EQ(l->resume(i).kind, StreamResume::kNewRun);
    for (uint64_t want = 0; want < 3; ++want) {
      ASSERT_TRUE(l->Number(i, want, &seq));
      EXPECT_EQ(seq, want);
    }
  }
  // The new runs were persisted by Admit itself (before any frame of them could leave).
  std::vector<StreamRecord> saved = f.Saved();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].run, 7u);
  ASSERT_TRUE(l->Persist().ok());
  saved = f.Saved();
  EXPECT_EQ(saved[0], (StreamRecord{"a", "/videos/a.mp4", 7, std::nullopt, 3}));
  EXPECT_EQ(saved[1], (StreamRecord{"b", "rtsp://10.0.0.1/b", 7, std::nullopt, 3}));
  // A later Welcome (a reconnect) keeps the runs.
  l->Admit({7, {}});
  EXPECT_EQ(l->run(0), 7u);
}

TEST(StreamLedger, AFileResumesAfterTheLargerOfItsCursorAndTheAggregatorsContiguousPrefix) {
  Fixture f;
  f.Seed({{"a", "/videos/a.mp4", 3, 4, 10}, {"b", "/videos/other.mp4", 2, 9, 10}});
  auto l = f.Open({File("a"), File("b")});
  // b's source changed: only a resumes.
  EXPECT_EQ(l->ResumedStreams(), (std::vector<transport::HelloStream>{{"a", 3}}));
  l->Admit({9, {{"a", 3, 6, 8}}});
  EXPECT_EQ(l->resume(0).kind, StreamResume::kResumeReplayable);
  EXPECT_EQ(l->resume(0).skip_through, std::optional<uint64_t>(6));
  EXPECT_EQ(l->run(0), 3u);
  EXPECT_EQ(l->resume(1).kind, StreamResume::kNewRun);
  EXPECT_EQ(l->run(1), 9u);
  uint64_t seq = 0;
  for (uint64_t i = 0; i <= 6; ++i) EXPECT_FALSE(l->Number(0, i, &seq)) << "position " << i << " was stored already";
  ASSERT_TRUE(l->Number(0, 7, &seq));
  EXPECT_EQ(seq, 7u);
  EXPECT_EQ(l->counters(0).skipped_resume, 7u);
  EXPECT_EQ(l->acked_through(0), std::optional<uint64_t>(6));
}

TEST(StreamLedger, AFilesSeqIsThePicturesPositionNotACountOfPictures) {
  // A hot standby's source was read up to the mirrored cursor before the takeover: the ledger sees its
  // pictures from position 5 on, and each must get the seq its position names (as on the primary).
  Fixture f;
  f.Seed({{"a", "/videos/a.mp4", 3, 4, 10}});
  auto l = f.Open({File("a")});
  l->Admit({9, {}});
  EXPECT_EQ(l->resume(0).skip_through, std::optional<uint64_t>(4));
  uint64_t seq = 0;
  ASSERT_TRUE(l->Number(0, 5, &seq));
  EXPECT_EQ(seq, 5u);
  ASSERT_TRUE(l->Number(0, 6, &seq));
  EXPECT_EQ(seq, 6u);
  EXPECT_EQ(l->counters(0).skipped_resume, 0u) << "nothing was skipped: the source started after the cursor";
  EXPECT_FALSE(l->Number(0, 4, &seq)) << "position 4 was stored already";
  EXPECT_EQ(l->counters(0).skipped_resume, 1u);
}

TEST(StreamLedger, ALiveStreamNumbersAboveItsHighWaterMarkAndReportsWhatWasLost) {
  Fixture f;
  // Assigned up to seq 19; the aggregator stored up to 14 (acks for 12..14 never came back).
  f.Seed({{"cam", "rtsp://10.0.0.1/cam", 5, 11, 20}});
  auto l = f.Open({Camera("cam")});
  l->Admit({6, {{"cam", 5, 14, 14}}});
  const StreamResume r = l->resume(0);
  EXPECT_EQ(r.kind, StreamResume::kResumeLive);
  EXPECT_EQ(r.run, 5u);
  EXPECT_EQ(r.first_seq, 20u);
  EXPECT_EQ(r.lost, 5u);
  EXPECT_EQ(l->counters(0).lost_on_restart, 5u);
  EXPECT_EQ(l->acked_through(0), std::optional<uint64_t>(14));
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ReportKind::kLost);
  EXPECT_EQ(out[0].rule, "lost_on_restart");
  EXPECT_EQ(std::make_pair(out[0].seq_first, out[0].seq_last), std::make_pair(uint64_t{15}, uint64_t{19}));
  EXPECT_EQ(out[0].run, 5u);
  uint64_t seq = 0;
  ASSERT_TRUE(l->Number(0, /*position: ignored for a live stream*/ 3, &seq));
  EXPECT_EQ(seq, 20u) << "no picture is skipped and no seq reused";
}

// A store whose writes fail (a full or read-only disk): what it loaded was written before.
class UnwritableStore : public StateStore {
 public:
  explicit UnwritableStore(std::vector<StreamRecord> records) : records_(std::move(records)) {}
  StatusOr<std::vector<StreamRecord>> Load() override { return records_; }
  Status Save(const std::vector<StreamRecord>&) override { return absl::UnavailableError("disk full"); }
  std::string where() const override { return "unwritable"; }

 private:
  std::vector<StreamRecord> records_;
};

std::unique_ptr<StreamLedger> OpenOn(std::unique_ptr<StateStore> store, FakeClock* clock) {
  LedgerOptions o;
  o.clock = clock;
  o.store = std::move(store);
  o.persist_interval = 1h;
  o.replayable_wait = 0ms;
  StatusOr<std::unique_ptr<StreamLedger>> l = StreamLedger::Open(std::move(o), {Camera("cam")});
  EXPECT_TRUE(l.ok()) << l.status();
  return std::move(*l);
}

TEST(StreamLedger, AResumedRunNumbersAtOnceANewRunOnlyOnceItIsOnDisk) {
  FakeClock clock;
  uint64_t seq = 0;
  {
    // A takeover or a restart resumes run 5, which the store holds already: its pictures are numbered without
    // waiting for the state write (here it even fails; the writer retries).
    auto l = OpenOn(std::make_unique<UnwritableStore>(std::vector<StreamRecord>{{"cam", "rtsp://10.0.0.1/cam", 5, 11, 20}}),
                    &clock);
    l->Admit({6, {{"cam", 5, 14, 14}}});
    ASSERT_TRUE(l->Number(0, 0, &seq));
    EXPECT_EQ(seq, 20u);
    EXPECT_EQ(l->counters(0).not_numbered, 0u);
    EXPECT_GE(l->counters(0).persist_failures, 1u);
  }
  {
    // A new run must reach the disk first: a crash would otherwise start yet another run for the same pictures.
    auto l = OpenOn(std::make_unique<UnwritableStore>(std::vector<StreamRecord>{}), &clock);
    l->Admit({6, {}});
    EXPECT_EQ(l->resume(0).kind, StreamResume::kNewRun);
    EXPECT_FALSE(l->Number(0, 0, &seq));
    EXPECT_EQ(l->counters(0).not_numbered, 1u);
  }
}

TEST(StreamLedger, ALiveStreamWhoseHighWaterMarkLagsTheAggregatorNumbersAboveTheHighestStored) {
  Fixture f;
  f.Seed({{"cam", "rtsp://10.0.0.1/cam", 5, 11, 20}});  // persisted lazily: the dead instance got further
  auto l = f.Open({Camera("cam")});
  l->Admit({6, {{"cam", 5, 31, 31}}});
  EXPECT_EQ(l->resume(0).first_seq, 32u);
  EXPECT_EQ(l->resume(0).lost, 0u);
  EXPECT_TRUE(Pending(*l).empty());
}

TEST(StreamLedger, ALiveStreamNeverReportsWhatWasAcknowledgedAsLost) {
  Fixture f;
  f.Seed({{"cam", "rtsp://10.0.0.1/cam", 5, 11, 20}});
  auto l = f.Open({Camera("cam")});
  l->Admit({6, {}});  // e.g. a replaced database: the aggregator knows nothing of run 5
  EXPECT_EQ(l->resume(0).first_seq, 20u);
  EXPECT_EQ(l->resume(0).lost, 8u) << "12..19: 0..11 were acknowledged";
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].seq_first, 12u);
}

TEST(StreamLedger, ALiveRestartAlsoClosesAHoleBelowTheHighestStoredSeq) {
  Fixture f;
  // The dead instance had a drop mark for seq 12 still pending while 13..16 were stored.
  f.Seed({{"cam", "rtsp://10.0.0.1/cam", 5, 11, 18}});
  auto l = f.Open({Camera("cam")});
  l->Admit({6, {{"cam", 5, 11, 16}}});
  EXPECT_EQ(l->resume(0).first_seq, 18u);
  EXPECT_EQ(l->resume(0).lost, 1u) << "17 is certainly lost";
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::make_pair(out[0].seq_first, out[0].seq_last), std::make_pair(uint64_t{12}, uint64_t{17}))
      << "the aggregator stores the seqs of the range it is missing (12 and 17)";
}

// A hot standby holds mirrored pictures of the run: those above the acknowledged cursor are processed again
// (resume().replay), the seqs it has no picture of are reported lost as ranges, and new pictures go above both.
TEST(StreamLedger, ALiveResumeWithMirroredPicturesProcessesThemAgainAndReportsOnlyTheRestLost) {
  Fixture f;
  // The dead primary assigned up to 19 (mirrored high-water 20); acknowledged 0..11; the aggregator has 14 too.
  f.Seed({{"cam", "rtsp://10.0.0.1/cam", 5, 11, 20}});
  LedgerStream cam = Camera("cam");
  // Pictures of 10 and 11 (acknowledged: not again), 13..15, 17, 18 and 21 (numbered after the last state the
  // standby got: the mirrored next_seq lags the frames).
  cam.mirrored = MirroredSeqs{5, {10, 11, 13, 14, 15, 17, 18, 21}};
  auto l = f.Open({cam});
  l->Admit({6, {{"cam", 5, 11, 14}}});
  const StreamResume r = l->resume(0);
  EXPECT_EQ(r.kind, StreamResume::kResumeLive);
  EXPECT_EQ(r.replay, (std::vector<uint64_t>{13, 14, 15, 17, 18, 21}));
  EXPECT_EQ(r.first_seq, 22u) << "above the last mirrored picture";
  // Without a picture: 12 (below the highest stored: maybe stored), 16, 19, 20 (certainly lost).
  EXPECT_EQ(r.lost, 3u);
  const LedgerCounters c = l->counters(0);
  EXPECT_EQ(c.lost_on_restart, 3u);
  EXPECT_EQ(c.replayed, 6u);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const Report& m : Pending(*l)) {
    EXPECT_EQ(m.kind, ReportKind::kLost);
    EXPECT_EQ(m.run, 5u);
    ranges.emplace_back(m.seq_first, m.seq_last);
  }
  EXPECT_EQ(ranges, (std::vector<std::pair<uint64_t, uint64_t>>{{12, 12}, {16, 16}, {19, 20}}));
  // The replayed pictures are recorded like any frame, then the source's new ones follow.
  for (uint64_t q : r.replay) l->Record(0, {q, 0, static_cast<int64_t>(q), 64, 48}, {});
  uint64_t seq = 0;
  ASSERT_TRUE(l->Number(0, 0, &seq));
  EXPECT_EQ(seq, 22u);
  l->Record(0, {seq, 0, static_cast<int64_t>(seq), 64, 48}, {});
  l->Tick(/*force=*/true);
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  for (const Report& m : Pending(*l)) {
    if (m.kind == ReportKind::kProgress) progress.emplace_back(m.seq_first, m.seq_last);
  }
  EXPECT_EQ(progress, (std::vector<std::pair<uint64_t, uint64_t>>{{13, 15}, {17, 18}, {21, 22}}));
}

TEST(StreamLedger, MirroredPicturesOfAnotherRunAreNotProcessedAgain) {
  Fixture f;
  f.Seed({{"cam", "rtsp://10.0.0.1/cam", 5, 11, 20}});
  LedgerStream cam = Camera("cam");
  cam.mirrored = MirroredSeqs{4, {15, 16, 17}};
  auto l = f.Open({cam});
  l->Admit({6, {{"cam", 5, 14, 14}}});
  EXPECT_TRUE(l->resume(0).replay.empty());
  EXPECT_EQ(l->resume(0).first_seq, 20u);
  EXPECT_EQ(l->resume(0).lost, 5u);
  EXPECT_EQ(l->counters(0).replayed, 0u);
}

TEST(StreamLedger, ProgressMarksCoalesceAndFlushByAgeOnTheClock) {
  Fixture f;
  auto l = f.Open({File("a")});
  l->Admit({1, {}});
  for (uint64_t s = 0; s < 3; ++s) EXPECT_EQ(l->Record(0, Frame(s), {}).published, 0);
  EXPECT_EQ(l->Record(0, Frame(3), std::vector{kCar}).published, 0) << "a car is not a person: a mark";
  l->Tick();
  EXPECT_TRUE(Pending(*l).empty()) << "younger than progress_flush";
  f.clock.Advance(499'999'999);
  l->Tick();
  EXPECT_TRUE(Pending(*l).empty());
  f.clock.Advance(1);
  l->Tick();
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ReportKind::kProgress);
  EXPECT_EQ(std::make_pair(out[0].seq_first, out[0].seq_last), std::make_pair(uint64_t{0}, uint64_t{3}));
  EXPECT_EQ(out[0].capture_ns, 1000);
  EXPECT_EQ(out[0].publish_ns, f.clock.WallNs());
}

TEST(StreamLedger, AnEventFlushesThePendingMarksFirstAndCarriesTheDetectionRows) {
  Fixture f;
  auto l = f.Open({File("a")});
  l->Admit({1, {}});
  l->Record(0, Frame(0), {});
  l->Record(0, Frame(1), {});
  const StreamLedger::Recorded r = l->Record(0, Frame(2), std::vector{kPerson, kCar});
  EXPECT_TRUE(r.verdict.event);
  EXPECT_EQ(r.published, 2);
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, ReportKind::kProgress);
  EXPECT_EQ(out[0].seq_last, 1u);
  EXPECT_EQ(out[1].kind, ReportKind::kEvent);
  EXPECT_EQ(out[1].seq_first, 2u);
  ASSERT_EQ(out[1].detections.size(), 1u) << "only the qualifying person";
  EXPECT_EQ(out[1].detections[0], (transport::ReportDetection{10, 20, 30, 40, 0.9f, 0}));
  EXPECT_EQ(out[1].width, 640u);
  // A gap in seqs (frame 3 dropped) splits the marks.
  l->Dropped(0, 3, "detect_error");
  l->Record(0, Frame(4), {});
  l->Record(0, Frame(5), {});
  l->Tick(/*force=*/true);
  out = Pending(*l);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].kind == ReportKind::kDropped ? out[2].rule : out[3].rule, "detect_error");
  for (const Report& m : {out[2], out[3]}) {
    if (m.kind == ReportKind::kProgress) {
      EXPECT_EQ(std::make_pair(m.seq_first, m.seq_last), std::make_pair(uint64_t{4}, uint64_t{5}));
    } else {
      EXPECT_EQ(std::make_pair(m.seq_first, m.seq_last), std::make_pair(uint64_t{3}, uint64_t{3}));
    }
  }
}

// A GPU detector's rows kept in device memory go with an event that carries all of them; when the rules
// narrowed the detections (or no rows were kept), the event has its host rows only.
TEST(StreamLedger, AnEventWithEveryDetectionOfItsFrameCarriesTheDeviceRowsBesideItsHostCopy) {
  Fixture f;
  auto l = f.Open({File("a")});
  l->Admit({1, {}});
  const std::vector<detect::Detection> persons{kPerson, {50, 60, 70, 80, 0.7f, 0}};
  auto memory = std::make_shared<int>(7);  // stands for the pool's buffer
  static const float kRows[12] = {};        // stands for device memory (never read here)
  const detect::DeviceRows kept{3, kRows, 2, memory};
  ASSERT_TRUE(l->Record(0, Frame(0), persons, &kept).verdict.event);
  ASSERT_TRUE(l->Record(0, Frame(1), std::vector{kPerson, kCar}, &kept).verdict.event);  // the car is not a rule's
  ASSERT_TRUE(l->Record(0, Frame(2), persons).verdict.event);                            // nothing kept
  const std::vector<std::shared_ptr<const transport::OutboxMessage>> m = l->outbox().PendingFrom(0, 10);
  ASSERT_EQ(m.size(), 3u);
  ASSERT_TRUE(m[0]->device.has_value());
  EXPECT_EQ(m[0]->device->count, 2u);
  EXPECT_EQ(m[0]->device->device, 3);
  EXPECT_EQ(m[0]->device->device_rows, kRows);
  EXPECT_EQ(m[0]->device->keepalive, memory);  // held until the message completes
  EXPECT_TRUE(static_cast<bool>(m[0]->device->download));
  ASSERT_EQ(m[0]->report.detections.size(), 2u);  // the host copy, for links that cannot send device memory
  EXPECT_EQ(m[0]->report.detections[1], (transport::ReportDetection{50, 60, 70, 80, 0.7f, 0}));
  EXPECT_FALSE(m[1]->device.has_value());
  EXPECT_EQ(m[1]->report.detections.size(), 1u);
  EXPECT_FALSE(m[2]->device.has_value());
  EXPECT_EQ(memory.use_count(), 2 + 2);  // ours, `kept`'s, the first message's payload (keepalive, download): no other
}

TEST(StreamLedger, ConsecutiveDropsOfOneReasonBecomeOneMark) {
  Fixture f;
  auto l = f.Open({Camera("cam")});
  l->Admit({1, {}});
  for (uint64_t s : {5, 6, 7}) l->Dropped(0, s, "queue_full");
  l->Dropped(0, 8, "shutdown");
  l->Dropped(0, 10, "shutdown");
  l->Tick(/*force=*/true);
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].rule, "queue_full");
  EXPECT_EQ(std::make_pair(out[0].seq_first, out[0].seq_last), std::make_pair(uint64_t{5}, uint64_t{7}));
  EXPECT_EQ(out[1].rule, "shutdown");
  EXPECT_EQ(out[1].seq_last, 8u);
  EXPECT_EQ(out[2].seq_first, 10u);
  EXPECT_EQ(l->counters(0).dropped, 5u);
}

TEST(StreamLedger, ALiveStreamNeverWaitsForAFullOutboxItsFramesBecomeDropMarks) {
  Fixture f;
  auto l = f.Open({Camera("cam")}, /*max_outbox=*/1);
  l->Admit({1, {}});
  EXPECT_EQ(l->Record(0, Frame(0), std::vector{kPerson}).published, 1);
  l->Record(0, Frame(1), std::vector{kPerson});  // no room: held as a drop mark
  l->Record(0, Frame(2), std::vector{kPerson});
  EXPECT_EQ(l->counters(0).backpressure_drops, 2u);
  ASSERT_EQ(Pending(*l).size(), 1u);
  l->Tick();
  ASSERT_EQ(Pending(*l).size(), 1u) << "still full: the mark stays held";
  ASSERT_TRUE(l->outbox().Complete("cam", 1, 0, /*acked=*/true));
  l->Tick();
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ReportKind::kDropped);
  EXPECT_EQ(out[0].rule, "backpressure");
  EXPECT_EQ(std::make_pair(out[0].seq_first, out[0].seq_last), std::make_pair(uint64_t{1}, uint64_t{2}));
}

TEST(StreamLedger, AFileStreamWaitsForRoomUntilCancelWaits) {
  Fixture f;
  LedgerOptions o;
  o.clock = &f.clock;
  o.store = MakeMemoryStateStore(f.state);
  o.max_outbox = 1;
  std::vector<LedgerStream> streams;
  streams.push_back(File("a"));
  auto l = std::move(*StreamLedger::Open(std::move(o), std::move(streams)));  // replayable_wait: 1 h
  l->Admit({1, {}});
  l->Record(0, Frame(0), std::vector{kPerson});
  std::atomic<bool> returned{false};
  std::thread worker([&] {
    l->Record(0, Frame(1), std::vector{kPerson});  // no room: waits (the aggregator is away)
    returned = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(returned.load()) << "a file stream waits for room: it must lose nothing";
  l->CancelWaits();  // a stop
  worker.join();
  EXPECT_EQ(Pending(*l).size(), 1u) << "the frame is given up (read again after a restart), not marked";
  EXPECT_EQ(l->counters(0).dropped, 0u);
}

TEST(StreamLedger, AReportTheProtocolCannotCarryBecomesADropMark) {
  Fixture f;
  auto l = f.Open({File("a")});
  l->Admit({1, {}});
  const detect::Detection bad{std::nanf(""), 0, 1, 1, 0.9f, 0};
  l->Record(0, Frame(0), std::vector{bad});
  l->Tick();
  std::vector<Report> out = Pending(*l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ReportKind::kDropped);
  EXPECT_EQ(out[0].rule, "invalid_report");
  EXPECT_EQ(out[0].seq_first, 0u);
}

TEST(StreamLedger, AcksAdvanceTheCursorOfTheCurrentRunOnly) {
  Fixture f;
  auto l = f.Open({File("a")});
  l->Admit({4, {}});
  l->OnAck({"a", 4, 4, 0, 0, 0});
  EXPECT_EQ(l->acked_through(0), std::optional<uint64_t>(0));
  l->OnAck({"a", 3, 4, 0, 9, 9});  // another run
  l->OnAck({"a", 4, 4, 1, 1, -1});  // a gap before it: no cursor
  l->OnAck({"zz", 4, 4, 0, 9, 9});  // unknown stream
  EXPECT_EQ(l->acked_through(0), std::optional<uint64_t>(0));
  l->OnAck({"a", 4, 4, 2, 5, 5});
  l->OnAck({"a", 4, 4, 1, 1, 3});  // late and lower: ignored
  EXPECT_EQ(l->acked_through(0), std::optional<uint64_t>(5));
  l->Close();  // the last write
  EXPECT_EQ(f.Saved()[0].acked_through, std::optional<uint64_t>(5));
}

TEST(StreamLedger, TheWriterPersistsInTheBackground) {
  Fixture f;
  LedgerOptions o;
  o.clock = &f.clock;
  o.store = MakeMemoryStateStore(f.state);
  o.persist_interval = 1ms;
  std::vector<LedgerStream> streams;
  streams.push_back(Camera("cam"));
  auto l = std::move(*StreamLedger::Open(std::move(o), std::move(streams)));
  l->Admit({2, {}});
  uint64_t seq = 0;
  for (uint64_t i = 0; i < 10; ++i) l->Number(0, i, &seq);
  for (int i = 0; i < 5000; ++i) {  // up to 5 s on a busy machine
    if (f.Saved().size() == 1 && f.Saved()[0].next_seq == 10) break;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(f.Saved().size(), 1u);
  EXPECT_EQ(f.Saved()[0].next_seq, 10u);
}

class StateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("vigil_state_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(StateDirTest, ASecondEdgeOnTheSameStateDirIsRefused) {
  StatusOr<std::unique_ptr<StateStore>> first = OpenStateDir(dir_.string());
  ASSERT_TRUE(first.ok()) << first.status();
  StatusOr<std::unique_ptr<StateStore>> second = OpenStateDir(dir_.string());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another vigil edge (pid " + std::to_string(::getpid())),
            std::string_view::npos)
      << second.status();
  first->reset();
  EXPECT_TRUE(OpenStateDir(dir_.string()).ok()) << "the lock goes with its holder";
}

TEST_F(StateDirTest, RecordsRoundTripThroughOneAtomicFile) {
  auto store = std::move(*OpenStateDir(dir_.string()));
  std::vector<StreamRecord> loaded = *store->Load();
  EXPECT_TRUE(loaded.empty());
  const std::vector<StreamRecord> records = {{"cam 1", "rtsp://u:p@h/x", 12, std::nullopt, 0},
                                             {"door", "/v/door.mp4", 3, 1234, 1300}};
  ASSERT_TRUE(store->Save(records).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ledger.json.tmp"));
  EXPECT_EQ(*store->Load(), records);
  store.reset();
  EXPECT_EQ(*(*OpenStateDir(dir_.string()))->Load(), records);
}

TEST_F(StateDirTest, MalformedFilesAreDataLossNamingTheFile) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "ledger.json") << "{\"version\": 1, \"streams\": [{\"stream\": \"a\"}]}";
  StatusOr<std::vector<StreamRecord>> r = (*OpenStateDir(dir_.string()))->Load();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("ledger.json"), std::string_view::npos) << r.status();
}

TEST_F(StateDirTest, ImpossibleCursorsAreDataLoss) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "ledger.json")
      << R"({"version": 1, "streams": [{"stream": "a", "source": "x", "run": 1, "acked_through": 9, "next_seq": 9}]})";
  StatusOr<std::vector<StreamRecord>> r = (*OpenStateDir(dir_.string()))->Load();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("acked_through < next_seq"), std::string_view::npos) << r.status();
  std::filesystem::remove(dir_ / "ledger.json");
  std::filesystem::create_directories(dir_ / "streams");
  std::ofstream(dir_ / "streams" / "cam%zz.state") << "run 4\ncursor 18446744073709551615\nsource rtsp://h/x\n";
  r = (*OpenStateDir(dir_.string()))->Load();
  ASSERT_FALSE(r.ok()) << "no crash on a bad escape, no overflow on a huge cursor";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(StateDirTest, StateOfAnOlderVigilIsCarriedOver) {
  std::filesystem::create_directories(dir_ / "streams");
  std::ofstream(dir_ / "streams" / "cam%201.state") << "run 4\ncursor 17\nsource rtsp://h/x\n";
  std::ofstream(dir_ / "streams" / "door.state") << "run 2\ncursor none\nsource /v/door.mp4\n";
  std::vector<StreamRecord> r = *(*OpenStateDir(dir_.string()))->Load();
  std::sort(r.begin(), r.end(), [](const StreamRecord& a, const StreamRecord& b) { return a.stream < b.stream; });
  EXPECT_EQ(r, (std::vector<StreamRecord>{{"cam 1", "rtsp://h/x", 4, 17, 18}, {"door", "/v/door.mp4", 2, std::nullopt, 0}}));
}

// ---- The ledger under the links: a Courier drains its outbox over two in-memory links ----

namespace links {

using vigil::testing::FakeAggregator;
using vigil::testing::MemoryLink;

// What the edge does with the courier's callbacks (pipeline/edge.cc).
class LedgerHandler final : public transport::CourierHandler {
 public:
  explicit LedgerHandler(StreamLedger* l) : ledger(l) {}
  transport::Hello MakeHello() override {
    transport::Hello h;
    h.class_names = kNames;
    h.streams = ledger->ResumedStreams();
    return h;
  }
  void OnWelcome(const transport::Welcome& w, std::string_view) override { ledger->Admit(w); }
  void OnAck(const transport::Ack& a) override { ledger->OnAck(a); }
  void OnReject(const transport::Reject&) override { ++rejects; }
  void OnFenced(const Status&) override { ++fenced; }
  StreamLedger* ledger;
  std::atomic<int> rejects{0}, fenced{0};
};

transport::CourierOptions Options(std::vector<std::shared_ptr<transport::Link>> links) {
  transport::CourierOptions o;
  o.edge = "edge-l";
  o.links = std::move(links);
  o.backoff_initial = 1ms;
  o.backoff_max = 10ms;
  o.heartbeat_interval = 50ms;
  o.peer_timeout = 5000ms;
  o.max_batch = 5;
  return o;
}

// Numbers and records `n` frames of stream 0 (every third one a person: an event), as the edge's reader
// and worker do.
void RunFrames(StreamLedger& l, int n) {
  for (int i = 0; i < n; ++i) {
    uint64_t seq = 0;
    ASSERT_TRUE(l.Number(0, static_cast<uint64_t>(i), &seq));
    if (i % 3 == 0) {
      l.Record(0, Frame(seq), std::vector{kPerson});
    } else {
      l.Record(0, Frame(seq), {});
    }
  }
  l.Tick(/*force=*/true);
}

TEST(LedgerOverLinks, SwitchingLinksMidStreamStoresEveryFrameOnceInOrder) {
  Fixture f;
  auto agg = std::make_shared<FakeAggregator>();
  auto a = std::make_shared<MemoryLink>(agg, "a");
  auto b = std::make_shared<MemoryLink>(agg, "b");
  a->BreakAfter(7, /*then_down=*/true);  // the preferred link fails mid-stream and stays down
  auto l = f.Open({File("door")}, /*max_outbox=*/1000);
  LedgerHandler handler(l.get());
  auto courier = std::move(*transport::Courier::Start(Options({a, b}), &l->outbox(), &handler));
  ASSERT_TRUE(l->WaitAdmitted(20s));
  EXPECT_EQ(l->run(0), 1u);
  RunFrames(*l, 60);
  ASSERT_TRUE(l->outbox().WaitEmpty(20s)) << l->outbox().Stats().pending << " pending";
  EXPECT_EQ(courier->Stats().link_switches, 1u);
  EXPECT_EQ(a->breaks(), 1);

  // Every report stored once, in the order the ledger queued them, covering seqs 0..59 exactly.
  std::vector<FakeAggregator::Key> queued;
  for (const transport::Report& r : agg->StoredReports()) queued.emplace_back(r.stream, r.run, r.seq_first);
  EXPECT_EQ(agg->StoredOrder(), queued);
  uint64_t next = 0;
  for (const transport::Report& r : agg->StoredReports()) {
    EXPECT_EQ(r.seq_first, next) << "in order, no gap, no overlap";
    next = r.seq_last + 1;
  }
  EXPECT_EQ(next, 60u);
  EXPECT_EQ(l->acked_through(0), std::optional<uint64_t>(59));
  EXPECT_EQ(handler.rejects.load(), 0);
  courier->Close();
  l->Close();

  // A restart on the same state: a new instance (epoch 2) resumes the file's run after its cursor.
  auto again = f.Open({File("door")}, /*max_outbox=*/1000);
  LedgerHandler handler2(again.get());
  auto courier2 = std::move(*transport::Courier::Start(Options({b}), &again->outbox(), &handler2));
  ASSERT_TRUE(again->WaitAdmitted(20s));
  EXPECT_EQ(again->epoch(), 2u);
  EXPECT_EQ(again->run(0), 1u);
  EXPECT_EQ(again->resume(0).skip_through, std::optional<uint64_t>(59));
  courier2->Close();
}

TEST(LedgerOverLinks, AZombieIsFencedWhenANewerInstanceIsAdmitted) {
  Fixture f;
  auto agg = std::make_shared<FakeAggregator>();
  auto old_link = std::make_shared<MemoryLink>(agg, "old");
  auto l = f.Open({Camera("cam")});
  LedgerHandler zombie(l.get());
  auto courier = std::move(*transport::Courier::Start(Options({old_link}), &l->outbox(), &zombie));
  ASSERT_TRUE(l->WaitAdmitted(20s));
  // A second instance of the same edge id, with its own state, is admitted with a newer epoch.
  Fixture g;
  auto l2 = g.Open({Camera("cam")});
  LedgerHandler fresh(l2.get());
  auto courier2 = std::move(*transport::Courier::Start(Options({std::make_shared<MemoryLink>(agg, "new")}),
                                                       &l2->outbox(), &fresh));
  ASSERT_TRUE(l2->WaitAdmitted(20s));
  EXPECT_EQ(l2->epoch(), 2u);
  RunFrames(*l, 5);  // the zombie keeps going
  for (int i = 0; i < 2000 && zombie.fenced.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(zombie.fenced.load(), 1);
  EXPECT_TRUE(courier->Stats().fenced);
  for (const transport::Report& r : agg->StoredReports()) EXPECT_NE(r.run, l->run(0)) << "nothing of the zombie";
  courier->Close();
  courier2->Close();
}

}  // namespace links

}  // namespace
}  // namespace vigil::pipeline
