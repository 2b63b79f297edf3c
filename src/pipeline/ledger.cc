#include "vigil/common/deadline.h"
#include "vigil/pipeline/ledger.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

namespace vigil::pipeline {

using transport::Report;
using transport::ReportKind;

namespace {

// A pending range of marks of one kind and reason (progress, or drops of one reason).
struct PendingRange {
  Report report;
  int64_t started_ns = 0;  // clock->SteadyNs() when the range was started
};

bool Extends(const std::optional<PendingRange>& p, uint64_t seq) { return p && p->report.seq_last + 1 == seq; }

}  // namespace

struct StreamLedger::Stream {
  LedgerStream spec;
  std::optional<StreamRecord> loaded;  // as the store had it (only when the source is the same)
  StreamRecord rec;                    // current, valid once admitted
  StreamResume resume;
  std::optional<PendingRange> progress;
  std::optional<PendingRange> drops;    // consecutive drops of one reason
  std::deque<Report> held;              // marks waiting for room in the outbox (live streams)
  LedgerCounters counters;
};

struct StreamLedger::Impl {
  LedgerOptions opt;
  transport::Outbox outbox;
  Mutex save_mu VIGIL_ACQUIRED_BEFORE(mu);  // serialises StateStore::Save; taken before mu
  mutable Mutex mu;
  mutable CondVar cv;  // admitted, dirty, stop
  std::vector<Stream> streams VIGIL_GUARDED_BY(mu);  // sized once in Open
  // Each stream's spec (in `streams`, never moved after Open), immutable after Open: read without mu.
  std::vector<const LedgerStream*> specs;
  std::map<std::string, size_t, std::less<>> index;  // immutable after Open
  bool admitted VIGIL_GUARDED_BY(mu) = false;
  uint64_t epoch VIGIL_GUARDED_BY(mu) = 0;
  bool dirty VIGIL_GUARDED_BY(mu) = false;
  bool stop VIGIL_GUARDED_BY(mu) = false;
  bool runs_durable VIGIL_GUARDED_BY(mu) = false;  // the runs decided by Admit are on disk
  std::atomic<bool> cancel_waits{false};
  std::thread writer;

  explicit Impl(LedgerOptions o) : opt(std::move(o)), outbox(opt.max_outbox) {}

  std::vector<StreamRecord> Snapshot() const VIGIL_REQUIRES(mu) {
    std::vector<StreamRecord> out;
    for (const Stream& s : streams) {
      if (admitted) {
        out.push_back(s.rec);
      } else if (s.loaded) {
        out.push_back(*s.loaded);
      }
    }
    return out;
  }

  // Writes the current state. The snapshot is taken under save_mu, so a later write never carries older
  // values than an earlier one. Marks the runs durable once a write succeeded after Admit.
  Status SaveNow() VIGIL_EXCLUDES(mu, save_mu) {
    MutexLock save_lock(save_mu);
    std::vector<StreamRecord> snapshot;
    bool covers_runs = false;
    {
      MutexLock lock(mu);
      snapshot = Snapshot();
      covers_runs = admitted;
      dirty = false;
    }
    Status st = opt.store->Save(snapshot);
    MutexLock lock(mu);
    if (!st.ok()) {
      dirty = true;
      for (Stream& s : streams) ++s.counters.persist_failures;
    } else if (covers_runs && !runs_durable) {
      runs_durable = true;
      cv.NotifyAll();
    }
    return st;
  }

  void WriterLoop() VIGIL_EXCLUDES(mu, save_mu) {
    bool failing = false;
    MutexLock lock(mu);
    for (;;) {
      while (!stop && !dirty) cv.Wait(lock);
      if (!dirty) return;  // stopping, nothing left to write
      lock.Unlock();
      const Status st = SaveNow();
      lock.Lock();
      if (!st.ok()) {
        if (!failing) spdlog::warn("ledger: cannot persist the stream state: {}; retrying", std::string(st.message()));
        failing = true;
        if (stop) return;
      } else {
        if (failing) spdlog::info("ledger: stream state persisted again in {}", opt.store->where());
        failing = false;
      }
      // The pause between writes is real time (as before): a FakeClock in tests does not stop the writer.
      const Deadline pause_end = Deadline::After(opt.persist_interval);
      while (!stop) {
        if (!cv.WaitUntil(lock, pause_end)) break;
      }
    }
  }

