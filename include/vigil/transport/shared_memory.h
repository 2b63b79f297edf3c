// vigil/transport/shared_memory.h — a POSIX shared-memory object mapped read-write, for the same-host rings:
// the cuda_ipc link's ring (transport/cuda_ipc.h) and the hot standby's picture ring (replication/frame_ring.h).
//
// Created with mode 0600 under a random name (/vigil-<pid>-<random>-<what>) or opened by a name a peer passed
// (over a Unix socket whose peer credentials were checked). The creator unlinks the name once the peer mapped it
// (Unlink) or at destruction; the mapping lives until the object is destroyed.
// Thread-safety: a SharedMemory is used by one thread at a time; its memory is shared by design — callers order
// their accesses with atomics (WordAt). RemoveStale is thread-safe.
// Errors: Unavailable naming the object and the OS reason (shm_open, ftruncate, mmap).
// Ownership: the object owns its mapping (munmap at destruction) and, as creator, its name until unlinked.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "vigil/common/status.h"

namespace vigil::transport {

class SharedMemory {
 public:
  // A new object named /vigil-<this pid>-<random>-<what>, `bytes` long, zero-filled.
  static StatusOr<std::unique_ptr<SharedMemory>> Create(std::string_view what, size_t bytes);
  // An existing object, which must be at least `bytes` long.
  static StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& name, size_t bytes);
  ~SharedMemory();  // unmaps; unlinks the name if this side created it and has not yet
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  void Unlink();  // removes the name (the mappings stay); idempotent
  // Removes /dev/shm objects that Create made for processes of this user that are gone (a creator killed
  // before it unlinked: mid-handshake); returns how many. Create calls it once per process. "Gone" is judged in
  // this PID namespace: processes sharing /dev/shm across PID namespaces (containers with a shared IPC namespace)
  // should run as different users. Thread-safe.
  static int RemoveStale();
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

// The 8-byte word at `base + offset` (8-byte aligned) as an atomic: how two processes sharing an object order
// their accesses to it.
inline std::atomic_ref<uint64_t> WordAt(void* base, size_t offset) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(static_cast<char*>(base) + offset));
}

}  // namespace vigil::transport
