// The edge's stream ingest (stream_ingest.h): sources, readers and feeder threads.
#include "vigil/pipeline/stream_ingest.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include <spdlog/spdlog.h>

#include "vigil/common/frame_key.h"
#include "vigil/common/npy.h"
#include "vigil/video/jpeg.h"

namespace vigil::pipeline {

using std::chrono::milliseconds;

StreamIngest::StreamIngest(StreamIngestOptions options) : options_(std::move(options)), clock_(options_.clock) {
  if (!options_.open_source) options_.open_source = [](video::SourceOptions so) { return video::OpenSource(std::move(so)); };
}

StreamIngest::~StreamIngest() {
  // A warm standby's readers pass the gate: it lets a held one go, and they stop (joined) while it lives.
  if (!gate_) return;
  gate_->Close();
  for (Stream& s : streams_) {
    if (s.reader) s.reader->Stop();
  }
}

video::SourceOptions StreamIngest::SourceOptionsOf(size_t index) const {
  const StreamConfig& sc = options_.streams[index];
  video::SourceOptions so;
  so.uri = sc.source;
  so.stream_id = sc.id;
  so.realtime = sc.realtime;
  so.loop = sc.loop;
  so.target_fps = sc.target_fps;
  so.hwaccel = decode_[index].hwaccel;
  // Frames decoded on the GPU of the stream's Detectors stay there (NV12 into the GPU letterbox);
  // save_frames needs host pixels, so such a stream gets host frames.
  const int gpu = decode_[index].gpu;
  const StatusOr<std::optional<int>> decode_gpu = video::ParseHwaccel(so.hwaccel);
  so.deliver_device_frames = gpu >= 0 && decode_gpu.ok() && *decode_gpu == gpu && sc.save_frames.empty();
  return so;
}

Status StreamIngest::Open(std::vector<StreamDecode> decode) {
  decode_ = std::move(decode);
  decode_.resize(options_.streams.size());
  for (const StreamConfig& sc : options_.streams) {
    Stream s;
    s.config = sc;
    s.metrics = std::make_unique<StreamMetrics>(*options_.registry, sc.id, sc.hwaccel);
    options_.mirror->AddStream(sc.id);  // its index: streams_.size()
    video::SourceOptions so = SourceOptionsOf(streams_.size());
    if (!sc.save_frames.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(sc.save_frames, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            StrCat("stream '", sc.id, "': save_frames ", sc.save_frames, ": cannot create the folder: ", ec.message()));
      }
    }
    s.live = video::IsLiveUri(sc.source);
    StatusOr<std::unique_ptr<video::Source>> source = options_.open_source(std::move(so));
    if (!source.ok()) {
      spdlog::error("{}", std::string(source.status().message()));  // the message names the stream
      s.metrics->errors().Inc();
    } else {
      s.live = (*source)->live();
      s.source = std::move(*source);
    }
    streams_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

bool StreamIngest::any_open() const {
  return std::any_of(streams_.begin(), streams_.end(),
                     [](const Stream& st) { return st.source != nullptr || st.reader != nullptr; });
}

std::vector<video::Source::Probe> StreamIngest::Probes() const {
  std::vector<video::Source::Probe> probed;
  for (const Stream& s : streams_) probed.push_back(s.source ? s.source->probed() : video::Source::Probe{});
  return probed;
}

video::StreamReaderOptions StreamIngest::ReaderOptionsOf(size_t i, bool gated) {
  video::StreamReaderOptions ro;
  ro.queue_capacity = static_cast<size_t>(std::max(4, options_.max_batch));
  ro.on_thread_start = [this, i] { PlaceThread(ThreadRole::kDecode, i); };
  // The ledger numbers every picture the Source delivers (and skips those a resumed file delivered); a warm
  // standby's picture passes its gate first (held or discarded until the takeover).
  ro.on_frame = [this, i, gated](video::Frame& f) {
    if (gated && gate_->Admit(i, streams_[i].live, f.seq) != StandbyGate::Verdict::kPass) return false;
    // Numbered by the ledger and, a live picture of a primary that mirrors, handed to the standby under the lock
    // that orders it before the ledger states that count it (picture_mirror.h).
    const uint64_t position = f.seq;
    return options_.mirror->Number(i, streams_[i].live, streams_[i].run, f,
                                   [&](uint64_t* seq) { return ledger_->Number(i, position, seq); });
  };
  ro.on_drop = [this, i](const video::Frame& f, video::DropReason why) {
    // A live frame that will never be processed travels as a drop mark; a file's unprocessed frame is
    // re-read after a restart (it lies after the acknowledged cursor), so it is not marked.
    if (streams_[i].live) {
      // queue_full drops are counted from the reader's stats (Periodic); a stop's here.
      if (why != video::DropReason::kQueueFull) streams_[i].metrics->dropped("shutdown").Inc();
      ledger_->Dropped(i, f.seq, why == video::DropReason::kQueueFull ? "queue_full" : "shutdown");
    }
  };
  return ro;
}

// A warm standby, before after_load: every opened stream is read through the gate.
void StreamIngest::StartFollowing(bool cameras) {
  warm_cameras_ = cameras;
  {
    gate_ = std::make_unique<StandbyGate>(streams_.size());
    following_.store(gate_.get(), std::memory_order_release);
  }
  size_t files = 0, camera_count = 0;
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    if (!s.source || (s.live && !warm_cameras_)) continue;  // a camera connects in its reader's first Next()
    (s.live ? camera_count : files) += 1;
    s.read = s.source.get();
    s.reader = std::make_unique<video::StreamReader>(std::move(s.source), ReaderOptionsOf(i, /*gated=*/true));
  }
  spdlog::info("edge '{}' (standby): reading {} file stream(s) up to the primary's mirrored cursor and {} camera(s) "
               "while it waits",
               options_.edge, files, camera_count);
}

void StreamIngest::FollowMirrored(const std::vector<StreamRecord>& records) {
  StandbyGate* gate = following_.load(std::memory_order_acquire);
  if (gate == nullptr) return;
  for (const StreamRecord& r : records) {
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i].config.id != r.stream || streams_[i].config.source != r.source) continue;
      gate->Raise(i, r.acked_through);
      if (r.acked_through && streams_[i].read) streams_[i].read->DoNotPaceThrough(*r.acked_through);
    }
  }
}

