// Internal: the cuda_ipc link's ring (cuda_ipc.h) — the shared layout and the memory backends.
//
// The aggregator (consumer) owns two pieces of memory per session:
//  - the slots: `slots` × `slot_bytes` bytes in GPU memory (memory "cuda": cudaMalloc, exported with
//    cudaIpcGetMemHandle) or in shared host memory (memory "host": a POSIX shared-memory object, for hosts
//    without a GPU and for the CPU tests);
//  - the control block, always in shared host memory (ControlHeader, then one u64 signal word per slot).
// The edge (producer) maps both: it writes a slot (a copy on its CUDA stream), then the slot's signal word
// (cuStreamWriteValue64 on the same stream into the control block, registered as mapped host memory: the
// write lands after the slot's bytes, with a system-wide fence). The consumer polls the signal words from
// the host — no host round trip of the edge per message — and releases slots by advancing `consumed`.
//
// Signal word of slot k = seq % slots: ((seq + 1) << 24) | used bytes (slot header included), so the
// consumer learns that slot seq is complete and how many bytes to copy from one 8-byte read.
// Slot: SlotHeader, then its payload:
//   kind 1 (stream): `bytes` bytes of the frame byte stream (protocol.h frames; a frame may span slots);
//   kind 2 (device report): a Report frame of `bytes` bytes encoded with no detection rows, then at
//          offset 16 + RoundUp8(bytes) `rows` detection rows (24 bytes each) copied from device memory.
// Not thread-safe: one producer thread per mapping, one consumer thread per memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport::ring {

inline constexpr uint64_t kControlMagic = 0x31474e4952474956ull;  // "VIGRING1"
inline constexpr uint32_t kSlotMagic = 0x544c5356;                // "VSLT"
inline constexpr uint32_t kKindStream = 1, kKindDeviceReport = 2;
inline constexpr size_t kSignalsOffset = 192;
inline constexpr uint32_t kMaxSlotBytes = (1u << 24) - 1;  // the signal word's byte field
inline constexpr uint32_t kMinSlotBytes = 4096;

struct ControlHeader {
  uint64_t magic;
  uint32_t slots, slot_bytes;
  alignas(64) uint64_t consumed;  // slots released by the consumer (a count); atomic_ref access
  alignas(64) uint64_t closed;    // 1: the consumer is gone; the producer stops waiting
};
static_assert(sizeof(ControlHeader) <= kSignalsOffset);

struct SlotHeader {
  uint32_t magic, kind, bytes, rows;
};
static_assert(sizeof(SlotHeader) == 16);

inline size_t ControlBytes(uint32_t slots) { return kSignalsOffset + 8 * static_cast<size_t>(slots); }
inline size_t SignalOffset(uint64_t seq, uint32_t slots) { return kSignalsOffset + 8 * (seq % slots); }
inline uint64_t SignalValue(uint64_t seq, uint32_t used) { return ((seq + 1) << 24) | used; }
inline size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

inline std::atomic_ref<uint64_t> Word(void* control, size_t offset) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(static_cast<char*>(control) + offset));
}

// A POSIX shared-memory object mapped read-write: created (mode 0600, a random name) or opened by name.
class SharedMemory {
 public:
  // Errors: Unavailable naming the object and the OS reason.
  static StatusOr<std::unique_ptr<SharedMemory>> Create(std::string_view what, size_t bytes);
  static StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& name, size_t bytes);
  ~SharedMemory();  // unmaps; unlinks the name if this side created it and has not yet
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  void Unlink();  // removes the name (the mappings stay); idempotent
  const std::string& name() const { return name_; }
  char* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  SharedMemory(std::string name, char* data, size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), owner_(owner) {}
  std::string name_;
  char* data_;
  size_t bytes_;
  bool owner_;
};

// The consumer's slots. Read copies to the host (what it returns stays valid until the next call).
class RingMemory {
 public:
  virtual ~RingMemory() = default;
  virtual std::string memory() const = 0;  // "cuda" / "host"
  virtual std::string device() const = 0;  // PCI bus id, "" for host
  virtual std::string handle() const = 0;  // what MapRing opens
  // Copies [offset, offset + bytes) of the slots to host memory. Errors: Internal (a CUDA error).
  virtual StatusOr<const char*> Read(size_t offset, size_t bytes) = 0;
  // Writes into the slots (tests: a corrupted slot). Errors: Internal.
  virtual Status Poke(size_t offset, std::string_view bytes) = 0;
  // The name to unlink once the producer mapped it (host memory); no-op for CUDA.
  virtual void Unlink() {}
};

// `device`: "host" or "cuda:N". Errors: InvalidArgument (device), Unimplemented (cuda without CUDA in
// this build), Unavailable / ResourceExhausted (allocation, export).
StatusOr<std::unique_ptr<RingMemory>> AllocateRing(const std::string& device, size_t bytes);

// The producer's side of a ring: staging in host memory (pinned for CUDA) and ordered copies + signals.
class RingMapping {
 public:
  virtual ~RingMapping() = default;
  // Host staging for the slot bytes at `offset` (fill, then Put).
  virtual char* staging(size_t offset) = 0;
  // Enqueues the copy of staging [offset, offset + bytes) into the ring at the same offset.
  virtual Status Put(size_t offset, size_t bytes) = 0;
  // Enqueues a copy of `bytes` device bytes at `src` (on CUDA device `src_device`, after `ready_event` — a
  // cudaEvent_t, or null) into the ring at `offset`. Unimplemented for host rings.
  virtual Status PutDevice(size_t offset, const void* src, size_t bytes, int src_device, void* ready_event) = 0;
  virtual bool takes_device_memory() const = 0;
  // Enqueues, after everything enqueued before, the write of `value` to the control word at `offset`.
  virtual Status Signal(size_t offset, uint64_t value) = 0;
  // Waits for everything enqueued (before unmapping). Errors: Internal.
  virtual Status Drain() = 0;
  virtual std::string transports() const = 0;  // "cuda_ipc" or "shm"
};

// Maps the ring of `offer` (memory "host" or "cuda"); `control` is the mapped control block (the mapping
// registers it with CUDA for device-side signal writes). `edge_device`: the CUDA device the edge writes
// from (-1: the ring's own GPU). Errors: Unavailable naming the reason (no such GPU here, no peer access,
// the IPC handle does not open, CUDA missing), InvalidArgument (a malformed offer).
StatusOr<std::unique_ptr<RingMapping>> MapRing(const RingOffer& offer, char* control, size_t control_bytes,
                                               int edge_device);

// Internal, per backend (ring.cc host, cuda_ring.cc CUDA or its stub).
StatusOr<std::unique_ptr<RingMemory>> AllocateCudaRing(int device, size_t bytes);
StatusOr<std::unique_ptr<RingMapping>> MapCudaRing(const RingOffer& offer, char* control, size_t control_bytes,
                                                   int edge_device);

}  // namespace vigil::transport::ring
