// aggregator/tracking.h: ByteTrack-style association with a constant-velocity model, and track rules.
#include "vigil/aggregator/tracking.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>

namespace vigil::aggregator {
namespace {

constexpr double kNever = 1e9;  // the cost of a pair that must not be matched (above every max_cost)

uint64_t NewStateId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

bool Finite(const TrackBox& b) {
  return std::isfinite(b.x1) && std::isfinite(b.y1) && std::isfinite(b.x2) && std::isfinite(b.y2) && b.x2 >= b.x1 &&
         b.y2 >= b.y1;
}

TrackBox Advance(const TrackBox& b, const TrackBox& v, double seconds) {
  const auto s = static_cast<float>(seconds);
  return {b.x1 + v.x1 * s, b.y1 + v.y1 * s, b.x2 + v.x2 * s, b.y2 + v.y2 * s};
}

double CentreDistance(const TrackBox& a, const TrackBox& b) {
  const double dx = (a.x1 + a.x2 - b.x1 - b.x2) / 2.0, dy = (a.y1 + a.y2 - b.y1 - b.y2) / 2.0;
  return std::sqrt(dx * dx + dy * dy);
}

}  // namespace

float IoU(const TrackBox& a, const TrackBox& b) {
  const float iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1), ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  if (iw <= 0 || ih <= 0) return 0;
  const float inter = iw * ih;
  const float uni = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter;
  return uni > 0 ? inter / uni : 0;
}

std::string_view ToString(TrackState s) {
  switch (s) {
    case TrackState::kTentative:
      return "tentative";
    case TrackState::kConfirmed:
      return "confirmed";
    case TrackState::kLost:
      return "lost";
  }
  return "unknown";
}

std::string_view ToString(TrackVerdict::Kind k) {
  switch (k) {
    case TrackVerdict::kPending:
      return "pending";
    case TrackVerdict::kConfirmed:
      return "confirmed";
    case TrackVerdict::kRejected:
      return "rejected";
  }
  return "unknown";
}

Status ValidateTrackerOptions(const TrackerOptions& o) {
  auto bad = [](std::string what) { return absl::InvalidArgumentError(StrCat("tracker: ", what)); };
  if (!(o.high_score > 0 && o.high_score <= 1)) return bad(StrCat("high_score ", o.high_score, ": must be in (0, 1]"));
  if (!(o.low_score >= 0 && o.low_score < o.high_score)) {
    return bad(StrCat("low_score ", o.low_score, ": must be in [0, high_score ", o.high_score, ")"));
  }
  if (!(o.new_track_score >= o.high_score && o.new_track_score <= 1)) {
    return bad(StrCat("new_track_score ", o.new_track_score, ": must be in [high_score ", o.high_score, ", 1]"));
  }
  if (!(o.match_iou > 0 && o.match_iou <= 1)) return bad(StrCat("match_iou ", o.match_iou, ": must be in (0, 1]"));
  if (!(o.low_match_iou > 0 && o.low_match_iou <= 1)) {
    return bad(StrCat("low_match_iou ", o.low_match_iou, ": must be in (0, 1]"));
  }
  if (o.min_hits < 1 || o.min_hits > 1000) return bad(StrCat("min_hits ", o.min_hits, ": must be 1..1000"));
  if (!(o.max_lost_s >= 0 && o.max_lost_s <= 3600)) return bad(StrCat("max_lost_s ", o.max_lost_s, ": must be 0..3600"));
  if (!(o.velocity_smoothing > 0 && o.velocity_smoothing <= 1)) {
    return bad(StrCat("velocity_smoothing ", o.velocity_smoothing, ": must be in (0, 1]"));
  }
  return absl::OkStatus();
}

Status ValidateTrackRules(const TrackRules& r) {
  if (r.k < 1 || r.m < r.k || r.m > 1000) {
    return absl::InvalidArgumentError(StrCat("track rules: k ", r.k, " of m ", r.m, ": need 1 <= k <= m <= 1000"));
  }
  if (!(r.min_duration_s >= 0) || !(r.min_travel_px >= 0)) {
    return absl::InvalidArgumentError("track rules: min_duration_s and min_travel_px must be >= 0");
  }
  return absl::OkStatus();
}

