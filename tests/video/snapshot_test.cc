// An event's pictures (video/snapshot.h) on real photographs (opencv-doc's messi5.jpg and fruits.jpg): the
// downscaled frame and the crops decode close to the source region they name, crops sit at their boxes
// (margin, clipping, downscaling), boxes are drawn in their class's colour, bad input is refused by name.
#include "vigil/video/snapshot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "vigil/video/jpeg.h"

namespace vigil::video {
namespace {

const std::filesystem::path kData = "/usr/share/doc/opencv-doc/examples/data";

Frame Load(const std::string& name) {
  const cv::Mat m = cv::imread((kData / name).string(), cv::IMREAD_COLOR);
  Frame f;
  f.stream_id = name;
  f.width = m.cols;
  f.height = m.rows;
  f.stride = m.cols * 3 + 8;  // padded rows: the stride must be honoured
  f.bgr.assign(static_cast<size_t>(f.stride) * m.rows, 0);
  for (int y = 0; y < m.rows; ++y) std::copy_n(m.ptr<uint8_t>(y), m.cols * 3, f.bgr.data() + y * f.stride);
  return f;
}

cv::Mat AsMat(const Frame& f) {
  return cv::Mat(f.height, f.width, CV_8UC3, const_cast<uint8_t*>(f.bgr.data()), static_cast<size_t>(f.stride));
}

double MeanAbsDiff(const cv::Mat& a, const cv::Mat& b) {
  cv::Mat d;
  cv::absdiff(a, b, d);
  const cv::Scalar s = cv::mean(d);
  return (s[0] + s[1] + s[2]) / 3;
}

cv::Mat Decoded(const std::string& jpeg) {
  Frame f;
  EXPECT_TRUE(DecodeJpeg(jpeg, &f).ok());
  return AsMat(f).clone();
}

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!JpegAvailable()) GTEST_SKIP() << "built without libturbojpeg";
    if (!std::filesystem::exists(kData / "messi5.jpg")) GTEST_SKIP() << "opencv-doc's sample pictures not installed";
  }
};

TEST_F(SnapshotTest, TheFrameIsDownscaledWithItsAspectAndDecodesCloseToTheSource) {
  const Frame f = Load("messi5.jpg");  // 548 x 342
  SnapshotOptions o;
  o.frame_max_width = 320;
  o.quality = 90;
  StatusOr<std::vector<SnapshotPicture>> pics = EncodeSnapshots(f, {}, o);
  ASSERT_TRUE(pics.ok()) << pics.status();
  ASSERT_EQ(pics->size(), 1u);
  const SnapshotPicture& p = (*pics)[0];
  EXPECT_EQ(p.box, -1);
  EXPECT_EQ(std::make_tuple(p.x, p.y, p.width, p.height), std::make_tuple(0, 0, 548, 342));
  EXPECT_EQ(p.out_width, 320);
  EXPECT_EQ(p.out_height, static_cast<int>(std::lround(342 * 320.0 / 548)));
  cv::Mat want;
  cv::resize(AsMat(f), want, cv::Size(p.out_width, p.out_height), 0, 0, cv::INTER_AREA);
  const cv::Mat got = Decoded(p.jpeg);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(MeanAbsDiff(got, want), 3.0);
  // Never upscaled; 0 keeps the source size.
  o.frame_max_width = 4096;
  EXPECT_EQ((*EncodeSnapshots(f, {}, o))[0].out_width, 548);
  o.frame_max_width = 0;
  EXPECT_EQ((*EncodeSnapshots(f, {}, o))[0].out_height, 342);
}

TEST_F(SnapshotTest, CropsShowTheirBoxWithItsMarginClippedAndDownscaled) {
  const Frame f = Load("fruits.jpg");  // 512 x 480
  SnapshotOptions o;
  o.frame = false;
  o.crops = true;
  o.crop_margin = 0.25f;
  o.crop_max_side = 120;
  o.quality = 95;
  const std::vector<SnapshotBox> boxes = {
      {100.4f, 50.6f, 180.2f, 110.0f},  // inside: 80 x 60 grows by 20 / 15 on each side
      {-30, 400, 60, 520},             // off the bottom-left corner: clipped
      {600, 10, 700, 90},              // right of the frame: no pixel, no crop
      {200, 100, 500, 400},            // 300 x 300 (+75 each side, clipped): longer side downscaled to 120
      {NAN, 0, 10, 10},                // not finite: no crop
  };
  StatusOr<std::vector<SnapshotPicture>> pics = EncodeSnapshots(f, boxes, o);
  ASSERT_TRUE(pics.ok()) << pics.status();
  ASSERT_EQ(pics->size(), 3u);
  const SnapshotPicture& a = (*pics)[0];
  EXPECT_EQ(a.box, 0);
  // floor(100.4 - 19.95) = 80, floor(50.6 - 14.85) = 35, ceil(180.2 + 19.95) = 201, ceil(110 + 14.85) = 125.
  EXPECT_EQ(std::make_tuple(a.x, a.y, a.width, a.height), std::make_tuple(80, 35, 121, 90));
  EXPECT_EQ(std::make_tuple(a.out_width, a.out_height), std::make_tuple(120, 89));
  cv::Mat want;
  cv::resize(AsMat(f)(cv::Rect(a.x, a.y, a.width, a.height)), want, cv::Size(a.out_width, a.out_height), 0, 0,
             cv::INTER_AREA);
  EXPECT_LT(MeanAbsDiff(Decoded(a.jpeg), want), 3.0) << "the crop shows its box's pixels";
  // The same region shifted by 40 px is far from it: the comparison can tell places apart.
  cv::Mat elsewhere;
  cv::resize(AsMat(f)(cv::Rect(a.x + 40, a.y + 40, a.width, a.height)), elsewhere, want.size(), 0, 0, cv::INTER_AREA);
  EXPECT_GT(MeanAbsDiff(Decoded(a.jpeg), elsewhere), 10.0);

  const SnapshotPicture& b = (*pics)[1];
  EXPECT_EQ(b.box, 1);
  EXPECT_EQ(std::make_tuple(b.x, b.y, b.width, b.height), std::make_tuple(0, 370, 83, 110));  // clipped at 0 and 480
  const SnapshotPicture& d = (*pics)[2];
  EXPECT_EQ(d.box, 3);
  EXPECT_EQ(std::make_tuple(d.x, d.y, d.width, d.height), std::make_tuple(125, 25, 387, 450));
  EXPECT_EQ(std::max(d.out_width, d.out_height), 120);
  EXPECT_EQ(d.out_width, static_cast<int>(std::lround(387 * 120.0 / 450)));
  const cv::Mat dd = Decoded(d.jpeg);
  EXPECT_EQ(dd.cols, d.out_width);
  EXPECT_EQ(dd.rows, d.out_height);
}