void StreamIngest::Admitted(MirrorWindow* window) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    s.run = ledger_->run(i);
    const StreamResume r = ledger_->resume(i);
    s.metrics->lost_on_restart().Inc(static_cast<double>(r.lost));
    if (window && s.live) {
      // The old primary's pictures the aggregator lacks: Feed processes them before the camera's next ones.
      s.replay = window->Take(s.config.id, s.run, r.replay);
      s.metrics->replayed().Inc(static_cast<double>(r.replay.size()));
      // This node's own standby (once one pairs) needs those the aggregator has not stored yet as much as this
      // node did: kept raw like this primary's own pictures (no work on the takeover's path). (A re-published
      // result goes to that standby as this node's own result: DetectionSink::RecordFrame.)
      options_.mirror->KeepTakenOver(i, s.replay);
      if (!r.replay.empty()) {
        const size_t with_results = static_cast<size_t>(
            std::count_if(s.replay.begin(), s.replay.end(), [](const auto& m) { return m.result.has_value(); }));
        spdlog::warn("stream '{}': processing {} mirrored picture(s) of the old primary again (seqs {}..{}): {} with "
                     "the old primary's own results to re-publish, {} to run again",
                     s.config.id, r.replay.size(), r.replay.front(), r.replay.back(), with_results,
                     s.replay.size() - with_results);
      }
    }
  }
}

void StreamIngest::StartReaders() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    const StreamResume r = ledger_->resume(i);
    if (s.reader && gate_ && !s.live) {
      // Read while this node was the standby: it resumes at the gate's position, which must not lie after the
      // first picture the aggregator lacks (it can, if the aggregator lost what it had acknowledged).
      const uint64_t resume_at = r.skip_through ? *r.skip_through + 1 : 0;
      const uint64_t at = gate_->next_position(i);
      if (at <= resume_at) {
        spdlog::info("stream '{}': resumes at position {} (read up to {} while standby; {} to skip)", s.config.id,
                     resume_at, at, resume_at - at);
      } else {
        spdlog::warn("stream '{}': the standby read up to position {} but the aggregator lacks {} on: reading the "
                     "input again from its start",
                     s.config.id, at, resume_at);
        gate_->Release(i);
        s.reader.reset();
        s.read = nullptr;
        StatusOr<std::unique_ptr<video::Source>> source = options_.open_source(SourceOptionsOf(i));
        if (!source.ok()) {
          spdlog::error("{}", std::string(source.status().message()));
          s.metrics->errors().Inc();
          continue;
        }
        s.source = std::move(*source);
      }
    }
    if (!s.reader) {
      if (!s.source) continue;
      s.read = s.source.get();
      video::StreamReaderOptions ro = ReaderOptionsOf(i, /*gated=*/false);
      // A resumed file: what the ledger skips (reported already) is not paced in real time either.
      if (r.skip_through) s.read->DoNotPaceThrough(*r.skip_through);
      s.reader = std::make_unique<video::StreamReader>(std::move(s.source), ro);
      continue;
    }
    // Read while standby: its held picture was paced when it was decoded; the clock starts anew at the
    // takeover (a real-time file continues from now, the skipped pictures not paced).
    s.read->DoNotPaceThrough(r.skip_through.value_or(0));
  }
  if (gate_) gate_->Open();  // the ledger is admitted: held pictures go on to it
  options_.takeover->Mark(TakeoverTimeline::kResumed);
}

