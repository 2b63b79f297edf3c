// vigil/pipeline/edge_config.h — edge.yaml, the configuration of `vigil edge`.
//
//   edge: cam-host-1                 # edge id (required)
//   aggregator: 127.0.0.1:7400       # host:port (required)
//   model: {path: m.onnx, conf: 0.25, iou: 0.7, max_det: 300, threads: 2, batch: 1,
//           device: cpu | cuda:N | [cuda:0, cuda:1],   # a list: workers on each, streams spread over them
//           workers: 0,                                  # Detectors per device; 0 = 2 on GPUs, 1 on the CPU
//                                                        # (CPU, threads 0: cores split between them)
//           precision: fp32 | fp16}
//   batching: {max_batch: 4, max_wait_ms: 10}
//   http_port: 0                     # /healthz and /metrics on 127.0.0.1; 0 = off
//   http_host: 127.0.0.1
//   http_allow: [10.0.0.0/8]         # addresses that may use it (CIDR); default: any
//   http_token_file: token           # a bearer token every request but /healthz must carry (or the
//                                    # environment's VIGIL_HTTP_TOKEN); default: none
//   http_tls: {cert_file: c.pem, key_file: k.pem}   # HTTPS; default: off
//   state_dir: ./vigil-edge-state    # the stream ledger's runs, cursors and high-water marks; locked by
//                                    # one edge process at a time
//   progress_flush_ms: 500           # pending progress and drop marks are published at least this often
//   transport:
//     links: [ucx, tcp]              # links to the aggregator in order of preference: tcp, ucx, cuda_ipc.
//                                    # Default: [tcp]
//     ucx: host:port                 # the aggregator's ucx_listen; default: the aggregator's host, port 7402
//     cuda_ipc: /run/vigil/agg.sock  # the aggregator's cuda_ipc socket (same host); required with that link
//     cuda_ipc_linger_us: 200        # a GPU ring's publisher kernel stays resident this long after the last
//                                    # report (no launch per report while they keep coming); 0: a launch
//                                    # per slot. 0..100000
//     key_file: /etc/vigil/edge.key  # this edge's pre-shared key (hex), or the environment's VIGIL_EDGE_KEY;
//                                    # with it the aggregator must prove it knows the key too. Default: none
//     tls: {ca_file: ca.pem,         # TLS on the tcp link: the CA the aggregator's certificate chains to,
//           cert_file: c.pem, key_file: k.pem,   # a client certificate (mutual TLS), optional
//           server_name: agg.example}            # the name to verify; default: the aggregator's host
//     probe_interval_ms: 1000        # on a fallback link, try the preferred ones this often
//     ack_timeout_ms: 15000          # a report unacknowledged this long: the session is replaced, re-sent
//     max_outbox: 4096               # reports held until the aggregator acknowledges them
//   placement:                       # threads on the cores of their NUMA node (docs/architecture.md)
//     bind: true                     # false (or DISABLE_NUMA_BIND=1 in the environment): no binding
//     bind_single_numa: false        # bind also on a machine with a single NUMA node
//     topology: machine.xml          # plan with this hwloc XML instead of this machine; binding is then off
//     gflop_per_frame: 8.7           # model cost per frame; 0 = counted from the model (2 x multiply-adds)
//   replication:                     # hot standby (issue 16); absent = a lone edge
//     role: primary | standby        # the role to start in; the same edge id, model, streams and rules on
//                                    # both nodes (pair digest)
//     listen: 0.0.0.0:7420           # this node's replication channel, served while it is the primary
//     peer: gpu-b.local:7420         # the other node's channel (required)
//     node: gpu-a                    # this side's name in logs and the other side's messages; default: edge id
//     tls: {cert_file: node.pem, key_file: node.key, ca_file: pair-ca.pem}   # mutual TLS, required: both
//                                    # certificates signed by ca_file, serverAuth + clientAuth, and a
//                                    # subjectAltName naming this node's host as `peer` names it (IP or DNS)
//     heartbeat_ms: 500              # standby → primary heartbeats (answered at once)
//     detector: {kind: fixed, misses: 3}          # suspect after misses × heartbeat_ms of silence, or
//               {kind: phi, threshold: 8, min_std_dev_ms: 50, acceptable_pause_ms: 0}   # φ accrual
//     step_down: {stall_ms: 3000, errors: 3}       # the primary's own health: it hands over to its paired
//                                    # standby at once when no inference batch completed for stall_ms while
//                                    # frames wait for one, or when `errors` batches in a row failed (a CUDA
//                                    # error is sticky: every later batch fails). 0 turns either off
//     The channel's end (the primary's process gone) is a takeover at once; silence only when the
//     detector suspects. The standby keeps the primary's ledger records in its own state_dir and, on
//     takeover, runs as the edge from there (files continue at the aggregator's cursor; a live source's
//     frames numbered by the dead primary and never stored are reported as lost_on_restart), serving the
//     channel on `listen`. A node started as primary first asks its peer: when the peer is the primary
//     (it took over while this node was down), this node starts as its standby. A primary fenced by the
//     aggregator (its peer took over while it was paused or cut off) rejoins as the standby.
//   hwaccel: cuda                    # default of the streams' hwaccel (below); Default: cpu
//   streams:
//     - id: door                     # unique, required
//       source: /videos/door.mp4     # file path, URL, folder or glob (required)
//       hwaccel: cuda:1              # decode on: cpu, cuda (= cuda:0) or cuda:N (NVDEC on NVIDIA GPU N);
//                                    # falls back to the CPU with a warning where the GPU cannot decode
//                                    # the stream (video/source.h); image folders ignore it
//       realtime: false
//       loop: false
//       target_fps: 0                # 0 = every frame
//       save_frames: ""              # debug: a folder; every processed frame's decoded pixels go there as
//                                    # <seq>.npy (uint8 [height, width, 3], BGR, seq zero-padded to 6
//                                    # digits): what the detector saw. One file write per frame: slow.
//       rules:
//         classes: [person, 2]       # allow-list: class names or ids; absent/empty = every class
//         min_score: 0.5
//         roi: [[[0,0],[640,0],[640,480]]]   # polygons in source pixels; a box counts if its centre is inside one
//         confirm: {k: 2, m: 3}      # an event needs a qualifying frame in k of the last m frames
//         cooldown_s: 0              # after an event, no new event for this long (stream time)
//         severity: {critical: 0.9, warning: 0.5, info: 0}  # by the best qualifying score
//       placement: {width: 1920, height: 1080, fps: 25}   # what the planner assumes; default: probed
//                                    # from a file at open, else 1920x1080 at 25 fps (network sources)
//
// Validation (common/config.h): an unknown key, a wrong type or an impossible value is an error
// naming the file, line:column and key path; all problems are reported at once.
// Thread-safety: plain values; the functions are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/video/snapshot.h"