  // Hands `r` to the outbox under the stream's policy; false when it found no room and was held (as a drop
  // mark) instead. Push may wait for acks.
  bool Push(size_t i, Report r, std::optional<transport::DevicePayload> device = std::nullopt) VIGIL_EXCLUDES(mu) {
    const bool live = specs[i]->live;
    r.publish_ns = opt.clock->WallNs();
    StatusOr<uint64_t> id = absl::ResourceExhaustedError("not pushed");
    if (live) {
      id = outbox.Push(r, std::chrono::milliseconds(0), device);
    } else {
      // A replayable stream waits for room (it must lose nothing), in slices so that a stop cancels the
      // wait: an unreported frame of a file lies after the acknowledged cursor and is read again.
      const Deadline deadline = Deadline::After(opt.replayable_wait);
      do {
        id = outbox.Push(r, std::chrono::milliseconds(100), device);
      } while (absl::IsResourceExhausted(id.status()) && !cancel_waits.load() && !deadline.passed());
      if (absl::IsResourceExhausted(id.status()) && cancel_waits.load()) return true;
    }
    if (id.ok() || absl::IsCancelled(id.status())) return true;
    MutexLock lock(mu);
    Stream& s = streams[i];
    if (!absl::IsResourceExhausted(id.status())) {
      // A report the protocol cannot carry (e.g. more detections than kMaxDetections, a non-finite box):
      // its frames are reported as dropped rather than left as a gap.
      spdlog::error("ledger: stream '{}': report of seq {}..{} cannot be sent, reporting it as dropped: {}", r.stream,
                    r.seq_first, r.seq_last, std::string(id.status().message()));
      if (r.kind == ReportKind::kDropped || r.kind == ReportKind::kLost) return true;  // cannot happen: no rows
      Report d = MarkOf(s, ReportKind::kDropped, r.seq_first, "invalid_report");
      d.seq_last = r.seq_last;
      s.counters.dropped += r.seq_last - r.seq_first + 1;
      s.held.push_back(std::move(d));
      return false;
    }
    // Full: the frames become a drop mark (reason "backpressure") held until there is room. A held mark
    // that still finds no room goes back to the front, in order.
    if (r.kind == ReportKind::kDropped || r.kind == ReportKind::kLost) {
      s.held.push_front(std::move(r));
      return false;
    }
    const uint64_t n = r.seq_last - r.seq_first + 1;
    s.counters.backpressure_drops += n;
    s.counters.dropped += n;
    Report d = MarkOf(s, ReportKind::kDropped, r.seq_first, "backpressure");
    d.seq_last = r.seq_last;
    if (!s.held.empty() && s.held.back().kind == ReportKind::kDropped && s.held.back().rule == d.rule &&
        s.held.back().seq_last + 1 == d.seq_first) {
      s.held.back().seq_last = d.seq_last;
    } else {
      s.held.push_back(std::move(d));
    }
    return false;
  }

