// A hot standby's sources before the takeover (standby_gate.h).
#include "vigil/pipeline/standby_gate.h"

namespace vigil::pipeline {

StandbyGate::StandbyGate(size_t streams) : streams_(streams) {}

StandbyGate::Verdict StandbyGate::Admit(size_t stream, bool live, uint64_t position) {
  MutexLock lock(mu_);
  PerStream& s = streams_[stream];
  for (;;) {
    if (closed_ || s.released) return Verdict::kStop;
    if (open_) return Verdict::kPass;
    if (live || (s.through && position <= *s.through)) {
      ++s.discarded;
      if (!live) s.next = position + 1;
      return Verdict::kDiscard;
    }
    s.next = position;  // held: the stream resumes here
    cv_.Wait(lock);
  }
}

void StandbyGate::Raise(size_t stream, std::optional<uint64_t> acked_through) {
  if (!acked_through) return;
  {
    MutexLock lock(mu_);
    PerStream& s = streams_[stream];
    if (s.through && *s.through >= *acked_through) return;
    s.through = acked_through;
  }
  cv_.NotifyAll();
}

void StandbyGate::Open() {
  {
    MutexLock lock(mu_);
    open_ = true;
  }
  cv_.NotifyAll();
}

void StandbyGate::Close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.NotifyAll();
}

void StandbyGate::Release(size_t stream) {
  {
    MutexLock lock(mu_);
    streams_[stream].released = true;
  }
  cv_.NotifyAll();
}

uint64_t StandbyGate::next_position(size_t stream) const {
  MutexLock lock(mu_);
  return streams_[stream].next;
}

uint64_t StandbyGate::discarded(size_t stream) const {
  MutexLock lock(mu_);
  return streams_[stream].discarded;
}

std::optional<uint64_t> StandbyGate::cursor(size_t stream) const {
  MutexLock lock(mu_);
  return streams_[stream].through;
}

}  // namespace vigil::pipeline
