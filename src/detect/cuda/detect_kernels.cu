// Kernels of the detector's GPU stages; contracts in detect_kernels.h.
#include "detect/cuda/detect_kernels.h"

#include <cuda_fp16.h>

#include <cub/device/device_segmented_radix_sort.cuh>

namespace vigil::detect::cuda {
namespace {

constexpr int kPad = 114;            // Ultralytics LetterBox / YOLOX preproc fill
constexpr int kCoefBits = 11;        // OpenCV INTER_RESIZE_COEF_BITS
constexpr int kCoefScale = 1 << kCoefBits;

// cv::resize INTER_LINEAR source index and 11-bit weight of the left/top neighbour for output index
// `d` (OpenCV modules/imgproc/src/resize.cpp, resizeGeneric: fx = (d + 0.5)·scale − 0.5, floor,
// clamped to the first/last pixel with weight 0 for the outside neighbour).
__device__ void LinearTap(int d, double scale, int size, int& s0, int& s1, int& w0) {
  float f = static_cast<float>((d + 0.5) * scale - 0.5);
  int s = static_cast<int>(floorf(f));
  f -= static_cast<float>(s);
  if (s < 0) {
    s = 0;
    f = 0;
  }
  if (s >= size - 1) {
    s = size - 1;
    f = 0;
  }
  s0 = s;
  s1 = min(s + 1, size - 1);
  w0 = __float2int_rn((1.0f - f) * kCoefScale);
}

__device__ int ClampByte(float v) { return min(max(__float2int_rn(v), 0), 255); }

// The 8-bit B, G, R of source pixel (x, y): stored (BGR) or converted from NV12 (detect_kernels.h).
__device__ void FetchBgr(const SlotGeometry& g, int x, int y, int bgr[3]) {
  if (g.uv == nullptr) {
    const uint8_t* px = g.bgr + y * g.pitch + x * 3;
    bgr[0] = px[0];
    bgr[1] = px[1];
    bgr[2] = px[2];
    return;
  }
  const uint8_t* c = g.uv + (y / 2) * g.uv_pitch + (x / 2) * 2;
  float luma = g.bgr[y * g.pitch + x], cb = static_cast<float>(c[0]) - 128.0f, cr = static_cast<float>(c[1]) - 128.0f;
  if (!g.full_range) {
    luma = (luma - 16.0f) * (255.0f / 219.0f);
    cb *= 255.0f / 224.0f;
    cr *= 255.0f / 224.0f;
  }
  const float kg = 1.0f - g.kr - g.kb;
  bgr[2] = ClampByte(luma + 2.0f * (1.0f - g.kr) * cr);
  bgr[0] = ClampByte(luma + 2.0f * (1.0f - g.kb) * cb);
  bgr[1] = ClampByte(luma - (2.0f * g.kb * (1.0f - g.kb) / kg) * cb - (2.0f * g.kr * (1.0f - g.kr) / kg) * cr);
}

__global__ void LetterboxKernel(const SlotGeometry* slots, LetterboxParams p, void* out) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y;
  const int b = blockIdx.z;
  if (x >= p.width) return;
  const SlotGeometry g = slots[b];
  int bgr[3] = {kPad, kPad, kPad};
  bool blank = g.bgr == nullptr;
  const int rx = x - g.pad_left, ry = y - g.pad_top;
  if (!blank && rx >= 0 && ry >= 0 && rx < g.resized_width && ry < g.resized_height) {
    if (g.resized_width == g.source_width && g.resized_height == g.source_height) {
      FetchBgr(g, rx, ry, bgr);
    } else {
      // cv::resize computes scale as 1 / (dst / src) in double.
      const double sx_scale = 1.0 / (static_cast<double>(g.resized_width) / g.source_width);
      const double sy_scale = 1.0 / (static_cast<double>(g.resized_height) / g.source_height);
      int x0, x1, wx, y0, y1, wy;
      LinearTap(rx, sx_scale, g.source_width, x0, x1, wx);
      LinearTap(ry, sy_scale, g.source_height, y0, y1, wy);
      int p00[3], p01[3], p10[3], p11[3];
      FetchBgr(g, x0, y0, p00);
      FetchBgr(g, x1, y0, p01);
      FetchBgr(g, x0, y1, p10);
      FetchBgr(g, x1, y1, p11);
      for (int c = 0; c < 3; ++c) {
        const int top = p00[c] * wx + p01[c] * (kCoefScale - wx);
        const int bottom = p10[c] * wx + p11[c] * (kCoefScale - wx);
        const int v = (top * wy + bottom * (kCoefScale - wy) + (1 << (2 * kCoefBits - 1))) >> (2 * kCoefBits);
        bgr[c] = min(max(v, 0), 255);
      }
    }
  }
  const int64_t plane = static_cast<int64_t>(p.height) * p.width;
  const int64_t base = static_cast<int64_t>(b) * p.channels * plane + static_cast<int64_t>(y) * p.width + x;
  for (int c = 0; c < p.channels; ++c) {
    float v = 0;
    if (!blank) {
      int u;
      if (p.channels == 1) {
        // cv::COLOR_BGR2GRAY on 8 bits as OpenCV 4's vectorised path computes it (15-bit weights of
        // 0.114, 0.587, 0.299 summing to 2^15; checked equal to cv::cvtColor on every pixel of random
        // images): (3735·B + 19235·G + 9798·R + 2^14) >> 15.
        u = (bgr[0] * 3735 + bgr[1] * 19235 + bgr[2] * 9798 + (1 << 14)) >> 15;
      } else {
        u = bgr[p.rgb ? 2 - c : c];
      }
      v = __fmul_rn(static_cast<float>(u), p.scale);
    }
    if (p.half) {
      static_cast<__half*>(out)[base + c * plane] = __float2half_rn(v);
    } else {
      static_cast<float*>(out)[base + c * plane] = v;
    }
  }
}

template <typename T>
__device__ float Load(const T* p, int64_t i);
template <>
__device__ float Load<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ float Load<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

template <typename T>
__global__ void DecodeKernel(const T* output, DecodeParams p, uint64_t* keys, float* boxes, int* classes,
                             int* counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int b = blockIdx.y;
  if (i >= p.num_boxes) return;
  const int64_t n = p.num_boxes, nc = p.num_classes;
  float x1, y1, x2, y2, score;
  int best = 0;
  if (p.layout == Layout::kEnd2End) {
    const T* r = output + (b * n + i) * 6;
    x1 = Load(r, 0);
    y1 = Load(r, 1);
    x2 = Load(r, 2);
    y2 = Load(r, 3);
    score = Load(r, 4);
    best = static_cast<int>(Load(r, 5));
  } else {
    // Field f of box i at r[f * field_step]: [4+nc, N] (Ultralytics) or [N, 5+nc].
    const bool channels_first = p.layout == Layout::kUltralytics;
    const int64_t fields = channels_first ? 4 + nc : 5 + nc;
    const int64_t field_step = channels_first ? n : 1;
    const T* r = output + b * n * fields + (channels_first ? i : i * fields);
    const int64_t first_class = channels_first ? 4 : 5;
    float best_score = Load(r, first_class * field_step);
    for (int64_t c = 1; c < nc; ++c) {
      const float s = Load(r, (first_class + c) * field_step);
      if (s > best_score) {
        best_score = s;
        best = static_cast<int>(c);
      }
    }
    float cx = Load(r, 0), cy = Load(r, field_step), w = Load(r, 2 * field_step), h = Load(r, 3 * field_step);
    if (p.raw_boxes) {
      int64_t begin = 0;
      for (int l = 0; l < p.num_strides; ++l) {
        const int s = p.strides[l];
        const int64_t grid_w = (p.width + s - 1) / s, cells = grid_w * ((p.height + s - 1) / s);
        if (i < begin + cells || l == p.num_strides - 1) {
          const int64_t cell = i - begin;
          const float stride = static_cast<float>(s);
          cx = __fmul_rn(__fadd_rn(cx, static_cast<float>(cell % grid_w)), stride);
          cy = __fmul_rn(__fadd_rn(cy, static_cast<float>(cell / grid_w)), stride);
          w = __fmul_rn(expf(w), stride);
          h = __fmul_rn(expf(h), stride);
          break;
        }
        begin += cells;
      }
    }
    score = channels_first ? best_score : __fmul_rn(Load(r, 4 * field_step), best_score);
    const float hw = w / 2, hh = h / 2;
    x1 = __fsub_rn(cx, hw);
    y1 = __fsub_rn(cy, hh);
    x2 = __fadd_rn(cx, hw);
    y2 = __fadd_rn(cy, hh);
  }
  if (!(score > p.conf)) return;
  if (p.allowed != nullptr && (best < 0 || best >= p.allowed_count || p.allowed[best] == 0)) return;
  const int64_t at = b * n + i;
  float* box = boxes + at * 4;
  box[0] = x1;
  box[1] = y1;
  box[2] = x2;
  box[3] = y2;
  classes[at] = best;
  const int slot = atomicAdd(&counts[b], 1);
  // score > conf >= 0, so its bit pattern orders like the value.
  keys[b * n + slot] = (static_cast<uint64_t>(__float_as_uint(score)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

// Segment b is [b·N, b·N + counts[b]): begins in offsets[0, images), ends in offsets[images, 2·images).
__global__ void SegmentOffsetsKernel(const int* counts, int images, int64_t num_boxes, int* offsets) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= images) return;
  offsets[b] = static_cast<int>(b * num_boxes);
  offsets[images + b] = static_cast<int>(b * num_boxes) + counts[b];
}

// nms.h IoU, every operation rounded on its own (no fused multiply-add), as the host computes it.
__device__ float IoU(float4 a, float4 b) {
  const float iw = __fsub_rn(fminf(a.z, b.z), fmaxf(a.x, b.x));
  const float ih = __fsub_rn(fminf(a.w, b.w), fmaxf(a.y, b.y));
  const float inter = iw > 0 && ih > 0 ? __fmul_rn(iw, ih) : 0.0f;
  const float area_a = __fmul_rn(__fsub_rn(a.z, a.x), __fsub_rn(a.w, a.y));
  const float area_b = __fmul_rn(__fsub_rn(b.z, b.x), __fsub_rn(b.w, b.y));
  const float uni = __fsub_rn(__fadd_rn(area_a, area_b), inter);
  return uni > 0 ? __fdiv_rn(inter, uni) : 0.0f;
}

constexpr int kTile = 256;
constexpr int kWords = kTile / 32;

// One block per image. Candidates are taken in tiles of kTile in score order: each is first checked
// against the boxes kept so far (in parallel), then the tile's pairwise suppression masks are built
// (in parallel) and one thread walks the tile in order, keeping a candidate when neither an earlier
// tile's kept box nor a box kept earlier in this tile suppresses it — the host's greedy loop.
__global__ void NmsKernel(const uint64_t* sorted, const float* boxes, const int* classes, const int* counts,
                          int64_t num_boxes, NmsParams p, float* out, int* out_counts, int max_det) {
  const int b = blockIdx.x;
  const int t = threadIdx.x;
  __shared__ float4 tile_box[kTile];
  __shared__ int tile_class[kTile];
  __shared__ float tile_score[kTile];
  __shared__ unsigned mask[kTile][kWords];
  __shared__ bool alive[kTile];
  __shared__ int picked[kTile];
  __shared__ int num_picked;
  __shared__ int kept;
  const int n = min(counts[b], p.max_candidates);
  const int limit = min(p.max_det, max_det);
  float* rows = out + static_cast<int64_t>(b) * max_det * 6;
  if (t == 0) kept = 0;
  __syncthreads();
  for (int start = 0; start < n; start += kTile) {
    if (kept >= limit) break;  // uniform: kept is shared and stable here
    const int tile_n = min(kTile, n - start);
    const int c = start + t;
    bool live = false;
    if (t < tile_n) {
      const uint64_t key = sorted[b * num_boxes + c];
      const int64_t idx = static_cast<int64_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu));
      const float* bx = boxes + (b * num_boxes + idx) * 4;
      tile_box[t] = make_float4(bx[0], bx[1], bx[2], bx[3]);
      tile_class[t] = classes[b * num_boxes + idx];
      tile_score[t] = __uint_as_float(static_cast<uint32_t>(key >> 32));
      live = true;
      if (p.suppress) {
        for (int k = 0; k < kept && live; ++k) {
          const float* r = rows + k * 6;
          if ((p.agnostic || static_cast<int>(r[5]) == tile_class[t]) &&
              IoU(make_float4(r[0], r[1], r[2], r[3]), tile_box[t]) > p.iou) {
            live = false;
          }
        }
      }
    }
    alive[t] = live;
    __syncthreads();
    if (p.suppress && t < tile_n) {
      unsigned words[kWords] = {};
      for (int j = t + 1; j < tile_n; ++j) {
        if ((p.agnostic || tile_class[j] == tile_class[t]) && IoU(tile_box[t], tile_box[j]) > p.iou) {
          words[j / 32] |= 1u << (j % 32);
        }
      }
      for (int w = 0; w < kWords; ++w) mask[t][w] = words[w];
    }
    __syncthreads();
    if (t == 0) {
      unsigned removed[kWords] = {};
      int np = 0;
      for (int i = 0; i < tile_n && kept + np < limit; ++i) {
        if (!alive[i] || (removed[i / 32] >> (i % 32) & 1u)) continue;
        picked[np++] = i;
        if (p.suppress) {
          for (int w = 0; w < kWords; ++w) removed[w] |= mask[i][w];
        }
      }
      num_picked = np;
    }
    __syncthreads();
    if (t < num_picked) {
      const int i = picked[t];
      float* r = rows + (kept + t) * 6;
      r[0] = tile_box[i].x;
      r[1] = tile_box[i].y;
      r[2] = tile_box[i].z;
      r[3] = tile_box[i].w;
      r[4] = tile_score[i];
      r[5] = static_cast<float>(tile_class[i]);
    }
    __syncthreads();
    if (t == 0) kept += num_picked;
    __syncthreads();
  }
  if (t == 0) out_counts[b] = kept;
}