  Report MarkOf(const Stream& s, ReportKind kind, uint64_t seq, std::string_view reason) const {
    Report r;
    r.stream = s.spec.id;
    r.run = s.rec.run;
    r.seq_first = r.seq_last = seq;
    r.kind = kind;
    r.rule = std::string(reason);
    return r;
  }
};

namespace {

bool IsReplayable(const LedgerStream& s) { return !s.live; }

}  // namespace

StatusOr<std::unique_ptr<StreamLedger>> StreamLedger::Open(LedgerOptions options, std::vector<LedgerStream> streams) {
  if (!options.store) return absl::InvalidArgumentError("ledger: no state store");
  if (options.clock == nullptr) return absl::InvalidArgumentError("ledger: no clock");
  if (options.max_outbox == 0) return absl::InvalidArgumentError("ledger: max_outbox must be at least 1");
  VIGIL_ASSIGN_OR_RETURN(std::vector<StreamRecord> records, options.store->Load());
  auto impl = std::make_unique<Impl>(std::move(options));
  {
    Impl& im = *impl;
    MutexLock lock(im.mu);  // no other thread yet: for the analysis
    for (LedgerStream& spec : streams) {
      if (im.index.count(spec.id) != 0) {
        return absl::InvalidArgumentError(StrCat("ledger: stream '", spec.id, "' given twice"));
      }
      im.index.emplace(spec.id, im.streams.size());
      Stream& s = im.streams.emplace_back();
      for (const StreamRecord& r : records) {
        if (r.stream == spec.id && r.source == spec.source && r.run != 0) s.loaded = r;
      }
      s.spec = std::move(spec);
    }
    for (const Stream& s : im.streams) im.specs.push_back(&s.spec);  // `streams` is complete: never moves again
  }
  StreamLedger* ledger = new StreamLedger(std::move(impl));
  Impl* d = ledger->impl_.get();
  d->writer = std::thread([d] { d->WriterLoop(); });
  return std::unique_ptr<StreamLedger>(ledger);
}

StreamLedger::StreamLedger(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StreamLedger::~StreamLedger() { Close(); }

size_t StreamLedger::size() const { return impl_->specs.size(); }
const std::string& StreamLedger::stream_id(size_t i) const { return impl_->specs[i]->id; }
transport::Outbox& StreamLedger::outbox() { return impl_->outbox; }

std::vector<transport::HelloStream> StreamLedger::ResumedStreams() const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  std::vector<transport::HelloStream> out;
  for (const Stream& s : d.streams) {
    const uint64_t run = d.admitted ? s.rec.run : s.loaded ? s.loaded->run : 0;
    if (run != 0) out.push_back({s.spec.id, run});
  }
  return out;
}

void StreamLedger::Admit(const transport::Welcome& welcome) {
  Impl& d = *impl_;
  std::vector<std::pair<size_t, Report>> lost;
  {
    MutexLock lock(d.mu);
    if (d.admitted) {
      if (welcome.epoch != d.epoch) spdlog::info("ledger: epoch {} → {}", d.epoch, welcome.epoch);
      d.epoch = welcome.epoch;
      return;
    }
    d.epoch = welcome.epoch;
    bool new_runs = false;
    for (size_t i = 0; i < d.streams.size(); ++i) {
      Stream& s = d.streams[i];
      const transport::WelcomeStream* ws = nullptr;
      for (const transport::WelcomeStream& w : welcome.streams) {
        if (s.loaded && w.stream == s.spec.id && w.run == s.loaded->run) ws = &w;
      }
      // What the aggregator stored of the run (-1: nothing), made consistent whatever it sent.
      const int64_t contiguous = ws ? std::max<int64_t>(ws->contiguous_through, -1) : -1;
      const int64_t highest = ws ? std::max(ws->highest_seq, contiguous) : -1;
      StreamResume& r = s.resume;
      if (!s.loaded) {
        s.rec = {s.spec.id, s.spec.source, welcome.epoch, std::nullopt, 0};
        r = {StreamResume::kNewRun, welcome.epoch, std::nullopt, 0, 0};
        new_runs = true;
        spdlog::info("stream '{}': new run {}", s.spec.id, r.run);
        continue;
      }
      s.rec = *s.loaded;
      if (contiguous >= 0) {
        s.rec.acked_through = std::max(s.rec.acked_through.value_or(0), static_cast<uint64_t>(contiguous));
      }
      r.run = s.rec.run;
      if (IsReplayable(s.spec)) {
        r.kind = StreamResume::kResumeReplayable;
        r.skip_through = s.rec.acked_through;
        spdlog::info("stream '{}': resuming run {} after seq {}", s.spec.id, r.run,
                     r.skip_through ? std::to_string(*r.skip_through) : "none");
        continue;
      }
      r.kind = StreamResume::kResumeLive;
      // New pictures go above every seq the dead instance assigned (its high-water mark), every seq the
      // aggregator stored and every mirrored picture this node processes again. Everything between the
      // acknowledged prefix and that point that the aggregator does not have and this node has no picture of
      // was numbered and never delivered: kLost ranges report it (the aggregator stores only the seqs it is
      // missing, so a hole left below the highest stored seq — a drop mark still pending in the dead process —
      // is closed too).
      const uint64_t prefix_end = s.rec.acked_through ? *s.rec.acked_through + 1 : 0;  // first seq not known stored
      const uint64_t above_stored = std::max(static_cast<uint64_t>(highest + 1), prefix_end);
      r.replay.clear();
      if (s.spec.mirrored && s.spec.mirrored->run == r.run) {
        for (uint64_t q : s.spec.mirrored->seqs) {
          if (q >= prefix_end && (r.replay.empty() || q > r.replay.back())) r.replay.push_back(q);
        }
      }
      r.first_seq = std::max(s.rec.next_seq, above_stored);
      if (!r.replay.empty()) r.first_seq = std::max(r.first_seq, r.replay.back() + 1);
      // The seqs in [prefix_end, first_seq) without a picture to process again, as ranges; those at or above
      // above_stored are certainly lost.
      r.lost = 0;
      size_t k = 0;
      for (uint64_t q = prefix_end; q < r.first_seq;) {
        while (k < r.replay.size() && r.replay[k] < q) ++k;
        if (k < r.replay.size() && r.replay[k] == q) {
          ++q;
          continue;
        }
        const uint64_t end = k < r.replay.size() ? std::min(r.replay[k], r.first_seq) : r.first_seq;  // exclusive
        Report m = d.MarkOf(s, ReportKind::kLost, q, "lost_on_restart");
        m.seq_last = end - 1;
        lost.emplace_back(i, std::move(m));
        if (end > above_stored) r.lost += end - std::max(q, above_stored);
        q = end;
      }
      s.counters.lost_on_restart += r.lost;
      s.counters.replayed += r.replay.size();
      s.rec.next_seq = r.first_seq;
      spdlog::info("stream '{}' (live): resuming run {} at seq {} (aggregator stored up to {}; {} mirrored picture(s) "
                   "processed again; {} seqs lost on restart)",
                   s.spec.id, r.run, r.first_seq, highest, r.replay.size(), r.lost);
    }
    d.admitted = true;
    // Every run resumed is in the store already (a takeover, a restart): numbering need not wait for the
    // write below (a takeover's first pictures would wait for an fsync, ~20–150 ms on a busy disk).
    if (!new_runs) d.runs_durable = true;
    d.cv.NotifyAll();
  }
  // A new run must be durable before any of its frames is numbered: a crash now would otherwise start yet
  // another run for the same pictures. Until a write succeeds, Number() waits (files) or refuses (live).
  if (Status st = d.SaveNow(); !st.ok()) {
    spdlog::warn("ledger: cannot persist the runs: {}; the writer retries and no picture is numbered until then",
                 std::string(st.message()));
    MutexLock lock(d.mu);
    d.cv.NotifyAll();
  }
  for (auto& [i, m] : lost) d.Push(i, std::move(m));
}

bool StreamLedger::admitted() const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  return d.admitted;
}

