// JPEG pictures for the standby's frame mirror (video/jpeg.h): a round trip keeps the picture, bad input is
// refused with a reason.
#include "vigil/video/jpeg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

namespace vigil::video {
namespace {

// A smooth picture with an edge: odd sizes (4:2:0 chroma rounds up), a padded stride.
Frame Picture(int width, int height, int pad) {
  Frame f;
  f.stream_id = "cam";
  f.seq = 7;
  f.width = width;
  f.height = height;
  f.stride = width * 3 + pad;
  f.bgr.assign(static_cast<size_t>(f.stride) * height, 0xEE);  // padding bytes: must not matter
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = f.bgr.data() + static_cast<size_t>(y) * f.stride + static_cast<size_t>(x) * 3;
      p[0] = static_cast<uint8_t>(255 * x / width);
      p[1] = static_cast<uint8_t>(255 * y / height);
      p[2] = x < width / 2 ? 40 : 200;
    }
  }
  return f;
}

double MeanAbsError(const Frame& a, const Frame& b) {
  double sum = 0;
  for (int y = 0; y < a.height; ++y) {
    for (int x = 0; x < a.width * 3; ++x) {
      sum += std::abs(a.bgr[static_cast<size_t>(y) * a.stride + x] - b.bgr[static_cast<size_t>(y) * b.stride + x]);
    }
  }
  return sum / (static_cast<double>(a.width) * a.height * 3);
}

TEST(Jpeg, ARoundTripKeepsThePicture) {
  if (!JpegAvailable()) GTEST_SKIP() << "built without libturbojpeg";
  const Frame in = Picture(97, 61, 5);
  StatusOr<std::string> hi = EncodeJpeg(in, 95);
  StatusOr<std::string> lo = EncodeJpeg(in, 30);
  ASSERT_TRUE(hi.ok()) << hi.status();
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(static_cast<unsigned char>((*hi)[0]), 0xFF);  // SOI marker
  EXPECT_EQ(static_cast<unsigned char>((*hi)[1]), 0xD8);
  EXPECT_LT(lo->size(), hi->size()) << "a lower quality is a smaller picture";
  Frame out;
  out.seq = 99;
  ASSERT_TRUE(DecodeJpeg(*hi, &out).ok());
  EXPECT_EQ(out.width, 97);
  EXPECT_EQ(out.height, 61);
  EXPECT_EQ(out.stride, 97 * 3);
  EXPECT_EQ(out.bgr.size(), 97u * 61 * 3);
  EXPECT_EQ(out.seq, 99u) << "only the pixels are set";
  EXPECT_LT(MeanAbsError(in, out), 4.0);
  Frame rough;
  ASSERT_TRUE(DecodeJpeg(*lo, &rough).ok());
  EXPECT_LT(MeanAbsError(in, rough), 12.0);
  EXPECT_GT(MeanAbsError(in, rough), MeanAbsError(in, out));
}

TEST(Jpeg, BadInputIsRefusedWithAReason) {
  if (!JpegAvailable()) {
    Frame f;
    EXPECT_EQ(EncodeJpeg(Picture(8, 8, 0), 80).status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(DecodeJpeg("x", &f).code(), absl::StatusCode::kUnimplemented);
    return;
  }
  const Frame good = Picture(16, 16, 0);
  StatusOr<std::string> q0 = EncodeJpeg(good, 0);
  EXPECT_EQ(q0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q0.status().message().find("quality 0 not in 1..100"), std::string::npos) << q0.status();
  Frame device = good;
  device.device.emplace();
  device.bgr.clear();
  EXPECT_NE(EncodeJpeg(device, 80).status().message().find("device frame"), std::string::npos);
  Frame short_pixels = good;
  short_pixels.bgr.resize(100);
  StatusOr<std::string> s = EncodeJpeg(short_pixels, 80);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("stream 'cam' seq 7"), std::string::npos) << s.status();
  Frame out;
  EXPECT_EQ(DecodeJpeg("", &out).code(), absl::StatusCode::kInvalidArgument);
  const Status garbage = DecodeJpeg("definitely not a jpeg", &out);
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.message().find("not a JPEG picture"), std::string::npos) << garbage;
  // A truncated picture: its header decodes, its data does not all arrive — refused or decoded with the rest
  // grey, never a crash.
  StatusOr<std::string> whole = EncodeJpeg(Picture(64, 64, 0), 90);
  ASSERT_TRUE(whole.ok());
  Frame cut;
  const Status st = DecodeJpeg(std::string_view(*whole).substr(0, whole->size() / 2), &cut);
  if (st.ok()) {
    EXPECT_EQ(cut.bgr.size(), 64u * 64 * 3);
  }
  EXPECT_TRUE(out.bgr.empty()) << "a refused picture leaves the frame as it was";
  // The same thread decodes good pictures after the bad ones (its decompressor was once left answering 0x0).
  Frame after;
  const Status again = DecodeJpeg(*whole, &after);
  ASSERT_TRUE(again.ok()) << again;
  EXPECT_EQ(after.width, 64);
  EXPECT_EQ(after.height, 64);
}

}  // namespace
}  // namespace vigil::video
