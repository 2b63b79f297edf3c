#include "vigil/common/deadline.h"
#include "vigil/video/source.h"

#include <glob.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <string_view>

namespace vigil::video {
namespace {

namespace fs = std::filesystem;

bool IsImagePath(std::string_view path) {
  static constexpr std::array<std::string_view, 20> kExtensions = {
      ".bmp", ".dib", ".jpg", ".jpeg", ".jpe", ".jp2", ".png", ".webp", ".pbm", ".pgm",
      ".ppm", ".pxm", ".pnm", ".pfm", ".sr",  ".ras", ".tif", ".tiff", ".hdr", ".pic"};
  const size_t dot = path.rfind('.');
  if (dot == std::string_view::npos || path.find('/', dot) != std::string_view::npos) return false;
  std::string ext(path.substr(dot));
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::find(kExtensions.begin(), kExtensions.end(), ext) != kExtensions.end();
}

// The scheme of "<scheme>://...", or "" when `uri` has none.
std::string_view Scheme(std::string_view uri) {
  const size_t p = uri.find("://");
  if (p == std::string_view::npos || p == 0) return {};
  const std::string_view scheme = uri.substr(0, p);
  const bool valid = std::all_of(scheme.begin(), scheme.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '+' || c == '-' || c == '.';
  });
  return valid ? scheme : std::string_view{};
}

std::string StripFileScheme(const std::string& uri) {
  return Scheme(uri) == "file" ? uri.substr(7) : uri;
}

bool HasGlobCharacters(std::string_view path) { return path.find_first_of("*?[") != std::string_view::npos; }

StatusOr<std::vector<std::string>> ListImages(const std::string& path) {
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      if (IsImagePath(e.path().string()) && !e.is_directory()) paths.push_back(e.path().string());
    }
    if (ec) return absl::NotFoundError(StrCat(path, ": cannot list folder: ", ec.message()));
    if (paths.empty()) return absl::NotFoundError(StrCat(path, ": folder holds no image file"));
  } else if (HasGlobCharacters(path)) {
    glob_t g{};
    const int r = glob(path.c_str(), 0, nullptr, &g);
    for (size_t i = 0; r == 0 && i < g.gl_pathc; ++i) {
      if (!fs::is_directory(g.gl_pathv[i], ec)) paths.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    if (paths.empty()) return absl::NotFoundError(StrCat(path, ": no file matches"));
  } else {
    if (!fs::exists(path, ec)) return absl::NotFoundError(StrCat(path, ": no such file"));
    paths.push_back(path);
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

Status ValidateOptions(const SourceOptions& o) {
  auto bad = [&](std::string_view what) { return absl::InvalidArgumentError(StrCat(o.uri, ": ", what)); };
  if (o.uri.empty()) return absl::InvalidArgumentError("source: uri is empty");
  if (!std::isfinite(o.target_fps) || o.target_fps < 0) return bad(StrCat("target_fps ", o.target_fps, " is not >= 0"));
  if (!std::isfinite(o.image_fps) || o.image_fps <= 0) return bad(StrCat("image_fps ", o.image_fps, " is not > 0"));
  if (o.max_pts_jump_ns <= 0) return bad("max_pts_jump_ns is not > 0");
  if (o.decoder_threads < 0) return bad("decoder_threads is negative");
  if (o.connect_timeout.count() <= 0 || o.read_timeout.count() <= 0) return bad("timeouts must be > 0");
  if (o.reconnect.initial_delay.count() <= 0 || o.reconnect.max_delay < o.reconnect.initial_delay) {
    return bad("reconnect delays must satisfy 0 < initial_delay <= max_delay");
  }
  if (o.reconnect.max_attempts < 0) return bad("reconnect max_attempts is negative");
  if (StatusOr<std::optional<int>> device = ParseHwaccel(o.hwaccel); !device.ok()) return bad(std::string(device.status().message()));
  return absl::OkStatus();
}

}  // namespace

std::chrono::nanoseconds BackoffDelay(const ReconnectPolicy& policy, int n, double u) {
  const double initial = std::chrono::duration<double>(policy.initial_delay).count();
  const double max = std::chrono::duration<double>(policy.max_delay).count();
  const double cap = std::min(max, initial * std::ldexp(1.0, std::clamp(n, 0, 62)));
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(std::clamp(u, 0.0, 1.0) * cap));
}

