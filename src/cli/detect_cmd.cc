// `vigil detect`: run a detection model on image files and folders.
//
//   vigil detect --model M.onnx [--conf 0.25] [--iou X] [--max-det 300] [--agnostic] [--classes 0,2]
//                [--imgsz H,W] [--batch B] [--threads T] [--json OUT.jsonl|-] [--output-dir DIR]
//                [--no-save] PATHS...
//
// PATHS are image files or folders; a folder contributes its files with image extensions
// (HasImageExtension), sorted by name, without descending into subfolders. Outputs:
//  * annotated copies (boxes, "name score" labels, one colour per class) in --output-dir
//    (default runs/detect) under the source's file name (a repeated name gets _2, _3, ...);
//  * one JSON object per detection and line, {"file","class_id","name","score","box":[x1,y1,x2,y2]}
//    in source pixels, to --json (default <output-dir>/detections.jsonl; "-" = stdout);
//  * one summary line per image on stderr: file, size, detections per class, milliseconds per
//    image (letterbox + inference + decoding + NMS of its batch, divided by the batch's images).
// --no-save writes no files: no annotated images, and JSON only where --json names a target.
// An image that cannot be read or is not an image is reported by name and reason; the others run.
// Exit code: 0 when at least one image was processed, 1 when none was, 2 for bad arguments or a
// model that cannot be loaded (src/cli/commands.h).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "cli/commands.h"
#include "vigil/detect/detector.h"
#include "vigil/detect/image.h"

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
  std::string json;
  std::string output_dir = "runs/detect";
  bool no_save = false;
  std::vector<std::string> paths;
};

// One input: an image path, or a path that failed before decoding with the reason.
struct Input {
  std::string path;
  std::string error;
};

void PrintError(const std::string& message) { std::fprintf(stderr, "vigil detect: %s\n", message.c_str()); }