__global__ void MapKernel(const SlotGeometry* slots, int max_det, const int* out_counts, float* out) {
  const int b = blockIdx.y;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= out_counts[b]) return;
  const SlotGeometry g = slots[b];
  float* r = out + (static_cast<int64_t>(b) * max_det + k) * 6;
  // Host: std::clamp(static_cast<float>((v - pad) / ratio), 0, limit) with v - pad in float.
  const auto map = [&](float v, int pad, int limit) {
    const float shifted = __fsub_rn(v, static_cast<float>(pad));
    const float m = static_cast<float>(static_cast<double>(shifted) / g.ratio);
    return fminf(fmaxf(m, 0.0f), static_cast<float>(limit));
  };
  r[0] = map(r[0], g.pad_left, g.source_width);
  r[2] = map(r[2], g.pad_left, g.source_width);
  r[1] = map(r[1], g.pad_top, g.source_height);
  r[3] = map(r[3], g.pad_top, g.source_height);
}

}  // namespace

cudaError_t Letterbox(const SlotGeometry* slots, const LetterboxParams& params, void* out, cudaStream_t stream) {
  if (params.batch <= 0) return cudaSuccess;
  const dim3 block(128);
  const dim3 grid((params.width + block.x - 1) / block.x, params.height, params.batch);
  LetterboxKernel<<<grid, block, 0, stream>>>(slots, params, out);
  return cudaGetLastError();
}

