// aggregator::Confirmer (confirm.h): trackers per stream and the events waiting for their tracks.
#include "vigil/aggregator/confirm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <utility>

#include <spdlog/spdlog.h>

namespace vigil::aggregator {

using transport::Report;
using transport::ReportKind;

Status ValidateConfirmConfig(const ConfirmConfig& c) {
  if (Status st = ValidateTrackerOptions(c.tracker); !st.ok()) {
    return absl::InvalidArgumentError(StrCat("confirm.tracker: ", st.message()));
  }
  if (Status st = ValidateTrackRules(c.rules); !st.ok()) {
    return absl::InvalidArgumentError(StrCat("confirm.rules: ", st.message()));
  }
  for (size_t i = 0; i < c.overrides.size(); ++i) {
    if (Status st = ValidateTrackRules(c.overrides[i].rules); !st.ok()) {
      return absl::InvalidArgumentError(StrCat("confirm.overrides[", i, "]: ", st.message()));
    }
  }
  if (!(c.idle_s >= 0.1 && c.idle_s <= 3600)) {
    return absl::InvalidArgumentError(StrCat("confirm.idle_s: ", c.idle_s, " is outside [0.1, 3600]"));
  }
  const std::string& dev = c.association_device;
  if (dev != "auto" && dev != "cpu" && !(dev.starts_with("cuda:") && dev.size() > 5 && dev.size() <= 9 &&
                                         dev.find_first_not_of("0123456789", 5) == std::string::npos)) {
    return absl::InvalidArgumentError(StrCat("confirm.association.device: '", dev, "' is not auto, cpu or cuda:N"));
  }
  const DeviceAssociatorOptions& l = c.association_limits;
  if (l.max_streams < 1 || l.max_streams > 65536) {
    return absl::InvalidArgumentError(StrCat("confirm.association.max_streams: ", l.max_streams, " is outside 1..65536"));
  }
  if (l.max_tracks < 1 || l.max_tracks > 4096) {
    return absl::InvalidArgumentError(StrCat("confirm.association.max_tracks: ", l.max_tracks, " is outside 1..4096"));
  }
  if (l.max_detections < 1 || l.max_detections > transport::kMaxDetections) {
    return absl::InvalidArgumentError(StrCat("confirm.association.max_detections: ", l.max_detections,
                                             " is outside 1..", transport::kMaxDetections));
  }
  return absl::OkStatus();
}

struct Confirmer::Stream {
  explicit Stream(const ConfirmConfig& c, int window, uint64_t n) : tracker(c.tracker, window), number(n) {}
  Tracker tracker;
  uint64_t number;                    // unique per Confirmer: the Associator's name for the stream
  bool has_run = false;
  uint64_t run = 0, highest_seq = 0;  // the current run and its highest frame fed
  uint64_t frame = 0;                 // frames fed, across runs: the tracker's frame numbers
  // The stream's clock (ns from its first frame fed): the frames' presentation timestamps within a run (media time:
  // a file read faster than real time still moves its objects at their speed), the capture clock across runs and
  // where a source gives no timestamps. It never runs backwards.
  bool clock_started = false;
  uint64_t clock_run = 0;
  int64_t clock_ns = 0, last_pts_ns = 0, last_capture_ns = 0;
  int64_t last_fed_now = 0;           // the aggregator's clock at the last report (idle_s)
  std::unordered_map<int64_t, std::string> labels;  // live track → its label
  struct Pending {
    std::vector<int64_t> tracks;  // its live tracks
    std::string reason;           // the latest word on it
  };
  std::map<std::pair<uint64_t, uint64_t>, Pending> pending;                         // (run, seq) →
  std::unordered_map<int64_t, std::vector<std::pair<uint64_t, uint64_t>>> by_track;  // track → its pending events
};

// A frame ObserveBatch's first pass found for a stream's tracker; fed in the second.
struct Confirmer::Fed {
  Stream* s;
  const Report* r;
  uint64_t frame;  // the tracker's frame number
  int64_t time_ns;
  bool event;
  std::vector<TrackInput> inputs;
  std::vector<std::string> labels;
  size_t index;  // the report's in the batch
};

Confirmer::Confirmer(ConfirmConfig config, int64_t first_track_id, std::unique_ptr<Associator> associator)
    : config_(std::move(config)),
      next_track_id_(std::make_unique<int64_t>(std::max<int64_t>(first_track_id, 1))),
      associator_(std::move(associator)) {
  window_ = config_.rules.m;
  for (const ConfirmRuleOverride& o : config_.overrides) window_ = std::max(window_, o.rules.m);
}
Confirmer::~Confirmer() = default;

const TrackRules& Confirmer::RulesFor(const std::string& stream, const std::string& label) const {
  for (const ConfirmRuleOverride& o : config_.overrides) {
    const bool stream_ok = o.streams.empty() || std::find(o.streams.begin(), o.streams.end(), stream) != o.streams.end();
    const bool class_ok = o.classes.empty() || std::find(o.classes.begin(), o.classes.end(), label) != o.classes.end();
    if (stream_ok && class_ok) return o.rules;
  }
  return config_.rules;
}

void Confirmer::Begin() {
  saved_.clear();
  saved_stats_ = stats_;
  in_batch_ = true;
}

void Confirmer::Commit() {
  saved_.clear();
  in_batch_ = false;
}

void Confirmer::Rollback() {
  for (auto& [key, copy] : saved_) {
    if (copy == nullptr) {
      auto it = streams_.find(key);
      if (it != streams_.end() && associator_) associator_->Forget(it->second->number);
      streams_.erase(key);
    } else {
      streams_[key] = std::move(copy);
    }
  }
  saved_.clear();
  decisions_.clear();
  stats_ = saved_stats_;
  in_batch_ = false;
}

Confirmer::Stream& Confirmer::StreamOf(const std::string& edge, const std::string& stream, int64_t now_ns) {
  auto key = std::make_pair(edge, stream);
  auto it = streams_.find(key);
  if (in_batch_ && !saved_.contains(key)) {
    saved_.emplace(key, it == streams_.end() ? nullptr : std::make_unique<Stream>(*it->second));
  }
  if (it == streams_.end()) {
    it = streams_.emplace(key, std::make_unique<Stream>(config_, window_, next_stream_number_++)).first;
    it->second->tracker.set_id_source(next_track_id_.get());
  }
  it->second->last_fed_now = now_ns;
  return *it->second;
}

namespace {

// Advances `s`'s clock to a frame of `run` with these timestamps and returns it.
template <typename S>
int64_t Tick(S& s, uint64_t run, int64_t pts_ns, int64_t capture_ns) {
  if (!s.clock_started) {
    s.clock_started = true;
  } else if (run == s.clock_run && pts_ns > s.last_pts_ns) {
    s.clock_ns += pts_ns - s.last_pts_ns;
  } else {
    s.clock_ns += std::max<int64_t>(0, capture_ns - s.last_capture_ns);
  }
  s.clock_run = run;
  s.last_pts_ns = pts_ns;
  s.last_capture_ns = capture_ns;
  return s.clock_ns;
}

// "track 7 (person): " + what.
std::string About(int64_t id, const std::string& label, const std::string& what) {
  return StrCat("track ", id, " (", label, "): ", what);
}

}  // namespace

std::optional<EventVerdict> Confirmer::Observe(const Report& r, const std::vector<std::string>* class_names,
                                               bool current_epoch, int64_t now_ns) {
  const ObservedReport one{&r, class_names, current_epoch};
  return std::move(ObserveBatch(std::span<const ObservedReport>(&one, 1), now_ns).front());
}

uint64_t Confirmer::NextFrame(Stream& s, uint64_t frames) {
  s.frame += std::max<uint64_t>(frames, 1);
  ++stats_.frames;
  return s.frame;
}

std::vector<std::optional<EventVerdict>> Confirmer::ObserveBatch(std::span<const ObservedReport> reports,
                                                                 int64_t now_ns) {
  std::vector<std::optional<EventVerdict>> out(reports.size());
  // First pass: which frame of which stream each report feeds, and when in the stream's time (nothing here reads
  // a tracker: the second pass feeds them in this order).
  std::vector<Fed> fed;
  fed.reserve(reports.size());
  for (size_t i = 0; i < reports.size(); ++i) {
    const Report& r = *reports[i].report;
    if (r.kind == ReportKind::kDropped || r.kind == ReportKind::kLost) continue;  // nothing looked there
    const bool event = r.kind == ReportKind::kEvent;
    auto untracked = [&](std::string why) {
      ++stats_.skipped;
      if (!event) return;
      EventVerdict v;
      v.state = EventState::kConfirmed;
      v.reason = std::move(why);
      out[i] = std::move(v);
    };
    if (!reports[i].current_epoch) {
      untracked("not tracked: its epoch is not the edge's current one");
      continue;
    }
    Stream& s = StreamOf(r.edge, r.stream, now_ns);
    if (s.has_run && r.run < s.run) {
      untracked("not tracked: an older run re-sent after a newer one");
      continue;
    }
    if (s.has_run && r.run == s.run && r.seq_first <= s.highest_seq) {
      untracked("not tracked: re-sent after later frames");
      continue;
    }
    if (!s.has_run || r.run != s.run) {
      s.has_run = true;
      s.run = r.run;
    }
    s.highest_seq = r.seq_last;
    Fed f{&s, &r, 0, 0, event, {}, {}, i};
    if (event) {
      f.inputs.reserve(r.detections.size());
      f.labels.reserve(r.detections.size());
      const std::vector<std::string>* class_names = reports[i].class_names;
      for (const transport::ReportDetection& d : r.detections) {
        f.inputs.push_back({{d.x1, d.y1, d.x2, d.y2}, d.score, static_cast<int>(d.class_id)});
        const auto id = static_cast<size_t>(d.class_id);
        f.labels.push_back(class_names != nullptr && id < class_names->size() ? (*class_names)[id]
                                                                              : StrCat("class ", d.class_id));
      }
    }
    f.time_ns = Tick(s, r.run, r.pts_ns, r.capture_ns);
    f.frame = NextFrame(s, event ? 1 : r.seq_last - r.seq_first + 1);
    if (event) out[i].emplace();
    fed.push_back(std::move(f));
  }
  AssociateAndFeed(fed, out);
  return out;
}

void Confirmer::AssociateAndFeed(std::vector<Fed>& fed, std::vector<std::optional<EventVerdict>>& out) {
  std::vector<Association> given;
  if (associator_ && !fed.empty()) {
    std::vector<AssociationFrame> frames;
    frames.reserve(fed.size());
    std::vector<size_t> sent;  // fed index of each frame sent
    for (size_t k = 0; k < fed.size(); ++k) {
      const Fed& f = fed[k];
      // Frames the tracker would refuse are not associated anywhere (Update says why, below).
      if (!f.s->tracker.Check(f.frame, f.time_ns, f.inputs).ok()) {
        continue;
      }
      frames.push_back({f.s->number, &f.s->tracker, f.frame, f.time_ns, f.inputs});
      sent.push_back(k);
    }
    StatusOr<std::vector<Association>> got = associator_->Associate(frames);
    if (got.ok() && got->size() == frames.size()) {
      associator_failures_in_row_ = 0;
      given.resize(fed.size());
      for (size_t n = 0; n < sent.size(); ++n) given[sent[n]] = std::move((*got)[n]);
    } else {
      ++association_failures_;
      const std::string why = got.ok() ? StrCat(got->size(), " associations for ", frames.size(), " frames")
                                       : std::string(got.status().message());
      if (++associator_failures_in_row_ >= 3) {
        spdlog::error("confirm: association on {} failed {} batches in a row (last: {}); associating on the host "
                      "from now on",
                      associator_->where(), associator_failures_in_row_, why);
        associator_.reset();
      } else {
        spdlog::warn("confirm: association on {} failed ({}); this batch is associated on the host",
                     associator_->where(), why);
      }
    }
  }
  // Second pass: every frame in order. A stream's frames use the Associator's associations until one is declined
  // or refused; from there on, and for the next batch's copy, the host's.
  std::unordered_map<Stream*, bool> on_device;  // stream → all its frames so far applied with the given ones
  for (size_t k = 0; k < fed.size(); ++k) {
    Fed& f = fed[k];
    const Report& r = *f.r;
    const std::vector<int>* association = nullptr;
    if (!given.empty()) {
      auto [it, fresh] = on_device.try_emplace(f.s, true);
      if (it->second && given[k].ok) {
        association = &given[k].det_of_track;
      } else {
        if (it->second && !given[k].why.empty()) {
          spdlog::debug("confirm: {}/{} frame {} associated on the host: {}", r.edge, r.stream, f.frame, given[k].why);
        }
        it->second = false;
        ++association_fallbacks_;
      }
    }
    EventVerdict* verdict = out[f.index] ? &*out[f.index] : nullptr;
    const bool applied = Feed(*f.s, r.edge, r.stream, r.run, r.seq_first, f.frame, f.time_ns,
                              f.event ? &f.inputs : nullptr, f.labels, verdict, false, association);
    if (association != nullptr) {
      if (applied) {
        ++associated_;
      } else {
        on_device[f.s] = false;
        ++association_fallbacks_;
      }
    }
  }
  if (associator_) {
    for (const auto& [s, ok] : on_device) {
      if (ok) associator_->Advanced(s->number, s->tracker.state_id());
    }
  }
}

void Confirmer::Resume(const StoredEvent& e, int64_t now_ns) {
  Stream& s = StreamOf(e.edge, e.stream, now_ns);
  if (s.has_run && (e.run < s.run || (e.run == s.run && e.seq <= s.highest_seq))) return;
  if (s.has_run && e.run == s.run && e.seq > s.highest_seq + 1) {
    // The frames between two stored events carried no event: one frame without detections stands for them.
    const uint64_t frame = NextFrame(s, e.seq - s.highest_seq - 1);
    Feed(s, e.edge, e.stream, e.run, s.highest_seq + 1, frame, s.clock_ns, nullptr, {}, nullptr, false);
  }
  s.has_run = true;
  s.run = e.run;
  s.highest_seq = e.seq;
  std::vector<TrackInput> inputs;
  std::vector<std::string> labels;
  for (const StoredDetection& d : e.detections) {
    inputs.push_back({{d.x1, d.y1, d.x2, d.y2}, d.score, d.class_id});
    labels.push_back(d.label);
  }
  // A decided event only feeds its tracks; a pending one waits for them again (or is decided by what it finds).
  EventVerdict verdict;
  const bool pending = e.state == EventState::kPending;
  const int64_t t = Tick(s, e.run, e.pts_ns, e.capture_ns);
  Feed(s, e.edge, e.stream, e.run, e.seq, NextFrame(s, 1), t, &inputs, labels, pending ? &verdict : nullptr, pending);
}

bool Confirmer::Feed(Stream& s, const std::string& edge, const std::string& stream, uint64_t run, uint64_t seq,
                     uint64_t frame, int64_t time_ns, const std::vector<TrackInput>* detections,
                     const std::vector<std::string>& labels, EventVerdict* verdict, bool resumed_pending,
                     const std::vector<int>* association) {
  static const std::vector<TrackInput> kNone;
  const std::vector<TrackInput>& dets = detections != nullptr ? *detections : kNone;
  bool applied = association != nullptr;
  StatusOr<TrackUpdate> up = s.tracker.Update(frame, time_ns, dets, association);
  if (!up.ok() && association != nullptr) {  // a given association the tracker refused: the host's own
    spdlog::warn("confirm: {}/{}: run {} seq {}: the association from {} was refused, associated on the host: {}",
                 edge, stream, run, seq, associator_ ? associator_->where() : "elsewhere",
                 std::string(up.status().message()));
    applied = false;
    up = s.tracker.Update(frame, time_ns, dets);
  }
  if (!up.ok()) {  // ValidateReport keeps boxes finite; a tracker error is not expected, but never fatal
    spdlog::warn("confirm: {}/{}: run {} seq {} not tracked: {}", edge, stream, run, seq,
                 std::string(up.status().message()));
    if (verdict != nullptr) {
      verdict->state = EventState::kConfirmed;
      verdict->reason = StrCat("not tracked: ", up.status().message());
      ++stats_.stored_confirmed;
    }
    return applied;
  }
  const TrackerOptions& topt = config_.tracker;
  // The word on a live track now: confirmed needs the tracker's confirmation (min_hits) and the rules.
  auto judge = [&](const Track& t) {
    const std::string& label = s.labels[t.id];
    if (t.state == TrackState::kTentative) {
      return TrackVerdict{TrackVerdict::kPending, About(t.id, label, StrCat("tentative, matched in ", t.hits, " of ",
                                                                             topt.min_hits, " consecutive frames"))};
    }
    TrackVerdict v = Evaluate(RulesFor(stream, label), t, frame, false);
    v.reason = About(t.id, label, v.reason);
    return v;
  };
  // `by`: the track that confirmed it (0 for a rejection).
  auto decide = [&](std::pair<uint64_t, uint64_t> key, EventState state, std::string reason, int64_t by) {
    auto it = s.pending.find(key);
    if (it == s.pending.end()) return;
    for (int64_t other : it->second.tracks) {
      auto bt = s.by_track.find(other);
      if (bt == s.by_track.end()) continue;
      std::erase(bt->second, key);
      if (bt->second.empty()) s.by_track.erase(bt);
    }
    s.pending.erase(it);
    decisions_.push_back({edge, stream, key.first, key.second, state, std::move(reason), {},
                          by != 0 ? std::vector<int64_t>{by} : std::vector<int64_t>{}});
    ++(state == EventState::kConfirmed ? stats_.decided_confirmed : stats_.decided_rejected);
  };
  if (detections != nullptr) {
    for (size_t j = 0; j < up->track_of.size(); ++j) {
      if (up->track_of[j] != 0) s.labels.try_emplace(up->track_of[j], labels[j]);
    }
  }
  // Tracks that ended: their pending events lose them; one left with none is rejected.
  for (const Track& t : up->ended) {
    const std::string label = s.labels[t.id];
    auto bt = s.by_track.find(t.id);
    if (bt != s.by_track.end()) {
      const std::string why =
          t.state == TrackState::kTentative
              ? About(t.id, label, StrCat("ended tentative, matched in ", t.hits, " of ", topt.min_hits,
                                          " consecutive frames"))
              : About(t.id, label, Evaluate(RulesFor(stream, label), t, t.last_seen_seq, true).reason);
      const std::vector<std::pair<uint64_t, uint64_t>> keys = std::move(bt->second);
      s.by_track.erase(bt);
      for (const auto& key : keys) {
        auto it = s.pending.find(key);
        if (it == s.pending.end()) continue;
        std::erase(it->second.tracks, t.id);
        it->second.reason = why;
        if (it->second.tracks.empty()) decide(key, EventState::kRejected, why, 0);
      }
    }
    s.labels.erase(t.id);
  }
  // Live tracks with pending events: confirmed now?
  std::vector<std::pair<int64_t, std::string>> confirmed;
  for (const auto& [id, keys] : s.by_track) {
    const Track* t = s.tracker.Find(id);
    if (t == nullptr) continue;
    TrackVerdict v = judge(*t);
    if (v.kind == TrackVerdict::kConfirmed) confirmed.emplace_back(id, std::move(v.reason));
  }
  for (auto& [id, reason] : confirmed) {
    auto bt = s.by_track.find(id);
    if (bt == s.by_track.end()) continue;
    const std::vector<std::pair<uint64_t, uint64_t>> keys = bt->second;
    for (const auto& key : keys) decide(key, EventState::kConfirmed, reason, id);
  }
  if (verdict == nullptr) return applied;
  // This frame's event.
  verdict->track_ids = up->track_of;
  std::vector<int64_t> tracked;
  std::string pending_reason;
  for (size_t j = 0; j < up->track_of.size(); ++j) {
    const int64_t id = up->track_of[j];
    if (id == 0 || std::find(tracked.begin(), tracked.end(), id) != tracked.end()) continue;
    const Track* t = s.tracker.Find(id);
    if (t == nullptr) continue;
    TrackVerdict v = judge(*t);
    if (v.kind == TrackVerdict::kConfirmed) {
      verdict->state = EventState::kConfirmed;
      verdict->reason = std::move(v.reason);
      verdict->confirmed_by = id;
      if (resumed_pending) {
        decisions_.push_back({edge, stream, run, seq, EventState::kConfirmed, verdict->reason, {}, {id}});
        ++stats_.decided_confirmed;
      } else {
        ++stats_.stored_confirmed;
      }
      return applied;
    }
    tracked.push_back(id);
    if (pending_reason.empty()) pending_reason = std::move(v.reason);
  }
  if (tracked.empty()) {
    float best = 0;
    for (const TrackInput& d : detections != nullptr ? *detections : kNone) best = std::max(best, d.score);
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "no detection started or continued a track (best score %.2f, a new track needs %.2f)",
                  static_cast<double>(best), static_cast<double>(topt.new_track_score));
    verdict->state = EventState::kRejected;
    verdict->reason = buf;
    if (resumed_pending) {
      decisions_.push_back({edge, stream, run, seq, EventState::kRejected, verdict->reason, {}, {}});
      ++stats_.decided_rejected;
    } else {
      ++stats_.stored_rejected;
    }
    return applied;
  }
  verdict->state = EventState::kPending;
  verdict->reason = pending_reason;
  if (!resumed_pending) ++stats_.stored_pending;
  const auto key = std::make_pair(run, seq);
  s.pending[key] = {tracked, pending_reason};
  for (int64_t id : tracked) s.by_track[id].push_back(key);
  return applied;
}

