// The replication channel in a build without gRPC (channel.cc is the real one).
#include "vigil/replication/channel.h"

namespace vigil::replication {
namespace {
Status NoGrpc() {
  return absl::UnimplementedError(
      "replication channel: this vigil was built without gRPC (VIGIL_WITH_GRPC; Debian libgrpc++-dev "
      "protobuf-compiler-grpc)");
}
}  // namespace

StatusOr<std::unique_ptr<PrimaryChannel>> PrimaryChannel::Start(PrimaryChannelOptions) { return NoGrpc(); }
StatusOr<std::unique_ptr<StandbyChannel>> StandbyChannel::Pair(StandbyChannelOptions, std::chrono::milliseconds) {
  return NoGrpc();
}

}  // namespace vigil::replication
