// vigil/infer/cuda_device.h — CUDA device discovery (ordinal, name, PCI bus id, compute capability, memory).
// Thread-safety: thread-safe (the CUDA runtime serialises these calls). Errors: a machine without
// a driver or GPU reports zero devices and the runtime's error string, never a crash.
#pragma once

#include <string>
#include <vector>

namespace vigil::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string pci_bus_id;     // "0000:17:00.0", the key topology code matches GPUs by
  int compute_major = 0, compute_minor = 0;
  size_t total_memory_bytes = 0;
};

// Visible CUDA devices; empty with `*error` set when the runtime reports none.
std::vector<DeviceInfo> ListDevices(std::string* error);

// cudaProfilerStart / cudaProfilerStop: the range that `ncu --profile-from-start off` and
// `nsys profile --capture-range=cudaProfilerApi` record. Errors are the runtime's string ("" on success).
std::string ProfilerStart();
std::string ProfilerStop();

}  // namespace vigil::cuda