TEST_F(SnapshotTest, BoxesAreDrawnScaledInTheirClassColourAndTheRestIsUntouched) {
  // A flat grey picture half the source's size: a box drawn from source coordinates lands at half of them.
  Frame grey;
  grey.width = 400;
  grey.height = 300;
  grey.stride = 1200;
  grey.bgr.assign(1200 * 300, 128);
  StatusOr<std::string> jpeg = EncodeJpeg(grey, 95);
  ASSERT_TRUE(jpeg.ok());
  const std::vector<LabeledBox> boxes = {{100, 200, 500, 500, 2, "car", 0.87f}};
  StatusOr<std::string> drawn = DrawBoxes(*jpeg, 800, 600, boxes, 95);
  ASSERT_TRUE(drawn.ok()) << drawn.status();
  const cv::Mat m = Decoded(*drawn);
  ASSERT_EQ(m.size(), cv::Size(400, 300));
  uint8_t c[3];
  ClassColour(2, c);
  auto near = [&](cv::Point p, const uint8_t want[3]) {
    const cv::Vec3b v = m.at<cv::Vec3b>(p);
    return std::abs(v[0] - want[0]) < 40 && std::abs(v[1] - want[1]) < 40 && std::abs(v[2] - want[2]) < 40;
  };
  // The share of a region's pixels close to a colour (JPEG blurs single pixels; regions do not lie).
  auto share = [&](cv::Rect r, const uint8_t want[3]) {
    int n = 0;
    for (int y = r.y; y < r.y + r.height; ++y) {
      for (int x = r.x; x < r.x + r.width; ++x) n += near({x, y}, want) ? 1 : 0;
    }
    return static_cast<double>(n) / r.area();
  };
  // A 2-px line at 250 covers two of the rows 249..251 (which two is the rasterizer's choice).
  auto best_row = [&](int y) { return std::max({share({60, y - 1, 180, 1}, c), share({60, y, 180, 1}, c), share({60, y + 1, 180, 1}, c)}); };
  auto best_col = [&](int x) { return std::max({share({x - 1, 110, 1, 130}, c), share({x, 110, 1, 130}, c), share({x + 1, 110, 1, 130}, c)}); };
  EXPECT_GT(best_row(250), 0.9) << "the bottom edge at y = 500 / 2";
  EXPECT_GT(best_col(250), 0.9) << "the right edge at x = 500 / 2";
  EXPECT_GT(best_row(100), 0.9) << "the top edge at y = 200 / 2";
  EXPECT_LT(best_row(150), 0.1) << "no line through the middle";
  const uint8_t grey3[3] = {128, 128, 128};
  EXPECT_GT(share({70, 120, 160, 110}, grey3), 0.99) << "inside the box";
  EXPECT_GT(share({260, 260, 130, 35}, grey3), 0.99) << "outside it";
  EXPECT_GT(share({50, 86, 50, 13}, c), 0.4) << "the label's background above the box's top-left corner (white text on it)";
  EXPECT_LT(share({50, 86, 50, 13}, c), 0.95);
  uint8_t other[3];
  ClassColour(3, other);
  EXPECT_FALSE(c[0] == other[0] && c[1] == other[1] && c[2] == other[2]) << "classes differ in colour";
}

TEST_F(SnapshotTest, BadInputIsRefusedByName) {
  const Frame f = Load("messi5.jpg");
  SnapshotOptions o;
  o.quality = 0;
  EXPECT_EQ(std::string(EncodeSnapshots(f, {}, o).status().message()), "snapshot quality 0: must be 1..100");
  o = {};
  o.frame_max_width = 8;
  EXPECT_EQ(std::string(ValidateSnapshotOptions(o).message()), "snapshot frame_max_width 8: must be 0 or 16..16384");
  o = {};
  o.crop_margin = -1;
  EXPECT_EQ(std::string(ValidateSnapshotOptions(o).message()), "snapshot crop_margin -1: must be 0..2");
  Frame empty;
  empty.stream_id = "cam";
  EXPECT_EQ(EncodeSnapshots(empty, {}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DrawBoxes("not a jpeg", 10, 10, {}, 80).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DrawBoxes("x", 0, 10, {}, 80).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vigil::video
