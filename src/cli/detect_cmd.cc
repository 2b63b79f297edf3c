// `vigil detect`: run a detection model on image files, folders and video files.
//
//   vigil detect --model M.onnx [--conf 0.25] [--iou X] [--max-det 300] [--agnostic] [--classes 0,2]
//                [--imgsz H,W] [--batch B] [--threads T] [--json OUT.jsonl|-] [--output-dir DIR]
//                [--no-save] PATHS...
//
// PATHS are image files, folders or video files. A folder contributes its files with image extensions
// (HasImageExtension), sorted by name, without descending into subfolders; any other file is opened as
// a video with FFmpeg (video::OpenSource: any container and codec it reads, rotation applied). Outputs:
//  * images: annotated copies (boxes, "name score" labels, one colour per class) in --output-dir
//    (default runs/detect) under the source's file name (a repeated name gets _2, _3, ...);
//  * videos: the annotated video as <output-dir>/<file stem>.mp4 (video::VideoWriter: H.264 through
//    libx264, else MPEG-4 Part 2; the source's timestamps);
//  * JSON lines to --json (default <output-dir>/detections.jsonl; "-" = stdout): per image detection
//    {"file","class_id","name","score","box":[x1,y1,x2,y2]}; per video frame (also without detections)
//    {"file","frame","pts","detections":[{"class_id","name","score","box"}, ...]}, frame = index of the
//    decoded frame from 0, pts = its presentation time in seconds from the stream start; boxes in
//    source pixels;
//  * on stderr one summary line per image or video: file, size, detections per class (videos: summed
//    over frames), milliseconds per image or frame (letterbox + inference + decoding + NMS of its batch,
//    divided by the batch's images). While a video runs and stderr is a terminal, a progress line
//    (frames done / declared total, frames per second, time left) is redrawn in place; else nothing.
// --no-save writes no files: no annotated images or videos, and JSON only where --json names a target.
// An input that cannot be read is reported by name and reason; the others run. A video that breaks
// off keeps the frames before the damage (decode errors are counted in its summary line).
// Exit code: 0 when at least one input was processed, 1 when none was, 2 for bad arguments or a
// model that cannot be loaded (src/cli/commands.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "cli/commands.h"
#include "vigil/common/clock.h"
#include "vigil/detect/detector.h"
#include "vigil/detect/image.h"
#ifdef VIGIL_HAVE_FFMPEG
#include "vigil/video/source.h"
#include "vigil/video/stream_reader.h"
#include "vigil/video/writer.h"
#endif

namespace vigil::cli {
namespace {

namespace fs = std::filesystem;

struct DetectArgs {
  std::string model;
  float conf = 0.25f;
  float iou = -1.0f;
  int max_det = 300;
  bool agnostic = false;
  std::vector<int> classes;
  std::string imgsz;
  int64_t batch = 0;
  int threads = 0;
  std::string device = "cpu", precision = "fp32", int8_activations = "quantized";
  std::string json;
  std::string output_dir = "runs/detect";
  bool no_save = false;
  std::vector<std::string> paths;
};

// One input: an image or video path, or a path that failed before decoding with the reason.
struct Input {
  std::string path;
  std::string error;
  bool video = false;
};

void PrintError(const std::string& message) { std::fprintf(stderr, "vigil detect: %s\n", message.c_str()); }

// Expands files and folders into inputs, in argument order (folder contents sorted by name).
std::vector<Input> CollectInputs(const std::vector<std::string>& paths) {
  std::vector<Input> inputs;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) {
      inputs.push_back({path, "no such file or directory"});
    } else if (fs::is_directory(st)) {
      std::vector<std::string> images;
      for (const auto& entry : fs::directory_iterator(path, ec)) {
        if (entry.is_regular_file(ec) && detect::HasImageExtension(entry.path().string())) {
          images.push_back(entry.path().string());
        }
      }
      if (ec) inputs.push_back({path, "cannot list folder: " + ec.message()});
      if (images.empty() && !ec) inputs.push_back({path, "folder holds no image files (.jpg, .png, .bmp, .webp, .tif, ...)"});
      std::sort(images.begin(), images.end());
      for (std::string& image : images) inputs.push_back({std::move(image), ""});
    } else if (detect::HasImageExtension(path)) {
      inputs.push_back({path, ""});
    } else {
#ifdef VIGIL_HAVE_FFMPEG
      inputs.push_back({path, "", /*video=*/true});
#else
      inputs.push_back({path, "not an image, and this vigil was built without FFmpeg, so no video either"});
#endif
    }
  }
  return inputs;
}

