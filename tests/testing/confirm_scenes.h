// Random report batches fed to two Confirmers — one through an Associator, one associating on the host alone — and
// compared verdict by verdict, decision by decision (tests/aggregator with the host Associator and misbehaving
// ones, tests/cuda with the device one).
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "testing/track_scenes.h"
#include "vigil/aggregator/confirm.h"

namespace vigil::testing {

using aggregator::Confirmer;
using aggregator::ConfirmConfig;
using aggregator::ConfirmStats;
using aggregator::EventDecision;
using aggregator::EventVerdict;
using aggregator::ObservedReport;
using aggregator::TrackInput;
using transport::Report;
using transport::ReportKind;

// Reports of several streams of two edges made from random scenes: events with their detections, progress ranges,
// now and then a dropped frame.
class ReportSource {
 public:
  explicit ReportSource(uint32_t seed) : rng_(seed) {
    SceneOptions so;
    so.max_objects = 8;
    so.gap_chance = 0.02;
    for (int s = 0; s < 6; ++s) {
      scenes_.emplace_back(seed * 100 + static_cast<uint32_t>(s), so);
      next_seq_.push_back(0);
    }
  }
  Report Next() {
    const int s = static_cast<int>(rng_() % scenes_.size());
    SceneStream::Frame f = scenes_[s].Next();
    Report r;
    r.edge = s < 3 ? "edge-a" : "edge-b";
    r.stream = StrCat("cam", s);
    r.run = 1;
    r.epoch = 1;
    r.seq_first = r.seq_last = next_seq_[s]++;
    r.pts_ns = f.time_ns;
    r.capture_ns = 1'700'000'000'000'000'000 + f.time_ns;
    r.width = 1920;
    r.height = 1080;
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (u < 0.08 || f.dets.empty()) {
      r.kind = ReportKind::kProgress;
      const uint64_t extra = rng_() % 3;
      r.seq_last += extra;
      next_seq_[s] += extra;
    } else if (u < 0.1) {
      r.kind = ReportKind::kDropped;
    } else {
      r.kind = ReportKind::kEvent;
      r.rule = "any";
      for (const TrackInput& d : f.dets) {
        r.detections.push_back({d.box.x1, d.box.y1, d.box.x2, d.box.y2, d.score, static_cast<float>(d.class_id)});
      }
    }
    return r;
  }

 private:
  std::mt19937 rng_;
  std::vector<SceneStream> scenes_;
  std::vector<uint64_t> next_seq_;
};

inline const std::vector<std::string> kNames = {"person", "bicycle", "car"};

inline ConfirmConfig RandomConfig() {
  ConfirmConfig c;
  c.enabled = true;
  c.tracker.min_hits = 3;
  c.tracker.max_lost_s = 0.5;
  c.rules = {.k = 4, .m = 8, .min_duration_s = 0.2, .min_travel_px = 10};
  c.overrides = {{{}, {"car"}, {.k = 2, .m = 3, .min_duration_s = 0, .min_travel_px = 30}}};
  c.idle_s = 1;
  return c;
}

inline void ExpectSameVerdicts(const std::vector<std::optional<EventVerdict>>& a,
                        const std::vector<std::optional<EventVerdict>>& b, int batch) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].has_value(), b[i].has_value());
    if (!a[i]) continue;
    EXPECT_EQ(a[i]->state, b[i]->state) << "batch " << batch << " report " << i;
    EXPECT_EQ(a[i]->reason, b[i]->reason) << "batch " << batch << " report " << i;
    EXPECT_EQ(a[i]->track_ids, b[i]->track_ids) << "batch " << batch << " report " << i;
    EXPECT_EQ(a[i]->confirmed_by, b[i]->confirmed_by);
  }
}

inline void ExpectSameDecisions(const std::vector<EventDecision>& a, const std::vector<EventDecision>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].edge, b[i].edge);
    EXPECT_EQ(a[i].stream, b[i].stream);
    EXPECT_EQ(a[i].seq, b[i].seq);
    EXPECT_EQ(a[i].state, b[i].state);
    EXPECT_EQ(a[i].reason, b[i].reason);
    EXPECT_EQ(a[i].tracks, b[i].tracks);
  }
}

// Feeds the same random batches to `with` and to a Confirmer associating on the host alone, and compares.
inline void RunConfirmers(Confirmer& with, uint32_t seed, int batches) {
  Confirmer alone(RandomConfig());
  ReportSource src(seed);
  std::mt19937 rng(seed);
  int64_t now = 1'000'000'000;
  std::vector<Report> replay;
  uint64_t verdicts = 0, decisions = 0;
  for (int b = 0; b < batches; ++b) {
    std::vector<Report> reports = std::move(replay);
    replay.clear();
    if (reports.empty()) {
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int k = 0; k < n; ++k) reports.push_back(src.Next());
    }
    std::vector<ObservedReport> obs;
    for (const Report& r : reports) obs.push_back({&r, &kNames, true});
    with.Begin();
    alone.Begin();
    const std::vector<std::optional<EventVerdict>> vw = with.ObserveBatch(obs, now);
    const std::vector<std::optional<EventVerdict>> va = alone.ObserveBatch(obs, now);
    ExpectSameVerdicts(vw, va, b);
    for (const auto& v : va) verdicts += v ? 1 : 0;
    if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.1) {  // the store failed: undone, sent again
      with.Rollback();
      alone.Rollback();
      replay = std::move(reports);
    } else {
      const std::vector<EventDecision> dw = with.TakeDecisions(), da = alone.TakeDecisions();
      ExpectSameDecisions(dw, da);
      decisions += da.size();
      with.Commit();
      alone.Commit();
    }
    now += 40'000'000;
    if (b % 25 == 24) {  // a pause: idle streams end their tracks
      now += 1'500'000'000;
      with.Begin();
      alone.Begin();
      with.Expire(now);
      alone.Expire(now);
      ExpectSameDecisions(with.TakeDecisions(), alone.TakeDecisions());
      with.Commit();
      alone.Commit();
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(verdicts, 8u * static_cast<uint64_t>(batches));
  EXPECT_GT(decisions, static_cast<uint64_t>(batches) / 10);
  const ConfirmStats sw = with.stats(), sa = alone.stats();
  EXPECT_EQ(sw.stored_confirmed, sa.stored_confirmed);
  EXPECT_EQ(sw.stored_pending, sa.stored_pending);
  EXPECT_EQ(sw.stored_rejected, sa.stored_rejected);
  EXPECT_EQ(sw.decided_confirmed, sa.decided_confirmed);
  EXPECT_EQ(sw.tracks, sa.tracks);
  EXPECT_GT(sa.stored_confirmed, 0u);
  EXPECT_GT(sa.stored_pending, 0u);
  EXPECT_GT(sa.stored_rejected, 0u);
  EXPECT_EQ(sa.associated, 0u) << "no Associator: nothing associated elsewhere";
}

}  // namespace vigil::testing