int StreamIngest::Activate() {
  int active = 0;
  for (const Stream& s : streams_) {
    if (s.reader || !s.replay.empty()) ++active;
  }
  active_ = active;
  return active;
}

void StreamIngest::StartFeeders() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].reader || !streams_[i].replay.empty()) {  // a camera that did not open still gets its replay
      feeders_.emplace_back([this, i] {
        PlaceThread(ThreadRole::kFeed, i);
        Feed(i);
      });
    }
  }
}

void StreamIngest::JoinFeeders() {
  for (std::thread& t : feeders_) t.join();
  feeders_.clear();
}

// A takeover's mirrored pictures (Stream::replay, seq order), decoded and pushed before the source's. One that
// does not decode becomes a drop mark (mirror_error): its seq was kept out of the lost ranges for it.
bool StreamIngest::FeedReplay(size_t index) {
  Stream& s = streams_[index];
  std::vector<replication::MirroredFrame> replay = std::move(s.replay);
  s.replay.clear();
  size_t k = 0;
  uint64_t republished = 0;
  // The old primary's own results re-published (they need no engine), in seq order, as long as nothing of this
  // stream waits in the pool: the ledger takes a stream's frames in seq order. A result after a picture that must
  // run again (one the old primary dropped, or never processed) is re-published only when its picture is gone;
  // otherwise its picture runs again, behind the one before it.
  auto republish = [&](const replication::MirroredFrame& m) {
    std::vector<detect::Detection> dets;
    dets.reserve(m.result->detections.size());
    for (const replication::MirroredDetection& d : m.result->detections) {
      dets.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
    }
    const FrameInfo info{m.seq, m.result->capture_ns, m.result->pts_ns, m.result->width, m.result->height};
    if (republished == 0) options_.takeover->Republishing(m.key(options_.edge));
    if (options_.republish) options_.republish(index, info, dets, clock_->SteadyNs());
    ++republished;
  };
  for (; k < replay.size() && replay[k].result && !Stopping(); ++k) republish(replay[k]);
  for (; k < replay.size() && !Stopping(); ++k) {
    const replication::MirroredFrame& m = replay[k];
    if (!m.has_picture()) {
      if (m.result) republish(m);
      continue;
    }
    video::Frame frame;
    const int64_t t0 = clock_->SteadyNs();
    if (m.gpu) {  // from a ring in GPU memory: stays there (the engine's GPU stages read it)
      frame = FrameOfGpu(m);
    } else if (!m.bgr.empty()) {  // a raw picture from the same-host ring: nothing to decode
      frame = FrameOfRaw(m);
    } else if (Status st = video::DecodeJpeg(m.jpeg, &frame); !st.ok()) {
      spdlog::error("stream '{}': mirrored picture seq {} cannot be processed again: {}", s.config.id, m.seq,
                    std::string(st.message()));
      s.metrics->dropped("mirror_error").Inc();
      ledger_->Dropped(index, m.seq, "mirror_error");
      continue;
    }
    frame.stream_id = s.config.id;
    frame.run = s.run;
    frame.seq = m.seq;
    frame.pts_ns = m.pts_ns;
    frame.capture_time_ns = m.capture_ns;  // the old primary's capture: frame→stored includes the takeover
    frame.source_steady_ns = clock_->SteadyNs();
    frame.decode_ns = frame.source_steady_ns - t0;
    if (!PushToPool(index, std::move(frame))) break;
  }
  // Stopped, or the pool closed: what was not handed over becomes drop marks (its seqs are not reported lost).
  for (size_t rest = k; rest < replay.size(); ++rest) {
    s.metrics->dropped("shutdown").Inc();
    ledger_->Dropped(index, replay[rest].seq, "shutdown");
  }
  if (republished > 0) {
    ledger_->Tick(/*force=*/true);  // the aggregator learns of them at once (not after progress_flush)
    s.metrics->republished().Inc(static_cast<double>(republished));
    spdlog::info("stream '{}': re-published the old primary's own results for {} frame(s)", s.config.id, republished);
  }
  return k == replay.size();
}

