// vigil/replication/frame_ring.h — a hot standby's same-host picture ring (issue 17): the primary's live
// pictures reach a standby on the same host as raw pixels through shared memory, not as JPEGs over gRPC.
//
// Who owns what: the standby creates the ring — a POSIX shared-memory object (mode 0600, a random name) of
// `slots` slots of `slot_bytes` bytes each, behind a control block — so the pictures in it outlive the primary
// (a takeover reads what a killed primary wrote). The primary maps it and writes; the standby reads each slot
// once, copies the picture out (its MirrorWindow keeps it) and releases the slot (`consumed`), in order.
// Memory "cuda:N": the pixels live in `slots` GPU slots of `slot_bytes` on the standby's GPU N (cudaMalloc,
// exported with CUDA IPC; the shared memory holds only the headers and signals). The primary opens them
// (on that GPU; a picture on another GPU goes over peer access) and copies a GPU-decoded NV12 picture device to
// device (WriteDevice: no host copy anywhere), or uploads a host picture as BGR; the standby copies each
// picture into a buffer of its own on the same GPU (MirroredFrame::gpu; a BGR one to host memory).
//
// Reading in batches: each batch of GPU copies costs the primary a time slice of the standby's CUDA context (two
// processes' contexts on one GPU take turns). The reader therefore takes the complete slots together, once half the
// ring is complete or the oldest complete slot has waited `batch_hold` — not each picture as it comes (at 128 1080p30
// cameras that was ~2,000 batches a second and a third of the primary's throughput on an H200) — and does not copy
// a picture the aggregator has acknowledged meanwhile (`wanted`): most are, by then. Drain takes everything at once.
//
// Authentication: the primary listens on a Unix-domain socket (transport/unix_socket.h: SO_PEERCRED, only the
// uids allowed, by default its own). Over the mutually authenticated replication channel (channel.h) it gives
// the paired standby the socket's path and a fresh random token (Paired); the standby dials the socket and
// sends that token with its ring; the primary maps the ring only for the current token (compared in constant
// time), so a process that did not pass the channel's TLS learns nothing and writes nothing. One standby at a
// time: a new token ends the session of the previous one.
//
// Slot layout: FrameSlot header (magic, format, the picture's identity and times, width, height, stride, bytes,
// the YUV matrix and range, the stream id), then — host memory — `bytes` bytes of pixels: 8-bit BGR
// (video/frame.h's host form: `height` rows of `stride` bytes), or — GPU memory — those pixels or packed NV12
// (MirroredGpuPicture's layout) in the GPU slot. The signal word of slot seq % slots becomes seq + 1 once the slot is complete (release order); the
// standby checks every header (magic, sizes against the slot, a stream id of printable characters, the
// picture's own size) and rejects (counts, skips) a slot that fails.
//
// Never blocking the primary: Write fails at once (ResourceExhausted) when every slot is still unread — the
// standby is behind — and the caller counts the picture as not mirrored.
// Thread-safety: FramePublisher::Write and the accessors from any thread (one internal mutex); FrameRing's
// callback runs on its reader thread, in slot order, and must be quick. Destructors stop their threads.
// Errors name the socket, the shared-memory object and the reason.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/status.h"
#include "vigil/replication/channel.h"

