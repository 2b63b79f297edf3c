#include "vigil/pipeline/picture_mirror.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "vigil/transport/device_memory.h"
#include "vigil/video/jpeg.h"

namespace vigil::pipeline {

video::Frame FrameOfGpu(const replication::MirroredFrame& m) {
  video::Frame frame;
  frame.width = static_cast<int>(m.width);
  frame.height = static_cast<int>(m.height);
  const std::shared_ptr<const replication::MirroredGpuPicture> pic = m.gpu;
  video::DeviceFrame d;
  d.device = pic->device;
  d.y = pic->data;
  d.uv = pic->data + static_cast<size_t>(m.width) * m.height;
  d.y_pitch = static_cast<int>(m.width);
  d.uv_pitch = static_cast<int>(2 * ((m.width + 1) / 2));
  d.matrix = static_cast<video::YuvMatrix>(pic->matrix);
  d.full_range = pic->full_range;
  d.keepalive = std::const_pointer_cast<replication::MirroredGpuPicture>(pic);
  d.copy_to_host = [pic](uint8_t* dst) {
    return transport::device_memory::CopyToHost(dst, pic->data, pic->bytes, pic->device);
  };
  frame.device = std::move(d);
  return frame;
}

video::Frame FrameOfRaw(const replication::MirroredFrame& m) {
  video::Frame frame;
  frame.width = static_cast<int>(m.width);
  frame.height = static_cast<int>(m.height);
  frame.stride = static_cast<int>(m.width) * 3;
  frame.bgr.resize(static_cast<size_t>(frame.stride) * m.height);
  for (uint32_t y = 0; y < m.height; ++y) {
    std::memcpy(frame.bgr.data() + static_cast<size_t>(y) * frame.stride, m.bgr.data() + size_t{y} * m.stride,
                static_cast<size_t>(frame.stride));
  }
  return frame;
}

namespace {

// `f`'s identity and times as a MirroredFrame of `stream` (pixels, run and seq left to the caller).
replication::MirroredFrame MirroredOf(const std::string& stream, const video::Frame& f) {
  replication::MirroredFrame m;
  m.stream = stream;
  m.capture_ns = f.capture_time_ns;
  m.pts_ns = f.pts_ns;
  m.width = static_cast<uint32_t>(f.width);
  m.height = static_cast<uint32_t>(f.height);
  return m;
}

void ObserveSince(MirrorShared& shared, int64_t t0) {
  if (shared.stage != nullptr) shared.stage->Observe(static_cast<double>(shared.clock->SteadyNs() - t0) * 1e-9);
}

}  // namespace

// ---- RingMirror ----

bool RingMirror::Prepare(size_t i, const video::Frame& f, Prepared* out) {
  MirrorShared::Stream& s = shared_.streams[i];
  replication::FramePublisher* ring = shared_.ring.load();
  if (ring == nullptr || !ring->active()) return false;
  // A picture larger than the standby's slots goes over the channel as a JPEG (said once per stream).
  const bool nv12 = f.device && ring->in_gpu_memory();
  const size_t w = static_cast<size_t>(f.width), h = static_cast<size_t>(f.height);
  const size_t need = nv12 ? replication::PackedNv12Bytes(w, h) : w * h * 3;
  const size_t room = ring->slot_capacity();
  if (room == 0) return false;  // the ring went away since active(): the channel's way takes the picture
  if (need > room) {
    if (!s.ring_size_logged.exchange(true)) {
      spdlog::error("stream '{}': its {}x{} pictures ({} bytes) do not fit the standby's ring slots ({} bytes: raise "
                    "replication.mirror_slot_mb on the standby to at least {}); they go over the channel as JPEGs",
                    s.id, w, h, need, room, (need + 4096 + (1u << 20) - 1) >> 20);
    }
    return false;
  }
  out->picture = MirroredOf(s.id, f);
  if (!f.device || nv12) {  // a host picture, or a GPU picture into a GPU ring: device to device
    out->raw = &f;
    return true;
  }
  out->downloaded = f;  // shares the GPU picture; the download fills a host copy
  if (Status st = video::DownloadBgr(out->downloaded); !st.ok()) {
    s.skipped->Inc();
    if (!s.error_logged.exchange(true)) {
      spdlog::error("stream '{}': a picture cannot be mirrored to the standby: {}", s.id, std::string(st.message()));
    }
    return false;  // the channel's way tries (and counts) it
  }
  out->raw = &out->downloaded;
  return true;
}

void RingMirror::Hand(size_t i, Prepared& p) {
  const video::Frame& raw = *p.raw;
  p.picture.width = static_cast<uint32_t>(raw.width);
  p.picture.height = static_cast<uint32_t>(raw.height);
  Write(i, p.picture, raw.bgr.data(), static_cast<size_t>(raw.stride), raw.device ? &*raw.device : nullptr);
}

bool RingMirror::HandKept(size_t i, const replication::MirroredFrame& m) {
  replication::FramePublisher* ring = shared_.ring.load();
  if (ring == nullptr || !ring->active() || !(!m.bgr.empty() || (m.gpu && ring->in_gpu_memory()))) return false;
  const video::Frame g = m.gpu ? FrameOfGpu(m) : video::Frame{};
  MutexLock lock(shared_.order);
  Write(i, m, m.bgr.data(), m.stride, m.gpu ? &*g.device : nullptr);
  return true;
}

void RingMirror::Write(size_t i, const replication::MirroredFrame& m, const uint8_t* bgr, size_t stride,
                       const video::DeviceFrame* device) {
  MirrorShared::Stream& s = shared_.streams[i];
  replication::FramePublisher* ring = shared_.ring.load();
  const int64_t t0 = shared_.clock->SteadyNs();
  Status st;
  double bytes = static_cast<double>(stride) * m.height;
  if (ring == nullptr) {
    st = absl::UnavailableError("no picture ring");
  } else if (device != nullptr) {
    replication::FramePublisher::DevicePicture p;
    p.device = device->device;
    p.y = device->y;
    p.uv = device->uv;
    p.y_pitch = static_cast<size_t>(device->y_pitch);
    p.uv_pitch = static_cast<size_t>(device->uv_pitch);
    p.matrix = static_cast<int>(device->matrix);
    p.full_range = device->full_range;
    st = ring->WriteDevice(m, p);
    bytes = static_cast<double>(m.width) * m.height * 1.5;
  } else {
    st = ring->Write(m, bgr, stride);
  }
  ObserveSince(shared_, t0);
  if (st.ok()) {
    s.mirrored->Inc();
    s.mirrored_bytes->Inc(bytes);
    return;
  }
  // Not mirrored (counted): a standby behind (every slot unread), gone, or a picture larger than its slots. A
  // takeover reports such a seq lost if the aggregator never stored it.
  s.skipped->Inc();
  // A full ring (the standby behind) and a session that ended (the ring's own log says so) are not this stream's
  // errors; a picture that does not fit, or a failed copy, is — logged once per stream.
  if (!absl::IsResourceExhausted(st) && !absl::IsUnavailable(st) && !s.error_logged.exchange(true)) {
    spdlog::error("stream '{}': a picture is not mirrored to the standby's ring: {}", s.id, std::string(st.message()));
  }
}

// ---- ChannelMirror ----

bool ChannelMirror::Prepare(size_t i, const video::Frame& f, Prepared* out) {
  MirrorShared::Stream& s = shared_.streams[i];
  replication::PrimaryChannel* ch = shared_.channel.load();
  if (ch == nullptr) return false;
  // Only while a standby is paired. Encoding every picture for one that may pair later cost a primary left
  // alone (its standby killed and restarting) a download and a JPEG encode per 1080p picture, ~15 ms of CPU:
  // at 32 cameras the whole machine, its inference starved for seconds (H200 run of issue 17). Unpaired, the
  // reader keeps the picture raw instead (UnpairedKeep); a standby that pairs gets those still unstored within a
  // Periodic (the flush): a kill in that ~100 ms reports their seqs lost.
  if (!ch->stats().standby_connected) return false;
  const int64_t t0 = shared_.clock->SteadyNs();
  StatusOr<std::string> jpeg = absl::InternalError("not encoded");
  if (f.device) {
    video::Frame host = f;  // shares the GPU picture; the download fills a host copy
    Status st = video::DownloadBgr(host);
    jpeg = st.ok() ? video::EncodeJpeg(host, shared_.config.jpeg_quality) : StatusOr<std::string>(st);
  } else {
    jpeg = video::EncodeJpeg(f, shared_.config.jpeg_quality);
  }
  if (!jpeg.ok()) {
    s.skipped->Inc();
    if (!s.error_logged.exchange(true)) {
      spdlog::error("stream '{}': a picture cannot be mirrored to the standby: {}", s.id,
                    std::string(jpeg.status().message()));
    }
    return false;
  }
  ObserveSince(shared_, t0);
  out->picture = MirroredOf(s.id, f);
  out->picture.jpeg = std::move(*jpeg);
  return true;
}

void ChannelMirror::Hand(size_t i, Prepared& p) {
  MirrorShared::Stream& s = shared_.streams[i];
  replication::PrimaryChannel* ch = shared_.channel.load();
  const double bytes = static_cast<double>(p.picture.jpeg.size());
  if (ch != nullptr && ch->MirrorFrame(std::move(p.picture))) {
    s.mirrored->Inc();
    s.mirrored_bytes->Inc(bytes);
  } else {
    s.skipped->Inc();  // larger than the channel carries
  }
}

bool ChannelMirror::HandKept(size_t i, const replication::MirroredFrame& m) {
  MirrorShared::Stream& s = shared_.streams[i];
  replication::PrimaryChannel* ch = shared_.channel.load();
  if (ch == nullptr || !ch->stats().standby_connected) return false;  // gone again: kept for the next one
  replication::MirroredFrame jpeg;
  if (m.jpeg.empty()) {  // a raw picture and no ring (or a host one) mapped now: the channel carries JPEGs
    video::Frame host = m.gpu ? FrameOfGpu(m) : FrameOfRaw(m);
    Status down = video::DownloadBgr(host);
    StatusOr<std::string> encoded = !down.ok()                ? StatusOr<std::string>(down)
                                    : video::JpegAvailable() ? video::EncodeJpeg(host, shared_.config.jpeg_quality)
                                                             : StatusOr<std::string>(absl::UnimplementedError("no libturbojpeg"));
    if (encoded.ok()) {
      jpeg = m;
      jpeg.bgr = {};
      jpeg.gpu.reset();
      jpeg.stride = 0;
      jpeg.jpeg = std::move(*encoded);
    }
  }
  const replication::MirroredFrame& out = m.jpeg.empty() ? jpeg : m;
  MutexLock lock(shared_.order);
  if (!out.jpeg.empty() && ch->MirrorFrame(out)) {
    s.mirrored->Inc();
    s.mirrored_bytes->Inc(static_cast<double>(out.jpeg.size()));
  } else {
    s.skipped->Inc();
  }
  return true;
}

void ChannelMirror::Stored(const std::string& id, uint64_t run, uint64_t through) {
  if (replication::PrimaryChannel* ch = shared_.channel.load()) ch->Acknowledge(id, run, through);
}

// ---- UnpairedKeep ----

bool UnpairedKeep::Prepare(size_t i, const video::Frame& f, Prepared* out) {
  MirrorShared::Stream& s = shared_.streams[i];
  replication::PrimaryChannel* ch = shared_.channel.load();
  if (ch == nullptr || ch->stats().standby_connected) return false;
  replication::MirroredFrame& m = out->picture;
  m = MirroredOf(s.id, f);
  const size_t w = m.width, h = m.height;
  const int64_t t0 = shared_.clock->SteadyNs();
  Status st;
  if (f.device) {
    const video::DeviceFrame& d = *f.device;
    const size_t bytes = replication::PackedNv12Bytes(w, h), uv_row = 2 * ((w + 1) / 2);
    StatusOr<std::unique_ptr<transport::device_memory::Buffer>> buf =
        transport::device_memory::AllocatePooled(d.device, bytes);
    st = buf.status();
    if (st.ok()) {
      uint8_t* dst = static_cast<uint8_t*>((*buf)->data());
      st = transport::device_memory::Copy2D(dst, w, d.y, static_cast<size_t>(d.y_pitch), w, h, d.device);
      if (st.ok()) {
        st = transport::device_memory::Copy2D(dst + w * h, uv_row, d.uv, static_cast<size_t>(d.uv_pitch), uv_row,
                                              (h + 1) / 2, d.device);
      }
    }
    if (st.ok()) {
      auto pic = std::make_shared<replication::MirroredGpuPicture>();
      pic->device = d.device;
      pic->data = static_cast<const uint8_t*>((*buf)->data());
      pic->bytes = bytes;
      pic->matrix = static_cast<int>(d.matrix);
      pic->full_range = d.full_range;
      pic->owner = std::shared_ptr<transport::device_memory::Buffer>(std::move(*buf));
      m.gpu = std::move(pic);
    }
  } else {
    m.stride = static_cast<uint32_t>(w * 3);
    m.bgr.resize(size_t{m.stride} * h);
    for (size_t y = 0; y < h; ++y) {
      std::memcpy(m.bgr.data() + y * m.stride, f.bgr.data() + y * static_cast<size_t>(f.stride), m.stride);
    }
  }
  ObserveSince(shared_, t0);  // this primary's mirroring cost now
  if (st.ok()) return true;
  s.skipped->Inc();
  if (!s.error_logged.exchange(true)) {
    spdlog::error("stream '{}': a picture cannot be kept for a standby: {}", s.id, std::string(st.message()));
  }
  return false;  // numbered without a picture kept
}

void UnpairedKeep::Hand(size_t i, Prepared& p) {
  const size_t room = static_cast<size_t>(std::max(1, shared_.config.mirror_window));
  MutexLock lock(mu_);
  if (kept_.size() <= i) kept_.resize(shared_.streams.size());
  std::deque<replication::MirroredFrame>& kept = kept_[i];
  kept.push_back(std::move(p.picture));
  while (kept.size() > room) {
    kept.pop_front();
    shared_.streams[i].unpaired_evicted->Inc();
  }
}

bool UnpairedKeep::HandKept(size_t i, const replication::MirroredFrame& m) {
  Keep(i, m);  // no standby to take it after all: kept for the next one
  return true;
}

void UnpairedKeep::Keep(size_t i, replication::MirroredFrame m) {
  MutexLock lock(mu_);
  if (kept_.size() <= i) kept_.resize(shared_.streams.size());
  kept_[i].push_back(std::move(m));
}

void UnpairedKeep::Stored(const std::string& id, uint64_t run, uint64_t through) {
  MutexLock lock(mu_);
  for (size_t i = 0; i < kept_.size(); ++i) {
    if (shared_.streams[i].id != id) continue;
    std::erase_if(kept_[i], [&](const replication::MirroredFrame& m) {
      return m.run < run || (m.run == run && m.seq <= through);
    });
  }
}

std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> UnpairedKeep::TakeAll() {
  std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> out;
  MutexLock lock(mu_);
  for (size_t i = 0; i < kept_.size(); ++i) {
    if (!kept_[i].empty()) out.emplace_back(i, std::exchange(kept_[i], {}));
  }
  return out;
}

size_t UnpairedKeep::kept(size_t i) const {
  MutexLock lock(mu_);
  return i < kept_.size() ? kept_[i].size() : 0;
}

// ---- PrimaryMirror ----

PrimaryMirror::PrimaryMirror(PrimaryMirrorOptions options)
    : reg_(*options.registry), stopping_(std::move(options.stopping)) {
  shared_.config = std::move(options.config);
  shared_.clock = options.clock != nullptr ? options.clock : SystemClock();
  shared_.stage = &reg_.GetHistogram("vigil_edge_stage_seconds", "Edge latency per pipeline stage, seconds",
                                     metrics::LatencyBuckets(), {{"stage", "mirror"}});
}

PrimaryMirror::~PrimaryMirror() { Join(); }

size_t PrimaryMirror::AddStream(const std::string& id) {
  const metrics::Labels labels{{"stream", id}};
  MirrorShared::Stream& s = shared_.streams.emplace_back();
  s.id = id;
  s.mirrored = &reg_.GetCounter("vigil_edge_mirror_frames_total",
                                "Live pictures mirrored for the standby (replication.mirror_frames): as JPEG on the channel "
                                "(sent to a paired one, kept until acknowledged for one that pairs later), or raw into a "
                                "same-host standby's ring (mirror_via shm)",
                                labels);
  s.mirrored_bytes = &reg_.GetCounter("vigil_edge_mirror_bytes_total",
                                      "Bytes of the live pictures mirrored: JPEG, or raw pixels into the ring", labels);
  s.skipped = &reg_.GetCounter(
      "vigil_edge_mirror_frames_skipped_total",
      "Live pictures not mirrored: the picture did not encode, its JPEG is larger than the channel carries, or the "
      "standby's ring had no free slot or too small a slot",
      labels);
  s.unpaired_evicted = &reg_.GetCounter(
      "vigil_edge_mirror_unpaired_evicted_total",
      "Live pictures kept raw while no standby was paired, dropped for room (mirror_window) before they were stored",
      labels);
  s.results_mirrored = &reg_.GetCounter("vigil_edge_mirror_results_total",
                                        "Processed live pictures whose detections were handed to the replication channel "
                                        "(replication.mirror_results; kept until stored, for a standby)",
                                        labels);
  MutexLock lock(stored_mu_);
  stored_.resize(shared_.streams.size());
  return shared_.streams.size() - 1;
}

bool PrimaryMirror::Number(size_t i, bool live, uint64_t run, video::Frame& f,
                           absl::FunctionRef<bool(uint64_t*)> number) {
  PictureMirror::Prepared p;
  PictureMirror* way = nullptr;
  if (live && shared_.config.mirror_frames) {
    for (PictureMirror* w : ways_) {
      if (w->Prepare(i, f, &p)) {
        way = w;
        break;
      }
    }
  }
  uint64_t seq = 0;
  if (way != nullptr) {
    // Numbered and handed over under the order lock, which the ledger's mirrored states also take: no state that
    // counts this seq reaches the standby before its picture.
    MutexLock lock(shared_.order);
    if (!number(&seq)) return false;
    p.picture.run = run;
    p.picture.seq = seq;
    way->Hand(i, p);
  } else if (!number(&seq)) {
    return false;
  }
  f.seq = seq;
  f.run = run;
  return true;
}

void PrimaryMirror::MirrorResult(size_t i, bool live, uint64_t run, const FrameInfo& info,
                                 std::span<const detect::Detection> dets) {
  replication::PrimaryChannel* ch = shared_.channel.load();
  if (ch == nullptr || !live || !shared_.config.mirror_results) return;
  MirrorShared::Stream& s = shared_.streams[i];
  replication::MirroredResult m{s.id, run, info.seq, info.capture_ns, info.pts_ns, info.width, info.height, {}};
  m.detections.reserve(dets.size());
  for (const detect::Detection& d : dets) m.detections.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
  if (ch->MirrorResult(std::move(m))) s.results_mirrored->Inc();
}

void PrimaryMirror::KeepTakenOver(size_t i, const std::vector<replication::MirroredFrame>& frames) {
  if (frames.empty() || shared_.channel.load() == nullptr || !shared_.config.mirror_frames) return;
  for (const replication::MirroredFrame& m : frames) {
    if (m.has_picture()) keep_.Keep(i, m);
  }
}

void PrimaryMirror::Stored(const std::string& id, uint64_t run, uint64_t through) {
  if (!shared_.config.mirror_frames) return;
  {
    MutexLock lock(stored_mu_);
    for (size_t i = 0; i < stored_.size(); ++i) {
      if (shared_.streams[i].id != id) continue;
      if (!stored_[i] || *stored_[i] < std::make_pair(run, through)) stored_[i] = std::make_pair(run, through);
    }
  }
  for (PictureMirror* w : ways_) w->Stored(id, run, through);
}

bool PrimaryMirror::IsStored(size_t i, const replication::MirroredFrame& m) const {
  MutexLock lock(stored_mu_);
  return i < stored_.size() && stored_[i] && std::make_pair(m.run, m.seq) <= *stored_[i];
}

void PrimaryMirror::FlushKept(std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> kept) {
  for (const auto& [i, frames] : kept) {
    for (const replication::MirroredFrame& m : frames) {
      if ((stopping_ && stopping_()) || shared_.channel.load() == nullptr) return;
      if (IsStored(i, m)) continue;
      for (PictureMirror* w : ways_) {
        if (w->HandKept(i, m)) break;
      }
    }
  }
}

void PrimaryMirror::Periodic() {
  // A standby paired: the pictures kept while there was none go to it (one flush at a time).
  if (replication::PrimaryChannel* ch = shared_.channel.load(); ch != nullptr && shared_.config.mirror_frames &&
                                                                  !flush_running_.load() &&
                                                                  ch->stats().standby_connected) {
    std::vector<std::pair<size_t, std::deque<replication::MirroredFrame>>> kept = keep_.TakeAll();
    if (!kept.empty()) {
      if (flush_.joinable()) flush_.join();  // the last flush: done (flush_running_)
      flush_running_ = true;
      flush_ = std::thread([this, kept = std::move(kept)]() mutable {
        FlushKept(std::move(kept));
        flush_running_ = false;
      });
    }
  }
  if (replication::FramePublisher* ring = shared_.ring.load()) {
    const replication::FramePublisherStats fs = ring->stats();
    reg_.GetGauge("vigil_edge_mirror_ring_mapped", "1 while a same-host standby's picture ring is mapped (mirror_via shm)")
        .Set(fs.active ? 1 : 0);
    metrics::Counter& sessions =
        reg_.GetCounter("vigil_edge_mirror_ring_sessions_total", "Standby picture rings mapped (authenticated standbys)");
    sessions.Inc(static_cast<double>(fs.sessions - std::exchange(ring_sessions_seen_, fs.sessions)));
    metrics::Counter& refused = reg_.GetCounter("vigil_edge_mirror_ring_refused_total",
                                                "Connections to the picture ring's socket refused (token, uid, ring)");
    refused.Inc(static_cast<double>(fs.refused - std::exchange(ring_refused_seen_, fs.refused)));
  }
  if (replication::PrimaryChannel* ch = shared_.channel.load(); ch != nullptr && shared_.config.mirror_frames) {
    // The mirrored pictures the channel keeps for a standby until the aggregator acknowledges them.
    const replication::PrimaryChannelStats cs = ch->stats();
    reg_.GetGauge("vigil_edge_mirror_retained_frames", "Mirrored pictures kept for the standby, not yet acknowledged")
        .Set(static_cast<double>(cs.frames_retained));
    reg_.GetGauge("vigil_edge_mirror_retained_bytes", "Their JPEG bytes").Set(static_cast<double>(cs.retained_bytes));
    metrics::Counter& evicted = reg_.GetCounter(
        "vigil_edge_mirror_frames_evicted_total",
        "Mirrored pictures dropped for room (mirror_window per stream) before the aggregator acknowledged them");
    if (cs.frames_evicted > frames_evicted_seen_) {
      evicted.Inc(static_cast<double>(cs.frames_evicted - frames_evicted_seen_));
      frames_evicted_seen_ = cs.frames_evicted;
    }
    metrics::Counter& results_evicted = reg_.GetCounter(
        "vigil_edge_mirror_results_evicted_total",
        "Mirrored results dropped for room before the aggregator acknowledged them (a takeover runs their pictures "
        "again)");
    results_evicted.Inc(static_cast<double>(cs.results_evicted - std::exchange(results_evicted_seen_, cs.results_evicted)));
  }
}

void PrimaryMirror::Join() {
  if (flush_.joinable()) flush_.join();
}

}  // namespace vigil::pipeline
