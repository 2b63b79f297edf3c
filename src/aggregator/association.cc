// aggregator/association.h: the host reference Associator (Tracker copies advanced by Tracker::Update).
#include "vigil/aggregator/association.h"

#include <unordered_map>
#include <unordered_set>

namespace vigil::aggregator {
namespace {

class HostAssociator final : public Associator {
 public:
  StatusOr<std::vector<Association>> Associate(std::span<const AssociationFrame> frames) override {
    std::vector<Association> out(frames.size());
    std::unordered_set<uint64_t> seen, stopped;
    for (size_t f = 0; f < frames.size(); ++f) {
      const AssociationFrame& fr = frames[f];
      Association& a = out[f];
      auto it = copies_.find(fr.stream);
      if (seen.insert(fr.stream).second) {
        if (it == copies_.end() || it->second.id != fr.tracker->state_id()) {
          it = copies_.insert_or_assign(fr.stream, Copy{*fr.tracker, 0}).first;
          it->second.tracker.set_id_source(&ids_);  // the copy's ids are nobody's
          ++stats_.copied_in;
        }
        it->second.id = 0;  // the copy moves on: only Advanced names its state again
      }
      if (stopped.contains(fr.stream)) {
        a.why = "an earlier frame of the stream was not associated here";
        ++stats_.declined;
        continue;
      }
      StatusOr<TrackUpdate> up = it->second.tracker.Update(fr.seq, fr.time_ns, fr.detections);
      if (!up.ok()) {
        a.why = std::string(up.status().message());
        stopped.insert(fr.stream);
        ++stats_.declined;
        continue;
      }
      a.ok = true;
      a.det_of_track = std::move(up->det_of_track);
      ++stats_.frames;
    }
    ++stats_.batches;
    return out;
  }

  void Advanced(uint64_t stream, uint64_t state_id) override {
    auto it = copies_.find(stream);
    if (it != copies_.end()) it->second.id = state_id;
  }
  void Forget(uint64_t stream) override { copies_.erase(stream); }
  std::string where() const override { return "host"; }
  AssociatorStats stats() const override { return stats_; }

 private:
  struct Copy {
    Tracker tracker;
    uint64_t id;  // the state id of the caller's tracker this copy equals; 0: none
  };
  std::unordered_map<uint64_t, Copy> copies_;
  int64_t ids_ = 1;
  AssociatorStats stats_;
};

}  // namespace

std::unique_ptr<Associator> MakeHostAssociator() { return std::make_unique<HostAssociator>(); }

}  // namespace vigil::aggregator