bool HasVideoExtension(const fs::path& p) {
  static const std::set<std::string> kVideo = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg",
                                               ".mpeg", ".ts", ".flv", ".wmv", ".h264", ".h265", ".hevc"};
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return kVideo.count(ext) != 0;
}

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
    } else if (HasVideoExtension(path)) {
      inputs.push_back({path, "not an image: video files are not supported yet"});
    } else {
      inputs.push_back({path, "not an image (unknown extension; images are .jpg, .png, .bmp, .webp, .tif, ...)"});
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

// Writes `canvas` as dir/<name of source> (made unique among `used`); formats OpenCV cannot write
// fall back to JPEG. Returns the path written or an error message.
StatusOr<std::string> SaveAnnotated(const cv::Mat& canvas, const std::string& source, const fs::path& dir,
                                    std::set<std::string>& used) {
  const fs::path src(source);
  std::string name = src.filename().string();
  for (int n = 2; used.count(name) != 0; ++n) name = src.stem().string() + "_" + std::to_string(n) + src.extension().string();
  used.insert(name);
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

// "768x576, 1 bicycle, 1 truck, 1 dog" (classes in id order).
std::string SummaryText(const detect::Image& image, const std::vector<detect::Detection>& dets,
                        const detect::Detector& detector) {
  std::map<int, int> counts;
  for (const detect::Detection& d : dets) ++counts[d.class_id];
  std::string s = StrCat(image.width, "x", image.height);
  if (counts.empty()) s += ", no detections";
  for (const auto& [cls, n] : counts) s += StrCat(", ", n, " ", detector.ClassName(cls));
  return s;
}

int RunDetect(const DetectArgs& a) {
  detect::DetectorOptions options;
  options.conf = a.conf;
  options.iou = a.iou;
  options.max_det = a.max_det;
  options.agnostic = a.agnostic;
  options.classes = a.classes;
  options.engine.batch = a.batch;
  options.engine.threads = a.threads;
  if (!ParseImgsz(a.imgsz, &options.imgsz_height, &options.imgsz_width)) {
    PrintError(StrCat("--imgsz '", a.imgsz, "' is not H,W or one size in pixels"));
    return 2;
  }
  const fs::path out_dir(a.output_dir);
  const bool save_images = !a.no_save;
  const std::string json_path = !a.json.empty() ? a.json : (a.no_save ? "" : (out_dir / "detections.jsonl").string());
  std::error_code ec;
  if (save_images) fs::create_directories(out_dir, ec);
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
  std::ostream* json = json_path.empty() ? nullptr : json_path == "-" ? &std::cout : &json_file;

  const std::vector<Input> inputs = CollectInputs(a.paths);
  StatusOr<std::unique_ptr<detect::Detector>> loaded = detect::Detector::Load(a.model, options);
  if (!loaded.ok()) {
    PrintError(std::string(loaded.status().message()));
    return 2;
  }
  const detect::Detector& detector = **loaded;

  int succeeded = 0, failed = 0;
  std::set<std::string> used_names;
  const size_t chunk = static_cast<size_t>(detector.model().batch);
  for (size_t first = 0; first < inputs.size();) {
    // Decode up to one batch of readable images; report the others.
    std::vector<detect::Image> images;
    std::vector<const Input*> sources;
    for (; first < inputs.size() && images.size() < chunk; ++first) {
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
    const auto start = std::chrono::steady_clock::now();
    StatusOr<std::vector<std::vector<detect::Detection>>> results = detector.Detect(images);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / images.size();
    if (!results.ok()) {
      for (const Input* in : sources) PrintError(StrCat(in->path, ": ", std::string(results.status().message())));
      failed += static_cast<int>(images.size());
      continue;
    }
    for (size_t i = 0; i < images.size(); ++i) {
      const std::vector<detect::Detection>& dets = (*results)[i];
      const std::string& path = sources[i]->path;
      ++succeeded;
      if (json != nullptr) {
        for (const detect::Detection& d : dets) {
          const nlohmann::ordered_json row = {
              {"file", path},
              {"class_id", d.class_id},
              {"name", detector.ClassName(d.class_id)},
              {"score", Round(d.score, 4)},
              {"box", {Round(d.x1, 2), Round(d.y1, 2), Round(d.x2, 2), Round(d.y2, 2)}}};
          *json << row.dump() << "\n";
        }
        json->flush();
      }
      if (save_images) {
        StatusOr<std::string> written = SaveAnnotated(DrawDetections(images[i], dets, detector), path, out_dir, used_names);
        if (!written.ok()) PrintError(std::string(written.status().message()));
      }
      std::fprintf(stderr, "%s: %s, %.1f ms\n", path.c_str(), SummaryText(images[i], dets, detector).c_str(), ms);
    }
  }
  if (json_file.is_open() && !json_file) {
    PrintError(StrCat("--json ", json_path, ": write failed"));
    return 1;
  }
  if (succeeded == 0) {
    PrintError(StrCat("no image was processed (", failed, " failed)"));
    return 1;
  }
  return 0;
}

}  // namespace

void AddDetectCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<DetectArgs>();
  CLI::App* cmd = app.add_subcommand("detect", "Detect objects in image files and folders");
  cmd->add_option("--model", a->model, "ONNX detection model (YOLOv5/v8/11/26, YOLOX, ...)")->required();
  cmd->add_option("--conf", a->conf, "confidence threshold: keep score > conf")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--iou", a->iou, "NMS IoU threshold (default: 0.7 Ultralytics, 0.45 YOLOv5/YOLOX)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-det", a->max_det, "detections per image")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--agnostic", a->agnostic, "class-agnostic NMS");
  cmd->add_option("--classes", a->classes, "keep only these class ids, e.g. 0,2")
      ->delimiter(',');
  cmd->add_option("--imgsz", a->imgsz, "input size H,W (or one size) for models with symbolic H/W");
  cmd->add_option("--batch", a->batch, "images per inference for a symbolic batch (0 = the model's, 1 if symbolic)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", a->threads, "kernel threads (0 = all CPUs of this process)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", a->json, "JSON lines output (default <output-dir>/detections.jsonl; - = stdout)");
  cmd->add_option("--output-dir", a->output_dir, "folder for annotated images")->capture_default_str();
  cmd->add_flag("--no-save", a->no_save, "write no annotated images (and no JSON unless --json is given)");
  cmd->add_option("paths", a->paths, "image files or folders of images")->required();
  cmd->callback([a, exit_code] { *exit_code = RunDetect(*a); });
}

}  // namespace vigil::cli
