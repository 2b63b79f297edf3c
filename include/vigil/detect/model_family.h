// vigil/detect/model_family.h — recognising a YOLO model's family from its input/output shapes and
// metadata, and its class names. Decoding the outputs is in decode.h.
//
// Families (YOLO-NOTES.md, "Output layouts"); H×W is the model input, cells = Σ_s ceil(H/s)·ceil(W/s)
// over the strides s = 8, 16, 32 (and 64 for P6 models whose metadata `stride` is 64):
//   kUltralytics  [B, 4+nc, cells]  YOLOv8/YOLO11/YOLOv5u anchor-free: cx, cy, w, h in input pixels,
//                                   then nc class scores (sigmoid applied in-graph), no objectness.
//   kYoloV5       [B, 3·cells, 5+nc] original anchor-based YOLOv5: cx, cy, w, h in input pixels,
//                                   objectness, nc class scores (all decoded in-graph).
//   kYolox        [B, cells, 5+nc]  YOLOX: objectness and class scores sigmoided; the box is raw
//                                   (xy = (p + grid)·stride, wh = exp(p)·stride, YOLOX `YOLOXHead.decode_outputs`)
//                                   unless the graph decodes it itself (it then contains an Exp op).
//   kEnd2End      [B, K, 6]         YOLO26, YOLOv10 and nms=True exports: x1, y1, x2, y2 in input
//                                   pixels, score, class id; the graph has already selected K boxes.
// Metadata (Ultralytics `metadata_props`): end2end == "True", or `args` containing 'nms': True, mark
// an end-to-end model whatever its shape; `task` other than "detect" is refused; `names` gives the
// class names. Shapes decide otherwise, in the order above; a [B, K, 6] output that matches no
// cell count is end-to-end (YOLOv10 files without metadata).
//
// Thread-safety: all functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/detect/letterbox.h"
#include "vigil/infer/engine.h"

namespace vigil::detect {

enum class ModelFamily { kUltralytics, kYoloV5, kYolox, kEnd2End };

// "ultralytics", "yolov5", "yolox", "end2end".
std::string_view FamilyName(ModelFamily family);

// Everything pre- and post-processing need to know about a detection model.
struct ModelInfo {
  ModelFamily family = ModelFamily::kUltralytics;
  std::string input_name;
  DType input_dtype = DType::kFloat32;  // float32 or float16
  int64_t batch = 1, channels = 3, height = 0, width = 0;  // the input is [batch, channels, height, width]
  std::string output_name;              // the output decoded (the model's first)
  int64_t num_boxes = 0;                // candidate boxes per image (cells, 3·cells or K)
  int64_t num_classes = 0;              // nc; for end-to-end models the number of names
  std::vector<int> strides;             // 8, 16, 32 (, 64): the grid of the raw YOLOX decode
  bool raw_boxes = false;               // YOLOX without in-graph decoding
  std::vector<std::string> names;       // at least num_classes entries: metadata `names`, else COCO-80
                                        // when nc is 80 (or unknown: end-to-end), else "class<N>"
  LetterboxStyle letterbox = LetterboxStyle::kUltralytics;  // YOLOX style for kYolox
  float default_iou = 0.7f;             // NMS IoU: 0.7 Ultralytics, 0.45 YOLOv5/YOLOX (their defaults)
};

// Σ_s ceil(height/s)·ceil(width/s): the grid cells of detection heads at `strides` (a stride-2
// convolution with padding 1 maps n pixels to ceil(n/2)). 8400 for 640×640 at 8, 16, 32.
int64_t GridCellCount(int64_t height, int64_t width, std::span<const int> strides);

// Recognises the family from the model's metadata and op counts (`summary`) and its concrete
// input/output shapes (Engine::inputs()/outputs()).
// Errors: InvalidArgument naming the input and its shape when the model does not have exactly one
// image input [N, 3|1, H, W] of float32/float16, or naming the output and its shape when it matches
// no layout above; Unimplemented for a `task` other than detect (segment, pose, obb, classify).
StatusOr<ModelInfo> DescribeModel(const infer::ModelSummary& summary, std::span<const infer::TensorInfo> inputs,
                                  std::span<const infer::TensorInfo> outputs);
// The same for a loaded engine: its summary(), inputs() and outputs().
StatusOr<ModelInfo> DescribeModel(const infer::Engine& engine);

// Parses Ultralytics' `names` metadata, a Python dict literal {0: 'person', 1: "it's", ...} (or a
// list literal ['person', ...]) with '…' or "…" strings and Python escapes (\\ \' \" \n \t \xNN
// \uNNNN \UNNNNNNNN; an unknown escape keeps its backslash). Returns the names indexed by key;
// keys that the dict skips are filled with "class<N>".
// Errors: InvalidArgument naming the offset and what was expected.
StatusOr<std::vector<std::string>> ParseClassNames(std::string_view literal);

// The 80 COCO class names in the standard order (0 person … 79 toothbrush).
const std::vector<std::string>& CocoClassNames();

// names[class_id] when in range, else "class<class_id>".
std::string ClassName(std::span<const std::string> names, int class_id);

}  // namespace vigil::detect
