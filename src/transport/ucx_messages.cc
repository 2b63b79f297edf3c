// ucx::Worker (ucx_worker.h), its messages: what the progress thread sends (data, control, rows) and what it
// does with what arrives (the active messages' handlers, rendezvous fetches, the rows' check), per the wire
// format in ucx_worker.h.
#include "transport/ucx_worker.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace vigil::transport::ucx {

void Worker::SendControl(ConnState* conn, ControlType type, uint64_t value) {
  if (conn->ep == nullptr || conn->close_started) return;
  struct Pending {
    ConnState* conn;
    ControlHeader header;
  };
  auto* m = new Pending{conn, {static_cast<uint32_t>(type), kWireVersion, value}};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  p.cb.send = [](void* request, ucs_status_t st, void* user_data) {
    auto* pending = static_cast<Pending*>(user_data);
    --pending->conn->inflight;
    Completed(pending->conn, st, "sending a control message");
    delete pending;
    ucp_request_free(request);
  };
  p.user_data = m;
  ucs_status_ptr_t r = ucp_am_send_nbx(conn->ep, kControlAm, &m->header, sizeof m->header, nullptr, 0, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    ++conn->inflight;
    return;
  }
  Completed(conn, UCS_PTR_STATUS(r), "sending a control message");
  delete m;
}

void Worker::SendData(SendSlot* slot) {
  ConnState* conn = slot->conn;
  if (conn->ep == nullptr || conn->close_started) {  // the connection is gone; its reader sees why
    MutexLock lock(conn->mu);
    conn->slot_busy[slot->index] = false;
    conn->cv.NotifyAll();
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  p.memh = conn->memh;  // the pool is registered once: UCX skips registering the buffer per send
  p.cb.send = [](void* request, ucs_status_t st, void* user_data) {
    auto* s = static_cast<SendSlot*>(user_data);
    --s->conn->inflight;
    DataSent(s, st);
    ucp_request_free(request);
  };
  p.user_data = slot;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(conn->ep, kDataAm, &slot->header, sizeof slot->header, slot->data, slot->len, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    ++conn->inflight;
    return;
  }
  DataSent(slot, UCS_PTR_STATUS(r));
}

void Worker::SendRows(std::shared_ptr<PendingRows> m) {
  ConnState* conn = m->conn;
  if (conn->ep == nullptr || conn->close_started) return;  // the connection is gone; its reader sees why
  if (m->device >= 0 && m->device != current_device_) {
    Status st = device_memory::Use(m->device);
    if (!st.ok()) {
      MutexLock lock(conn->mu);
      conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": sending rows: ", st.message())));
      return;
    }
    current_device_ = m->device;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  p.memory_type = m->device >= 0 ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  p.cb.send = [](void* request, ucs_status_t st, void* user_data) {
    auto* pending = static_cast<std::shared_ptr<PendingRows>*>(user_data);
    --(*pending)->conn->inflight;
    Completed((*pending)->conn, st, "sending rows");
    delete pending;
    ucp_request_free(request);
  };
  auto* held = new std::shared_ptr<PendingRows>(m);
  p.user_data = held;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(conn->ep, kRowsAm, m->header.data(), m->header.size(), m->rows, m->row_bytes, &p);
  ++g_rows_sent;
  if (m->device >= 0) ++g_rows_sent_from_device;
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    ++conn->inflight;
    return;
  }
  Completed(conn, UCS_PTR_STATUS(r), "sending rows");
  delete held;
}

ConnState* Worker::Find(const ucp_am_recv_param_t* param) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return nullptr;
  auto it = eps_.find(param->reply_ep);
  return it == eps_.end() || it->second->close_started ? nullptr : it->second.get();
}

void Worker::Completed(ConnState* conn, ucs_status_t st, std::string_view what) {
  if (st == UCS_OK || st == UCS_ERR_CANCELED) return;
  MutexLock lock(conn->mu);
  conn->FailLocked(
      absl::UnavailableError(StrCat(conn->peer, ": ", conn->connected ? what : kNotConnected, ": ", UcsError(st))));
}

