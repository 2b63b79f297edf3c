// The standby's window of mirrored live pictures (pipeline/mirror_window.h).
#include "vigil/pipeline/mirror_window.h"

#include <algorithm>
#include <utility>

namespace vigil::pipeline {

MirrorWindow::MirrorWindow(std::vector<std::string> streams, size_t frames_per_stream)
    : frames_per_stream_(std::max<size_t>(frames_per_stream, 1)) {
  for (std::string& id : streams) streams_.try_emplace(std::move(id));
}

void MirrorWindow::Forget(PerStream& s,
                          std::map<std::pair<uint64_t, uint64_t>, replication::MirroredFrame>::iterator it) {
  s.stats.bytes -= it->second.bytes();
  s.frames.erase(it);
}

void MirrorWindow::Add(replication::MirroredFrame frame) {
  MutexLock lock(mu_);
  auto st = streams_.find(frame.stream);
  if (st == streams_.end()) {
    ++unknown_;
    return;
  }
  PerStream& s = st->second;
  ++s.stats.received;
  // Acknowledged already (the ack's state overtook nothing: frames precede later states, but an ack can arrive
  // for a picture numbered earlier), or of a run the ledger left: not kept.
  if (s.Stale(frame.run, frame.seq)) {
    ++s.stats.acked;
    return;
  }
  const std::pair<uint64_t, uint64_t> key{frame.run, frame.seq};
  if (auto old = s.frames.find(key); old != s.frames.end()) Forget(s, old);
  s.stats.bytes += frame.bytes();
  s.frames.emplace(key, std::move(frame));
  while (s.frames.size() > frames_per_stream_) {
    Forget(s, s.frames.begin());
    ++s.stats.evicted;
  }
  s.stats.held = s.frames.size();
}

bool MirrorWindow::Wanted(const replication::MirroredFrame& frame) {
  MutexLock lock(mu_);
  auto st = streams_.find(frame.stream);
  if (st == streams_.end() || !st->second.Stale(frame.run, frame.seq)) return true;
  ++st->second.stats.received;
  ++st->second.stats.acked;
  return false;
}

void MirrorWindow::AddResult(replication::MirroredResult result) {
  MutexLock lock(mu_);
  auto st = streams_.find(result.stream);
  if (st == streams_.end()) {
    ++unknown_;
    return;
  }
  PerStream& s = st->second;
  ++s.stats.results_received;
  if (s.Stale(result.run, result.seq)) return;
  const std::pair<uint64_t, uint64_t> key{result.run, result.seq};
  s.results.insert_or_assign(key, std::move(result));
  while (s.results.size() > frames_per_stream_) {
    s.results.erase(s.results.begin());
    ++s.stats.results_evicted;
  }
  s.stats.results_held = s.results.size();
}

void MirrorWindow::Follow(const std::vector<StreamRecord>& records) {
  MutexLock lock(mu_);
  for (const StreamRecord& r : records) {
    auto st = streams_.find(r.stream);
    if (st == streams_.end()) continue;
    PerStream& s = st->second;
    s.run = r.run;
    s.acked_through = r.acked_through;
    for (auto it = s.frames.begin(); it != s.frames.end();) {
      if (s.Stale(it->first.first, it->first.second)) {
        auto gone = it++;
        Forget(s, gone);
        ++s.stats.acked;
      } else {
        ++it;
      }
    }
    std::erase_if(s.results, [&](const auto& kv) { return s.Stale(kv.first.first, kv.first.second); });
    s.stats.held = s.frames.size();
    s.stats.results_held = s.results.size();
  }
}

std::optional<MirroredSeqs> MirrorWindow::Seqs(const std::string& stream, uint64_t run) const {
  MutexLock lock(mu_);
  auto st = streams_.find(stream);
  if (st == streams_.end()) return std::nullopt;
  MirroredSeqs out{run, {}};
  for (const auto& [key, frame] : st->second.frames) {
    if (key.first == run) out.seqs.push_back(key.second);
  }
  const size_t pictures = out.seqs.size();
  for (const auto& [key, result] : st->second.results) {
    if (key.first == run) out.seqs.push_back(key.second);
  }
  std::inplace_merge(out.seqs.begin(), out.seqs.begin() + static_cast<std::ptrdiff_t>(pictures), out.seqs.end());
  out.seqs.erase(std::unique(out.seqs.begin(), out.seqs.end()), out.seqs.end());
  if (out.seqs.empty()) return std::nullopt;
  return out;
}

std::optional<MirroredSeqs> MirrorWindow::Held(const std::string& stream) const {
  std::optional<uint64_t> run;
  {
    MutexLock lock(mu_);
    auto st = streams_.find(stream);
    if (st != streams_.end()) run = st->second.run;
  }
  return run ? Seqs(stream, *run) : std::nullopt;
}

std::vector<replication::MirroredFrame> MirrorWindow::Take(const std::string& stream, uint64_t run,
                                                           const std::vector<uint64_t>& seqs) {
  MutexLock lock(mu_);
  std::vector<replication::MirroredFrame> out;
  auto st = streams_.find(stream);
  if (st == streams_.end()) return out;
  PerStream& s = st->second;
  for (uint64_t q : seqs) {
    auto it = s.frames.find({run, q});
    auto r = s.results.find({run, q});
    if (it == s.frames.end() && r == s.results.end()) continue;
    if (it != s.frames.end()) {
      out.push_back(std::move(it->second));
    } else {  // only the result: enough to re-publish it
      replication::MirroredFrame f;
      f.stream = stream;
      f.run = run;
      f.seq = q;
      f.capture_ns = r->second.capture_ns;
      f.pts_ns = r->second.pts_ns;
      f.width = r->second.width;
      f.height = r->second.height;
      out.push_back(std::move(f));
    }
    if (r != s.results.end()) out.back().result = std::move(r->second);
  }
  s.frames.clear();
  s.results.clear();
  s.stats.held = 0;
  s.stats.bytes = 0;
  s.stats.results_held = 0;
  return out;
}

MirrorWindowStats MirrorWindow::stats(const std::string& stream) const {
  MutexLock lock(mu_);
  auto st = streams_.find(stream);
  return st == streams_.end() ? MirrorWindowStats{} : st->second.stats;
}

uint64_t MirrorWindow::unknown() const {
  MutexLock lock(mu_);
  return unknown_;
}

}  // namespace vigil::pipeline
