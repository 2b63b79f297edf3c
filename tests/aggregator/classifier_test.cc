// The second model (issue 20): a classifier the test writes (its argmax known: the crop's dominant colour) on real
// JPEG crops, and SecondStage's decisions with a scripted classifier and the times passed in (no sleeps).
#include "vigil/aggregator/classifier.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "testing/colour_classifier.h"

namespace vigil::aggregator {
namespace {

namespace fs = std::filesystem;
using testing::ColourModel;
using testing::Crop;

#if VIGIL_HAVE_CLASSIFIER
class ClassifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("vigil-cls-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const onnx::ModelProto& m) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << m.SerializeAsString();
    return p.string();
  }
  fs::path dir_;
};

TEST_F(ClassifierTest, TheTopClassIsTheCropsDominantColourWithItsSoftmaxProbability) {
  ClassifierConfig c;
  c.model = Write("colour.onnx", ColourModel(true));
  StatusOr<std::unique_ptr<Classifier>> cls = Classifier::Load(c);
  ASSERT_TRUE(cls.ok()) << cls.status();
  EXPECT_EQ((*cls)->labels(), (std::vector<std::string>{"red", "green", "blue"}));  // from the model's names
  EXPECT_EQ((*cls)->width(), 16);
  // Pure red: the means are (≈1, ≈0, ≈0) → softmax e / (e + 2) = 0.576 (JPEG moves them by a few levels).
  StatusOr<CropClass> red = (*cls)->Classify(Crop(0, 0, 255));
  ASSERT_TRUE(red.ok()) << red.status();
  EXPECT_EQ(red->index, 0);
  EXPECT_EQ(red->label, "red");
  EXPECT_NEAR(red->score, 0.576f, 0.01f);
  // Blue (B = 255 in BGR): class 2 — the RGB planes are in the right order.
  StatusOr<CropClass> blue = (*cls)->Classify(Crop(255, 0, 0, 8, 300));
  ASSERT_TRUE(blue.ok()) << blue.status();
  EXPECT_EQ(blue->label, "blue");
  // Mostly green with some red: green wins, with less certainty.
  StatusOr<CropClass> green = (*cls)->Classify(Crop(0, 200, 120));
  ASSERT_TRUE(green.ok());
  EXPECT_EQ(green->label, "green");
  EXPECT_LT(green->score, red->score);
  // Not a JPEG: an error, nothing else.
  EXPECT_EQ((*cls)->Classify("not a jpeg").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClassifierTest, LabelsComeFromTheConfigOrAreNumberedAndABadModelIsNamed) {
  ClassifierConfig c;
  c.model = Write("plain.onnx", ColourModel(false));
  StatusOr<std::unique_ptr<Classifier>> numbered = Classifier::Load(c);
  ASSERT_TRUE(numbered.ok()) << numbered.status();
  EXPECT_EQ((*numbered)->labels(), (std::vector<std::string>{"class 0", "class 1", "class 2"}));
  c.labels = {"rust", "paint", "sky"};
  StatusOr<std::unique_ptr<Classifier>> named = Classifier::Load(c);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ((*named)->Classify(Crop(10, 10, 250))->label, "rust");
  c.labels = {"a", "b"};
  const Status two = Classifier::Load(c).status();
  EXPECT_EQ(two.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.message().find("confirm.classifier.labels: 2 names for a model of 3 classes"), std::string::npos) << two;
  c.labels.clear();
  c.confirm = {"class 0"};
  c.reject = {"purple"};  // not a class of the model: it could never decide
  const Status purple = Classifier::Load(c).status();
  EXPECT_EQ(purple.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(purple.message().find("confirm.classifier.reject: 'purple' is not a class of"), std::string::npos) << purple;
  EXPECT_NE(purple.message().find("(class 0, class 1, class 2)"), std::string::npos) << purple;
  c.reject = {"class 2"};
  c.confirm = {"class 0"};
  c.relabel = {{"class 9", "x"}};
  EXPECT_NE(Classifier::Load(c).status().message().find("relabel: 'class 9' is not a class"), std::string::npos);
  c.confirm.clear();
  c.reject.clear();
  c.relabel.clear();
  c.model = (dir_ / "missing.onnx").string();
  const Status missing = Classifier::Load(c).status();
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("confirm.classifier"), std::string::npos) << missing;
  EXPECT_NE(missing.message().find("missing.onnx"), std::string::npos) << missing;
}

#else
// Built with VIGIL_WITH_CLASSIFIER=OFF: the aggregator links no engine; loading a classifier fails and says why.
TEST(ClassifierTest, WithoutTheClassifierBuiltInLoadFailsNamingTheOption) {
  ClassifierConfig c;
  c.model = "/nonexistent/cls.onnx";
  const Status st = Classifier::Load(c).status();
  EXPECT_TRUE(absl::IsUnimplemented(st)) << st;
  EXPECT_EQ(st.message(),
            "confirm.classifier: this vigil was built without the second model (VIGIL_WITH_CLASSIFIER=OFF: the "
            "aggregator links no inference engine to run it)");
}
#endif  // VIGIL_HAVE_CLASSIFIER

// SecondStage with a scripted classifier: a crop's bytes name its class and score ("helmet 0.90").
struct Scripted {
  std::map<std::pair<std::string, uint64_t>, std::vector<StoredSnapshot>> crops;  // (stream, seq) →
  void Put(const std::string& stream, uint64_t seq, int box, const std::string& what) {
    StoredSnapshot s;
    s.stream = stream;
    s.seq = seq;
    s.box = box;
    s.jpeg = what;
    crops[{stream, seq}].push_back(s);
  }
};

ClassifierConfig HelmetRules() {
  ClassifierConfig c;
  c.confirm = {"helmet", "bare_head"};
  c.reject = {"glare"};
  c.relabel = {{"bare_head", "no_helmet"}};
  c.min_score = 0.5f;
  c.wait_s = 2;
  return c;
}

EventDecision Tracked(const std::string& stream, uint64_t seq) {
  return {"edge-1", stream, 1, seq, EventState::kConfirmed, "track 1 (person): seen in 3 of the last 5 frames", {}};
}

TEST(SecondStageTest, CropsConfirmRejectRelabelOrLeaveTheTrackersWordAndMissingCropsAreWaitedForUntilTheDeadline) {
  Scripted s;
  SecondStage stage(
      HelmetRules(),
      [](std::string_view jpeg) -> StatusOr<CropClass> {
        if (jpeg == "broken") return absl::InvalidArgumentError("not a JPEG");
        const size_t sp = jpeg.find(' ');
        return CropClass{0, std::string(jpeg.substr(0, sp)), std::stof(std::string(jpeg.substr(sp + 1)))};
      },
      [&s](const std::string&, const std::string& stream, uint64_t, uint64_t seq)
          -> StatusOr<std::vector<StoredSnapshot>> { return s.crops[{stream, seq}]; });
  s.Put("a", 0, 0, "helmet 0.90");
  s.Put("a", 0, -1, "the whole frame: not classified");
  s.Put("b", 0, 0, "glare 0.80");
  s.Put("c", 0, 0, "cat 0.40");
  s.Put("e", 0, 0, "bare_head 0.70");
  s.Put("e", 0, 1, "broken");
  s.Put("f", 0, 1, "glare 0.95");  // box 1 of 2: box 0's crop comes later
  const int64_t t0 = 1'000'000'000;
  for (const char* stream : {"a", "b", "c", "d", "e"}) stage.Add(Tracked(stream, 0), stream[0] == 'e' ? 2 : 1, t0);
  stage.Add(Tracked("f", 0), 2, t0);
  EXPECT_EQ(stage.Step(t0), 4u) << "a, b, c, e have all their crops; d and f wait";
  EXPECT_EQ(stage.waiting(), 2u);
  std::vector<EventDecision> d = stage.TakeDecisions();
  ASSERT_EQ(d.size(), 4u);
  const std::string track = "track 1 (person): seen in 3 of the last 5 frames";
  EXPECT_EQ(d[0].stream, "a");
  EXPECT_EQ(d[0].state, EventState::kConfirmed);
  EXPECT_EQ(d[0].reason, track + "; second model: box 0 helmet 0.90");
  ASSERT_EQ(d[0].detections.size(), 1u);
  EXPECT_EQ(d[0].detections[0].index, 0);
  EXPECT_EQ(d[0].detections[0].second_label, "helmet");
  EXPECT_FLOAT_EQ(d[0].detections[0].second_score, 0.9f);
  EXPECT_EQ(d[0].detections[0].label, "");
  EXPECT_EQ(d[1].state, EventState::kRejected);
  EXPECT_EQ(d[1].reason, track + "; second model rejects: box 0 glare 0.80");
  EXPECT_EQ(d[2].state, EventState::kConfirmed);
  EXPECT_EQ(d[2].reason, track + "; second model: no opinion (box 0 cat 0.40)");
  EXPECT_EQ(d[3].stream, "e");
  EXPECT_EQ(d[3].state, EventState::kConfirmed);
  ASSERT_EQ(d[3].detections.size(), 1u) << "the broken crop is skipped";
  EXPECT_EQ(d[3].detections[0].label, "no_helmet");
  EXPECT_EQ(d[3].detections[0].second_label, "bare_head");

  // f's box 0 arrives (a helmet: confirm wins over the glare); d never gets a crop.
  s.Put("f", 0, 0, "helmet 0.60");
  EXPECT_EQ(stage.Step(t0 + 500'000'000), 1u);
  d = stage.TakeDecisions();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].stream, "f");
  EXPECT_EQ(d[0].state, EventState::kConfirmed);
  EXPECT_EQ(d[0].detections.size(), 2u);
  EXPECT_EQ(stage.Step(t0 + 1'999'000'000), 0u) << "d waits until its deadline";
  EXPECT_EQ(stage.Step(t0 + 2'000'000'000), 1u);
  d = stage.TakeDecisions();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].stream, "d");
  EXPECT_EQ(d[0].state, EventState::kConfirmed);
  EXPECT_EQ(d[0].reason, track + "; second model: no crops within 2.0 s");
  EXPECT_EQ(stage.waiting(), 0u);
  const SecondStageStats st = stage.stats();
  EXPECT_EQ(st.confirmed, 3u);  // a, e, f
  EXPECT_EQ(st.rejected, 1u);
  EXPECT_EQ(st.no_opinion, 1u);
  EXPECT_EQ(st.no_crops, 1u);
  EXPECT_EQ(st.crops, 6u);  // a, b, c, e (one of two), f (two)
  EXPECT_EQ(st.crop_errors, 1u);
}

}  // namespace
}  // namespace vigil::aggregator
