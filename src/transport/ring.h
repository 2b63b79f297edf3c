// Internal: the cuda_ipc link's ring (cuda_ipc.h) — the shared layout and the memory backends.
//
// The aggregator (consumer) owns, per session:
//  - the shared block (host memory, a POSIX shared-memory object, mode 0600): ControlHeader, one u64
//    signal word per slot, and — at MirrorOffset — a host mirror of every slot (`slots` × `slot_bytes`);
//  - for memory "cuda", the ring itself: `slots` × `slot_bytes` bytes of GPU memory (cudaMalloc, exported
//    with cudaIpcGetMemHandle), where a GPU consumer of the aggregator reads results without a host copy.
//    For memory "host" (hosts without a GPU, the CPU tests) the mirror is the ring.
// The edge (producer) maps both. It writes a slot's host part (slot header, frames) straight into the
// mirror with the CPU, then — memory "cuda" — has one kernel on its own stream copy device rows (a
// DevicePayload) into the mirror and, after a system-wide fence, write the slot's signal word, then copy the
// slot into the GPU ring and advance ring_ready (ring_kernels.h): the edge never waits for the GPU, and the
// aggregator learns of the slot from a host-memory poll and reads it from the mirror — the copy to the host
// that storage needs is made by the same kernel, with no host round trip on either side. Memory "host":
// the CPU writes everything and stores the signal with release order.
//
// Signal word of slot k = seq % slots: ((seq + 1) << 24) | used bytes (slot header included), so the
// consumer learns that slot seq is complete and how many bytes to read from one 8-byte read.
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
#include "vigil/transport/shared_memory.h"

namespace vigil::transport::ring {

inline constexpr uint64_t kControlMagic = 0x31474e4952474956ull;  // "VIGRING1"
inline constexpr uint32_t kSlotMagic = 0x544c5356;                // "VSLT"
inline constexpr uint32_t kKindStream = 1, kKindDeviceReport = 2;
inline constexpr size_t kSignalsOffset = 256;
inline constexpr uint32_t kMaxSlotBytes = (1u << 24) - 1;  // the signal word's byte field
inline constexpr uint32_t kMinSlotBytes = 4096;

struct ControlHeader {
  uint64_t magic;
  uint32_t slots, slot_bytes;
  alignas(64) uint64_t consumed;  // slots released by the consumer (a count); atomic_ref access
  alignas(64) uint64_t closed;    // 1: the consumer is gone; the producer stops waiting
  alignas(64) uint64_t ring_ready;  // slots complete in the GPU ring, in order (a count; a GPU consumer's
                                    // signal: a slot's host signal may come first, see Publish)
};
static_assert(sizeof(ControlHeader) <= kSignalsOffset);

struct SlotHeader {
  uint32_t magic, kind, bytes, rows;
};
static_assert(sizeof(SlotHeader) == 16);

// The shared block: header and signals, then the slots' host mirror at a page boundary.
inline size_t MirrorOffset(uint32_t slots) {
  return (kSignalsOffset + 8 * static_cast<size_t>(slots) + 4095) & ~size_t{4095};
}
inline size_t SharedBytes(uint32_t slots, uint32_t slot_bytes) {
  return MirrorOffset(slots) + static_cast<size_t>(slots) * slot_bytes;
}
inline size_t SignalOffset(uint64_t seq, uint32_t slots) { return kSignalsOffset + 8 * (seq % slots); }
inline uint64_t SignalValue(uint64_t seq, uint32_t used) { return ((seq + 1) << 24) | used; }
inline size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

inline std::atomic_ref<uint64_t> Word(void* control, size_t offset) { return WordAt(control, offset); }

using transport::SharedMemory;  // vigil/transport/shared_memory.h

// The consumer's GPU ring (memory "cuda"); memory "host" has none (the mirror is the ring).
class RingMemory {
 public:
  virtual ~RingMemory() = default;
  virtual std::string device() const = 0;  // PCI bus id
  virtual std::string handle() const = 0;  // the cudaIpcMemHandle_t bytes
};

// `device`: "cuda:N". Errors: InvalidArgument (device), Unimplemented (no CUDA in this build), Unavailable /
// ResourceExhausted (allocation, export).
StatusOr<std::unique_ptr<RingMemory>> AllocateRing(const std::string& device, size_t bytes);

// The producer's side of a ring. The host part of each slot is written by the caller into the mirror
// (`shared` + MirrorOffset) before Publish.
class RingMapping {
 public:
  virtual ~RingMapping() = default;
  // Publishes slot `seq` at `offset` (from the start of the slots): its first `host_bytes` bytes are in the
  // mirror already; `row_bytes` bytes of device rows at `rows` (on the mapping's GPU, ready after
  // `ready_event`, a cudaEvent_t or null) go to `rows_offset` in the slot (ring and mirror); the signal word at
  // `signal_offset` (from the start of the shared block) becomes `value`, and ControlHeader::ring_ready
  // becomes seq + 1 once the GPU ring holds the slot. Without device rows the mirror is complete already, so
  // the CPU stores the signal at once and the copy into the GPU ring follows on the stream (the consumer's
  // host path waits for no GPU work); with device rows the kernel writes the signal after the rows. Ordered
  // with earlier publishes. Errors: Unimplemented (device rows on a host ring), Internal (a CUDA error).
  virtual Status Publish(uint64_t seq, size_t offset, size_t host_bytes, const void* rows, size_t rows_offset,
                         size_t row_bytes, void* ready_event, size_t signal_offset, uint64_t value) = 0;
  // Whether Publish takes device rows from CUDA device `device`.
  virtual bool takes_device_rows(int device) const = 0;
  // Waits for everything published (before unmapping). Errors: Internal.
  virtual Status Drain() = 0;
  virtual std::string transports() const = 0;  // "cuda_ipc" or "shm"
};

// Maps the ring of `offer`; `shared` is the mapped shared block (the mapping registers it with CUDA for
// the kernel's writes). `edge_device`: the CUDA device the edge writes from (-1: the ring's own GPU).
// `linger_us` (a GPU ring): how long the resident publisher kernel stays after its last slot, polling for
// the next (ring_kernels.h: no launch per slot while slots keep coming; a CUDA call that synchronises the
// whole device waits up to this long after the last); 0: one kernel launch per slot.
// Errors: Unavailable naming the reason (no such GPU here, no peer access, the IPC handle does not open,
// CUDA missing), InvalidArgument (a malformed offer).
StatusOr<std::unique_ptr<RingMapping>> MapRing(const RingOffer& offer, char* shared, size_t shared_bytes,
                                               int edge_device, uint32_t linger_us);

// Launches of the resident publisher in this process (a counter; CudaIpcCounters::publisher_launches).
std::atomic<uint64_t>& PublisherLaunches();

// Internal, per backend (ring.cc host, cuda_ring.cc CUDA or its stub).
StatusOr<std::unique_ptr<RingMemory>> AllocateCudaRing(int device, size_t bytes);
StatusOr<std::unique_ptr<RingMapping>> MapCudaRing(const RingOffer& offer, char* shared, size_t shared_bytes,
                                                   int edge_device, uint32_t linger_us);

}  // namespace vigil::transport::ring
