// vigil/pipeline/edge.h — the edge pipeline behind `vigil edge --config edge.yaml`.
//
// Data flow (docs/architecture.md): one video::StreamReader per stream (files block, live sources drop
// the oldest frame) → a feeder thread per stream pushes frames into one cross-stream Batcher → the
// inference thread takes batches (max_batch, max_wait_ms), runs detect::Detector, applies each stream's
// RuleEngine → a frame that raises an event is published as an event report, every other frame as a
// progress mark (ProgressCoalescer, flushed at least every progress_flush_ms) → transport::Publisher.
// So every processed frame is reported once per (edge, stream, run, seq); the aggregator de-duplicates
// re-sends.
//
// Identity and resume (edge_state.h): epoch = persisted counter + 1 at every start. Per stream the
// run is kept while the source stays the same; the cursor (aggregator's "0..S stored", Publisher::
// AckedThrough) is persisted whenever it advances, and a restarted edge opens the stream with
// start_after_seq = cursor (same run). A stream without state, or whose source changed, starts a new
// run (run = this epoch) from seq 0.
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
//     rules: its RuleEngine::Evaluate; publish: one Publisher::Publish call (waits while the outbox is full);
//     frame_to_ack: frame released → the aggregator acknowledged it, i.e. stored it (acks are polled every
//       ~100 ms, so this over-states by up to that; the aggregator's own frame_to_stored is exact).
//   vigil_edge_engine_busy_seconds_total   time the engine spent in runs (each run once, however many frames):
//     ÷ vigil_edge_frames_total = inference time per frame; its rate = the engine's utilisation.
//   vigil_edge_frames_total{stream}, vigil_edge_events_total{stream,severity}, vigil_edge_fps{stream}
//   vigil_edge_queue_depth{queue=reader|batcher|outbox[,stream]}   gauges
//   vigil_edge_frames_dropped_total{stream,reason=queue_full|backpressure|publish_error|detect_error}
//     (queue_full: a live reader dropped it; backpressure: the outbox stayed full; both leave a gap),
//   vigil_edge_decode_errors_total{stream}, vigil_edge_reconnects_total{stream},
//   vigil_edge_stream_errors_total{stream}, vigil_edge_streams_active, vigil_edge_aggregator_connected
// Counters and gauges sampled from other modules (reader stats, outbox) are updated every ~100 ms.
// Placement (placement.h): the streams' decode and feeder threads and the inference thread are planned on
// the machine's NUMA nodes and bound at start (placement: in the config; DISABLE_NUMA_BIND=1 turns it
// off); GET /api/placement and <state_dir>/placement.json give the PlacementReport `vigil topo --check`
// reads; RegisterNumaMetrics adds vigil_process_numa_memory_bytes, vigil_numastat_pages_total and
// vigil_thread_cpu_seconds_total (it hooks the registry: use a fresh registry per RunEdge).
//
// Thread-safety: Run from one thread; `stop` may be set from any thread (a signal handler sets an atomic).
// Errors: Run returns the model's Load error, a state dir error, a bad publisher/rules option, or
// FailedPrecondition when none of the configured streams could be opened; the failure of some streams
// (at open, or later) is not an error of Run: it is logged and counted in vigil_edge_stream_errors_total.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>

#include "vigil/common/status.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge_config.h"

namespace vigil::pipeline {

struct EdgeRunOptions {
  std::chrono::milliseconds shutdown_timeout{10000};  // wait for acks at the end. Default: 10 s
  // Called once the pipeline runs, with the bound HTTP port (0 when off).
  std::function<void(uint16_t http_port)> on_started;
};

Status RunEdge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& registry,
               const EdgeRunOptions& options = {});

}  // namespace vigil::pipeline