// "640" or "480,640" → height, width.
bool ParseImgsz(const std::string& text, int64_t* height, int64_t* width) {
  if (text.empty()) return true;
  const size_t comma = text.find(',');
  try {
    size_t used = 0;
    *height = std::stoll(text.substr(0, comma), &used);
    if (used != text.substr(0, comma).size()) return false;
    *width = *height;
    if (comma != std::string::npos) {
      const std::string w = text.substr(comma + 1);
      *width = std::stoll(w, &used);
      if (used != w.size()) return false;
    }
  } catch (const std::exception&) {
    return false;
  }
  return *height > 0 && *width > 0;
}

// A distinct, stable colour per class: hues spaced by the golden ratio (BGR).
cv::Scalar ClassColor(int class_id) {
  const double hue = std::fmod(class_id * 0.618033988749895, 1.0);
  cv::Mat hsv(1, 1, CV_8UC3, cv::Scalar(hue * 180, 220, 240)), bgr;
  cv::cvtColor(hsv, bgr, cv::COLOR_HSV2BGR);
  const cv::Vec3b c = bgr.at<cv::Vec3b>(0, 0);
  return {static_cast<double>(c[0]), static_cast<double>(c[1]), static_cast<double>(c[2])};
}

// Draws boxes and "name score" labels on a copy of `image` (line width as Ultralytics' Annotator:
// max(round((w + h) / 2 · 0.003), 2) pixels).
cv::Mat DrawDetections(const detect::Image& image, const std::vector<detect::Detection>& dets,
                 const detect::Detector& detector) {
  cv::Mat canvas = cv::Mat(image.height, image.width, CV_8UC3, const_cast<uint8_t*>(image.bgr.data())).clone();
  const int lw = std::max(static_cast<int>(std::lround((image.width + image.height) / 2.0 * 0.003)), 2);
  const double font_scale = lw / 3.0;
  const int font_thickness = std::max(lw - 1, 1);
  for (auto it = dets.rbegin(); it != dets.rend(); ++it) {  // lowest score first: the best label ends on top
    const detect::Detection& d = *it;
    const cv::Scalar color = ClassColor(d.class_id);
    const cv::Point p1(static_cast<int>(d.x1), static_cast<int>(d.y1));
    const cv::Point p2(static_cast<int>(d.x2), static_cast<int>(d.y2));
    cv::rectangle(canvas, p1, p2, color, lw, cv::LINE_AA);
    char score[16];
    std::snprintf(score, sizeof(score), " %.2f", d.score);
    const std::string label = detector.ClassName(d.class_id) + score;
    int baseline = 0;
    const cv::Size text = cv::getTextSize(label, cv::FONT_HERSHEY_SIMPLEX, font_scale, font_thickness, &baseline);
    const bool above = p1.y - text.height - 3 >= 0;  // label above the box when it fits, else inside
    const cv::Point corner(p1.x + text.width, above ? p1.y - text.height - 3 : p1.y + text.height + 3);
    cv::rectangle(canvas, p1, corner, color, cv::FILLED, cv::LINE_AA);
    const double luma = 0.299 * color[2] + 0.587 * color[1] + 0.114 * color[0];
    cv::putText(canvas, label, cv::Point(p1.x, above ? p1.y - 2 : p1.y + text.height + 2), cv::FONT_HERSHEY_SIMPLEX,
                font_scale, luma > 150 ? cv::Scalar(0, 0, 0) : cv::Scalar(255, 255, 255), font_thickness, cv::LINE_AA);
  }
  return canvas;
}

