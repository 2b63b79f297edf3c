// classifier.h's Classifier in a build without the second model (VIGIL_WITH_CLASSIFIER=OFF): the aggregator links
// no vigil_infer, vigil_detect or vigil_video, so Load fails with Unimplemented naming the option, and a config with
// confirm.classifier (or `vigil model classify`) stops with that error. SecondStage (second_stage.cc) is built as ever.
#include "vigil/aggregator/classifier.h"

namespace vigil::aggregator {
namespace {

Status NoClassifier() {
  return absl::UnimplementedError(
      "confirm.classifier: this vigil was built without the second model (VIGIL_WITH_CLASSIFIER=OFF: the aggregator "
      "links no inference engine to run it)");
}

}  // namespace

Classifier::~Classifier() = default;

// Never given an engine: Load makes no Classifier here.
void Classifier::EngineDeleter::operator()(infer::Engine*) const {}

StatusOr<std::unique_ptr<Classifier>> Classifier::Load(const ClassifierConfig&) { return NoClassifier(); }

StatusOr<std::vector<float>> Classifier::Probabilities(std::string_view, Tensor*) { return NoClassifier(); }

StatusOr<CropClass> Classifier::Classify(std::string_view) { return NoClassifier(); }

}  // namespace vigil::aggregator
