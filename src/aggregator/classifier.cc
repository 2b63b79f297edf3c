// aggregator::Classifier (classifier.h): the second model, run on vigil's own engine, on one crop. Built with
// VIGIL_WITH_CLASSIFIER (the aggregator then links vigil_infer, vigil_detect and vigil_video);
// classifier_unavailable.cc without.
#include "vigil/aggregator/classifier.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "vigil/detect/model_family.h"
#include "vigil/infer/engine.h"
#if VIGIL_HAVE_FFMPEG
#include "vigil/video/snapshot.h"
#endif

namespace vigil::aggregator {

Classifier::~Classifier() = default;

void Classifier::EngineDeleter::operator()(infer::Engine* engine) const { delete engine; }

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
  c->engine_.reset(engine->release());
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

}  // namespace vigil::aggregator