StatusOr<std::optional<int>> ParseHwaccel(const std::string& hwaccel) {
  if (hwaccel.empty() || hwaccel == "cpu") return std::optional<int>();
  if (hwaccel == "cuda") return std::optional<int>(0);
  const std::string_view digits = std::string_view(hwaccel).substr(std::min<size_t>(5, hwaccel.size()));
  if (hwaccel.rfind("cuda:", 0) == 0 && !digits.empty() && digits.size() <= 4 &&
      digits.find_first_not_of("0123456789") == std::string_view::npos && std::stoi(std::string(digits)) < 1024) {
    return std::optional<int>(std::stoi(std::string(digits)));
  }
  return absl::InvalidArgumentError(
      StrCat("hwaccel '", hwaccel, "' is not one of: cpu or \"\" (decode on the CPU), cuda, cuda:N (NVIDIA GPU N, 0..1023)"));
}

SourceKind ClassifyUri(const std::string& uri) {
  if (uri.rfind("synthetic:", 0) == 0) return SourceKind::kSynthetic;
  const std::string_view scheme = Scheme(uri);
  if (!scheme.empty() && scheme != "file") return SourceKind::kNetwork;
  const std::string path = StripFileScheme(uri);
  std::error_code ec;
  if (fs::is_directory(path, ec) || HasGlobCharacters(path) || IsImagePath(path)) return SourceKind::kImages;
  return SourceKind::kFile;
}

bool IsLiveUri(const std::string& uri) {
  switch (ClassifyUri(uri)) {
    case SourceKind::kNetwork:
      return true;
    case SourceKind::kSynthetic:
      return internal::SyntheticUriIsLive(uri);
    default:
      return false;
  }
}

std::string RedactUri(const std::string& uri) {
  const std::string_view scheme = Scheme(uri);
  if (scheme.empty()) return uri;
  const size_t start = scheme.size() + 3;
  const size_t end = uri.find_first_of("/?#", start);
  const size_t at = uri.rfind('@', end == std::string::npos ? std::string::npos : end);
  if (at == std::string::npos || at < start) return uri;
  const size_t colon = uri.find(':', start);
  if (colon == std::string::npos || colon > at) return uri;
  return uri.substr(0, colon + 1) + "***" + uri.substr(at);
}

Source::Source(SourceOptions options, bool live)
    : options_(std::move(options)),
      live_(live),
      who_(StrCat("stream '", options_.stream_id, "'",
                  options_.stream_id == RedactUri(options_.uri) ? "" : StrCat(" (", RedactUri(options_.uri), ")"))) {}

