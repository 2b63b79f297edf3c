// vigil/pipeline/edge.h — the edge pipeline behind `vigil edge --config edge.yaml`.
//
// Data flow (docs/architecture.md): one video::StreamReader per stream (files block, live sources drop the oldest
// frame) → a feeder thread per stream (both stream_ingest.h) pushes frames into the WorkerPool (workers.h; loaded
// by worker_setup.h): the cross-stream Batcher of the stream's device (a queue per stream, batches of up to
// max_batch taken round-robin with a max_wait_ms deadline: fair when the engine is the bottleneck) → model.workers
// Detectors per device, each on its own thread → the pool's sink thread (detection_sink.h) hands each frame's
// detections, in order per stream, to the stream ledger (ledger.h), which applies the stream's rules and queues an
// event report or a progress mark (coalesced, flushed at least every progress_flush_ms) in its outbox → a
// transport::Courier drains the outbox over the configured links (transport.links: tcp). The rules, the
// ledger and the links never hold a worker: the GPU goes on with the next batch.
// So every frame the ledger numbers is reported once per (edge, stream, run, seq) — as an event, a progress
// mark, a drop mark (queue_full / detect_error / backpressure / shutdown) or, after a crash, as
// lost_on_restart; the aggregator de-duplicates re-sends.
//
// Start-up: the state_dir is locked (a second edge on it fails with FailedPrecondition), the streams are
// opened, and the edge waits for the aggregator to admit it (Welcome: the epoch granted to this instance;
// new runs take it as their id) before any stream is read. Identity and resume follow the ledger
// (ledger.h): a file resumes after the acknowledged cursor, a live source after the larger of its
// high-water mark and the aggregator's highest stored seq.
// Fencing: when the aggregator admits a newer instance of this edge id, this one is told (courier.h), stops
// publishing and reading, and Run returns Aborted ("fenced: …"; `vigil edge` exits 3).
//
// Failure isolation: a stream that cannot open or fails mid-way is logged and counted
// (vigil_edge_stream_errors_total) and ends; the others go on. Run returns when every stream has
// ended (a network source never ends by itself) or `stop` became true; it then flushes pending marks
// and waits up to shutdown_timeout for the aggregator's acks, persisting the cursors.
//
// Metrics (registry; names are the contract):
//   vigil_edge_stage_seconds{stage=...}   histograms, one observation per processed frame (publish: per report)
//     decode: the frame's video::Frame::decode_ns (decoder + conversion to BGR, on its reader thread);
//     queue: frame released by its Source → its batch starts;
//     preprocess / inference / postprocess: detect::DetectTiming of the frame (its letterbox; the engine run
//       of its chunk, i.e. the latency it waited, shared by the chunk; its decoding + NMS + mapping back);
//     rules: its StreamLedger::Record call (rules + queuing); publish: the same call when it queued a message
//       (a file stream's call waits while the outbox is full);
//     frame_to_ack: frame released → the aggregator acknowledged it, i.e. stored it (acks are polled every
//       ~100 ms, so this over-states by up to that; the aggregator's own frame_to_stored is exact).
//   vigil_edge_frame_to_detection_seconds   histogram, one observation per processed frame: released by its
//     Source → its detections ready (queue + preprocess + inference + postprocess; what `vigil bench streams`
//     reports as frame→detection), the edge's counterpart of the aggregator's frame_to_stored.
//   vigil_edge_engine_busy_seconds_total   time the engines spent in runs (each run once, however many frames;
//     summed over the workers, which may run at once): ÷ vigil_edge_frames_total = inference time per frame.
//   vigil_edge_batch_frames   histogram: frames per batch a worker ran (le 1, 2, 4, …, 256)
//   vigil_edge_frames_total{stream}, vigil_edge_events_total{stream,severity}, vigil_edge_fps{stream}
//   vigil_edge_queue_depth{queue=reader|batcher|outbox[,stream]}   gauges
//   vigil_edge_frames_dropped_total{stream,reason=queue_full|detect_error|backpressure|shutdown}
//     (queue_full: a live reader dropped it; backpressure: a live stream found the outbox full; each travels
//     as a drop mark, so it is not a gap), vigil_edge_frames_lost_on_restart_total{stream},
//   vigil_edge_epoch (granted epoch), vigil_edge_fenced (1 once fenced), vigil_edge_reports_rejected_total,
//   vigil_edge_decode_errors_total{stream}, vigil_edge_reconnects_total{stream},
//   vigil_edge_stream_errors_total{stream}, vigil_edge_streams_active, vigil_edge_aggregator_connected,
//   vigil_edge_stalls_total (no frame processed for 10 s while streams were active: each logged once with the
//   readers', batcher's, outbox's and link's state)
// Counters and gauges sampled from other modules (reader stats, outbox) are updated every ~100 ms.
// Placement (placement.h): the streams' decode and feeder threads and the inference thread are planned on
// the machine's NUMA nodes and bound at start (placement: in the config; DISABLE_NUMA_BIND=1 turns it
// off); GET /api/placement and <state_dir>/placement.json give the PlacementReport `vigil topo --check`
// reads; RegisterNumaMetrics adds vigil_process_numa_memory_bytes, vigil_numastat_pages_total and
// vigil_thread_cpu_seconds_total (it hooks the registry: use a fresh registry per RunEdge).
//
// Thread-safety: Run from one thread; `stop` may be set from any thread (a signal handler sets an atomic).
// Errors: Run returns the model's Load error, a state dir error (FailedPrecondition when another edge holds
// it), a bad rules option, FailedPrecondition when none of the configured streams could be opened, Aborted
// when fenced; the failure of some streams
// (at open, or later) is not an error of Run: it is logged and counted in vigil_edge_stream_errors_total.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>