void Worker::DataSent(SendSlot* slot, ucs_status_t st) {
  Completed(slot->conn, st, "sending data");
  MutexLock lock(slot->conn->mu);
  slot->conn->slot_busy[slot->index] = false;
  slot->conn->cv.NotifyAll();
}

ucs_status_t Worker::OnControlAm(void* arg, const void* header, size_t header_length, void*, size_t,
                                 const ucp_am_recv_param_t* param) {
  auto* w = static_cast<Worker*>(arg);
  ConnState* conn = w->Find(param);
  if (conn == nullptr || header_length != sizeof(ControlHeader)) return UCS_OK;
  ControlHeader h;
  std::memcpy(&h, header, sizeof h);
  // Known before Dial/Accept return (they wait for `connected`), so transports() answers at once.
  if (static_cast<ControlType>(h.type) == ControlType::kHello) UpdateTransports(conn);
  MutexLock lock(conn->mu);
  if (h.version != kWireVersion) {
    conn->FailLocked(absl::UnavailableError(
        StrCat(conn->peer, ": the peer speaks vigil UCX wire version ", h.version, ", this is ", kWireVersion)));
    return UCS_OK;
  }
  switch (static_cast<ControlType>(h.type)) {
    case ControlType::kHello: {
      conn->peer_window = h.value;
      conn->connected = true;
      conn->cv.NotifyAll();
      lock.Unlock();
      if (conn->awaiting_accept) {
        conn->awaiting_accept = false;
        std::shared_ptr<ConnState> keep = w->eps_[conn->ep];
        if (w->accept_queue_) {
          MutexLock qlock(w->accept_queue_->mu);
          w->accept_queue_->ready.push_back(std::move(keep));
          w->accept_queue_->cv.NotifyAll();
        } else {
          w->deferred_.push_back([w, keep] { w->BeginClose(keep, true); });
        }
      }
      return UCS_OK;  // (conn->mu released)
    }
    case ControlType::kCredit:
      conn->peer_consumed = std::max(conn->peer_consumed, h.value);
      conn->cv.NotifyAll();
      break;
    case ControlType::kFin:
      conn->peer_fin = true;
      conn->peer_fin_count = h.value;
      conn->cv.NotifyAll();
      w->MaybeAckFinLocked(conn);
      break;
    case ControlType::kFinAck:
      conn->fin_acked = true;
      conn->cv.NotifyAll();
      break;
  }
  return UCS_OK;
}

void Worker::UpdateTransports(ConnState* conn) {
  if (conn->transports_known) return;
  std::string t = EndpointTransports(conn->ep);
  if (t.empty()) return;
  conn->transports_known = true;
  MutexLock lock(conn->mu);
  conn->transports = std::move(t);
}

void Worker::MaybeAckFinLocked(ConnState* conn) {
  if (conn->fin_ack_sent || !conn->AllBeforeFinArrivedLocked()) return;
  conn->fin_ack_sent = true;
  std::shared_ptr<ConnState> keep = eps_[conn->ep];
  deferred_.push_back([this, keep] { SendControl(keep.get(), ControlType::kFinAck, 0); });
}

Chunk* Worker::NewChunkLocked(ConnState* conn, uint64_t seq) {
  if (seq < conn->next_read_seq || conn->rx.count(seq) != 0) {
    conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": data message ", seq, " arrived twice")));
    return nullptr;
  }
  if (seq != conn->next_arrival_seq) ++g_out_of_order;
  conn->next_arrival_seq = std::max(conn->next_arrival_seq, seq + 1);
  return &conn->rx[seq];
}

