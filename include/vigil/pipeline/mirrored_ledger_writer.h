// vigil/pipeline/mirrored_ledger_writer.h — a hot standby's writer of the primary's mirrored ledger states.
//
// The standby keeps every ledger state its primary mirrors in its own state_dir (StateStore::Save: a whole-file
// write, two fsyncs). Done on the replication channel's reader thread, a slow disk held the reader — and with it
// the primary's heartbeat answers queued behind the state — so a loaded standby judged a healthy primary gone. The
// writer takes the states off that thread: Offer only stores the latest (the latest state wins: each one is the
// whole ledger) and wakes the writer thread, which saves it and then calls `on_saved`. Flush waits until the last
// state offered is saved (the takeover opens the state_dir right after).
//
// Thread-safety: Offer, Flush and the accessors from any thread; `on_saved` runs on the writer thread, one call at a
// time, in offer order (states skipped for a newer one are never saved nor passed); it must not call Flush. Ownership: `store` is not owned
// and must outlive the writer. The destructor saves what is pending, then joins.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/pipeline/ledger.h"

namespace vigil::pipeline {

class MirroredLedgerWriter {
 public:
  MirroredLedgerWriter(StateStore* store, std::function<void(const std::vector<StreamRecord>&, const Status&)> on_saved);
  ~MirroredLedgerWriter();
  MirroredLedgerWriter(const MirroredLedgerWriter&) = delete;
  MirroredLedgerWriter& operator=(const MirroredLedgerWriter&) = delete;

  // Never waits for the disk: replaces a state not yet saved.
  void Offer(std::vector<StreamRecord> records);
  // Returns once every state offered before the call is saved or replaced by a saved later one (or failed).
  void Flush();
  uint64_t saved() const;     // states saved
  uint64_t skipped() const;   // states replaced by a later one before they were saved
  Status last_error() const;  // the last Save's error (ok when it succeeded)

 private:
  void Run();

  StateStore* const store_;
  const std::function<void(const std::vector<StreamRecord>&, const Status&)> on_saved_;
  mutable Mutex mu_;
  CondVar cv_;
  std::optional<std::vector<StreamRecord>> pending_ VIGIL_GUARDED_BY(mu_);
  uint64_t offered_ VIGIL_GUARDED_BY(mu_) = 0;  // states offered
  uint64_t done_ VIGIL_GUARDED_BY(mu_) = 0;     // states offered before the last save
  uint64_t saved_ VIGIL_GUARDED_BY(mu_) = 0;
  uint64_t skipped_ VIGIL_GUARDED_BY(mu_) = 0;
  Status last_error_ VIGIL_GUARDED_BY(mu_);
  bool stop_ VIGIL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace vigil::pipeline