#include "vigil/common/status.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/transport/link.h"
#include "vigil/pipeline/workers.h"
#include "vigil/transport/protocol.h"

namespace vigil::pipeline {

struct EdgeRunOptions {
  std::chrono::milliseconds shutdown_timeout{10000};  // wait for acks at the end. Default: 10 s
  // Called once the pipeline runs, with the bound HTTP port (0 when off).
  std::function<void(uint16_t http_port)> on_started;
  // Called for every batch whose detections are ready, on the pool's sink thread, before its frames go to
  // the ledger (batches in the order they were taken; pixels already released). `vigil bench streams`
  // takes its exact frame→detection latencies here. Must be quick: it holds up the sink.
  std::function<void(const BatchResult& batch)> on_detected;
  // Called for every acknowledgement of a report (the aggregator committed seq_first..seq_last of its
  // stream), on the courier's reader thread. Must be quick.
  std::function<void(const transport::Ack& ack)> on_acked;
  // Called once the model is loaded and before the state_dir is opened; a non-OK status ends Run with it. A
  // hot standby waits here for its primary to fail (RunEdge with `replication: {role: standby}`): before the
  // call every worker's engine has run one batch, and the HTTP server (http_port) is up — /healthz answers
  // {"status": "standby"} and /metrics the standby's role and counters until the pipeline publishes.
  std::function<Status()> after_load;
};

// The WorkerPool the edge runs for `config` (model_path, detector options, devices, batching, stream →
// device by AssignStreamDevices): workers per device model.workers, else 2 when every device is a GPU and 1
// otherwise; a model whose batch is symbolic (`symbolic_batch()` says so; asked only on GPUs with model.batch
// 0 and max_batch > 1) gets engine batch max_batch there (one engine run per cross-stream batch) and stays
// at 1 on the CPU (padding a partial batch costs in proportion there); on the CPU with threads 0 and several
// workers each takes cores / workers threads. Reads no file itself.
WorkerPoolOptions EdgeWorkerOptions(const EdgeConfig& config, const std::function<bool()>& symbolic_batch, int cores);

// The links of config.links, in that order: tcp to the aggregator (TLS when transport.tls is set), ucx to
// transport.ucx (default: the aggregator's host, port 7402). Each proves the key of transport.key_file, or
// of the environment's VIGIL_EDGE_KEY (hex) when no file is named; with neither, the links carry no proof
// (logged: only an aggregator without authentication admits such an edge). Nothing connects here.
// Errors: NotFound / InvalidArgument naming the key or certificate file and the reason; Unimplemented for
// ucx in a build without UCX.
StatusOr<std::vector<std::shared_ptr<transport::Link>>> MakeEdgeLinks(const EdgeConfig& config);

// Runs the edge. With `replication:` (edge_config.h): a primary also serves the replication channel and
// mirrors its ledger to the paired standby; a standby loads its model, pairs with the primary, mirrors its
// ledger, and runs as the edge once the primary is judged gone (a stop before that returns OK). Metrics:
// vigil_edge_replication_role{role} (1 on the current role), vigil_edge_takeovers_total,
// vigil_edge_takeover_seconds (the primary's last contact → the first report the new primary got stored).
// Errors as Edge's, plus the pair digest's (model file) and the channel's (TLS files, listen address, a
// primary that refuses to pair: FailedPrecondition naming what differs).
Status RunEdge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& registry,
               const EdgeRunOptions& options = {});

}  // namespace vigil::pipeline