ucs_status_t Worker::OnDataAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
  auto* w = static_cast<Worker*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ConnState* conn = w->Find(param);
  if (conn == nullptr || header_length != sizeof(DataHeader)) return UCS_OK;  // a rendezvous is dropped too
  DataHeader h;
  std::memcpy(&h, header, sizeof h);
  UpdateTransports(conn);
  MutexLock lock(conn->mu);
  Chunk* chunk = NewChunkLocked(conn, h.seq);
  if (chunk == nullptr) return UCS_OK;
  Chunk& c = *chunk;
  c.size = length;
  c.wire = length;
  c.bytes.reset(new char[std::max<size_t>(length, 1)]);
  if (!rndv) {
    std::memcpy(c.bytes.get(), data, length);
    c.ready = true;
    conn->cv.NotifyAll();
    if (conn->peer_fin) w->MaybeAckFinLocked(conn);
    return UCS_OK;
  }
  // Rendezvous: fetch the data into the chunk once progress returns. The chunk keeps its place in the
  // sequence meanwhile, so bytes that arrive later by eager messages are not read before it.
  std::shared_ptr<ConnState> keep = w->eps_[conn->ep];
  w->deferred_.push_back([w, keep, seq = h.seq, desc = data] { w->ReceiveRendezvous(keep, seq, desc); });
  return UCS_INPROGRESS;
}

ucs_status_t Worker::OnRowsAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
  auto* w = static_cast<Worker*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ConnState* conn = w->Find(param);
  if (conn == nullptr) return UCS_OK;
  RowsHeader h{};
  std::string malformed;
  if (header_length < sizeof h) {
    malformed = StrCat("a header of ", header_length, " bytes");
  } else {
    std::memcpy(&h, header, sizeof h);
    if (header_length != sizeof h + h.frame_bytes) {
      malformed = StrCat("a header of ", header_length, " bytes announcing a frame of ", h.frame_bytes);
    } else if (h.rows > kMaxDetections) {
      malformed = StrCat(h.rows, " rows, more than ", kMaxDetections);
    } else if (length != h.rows * kRowBytes) {
      malformed = StrCat(length, " bytes of data for ", h.rows, " rows");
    }
  }
  UpdateTransports(conn);
  MutexLock lock(conn->mu);
  if (!malformed.empty()) {
    ++g_rows_rejected;
    conn->FailLocked(absl::DataLossError(StrCat(conn->peer, ": a malformed rows message: ", malformed)));
    return UCS_OK;
  }
  Chunk* chunk = NewChunkLocked(conn, h.seq);
  if (chunk == nullptr) return UCS_OK;
  Chunk& c = *chunk;
  c.is_rows = true;
  c.rows = h.rows;
  c.frame.assign(static_cast<const char*>(header) + sizeof h, h.frame_bytes);
  c.size = length;
  c.wire = h.frame_bytes + length;
  c.bytes.reset(new char[std::max<size_t>(length, 1)]);
  if (!rndv) {
    std::memcpy(c.bytes.get(), data, length);
    w->FinishRowsLocked(conn, h.seq, c);
    return UCS_OK;
  }
  std::shared_ptr<ConnState> keep = w->eps_[conn->ep];
  w->deferred_.push_back([w, keep, seq = h.seq, desc = data] { w->ReceiveRendezvous(keep, seq, desc); });
  return UCS_INPROGRESS;
}

void Worker::FinishRowsLocked(ConnState* conn, uint64_t seq, Chunk& c) {
  auto reject = [&](const auto& why) {
    conn->mu.AssertHeld();  // run right here, under the caller's lock
    ++g_rows_rejected;
    conn->FailLocked(absl::DataLossError(StrCat(conn->peer, ": rows message ", seq, " rejected: ", why)));
  };
  StatusOr<Message> m = DecodeFrame(c.frame);
  if (!m.ok()) return reject(m.status().message());
  Report* r = std::get_if<Report>(&*m);
  if (r == nullptr || !r->detections.empty()) return reject("its frame is not a Report without rows");
  r->detections.resize(c.rows);
  if (c.rows > 0) std::memcpy(r->detections.data(), c.bytes.get(), c.rows * kRowBytes);
  Status valid = ValidateReport(*r);  // finite boxes and scores, integral class ids, an event's rows
  if (!valid.ok()) return reject(valid.message());
  std::string out;
  AppendFrame(*r, &out);
  c.bytes.reset(new char[out.size()]);
  std::memcpy(c.bytes.get(), out.data(), out.size());
  c.size = out.size();
  c.frame.clear();
  c.ready = true;
  ++g_rows_received;
  conn->cv.NotifyAll();
  if (conn->peer_fin) MaybeAckFinLocked(conn);
}

