// LoadImage on the files users actually have: EXIF-rotated JPEGs, grayscale, alpha, palette,
// 16-bit, CMYK, tiny and extreme aspect ratios, and files that are not images at all.
#include "vigil/detect/image.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "vigil/detect/letterbox.h"

namespace vigil::detect {
namespace {

namespace fs = std::filesystem;

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("vigil_image_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// B, G, R of pixel (x, y).
std::vector<int> Pixel(const Image& im, int x, int y) {
  const size_t i = (static_cast<size_t>(y) * im.width + x) * 3;
  return {im.bgr[i], im.bgr[i + 1], im.bgr[i + 2]};
}

void ExpectNear(const std::vector<int>& got, const std::vector<int>& want, int tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < got.size(); ++c) EXPECT_NEAR(got[c], want[c], tol) << "channel " << c;
}

// Inserts an APP1 Exif segment holding only the Orientation tag (0x0112) right after the SOI
// marker of a JPEG: "Exif\0\0", a big-endian TIFF header, one IFD with one SHORT entry.
std::vector<uint8_t> WithExifOrientation(const std::vector<uint8_t>& jpeg, int orientation) {
  const std::vector<uint8_t> payload = {
      'E', 'x', 'i', 'f', 0, 0,                    // Exif identifier
      'M', 'M', 0, 42, 0, 0, 0, 8,                 // TIFF header: big endian, IFD at offset 8
      0, 1,                                        // one entry
      0x01, 0x12, 0, 3, 0, 0, 0, 1,                // tag Orientation, type SHORT, count 1
      0, static_cast<uint8_t>(orientation), 0, 0,  // value, padded to 4 bytes
      0, 0, 0, 0};                                 // no next IFD
  const size_t length = payload.size() + 2;
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);  // SOI
  out.insert(out.end(), {0xFF, 0xE1, static_cast<uint8_t>(length >> 8), static_cast<uint8_t>(length & 0xFF)});
  out.insert(out.end(), payload.begin(), payload.end());
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

TEST_F(ImageTest, AppliesExifOrientation) {
  // Stored 40 wide × 20 tall: left half blue, right half red.
  cv::Mat stored(20, 40, CV_8UC3, cv::Scalar(0, 0, 255));
  stored(cv::Rect(0, 0, 20, 20)).setTo(cv::Scalar(255, 0, 0));
  std::vector<uint8_t> jpeg;
  ASSERT_TRUE(cv::imencode(".jpg", stored, jpeg, {cv::IMWRITE_JPEG_QUALITY, 95}));
  const std::vector<int> blue = {255, 0, 0}, red = {0, 0, 255};
  struct Case {
    int orientation, width, height;
    int blue_x, blue_y, red_x, red_y;  // a pixel well inside each half after orientation
  };
  // EXIF 2.3 Orientation: 1 as stored; 3 rotated 180°; 6 stored column 0 is the visual top row
  // (display = rotate 90° clockwise); 8 stored column 0 is the visual bottom row.
  for (const Case& c : {Case{1, 40, 20, 10, 10, 30, 10}, Case{3, 40, 20, 30, 10, 10, 10},
                        Case{6, 20, 40, 10, 10, 10, 30}, Case{8, 20, 40, 10, 30, 10, 10}}) {
    SCOPED_TRACE(::testing::Message() << "orientation " << c.orientation);
    const std::string path = Path("exif" + std::to_string(c.orientation) + ".jpg");
    WriteBytes(path, WithExifOrientation(jpeg, c.orientation));
    auto image = LoadImage(path);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, c.width);
    EXPECT_EQ(image->height, c.height);
    ExpectNear(Pixel(*image, c.blue_x, c.blue_y), blue, 8);
    ExpectNear(Pixel(*image, c.red_x, c.red_y), red, 8);
  }
}

TEST_F(ImageTest, GrayAlphaAndSixteenBitBecomeEightBitBgr) {
  cv::Mat gray(3, 5, CV_8UC1);
  for (int i = 0; i < 15; ++i) gray.data[i] = static_cast<uint8_t>(i * 17);
  ASSERT_TRUE(cv::imwrite(Path("gray.png"), gray));
  auto g = LoadImage(Path("gray.png"));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->width, 5);
  ASSERT_EQ(g->height, 3);
  for (int i = 0; i < 15; ++i) ExpectNear(Pixel(*g, i % 5, i / 5), {i * 17, i * 17, i * 17}, 0);

  // Alpha is dropped, not composited: a fully transparent pixel keeps its colour.
  cv::Mat bgra(2, 2, CV_8UC4, cv::Scalar(10, 20, 30, 0));
  bgra.at<cv::Vec4b>(1, 1) = cv::Vec4b(200, 100, 50, 255);
  ASSERT_TRUE(cv::imwrite(Path("alpha.png"), bgra));
  auto a = LoadImage(Path("alpha.png"));
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectNear(Pixel(*a, 0, 0), {10, 20, 30}, 0);
  ExpectNear(Pixel(*a, 1, 1), {200, 100, 50}, 0);