bool StreamLedger::WaitAdmitted(std::chrono::milliseconds timeout) const {
  Impl& d = *impl_;
  // A real-time deadline (as before): WaitAdmitted's timeout is not the ledger clock's time.
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(d.mu);
  while (!d.admitted && !d.stop) {
    if (!d.cv.WaitUntil(lock, deadline)) break;
  }
  return d.admitted;
}

uint64_t StreamLedger::epoch() const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  return d.epoch;
}

StreamResume StreamLedger::resume(size_t stream) const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  return d.streams[stream].resume;
}

bool StreamLedger::Number(size_t stream, uint64_t position, uint64_t* seq) {
  Impl& d = *impl_;
  MutexLock lock(d.mu);
  Stream& s = d.streams[stream];
  if (!d.admitted || !d.runs_durable) {
    // A file's picture must get its position: wait for the runs to reach the disk (or a stop). A live
    // picture is refused and counted.
    while (!s.spec.live && d.admitted && !d.runs_durable && !d.stop && !d.cancel_waits.load()) {
      d.cv.WaitFor(lock, std::chrono::milliseconds(100));
    }
    if (!d.admitted || !d.runs_durable) {
      ++s.counters.not_numbered;
      return false;
    }
  }
  if (IsReplayable(s.spec)) {
    s.rec.next_seq = std::max(s.rec.next_seq, position + 1);
    if (s.resume.skip_through && position <= *s.resume.skip_through) {
      ++s.counters.skipped_resume;
      return false;
    }
    *seq = position;
  } else {
    *seq = s.rec.next_seq++;
  }
  d.dirty = true;
  d.cv.NotifyAll();
  return true;
}

