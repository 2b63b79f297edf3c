// vigil/aggregator/classifier.h — the aggregator's second model (issue 20): an ONNX image classifier run with vigil's
// own engine on an event's crops (the edge's snapshots, `crops: true`), after the tracker confirmed the event.
//
// agg.yaml, inside `confirm:`:
//   classifier:
//     model: helmet-cls.onnx       # required: input [1, 3, H, W] float32 RGB, output [1, C] (logits or probabilities)
//     device: cpu                  # or cuda:N (a build with CUDA). Default: cpu
//     threads: 1                   # CPU kernel threads. Default: 1
//     labels: [helmet, bare_head, glare]   # class names by output index. Default: the model's `names` metadata, else
//                                          # "class N"
//     normalize: unit              # unit: pixel / 255; imagenet: (pixel / 255 − mean) / std. Default: unit
//     min_score: 0.5               # the top class's probability below this: no opinion. Default: 0.5
//     confirm: [helmet, bare_head] # a crop classified as one of these confirms the event
//     reject: [glare]              # ... as one of these rejects it (when no crop confirms)
//     relabel: {bare_head: no_helmet}  # a detection classified so is relabelled (stored and pushed with it)
//     wait_s: 2                    # how long an event waits for all its crops (0.1..600). Default: 2
//
// How it decides (Verdict): every crop of the event (box ≥ 0) is classified; the top class (softmax of the output
// unless it already sums to 1) with its probability is stored with the detection (second_label, second_score) and a
// relabel applied. Then: a crop whose class is in `confirm` (at min_score) confirms the event; else one in `reject`
// rejects it; else the tracker's confirmation stands ("no opinion"). An event whose crops did not all arrive within
// wait_s is decided on those that did, or — none — by the tracker alone ("no crops"). Events the tracker rejects are
// never classified.
//
// SecondStage holds the events waiting for their crops; Step() classifies those whose crops are all there (or whose
// wait ran out) and returns the decisions. Times are parameters (the aggregator's steady clock): tests pass their own.
// Thread-safety: Classifier::Classify from one thread at a time; SecondStage: Add / TakeDecisions / size from any
// thread, Step from one thread (its worker). Errors: Load names the file and what is wrong; a crop that cannot be
// decoded or classified is skipped (counted) and the event decided on the rest.
// Build: Classifier runs on vigil_infer / vigil_detect and decodes crops with vigil_video, linked into the aggregator
// only with the CMake option VIGIL_WITH_CLASSIFIER (default ON; VIGIL_HAVE_CLASSIFIER=1). Without it Load (and so an
// agg.yaml with confirm.classifier, or `vigil model classify`) fails with Unimplemented naming the option;
// SecondStage is built either way.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vigil/aggregator/store.h"
#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/common/tensor.h"

namespace vigil::infer {
class Engine;
}

namespace vigil::aggregator {

struct ClassifierConfig {
  std::string model;
  std::string device = "cpu";
  int threads = 1;
  std::vector<std::string> labels;
  bool imagenet = false;  // normalize: imagenet
  float min_score = 0.5f;
  std::vector<std::string> confirm, reject;
  std::map<std::string, std::string> relabel;
  double wait_s = 2;
};

struct CropClass {
  int index = 0;        // the top class
  std::string label;    // its name
  float score = 0;      // its probability
};

class Classifier {
 public:
  // Errors: the engine's (NotFound, Unimplemented naming the op, …); InvalidArgument when the model is not
  // [1, 3, H, W] → [1, C] or `labels` has a count other than C.
  static StatusOr<std::unique_ptr<Classifier>> Load(const ClassifierConfig& config);
  ~Classifier();

  // One crop (a JPEG). Errors: InvalidArgument (not a JPEG), the engine's.
  StatusOr<CropClass> Classify(std::string_view jpeg);
  // Every class's probability for one crop (index = class; softmax of the output unless it already sums to 1), and
  // when `input` is non-null the tensor the model was given ([1, 3, H, W], video::ClassifierInput).
  StatusOr<std::vector<float>> Probabilities(std::string_view jpeg, Tensor* input = nullptr);
  const std::vector<std::string>& labels() const { return labels_; }
  int width() const { return width_; }
  int height() const { return height_; }

 private:
  // Deletes the engine where infer::Engine is complete (classifier.cc): a build without the classifier
  // (classifier_unavailable.cc, which never loads one) needs nothing of vigil_infer.
  struct EngineDeleter {
    void operator()(infer::Engine* engine) const;
  };
  Classifier() = default;
  ClassifierConfig config_;
  std::unique_ptr<infer::Engine, EngineDeleter> engine_;
  std::vector<std::string> labels_;
  int width_ = 0, height_ = 0;
};

// Counters since construction (SecondStage::stats).
struct SecondStageStats {
  uint64_t confirmed = 0, rejected = 0;  // decided by the second model
  uint64_t no_opinion = 0;               // the tracker's confirmation stood: no crop reached min_score in a list
  uint64_t no_crops = 0;                 // the tracker's confirmation stood: no crop arrived within wait_s
  uint64_t crops = 0, crop_errors = 0;   // crops classified / not (undecodable, engine error)
};

class SecondStage {
 public:
  // The crops stored for an event (store.h StoredSnapshot, with their JPEG): Store::Snapshots in the aggregator.
  using CropSource = std::function<StatusOr<std::vector<StoredSnapshot>>(const std::string& edge,
                                                                         const std::string& stream, uint64_t run,
                                                                         uint64_t seq)>;
  // `classify`: Classifier::Classify, or a test's own.
  using Classify = std::function<StatusOr<CropClass>(std::string_view jpeg)>;
  SecondStage(ClassifierConfig config, Classify classify, CropSource crops);

  // An event the tracker confirmed (`tracked.state` kConfirmed, its reason the tracker's) with `detections` boxes,
  // waiting from `now_ns` for its crops.
  void Add(EventDecision tracked, size_t detections, int64_t now_ns);
  // Classifies the events whose crops are all stored, or whose wait ran out by `now_ns`; their decisions gather for
  // TakeDecisions. Returns how many events it decided. Events whose crops are missing are looked at again on the
  // next Step (the caller paces it).
  size_t Step(int64_t now_ns);
  std::vector<EventDecision> TakeDecisions();
  size_t waiting() const;
  SecondStageStats stats() const;

 private:
  struct Waiting {
    EventDecision tracked;
    size_t detections = 0;
    int64_t deadline_ns = 0;
  };
  EventDecision Decide(Waiting& w, const std::vector<StoredSnapshot>& crops);

  ClassifierConfig config_;
  Classify classify_;
  CropSource crops_;
  mutable Mutex mu_;
  std::deque<Waiting> waiting_ VIGIL_GUARDED_BY(mu_);
  std::vector<EventDecision> decided_ VIGIL_GUARDED_BY(mu_);
  SecondStageStats stats_ VIGIL_GUARDED_BY(mu_);
};

}  // namespace vigil::aggregator