std::vector<int> Assign(std::span<const double> cost, size_t rows, size_t cols, double max_cost) {
  std::vector<int> out(rows, -1);
  if (rows == 0 || cols == 0) return out;
  // Square, 1-based (the e-maxx formulation of the Hungarian algorithm with potentials): padding and forbidden
  // pairs cost kNever, so they are taken only when nothing else is left, and dropped below.
  const size_t n = std::max(rows, cols);
  auto c = [&](size_t i, size_t j) {  // 1-based
    if (i > rows || j > cols) return kNever;
    const double v = cost[(i - 1) * cols + (j - 1)];
    return v > max_cost ? kNever : v;
  };
  std::vector<double> u(n + 1, 0), v(n + 1, 0), minv(n + 1);
  std::vector<size_t> p(n + 1, 0), way(n + 1, 0);
  std::vector<char> used(n + 1);
  for (size_t i = 1; i <= n; ++i) {
    p[0] = i;
    size_t j0 = 0;
    std::fill(minv.begin(), minv.end(), std::numeric_limits<double>::infinity());
    std::fill(used.begin(), used.end(), 0);
    do {
      used[j0] = 1;
      const size_t i0 = p[j0];
      double delta = std::numeric_limits<double>::infinity();
      size_t j1 = 0;
      for (size_t j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const double cur = c(i0, j) - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (size_t j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      const size_t j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  for (size_t j = 1; j <= n; ++j) {
    const size_t i = p[j];
    if (i >= 1 && i <= rows && j <= cols && cost[(i - 1) * cols + (j - 1)] <= max_cost) {
      out[i - 1] = static_cast<int>(j - 1);
    }
  }
  return out;
}

Tracker::Tracker(TrackerOptions options, int window)
    : opt_(options), window_(std::max(1, window)), state_id_(NewStateId()) {}

const Track* Tracker::Find(int64_t id) const {
  for (const Track& t : tracks_) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

Status Tracker::Check(uint64_t seq, int64_t time_ns, std::span<const TrackInput> detections) const {
  if (started_ && (seq <= last_seq_ || time_ns < last_ns_)) {
    return absl::InvalidArgumentError(StrCat("tracker: frame ", seq, " at ", time_ns, " ns after frame ", last_seq_,
                                             " at ", last_ns_, " ns: frames must come in order"));
  }
  for (size_t j = 0; j < detections.size(); ++j) {
    if (!Finite(detections[j].box) || !std::isfinite(detections[j].score)) {
      return absl::InvalidArgumentError(StrCat("tracker: frame ", seq, " detection ", j, ": not a finite box"));
    }
  }
  return absl::OkStatus();
}

StatusOr<TrackUpdate> Tracker::Update(uint64_t seq, int64_t time_ns, std::span<const TrackInput> detections,
                                      const std::vector<int>* association) {
  VIGIL_RETURN_IF_ERROR(Check(seq, time_ns, detections));
  const size_t nt = tracks_.size(), nd = detections.size();
  if (association != nullptr) {  // checked before anything changes
    if (association->size() != nt) {
      return absl::InvalidArgumentError(StrCat("tracker: frame ", seq, ": the association has ", association->size(),
                                               " entries for ", nt, " tracks"));
    }
    std::vector<char> seen(nd, 0);
    for (size_t i = 0; i < nt; ++i) {
      const int j = (*association)[i];
      if (j < 0) continue;
      const auto ju = static_cast<size_t>(j);
      const auto bad = [&](std::string_view why) {
        return absl::InvalidArgumentError(StrCat("tracker: frame ", seq, ": the association gives track ",
                                                 tracks_[i].id, " detection ", j, ": ", why));
      };
      if (ju >= nd) return bad(StrCat("there are ", nd, " detections"));
      if (seen[ju]) return bad("given to another track too");
      seen[ju] = 1;
      const TrackInput& d = detections[ju];
      if (d.class_id != tracks_[i].class_id) return bad("another class");
      const bool recent = started_ && tracks_[i].last_seen_seq == last_seq_;
      if (!(d.score >= opt_.high_score || (recent && d.score >= opt_.low_score))) {
        return bad("its score cannot match that track");
      }
    }
  }
  const bool previous_frame_known = started_;
  const uint64_t previous_seq = last_seq_;
  started_ = true;
  last_seq_ = seq;
  last_ns_ = time_ns;
  state_id_ = NewStateId();

  TrackUpdate up;
  up.track_of.assign(nd, 0);
  std::vector<int>& det_of_track = up.det_of_track;
  det_of_track.assign(nt, -1);
  std::vector<char> det_taken(nd, 0);
  if (association != nullptr) {
    det_of_track = *association;
    for (int j : det_of_track) {
      if (j >= 0) det_taken[static_cast<size_t>(j)] = 1;
    }
  } else {
    std::vector<TrackBox> predicted(nt);
    for (size_t i = 0; i < nt; ++i) {
      predicted[i] =
          Advance(tracks_[i].box, velocity_[i], static_cast<double>(time_ns - tracks_[i].last_seen_ns) * 1e-9);
    }
    // One stage: the given tracks against the given detections, same class only, by 1 − IoU.
    auto stage = [&](const std::vector<size_t>& ts, const std::vector<size_t>& ds, float min_iou) {
      if (ts.empty() || ds.empty()) return;
      std::vector<double> cost(ts.size() * ds.size());
      for (size_t a = 0; a < ts.size(); ++a) {
        for (size_t b = 0; b < ds.size(); ++b) {
          const TrackInput& d = detections[ds[b]];
          cost[a * ds.size() + b] =
              d.class_id == tracks_[ts[a]].class_id ? 1.0 - IoU(predicted[ts[a]], d.box) : kNever;
        }
      }
      const std::vector<int> got = Assign(cost, ts.size(), ds.size(), 1.0 - min_iou);
      for (size_t a = 0; a < ts.size(); ++a) {
        if (got[a] < 0) continue;
        det_of_track[ts[a]] = static_cast<int>(ds[static_cast<size_t>(got[a])]);
        det_taken[ds[static_cast<size_t>(got[a])]] = 1;
      }
    };
    std::vector<size_t> all_tracks(nt), high, low;
    for (size_t i = 0; i < nt; ++i) all_tracks[i] = i;
    for (size_t j = 0; j < nd; ++j) {
      if (detections[j].score >= opt_.high_score) {
        high.push_back(j);
      } else if (detections[j].score >= opt_.low_score) {
        low.push_back(j);
      }
    }
    stage(all_tracks, high, opt_.match_iou);
    std::vector<size_t> recent_unmatched;  // seen in the previous frame, unmatched by stage one
    for (size_t i = 0; i < nt; ++i) {
      if (det_of_track[i] < 0 && previous_frame_known && tracks_[i].last_seen_seq == previous_seq) {
        recent_unmatched.push_back(i);
      }
    }
    stage(recent_unmatched, low, opt_.low_match_iou);
  }

  std::vector<Track> kept;
  std::vector<TrackBox> kept_velocity;
  for (size_t i = 0; i < nt; ++i) {
    Track& t = tracks_[i];
    if (det_of_track[i] >= 0) {
      const TrackInput& d = detections[static_cast<size_t>(det_of_track[i])];
      const double dt = static_cast<double>(time_ns - t.last_seen_ns) * 1e-9;
      if (dt > 0) {
        const TrackBox observed{static_cast<float>((d.box.x1 - t.box.x1) / dt), static_cast<float>((d.box.y1 - t.box.y1) / dt),
                                static_cast<float>((d.box.x2 - t.box.x2) / dt), static_cast<float>((d.box.y2 - t.box.y2) / dt)};
        const auto b = static_cast<float>(t.hits == 1 ? 1.0 : opt_.velocity_smoothing);
        TrackBox& v = velocity_[i];
        v = {b * observed.x1 + (1 - b) * v.x1, b * observed.y1 + (1 - b) * v.y1, b * observed.x2 + (1 - b) * v.x2,
             b * observed.y2 + (1 - b) * v.y2};
      }
      t.box = d.box;
      t.last_seen_ns = time_ns;
      t.last_seen_seq = seq;
      ++t.hits;
      t.recent.push_back(seq);
      if (t.state == TrackState::kLost || (t.state == TrackState::kTentative && t.hits >= static_cast<uint32_t>(opt_.min_hits))) {
        t.state = TrackState::kConfirmed;
      }
      up.track_of[static_cast<size_t>(det_of_track[i])] = t.id;
    } else if (t.state == TrackState::kTentative) {  // missed before it was confirmed: gone
      up.ended.push_back(std::move(t));
      continue;
    } else if (static_cast<double>(time_ns - t.last_seen_ns) * 1e-9 > opt_.max_lost_s) {
      up.ended.push_back(std::move(t));
      continue;
    } else {
      t.state = TrackState::kLost;
    }
    while (!t.recent.empty() && t.recent.front() + static_cast<uint64_t>(window_) <= seq) t.recent.pop_front();
    kept.push_back(std::move(t));
    kept_velocity.push_back(velocity_[i]);
  }
  for (size_t j = 0; j < nd; ++j) {
    const TrackInput& d = detections[j];
    if (det_taken[j] || d.score < opt_.new_track_score) continue;
    Track t;
    t.id = id_source_ != nullptr ? (*id_source_)++ : next_id_++;
    t.class_id = d.class_id;
    t.state = opt_.min_hits <= 1 ? TrackState::kConfirmed : TrackState::kTentative;
    t.box = t.first_box = d.box;
    t.first_ns = t.last_seen_ns = time_ns;
    t.first_seq = t.last_seen_seq = seq;
    t.hits = 1;
    t.recent.push_back(seq);
    up.track_of[j] = t.id;
    kept.push_back(std::move(t));
    kept_velocity.push_back({});
  }
  tracks_ = std::move(kept);
  velocity_ = std::move(kept_velocity);
  return up;
}

void Tracker::Restart() {
  tracks_.clear();
  velocity_.clear();
  started_ = false;
  state_id_ = NewStateId();
}

TrackVerdict Evaluate(const TrackRules& rules, const Track& track, uint64_t seq, bool ended) {
  uint64_t seen = 0;
  for (uint64_t s : track.recent) seen += (s + static_cast<uint64_t>(rules.m) > seq) ? 1 : 0;
  const double duration = static_cast<double>(track.last_seen_ns - track.first_ns) * 1e-9;
  const double travel = CentreDistance(track.first_box, track.box);
  char facts[160];
  std::snprintf(facts, sizeof facts, "seen in %llu of the last %d frames, for %.2f s, travelled %.0f px",
                static_cast<unsigned long long>(seen), rules.m, duration, travel);
  std::string missing;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) missing += (missing.empty() ? "" : ", ") + what;
  };
  need(seen >= static_cast<uint64_t>(rules.k), StrCat("needs ", rules.k, " of ", rules.m, " frames"));
  char buf[64];
  std::snprintf(buf, sizeof buf, "needs %.2f s", rules.min_duration_s);
  need(duration >= rules.min_duration_s, buf);
  std::snprintf(buf, sizeof buf, "needs %.0f px of travel", rules.min_travel_px);
  need(travel >= rules.min_travel_px, buf);
  TrackVerdict v;
  if (missing.empty()) {
    v.kind = TrackVerdict::kConfirmed;
    v.reason = facts;
  } else {
    v.kind = ended ? TrackVerdict::kRejected : TrackVerdict::kPending;
    v.reason = StrCat(facts, ended ? "; ended, " : "; ", missing);
  }
  return v;
}

}  // namespace vigil::aggregator
