#include "vigil/transport/publisher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace vigil::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxBatchBytes = 256 << 10;  // frames written per send call
constexpr size_t kReadBufferBytes = 64 << 10;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Waits on `cv` for `pred`, treating waits of a year or more as "forever" (now + max overflows).
template <typename Pred>
bool WaitFor(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, milliseconds wait, Pred pred) {
  if (wait >= std::chrono::hours(24 * 365)) {
    cv.wait(lock, pred);
    return true;
  }
  return cv.wait_for(lock, wait, pred);
}

class TcpPublisher final : public Publisher {
 public:
  explicit TcpPublisher(TcpPublisherOptions o) : opt_(std::move(o)) {
    dialer_ = opt_.dialer ? opt_.dialer : std::shared_ptr<Dialer>(MakeTcpDialer(opt_.host, opt_.port));
    sender_ = std::thread([this] { SenderLoop(); });
  }
  ~TcpPublisher() override { Close(); }

  Status Publish(Report report, milliseconds wait) override {
    report.edge = opt_.edge;
    report.epoch = opt_.epoch;
    VIGIL_RETURN_IF_ERROR(ValidateReport(report));
    Entry e{0, report.stream, report.run, report.seq_first, report.seq_last, EncodeFrame(report)};
    std::unique_lock lock(mu_);
    if (!WaitFor(cv_, lock, wait, [&] { return stop_ || outbox_.size() < opt_.max_outbox; })) {
      ++stats_.backpressure;
      return absl::ResourceExhaustedError(
          StrCat("publisher ", dialer_->target(), ": outbox full (", outbox_.size(), " reports unacknowledged)"));
    }
    if (stop_) return absl::CancelledError("publisher closed");
    e.id = next_id_++;
    outbox_.push_back(std::move(e));
    ++stats_.published;
    cv_.notify_all();
    return absl::OkStatus();
  }

  std::optional<uint64_t> AckedThrough(std::string_view stream, uint64_t run) const override {
    std::lock_guard lock(mu_);
    auto it = acked_through_.find({std::string(stream), run});
    if (it == acked_through_.end()) return std::nullopt;
    return it->second;
  }

  bool Flush(milliseconds timeout) override {
    std::unique_lock lock(mu_);
    return WaitFor(cv_, lock, timeout, [&] { return stop_ || outbox_.empty(); }) && outbox_.empty();
  }

  PublisherStats Stats() const override {
    std::lock_guard lock(mu_);
    PublisherStats s = stats_;
    s.outbox = outbox_.size();
    return s;
  }