void Confirmer::Expire(int64_t now_ns) {
  const auto idle = static_cast<int64_t>(config_.idle_s * 1e9);
  for (auto& [key, sp] : streams_) {
    if (now_ns - sp->last_fed_now < idle || (sp->pending.empty() && sp->tracker.tracks().empty())) continue;
    Stream& s = StreamOf(key.first, key.second, sp->last_fed_now);  // saved for a rollback; keeps its idle time
    // Rules a track met by now confirm it; the rest are judged as ended.
    struct Out {
      std::pair<uint64_t, uint64_t> key;
      EventState state;
      std::string reason;
      int64_t by;  // the track that confirmed it
    };
    std::vector<Out> out;
    for (auto& [ek, p] : s.pending) {
      EventState state = EventState::kRejected;
      std::string reason;
      int64_t by = 0;
      for (int64_t id : p.tracks) {
        const Track* t = s.tracker.Find(id);
        if (t == nullptr) continue;
        const std::string& label = s.labels[id];
        TrackVerdict v = Evaluate(RulesFor(key.second, label), *t, t->last_seen_seq, true);
        if (v.kind == TrackVerdict::kConfirmed && t->state != TrackState::kTentative) {
          state = EventState::kConfirmed;
          reason = About(id, label, v.reason);
          by = id;
          break;
        }
        reason = About(id, label, v.reason);
      }
      if (reason.empty()) reason = p.reason;
      out.push_back({ek, state, StrCat(reason, state == EventState::kRejected ? "; the stream went silent" : ""), by});
    }
    for (Out& o : out) {
      decisions_.push_back({key.first, key.second, o.key.first, o.key.second, o.state, std::move(o.reason), {},
                            o.by != 0 ? std::vector<int64_t>{o.by} : std::vector<int64_t>{}});
      ++(o.state == EventState::kConfirmed ? stats_.decided_confirmed : stats_.decided_rejected);
    }
    s.pending.clear();
    s.by_track.clear();
    s.labels.clear();
    s.tracker.Restart();  // its clock goes on: time never runs backwards
  }
}

std::vector<EventDecision> Confirmer::TakeDecisions() { return std::exchange(decisions_, {}); }

ConfirmStats Confirmer::stats() const {
  ConfirmStats s = stats_;
  s.pending = 0;
  s.tracks = 0;
  for (const auto& [key, st] : streams_) {
    s.pending += st->pending.size();
    s.tracks += st->tracker.tracks().size();
  }
  s.associated = associated_;
  s.association_fallbacks = association_fallbacks_;
  s.association_failures = association_failures_;
  return s;
}

std::string Confirmer::association_where() const { return associator_ ? associator_->where() : "host"; }

}  // namespace vigil::aggregator
