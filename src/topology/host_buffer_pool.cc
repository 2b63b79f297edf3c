// HostBufferPool and PooledBuffer (vigil/topology/host_buffer_pool.h).
#include "vigil/common/deadline.h"
#include "vigil/topology/host_buffer_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "vigil/common/mutex.h"

namespace vigil::topology {
namespace internal {

struct HostBufferPoolState {
  ~HostBufferPoolState() {
    if (pinned) options.pinner->Unpin(slab.data());
  }  // then `slab` unmaps

  HostBufferPoolOptions options;
  HostBuffer slab;
  bool pinned = false;  // set once at creation
  Mutex mu;
  CondVar freed;
  std::vector<size_t> free_list VIGIL_GUARDED_BY(mu);  // indexes; the back is handed out next
  HostBufferPoolStats stats VIGIL_GUARDED_BY(mu);

  void Give(size_t index) VIGIL_EXCLUDES(mu) {
    {
      MutexLock lock(mu);
      free_list.push_back(index);
      --stats.in_use;
    }
    freed.NotifyOne();
  }
};

}  // namespace internal

PooledBuffer::PooledBuffer(PooledBuffer&& other) noexcept
    : pool_(std::move(other.pool_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      index_(std::exchange(other.index_, 0)) {}

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    index_ = std::exchange(other.index_, 0);
  }
  return *this;
}

void PooledBuffer::Release() {
  if (!pool_) return;
  pool_->Give(index_);
  pool_.reset();
  data_ = nullptr;
  size_ = 0;
}

StatusOr<HostBufferPool> HostBufferPool::Create(Binder& binder, HostBufferPoolOptions options) {
  const std::string who = StrCat("host buffer pool '", options.name, "'");
  if (options.buffer_bytes == 0 || options.buffers == 0) {
    return absl::InvalidArgumentError(StrCat(who, ": ", options.buffers, " buffers of ", options.buffer_bytes,
                                             " bytes: need at least one buffer of at least one byte"));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (options.buffer_bytes > SIZE_MAX / 2 || options.buffers > SIZE_MAX / 2 / (options.buffer_bytes + page)) {
    return absl::InvalidArgumentError(
        StrCat(who, ": ", options.buffers, " buffers of ", options.buffer_bytes, " bytes overflow the address space"));
  }
  const size_t stride = (options.buffer_bytes + page - 1) / page * page;
  StatusOr<HostBuffer> slab = binder.AllocateHostBuffer(stride * options.buffers, options.numa_node, options.huge_pages);
  if (!slab.ok()) return Annotate(slab.status(), who);

  auto state = std::make_shared<internal::HostBufferPoolState>();
  state->options = std::move(options);
  state->slab = std::move(*slab);
  {
    MutexLock lock(state->mu);  // nobody else sees the state yet: the lock is for the analysis
    HostBufferPoolStats& st = state->stats;
    st.capacity = state->options.buffers;
    st.buffer_bytes = state->options.buffer_bytes;
    st.stride = stride;
    st.slab_bytes = state->slab.mapped();
    st.numa_node = state->slab.numa_node();
    st.huge_pages = state->slab.huge_pages();
    if (HostMemoryPinner* pinner = state->options.pinner) {
      Status pinned = pinner->Pin(state->slab.data(), state->slab.mapped());
      st.pinned = state->pinned = pinned.ok();
      if (!pinned.ok()) {
        spdlog::warn("topology: {}: pinning {} bytes with {} failed; the buffers stay pageable: {}", who,
                     state->slab.mapped(), pinner->name(), std::string(pinned.message()));
      }
    }
    // Highest index at the front, so that the first acquires hand out buffers 0, 1, 2, ...
    for (size_t i = st.capacity; i-- > 0;) state->free_list.push_back(i);
  }
  return HostBufferPool(std::move(state));
}

StatusOr<PooledBuffer> HostBufferPool::Acquire(std::chrono::nanoseconds timeout) {
  internal::HostBufferPoolState& s = *state_;
  MutexLock lock(s.mu);
  if (s.free_list.empty()) {
    if (timeout > std::chrono::nanoseconds(0)) {
      ++s.stats.waits;
      const Deadline deadline = Deadline::After(timeout);
      while (s.free_list.empty() && s.freed.WaitUntil(lock, deadline)) {
      }
    }
    if (s.free_list.empty()) {
      ++s.stats.failures;
      return absl::ResourceExhaustedError(StrCat("host buffer pool '", s.options.name, "': all ", s.stats.capacity,
                                                 " buffers in use", timeout.count() > 0 ? " after waiting" : ""));
    }
  }
  PooledBuffer b;
  b.index_ = s.free_list.back();
  s.free_list.pop_back();
  b.data_ = static_cast<char*>(s.slab.data()) + b.index_ * s.stats.stride;
  b.size_ = s.stats.buffer_bytes;
  b.pool_ = state_;
  ++s.stats.acquired;
  s.stats.peak_in_use = std::max(s.stats.peak_in_use, ++s.stats.in_use);
  return b;
}

HostBufferPoolStats HostBufferPool::stats() const {
  MutexLock lock(state_->mu);
  return state_->stats;
}

const void* HostBufferPool::slab() const { return state_->slab.data(); }
const std::string& HostBufferPool::name() const { return state_->options.name; }

}  // namespace vigil::topology
