// A hot standby's writer of the mirrored ledger states (pipeline/mirrored_ledger_writer.h).
#include "vigil/pipeline/mirrored_ledger_writer.h"

#include <utility>

namespace vigil::pipeline {

MirroredLedgerWriter::MirroredLedgerWriter(StateStore* store,
                                           std::function<void(const std::vector<StreamRecord>&, const Status&)> on_saved)
    : store_(store), on_saved_(std::move(on_saved)), thread_([this] { Run(); }) {}

MirroredLedgerWriter::~MirroredLedgerWriter() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void MirroredLedgerWriter::Offer(std::vector<StreamRecord> records) {
  {
    MutexLock lock(mu_);
    if (pending_) ++skipped_;
    pending_ = std::move(records);
    ++offered_;
  }
  cv_.NotifyAll();
}

void MirroredLedgerWriter::Flush() {
  MutexLock lock(mu_);
  const uint64_t want = offered_;
  while (done_ < want) cv_.Wait(lock);
}

uint64_t MirroredLedgerWriter::saved() const {
  MutexLock lock(mu_);
  return saved_;
}

uint64_t MirroredLedgerWriter::skipped() const {
  MutexLock lock(mu_);
  return skipped_;
}

Status MirroredLedgerWriter::last_error() const {
  MutexLock lock(mu_);
  return last_error_;
}

void MirroredLedgerWriter::Run() {
  MutexLock lock(mu_);
  for (;;) {
    while (!stop_ && !pending_.has_value()) cv_.Wait(lock);
    if (!pending_) return;  // stopping, nothing left to save
    std::vector<StreamRecord> records = std::move(*pending_);
    pending_.reset();
    const uint64_t covers = offered_;  // every state offered so far is this one or older
    lock.Unlock();
    Status st = store_->Save(records);
    if (on_saved_) on_saved_(records, st);
    lock.Lock();
    if (st.ok()) ++saved_;
    last_error_ = std::move(st);
    done_ = covers;
    cv_.NotifyAll();
  }
}

}  // namespace vigil::pipeline
