// Family detection from shapes and metadata, and class names (64×64 input: cells = 8·8 + 4·4 + 2·2 = 84
// for strides 8, 16, 32).
#include "vigil/detect/model_family.h"

#include <gtest/gtest.h>

namespace vigil::detect {
namespace {

using infer::ModelSummary;
using infer::TensorInfo;

TensorInfo Info(const std::string& name, Shape shape, DType dtype = DType::kFloat32) {
  return {name, dtype, std::move(shape)};
}

StatusOr<ModelInfo> Describe(const ModelSummary& s, Shape input, Shape output, DType in_dtype = DType::kFloat32) {
  const std::vector<TensorInfo> in = {Info("images", std::move(input), in_dtype)};
  const std::vector<TensorInfo> out = {Info("output0", std::move(output))};
  return DescribeModel(s, in, out);
}

TEST(GridCellCount, SumsCeiledGridsPerStride) {
  const std::vector<int> s3 = {8, 16, 32};
  EXPECT_EQ(GridCellCount(640, 640, s3), 6400 + 1600 + 400);
  EXPECT_EQ(GridCellCount(416, 416, s3), 52 * 52 + 26 * 26 + 13 * 13);
  EXPECT_EQ(GridCellCount(64, 96, s3), 8 * 12 + 4 * 6 + 2 * 3);
  EXPECT_EQ(GridCellCount(100, 100, s3), 13 * 13 + 7 * 7 + 4 * 4);  // 100/8 = 12.5 → 13 rows
}

TEST(DescribeModel, RecognisesEachFamilyFromShapes) {
  const ModelSummary none;
  auto u = Describe(none, {1, 3, 64, 64}, {1, 6, 84});
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->family, ModelFamily::kUltralytics);
  EXPECT_EQ(u->num_classes, 2);
  EXPECT_EQ(u->num_boxes, 84);
  EXPECT_EQ(u->letterbox, LetterboxStyle::kUltralytics);
  EXPECT_FLOAT_EQ(u->default_iou, 0.7f);
  EXPECT_EQ(u->names, (std::vector<std::string>{"class0", "class1"}));

  auto v5 = Describe(none, {1, 3, 64, 64}, {1, 252, 7});
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ(v5->family, ModelFamily::kYoloV5);
  EXPECT_EQ(v5->num_classes, 2);
  EXPECT_FLOAT_EQ(v5->default_iou, 0.45f);

  auto x = Describe(none, {1, 3, 64, 64}, {1, 84, 85});
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->family, ModelFamily::kYolox);
  EXPECT_EQ(x->num_classes, 80);
  EXPECT_TRUE(x->raw_boxes);
  EXPECT_EQ(x->letterbox, LetterboxStyle::kYolox);
  EXPECT_EQ(x->names, CocoClassNames());  // no metadata, 80 classes: COCO

  // One-class YOLOX ([B, cells, 6]) is not mistaken for an end-to-end output.
  auto x1 = Describe(none, {1, 3, 64, 64}, {1, 84, 6});
  ASSERT_TRUE(x1.ok()) << x1.status();
  EXPECT_EQ(x1->family, ModelFamily::kYolox);

  auto e = Describe(none, {2, 3, 640, 640}, {2, 300, 6});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->family, ModelFamily::kEnd2End);
  EXPECT_EQ(e->num_boxes, 300);
  EXPECT_EQ(e->batch, 2);
  EXPECT_EQ(e->num_classes, 80);

  // The real files' layouts: 8400 = 80² + 40² + 20², 3549 = 52² + 26² + 13².
  EXPECT_EQ(Describe(none, {1, 3, 640, 640}, {1, 84, 8400})->family, ModelFamily::kUltralytics);
  EXPECT_EQ(Describe(none, {1, 3, 416, 416}, {1, 3549, 85})->family, ModelFamily::kYolox);
  EXPECT_EQ(Describe(none, {1, 3, 640, 640}, {1, 25200, 85})->family, ModelFamily::kYoloV5);
  // Non-square 64 high × 96 wide: 8·12 + 4·6 + 2·3 = 126 cells.
  EXPECT_EQ(Describe(none, {1, 3, 64, 96}, {1, 5, 126})->family, ModelFamily::kUltralytics);
}

