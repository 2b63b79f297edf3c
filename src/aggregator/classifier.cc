// aggregator::Classifier and SecondStage (classifier.h): the second model on an event's crops.
#include "vigil/aggregator/classifier.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include <spdlog/spdlog.h>

#include "vigil/detect/model_family.h"
#include "vigil/infer/engine.h"
#if VIGIL_HAVE_FFMPEG
#include "vigil/video/snapshot.h"
#endif

namespace vigil::aggregator {

Classifier::~Classifier() = default;

StatusOr<std::unique_ptr<Classifier>> Classifier::Load(const ClassifierConfig& config) {
#if !VIGIL_HAVE_FFMPEG
  (void)config;
  return absl::UnimplementedError("confirm.classifier: this vigil was built without FFmpeg/OpenCV (JPEG decoding)");
#else
  auto c = std::unique_ptr<Classifier>(new Classifier());
  c->config_ = config;
  infer::EngineOptions eo;
  eo.device = config.device;
  eo.threads = config.threads;
  eo.batch = 1;
  StatusOr<std::unique_ptr<infer::Engine>> engine = infer::Engine::Load(config.model, eo);
  if (!engine.ok()) {
    return Status(engine.status().code(), StrCat("confirm.classifier: ", engine.status().message()));
  }
  c->engine_ = std::move(*engine);
  const std::vector<infer::TensorInfo>& in = c->engine_->inputs();
  const std::vector<infer::TensorInfo>& out = c->engine_->outputs();
  if (in.size() != 1 || in[0].shape.size() != 4 || in[0].shape[0] != 1 || in[0].shape[1] != 3 ||
      in[0].shape[2] < 1 || in[0].shape[3] < 1) {
    return absl::InvalidArgumentError(StrCat("confirm.classifier: ", config.model,
                                             ": the model must take one image [1, 3, H, W] (set the input size when "
                                             "exporting: its height and width must be fixed)"));
  }
  int64_t classes = 0;
  if (!out.empty() && out[0].shape.size() == 2 && out[0].shape[0] == 1) classes = out[0].shape[1];
  if (classes < 1) {
    return absl::InvalidArgumentError(
        StrCat("confirm.classifier: ", config.model, ": its first output must be [1, C] class scores, not ",
               out.empty() ? std::string("nothing") : ShapeToString(out[0].shape),
               " (a detector? the second model is an image classifier)"));
  }
  c->height_ = static_cast<int>(in[0].shape[2]);
  c->width_ = static_cast<int>(in[0].shape[3]);
  if (!config.labels.empty()) {
    if (static_cast<int64_t>(config.labels.size()) != classes) {
      return absl::InvalidArgumentError(StrCat("confirm.classifier.labels: ", config.labels.size(),
                                               " names for a model of ", classes, " classes"));
    }
    c->labels_ = config.labels;
  } else {
    auto it = c->engine_->metadata().find("names");
    if (it != c->engine_->metadata().end()) {
      StatusOr<std::vector<std::string>> names = detect::ParseClassNames(it->second);
      if (names.ok() && static_cast<int64_t>(names->size()) == classes) c->labels_ = *names;
    }
    if (c->labels_.empty()) {
      for (int64_t k = 0; k < classes; ++k) c->labels_.push_back(StrCat("class ", k));
    }
  }
  // A confirm / reject / relabel class the model does not have could never decide anything: said at start.
  auto known = [&](const std::string& label) {
    return std::find(c->labels_.begin(), c->labels_.end(), label) != c->labels_.end();
  };
  auto some = [&] {
    std::string listed;
    for (size_t k = 0; k < c->labels_.size() && k < 8; ++k) listed += (k ? ", " : "") + c->labels_[k];
    return c->labels_.size() > 8 ? StrCat(listed, ", … (", c->labels_.size(), " in all)") : listed;
  };
  for (const auto& [key, list] : {std::pair<const char*, const std::vector<std::string>*>{"confirm", &config.confirm},
                                  {"reject", &config.reject}}) {
    for (const std::string& l : *list) {
      if (!known(l)) {
        return absl::InvalidArgumentError(
            StrCat("confirm.classifier.", key, ": '", l, "' is not a class of ", config.model, " (", some(), ")"));
      }
    }
  }
  for (const auto& [from, to] : config.relabel) {
    if (!known(from)) {
      return absl::InvalidArgumentError(
          StrCat("confirm.classifier.relabel: '", from, "' is not a class of ", config.model, " (", some(), ")"));
    }
  }
  return c;
#endif
}

StatusOr<std::vector<float>> Classifier::Probabilities(std::string_view jpeg, Tensor* input_out) {
#if !VIGIL_HAVE_FFMPEG
  (void)jpeg;
  (void)input_out;
  return absl::UnimplementedError("classifier: no JPEG decoding in this build");
#else
  static constexpr float kUnitMean[3] = {0, 0, 0}, kUnitStd[3] = {1, 1, 1};
  static constexpr float kImagenetMean[3] = {0.485f, 0.456f, 0.406f}, kImagenetStd[3] = {0.229f, 0.224f, 0.225f};
  VIGIL_ASSIGN_OR_RETURN(Tensor input, video::ClassifierInput(jpeg, width_, height_,
                                                              config_.imagenet ? kImagenetMean : kUnitMean,
                                                              config_.imagenet ? kImagenetStd : kUnitStd));
  std::vector<Tensor> outputs;
  VIGIL_RETURN_IF_ERROR(engine_->Run(std::span<const Tensor>(&input, 1), &outputs));
  const Tensor o = outputs.at(0).dtype() == DType::kFloat32 ? outputs.at(0) : outputs.at(0).ToFloat32();
  const float* v = o.data<float>();
  const size_t n = labels_.size();
  // Probabilities already (a Softmax at the end) or logits.
  double sum = 0;
  bool unit = true;
  for (size_t k = 0; k < n; ++k) {
    sum += v[k];
    unit = unit && v[k] >= 0 && v[k] <= 1;
  }
  std::vector<double> p(v, v + n);
  if (!(unit && std::abs(sum - 1.0) < 1e-3)) {
    const double top = *std::max_element(p.begin(), p.end());
    double z = 0;
    for (double& x : p) z += (x = std::exp(x - top));
    for (double& x : p) x /= z;
  }
  for (double x : p) {
    if (!std::isfinite(x)) return absl::InternalError("classifier: a non-finite output");
  }
  if (input_out != nullptr) *input_out = std::move(input);
  return std::vector<float>(p.begin(), p.end());
#endif
}

StatusOr<CropClass> Classifier::Classify(std::string_view jpeg) {
  VIGIL_ASSIGN_OR_RETURN(std::vector<float> p, Probabilities(jpeg));
  const size_t best = static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin());
  return CropClass{static_cast<int>(best), labels_[best], p[best]};
}

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
