// aggregator/association.h without CUDA: no device Associator (the host's associates).
#include "vigil/aggregator/association.h"

namespace vigil::aggregator {

StatusOr<std::unique_ptr<Associator>> MakeDeviceAssociator(DeviceAssociatorOptions options) {
  return absl::UnimplementedError(
      StrCat("association on cuda:", options.device, ": this vigil was built without CUDA (VIGIL_WITH_CUDA=OFF)"));
}

}  // namespace vigil::aggregator