void StreamLedger::Dropped(size_t stream, uint64_t seq, std::string_view reason) {
  Impl& d = *impl_;
  std::optional<Report> out;
  {
    MutexLock lock(d.mu);
    Stream& s = d.streams[stream];
    ++s.counters.dropped;
    if (Extends(s.drops, seq) && s.drops->report.rule == reason) {
      s.drops->report.seq_last = seq;
      return;
    }
    if (s.drops) out = std::move(s.drops->report);
    s.drops = PendingRange{d.MarkOf(s, ReportKind::kDropped, seq, reason), d.opt.clock->SteadyNs()};
  }
  if (out) d.Push(stream, std::move(*out));
}

StreamLedger::Recorded StreamLedger::Record(size_t stream, const FrameInfo& f,
                                            std::span<const detect::Detection> detections,
                                            const detect::DeviceRows* device_rows) {
  Impl& d = *impl_;
  Verdict v;
  std::vector<Report> out;
  std::optional<transport::DevicePayload> event_rows;  // for the event (the last of `out`)
  {
    MutexLock lock(d.mu);
    Stream& s = d.streams[stream];
    v = s.spec.rules.Evaluate(std::vector<detect::Detection>(detections.begin(), detections.end()), f.pts_ns);
    if (v.event || (s.progress && !Extends(s.progress, f.seq))) {
      if (s.progress) out.push_back(std::move(s.progress->report));
      s.progress.reset();
    }
    if (v.event) {
      Report r = d.MarkOf(s, ReportKind::kEvent, f.seq, "rules");
      r.severity = v.severity;
      r.capture_ns = f.capture_ns;
      r.pts_ns = f.pts_ns;
      r.width = f.width;
      r.height = f.height;
      r.detections.reserve(v.detections.size());
      for (const detect::Detection& det : v.detections) {
        r.detections.push_back({det.x1, det.y1, det.x2, det.y2, det.score, static_cast<float>(det.class_id)});
      }
      // Every detection qualified: the device rows are the event's rows, in the same order.
      if (device_rows != nullptr && device_rows->rows != nullptr && device_rows->count == detections.size() &&
          v.detections.size() == detections.size() && !detections.empty()) {
        transport::DevicePayload p;
        p.count = device_rows->count;
        p.device = device_rows->device;
        p.device_rows = device_rows->rows;
        p.keepalive = device_rows->memory;
        p.download = [rows = *device_rows](transport::ReportDetection* dst) {
          return detect::DownloadRows(rows, reinterpret_cast<float*>(dst));
        };
        event_rows = std::move(p);
      }
      out.push_back(std::move(r));
      ++s.counters.events;
    } else if (s.progress) {
      s.progress->report.seq_last = f.seq;
    } else {
      Report r = d.MarkOf(s, ReportKind::kProgress, f.seq, "");
      r.capture_ns = f.capture_ns;
      r.pts_ns = f.pts_ns;
      r.width = f.width;
      r.height = f.height;
      s.progress = PendingRange{std::move(r), d.opt.clock->SteadyNs()};
    }
    if (!v.event) ++s.counters.progress_marks;
  }
  for (size_t k = 0; k < out.size(); ++k) {
    const bool event = v.event && k + 1 == out.size();
    d.Push(stream, std::move(out[k]), event ? std::move(event_rows) : std::nullopt);
  }
  return {std::move(v), static_cast<int>(out.size())};
}