TEST(DescribeModel, MetadataEnd2EndStrideNamesAndOps) {
  ModelSummary s;
  s.metadata["end2end"] = "True";
  s.metadata["names"] = "{0: 'defect'}";
  auto e = Describe(s, {1, 3, 640, 640}, {1, 300, 6});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->family, ModelFamily::kEnd2End);
  EXPECT_EQ(e->names, std::vector<std::string>{"defect"});

  ModelSummary nms;
  nms.metadata["end2end"] = "False";
  nms.metadata["args"] = "{'batch': 1, 'half': False, 'nms': True}";
  EXPECT_EQ(Describe(nms, {1, 3, 640, 640}, {1, 300, 6})->family, ModelFamily::kEnd2End);
  // An end-to-end claim with a non-[B,K,6] output is an error naming the output.
  auto bad = Describe(s, {1, 3, 640, 640}, {1, 84, 8400});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("output0"), std::string::npos) << bad.status();

  // P6: metadata stride 64 → strides 8..64: 16² + 8² + 4² + 2² = 340 cells at 128².
  ModelSummary p6;
  p6.metadata["stride"] = "64";
  auto u = Describe(p6, {1, 3, 128, 128}, {1, 5, 340});
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->strides, (std::vector<int>{8, 16, 32, 64}));

  // YOLOX that decodes in the graph (has Exp) takes boxes as they are.
  ModelSummary decoded;
  decoded.op_counts["Exp"] = 1;
  EXPECT_FALSE(Describe(decoded, {1, 3, 64, 64}, {1, 84, 7})->raw_boxes);

  // Names from metadata, missing ids filled.
  ModelSummary named;
  named.metadata["names"] = "{0: 'a', 2: 'c'}";
  auto n = Describe(named, {1, 3, 64, 64}, {1, 4 + 4, 84});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->names, (std::vector<std::string>{"a", "class1", "c", "class3"}));

  ModelSummary seg;
  seg.metadata["task"] = "segment";
  EXPECT_EQ(Describe(seg, {1, 3, 640, 640}, {1, 116, 8400}).status().code(), absl::StatusCode::kUnimplemented);

  // float16 input is fine.
  EXPECT_TRUE(Describe(ModelSummary{}, {1, 3, 64, 64}, {1, 6, 84}, DType::kFloat16).ok());
}

TEST(DescribeModel, RejectsNonImageInputsAndUnknownOutputs) {
  const ModelSummary none;
  auto nhwc = Describe(none, {1, 640, 640, 3}, {1, 84, 8400});
  ASSERT_FALSE(nhwc.ok());
  EXPECT_EQ(nhwc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nhwc.status().message().find("'images'"), std::string::npos) << nhwc.status();
  EXPECT_NE(nhwc.status().message().find("[1,640,640,3]"), std::string::npos) << nhwc.status();

  auto tokens = Describe(none, {1, 128}, {1, 84, 8400});
  ASSERT_FALSE(tokens.ok());
  EXPECT_NE(tokens.status().message().find("[1,128]"), std::string::npos) << tokens.status();

  auto u8 = Describe(none, {1, 3, 640, 640}, {1, 84, 8400}, DType::kUInt8);
  ASSERT_FALSE(u8.ok());
  EXPECT_NE(u8.status().message().find("uint8"), std::string::npos) << u8.status();

  const std::vector<TensorInfo> two = {Info("images", {1, 3, 64, 64}), Info("orig_size", {1, 2})};
  const std::vector<TensorInfo> out = {Info("output0", {1, 6, 84})};
  auto two_inputs = DescribeModel(none, two, out);
  ASSERT_FALSE(two_inputs.ok());
  EXPECT_NE(two_inputs.status().message().find("'orig_size'"), std::string::npos) << two_inputs.status();

  auto unknown = Describe(none, {1, 3, 640, 640}, {1, 85, 100});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'output0'"), std::string::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("[1,85,100]"), std::string::npos) << unknown.status();
}

TEST(ParseClassNames, DictListQuotesAndEscapes) {
  auto n = ParseClassNames(R"({0: 'person', 1: "it's", 2: 'a\'b', 3: 'back\\slash', 5: 'caf\xe9',
                               4: 'ü', 6: '\u00e9t\u00e9', 7: 'tab\there', 8: '\q'})");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (std::vector<std::string>{"person", "it's", "a'b", "back\\slash", "ü", "caf\xc3\xa9",
                                          "\xc3\xa9t\xc3\xa9", "tab\there", "\\q"}));
  auto list = ParseClassNames("['cat', \"dog\",]");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<std::string>{"cat", "dog"}));
  auto empty = ParseClassNames(" {} ");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  for (const char* bad : {"", "{0: 'x'", "{0 'x'}", "{a: 'x'}", "{0: 'x}", "{0: x}", "{0: 'x'} junk",
                          "{-1: 'x'}", "{0: '\\x4'}"}) {
    auto r = ParseClassNames(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ClassName(*list, 1), "dog");
  EXPECT_EQ(ClassName(*list, 7), "class7");
  EXPECT_EQ(CocoClassNames().size(), 80u);
  EXPECT_EQ(CocoClassNames()[16], "dog");
  EXPECT_EQ(CocoClassNames()[79], "toothbrush");
}

}  // namespace
}  // namespace vigil::detect
