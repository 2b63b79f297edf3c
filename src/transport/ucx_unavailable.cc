// ucx.h for a build without UCX (VIGIL_WITH_UCX=OFF, or Debian libucx-dev missing): everything fails
// with Unimplemented, so a config naming the "ucx" link kind fails with a clear error.
#include "vigil/transport/ucx.h"

namespace vigil::transport {
namespace {

Status NoUcx() { return absl::UnimplementedError("vigil was built without UCX (Debian libucx-dev)"); }

class NoUcxDialer final : public Dialer {
 public:
  NoUcxDialer(std::string host, uint16_t port) : target_(StrCat("ucx://", host, ":", port)) {}
  StatusOr<std::unique_ptr<Connection>> Dial(std::chrono::milliseconds) override { return NoUcx(); }
  std::string target() const override { return target_; }

 private:
  const std::string target_;
};

}  // namespace

std::unique_ptr<Dialer> MakeUcxDialer(std::string host, uint16_t port, UcxOptions) {
  return std::make_unique<NoUcxDialer>(std::move(host), port);
}

StatusOr<std::unique_ptr<Listener>> UcxListen(const std::string&, uint16_t, UcxOptions) { return NoUcx(); }

UcxCounters GetUcxCounters() { return {}; }

void PrepareUcxEnvironment() {}

}  // namespace vigil::transport