// The source's file name with `extension` ("" = its own), made unique among `used` by _2, _3, ...
std::string UniqueName(const std::string& source, const std::string& extension, std::set<std::string>& used) {
  const fs::path src(source);
  const std::string ext = extension.empty() ? src.extension().string() : extension;
  std::string name = src.stem().string() + ext;
  for (int n = 2; used.count(name) != 0; ++n) name = src.stem().string() + "_" + std::to_string(n) + ext;
  used.insert(name);
  return name;
}

// Writes `canvas` as dir/<name of source> (made unique among `used`); formats OpenCV cannot write
// fall back to JPEG. Returns the path written or an error message.
StatusOr<std::string> SaveAnnotated(const cv::Mat& canvas, const std::string& source, const fs::path& dir,
                                    std::set<std::string>& used) {
  const std::string name = UniqueName(source, "", used);
  for (const std::string& file : {name, name + ".jpg"}) {
    const std::string out = (dir / file).string();
    try {
      if (cv::imwrite(out, canvas)) return out;
    } catch (const cv::Exception&) {  // e.g. a format OpenCV reads but cannot write 8-bit BGR to
    }
  }
  return absl::InternalError(StrCat("cannot write annotated image to ", (dir / name).string()));
}

// `v` rounded to `decimals` places (so JSON shows 467.71, not 467.7100000000000364).
double Round(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

// {"class_id","name","score","box"} of one detection, box in source pixels.
nlohmann::ordered_json DetectionJson(const detect::Detection& d, const detect::Detector& detector) {
  return {{"class_id", d.class_id},
          {"name", detector.ClassName(d.class_id)},
          {"score", Round(d.score, 4)},
          {"box", {Round(d.x1, 2), Round(d.y1, 2), Round(d.x2, 2), Round(d.y2, 2)}}};
}

// "768x576, 1 bicycle, 1 truck, 1 dog" (classes in id order).
std::string SummaryText(int width, int height, const std::map<int, int>& counts, const detect::Detector& detector) {
  std::string s = StrCat(width, "x", height);
  if (counts.empty()) s += ", no detections";
  for (const auto& [cls, n] : counts) s += StrCat(", ", n, " ", detector.ClassName(cls));
  return s;
}

// Where results go: shared by images and videos.
struct Outputs {
  std::ostream* json = nullptr;  // null: no JSON
  bool save = true;              // annotated images / videos
  fs::path dir;
  std::set<std::string> used_names;
};

#ifdef VIGIL_HAVE_FFMPEG
// The progress line of a video on a terminal: "name  40% [#####.......] 318/795 frames, 12.3 fps, ETA 0:38",
// redrawn in place (carriage return) at most every 0.1 s. Prints nothing when stderr is not a terminal.
class ProgressLine {
 public:
  ProgressLine(std::string name, std::optional<uint64_t> total)
      : enabled_(isatty(STDERR_FILENO) == 1), name_(std::move(name)), total_(total),
        start_ns_(SystemClock()->SteadyNs()) {}

  void Update(uint64_t done, bool last = false) {
    if (!enabled_) return;
    const int64_t now = SystemClock()->SteadyNs();
    if (!last && drawn_ns_ != 0 && now - drawn_ns_ < 100'000'000) return;
    drawn_ns_ = now;
    const double seconds = static_cast<double>(now - start_ns_) / 1e9;
    const double fps = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
    std::string line = name_;
    if (total_ && *total_ > 0) {
      const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(*total_));
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(fraction * kWidth);
      line += StrCat(" ", static_cast<int>(fraction * 100), "% [", std::string(static_cast<size_t>(filled), '#'),
                     std::string(static_cast<size_t>(kWidth - filled), '.'), "] ", done, "/", *total_, " frames, ");
    } else {
      line += StrCat(" ", done, " frames, ");
    }
    char rate[64];
    std::snprintf(rate, sizeof(rate), "%.1f fps", fps);
    line += rate;
    if (total_ && fps > 0 && *total_ > done) {
      const auto left = static_cast<int64_t>(static_cast<double>(*total_ - done) / fps);
      std::snprintf(rate, sizeof(rate), ", ETA %lld:%02lld", static_cast<long long>(left / 60),
                    static_cast<long long>(left % 60));
      line += rate;
    }
    std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), last ? "\n" : "");  // \033[K: clear the rest of the line
    std::fflush(stderr);
  }

 private:
  const bool enabled_;
  const std::string name_;
  const std::optional<uint64_t> total_;
  const int64_t start_ns_;  // SystemClock()->SteadyNs()
  int64_t drawn_ns_ = 0;    // the last draw's; 0: none yet
};