void Worker::ReceiveRendezvous(const std::shared_ptr<ConnState>& conn, uint64_t seq, void* desc) {
  char* buf = nullptr;
  size_t size = 0;
  bool into_device = false;
  {
    MutexLock lock(conn->mu);
    auto it = conn->rx.find(seq);
    if (it != conn->rx.end()) {
      buf = it->second.bytes.get();
      size = it->second.size;
      into_device = it->second.is_rows && conn->options.receive_device >= 0 && size > 0;
    }
  }
  if (buf == nullptr || conn->ep == nullptr || conn->close_started) {
    ucp_am_data_release(worker_, desc);
    return;
  }
  ucs_memory_type_t memory_type = UCS_MEMORY_TYPE_HOST;
  if (into_device) {  // rows into GPU memory; copied to the host for storage when they are all here
    std::unique_ptr<device_memory::Buffer> dev;
    if (!conn->free_row_buffers.empty()) {
      dev = std::move(conn->free_row_buffers.back());
      conn->free_row_buffers.pop_back();
    } else {
      StatusOr<std::unique_ptr<device_memory::Buffer>> made =
          device_memory::Allocate(conn->options.receive_device, kMaxDetections * kRowBytes);
      if (!made.ok()) {
        ucp_am_data_release(worker_, desc);
        MutexLock lock(conn->mu);
        conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": receiving rows: ", made.status().message())));
        return;
      }
      dev = std::move(*made);
    }
    current_device_ = conn->options.receive_device;  // Allocate made it current
    buf = static_cast<char*>(dev->data());
    memory_type = UCS_MEMORY_TYPE_CUDA;
    MutexLock lock(conn->mu);
    conn->rx[seq].device = std::move(dev);
  }
  struct Pending {
    ConnState* conn;
    uint64_t seq;
  };
  auto* pending = new Pending{conn.get(), seq};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.memory_type = memory_type;
  p.cb.recv_am = [](void* request, ucs_status_t st, size_t, void* user_data) {
    auto* pend = static_cast<Pending*>(user_data);
    --pend->conn->inflight;
    pend->conn->worker->RendezvousDone(pend->conn, pend->seq, st);
    delete pend;
    ucp_request_free(request);
  };
  p.user_data = pending;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, desc, buf, size, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    ++conn->inflight;
    return;
  }
  RendezvousDone(conn.get(), seq, UCS_PTR_STATUS(r));
  delete pending;
}

void Worker::RendezvousDone(ConnState* conn, uint64_t seq, ucs_status_t st) {
  Completed(conn, st, "receiving rendezvous data");
  if (st != UCS_OK) return;
  ++g_rendezvous;
  MutexLock lock(conn->mu);
  auto it = conn->rx.find(seq);
  if (it == conn->rx.end()) return;
  Chunk& c = it->second;
  if (!c.is_rows) {
    c.ready = true;
    conn->cv.NotifyAll();
    if (conn->peer_fin) MaybeAckFinLocked(conn);
    return;
  }
  if (c.device) {
    Status copied = device_memory::CopyToHost(c.bytes.get(), c.device->data(), c.size, c.device->device());
    conn->free_row_buffers.push_back(std::move(c.device));
    if (!copied.ok()) {
      conn->FailLocked(absl::UnavailableError(StrCat(conn->peer, ": receiving rows: ", copied.message())));
      return;
    }
    ++g_rows_into_device;
  }
  FinishRowsLocked(conn, seq, c);
}

}  // namespace vigil::transport::ucx
