// aggregator::SecondStage (classifier.h): the events waiting for their crops and the decisions from what the
// classifier says of them. Built in every configuration (the classifier is a parameter).
#include "vigil/aggregator/classifier.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include <spdlog/spdlog.h>

namespace vigil::aggregator {

SecondStage::SecondStage(ClassifierConfig config, Classify classify, CropSource crops)
    : config_(std::move(config)), classify_(std::move(classify)), crops_(std::move(crops)) {}

void SecondStage::Add(EventDecision tracked, size_t detections, int64_t now_ns) {
  MutexLock lock(mu_);
  waiting_.push_back({std::move(tracked), detections, now_ns + static_cast<int64_t>(config_.wait_s * 1e9)});
}

size_t SecondStage::Step(int64_t now_ns) {
  std::deque<Waiting> batch;
  {
    MutexLock lock(mu_);
    batch.swap(waiting_);
  }
  size_t decided = 0;
  std::deque<Waiting> again;
  for (Waiting& w : batch) {
    StatusOr<std::vector<StoredSnapshot>> pictures =
        crops_(w.tracked.edge, w.tracked.stream, w.tracked.run, w.tracked.seq);
    std::vector<StoredSnapshot> crops;
    if (pictures.ok()) {
      for (StoredSnapshot& s : *pictures) {
        if (s.box >= 0 && static_cast<size_t>(s.box) < w.detections) crops.push_back(std::move(s));
      }
    } else {
      spdlog::warn("second model: the crops of {}/{} run {} seq {} cannot be read (tried again): {}", w.tracked.edge,
                   w.tracked.stream, w.tracked.run, w.tracked.seq, std::string(pictures.status().message()));
    }
    if (crops.size() < w.detections && now_ns < w.deadline_ns) {
      again.push_back(std::move(w));
      continue;
    }
    EventDecision d = Decide(w, crops);
    MutexLock lock(mu_);
    decided_.push_back(std::move(d));
    ++decided;
  }
  MutexLock lock(mu_);
  for (Waiting& w : waiting_) again.push_back(std::move(w));  // added while this Step ran
  waiting_ = std::move(again);
  return decided;
}

EventDecision SecondStage::Decide(Waiting& w, const std::vector<StoredSnapshot>& crops) {
  EventDecision d = std::move(w.tracked);
  auto in = [](const std::vector<std::string>& list, const std::string& label) {
    return std::find(list.begin(), list.end(), label) != list.end();
  };
  std::string confirmed_by, rejected_by, seen;
  uint64_t classified = 0, errors = 0;
  for (const StoredSnapshot& crop : crops) {
    StatusOr<CropClass> c = classify_(crop.jpeg);
    if (!c.ok()) {
      ++errors;
      spdlog::warn("second model: {}/{} run {} seq {} box {}: {}", d.edge, d.stream, d.run, d.seq, crop.box,
                   std::string(c.status().message()));
      continue;
    }
    ++classified;
    DetectionUpdate u;
    u.index = crop.box;
    u.second_label = c->label;
    u.second_score = c->score;
    auto re = config_.relabel.find(c->label);
    if (re != config_.relabel.end()) u.label = re->second;
    d.detections.push_back(u);
    char what[160];
    std::snprintf(what, sizeof what, "box %d %s %.2f", crop.box, c->label.c_str(), static_cast<double>(c->score));
    seen += (seen.empty() ? "" : ", ") + std::string(what);
    if (c->score < config_.min_score) continue;
    if (confirmed_by.empty() && in(config_.confirm, c->label)) confirmed_by = what;
    if (rejected_by.empty() && in(config_.reject, c->label)) rejected_by = what;
  }
  MutexLock lock(mu_);
  stats_.crops += classified;
  stats_.crop_errors += errors;
  if (!confirmed_by.empty()) {
    d.state = EventState::kConfirmed;
    d.reason = StrCat(d.reason, "; second model: ", confirmed_by);
    ++stats_.confirmed;
  } else if (!rejected_by.empty()) {
    d.state = EventState::kRejected;
    d.reason = StrCat(d.reason, "; second model rejects: ", rejected_by);
    ++stats_.rejected;
  } else if (classified > 0) {
    d.state = EventState::kConfirmed;
    d.reason = StrCat(d.reason, "; second model: no opinion (", seen, ")");
    ++stats_.no_opinion;
  } else {
    d.state = EventState::kConfirmed;
    char buf[96];
    std::snprintf(buf, sizeof buf, "; second model: no crops within %.1f s", config_.wait_s);
    d.reason = StrCat(d.reason, buf);
    ++stats_.no_crops;
  }
  return d;
}

std::vector<EventDecision> SecondStage::TakeDecisions() {
  MutexLock lock(mu_);
  return std::exchange(decided_, {});
}

size_t SecondStage::waiting() const {
  MutexLock lock(mu_);
  return waiting_.size();
}

SecondStageStats SecondStage::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

}  // namespace vigil::aggregator
