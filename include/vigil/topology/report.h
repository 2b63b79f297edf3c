// vigil/topology/report.h — what `vigil topo` prints: the nvidia-smi-style matrix, JSON, Kubernetes
// node labels, and a plan.
//
// Thread-safety: pure functions over values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vigil/topology/planner.h"
#include "vigil/topology/topology.h"

namespace vigil::topology {

// Summary (packages, NUMA nodes with memory and PUs, allowed cpuset), the GPU × (GPU, NIC) relation
// matrix with CPU affinity (allowed PUs of the GPU's locality), NUMA node and nearest NIC per GPU,
// GPU and NIC lists, a legend of the codes and the discovery notes.
std::string FormatTopologyText(const Topology& topo);
// The plan as a table: device, streams, load/capacity, NUMA node, worker/decode PUs, threads,
// staging bytes, NIC; then its notes.
std::string FormatPlanText(const Topology& topo, const Plan& plan);
// {"topology": {...}} and, when `plan` is given, "plan": {...}; 2-space indented.
std::string ToJson(const Topology& topo, const Plan* plan = nullptr);

// Kubernetes node labels "key=value" for a node-labelling DaemonSet:
//   vigil.io/gpu-count=16, vigil.io/numa-count=2, vigil.io/nic-count=1, vigil.io/nvswitch-count=12 (when > 0),
//   vigil.io/numa-0-gpus=0_1_2 (per NUMA node with GPUs; vigil GPU indexes, '_'-separated, as
//   ranges "0-15" when the list would exceed 63 characters), vigil.io/gpu-0-numa=0 (per GPU; "0_1"
//   for several nodes, "unknown"), vigil.io/gpu-0-nic=mlx5_0 (per GPU, when a NIC exists).
std::vector<std::string> KubernetesLabels(const Topology& topo);
// Kubernetes syntax (k8s.io/apimachinery validation, IsQualifiedName / IsValidLabelValue): a value is
// empty or ≤ 63 characters of [A-Za-z0-9._-] beginning and ending with [A-Za-z0-9]; a key is an
// optional DNS-subdomain prefix (≤ 253 characters, lower case) and '/', then a name with the
// value's rules that is not empty.
bool IsValidLabelValue(std::string_view value);
bool IsValidLabelKey(std::string_view key);

}  // namespace vigil::topology