namespace vigil::pipeline {

struct Point {
  double x = 0, y = 0;  // source pixels
};
using Polygon = std::vector<Point>;  // >= 3 vertices, in order (either orientation)

struct RulesConfig {
  std::vector<std::string> classes;  // names or decimal ids; empty = all classes
  double min_score = 0.0;            // [0, 1]
  std::vector<Polygon> roi;          // empty = the whole picture
  int confirm_k = 1, confirm_m = 1;  // 1 <= k <= m <= 1000
  double cooldown_s = 0;             // >= 0
  // Severity by the best qualifying score: >= critical → critical, >= warning → warning, else info.
  double critical = 2.0, warning = 2.0;  // > 1 = never (Default)
};

// snapshots: an event's pictures as JPEG, sent to the aggregator beside the event (protocol.h Snapshot) and
// shown by its dashboard. Given at the top level (every stream's default) and per stream (overrides the keys
// it names): {enabled: true, frame: true, max_width: 640, crops: false, crop_margin: 0.15, crop_max_side: 320,
// quality: 80}. Encoded on a thread of their own, off the inference path (video/snapshot.h).
struct SnapshotConfig {
  bool enabled = false;             // Default: off
  video::SnapshotOptions options;   // frame, max_width (frame_max_width), crops, crop_margin, crop_max_side, quality
};

struct StreamConfig {
  std::string id;
  std::string source;
  bool realtime = false;
  bool loop = false;
  double target_fps = 0;
  std::string hwaccel;      // video::SourceOptions::hwaccel: "" or "cpu", "cuda", "cuda:N"
  std::string save_frames;  // "" = off
  RulesConfig rules;
  int width = 0, height = 0;  // placement: frame size in pixels, 1..16384; 0 = probed / default
  double fps = 0;             // placement: frames per second, (0, 1000]; 0 = probed / default
  SnapshotConfig snapshots;   // the top level's `snapshots`, with this stream's overrides
};

struct PlacementConfig {
  bool bind = true;               // Default: true
  bool bind_single_numa = false;  // Default: false
  std::string topology;           // hwloc XML file; "" = this machine. Default: ""
  double gflop_per_frame = 0;     // >= 0; 0 = counted from the model. Default: 0
};

struct ReplicationConfig {
  enum class Role { kNone, kPrimary, kStandby };
  Role role = Role::kNone;  // kNone: no replication section
  std::string listen = "0.0.0.0:7420";  // this node's channel while it is the primary
  std::string peer;                      // host:port of the other node's channel (required)
  std::string node;                      // default: the edge id
  std::string cert_file, key_file, ca_file;
  int heartbeat_ms = 500;                // 10..60000
  bool phi = false;                      // detector.kind phi (else fixed)
  int misses = 3;                        // fixed: 1..100
  double phi_threshold = 8;              // phi: (0, 100]
  int min_std_dev_ms = 50;               // phi: 1..60000
  int acceptable_pause_ms = 0;           // phi: 0..600000
  int step_down_stall_ms = 3000;         // step_down.stall_ms: 0 (never) or 100..600000
  int step_down_errors = 3;              // step_down.errors: 0 (never) or 1..1000
  // What a standby reads while it waits (standby_gate.h). kFiles (default): replayable streams (files, image
  // folders) up to the mirrored cursor, so the takeover resumes there instead of decoding from the start;
  // kAll: also every camera, each picture discarded, so its connection is up at the takeover (only for cameras
  // that serve two clients: a one-client camera would refuse the primary or the standby); kNone: nothing
  // before the takeover.
  enum class WarmSources { kNone, kFiles, kAll };
  WarmSources warm_sources = WarmSources::kFiles;
  // mirror_frames: live (default where vigil has libturbojpeg) — the primary sends every live picture it numbers
  // to the paired standby as a JPEG of jpeg_quality (1..100), and the standby keeps up to mirror_window (per
  // stream, 1..100000) that the aggregator has not acknowledged, to process again at a takeover
  // (pipeline/mirror_window.h) instead of reporting them lost; none — nothing mirrored (files need nothing:
  // they are read again from the cursor). Costs the primary one JPEG encode per live picture, on its reader
  // thread, also while no standby is paired (the channel keeps the unacknowledged ones for a standby that pairs
  // later), and memory for up to mirror_window pictures per live stream on each side.
  bool mirror_frames = true;
  // mirror_results (with mirror_frames: live; default true): the primary also sends each processed live
  // picture's detections over the channel (small: ≤ max_det rows of 24 bytes), and a takeover re-publishes the
  // primary's own results for the pictures whose detections arrived instead of processing them again
  // (replication/channel.h "Result mirroring"); false: every unstored picture is processed again.
  bool mirror_results = true;
  int jpeg_quality = 85;
  int mirror_window = 256;
  // mirror_via: channel (default) — the JPEGs above over the replication channel, to a standby on any host;
  // shm — a standby on the same host maps a ring of raw pictures (replication/frame_ring.h): the primary copies
  // each live picture's BGR pixels into it (no JPEG encode; a GPU-decoded picture is downloaded first) and the
  // standby keeps them raw (mirror_window pictures per stream of width × height × 3 bytes each: size it for
  // that). The standby owns the ring: mirror_slots (2..4096; default auto: two per stream, at least 8 — two
  // frame intervals of every camera, so a standby whose GPU copies wait behind the primary's work still keeps up)
  // slots of mirror_slot_mb (1..1024) MiB, a slot per picture; a picture larger than a slot, or one that finds
  // every slot unread, is not mirrored (counted,
  // vigil_edge_mirror_frames_skipped_total). The primary serves the ring's Unix socket at mirror_socket
  // (default <state_dir>/frames.sock, made absolute), offered to each paired standby with a fresh token over
  // the channel's TLS; while no ring is mapped (the standby on another host, or not yet connected) pictures
  // go over the channel as JPEGs.
  enum class MirrorVia { kChannel, kShm };
  MirrorVia mirror_via = MirrorVia::kChannel;
  // mirror_memory (the standby's): host, or cuda:N — the ring's pixels in GPU N's memory (CUDA IPC): the primary
  // copies a GPU-decoded (NVDEC) picture into it device to device as NV12 (no download, no host copy; 3 MiB at
  // 1080p), a CPU-decoded one as BGR; the standby keeps NV12 pictures on that GPU and processes them there at a
  // takeover. Needs both processes on one host with the GPU visible to both (peer access for two GPUs).
  std::string mirror_socket;
  int mirror_slots = 0;  // 0: auto — 2 per stream, 8..4096 (MirrorSlotsFor)
  int mirror_slot_mb = 8;
  std::string mirror_memory = "host";
};

struct EdgeConfig {
  std::string edge;
  std::string aggregator_host;
  uint16_t aggregator_port = 0;
  std::string model_path;
  double conf = 0.25, iou = -1;  // iou < 0: the model family's default
  int max_det = 300;
  int threads = 0;               // 0 = all cores
  // Engine devices, distinct: "cpu" or "cuda:N" (CUDA backend builds; "cuda" reads as "cuda:0"). Stream i
  // runs on the device its hwaccel names when that is one of them, else on devices[i mod size].
  std::vector<std::string> devices = {"cpu"};
  // model.workers: Detectors per device, 0..64; 0 = 2 when every device is a GPU, else 1. On the CPU with
  // threads 0 each worker takes cores / workers threads; `workers: 2, threads: 1` on 2 cores runs two
  // single-threaded engines, more frames per second than one on both cores (docs/benchmarks.md) at twice
  // the per-frame latency.
  int workers_per_device = 0;
  std::string precision = "fp32";  // CUDA compute precision: "fp32" or "fp16"
  // int8-dynamic models: "quantized" (as exported, ONNX Runtime's results) or "float" (EngineOptions::int8_activations)
  std::string int8_activations = "quantized";
  int model_batch = 0;           // model.batch: engine batch, 0..256; 0 = the model's fixed batch; a symbolic
                                 // batch: max_batch on GPUs (one engine run per cross-stream batch), 1 on the CPU
  int max_batch = 1;             // cross-stream batch, 1..256
  int max_wait_ms = 0;           // 0..10000
  std::string http_host = "127.0.0.1";
  uint16_t http_port = 0;
  std::string state_dir = "vigil-edge-state";
  int progress_flush_ms = 500;   // 1..60000
  std::vector<std::string> http_allow;        // CIDRs; empty = any
  std::string http_token_file;                // "" = VIGIL_HTTP_TOKEN or none
  std::string http_cert_file, http_key_file;  // http_tls
  std::vector<std::string> links = {"tcp"};  // transport.links, in order of preference: "tcp", "ucx"
  std::string ucx_host;                      // transport.ucx; "" = aggregator_host
  uint16_t ucx_port = 7402;
  std::string cuda_ipc_socket;               // transport.cuda_ipc: the aggregator's Unix socket
  int cuda_ipc_linger_us = 200;              // transport.cuda_ipc_linger_us (LinkOptions::ring_linger_us)
  std::string key_file;                      // transport.key_file; "" = VIGIL_EDGE_KEY or none
  bool tls = false;                          // transport.tls given
  std::string tls_ca_file, tls_cert_file, tls_key_file, tls_server_name;
  int probe_interval_ms = 1000;              // transport.probe_interval_ms, 10..600000
  int ack_timeout_ms = 15000;                // transport.ack_timeout_ms, 100..3600000
  int max_outbox = 4096;         // transport.max_outbox, 1..10^7
  PlacementConfig placement;
  ReplicationConfig replication;
  std::vector<StreamConfig> streams;  // at least one, ids unique
  // snapshots.queue (top level only): events waiting for their pictures to be encoded, 1..1024; an event that
  // finds it full gets none (counted). Default: 16
  int snapshot_queue = 16;
};

// What a primary and its standby must agree on (replication/pair.h PairInputs): the model file, the
// detection settings (conf, iou, max_det, precision, batch), each stream's id, source and how it is read
// (realtime, loop, target_fps), and each stream's rules — in config order. Role, addresses, node names,
// devices, threads, links and the state_dir are not part of it (the two may differ there). Canonical text:
// numbers printed exactly, lists in order.
struct PairTexts {
  std::string model_path;
  std::string settings;
  std::vector<std::string> streams, rules;
};
PairTexts PairTextsOf(const EdgeConfig& config);

// CUDA ordinal of an engine device as EdgeConfig::devices holds it: "cuda:N" → N; -1 otherwise ("cpu").
int CudaOrdinal(const std::string& device);

// Where each stream (config order) is detected and decoded: stream i runs on the device its hwaccel names
// explicitly ("cuda:N" when that is one of config.devices), else on devices[i mod D]; an unnumbered
// hwaccel "cuda" becomes the GPU of the stream's device (so NVDEC frames stay where they are detected).
struct StreamDevice {
  size_t device = 0;    // index into config.devices
  std::string hwaccel;  // what the stream's Source is asked to decode on
};
std::vector<StreamDevice> AssignStreamDevices(const EdgeConfig& config);

// The standby's picture ring slots: replication.mirror_slots when set, else two per stream, 8..4096.
int MirrorSlotsFor(const EdgeConfig& config);

// Errors: NotFound (unreadable file), InvalidArgument listing each bad key with line:column.
StatusOr<EdgeConfig> LoadEdgeConfig(const std::string& path);
StatusOr<EdgeConfig> ParseEdgeConfig(std::string_view yaml, const std::string& name);

}  // namespace vigil::pipeline
