// Random multi-stream detection sequences, and the equality harness that holds an Associator (association.h) to the
// host tracker: tests/aggregator (the host Associator, the Confirmer) and tests/cuda (the device one) use both.
//
// Each stream is a scene of objects moving at constant velocity with jitter, appearing and leaving, overlapping,
// of several classes; detections are sometimes missed, sometimes low-score (an occlusion), sometimes spurious; the
// frames' order within a report is shuffled, and now and then a stream pauses longer than max_lost_s. Values have
// fractional bits everywhere, so an association computed with other rounding would show.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "vigil/aggregator/association.h"
#include "vigil/aggregator/tracking.h"

namespace vigil::testing {

struct SceneOptions {
  int max_objects = 12;       // live objects per stream at most
  int classes = 3;
  int initial_objects = 0;    // live at the first frame
  double spawn = 0.35;        // new objects per frame on average
  double gap_chance = 0.03;   // a frame arrives 1.2 s after the previous one (tracks get lost and end)
  float width = 1920, height = 1080;
};

class SceneStream {
 public:
  SceneStream(uint32_t seed, SceneOptions o) : rng_(seed), o_(o) {}

  struct Frame {
    uint64_t seq;
    int64_t time_ns;
    std::vector<aggregator::TrackInput> dets;
  };

  Frame Next() {
    Frame f;
    f.seq = seq_++;
    const double dt = Chance(o_.gap_chance) ? 1.2 : 1.0 / 30.0 + Uniform(-0.004, 0.004);
    time_ns_ += static_cast<int64_t>(dt * 1e9);
    f.time_ns = time_ns_;
    int births = static_cast<int>(o_.spawn) + (Chance(o_.spawn - static_cast<int>(o_.spawn)) ? 1 : 0);
    if (f.seq == 1) births += o_.initial_objects;
    for (; births > 0 && static_cast<int>(objects_.size()) < o_.max_objects; --births) {
      Object b;
      b.w = static_cast<float>(Uniform(16, 220));
      b.h = static_cast<float>(Uniform(16, 260));
      b.x = static_cast<float>(Uniform(0, o_.width - b.w));
      b.y = static_cast<float>(Uniform(0, o_.height - b.h));
      b.vx = static_cast<float>(Uniform(-320, 320));
      b.vy = static_cast<float>(Uniform(-200, 200));
      b.cls = static_cast<int>(rng_() % static_cast<uint32_t>(std::max(1, o_.classes)));
      b.life = static_cast<int>(Uniform(3, 120));
      objects_.push_back(b);
    }
    for (Object& b : objects_) {
      b.x += b.vx * static_cast<float>(dt) + static_cast<float>(Uniform(-2, 2));
      b.y += b.vy * static_cast<float>(dt) + static_cast<float>(Uniform(-2, 2));
      --b.life;
    }
    std::erase_if(objects_, [&](const Object& b) {
      return b.life <= 0 || b.x + b.w < 0 || b.y + b.h < 0 || b.x > o_.width || b.y > o_.height;
    });
    for (const Object& b : objects_) {
      if (Chance(0.08)) continue;  // missed
      const double r = Uniform(0, 1);
      const float score = static_cast<float>(r < 0.8 ? Uniform(0.6, 1) : r < 0.93 ? Uniform(0.1, 0.5) : Uniform(0.5, 0.6));
      const float j = static_cast<float>(Uniform(-1.5, 1.5));
      f.dets.push_back({{b.x + j, b.y - j, b.x + b.w + j, b.y + b.h + j}, score, b.cls});
    }
    if (Chance(0.15)) {  // spurious
      const auto x = static_cast<float>(Uniform(0, o_.width - 50)), y = static_cast<float>(Uniform(0, o_.height - 50));
      f.dets.push_back({{x, y, x + static_cast<float>(Uniform(5, 50)), y + static_cast<float>(Uniform(5, 50))},
                        static_cast<float>(Uniform(0.05, 0.75)),
                        static_cast<int>(rng_() % static_cast<uint32_t>(std::max(1, o_.classes)))});
    }
    std::shuffle(f.dets.begin(), f.dets.end(), rng_);
    return f;
  }

