// Shared memory of the same-host rings (transport/ring.h SharedMemory): the names carry the creator's pid, and the
// objects of a creator that is gone (killed mid-handshake, before it unlinked) are removed; a live process's are
// not.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "transport/ring.h"

namespace vigil::transport::ring {
namespace {

bool Exists(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

void Make(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name;
  ::close(fd);
}

// A pid that was a process of ours and is gone now (reaped).
pid_t DeadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(SharedMemory, AGoneCreatorsObjectsAreRemovedALiveOnesKept) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  StatusOr<std::unique_ptr<SharedMemory>> mine = SharedMemory::Create("test", 4096);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ((*mine)->name().rfind("/vigil-" + pid + "-", 0), 0u) << (*mine)->name();
  const std::string dead = "/vigil-" + std::to_string(DeadPid()) + "-0123456789ab-frames";
  const std::string other = "/vigil-0123456789ab-frames-" + pid;  // an older vigil's name: no pid first
  Make(dead);
  Make(other);
  ASSERT_TRUE(Exists(dead));
  EXPECT_GE(SharedMemory::RemoveStale(), 1);
  EXPECT_FALSE(Exists(dead));
  EXPECT_TRUE(Exists((*mine)->name()));  // this process is alive
  EXPECT_TRUE(Exists(other));
  ::shm_unlink(other.c_str());
}

}  // namespace
}  // namespace vigil::transport::ring