void StreamLedger::Tick(bool force) {
  Impl& d = *impl_;
  std::vector<std::pair<size_t, Report>> out;
  {
    MutexLock lock(d.mu);
    const int64_t now = d.opt.clock->SteadyNs();
    const int64_t max_age = std::chrono::duration_cast<std::chrono::nanoseconds>(d.opt.progress_flush).count();
    for (size_t i = 0; i < d.streams.size(); ++i) {
      Stream& s = d.streams[i];
      for (std::optional<PendingRange>* p : {&s.progress, &s.drops}) {
        if (*p && (force || now - (*p)->started_ns >= max_age)) {
          out.emplace_back(i, std::move((*p)->report));
          p->reset();
        }
      }
    }
  }
  for (auto& [i, r] : out) d.Push(i, std::move(r));
  // Held marks, oldest first; the first that still finds no room goes back to the front and ends the round,
  // so their order is kept and a full outbox costs one attempt per stream.
  for (size_t i = 0; i < d.specs.size(); ++i) {
    for (;;) {
      std::optional<Report> next;
      {
        MutexLock lock(d.mu);
        if (d.streams[i].held.empty()) break;
        next = std::move(d.streams[i].held.front());
        d.streams[i].held.pop_front();
      }
      if (!d.Push(i, std::move(*next))) break;
    }
  }
}

void StreamLedger::Refused(const transport::Reject& reject) {
  Impl& d = *impl_;
  if (reject.reason != transport::RejectReason::kInvalid) return;
  auto it = d.index.find(reject.stream);
  if (it == d.index.end()) return;
  {
    MutexLock lock(d.mu);
    Stream& s = d.streams[it->second];
    if (!d.admitted || reject.run != s.rec.run || reject.seq_first > reject.seq_last) return;
    Report m = d.MarkOf(s, ReportKind::kDropped, reject.seq_first, "invalid_report");
    m.seq_last = reject.seq_last;
    s.counters.dropped += reject.seq_last - reject.seq_first + 1;
    s.held.push_back(std::move(m));
  }
}

void StreamLedger::OnAck(const transport::Ack& ack) {
  Impl& d = *impl_;
  if (ack.contiguous_through < 0) return;
  auto it = d.index.find(ack.stream);
  if (it == d.index.end()) return;
  MutexLock lock(d.mu);
  Stream& s = d.streams[it->second];
  if (!d.admitted || ack.run != s.rec.run) return;
  const uint64_t through = static_cast<uint64_t>(ack.contiguous_through);
  if (!s.rec.acked_through || through > *s.rec.acked_through) {
    s.rec.acked_through = through;
    d.dirty = true;
    d.cv.NotifyAll();
  }
}

std::optional<uint64_t> StreamLedger::acked_through(size_t stream) const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  return d.streams[stream].rec.acked_through;
}

uint64_t StreamLedger::run(size_t stream) const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  return d.streams[stream].rec.run;
}

LedgerCounters StreamLedger::counters(size_t stream) const {
  const Impl& d = *impl_;
  MutexLock lock(d.mu);
  return d.streams[stream].counters;
}

Status StreamLedger::Persist() { return impl_->SaveNow(); }

void StreamLedger::CancelWaits() {
  Impl& d = *impl_;
  d.cancel_waits = true;
  MutexLock lock(d.mu);
  d.cv.NotifyAll();
}

void StreamLedger::Close() {
  Impl& d = *impl_;
  {
    MutexLock lock(d.mu);
    if (d.stop) return;
    d.stop = true;
    d.cv.NotifyAll();
  }
  d.outbox.Close();
  d.writer.join();
}

}  // namespace vigil::pipeline