namespace vigil::replication {

inline constexpr size_t kFrameTokenBytes = 32;

struct FramePublisherOptions {
  std::string socket;              // Unix socket path (≤ 107 bytes); a stale file is replaced
  std::vector<uid_t> allow_uids;   // peers allowed; empty: this process's uid only
};

struct FramePublisherStats {
  uint64_t sessions = 0;          // rings mapped (a standby authenticated)
  uint64_t refused = 0;           // connections refused: wrong token, bad ring, another uid
  uint64_t written = 0;           // pictures written
  uint64_t bytes = 0;             // their pixel bytes
  uint64_t ring_full = 0;         // Write refused: every slot unread
  uint64_t too_large = 0;         // Write refused: the picture does not fit a slot
  bool active = false;            // a ring is mapped now
  std::string last_refusal;
};

// The primary's side: listens, maps the ring of the standby holding the current token, writes pictures.
class FramePublisher {
 public:
  // Errors: UnixListener::Listen's (InvalidArgument, AlreadyExists, Unavailable).
  static StatusOr<std::unique_ptr<FramePublisher>> Listen(FramePublisherOptions options);
  virtual ~FramePublisher() = default;
  virtual const std::string& socket() const = 0;
  // A fresh token (kFrameTokenBytes random bytes) for the standby about to pair; the previous token stops
  // working and its session (if any) ends.
  virtual std::string NewToken() = 0;
  // Whether a ring is mapped (a Write may succeed).
  virtual bool active() const = 0;
  // Copies `frame`'s metadata and `bgr` (host memory: height rows of `stride` bytes, stride ≥ 3 × width) into the
  // next slot and signals it. Errors: Unavailable (no ring mapped; the standby went away; a CUDA copy failed,
  // which ends the session), ResourceExhausted (every slot unread), InvalidArgument (a picture or stream id that
  // does not fit a slot).
  virtual Status Write(const MirroredFrame& frame, const uint8_t* bgr, size_t stride) = 0;
  // A picture in GPU memory (video/frame.h DeviceFrame: NV12 planes, pitches in bytes, `matrix` a video::YuvMatrix
  // value), complete when called. Copied device to device into the next GPU slot (synchronously), then signalled.
  struct DevicePicture {
    int device = 0;
    const uint8_t* y = nullptr;
    const uint8_t* uv = nullptr;
    size_t y_pitch = 0, uv_pitch = 0;
    int matrix = 0;
    bool full_range = false;
  };
  // Errors: as Write, and FailedPrecondition when the mapped ring is in host memory (download the picture and
  // Write it).
  virtual Status WriteDevice(const MirroredFrame& frame, const DevicePicture& picture) = 0;
  // Whether the mapped ring is in GPU memory (WriteDevice takes pictures).
  virtual bool in_gpu_memory() const = 0;
  // The most pixel bytes a picture may have in the mapped ring's slots (0: none mapped): BGR height × stride, or
  // NV12 width × height × 1.5 (rounded up) for WriteDevice.
  virtual size_t slot_capacity() const = 0;
  virtual FramePublisherStats stats() const = 0;
  // The test hook: the next n slots written get a header that fails the standby's check.
  virtual void CorruptNextSlotsForTesting(int n) = 0;
};

struct FrameRingOptions {
  std::string socket;  // the primary's FramePublisher socket (Paired)
  std::string token;   // the token Paired gave
  uint32_t slots = 8;            // 2..4096
  size_t slot_bytes = 8u << 20;  // 64 KiB..1 GiB, a multiple of 8: the largest picture + the header
  std::string memory = "host";   // "host", or "cuda:N": the slots' pixels in GPU N's memory (CUDA builds)
  // The reader thread takes complete slots once half the ring is complete or the oldest complete slot has waited
  // this long (0..10 s; 0: each as it completes). A picture in a complete slot is the standby's already (the ring
  // is its memory): the hold delays only its copy, never what a takeover gets (Drain).
  std::chrono::milliseconds batch_hold{20};
  Clock* clock = nullptr;  // what batch_hold is measured on (SteadyNs). Default: null = SystemClock()
  // Each picture read, in slot order, with `bgr` and `stride` set, or `gpu` (jpeg empty).
  std::function<void(MirroredFrame&&)> on_frame;
  // Optional: asked with a picture's identity and times (stream, run, seq, capture_ns, pts_ns, width, height; no
  // pixels) before its pixels are copied; false releases the slot uncopied (counted: `unwanted`) — a picture the
  // aggregator acknowledged meanwhile. On the reader's thread, under its lock: quick, and must not call the ring.
  std::function<bool(const MirroredFrame&)> wanted;
};

struct FrameRingStats {
  uint64_t received = 0;  // pictures read (handed to on_frame)
  uint64_t bytes = 0;     // their pixel bytes
  uint64_t rejected = 0;  // slots that failed a check (skipped)
  uint64_t unwanted = 0;  // pictures released uncopied: `wanted` said no
};

// The standby's side: creates the ring, hands it to the primary, reads it.
class FrameRing {
 public:
  // Creates the ring, dials `socket` and offers it with the token; returns once the primary mapped it.
  // Errors: InvalidArgument (options), Unavailable (no socket there — another host —, refused: the primary's
  // reason, shared memory), DeadlineExceeded, Unimplemented / Internal (memory cuda: no CUDA in this build, the
  // allocation).
  static StatusOr<std::unique_ptr<FrameRing>> Connect(FrameRingOptions options, std::chrono::milliseconds timeout);
  virtual ~FrameRing() = default;  // stops reading; tells the primary (closed) and unlinks the ring
  // Reads every slot complete now (on the caller's thread, after the reader's current one): a takeover calls it
  // once the primary is gone, so every picture it wrote is handed over before the window is taken.
  virtual void Drain() = 0;
  virtual FrameRingStats stats() const = 0;
};

}  // namespace vigil::replication