// Detects objects in every frame of the video at `path`: JSON per frame, annotated video, summary line.
// Returns false when no frame was processed (the reason is printed).
bool DetectVideo(const std::string& path, const detect::Detector& detector, Outputs& out) {
  video::SourceOptions so;
  so.uri = path;
  so.stream_id = path;
  StatusOr<std::unique_ptr<video::Source>> source = video::OpenSource(std::move(so));
  if (!source.ok()) {
    PrintError(std::string(source.status().message()));
    return false;
  }
  const double fps = (*source)->probed().fps;
  ProgressLine progress(fs::path(path).filename().string(), (*source)->declared_frames());
  const size_t chunk = static_cast<size_t>(detector.model().batch);
  video::StreamReaderOptions ro;
  ro.queue_capacity = std::max<size_t>(4, 2 * chunk);
  ro.policy = video::QueuePolicy::kBlock;
  video::StreamReader reader(*std::move(source), ro);  // decodes ahead on its own thread

  std::unique_ptr<video::VideoWriter> writer;
  std::string video_path;
  std::map<int, int> counts;
  uint64_t frames = 0;
  double ms = 0;
  int width = 0, height = 0;
  bool ended = false;
  std::vector<video::Frame> batch;
  std::vector<detect::Image> images;
  while (!ended) {
    batch.clear();
    while (batch.size() < chunk) {
      video::Frame f;
      const video::StreamReader::PopResult r = reader.Pop(&f, std::chrono::seconds(1));
      if (r == video::StreamReader::PopResult::kEnd) {
        ended = true;
        break;
      }
      if (r == video::StreamReader::PopResult::kFrame) batch.push_back(std::move(f));
    }
    if (batch.empty()) break;
    images.assign(batch.size(), {});
    for (size_t i = 0; i < batch.size(); ++i) images[i] = {batch[i].width, batch[i].height, std::move(batch[i].bgr)};
    const int64_t start_ns = SystemClock()->SteadyNs();
    StatusOr<std::vector<std::vector<detect::Detection>>> results = detector.Detect(images);
    ms += static_cast<double>(SystemClock()->SteadyNs() - start_ns) / 1e6;
    if (!results.ok()) {
      PrintError(StrCat(path, ": frame ", batch[0].seq, ": ", results.status().message()));
      break;
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::vector<detect::Detection>& dets = (*results)[i];
      const video::Frame& f = batch[i];
      if (frames == 0) {
        width = f.width;
        height = f.height;
      }
      for (const detect::Detection& d : dets) ++counts[d.class_id];
      if (out.json != nullptr) {
        nlohmann::ordered_json row = {{"file", path}, {"frame", f.seq}, {"pts", Round(static_cast<double>(f.pts_ns) * 1e-9, 6)}};
        row["detections"] = nlohmann::ordered_json::array();
        for (const detect::Detection& d : dets) row["detections"].push_back(DetectionJson(d, detector));
        *out.json << row.dump() << "\n";
      }
      if (out.save && !writer && frames == 0) {
        video_path = (out.dir / UniqueName(path, ".mp4", out.used_names)).string();
        StatusOr<std::unique_ptr<video::VideoWriter>> opened =
            video::VideoWriter::Open({video_path, f.width, f.height, fps > 0 ? fps : 25.0, ""});
        if (opened.ok()) {
          writer = *std::move(opened);
        } else {
          PrintError(std::string(opened.status().message()));
        }
      }
      if (writer) {
        cv::Mat canvas = DrawDetections(images[i], dets, detector);
        if (canvas.cols != width || canvas.rows != height) cv::resize(canvas, canvas, cv::Size(width, height));
        if (Status st = writer->Write(canvas.data, static_cast<int>(canvas.step), f.pts_ns); !st.ok()) {
          PrintError(std::string(st.message()));
          writer.reset();
          video_path.clear();
        }
      }
      ++frames;
    }
    if (out.json != nullptr) out.json->flush();
    progress.Update(frames);
  }
  reader.Stop();
  progress.Update(frames, /*last=*/true);
  if (Status st = reader.final_status(); !st.ok()) PrintError(std::string(st.message()));
  if (writer) {
    if (Status st = writer->Close(); !st.ok()) {
      PrintError(std::string(st.message()));
      video_path.clear();
    }
  }
  const uint64_t decode_errors = reader.Stats().decode_errors;
  std::fprintf(stderr, "%s: %llu frames, %s, %.1f ms per frame%s%s\n", path.c_str(),
               static_cast<unsigned long long>(frames), SummaryText(width, height, counts, detector).c_str(),
               frames > 0 ? ms / static_cast<double>(frames) : 0.0,
               decode_errors > 0 ? StrCat(", ", decode_errors, " decode errors").c_str() : "",
               video_path.empty() ? "" : StrCat(", annotated video ", video_path).c_str());
  if (frames == 0) PrintError(StrCat(path, ": no frame could be decoded"));
  return frames > 0;
}
#endif