// Hands `frame` to the intake; false when it is closed (the frame not taken). An idle pool's stall clock starts
// with the first frame that waits (a camera that took seconds to connect, or a file paused by pacing, is not a
// stalled inference).
bool StreamIngest::PushToPool(size_t index, video::Frame frame) {
  options_.health->Pushing();
  if (options_.intake->Push(index, std::move(frame))) {
    options_.takeover->Mark(TakeoverTimeline::kFed);
    return true;
  }
  options_.health->PushRefused();
  return false;
}

void StreamIngest::Feed(size_t index) {
  Stream& s = streams_[index];
  const bool fed = FeedReplay(index);
  while (fed && s.reader && !Stopping()) {
    video::Frame frame;
    const video::StreamReader::PopResult r = s.reader->Pop(&frame, milliseconds(100));
    if (r == video::StreamReader::PopResult::kTimeout) continue;
    if (r == video::StreamReader::PopResult::kEnd) {
      if (Status st = s.reader->final_status(); !st.ok()) {
        spdlog::error("{}", std::string(st.message()));  // the message names the stream
        s.metrics->errors().Inc();
      } else {
        const video::StreamStats stats = s.reader->Stats();
        spdlog::info("stream '{}': ended; decoded on {}, {} decode errors", s.config.id,
                     stats.hwaccel.empty() ? std::string("cpu") : stats.hwaccel, stats.decode_errors);
      }
      break;
    }
    const uint64_t seq = frame.seq;
    if (s.live && !std::exchange(s.first_frame_seen, true)) options_.takeover->FirstLiveFrame(s.config.id, seq);
    if (!PushToPool(index, std::move(frame))) {
      if (s.live) {
        s.metrics->dropped("shutdown").Inc();
        ledger_->Dropped(index, seq, "shutdown");
      }
      break;
    }
  }
  if (!s.reader) {  // a takeover's replay for a camera that did not open
    if (--active_ == 0) options_.intake->Close();
    return;
  }
  s.reader->Stop();
  if (s.live) {  // numbered and never processed: marked, so the next instance does not report them as lost
    video::Frame frame;
    while (s.reader->Pop(&frame, milliseconds(0)) == video::StreamReader::PopResult::kFrame) {
      s.metrics->dropped("shutdown").Inc();
      ledger_->Dropped(index, frame.seq, "shutdown");
    }
  }
  if (--active_ == 0) options_.intake->Close();
}

void StreamIngest::SaveFrames(const std::vector<WorkItem>& batch) const {
  for (const WorkItem& item : batch) {
    const Stream& s = streams_[item.stream];
    if (!s.config.save_frames.empty() && !item.frame.device) SaveFrame(s, item.frame);
  }
}

void StreamIngest::SaveFrame(const Stream& s, const video::Frame& f) const {
  Tensor pixels(DType::kUInt8, {f.height, f.width, 3});
  for (int y = 0; y < f.height; ++y) {
    std::copy_n(f.bgr.data() + static_cast<size_t>(y) * static_cast<size_t>(f.stride), static_cast<size_t>(f.width) * 3,
                pixels.data<uint8_t>() + static_cast<size_t>(y) * static_cast<size_t>(f.width) * 3);
  }
  char name[32];
  std::snprintf(name, sizeof(name), "%06llu.npy", static_cast<unsigned long long>(f.seq));
  const std::string path = (std::filesystem::path(s.config.save_frames) / name).string();
  if (Status st = WriteNpy(path, pixels); !st.ok()) {
    spdlog::warn("stream '{}': save_frames: {}", s.config.id, std::string(st.message()));
  }
}

void StreamIngest::DropQueued(size_t stream, uint64_t seq) {
  if (!streams_[stream].live) return;
  streams_[stream].metrics->dropped("shutdown").Inc();
  ledger_->Dropped(stream, seq, "shutdown");
}

}  // namespace vigil::pipeline
