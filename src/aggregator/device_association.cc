// aggregator/association.h: the device Associator (CUDA). Each stream's tracker state lives in a slot of device
// memory; a batch is one upload (the frames' detections, the states to copy in), one launch (a warp per stream,
// aggregator/cuda/association_kernels.cu) and one download (every frame's association).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <unordered_map>

#include "aggregator/cuda/association_kernels.h"
#include "vigil/common/cuda_status.h"
#include "vigil/aggregator/association.h"
#include "vigil/transport/protocol.h"

namespace vigil::aggregator {
namespace {

using assoc::DevDetection;
using assoc::DevHeader;
using assoc::DevOptions;
using assoc::DevTrack;
using assoc::FrameIn;
using assoc::WorkItem;
using cuda::CudaStatus;

size_t Align16(size_t b) { return (b + 15) & ~size_t{15}; }

bool SameOptions(const TrackerOptions& a, const TrackerOptions& b) {
  return a.high_score == b.high_score && a.low_score == b.low_score && a.new_track_score == b.new_track_score &&
         a.match_iou == b.match_iou && a.low_match_iou == b.low_match_iou && a.min_hits == b.min_hits &&
         a.max_lost_s == b.max_lost_s && a.velocity_smoothing == b.velocity_smoothing;
}

// A buffer pair that grows: pinned host memory and device memory of the same size.
struct Staging {
  char* host = nullptr;
  char* device = nullptr;
  size_t bytes = 0;
  Status Reserve(size_t want, const char* what) {
    if (want <= bytes) return absl::OkStatus();
    const size_t grown = std::max(want, bytes * 2);
    Free();
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&host), grown, cudaHostAllocDefault),
                                     StrCat("association: cudaHostAlloc ", grown, " bytes (", what, ")")));
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&device), grown),
                                     StrCat("association: cudaMalloc ", grown, " bytes (", what, ")")));
    bytes = grown;
    return absl::OkStatus();
  }
  void Free() {
    if (host != nullptr) cudaFreeHost(host);
    if (device != nullptr) cudaFree(device);
    host = device = nullptr;
    bytes = 0;
  }
};

