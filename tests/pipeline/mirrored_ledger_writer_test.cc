// The standby's writer of mirrored ledger states (pipeline/mirrored_ledger_writer.h): Offer never waits for the
// disk, the latest state wins, Flush waits for the last one offered.
#include "vigil/pipeline/mirrored_ledger_writer.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace vigil::pipeline {
namespace {

// A store whose Save blocks until released (a disk in a long fsync), and records what it saved.
class GatedStore final : public StateStore {
 public:
  StatusOr<std::vector<StreamRecord>> Load() override { return std::vector<StreamRecord>{}; }
  Status Save(const std::vector<StreamRecord>& records) override {
    std::unique_lock lock(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    saved_.push_back(records.empty() ? 0 : records.front().next_seq);
    return fail_ ? absl::InternalError("disk full") : absl::OkStatus();
  }
  std::string where() const override { return "gated"; }
  void WaitEntered(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }
  void Open(bool fail = false) {
    std::lock_guard lock(mu_);
    open_ = true;
    fail_ = fail;
    cv_.notify_all();
  }
  std::vector<uint64_t> saved() {
    std::lock_guard lock(mu_);
    return saved_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  bool open_ = false, fail_ = false;
  std::vector<uint64_t> saved_;
};

std::vector<StreamRecord> State(uint64_t next_seq) { return {{"cam", "rtsp://c", 1, std::nullopt, next_seq}}; }

TEST(MirroredLedgerWriter, OfferNeverWaitsForTheDiskAndTheLatestStateWins) {
  GatedStore store;
  std::vector<uint64_t> passed;
  std::vector<bool> ok;
  std::mutex mu;
  MirroredLedgerWriter writer(&store, [&](const std::vector<StreamRecord>& r, const Status& st) {
    std::lock_guard lock(mu);
    passed.push_back(r.front().next_seq);
    ok.push_back(st.ok());
  });
  writer.Offer(State(1));
  store.WaitEntered(1);  // the writer is inside Save(1), held: the disk is slow
  for (uint64_t q = 2; q <= 50; ++q) writer.Offer(State(q));  // returns at once each time (a hang fails the test)
  EXPECT_EQ(writer.skipped(), 48u) << "2..49 replaced before they were saved";
  store.Open();
  writer.Flush();
  EXPECT_EQ(store.saved(), (std::vector<uint64_t>{1, 50}));
  EXPECT_EQ(writer.saved(), 2u);
  std::lock_guard lock(mu);
  EXPECT_EQ(passed, (std::vector<uint64_t>{1, 50}));
  EXPECT_EQ(ok, (std::vector<bool>{true, true}));
}

TEST(MirroredLedgerWriter, AFailedSaveIsPassedOnAndKept) {
  GatedStore store;
  store.Open(/*fail=*/true);
  Status seen;
  MirroredLedgerWriter writer(&store, [&](const std::vector<StreamRecord>&, const Status& st) { seen = st; });
  writer.Offer(State(7));
  writer.Flush();
  EXPECT_EQ(seen.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(writer.last_error().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(writer.saved(), 0u);
}

TEST(MirroredLedgerWriter, ThePendingStateIsSavedBeforeTheWriterGoes) {
  GatedStore store;
  store.Open();
  {
    MirroredLedgerWriter writer(&store, nullptr);
    writer.Offer(State(3));
  }
  EXPECT_EQ(store.saved(), std::vector<uint64_t>{3});
}

}  // namespace
}  // namespace vigil::pipeline
