// POSIX shared memory (vigil/transport/shared_memory.h): created, opened, unlinked, stale objects swept.
#include "vigil/transport/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>

#include "vigil/transport/auth.h"

namespace vigil::transport {
namespace {

std::string RandomName(std::string_view what) {
  const Nonce n = RandomNonce();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (int i = 0; i < 12; ++i) {
    hex += kHex[n[i] >> 4];
    hex += kHex[n[i] & 15];
  }
  return StrCat("/vigil-", ::getpid(), "-", hex, "-", what);
}

}  // namespace

// The objects RandomName made for a process of this user that is gone: a creator unlinks its name once the peer
// mapped it, so only one killed between the two (mid-handshake) leaves one behind, and it would fill /dev/shm over
// many such kills. Names without a pid (an older vigil's) are left alone.
int SharedMemory::RemoveStale() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const pid_t self = ::getpid();
  int removed = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string_view n = e->d_name;
    if (n.substr(0, 6) != "vigil-") continue;
    const std::string_view rest = n.substr(6);
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string_view::npos || dash > 10 ||
        rest.substr(0, dash).find_first_not_of("0123456789") != std::string_view::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(std::string(rest.substr(0, dash))));
    if (pid <= 0 || pid == self || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to ask
    struct stat st {};
    if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != ::geteuid()) continue;
    if (::shm_unlink(StrCat("/", n).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  if (removed > 0) {
    spdlog::info("shared memory: removed {} object(s) in /dev/shm left by vigil processes of this user that are gone",
                 removed);
  }
  return removed;
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(std::string_view what, size_t bytes) {
  static std::once_flag swept;
  std::call_once(swept, [] { RemoveStale(); });
  const std::string name = RandomName(what);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(StrCat("shared memory ", name, ": shm_open: ", std::strerror(errno)));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::UnavailableError(StrCat("shared memory ", name, ": ", bytes, " bytes: ", std::strerror(err)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return absl::UnavailableError(StrCat("shared memory ", name, ": mmap: ", std::strerror(err)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, static_cast<char*>(p), bytes, true));
}

StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& name, size_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200) {
    return absl::InvalidArgumentError(StrCat("shared memory name '", name.substr(0, 200), "' is not /NAME"));
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(StrCat("shared memory ", name, ": shm_open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat("shared memory ", name, ": smaller than the ", bytes, " bytes offered"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return absl::UnavailableError(StrCat("shared memory ", name, ": mmap: ", std::strerror(err)));
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, static_cast<char*>(p), bytes, false));
}

SharedMemory::~SharedMemory() {
  Unlink();
  ::munmap(data_, bytes_);
}

void SharedMemory::Unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

}  // namespace vigil::transport