  // 16-bit samples keep their high byte.
  cv::Mat deep(2, 3, CV_16UC3, cv::Scalar(0xAB12, 0x00FF, 0xFFFF));
  ASSERT_TRUE(cv::imwrite(Path("deep.png"), deep));
  auto d = LoadImage(Path("deep.png"));
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectNear(Pixel(*d, 2, 1), {0xAB, 0x00, 0xFF}, 0);
}

TEST_F(ImageTest, PaletteAndCmykViaPillow) {
  if (std::system("/usr/bin/python3 -c 'import PIL' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with Pillow is needed to write palette PNG and CMYK JPEG files";
  }
  const std::string script = Path("make.py");
  std::ofstream(script) << "import sys\nfrom PIL import Image\n"
                           "d = sys.argv[1]\n"
                           "p = Image.new('P', (4, 1))\n"
                           "p.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30] + [0] * 756)\n"
                           "p.putdata([0, 1, 2, 3])\n"
                           "p.save(d + '/palette.png')\n"
                           "Image.new('CMYK', (16, 8), (0, 255, 255, 0)).save(d + '/cmyk.jpg', quality=95)\n";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + dir_.string()).c_str()), 0);

  auto p = LoadImage(Path("palette.png"));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->width, 4);
  ExpectNear(Pixel(*p, 0, 0), {0, 0, 255}, 0);  // palette entry 0 is RGB red
  ExpectNear(Pixel(*p, 1, 0), {0, 255, 0}, 0);
  ExpectNear(Pixel(*p, 2, 0), {255, 0, 0}, 0);
  ExpectNear(Pixel(*p, 3, 0), {30, 20, 10}, 0);

  auto c = LoadImage(Path("cmyk.jpg"));  // C=0 M=100% Y=100% K=0 is red
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->width, 16);
  ASSERT_EQ(c->height, 8);
  ExpectNear(Pixel(*c, 8, 4), {0, 0, 255}, 8);
}

TEST_F(ImageTest, TinyAndExtremeAspectRatios) {
  cv::Mat one(1, 1, CV_8UC3, cv::Scalar(1, 2, 3));
  ASSERT_TRUE(cv::imwrite(Path("one.png"), one));
  auto o = LoadImage(Path("one.png"));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->width, 1);
  EXPECT_EQ(o->height, 1);
  ExpectNear(Pixel(*o, 0, 0), {1, 2, 3}, 0);

  cv::Mat tall(3000, 1, CV_8UC3, cv::Scalar(50, 60, 70));
  ASSERT_TRUE(cv::imwrite(Path("tall.png"), tall));
  auto t = LoadImage(Path("tall.png"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->width, 1);
  EXPECT_EQ(t->height, 3000);

  // Both letterbox into a 640 input: the 1-pixel side stays 1 pixel instead of rounding to 0.
  Tensor input(DType::kFloat32, {2, 3, 640, 640});
  auto info_one = Letterbox(*o, LetterboxStyle::kUltralytics, input, 0);
  ASSERT_TRUE(info_one.ok()) << info_one.status();
  EXPECT_EQ(info_one->resized_width, 640);
  auto info_tall = Letterbox(*t, LetterboxStyle::kYolox, input, 1);
  ASSERT_TRUE(info_tall.ok()) << info_tall.status();
  EXPECT_EQ(info_tall->resized_width, 1);    // int(1 · 640/3000) = 0 → 1
  EXPECT_EQ(info_tall->resized_height, 640);
  EXPECT_FLOAT_EQ(input.data<float>()[640 * 640 * 3 + 5 * 640], 50.0f);  // slot 1, B plane, (0, 5)
}

TEST_F(ImageTest, ErrorsNameTheFileAndTheReason) {
  const auto expect_error = [](const std::string& path, absl::StatusCode code, const std::string& reason) {
    auto r = LoadImage(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(reason), std::string::npos) << r.status();
  };
  expect_error(Path("missing.jpg"), absl::StatusCode::kNotFound, "no such file");
  expect_error(dir_.string(), absl::StatusCode::kInvalidArgument, "is a directory");
  WriteBytes(Path("empty.jpg"), {});
  expect_error(Path("empty.jpg"), absl::StatusCode::kInvalidArgument, "empty file");
  WriteBytes(Path("garbage.jpg"), {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'});
  expect_error(Path("garbage.jpg"), absl::StatusCode::kDataLoss, "cannot decode");
}

TEST(ImageExtension, KnownExtensionsOnly) {
  EXPECT_TRUE(HasImageExtension("a/b.jpg"));
  EXPECT_TRUE(HasImageExtension("B.JPEG"));
  EXPECT_TRUE(HasImageExtension("x.png"));
  EXPECT_TRUE(HasImageExtension("dir.v2/x.webp"));
  EXPECT_FALSE(HasImageExtension("clip.mp4"));
  EXPECT_FALSE(HasImageExtension("a.jpg/file"));
  EXPECT_FALSE(HasImageExtension("noext"));
  EXPECT_FALSE(HasImageExtension(".jpg.txt"));
}

}  // namespace
}  // namespace vigil::detect