class DeviceAssociator final : public Associator {
 public:
  ~DeviceAssociator() override {
    cudaSetDevice(o_.device);
    in_.Free();
    out_.Free();
    if (slots_ != nullptr) cudaFree(slots_);
    if (headers_ != nullptr) cudaFree(headers_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaGetLastError();
  }

  static StatusOr<std::unique_ptr<Associator>> Make(DeviceAssociatorOptions o) {
    if (o.max_streams < 1 || o.max_streams > 65536 || o.max_tracks < 1 || o.max_tracks > 4096 ||
        o.max_detections < 1 || o.max_detections > transport::kMaxDetections) {
      return absl::InvalidArgumentError(StrCat("association on cuda:", o.device, ": max_streams ", o.max_streams,
                                               ", max_tracks ", o.max_tracks, ", max_detections ", o.max_detections,
                                               ": need 1..65536, 1..4096, 1..", transport::kMaxDetections));
    }
    const std::string where = StrCat("cuda:", o.device);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || o.device < 0 || o.device >= count) {
      cudaGetLastError();
      return absl::UnavailableError(StrCat("association on ", where, ": no such GPU (", count, " visible)"));
    }
    auto a = std::unique_ptr<DeviceAssociator>(new DeviceAssociator(o));
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o.device), StrCat("association on ", where, ": cudaSetDevice")));
    int optin = 0;
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, o.device),
                                     "association: cudaDeviceGetAttribute"));
    const size_t need = assoc::SharedBytes(static_cast<int>(std::max(o.max_tracks, o.max_detections)));
    if (need > static_cast<size_t>(optin)) {
      return absl::InvalidArgumentError(
          StrCat("association on ", where, ": max_tracks ", o.max_tracks, " / max_detections ", o.max_detections,
                 " need ", need, " bytes of shared memory per block, the GPU gives ", optin,
                 " (lower the larger of the two)"));
    }
    VIGIL_RETURN_IF_ERROR(CudaStatus(assoc::AllowSharedBytes(need), "association: cudaFuncSetAttribute"));
    const size_t slot_bytes = sizeof(DevTrack) * o.max_tracks * o.max_streams;
    if (Status st = CudaStatus(cudaMalloc(reinterpret_cast<void**>(&a->slots_), slot_bytes),
                               StrCat("association on ", where, ": cudaMalloc ", slot_bytes, " bytes"));
        !st.ok()) {
      return absl::UnavailableError(st.message());
    }
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&a->headers_), sizeof(DevHeader) * o.max_streams),
                                     "association: cudaMalloc headers"));
    VIGIL_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&a->stream_, cudaStreamNonBlocking),
                                     "association: cudaStreamCreate"));
    for (uint32_t s = 0; s < o.max_streams; ++s) a->free_.push_back(static_cast<int>(s));
    return std::unique_ptr<Associator>(std::move(a));
  }

  StatusOr<std::vector<Association>> Associate(std::span<const AssociationFrame> frames) override {
    std::vector<Association> out(frames.size());
    if (frames.empty()) return out;
    ++batch_;
    // The batch's streams, in order of their first frame.
    struct Group {
      uint64_t stream;
      const Tracker* tracker;
      std::vector<size_t> frames;  // indices into `frames`, in order
      size_t sent = 0;             // the first `sent` go to the device
      Slot* slot = nullptr;
      bool sync = false;
    };
    std::vector<Group> groups;
    std::unordered_map<uint64_t, size_t> group_of;
    for (size_t f = 0; f < frames.size(); ++f) {
      auto [it, fresh] = group_of.try_emplace(frames[f].stream, groups.size());
      if (fresh) groups.push_back({frames[f].stream, frames[f].tracker, {}});
      groups[it->second].frames.push_back(f);
    }
    const TrackerOptions& topt = groups.front().tracker->options();
    auto decline_from = [&](Group& g, size_t k, const std::string& why) {
      for (size_t m = k; m < g.frames.size(); ++m) {
        out[g.frames[m]].why = m == k ? why : "an earlier frame of the stream was not associated here";
      }
      g.sent = std::min(g.sent, k);
    };
    size_t placed = 0;
    for (Group& g : groups) {
      g.sent = g.frames.size();
      const size_t nt = g.tracker->tracks().size();
      if (!SameOptions(g.tracker->options(), topt)) {
        decline_from(g, 0, "tracker options differ from the batch's first stream");
      } else if (nt > o_.max_tracks) {
        decline_from(g, 0, StrCat("table of ", nt, " tracks, over max_tracks ", o_.max_tracks));
      }
      for (size_t k = 0; k < g.sent; ++k) {
        const size_t nd = frames[g.frames[k]].detections.size();
        if (nd > o_.max_detections) {
          decline_from(g, k, StrCat(nd, " detections, over max_detections ", o_.max_detections));
        }
      }
      if (g.sent == 0) continue;
      if (placed == o_.max_streams) {
        decline_from(g, 0, StrCat("more than max_streams ", o_.max_streams, " streams in one batch"));
        continue;
      }
      ++placed;
      g.slot = SlotFor(g.stream);
      g.sync = g.slot->id == 0 || g.slot->id != g.tracker->state_id();
    }
    // The upload: work items, frames, detections, states to copy in.
    size_t n_items = 0, n_frames = 0, n_dets = 0, n_sync = 0, n_out = 0;
    int n = 1;
    for (const Group& g : groups) {
      if (g.sent == 0) continue;
      ++n_items;
      n_frames += g.sent;
      if (g.sync) n_sync += g.tracker->tracks().size();
      size_t bound = g.tracker->tracks().size();
      for (size_t k = 0; k < g.sent; ++k) {
        const size_t nd = frames[g.frames[k]].detections.size();
        n_dets += nd;
        n_out += bound;
        n = std::max({n, static_cast<int>(bound), static_cast<int>(nd)});
        bound = std::min<size_t>(o_.max_tracks, bound + nd);
      }
    }
    if (n_items == 0) {
      for (Association& a : out) stats_.declined += a.ok ? 0 : 1;
      ++stats_.batches;
      return out;
    }
    const size_t off_frames = Align16(sizeof(WorkItem) * n_items);
    const size_t off_dets = off_frames + Align16(sizeof(FrameIn) * n_frames);
    const size_t off_sync = off_dets + Align16(sizeof(DevDetection) * n_dets);
    const size_t in_bytes = off_sync + Align16(sizeof(DevTrack) * n_sync);
    const size_t off_tracks = Align16(sizeof(int) * n_frames);
    const size_t out_bytes = off_tracks + sizeof(int) * std::max<size_t>(n_out, 1);
    VIGIL_RETURN_IF_ERROR(Fail(CudaStatus(cudaSetDevice(o_.device), "association: cudaSetDevice")));
    VIGIL_RETURN_IF_ERROR(Fail(in_.Reserve(in_bytes, "upload")));
    VIGIL_RETURN_IF_ERROR(Fail(out_.Reserve(out_bytes, "download")));
    auto* items = reinterpret_cast<WorkItem*>(in_.host);
    auto* fins = reinterpret_cast<FrameIn*>(in_.host + off_frames);
    auto* dets = reinterpret_cast<DevDetection*>(in_.host + off_dets);
    auto* sync = reinterpret_cast<DevTrack*>(in_.host + off_sync);
    struct Sent {
      size_t frame;  // index into `frames`
      int out_first;
    };
    std::vector<Sent> sent;
    sent.reserve(n_frames);
    int item = 0, fi = 0, di = 0, si = 0, oi = 0;
    for (const Group& g : groups) {
      if (g.sent == 0) continue;
      WorkItem& w = items[item++];
      w = {};
      w.slot = g.slot->index;
      w.frame_first = fi;
      w.frame_count = static_cast<int>(g.sent);
      w.sync_first = -1;
      const Tracker& tr = *g.tracker;
      if (g.sync) {
        w.sync_first = si;
        w.sync = {static_cast<int>(tr.tracks().size()), tr.started() ? 1 : 0, tr.last_seq(), tr.last_ns()};
        for (size_t i = 0; i < tr.tracks().size(); ++i) {
          const Track& t = tr.tracks()[i];
          const TrackBox& v = tr.velocities()[i];
          DevTrack& d = sync[si++];
          d = {};
          d.x1 = t.box.x1, d.y1 = t.box.y1, d.x2 = t.box.x2, d.y2 = t.box.y2;
          d.vx1 = v.x1, d.vy1 = v.y1, d.vx2 = v.x2, d.vy2 = v.y2;
          d.last_seen_ns = t.last_seen_ns;
          d.last_seen_seq = t.last_seen_seq;
          d.class_id = t.class_id;
          d.hits = t.hits;
          d.state = static_cast<int>(t.state);
        }
        ++stats_.copied_in;
      }
      size_t bound = tr.tracks().size();
      for (size_t k = 0; k < g.sent; ++k) {
        const AssociationFrame& fr = frames[g.frames[k]];
        FrameIn& in = fins[fi++];
        in = {};
        in.seq = fr.seq;
        in.time_ns = fr.time_ns;
        in.det_first = di;
        in.nd = static_cast<int>(fr.detections.size());
        in.out_first = oi;
        for (const TrackInput& t : fr.detections) {
          dets[di++] = {t.box.x1, t.box.y1, t.box.x2, t.box.y2, t.score, t.class_id};
        }
        sent.push_back({g.frames[k], oi});
        oi += static_cast<int>(bound);
        bound = std::min<size_t>(o_.max_tracks, bound + fr.detections.size());
      }
    }
    DevOptions opt{};
    opt.high_score = topt.high_score;
    opt.low_score = topt.low_score;
    opt.new_track_score = topt.new_track_score;
    opt.max_cost_high = 1.0 - topt.match_iou;
    opt.max_cost_low = 1.0 - topt.low_match_iou;
    opt.min_hits = static_cast<unsigned>(topt.min_hits);
    opt.max_lost_s = topt.max_lost_s;
    opt.smoothing = static_cast<float>(topt.velocity_smoothing);
    opt.max_tracks = static_cast<int>(o_.max_tracks);
    for (const Group& g : groups) {
      if (g.slot != nullptr) g.slot->id = 0;  // from here the slot holds the batch's outcome, named by Advanced
    }
    VIGIL_RETURN_IF_ERROR(Fail(CudaStatus(cudaMemcpyAsync(in_.device, in_.host, in_bytes, cudaMemcpyHostToDevice, stream_),
                                          "association: cudaMemcpyAsync (upload)")));
    VIGIL_RETURN_IF_ERROR(Fail(CudaStatus(
        assoc::LaunchAssociate(reinterpret_cast<const WorkItem*>(in_.device), static_cast<int>(n_items),
                               reinterpret_cast<const FrameIn*>(in_.device + off_frames),
                               reinterpret_cast<const DevDetection*>(in_.device + off_dets),
                               reinterpret_cast<const DevTrack*>(in_.device + off_sync), slots_, headers_, opt,
                               reinterpret_cast<int*>(out_.device), reinterpret_cast<int*>(out_.device + off_tracks),
                               n, stream_),
        "association: kernel launch")));
    VIGIL_RETURN_IF_ERROR(Fail(CudaStatus(
        cudaMemcpyAsync(out_.host, out_.device, out_bytes, cudaMemcpyDeviceToHost, stream_),
        "association: cudaMemcpyAsync (download)")));
    VIGIL_RETURN_IF_ERROR(Fail(CudaStatus(cudaStreamSynchronize(stream_), "association: the batch")));
    const auto* status = reinterpret_cast<const int*>(out_.host);
    const auto* assigned = reinterpret_cast<const int*>(out_.host + off_tracks);
    for (size_t k = 0; k < sent.size(); ++k) {
      Association& a = out[sent[k].frame];
      const int st = status[k];
      if (st >= 0) {
        a.ok = true;
        a.det_of_track.assign(assigned + sent[k].out_first, assigned + sent[k].out_first + st);
      } else if (st == assoc::kTableFull) {
        a.why = StrCat("the table would outgrow max_tracks ", o_.max_tracks);
      } else {
        a.why = "an earlier frame of the stream was not associated here";
      }
    }
    for (Group& g : groups) {
      if (g.slot == nullptr) continue;
      g.slot->complete = true;
      for (size_t f : g.frames) g.slot->complete = g.slot->complete && out[f].ok;
    }
    for (const Association& a : out) ++(a.ok ? stats_.frames : stats_.declined);
    ++stats_.batches;
    return out;
  }

  void Advanced(uint64_t stream, uint64_t state_id) override {
    auto it = slot_of_.find(stream);
    if (it != slot_of_.end() && it->second->complete) it->second->id = state_id;
  }
  void Forget(uint64_t stream) override {
    auto it = slot_of_.find(stream);
    if (it == slot_of_.end()) return;
    free_.push_back(it->second->index);
    lru_.erase(it->second);
    slot_of_.erase(it);
  }
  std::string where() const override { return StrCat("cuda:", o_.device); }
  AssociatorStats stats() const override { return stats_; }

 private:
  struct Slot {
    uint64_t stream;
    int index;          // into the device's slots
    uint64_t id = 0;    // the state id of the tracker it equals; 0: none (copy in before use)
    bool complete = false;  // every frame of its last batch associated (Advanced may name it)
    uint64_t batch = 0;     // the last batch it was used in
  };
  explicit DeviceAssociator(DeviceAssociatorOptions o) : o_(o) {}

  // The stream's slot, most recently used first in lru_; a free one, or the least recently used of another stream
  // (its state is copied in again when it comes back). The caller places at most max_streams streams a batch.
  Slot* SlotFor(uint64_t stream) {
    auto it = slot_of_.find(stream);
    if (it != slot_of_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      it->second->batch = batch_;
      return &*it->second;
    }
    int index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      Slot& victim = lru_.back();  // not of this batch: at most max_streams are placed and each moves to the front
      index = victim.index;
      slot_of_.erase(victim.stream);
      lru_.pop_back();
    }
    lru_.push_front({stream, index, 0, false, batch_});
    slot_of_[stream] = lru_.begin();
    return &lru_.front();
  }

  Status Fail(Status st) {
    if (!st.ok()) {
      ++stats_.failures;
      for (Slot& s : lru_) {  // the device's state is not known now
        s.id = 0;
        s.complete = false;
      }
    }
    return st;
  }

  DeviceAssociatorOptions o_;
  cudaStream_t stream_ = nullptr;
  DevTrack* slots_ = nullptr;
  DevHeader* headers_ = nullptr;
  Staging in_, out_;
  std::list<Slot> lru_;
  std::unordered_map<uint64_t, std::list<Slot>::iterator> slot_of_;
  std::vector<int> free_;
  uint64_t batch_ = 0;
  AssociatorStats stats_;
};

}  // namespace

StatusOr<std::unique_ptr<Associator>> MakeDeviceAssociator(DeviceAssociatorOptions options) {
  return DeviceAssociator::Make(options);
}

}  // namespace vigil::aggregator
