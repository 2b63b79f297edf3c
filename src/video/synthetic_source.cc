// Synthetic test-pattern source ("synthetic:WIDTHxHEIGHT[?fps=F&frames=N]", source.h): frames generated in
// host memory, no file and no decoder. The pattern (source.h gives the formula) is computed once, at open,
// into a buffer kPatternPeriod columns wider than the frame; frame k is one memcpy per row from column
// k mod kPatternPeriod of it, so a frame costs what copying its bytes costs.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <memory>
#include <new>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

#include "vigil/video/source.h"

namespace vigil::video::internal {
namespace {

constexpr std::string_view kPrefix = "synthetic:";
constexpr std::string_view kSyntax = "expected synthetic:WIDTHxHEIGHT[?fps=F&frames=N&live=0|1]";
constexpr int kMaxSide = 16384;                  // pixels
constexpr double kMinFps = 0.001, kMaxFps = 1000;
constexpr int kPatternPeriod = 256;              // pixels; frame k is shifted by k mod this
constexpr int kCheckerCell = 32;                 // pixels
constexpr double kMaxPtsNs = 4611686018427387904.0;  // 2^62 ns (146 years): the timeline ends there

struct SyntheticSpec {
  int width = 0, height = 0;            // pixels
  double fps = 30;                      // frames per second of the stream timeline
  std::optional<uint64_t> frames;       // frames per pass; nullopt = endless
  bool live = false;                    // a camera: frames come at fps by the clock; readers drop, not block
};

// `text` as a whole decimal number of type T (digits only: no sign, no spaces), or nullopt.
template <typename T>
std::optional<T> ParseDecimal(std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

StatusOr<int> ParseSide(std::string_view name, std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) {
    return absl::InvalidArgumentError(StrCat(name, " '", text, "' is not a whole number; ", kSyntax));
  }
  const std::optional<int64_t> v = text.size() <= 9 ? ParseDecimal<int64_t>(text) : std::nullopt;
  if (!v || *v < 1 || *v > kMaxSide) {
    return absl::InvalidArgumentError(StrCat(name, " ", text, " is not in 1..", kMaxSide, " pixels"));
  }
  return static_cast<int>(*v);
}

// The URI's size and parameters. Errors: InvalidArgument with the reason (the caller names the stream).
StatusOr<SyntheticSpec> ParseSyntheticUri(std::string_view uri) {
  const std::string_view rest = uri.substr(kPrefix.size());
  const size_t question = rest.find('?');
  const std::string_view size = rest.substr(0, question);
  const size_t x = size.find('x');
  if (size.empty() || x == std::string_view::npos) {
    return absl::InvalidArgumentError(StrCat("size '", size, "' is not WIDTHxHEIGHT; ", kSyntax));
  }
  SyntheticSpec spec;
  VIGIL_ASSIGN_OR_RETURN(spec.width, ParseSide("width", size.substr(0, x)));
  VIGIL_ASSIGN_OR_RETURN(spec.height, ParseSide("height", size.substr(x + 1)));
  if (question == std::string_view::npos) return spec;

  bool have_fps = false, have_live = false;
  std::string_view query = rest.substr(question + 1);
  while (true) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      return absl::InvalidArgumentError(StrCat("parameter '", item, "' is not key=value; ", kSyntax));
    }
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "fps") {
      if (have_fps) return absl::InvalidArgumentError("parameter fps is given twice");
      have_fps = true;
      double fps = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), fps);
      if (ec != std::errc() || end != value.data() + value.size() || !(fps >= kMinFps && fps <= kMaxFps)) {
        return absl::InvalidArgumentError(
            StrCat("fps '", value, "' is not a number in [", kMinFps, ", ", kMaxFps, "]"));
      }
      spec.fps = fps;
    } else if (key == "frames") {
      if (spec.frames) return absl::InvalidArgumentError("parameter frames is given twice");
      spec.frames = ParseDecimal<uint64_t>(value);
      if (!spec.frames || *spec.frames == 0) {
        return absl::InvalidArgumentError(
            StrCat("frames '", value, "' is not a whole number >= 1 (leave it out for an endless stream)"));
      }
    } else if (key == "live") {
      if (have_live) return absl::InvalidArgumentError("parameter live is given twice");
      have_live = true;
      if (value != "0" && value != "1") return absl::InvalidArgumentError(StrCat("live '", value, "' is not 0 or 1"));
      spec.live = value == "1";
    } else {
      return absl::InvalidArgumentError(StrCat("unknown parameter '", key, "' (known: fps, frames, live)"));
    }
    if (amp == std::string_view::npos) return spec;
    query = query.substr(amp + 1);
  }
}

class SyntheticSource final : public Source {
 public:
  SyntheticSource(SourceOptions options, const SyntheticSpec& spec)
      : Source(std::move(options), /*live=*/spec.live),
        spec_(spec),
        pattern_stride_(size_t(spec.width + kPatternPeriod) * 3),
        frame_duration_ns_(static_cast<int64_t>(std::llround(1e9 / spec.fps))) {
    probed_.width = spec.width;
    probed_.height = spec.height;
    probed_.fps = spec.fps;
    declared_frames_ = spec.frames;
    if (StatusOr<std::optional<int>> device = ParseHwaccel(options_.hwaccel); device.ok() && *device) {
      stats_.SetHwaccel("cpu (synthetic frames are generated in host memory)");
    }
  }