cudaError_t Decode(const void* output, int images, const DecodeParams& params, uint64_t* keys, float* boxes,
                   int* classes, int* counts, cudaStream_t stream) {
  if (images <= 0 || params.num_boxes <= 0) return cudaSuccess;
  const dim3 block(256);
  const dim3 grid(static_cast<unsigned>((params.num_boxes + block.x - 1) / block.x), images);
  if (params.half) {
    DecodeKernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(output), params, keys, boxes, classes, counts);
  } else {
    DecodeKernel<<<grid, block, 0, stream>>>(static_cast<const float*>(output), params, keys, boxes, classes, counts);
  }
  return cudaGetLastError();
}

size_t SortTempBytes(int images, int64_t num_boxes) {
  size_t bytes = 0;
  const int* offsets = nullptr;
  cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, bytes, static_cast<const uint64_t*>(nullptr),
                                                    static_cast<uint64_t*>(nullptr), static_cast<int>(images * num_boxes),
                                                    images, offsets, offsets);
  return bytes;
}

cudaError_t SortCandidates(const uint64_t* keys, uint64_t* sorted, const int* counts, int* segment_offsets,
                           int images, int64_t num_boxes, void* temp, size_t temp_bytes, cudaStream_t stream) {
  if (images <= 0) return cudaSuccess;
  SegmentOffsetsKernel<<<(images + 127) / 128, 128, 0, stream>>>(counts, images, num_boxes, segment_offsets);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int* begins = segment_offsets;
  const int* ends = segment_offsets + images;
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(temp, temp_bytes, keys, sorted,
                                                           static_cast<int>(images * num_boxes), images, begins, ends,
                                                           0, 64, stream);
}

cudaError_t Nms(const uint64_t* sorted, const float* boxes, const int* classes, const int* counts, int images,
                int64_t num_boxes, const NmsParams& params, float* out, int* out_counts, int max_det,
                cudaStream_t stream) {
  if (images <= 0) return cudaSuccess;
  NmsKernel<<<images, kTile, 0, stream>>>(sorted, boxes, classes, counts, num_boxes, params, out, out_counts, max_det);
  return cudaGetLastError();
}

cudaError_t MapToSource(const SlotGeometry* slots, int images, int max_det, const int* out_counts, float* out,
                        cudaStream_t stream) {
  if (images <= 0 || max_det <= 0) return cudaSuccess;
  const dim3 block(128);
  const dim3 grid((max_det + block.x - 1) / block.x, images);
  MapKernel<<<grid, block, 0, stream>>>(slots, max_det, out_counts, out);
  return cudaGetLastError();
}

}  // namespace vigil::detect::cuda
