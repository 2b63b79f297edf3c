// vigil/transport/publisher.h — the edge side: reports out, acknowledged delivery, reconnects.
//
// Publisher is the interface the edge pipeline uses; TCP is its first implementation (UCX / CUDA IPC
// links come later behind the same interface). Delivery contract:
//  - Publish() appends a report to a bounded outbox and returns at once while there is room. The
//    outbox holds every report until the aggregator acknowledges it (it is the retransmit window);
//    when it is full, Publish waits up to `wait` for room, then returns ResourceExhausted
//    ("backpressure", counted). A file source passes a long wait (it must lose nothing and may run
//    at the aggregator's pace); a live source passes 0 and drops the frame, counting it.
//  - A sender thread connects (exponential backoff with jitter between attempts), sends Hello, then
//    every unacknowledged report in publish order. After a reconnect it re-sends, in order, all that
//    is still unacknowledged, so the aggregator sees each report at least once; it stores each frame
//    once (protocol.h). An Ack frees its report; a Reject frees it too and is counted (a stale-epoch
//    reject means a newer edge instance owns the stream: `fenced` in Stats()).
//  - The publisher persists nothing. AckedThrough() gives, per (stream, run), the aggregator's
//    "every seq 0..S is stored", which the edge persists as its resume cursor.
//  - Heartbeats: the sender sends one after `heartbeat_interval` without traffic; the aggregator
//    echoes it. A connection with nothing received for `peer_timeout` is closed and redialled.
//
// Thread-safety: all methods are thread-safe. Publish may block (see above); the others do not,
// except Flush (waits up to its timeout) and Close (joins the sender thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/transport/connection.h"
#include "vigil/transport/protocol.h"

namespace vigil::transport {

struct PublisherStats {
  uint64_t published = 0;         // reports accepted by Publish
  uint64_t acked = 0;             // reports acknowledged (stored or duplicate at the aggregator)
  uint64_t rejected = 0;          // reports the aggregator refused (Reject), dropped
  uint64_t backpressure = 0;      // Publish calls that returned ResourceExhausted
  uint64_t sent = 0;              // report frames written, re-sends included
  uint64_t resent = 0;            // report frames written again after a reconnect
  uint64_t connects = 0;          // connections established
  uint64_t connect_failures = 0;  // dial attempts that failed
  uint64_t disconnects = 0;       // established connections lost (peer closed, error, timeout)
  uint64_t outbox = 0;            // reports waiting for an ack now
  bool connected = false;
  bool fenced = false;     // a stale-epoch Reject was received
  std::string last_error;  // the most recent connection error, "" if none
};

class Publisher {
 public:
  virtual ~Publisher() = default;
  // Queues `report` for delivery; the publisher stamps its own edge id and epoch on it.
  // Errors: InvalidArgument (ValidateReport fails), ResourceExhausted (outbox full after `wait`),
  // Cancelled (Close was called).
  virtual Status Publish(Report report, std::chrono::milliseconds wait) = 0;
  // The highest seq S such that the aggregator has confirmed frames 0..S of (stream, run) stored;
  // nullopt before the first such ack in this publisher's life.
  virtual std::optional<uint64_t> AckedThrough(std::string_view stream, uint64_t run) const = 0;
  // Waits until every published report is acknowledged or rejected; false if `timeout` passed first.
  virtual bool Flush(std::chrono::milliseconds timeout) = 0;
  virtual PublisherStats Stats() const = 0;
  // Stops the sender and closes the connection; unacknowledged reports are dropped (they stay
  // unacknowledged: a restarted edge re-sends from its cursor). Publish then returns Cancelled.
  virtual void Close() = 0;
};

struct TcpPublisherOptions {
  std::string edge;    // edge id, non-empty
  uint64_t epoch = 0;  // this edge instance's fencing token (changes at every start)
  std::string host;    // aggregator address
  uint16_t port = 0;
  size_t max_outbox = 4096;                         // reports held until acked. Default: 4096 (~2 min of 30 fps events)
  std::chrono::milliseconds backoff_initial{100};   // first delay between dial attempts. Default: 100 ms
  std::chrono::milliseconds backoff_max{5000};      // cap of the doubling delay. Default: 5 s
  std::chrono::milliseconds connect_timeout{2000};  // Default: 2 s
  std::chrono::milliseconds heartbeat_interval{1000};  // Default: 1 s
  std::chrono::milliseconds peer_timeout{5000};        // silence (or a blocked send) that drops a link. Default: 5 s
  std::shared_ptr<Dialer> dialer;                      // overrides host/port (tests inject faults here); null = TCP
};

// Validates the options (InvalidArgument naming the field) and starts the sender thread; it
// connects in the background, so an aggregator that is down is not an error here.
StatusOr<std::unique_ptr<Publisher>> MakeTcpPublisher(TcpPublisherOptions options);

// Exponential backoff with "equal jitter": attempt k waits uniformly in [d/2, d] with
// d = min(max, initial · 2^k) (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
// Not thread-safe.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, uint64_t seed);
  std::chrono::milliseconds Next();
  void Reset() { attempt_ = 0; }

 private:
  std::chrono::milliseconds initial_, max_;
  int attempt_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace vigil::transport