int RunDetect(const DetectArgs& a) {
  detect::DetectorOptions options;
  options.conf = a.conf;
  options.iou = a.iou;
  options.max_det = a.max_det;
  options.agnostic = a.agnostic;
  options.classes = a.classes;
  options.engine.batch = a.batch;
  options.engine.threads = a.threads;
  options.engine.device = a.device;
  if (StatusOr<infer::Precision> p = infer::ParsePrecision(a.precision); p.ok()) {
    options.engine.precision = *p;
  } else {
    PrintError(std::string(p.status().message()));
    return 2;
  }
  if (StatusOr<infer::Int8Activations> i = infer::ParseInt8Activations(a.int8_activations); i.ok()) {
    options.engine.int8_activations = *i;
  } else {
    PrintError(StrCat("--int8-activations: ", i.status().message()));
    return 2;
  }
  if (!ParseImgsz(a.imgsz, &options.imgsz_height, &options.imgsz_width)) {
    PrintError(StrCat("--imgsz '", a.imgsz, "' is not H,W or one size in pixels"));
    return 2;
  }
  Outputs out;
  out.dir = a.output_dir;
  out.save = !a.no_save;
  const std::string json_path = !a.json.empty() ? a.json : (a.no_save ? "" : (out.dir / "detections.jsonl").string());
  std::error_code ec;
  if (out.save) fs::create_directories(out.dir, ec);
  if (!ec && !json_path.empty() && json_path != "-" && fs::path(json_path).has_parent_path()) {
    fs::create_directories(fs::path(json_path).parent_path(), ec);
  }
  if (ec) {
    PrintError(StrCat("cannot create output folder: ", ec.message()));
    return 2;
  }
  std::ofstream json_file;
  if (!json_path.empty() && json_path != "-") {
    json_file.open(json_path, std::ios::trunc);
    if (!json_file) {
      PrintError(StrCat("--json ", json_path, ": cannot open for writing"));
      return 2;
    }
  }
  out.json = json_path.empty() ? nullptr : json_path == "-" ? &std::cout : &json_file;

  const std::vector<Input> inputs = CollectInputs(a.paths);
  StatusOr<std::unique_ptr<detect::Detector>> loaded = detect::Detector::Load(a.model, options);
  if (!loaded.ok()) {
    PrintError(std::string(loaded.status().message()));
    return 2;
  }
  const detect::Detector& detector = **loaded;

  int succeeded = 0, failed = 0;
  const size_t chunk = static_cast<size_t>(detector.model().batch);
  for (size_t first = 0; first < inputs.size();) {
#ifdef VIGIL_HAVE_FFMPEG
    if (inputs[first].video) {
      ++(DetectVideo(inputs[first++].path, detector, out) ? succeeded : failed);
      continue;
    }
#endif
    // Decode up to one batch of readable images (up to the next video); report the others.
    std::vector<detect::Image> images;
    std::vector<const Input*> sources;
    for (; first < inputs.size() && images.size() < chunk && !inputs[first].video; ++first) {
      const Input& in = inputs[first];
      if (!in.error.empty()) {
        PrintError(StrCat(in.path, ": ", in.error));
        ++failed;
        continue;
      }
      StatusOr<detect::Image> image = detect::LoadImage(in.path);
      if (!image.ok()) {
        PrintError(std::string(image.status().message()));
        ++failed;
        continue;
      }
      images.push_back(*std::move(image));
      sources.push_back(&in);
    }
    if (images.empty()) continue;
    const int64_t start_ns = SystemClock()->SteadyNs();
    StatusOr<std::vector<std::vector<detect::Detection>>> results = detector.Detect(images);
    const double ms = static_cast<double>(SystemClock()->SteadyNs() - start_ns) / 1e6 / images.size();
    if (!results.ok()) {
      for (const Input* in : sources) PrintError(StrCat(in->path, ": ", std::string(results.status().message())));
      failed += static_cast<int>(images.size());
      continue;
    }
    for (size_t i = 0; i < images.size(); ++i) {
      const std::vector<detect::Detection>& dets = (*results)[i];
      const std::string& path = sources[i]->path;
      ++succeeded;
      std::map<int, int> counts;
      for (const detect::Detection& d : dets) {
        ++counts[d.class_id];
        if (out.json == nullptr) continue;
        nlohmann::ordered_json row = {{"file", path}};
        row.update(DetectionJson(d, detector));
        *out.json << row.dump() << "\n";
      }
      if (out.json != nullptr) out.json->flush();
      if (out.save) {
        StatusOr<std::string> written = SaveAnnotated(DrawDetections(images[i], dets, detector), path, out.dir, out.used_names);
        if (!written.ok()) PrintError(std::string(written.status().message()));
      }
      std::fprintf(stderr, "%s: %s, %.1f ms\n", path.c_str(),
                   SummaryText(images[i].width, images[i].height, counts, detector).c_str(), ms);
    }
  }
  if (json_file.is_open() && !json_file) {
    PrintError(StrCat("--json ", json_path, ": write failed"));
    return 1;
  }
  if (succeeded == 0) {
    PrintError(StrCat("no input was processed (", failed, " failed)"));
    return 1;
  }
  return 0;
}

}  // namespace

void AddDetectCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<DetectArgs>();
  CLI::App* cmd = app.add_subcommand("detect", "Detect objects in images, folders of images and video files");
  cmd->add_option("--model", a->model, "ONNX detection model (YOLOv5/v8/11/26, YOLOX, ...)")->required();
  cmd->add_option("--conf", a->conf, "confidence threshold: keep score > conf")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--iou", a->iou, "NMS IoU threshold (default: 0.7 Ultralytics, 0.45 YOLOv5/YOLOX)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-det", a->max_det, "detections per image")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--agnostic", a->agnostic, "class-agnostic NMS");
  cmd->add_option("--classes", a->classes, "keep only these class ids, e.g. 0,2")
      ->delimiter(',')
      ->allow_extra_args(false);  // one (comma-separated) value: the image paths after it stay paths
  cmd->add_option("--imgsz", a->imgsz, "input size H,W (or one size) for models with symbolic H/W");
  cmd->add_option("--batch", a->batch, "images per inference for a symbolic batch (0 = the model's, 1 if symbolic)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", a->device, "cpu, or cuda:N (CUDA backend builds)")->capture_default_str();
  cmd->add_option("--precision", a->precision, "CUDA compute precision: fp32 or fp16")->capture_default_str();
  cmd->add_option("--int8-activations", a->int8_activations, kInt8ActivationsHelp)->capture_default_str();
  cmd->add_option("--threads", a->threads, "kernel threads (0 = all CPUs of this process)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", a->json, "JSON lines output (default <output-dir>/detections.jsonl; - = stdout)");
  cmd->add_option("--output-dir", a->output_dir, "folder for annotated images and videos")->capture_default_str();
  cmd->add_flag("--no-save", a->no_save, "write no annotated images or videos (and no JSON unless --json is given)");
  cmd->add_option("paths", a->paths, "image files, folders of images, video files")->required();
  cmd->callback([a, exit_code] { *exit_code = RunDetect(*a); });
}

}  // namespace vigil::cli