  void Close() override {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      stop_ = true;
      if (live_ != nullptr) live_->Shutdown();
      cv_.notify_all();
    }
    sender_.join();
  }

 private:
  struct Entry {
    uint64_t id;  // publish order
    std::string stream;
    uint64_t run, seq_first, seq_last;
    std::string frame;  // encoded Report
    bool done = false;  // acked or rejected, waiting for the entries before it
  };

  void SenderLoop() {
    Backoff backoff(opt_.backoff_initial, opt_.backoff_max, std::random_device{}());
    bool failing = false;  // in a streak of failed dials (logged once)
    for (;;) {
      StatusOr<std::unique_ptr<Connection>> conn = dialer_->Dial(opt_.connect_timeout);
      if (conn.ok()) {
        failing = false;
        RunConnection(**conn, backoff);
      } else {
        if (!failing) {
          spdlog::warn("publisher {}: {}; retrying with backoff", opt_.edge, std::string(conn.status().message()));
        }
        failing = true;
        std::lock_guard lock(mu_);
        ++stats_.connect_failures;
        stats_.last_error = std::string(conn.status().message());
      }
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, backoff.Next(), [&] { return stop_; })) return;
    }
  }

  // Sends Hello and the outbox on `conn` until it breaks or Close is called.
  void RunConnection(Connection& conn, Backoff& backoff) {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      live_ = &conn;
      broken_ = false;
      send_id_ = outbox_.empty() ? next_id_ : outbox_.front().id;  // re-send everything unacknowledged
      ++stats_.connects;
      stats_.connected = true;
    }
    spdlog::info("publisher {}: connected to {} (epoch {})", opt_.edge, conn.peer(), opt_.epoch);
    std::atomic<bool> heard{false};
    std::thread reader([&] { ReaderLoop(conn, heard); });
    Status st = conn.Write(EncodeFrame(Hello{opt_.edge, opt_.epoch, kProtocolVersion}), opt_.peer_timeout);
    auto last_write = Clock::now();
    std::string batch;
    while (st.ok()) {
      batch.clear();
      {
        std::unique_lock lock(mu_);
        cv_.wait_until(lock, last_write + opt_.heartbeat_interval,
                       [&] { return stop_ || broken_ || send_id_ < next_id_; });
        if (stop_ || broken_) break;
        if (!outbox_.empty()) {
          send_id_ = std::max(send_id_, outbox_.front().id);
          for (size_t i = send_id_ - outbox_.front().id; i < outbox_.size() && batch.size() < kMaxBatchBytes; ++i) {
            Entry& e = outbox_[i];
            if (!e.done) {
              batch += e.frame;
              ++stats_.sent;
              if (e.id < sent_high_) ++stats_.resent;
            }
            send_id_ = e.id + 1;
          }
          sent_high_ = std::max(sent_high_, send_id_);
        }
      }
      if (batch.empty()) AppendFrame(Heartbeat{NowNs()}, &batch);  // idle for heartbeat_interval
      st = conn.Write(batch, opt_.peer_timeout);
      last_write = Clock::now();
    }
    conn.Shutdown();
    reader.join();
    std::lock_guard lock(mu_);
    live_ = nullptr;
    stats_.connected = false;
    if (!stop_) {
      ++stats_.disconnects;
      if (!st.ok()) stats_.last_error = std::string(st.message());
      spdlog::warn("publisher {}: connection to {} lost: {}", opt_.edge, conn.peer(), stats_.last_error);
    }
    if (heard.load()) backoff.Reset();
  }

  void ReaderLoop(Connection& conn, std::atomic<bool>& heard) {
    FrameDecoder decoder;
    std::string buf(kReadBufferBytes, '\0');
    Status st;
    while (st.ok()) {
      StatusOr<size_t> n = conn.Read(buf.data(), buf.size(), opt_.peer_timeout);
      if (!n.ok()) {
        st = n.status();
        break;
      }
      heard = true;
      decoder.Feed(std::string_view(buf.data(), *n));
      for (;;) {
        StatusOr<std::optional<Message>> m = decoder.Next();
        if (!m.ok()) st = m.status();
        if (!m.ok() || !m->has_value()) break;
        st = Handle(**m);
        if (!st.ok()) break;
      }
    }
    std::lock_guard lock(mu_);
    broken_ = true;
    if (!stop_) stats_.last_error = std::string(st.message());
    conn.Shutdown();  // unblocks a Write waiting on a peer that stopped reading
    cv_.notify_all();
  }

  Status Handle(const Message& m) {
    if (const Ack* a = std::get_if<Ack>(&m)) {
      std::lock_guard lock(mu_);
      if (Complete(a->stream, a->run, a->seq_first)) ++stats_.acked;
      if (a->contiguous_through >= 0) {
        uint64_t& through = acked_through_[{a->stream, a->run}];
        through = std::max(through, static_cast<uint64_t>(a->contiguous_through));
      }
      return absl::OkStatus();
    }
    if (const Reject* r = std::get_if<Reject>(&m)) {
      if (r->stream.empty()) {
        return absl::FailedPreconditionError(
            StrCat("aggregator refused the connection (", ToString(r->reason), "): ", r->detail));
      }
      std::lock_guard lock(mu_);
      if (Complete(r->stream, r->run, r->seq_first)) ++stats_.rejected;
      const bool stale = r->reason == RejectReason::kStaleEpoch;
      if (!stale || !stats_.fenced) {  // once fenced, every later report is refused too: log the first
        spdlog::error("publisher {}: report {}/{} seq {}..{} rejected ({}): {}", opt_.edge, r->stream, r->run,
                      r->seq_first, r->seq_last, ToString(r->reason), r->detail);
      }
      stats_.fenced = stats_.fenced || stale;
      return absl::OkStatus();
    }
    if (std::holds_alternative<Heartbeat>(m)) return absl::OkStatus();
    return absl::InvalidArgumentError("aggregator sent an unexpected message type (Hello or Report)");
  }

  // Marks the oldest pending entry with this key done and frees the done prefix. REQUIRES: mu_ held.
  bool Complete(const std::string& stream, uint64_t run, uint64_t seq_first) {
    auto it = std::find_if(outbox_.begin(), outbox_.end(), [&](const Entry& e) {
      return !e.done && e.seq_first == seq_first && e.run == run && e.stream == stream;
    });
    if (it == outbox_.end()) return false;  // an ack for a report already completed
    it->done = true;
    while (!outbox_.empty() && outbox_.front().done) outbox_.pop_front();
    cv_.notify_all();
    return true;
  }

  const TcpPublisherOptions opt_;
  std::shared_ptr<Dialer> dialer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // outbox changed, connection broken, or stop
  std::deque<Entry> outbox_;    // GUARDED_BY(mu_); ids consecutive, front = oldest pending
  uint64_t next_id_ = 0;        // GUARDED_BY(mu_) id of the next published report
  uint64_t send_id_ = 0;        // GUARDED_BY(mu_) next id to send on the current connection
  uint64_t sent_high_ = 0;      // GUARDED_BY(mu_) one past the highest id ever sent
  bool stop_ = false;           // GUARDED_BY(mu_)
  bool broken_ = false;         // GUARDED_BY(mu_) the current connection failed
  Connection* live_ = nullptr;  // GUARDED_BY(mu_) the current connection, for Close
  std::map<std::pair<std::string, uint64_t>, uint64_t> acked_through_;  // GUARDED_BY(mu_)
  PublisherStats stats_;                                                // GUARDED_BY(mu_)
  std::thread sender_;
};

}  // namespace