 private:
  struct Object {
    float x, y, w, h, vx, vy;
    int cls, life;
  };
  double Uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  bool Chance(double p) { return Uniform(0, 1) < p; }
  std::mt19937 rng_;
  SceneOptions o_;
  std::vector<Object> objects_;
  uint64_t seq_ = 1;
  int64_t time_ns_ = 1'000'000'000;
};

struct HarnessOptions {
  int streams = 8;
  int batches = 60;
  int max_frames_per_batch = 24;  // frames of any streams, several of one stream in a row too
  double rollback_chance = 0.1;   // the batch is undone (trackers restored) and sent again
  double restart_chance = 0.02;   // per batch: a stream's tracker restarts (its idle_s passed)
  double forget_chance = 0.01;    // per batch: a stream is forgotten and starts again from nothing
  aggregator::TrackerOptions tracker;
  SceneOptions scene;
  uint32_t seed = 1;
};

struct HarnessResult {
  uint64_t frames = 0, associated = 0, declined = 0, compared_tracks = 0;
};

// Feeds random batches through `a` and checks, frame by frame, that each association it gives equals the one a
// reference tracker (fed the same frames, associating itself) computes, that a declined frame's stream declines the
// rest of its batch, and that trackers fed those associations keep the reference's ids and states.
inline HarnessResult RunAssociatorHarness(aggregator::Associator& a, const HarnessOptions& h) {
  using aggregator::Association;
  using aggregator::AssociationFrame;
  using aggregator::Tracker;
  using aggregator::TrackUpdate;
  HarnessResult res;
  std::mt19937 rng(h.seed * 7919u + 3u);
  std::vector<SceneStream> scenes;
  std::vector<Tracker> fed, ref;  // fed: with the associations; ref: the host alone
  std::vector<uint64_t> names;    // the Associator's stream numbers (a forgotten stream gets a new one)
  for (int s = 0; s < h.streams; ++s) {
    scenes.emplace_back(h.seed * 1000u + static_cast<uint32_t>(s), h.scene);
    fed.emplace_back(h.tracker);
    ref.emplace_back(h.tracker);
    names.push_back(static_cast<uint64_t>(s) + 1);
  }
  uint64_t next_name = static_cast<uint64_t>(h.streams) + 1;
  std::vector<std::pair<int, SceneStream::Frame>> replay;
  for (int b = 0; b < h.batches; ++b) {
    std::vector<std::pair<int, SceneStream::Frame>> batch;
    if (!replay.empty()) {
      batch = std::move(replay);
      replay.clear();
    } else {
      for (int s = 0; s < h.streams; ++s) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) < h.restart_chance) {
          fed[s].Restart();
          ref[s].Restart();
        }
        if (std::uniform_real_distribution<double>(0, 1)(rng) < h.forget_chance) {
          a.Forget(names[s]);
          names[s] = next_name++;
          fed[s] = Tracker(h.tracker);
          ref[s] = Tracker(h.tracker);
        }
      }
      const int n = 1 + static_cast<int>(rng() % static_cast<uint32_t>(h.max_frames_per_batch));
      for (int k = 0; k < n; ++k) {
        const int s = static_cast<int>(rng() % static_cast<uint32_t>(h.streams));
        batch.emplace_back(s, scenes[s].Next());
      }
    }
    const bool rollback = std::uniform_real_distribution<double>(0, 1)(rng) < h.rollback_chance;
    std::vector<Tracker> fed_saved = fed, ref_saved = ref;
    std::vector<AssociationFrame> frames;
    for (const auto& [s, f] : batch) frames.push_back({names[s], &fed[s], f.seq, f.time_ns, f.dets});
    StatusOr<std::vector<Association>> got = a.Associate(frames);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return res;
    EXPECT_EQ(got->size(), frames.size());
    std::map<int, bool> on_device;  // stream → every frame so far associated by `a`
    for (size_t k = 0; k < batch.size(); ++k) {
      const auto& [s, f] = batch[k];
      const Association& as = (*got)[k];
      auto [it, fresh] = on_device.try_emplace(s, true);
      if (!it->second) {
        EXPECT_FALSE(as.ok) << "batch " << b << " frame " << k << ": after a declined frame";
      }
      StatusOr<TrackUpdate> want = ref[s].Update(f.seq, f.time_ns, f.dets);
      EXPECT_TRUE(want.ok()) << want.status();
      if (!want.ok()) return res;
      ++res.frames;
      StatusOr<TrackUpdate> have;
      if (it->second && as.ok) {
        EXPECT_EQ(as.det_of_track, want->det_of_track)
            << "batch " << b << " stream " << s << " seq " << f.seq << ": " << f.dets.size() << " detections, "
            << want->det_of_track.size() << " tracks";
        have = fed[s].Update(f.seq, f.time_ns, f.dets, &as.det_of_track);
        ++res.associated;
      } else {
        EXPECT_FALSE(as.why.empty()) << "a declined frame says why";
        it->second = false;
        have = fed[s].Update(f.seq, f.time_ns, f.dets);
        ++res.declined;
      }
      EXPECT_TRUE(have.ok()) << have.status();
      if (!have.ok()) return res;
      EXPECT_EQ(have->track_of, want->track_of) << "batch " << b << " stream " << s << " seq " << f.seq;
      EXPECT_EQ(have->ended.size(), want->ended.size());
    }
    if (rollback) {
      fed = std::move(fed_saved);
      ref = std::move(ref_saved);
      replay = std::move(batch);
      continue;
    }
    for (const auto& [s, ok] : on_device) {
      if (ok) a.Advanced(names[s], fed[s].state_id());
    }
    if (::testing::Test::HasFailure()) return res;
  }
  for (int s = 0; s < h.streams; ++s) {  // the states, bit for bit
    EXPECT_EQ(fed[s].tracks().size(), ref[s].tracks().size());
    if (fed[s].tracks().size() != ref[s].tracks().size()) continue;
    for (size_t i = 0; i < fed[s].tracks().size(); ++i) {
      const aggregator::Track &x = fed[s].tracks()[i], &y = ref[s].tracks()[i];
      EXPECT_EQ(x.id, y.id);
      EXPECT_EQ(x.state, y.state);
      EXPECT_EQ(x.hits, y.hits);
      EXPECT_EQ(x.box.x1, y.box.x1);
      EXPECT_EQ(fed[s].velocities()[i].x1, ref[s].velocities()[i].x1);
      EXPECT_EQ(fed[s].velocities()[i].y2, ref[s].velocities()[i].y2);
      ++res.compared_tracks;
    }
  }
  return res;
}

}  // namespace vigil::testing
