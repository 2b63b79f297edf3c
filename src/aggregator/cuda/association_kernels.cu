// The device associator's kernel (association_kernels.h): Tracker::Update's association and state update
// (tracking.cc) for one stream per warp, the same float and double operations in the same order. Every
// arithmetic step is spelled with an explicitly rounded intrinsic (__fadd_rn, __dmul_rn, ...), which nvcc
// never fuses into a multiply-add, so the result is the host's bit for bit.
#include "aggregator/cuda/association_kernels.h"

namespace vigil::aggregator::assoc {
namespace {

constexpr unsigned kAll = 0xffffffffu;
constexpr double kNever = 1e9;  // tracking.cc: the cost of a pair that must not be matched

struct Box {
  float x1, y1, x2, y2;
};

__device__ __forceinline__ float Min(float a, float b) { return b < a ? b : a; }  // std::min's choice
__device__ __forceinline__ float Max(float a, float b) { return a < b ? b : a; }  // std::max's choice

// tracking.cc IoU.
__device__ float IoU(const Box& a, const Box& b) {
  const float iw = __fsub_rn(Min(a.x2, b.x2), Max(a.x1, b.x1));
  const float ih = __fsub_rn(Min(a.y2, b.y2), Max(a.y1, b.y1));
  if (iw <= 0 || ih <= 0) return 0;
  const float inter = __fmul_rn(iw, ih);
  const float area_a = __fmul_rn(__fsub_rn(a.x2, a.x1), __fsub_rn(a.y2, a.y1));
  const float area_b = __fmul_rn(__fsub_rn(b.x2, b.x1), __fsub_rn(b.y2, b.y1));
  const float uni = __fsub_rn(__fadd_rn(area_a, area_b), inter);
  return uni > 0 ? __fdiv_rn(inter, uni) : 0;
}

__device__ __forceinline__ double Seconds(long long ns) { return __dmul_rn(static_cast<double>(ns), 1e-9); }

// A block's shared memory for frames of up to n tracks or detections.
struct Scratch {
  Box* pred;     // [n] predicted boxes of the tracks
  double* u;     // [n + 1] the assignment's potentials and slack (tracking.cc Assign)
  double* v;
  double* minv;
  int* p;        // [n + 1]
  int* way;
  int* rows;     // [n] stage two's tracks
  int* high;     // [n] stage one's detections (score >= high_score), in order
  int* low;      // [n] stage two's (low_score <= score < high_score)
  unsigned char* used;   // [n + 1]
  unsigned char* taken;  // [n] detections matched
};

__host__ __device__ size_t Align8(size_t b) { return (b + 7) & ~size_t{7}; }

__device__ Scratch Carve(unsigned char* base, int n) {
  Scratch s;
  const size_t n1 = static_cast<size_t>(n) + 1;
  unsigned char* at = base;
  s.pred = reinterpret_cast<Box*>(at);
  at += sizeof(Box) * static_cast<size_t>(n);
  s.u = reinterpret_cast<double*>(at);
  at += 8 * n1;
  s.v = reinterpret_cast<double*>(at);
  at += 8 * n1;
  s.minv = reinterpret_cast<double*>(at);
  at += 8 * n1;
  s.p = reinterpret_cast<int*>(at);
  at += Align8(4 * n1);
  s.way = reinterpret_cast<int*>(at);
  at += Align8(4 * n1);
  s.rows = reinterpret_cast<int*>(at);
  at += Align8(4 * static_cast<size_t>(n));
  s.high = reinterpret_cast<int*>(at);
  at += Align8(4 * static_cast<size_t>(n));
  s.low = reinterpret_cast<int*>(at);
  at += Align8(4 * static_cast<size_t>(n));
  s.used = at;
  at += Align8(n1);
  s.taken = at;
  return s;
}

__device__ __forceinline__ Box BoxOf(const DevDetection& d) { return {d.x1, d.y1, d.x2, d.y2}; }

// The unclamped cost of track t and detection d (tracking.cc stage: same class ? 1 − IoU : kNever).
__device__ __forceinline__ double RawCost(const Scratch& s, const DevTrack* tracks, int t, const DevDetection& d) {
  return d.class_id == tracks[t].class_id ? __dsub_rn(1.0, static_cast<double>(IoU(s.pred[t], BoxOf(d)))) : kNever;
}

// tracking.cc Assign over rows (tracks: row r is track row_track[r], or r when null) × cols (detections
// col_det[c]), the warp's lanes sharing each scan over the columns. The matches go to det_of_track and taken.
__device__ void Assign(const Scratch& s, int rows, const int* row_track, int cols, const int* col_det,
                       const DevTrack* tracks, const DevDetection* dets, double max_cost, int* det_of_track,
                       int lane) {
  const double inf = __longlong_as_double(0x7ff0000000000000LL);
  const int n = rows > cols ? rows : cols;
  auto cost = [&](int i, int j) -> double {  // 1-based, as Assign's c()
    if (i > rows || j > cols) return kNever;
    const double c = RawCost(s, tracks, row_track != nullptr ? row_track[i - 1] : i - 1, dets[col_det[j - 1]]);
    return c > max_cost ? kNever : c;
  };
  for (int j = lane; j <= n; j += 32) {
    s.u[j] = 0;
    s.v[j] = 0;
    s.p[j] = 0;
    s.way[j] = 0;
  }
  __syncwarp();
  for (int i = 1; i <= n; ++i) {
    for (int j = lane; j <= n; j += 32) {
      s.minv[j] = inf;
      s.used[j] = 0;
    }
    __syncwarp();
    if (lane == 0) s.p[0] = i;
    int j0 = 0;
    do {
      if (lane == 0) s.used[j0] = 1;
      __syncwarp();
      const int i0 = s.p[j0];
      const double ui0 = s.u[i0];
      double delta = inf;
      int j1 = 0;
      for (int j = 1 + lane; j <= n; j += 32) {  // each lane its columns in order: the first of its minima
        if (s.used[j]) continue;
        const double cur = __dsub_rn(__dsub_rn(cost(i0, j), ui0), s.v[j]);
        if (cur < s.minv[j]) {
          s.minv[j] = cur;
          s.way[j] = j0;
        }
        if (s.minv[j] < delta) {
          delta = s.minv[j];
          j1 = j;
        }
      }
      // The smallest slack, the smallest column among equals: the host's strict < over columns in order.
      for (int off = 16; off > 0; off >>= 1) {
        const double od = __shfl_xor_sync(kAll, delta, off);
        const int oj = __shfl_xor_sync(kAll, j1, off);
        if (od < delta || (od == delta && oj < j1)) {
          delta = od;
          j1 = oj;
        }
      }
      __syncwarp();
      for (int j = lane; j <= n; j += 32) {
        if (s.used[j]) {
          s.u[s.p[j]] = __dadd_rn(s.u[s.p[j]], delta);  // used columns have distinct rows
          s.v[j] = __dsub_rn(s.v[j], delta);
        } else {
          s.minv[j] = __dsub_rn(s.minv[j], delta);
        }
      }
      __syncwarp();
      j0 = j1;
    } while (s.p[j0] != 0);
    if (lane == 0) {
      do {
        const int j1 = s.way[j0];
        s.p[j0] = s.p[j1];
        j0 = j1;
      } while (j0 != 0);
    }
    __syncwarp();
  }
  for (int j = 1 + lane; j <= cols; j += 32) {
    const int i = s.p[j];
    if (i < 1 || i > rows) continue;
    const int t = row_track != nullptr ? row_track[i - 1] : i - 1;
    const int d = col_det[j - 1];
    if (RawCost(s, tracks, t, dets[d]) <= max_cost) {
      det_of_track[t] = d;
      s.taken[d] = 1;
    }
  }
  __syncwarp();
}

// Appends, in order, the indices below `count` for which pred(index) holds to list; returns how many.
template <typename Pred>
__device__ int Partition(int count, int* list, int lane, Pred pred) {
  const unsigned below = (1u << lane) - 1u;
  int got = 0;
  for (int base = 0; base < count; base += 32) {
    const int k = base + lane;
    const bool in = k < count && pred(k);
    const unsigned ballot = __ballot_sync(kAll, in);
    if (in) list[got + __popc(ballot & below)] = k;
    got += __popc(ballot);
  }
  __syncwarp();
  return got;
}

__global__ void __launch_bounds__(32) Associate(const WorkItem* items, const FrameIn* frames,
                                                const DevDetection* dets, const DevTrack* sync_tracks,
                                                DevTrack* slots, DevHeader* headers, DevOptions opt,
                                                int* out_status, int* out_tracks, int n) {
  extern __shared__ __align__(16) unsigned char shared[];
  const Scratch s = Carve(shared, n);
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned below = (1u << lane) - 1u;
  const WorkItem w = items[blockIdx.x];
  DevTrack* tracks = slots + static_cast<size_t>(w.slot) * static_cast<size_t>(opt.max_tracks);
  if (w.sync_first >= 0) {
    for (int i = lane; i < w.sync.nt; i += 32) tracks[i] = sync_tracks[w.sync_first + i];
  }
  DevHeader h = w.sync_first >= 0 ? w.sync : headers[w.slot];
  __syncwarp();
  bool stopped = false;
  for (int f = 0; f < w.frame_count; ++f) {
    const int fi = w.frame_first + f;
    if (stopped) {
      if (lane == 0) out_status[fi] = kStopped;
      continue;
    }
    const FrameIn fr = frames[fi];
    const DevDetection* d = dets + fr.det_first;
    const int nt = h.nt, nd = fr.nd;
    int* det_of_track = out_tracks + fr.out_first;
    // 1. Predict every track to the frame's time.
    for (int i = lane; i < nt; i += 32) {
      const DevTrack& t = tracks[i];
      const auto sec = static_cast<float>(Seconds(fr.time_ns - t.last_seen_ns));
      s.pred[i] = {__fadd_rn(t.x1, __fmul_rn(t.vx1, sec)), __fadd_rn(t.y1, __fmul_rn(t.vy1, sec)),
                   __fadd_rn(t.x2, __fmul_rn(t.vx2, sec)), __fadd_rn(t.y2, __fmul_rn(t.vy2, sec))};
      det_of_track[i] = -1;
    }
    for (int j = lane; j < nd; j += 32) s.taken[j] = 0;
    const int nh = Partition(nd, s.high, lane, [&](int j) { return d[j].score >= opt.high_score; });
    const int nl = Partition(nd, s.low, lane, [&](int j) {
      return !(d[j].score >= opt.high_score) && d[j].score >= opt.low_score;
    });
    // 2. Stage one: every track against the high-score detections.
    if (nt > 0 && nh > 0) Assign(s, nt, nullptr, nh, s.high, tracks, d, opt.max_cost_high, det_of_track, lane);
    // 3. Stage two: tracks seen in the previous frame and still unmatched against the low-score ones.
    const int nr = Partition(nt, s.rows, lane, [&](int i) {
      return det_of_track[i] < 0 && h.started != 0 && tracks[i].last_seen_seq == h.last_seq;
    });
    if (nr > 0 && nl > 0) Assign(s, nr, s.rows, nl, s.low, tracks, d, opt.max_cost_low, det_of_track, lane);
    // 4–5. The tracks' update (tracking.cc Update, after the association), compacted in place in order.
    int kept = 0;
    for (int base = 0; base < nt; base += 32) {
      const int i = base + lane;
      bool keep = false;
      DevTrack t{};
      if (i < nt) {
        t = tracks[i];
        const int j = det_of_track[i];
        if (j >= 0) {
          const DevDetection& dj = d[j];
          const double dt = Seconds(fr.time_ns - t.last_seen_ns);
          if (dt > 0) {
            const auto o1 = static_cast<float>(__ddiv_rn(static_cast<double>(__fsub_rn(dj.x1, t.x1)), dt));
            const auto o2 = static_cast<float>(__ddiv_rn(static_cast<double>(__fsub_rn(dj.y1, t.y1)), dt));
            const auto o3 = static_cast<float>(__ddiv_rn(static_cast<double>(__fsub_rn(dj.x2, t.x2)), dt));
            const auto o4 = static_cast<float>(__ddiv_rn(static_cast<double>(__fsub_rn(dj.y2, t.y2)), dt));
            const float b = t.hits == 1 ? 1.0f : opt.smoothing;
            const float nb = __fsub_rn(1.0f, b);
            t.vx1 = __fadd_rn(__fmul_rn(b, o1), __fmul_rn(nb, t.vx1));
            t.vy1 = __fadd_rn(__fmul_rn(b, o2), __fmul_rn(nb, t.vy1));
            t.vx2 = __fadd_rn(__fmul_rn(b, o3), __fmul_rn(nb, t.vx2));
            t.vy2 = __fadd_rn(__fmul_rn(b, o4), __fmul_rn(nb, t.vy2));
          }
          t.x1 = dj.x1;
          t.y1 = dj.y1;
          t.x2 = dj.x2;
          t.y2 = dj.y2;
          t.last_seen_ns = fr.time_ns;
          t.last_seen_seq = fr.seq;
          ++t.hits;
          if (t.state == 2 || (t.state == 0 && t.hits >= opt.min_hits)) t.state = 1;
          keep = true;
        } else if (t.state == 0) {
          keep = false;  // tentative and missed: gone
        } else if (Seconds(fr.time_ns - t.last_seen_ns) > opt.max_lost_s) {
          keep = false;  // lost too long: ended
        } else {
          t.state = 2;
          keep = true;
        }
      }
      const unsigned ballot = __ballot_sync(kAll, keep);  // every lane read its track before any writes
      if (keep) tracks[kept + __popc(ballot & below)] = t;
      kept += __popc(ballot);
      __syncwarp();
    }
    int born = 0;
    for (int base = 0; base < nd; base += 32) {
      const int j = base + lane;
      born += __popc(__ballot_sync(kAll, j < nd && !s.taken[j] && d[j].score >= opt.new_track_score));
    }
    if (kept + born > opt.max_tracks) {
      if (lane == 0) out_status[fi] = kTableFull;
      stopped = true;
      continue;
    }
    for (int base = 0; base < nd; base += 32) {
      const int j = base + lane;
      const bool nw = j < nd && !s.taken[j] && d[j].score >= opt.new_track_score;
      const unsigned ballot = __ballot_sync(kAll, nw);
      if (nw) {
        DevTrack t{};
        t.x1 = d[j].x1;
        t.y1 = d[j].y1;
        t.x2 = d[j].x2;
        t.y2 = d[j].y2;
        t.last_seen_ns = fr.time_ns;
        t.last_seen_seq = fr.seq;
        t.class_id = d[j].class_id;
        t.hits = 1;
        t.state = opt.min_hits <= 1 ? 1 : 0;
        tracks[kept + __popc(ballot & below)] = t;
      }
      kept += __popc(ballot);
    }
    h.nt = kept;
    h.started = 1;
    h.last_seq = fr.seq;
    h.last_ns = fr.time_ns;
    if (lane == 0) out_status[fi] = nt;
    __syncwarp();
  }
  if (lane == 0 && !stopped) headers[w.slot] = h;
}

}  // namespace

size_t SharedBytes(int n) {
  const size_t n0 = static_cast<size_t>(n), n1 = n0 + 1;
  return sizeof(Box) * n0 + 3 * 8 * n1 + 2 * Align8(4 * n1) + 3 * Align8(4 * n0) + Align8(n1) + n0;
}

cudaError_t AllowSharedBytes(size_t bytes) {
  return cudaFuncSetAttribute(Associate, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

cudaError_t LaunchAssociate(const WorkItem* items, int n_items, const FrameIn* frames, const DevDetection* dets,
                            const DevTrack* sync_tracks, DevTrack* slots, DevHeader* headers, DevOptions options,
                            int* out_status, int* out_tracks, int n, cudaStream_t stream) {
  if (n_items <= 0) return cudaSuccess;
  Associate<<<n_items, 32, SharedBytes(n), stream>>>(items, frames, dets, sync_tracks, slots, headers, options,
                                                     out_status, out_tracks, n);
  return cudaGetLastError();
}

}  // namespace vigil::aggregator::assoc