Backoff::Backoff(milliseconds initial, milliseconds max, uint64_t seed) : initial_(initial), max_(max), rng_(seed) {}

milliseconds Backoff::Next() {
  const int64_t cap = max_.count();
  int64_t d = initial_.count();
  for (int i = 0; i < attempt_ && d < cap; ++i) d *= 2;
  d = std::min(d, cap);
  if (d < cap) ++attempt_;
  std::uniform_int_distribution<int64_t> dist(d / 2, d);
  return milliseconds(dist(rng_));
}

StatusOr<std::unique_ptr<Publisher>> MakeTcpPublisher(TcpPublisherOptions o) {
  auto bad = [](std::string_view what) { return absl::InvalidArgumentError(StrCat("publisher options: ", what)); };
  if (o.edge.empty() || o.edge.size() > 65535) return bad("edge id must be 1..65535 bytes");
  if (!o.dialer && (o.host.empty() || o.port == 0)) return bad("aggregator host and port are required");
  if (o.max_outbox == 0) return bad("max_outbox must be at least 1");
  if (o.backoff_initial.count() <= 0 || o.backoff_max < o.backoff_initial) {
    return bad("backoff_initial must be > 0 and ≤ backoff_max");
  }
  if (o.connect_timeout.count() <= 0 || o.heartbeat_interval.count() <= 0 || o.peer_timeout <= o.heartbeat_interval) {
    return bad("timeouts must be > 0 and peer_timeout longer than heartbeat_interval");
  }
  return std::unique_ptr<Publisher>(new TcpPublisher(std::move(o)));
}

}  // namespace vigil::transport