StatusOr<std::optional<Frame>> Source::Next() {
  if (finished_) {
    if (finished_->ok()) return std::nullopt;
    return *finished_;
  }
  auto stopped = [this] {
    stats_.SetState(StreamState::kStopped, who_);
    finished_ = absl::CancelledError(StrCat(who_, ": stopped"));
    return *finished_;
  };
  while (true) {
    if (interrupted()) return stopped();
    StatusOr<std::optional<Picture>> got = DecodeNext();
    if (!got.ok()) {
      if (interrupted() || absl::IsCancelled(got.status())) return stopped();
      const std::string message(got.status().message());
      stats_.SetLastError(message);
      stats_.SetState(StreamState::kFailed, who_, message);
      finished_ = got.status();
      return got.status();
    }
    if (!got->has_value()) {
      stats_.SetState(StreamState::kEnded, who_);
      finished_ = absl::OkStatus();
      return std::nullopt;
    }
    Picture& picture = **got;
    stats_.frames_decoded.fetch_add(1, std::memory_order_relaxed);
    const int64_t pts_ns = Retime(picture);
    if (!KeepForTargetFps(pts_ns)) {
      stats_.skipped_target_fps.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const uint64_t seq = next_seq_++;
    if (options_.start_after_seq && seq <= *options_.start_after_seq) {
      stats_.skipped_resume.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const bool unpaced = static_cast<int64_t>(seq) <= unpaced_through_.load(std::memory_order_relaxed);
    // After unpaced frames, or a DoNotPaceThrough call, the next paced frame anchors the clock anew (it is due
    // when delivered).
    if (unpaced || reanchor_.exchange(false, std::memory_order_relaxed)) paced_ = false;
    if (options_.realtime && !live_ && !unpaced && !Pace(pts_ns)) return stopped();
    Frame frame = std::move(picture.frame);
    frame.stream_id = options_.stream_id;
    frame.run = options_.run;
    frame.seq = seq;
    frame.pts_ns = pts_ns;
    frame.capture_time_ns = SystemClock()->WallNs();
    frame.source_steady_ns = SystemClock()->SteadyNs();
    stats_.SetState(StreamState::kStreaming, who_);
    stats_.frames_delivered.fetch_add(1, std::memory_order_relaxed);
    return frame;
  }
}

void Source::Interrupt() {
  {
    MutexLock lock(wait_mu_);
    interrupted_.store(true);
  }
  wait_cv_.NotifyAll();
  stats_.SetState(StreamState::kStopped, who_);
}

bool Source::WaitFor(std::chrono::nanoseconds d) {
  MutexLock lock(wait_mu_);
  const Deadline deadline = Deadline::After(d);
  while (!interrupted()) {
    if (!wait_cv_.WaitUntil(lock, deadline)) return !interrupted();
  }
  return false;
}

int64_t Source::Retime(const Picture& picture) {
  if (!have_pts_) {
    have_pts_ = true;
    last_pts_ns_ = picture.pts_ns.value_or(0);
    pts_offset_ns_ = 0;
    return last_pts_ns_;
  }
  if (picture.pts_ns && !picture.discontinuity) {
    const int64_t pts = *picture.pts_ns + pts_offset_ns_;
    if (pts > last_pts_ns_ && pts - last_pts_ns_ <= options_.max_pts_jump_ns) return last_pts_ns_ = pts;
  }
  if (!picture.discontinuity) stats_.timestamp_fixups.fetch_add(1, std::memory_order_relaxed);
  last_pts_ns_ += picture.nominal_duration_ns;
  if (picture.pts_ns) pts_offset_ns_ = last_pts_ns_ - *picture.pts_ns;
  return last_pts_ns_;
}

bool Source::KeepForTargetFps(int64_t pts_ns) {
  if (options_.target_fps <= 0) return true;
  if (!have_fps_origin_) {
    have_fps_origin_ = true;
    fps_origin_ns_ = pts_ns;
    last_fps_slot_ = 0;
    return true;
  }
  // The epsilon absorbs the rounding of pts to whole ns (a 15 fps slot boundary at 66666666.67 ns).
  const auto slot = static_cast<int64_t>(std::floor(double(pts_ns - fps_origin_ns_) * options_.target_fps * 1e-9 + 1e-6));
  if (slot <= last_fps_slot_) return false;
  last_fps_slot_ = slot;
  return true;
}

bool Source::Pace(int64_t pts_ns) {
  const int64_t now = SystemClock()->SteadyNs();
  const int64_t due = pace_anchor_ns_ + (pts_ns - pace_anchor_pts_ns_);
  if (!paced_ || due < now - 1'000'000'000) {
    paced_ = true;
    pace_anchor_ns_ = now;
    pace_anchor_pts_ns_ = pts_ns;
    return !interrupted();
  }
  return due <= now ? !interrupted() : WaitFor(std::chrono::nanoseconds(due - now));
}

StatusOr<std::unique_ptr<Source>> OpenSource(SourceOptions options) {
  VIGIL_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.stream_id.empty()) options.stream_id = RedactUri(options.uri);
  switch (ClassifyUri(options.uri)) {
    case SourceKind::kNetwork: {
      std::string url = options.uri;
      return internal::OpenFfmpegSource(std::move(options), std::move(url), /*live=*/true);
    }
    case SourceKind::kFile: {
      std::string url = "file:" + StripFileScheme(options.uri);
      return internal::OpenFfmpegSource(std::move(options), std::move(url), /*live=*/false);
    }
    case SourceKind::kImages: {
      StatusOr<std::vector<std::string>> paths = ListImages(StripFileScheme(options.uri));
      if (!paths.ok()) return Annotate(paths.status(), StrCat("stream '", options.stream_id, "'"));
      return internal::OpenImageSource(std::move(options), *std::move(paths));
    }
    case SourceKind::kSynthetic:
      return internal::OpenSyntheticSource(std::move(options));
  }
  return absl::InternalError("unknown source kind");
}

LumaWeights LumaWeightsOf(YuvMatrix matrix) {
  switch (matrix) {
    case YuvMatrix::kBt601: return {0.299, 0.114};
    case YuvMatrix::kBt709: return {0.2126, 0.0722};
    case YuvMatrix::kFcc: return {0.30, 0.11};
    case YuvMatrix::kSmpte240m: return {0.212, 0.087};
    case YuvMatrix::kBt2020: return {0.2627, 0.0593};
  }
  return {0.299, 0.114};
}

}  // namespace vigil::video
