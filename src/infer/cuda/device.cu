#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "vigil/infer/cuda_device.h"

namespace vigil::cuda {

std::vector<DeviceInfo> ListDevices(std::string* error) {
  std::vector<DeviceInfo> out;
  int count = 0;
  cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    if (error) *error = cudaGetErrorString(st);
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    char bus[32] = {};
    cudaDeviceGetPCIBusId(bus, sizeof(bus), i);
    out.push_back({i, prop.name, bus, prop.major, prop.minor, prop.totalGlobalMem});
  }
  return out;
}

std::string ProfilerStart() {
  const cudaError_t st = cudaProfilerStart();
  return st == cudaSuccess ? std::string() : cudaGetErrorString(st);
}

std::string ProfilerStop() {
  const cudaError_t st = cudaProfilerStop();
  return st == cudaSuccess ? std::string() : cudaGetErrorString(st);
}

}  // namespace vigil::cuda