  // Fills the pattern buffer. Errors: ResourceExhausted when it cannot be allocated.
  Status Init() {
    try {
      pattern_.resize(pattern_stride_ * size_t(spec_.height));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          StrCat(who(), ": cannot allocate the ", pattern_stride_ * spec_.height, "-byte pattern"));
    }
    const int ramp_den = std::max(1, spec_.height - 1);
    for (int y = 0; y < spec_.height; ++y) {
      uint8_t* row = pattern_.data() + size_t(y) * pattern_stride_;
      const auto green = static_cast<uint8_t>(y * 255 / ramp_den);
      for (int x = 0; x < spec_.width + kPatternPeriod; ++x) {
        row[3 * x + 0] = static_cast<uint8_t>(x % kPatternPeriod);
        row[3 * x + 1] = green;
        row[3 * x + 2] = ((x / kCheckerCell + y / kCheckerCell) & 1) ? 255 : 0;
      }
    }
    return absl::OkStatus();
  }

 protected:
  StatusOr<std::optional<Picture>> DecodeNext() override {
    if (interrupted()) return absl::CancelledError(StrCat(who(), ": stopped"));
    if (spec_.frames && index_ == *spec_.frames) {
      if (!options_.loop) return std::optional<Picture>();
      index_ = 0;
      new_pass_ = true;
    }
    const double pts_ns = std::round(double(index_) * 1e9 / spec_.fps);
    if (pts_ns > kMaxPtsNs) return std::optional<Picture>();
    const uint64_t index = index_++;
    if (spec_.live) {
      // A camera: picture p (all passes) exists at open + p / fps; a late reader gets it at once.
      const int64_t due = opened_ns_ + static_cast<int64_t>(std::llround(double(produced_) * 1e9 / spec_.fps));
      if (const int64_t wait = due - SystemClock()->SteadyNs(); wait > 0 && !WaitFor(std::chrono::nanoseconds(wait))) {
        return absl::CancelledError(StrCat(who(), ": stopped"));
      }
    }
    Picture picture;
    picture.frame.width = spec_.width;
    picture.frame.height = spec_.height;
    picture.frame.stride = spec_.width * 3;
    picture.pts_ns = static_cast<int64_t>(pts_ns);
    picture.discontinuity = new_pass_;
    picture.nominal_duration_ns = frame_duration_ns_;
    new_pass_ = false;
    // Picture p of this Source gets seq <= p (seq counts the pictures kept before it), so with
    // start_after_seq >= p it is never delivered: Next() skips it, and its pixels are not made.
    const bool skipped_for_resume = options_.start_after_seq && produced_ <= *options_.start_after_seq;
    ++produced_;
    if (skipped_for_resume) return std::optional<Picture>(std::move(picture));

    const int64_t t0 = SystemClock()->SteadyNs();
    const size_t row_bytes = size_t(spec_.width) * 3;
    const uint8_t* src = pattern_.data() + size_t(index % kPatternPeriod) * 3;
    std::vector<uint8_t>& bgr = picture.frame.bgr;
    try {
      bgr.reserve(row_bytes * size_t(spec_.height));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          StrCat(who(), ": cannot allocate a ", row_bytes * spec_.height, "-byte frame"));
    }
    for (int y = 0; y < spec_.height; ++y, src += pattern_stride_) bgr.insert(bgr.end(), src, src + row_bytes);
    picture.frame.decode_ns = SystemClock()->SteadyNs() - t0;
    return std::optional<Picture>(std::move(picture));
  }

 private:
  const SyntheticSpec spec_;
  const size_t pattern_stride_;      // bytes per pattern row: (width + kPatternPeriod) * 3
  const int64_t frame_duration_ns_;  // 1 / fps
  std::vector<uint8_t> pattern_;     // height rows of pattern_stride_ bytes, BGR
  uint64_t index_ = 0;               // next frame of this pass
  uint64_t produced_ = 0;            // pictures returned by DecodeNext so far, all passes
  const int64_t opened_ns_ = SystemClock()->SteadyNs();  // live: picture 0 due
  bool new_pass_ = false;
};

}  // namespace

bool SyntheticUriIsLive(const std::string& uri) {
  StatusOr<SyntheticSpec> spec = ParseSyntheticUri(uri);
  return spec.ok() && spec->live;
}

StatusOr<std::unique_ptr<Source>> OpenSyntheticSource(SourceOptions options) {
  StatusOr<SyntheticSpec> spec = ParseSyntheticUri(options.uri);
  if (!spec.ok()) return Annotate(spec.status(), StrCat("stream '", options.stream_id, "': ", options.uri));
  auto source = std::make_unique<SyntheticSource>(std::move(options), *spec);
  VIGIL_RETURN_IF_ERROR(source->Init());
  return std::unique_ptr<Source>(std::move(source));
}

}  // namespace vigil::video::internal
