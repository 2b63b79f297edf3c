// detect_kernels.h — the detector's GPU stages as CUDA kernels (detect_kernels.cu): letterbox from 8-bit
// BGR frames into the model's input tensor, and decode + sort + NMS + mapping back to source pixels
// into a fixed-size detection tensor. Host code (gpu_stages.cc) owns the buffers; these functions only
// enqueue work on `stream` and return the launch error (cudaSuccess when enqueued).
//
// Every formula is the host implementation's (letterbox.h, decode.h, nms.h), written so that the
// results can be compared exactly: see each function. Pointers are device pointers unless named
// `host`. Thread-safety: the functions are stateless; concurrent calls on different buffers are fine.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace vigil::detect::cuda {

// One slot of a batch: where its frame is and where it goes in the model input.
struct SlotGeometry {
  const uint8_t* bgr = nullptr;  // device, 8-bit BGR rows of `pitch` bytes (NV12: the Y plane);
                                 // nullptr = blank slot (zeros)
  int64_t pitch = 0;             // bytes from one row to the next (>= width * 3; NV12 >= width)
  const uint8_t* uv = nullptr;   // NV12 only: interleaved U, V rows ((height + 1) / 2 of them); nullptr = BGR
  int64_t uv_pitch = 0;
  float kr = 0.299f, kb = 0.114f;  // NV12: the matrix's luma weights of R and B (BT.601, BT.709)
  bool full_range = false;         // NV12: full instead of limited range
  int source_width = 0, source_height = 0;    // frame pixels
  int resized_width = 0, resized_height = 0;  // letterbox.h LetterboxInfo
  int pad_left = 0, pad_top = 0;
  double ratio = 1;              // resized / source
};

struct LetterboxParams {
  int batch = 0;             // slots (grid z)
  int channels = 3;          // 3 (colour) or 1 (grey: cv::COLOR_BGR2GRAY's 15-bit fixed point)
  int height = 0, width = 0; // model input H, W
  bool half = false;         // output float16 (round to nearest even) instead of float32
  bool rgb = true;           // plane c takes BGR channel 2 - c (Ultralytics); false keeps BGR (YOLOX)
  float scale = 1.0f / 255;  // multiplier after the 8-bit value (Ultralytics 1/255, YOLOX 1)
};

// Writes `params.batch` slots of the [batch, channels, height, width] tensor at `out`.
// NV12 slots are converted to 8-bit BGR per source pixel first (below), then resized like BGR ones.
// Resize: cv::resize INTER_LINEAR's geometry (source x = (x + 0.5) · scale − 0.5, clamped at the
// borders the way OpenCV's resize does) and its 11-bit fixed-point weights, summed in integers and
// rounded once; OpenCV's own vertical pass truncates in two steps, so values may differ from the host
// letterbox by 1 grey level, never more. Padding 114, blank slots 0.
// NV12 → BGR per pixel (ITU-R BT.601/709 equations; chroma of the 2×2 block, not interpolated, as
// nearest-neighbour 4:2:0 upsampling): limited range y = (Y − 16)·255/219, c = (C − 128)·255/224; full
// range y = Y, c = C − 128; R = y + 2(1−Kr)·cr, B = y + 2(1−Kb)·cb, G = (y − Kr·R − Kb·B)/(1−Kr−Kb),
// each rounded to nearest and clamped to 0..255 (float32 arithmetic).
cudaError_t Letterbox(const SlotGeometry* slots, const LetterboxParams& params, void* out, cudaStream_t stream);

enum class Layout : int { kUltralytics = 0, kYoloV5 = 1, kYolox = 2, kEnd2End = 3 };

struct DecodeParams {
  Layout layout = Layout::kUltralytics;
  int64_t num_boxes = 0;     // N
  int num_classes = 0;       // nc (end-to-end: only used to bound `allowed`)
  bool half = false;         // output elements are float16
  bool raw_boxes = false;    // YOLOX grid decoding with `strides`
  int strides[8] = {};
  int num_strides = 0;
  int height = 0, width = 0; // model input (the YOLOX grid)
  float conf = 0.25f;        // keep score > conf
  const uint8_t* allowed = nullptr;  // device, `allowed_count` flags by class id; nullptr = all classes
  int allowed_count = 0;
};

// Candidate decoding (decode.h) of `images` images of `output`: for each kept box writes its xyxy
// (model-input pixels) to boxes[(b·N + i)·4 …] and class to classes[b·N + i], and appends the sort
// key (score bits << 32 | ~i: descending order = score descending, then box index ascending, the
// host's stable order) to keys[b·N + counts[b]++]. REQUIRES: counts zeroed.
cudaError_t Decode(const void* output, int images, const DecodeParams& params, uint64_t* keys, float* boxes,
                   int* classes, int* counts, cudaStream_t stream);

// Bytes of temporary storage SortCandidates needs for `images` × `num_boxes`.
size_t SortTempBytes(int images, int64_t num_boxes);

// Sorts each image's keys[b·N, b·N + counts[b]) into sorted[...] (descending; cub's segmented radix
// sort). `segment_offsets` is scratch for 2 · `images` ints; `temp` holds SortTempBytes bytes.
cudaError_t SortCandidates(const uint64_t* keys, uint64_t* sorted, const int* counts, int* segment_offsets,
                           int images, int64_t num_boxes, void* temp, size_t temp_bytes, cudaStream_t stream);

struct NmsParams {
  float iou = 0.7f;          // suppress when IoU > iou
  int max_det = 300;
  bool agnostic = false;
  bool suppress = true;      // false: end-to-end models, the max_det best by score only
  int max_candidates = 30000;
};

// Greedy NMS of each image's sorted candidates (nms.h: same IoU expression and order, evaluated
// without contraction so every comparison equals the host's), writing kept rows (x1, y1, x2, y2,
// score, class) in score order to out[b, k, 6] and their number to out_counts[b].
cudaError_t Nms(const uint64_t* sorted, const float* boxes, const int* classes, const int* counts, int images,
                int64_t num_boxes, const NmsParams& params, float* out, int* out_counts, int max_det,
                cudaStream_t stream);

// letterbox.h MapToSource on the kept rows: subtract the pad, divide by the ratio (in double, as the
// host), clip to the source frame.
cudaError_t MapToSource(const SlotGeometry* slots, int images, int max_det, const int* out_counts, float* out,
                        cudaStream_t stream);

}  // namespace vigil::detect::cuda
