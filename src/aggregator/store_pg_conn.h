// src/aggregator/store_pg_conn.h — internal to the aggregator: the PostgreSQL engine's (store_pg.cc) libpq layer:
// results and their owner, reading a text-format result's values, text parameters and array literals, and one
// connection with its prepared statements, pipelines and transactions. Included by store_pg.cc only (header-only:
// a build without libpq compiles no file that includes it).
//
// Ownership: a Conn owns its PGconn (PQfinish at destruction) and a Result its PGresult (PQclear).
// Thread-safety: none; a Conn is used by one thread at a time (store_pg.cc serializes each connection: the
// writer thread, read_mu, push_mu). The value readers are pure.
// Errors: a Conn's calls return Internal with the server's message and the statement's purpose, Unavailable when
// the connection is down (not reconnected inside a transaction); the value readers read 0 / "" from a NULL.
#pragma once

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::aggregator::pg {

struct ResultFree {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultFree>;

inline int64_t Int(const PGresult* r, int row, int col) {
  const char* v = PQgetvalue(r, row, col);
  int64_t out = 0;
  std::from_chars(v, v + PQgetlength(r, row, col), out);
  return out;
}
inline uint64_t U64(const PGresult* r, int row, int col) { return static_cast<uint64_t>(Int(r, row, col)); }
inline double Real(const PGresult* r, int row, int col) {
  const char* v = PQgetvalue(r, row, col);
  double out = 0;
  std::from_chars(v, v + PQgetlength(r, row, col), out);
  return out;
}
inline std::string Text(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col)));
}

// A text parameter.
inline std::string P(int64_t v) { return std::to_string(v); }
inline std::string P(uint64_t v) { return std::to_string(static_cast<int64_t>(v)); }  // bit pattern
inline std::string P(int v) { return std::to_string(v); }
// A bytea parameter in its text form (hex: "\\x0a1b…").
inline std::string HexBytes(std::string_view b) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + 2 * b.size());
  for (char c : b) {
    const auto u = static_cast<unsigned char>(c);
    out += kHex[u >> 4];
    out += kHex[u & 15];
  }
  return out;
}
// A bytea column read in text form.
inline std::string BytesOf(const PGresult* r, int row, int col) {
  size_t n = 0;
  unsigned char* raw = PQunescapeBytea(reinterpret_cast<const unsigned char*>(PQgetvalue(r, row, col)), &n);
  if (raw == nullptr) return {};
  std::string out(reinterpret_cast<const char*>(raw), n);
  PQfreemem(raw);
  return out;
}

// A PostgreSQL array literal ('{…}') built element by element.
class Array {
 public:
  void Add(int64_t v) { Sep().append(std::to_string(v)); }
  void Add(uint64_t v) { Add(static_cast<int64_t>(v)); }
  void Add(int v) { Add(static_cast<int64_t>(v)); }
  void Add(double v) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest exact form
    Sep().append(buf, end);
  }
  void AddText(std::string_view v) {
    std::string& s = Sep();
    s += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    s += '"';
  }
  bool empty() const { return n_ == 0; }
  std::string Done() const { return s_ + "}"; }

 private:
  std::string& Sep() {
    if (n_++ > 0) s_ += ',';
    return s_;
  }
  std::string s_ = "{";
  size_t n_ = 0;
};

// One libpq connection with its prepared statements.
class Conn {
 public:
  static StatusOr<std::unique_ptr<Conn>> Open(const std::string& url, const std::string& password,
                                              const std::string& shown, const char* role) {
    auto c = std::unique_ptr<Conn>(new Conn(shown, role));
    // The URL first (expand_dbname), then what overrides it or fills in.
    const char* keys[] = {"dbname", "fallback_application_name", password.empty() ? nullptr : "password", nullptr};
    const char* values[] = {url.c_str(), "vigil-aggregator", password.c_str(), nullptr};
    c->c_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (PQstatus(c->c_) != CONNECTION_OK) {
      return absl::UnavailableError(
          StrCat("postgresql ", shown, ": cannot connect (", role, " connection): ", c->Message()));
    }
    VIGIL_RETURN_IF_ERROR(c->Simple("SET client_min_messages = warning", "quiet notices"));
    return c;
  }
  ~Conn() { PQfinish(c_); }

  // Runs `sql` (a static string: prepared once, keyed by its address) with text parameters $1, $2, ….
  // Outside a transaction a statement that finds the connection dropped (a server restart) is tried once more
  // on a new one; inside one the error is returned (the transaction is gone).
  StatusOr<Result> Run(const char* sql, const std::vector<std::string>& params, std::string_view what) {
    StatusOr<Result> r = RunOnce(sql, params, what);
    if (!r.ok() && !in_transaction_ && PQstatus(c_) != CONNECTION_OK) r = RunOnce(sql, params, what);
    return r;
  }
  // Runs SQL without parameters (transaction control, migrations); retried like Run.
  Status Simple(const char* sql, std::string_view what) {
    Status st = SimpleOnce(sql, what);
    if (!st.ok() && !in_transaction_ && PQstatus(c_) != CONNECTION_OK) st = SimpleOnce(sql, what);
    return st;
  }

 private:
  StatusOr<Result> RunOnce(const char* sql, const std::vector<std::string>& params, std::string_view what) {
    VIGIL_RETURN_IF_ERROR(Usable(what));
    auto it = prepared_.find(sql);
    if (it == prepared_.end()) {
      std::string name = StrCat("v", prepared_.size());
      Result r(PQprepare(c_, name.c_str(), sql, 0, nullptr));
      if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) return Error(StrCat("prepare for ", what));
      it = prepared_.emplace(sql, std::move(name)).first;
    }
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const std::string& p : params) values.push_back(p.c_str());
    Result r(PQexecPrepared(c_, it->second.c_str(), static_cast<int>(values.size()), values.data(), nullptr, nullptr,
                            0));
    const ExecStatusType st = PQresultStatus(r.get());
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return Error(what, r.get());
    return r;
  }
  Status SimpleOnce(const char* sql, std::string_view what) {
    VIGIL_RETURN_IF_ERROR(Usable(what));
    Result r(PQexec(c_, sql));
    const ExecStatusType st = PQresultStatus(r.get());
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return Error(what, r.get());
    return absl::OkStatus();
  }

 public:
  // One statement of a Pipeline: `sql` a static string (prepared like Run's), or BEGIN / COMMIT (sent unprepared).
  struct Step {
    const char* sql;
    std::vector<std::string> params;
    std::string_view what;
  };
  // Sends `steps` at once (libpq pipeline mode: one round trip) and returns their results in order. `begin`
  // puts a BEGIN first and starts a transaction; `commit` puts a COMMIT last and ends it. The first error is
  // returned (the server skips what follows it); inside a transaction the caller then calls Rollback. A
  // pipeline that begins is tried once more on a new connection when the old one was found dropped.
  StatusOr<std::vector<Result>> Pipeline(const std::vector<Step>& steps, bool begin, bool commit) {
    StatusOr<std::vector<Result>> r = PipelineOnce(steps, begin, commit);
    if (!r.ok() && begin && PQstatus(c_) != CONNECTION_OK) {
      in_transaction_ = false;
      r = PipelineOnce(steps, begin, commit);
    }
    return r;
  }
  Status Begin(const char* sql = "BEGIN") {
    in_transaction_ = false;
    VIGIL_RETURN_IF_ERROR(Simple(sql, "begin"));
    in_transaction_ = true;
    return absl::OkStatus();
  }
  Status Commit() {
    Status st = Simple("COMMIT", "commit");
    in_transaction_ = false;
    return st;
  }
  void Rollback() {
    if (PQstatus(c_) == CONNECTION_OK) (void)Simple("ROLLBACK", "rollback");
    in_transaction_ = false;
  }
  // Runs `body` in a transaction (rolled back on error).
  template <typename Body>
  Status InTransaction(Body&& body, const char* begin = "BEGIN") {
    VIGIL_RETURN_IF_ERROR(Begin(begin));
    Status st = body();
    if (st.ok()) st = Commit();
    if (!st.ok()) Rollback();
    return st;
  }

 private:
  Conn(std::string shown, const char* role) : shown_(std::move(shown)), role_(role) {}
  std::string Message() const {
    std::string m = PQerrorMessage(c_);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return m;
  }
  Status Error(std::string_view what, const PGresult* r = nullptr) {
    std::string m = r != nullptr ? PQresultErrorMessage(r) : "";
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    if (m.empty()) m = Message();
    const std::string text = StrCat("postgresql ", shown_, ": ", what, ": ", m);
    return PQstatus(c_) == CONNECTION_OK ? absl::InternalError(text) : absl::UnavailableError(text);
  }
  StatusOr<std::vector<Result>> PipelineOnce(const std::vector<Step>& steps, bool begin, bool commit) {
    VIGIL_RETURN_IF_ERROR(Usable(steps.empty() ? "pipeline" : steps.front().what));
    if (PQenterPipelineMode(c_) != 1) return Error("enter pipeline mode");
    struct Sent {
      int step;              // index in steps; -1 BEGIN, -2 COMMIT
      const char* prepares;  // non-null: a Prepare of this statement
    };
    std::vector<Sent> sent;
    std::vector<std::pair<const char*, std::string>> preparing;
    bool send_ok = true;
    if (begin) {
      send_ok = PQsendQueryParams(c_, "BEGIN", 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
      sent.push_back({-1, nullptr});
      in_transaction_ = true;
    }
    for (size_t i = 0; send_ok && i < steps.size(); ++i) {
      const Step& st = steps[i];
      auto it = prepared_.find(st.sql);
      auto pending = std::find_if(preparing.begin(), preparing.end(), [&](const auto& p) { return p.first == st.sql; });
      std::string name;
      if (it != prepared_.end()) {
        name = it->second;
      } else if (pending != preparing.end()) {  // the same statement twice in one pipeline: prepared once
        name = pending->second;
      } else {
        name = StrCat("v", prepared_.size() + preparing.size());
        send_ok = PQsendPrepare(c_, name.c_str(), st.sql, 0, nullptr) == 1;
        sent.push_back({static_cast<int>(i), st.sql});
        preparing.emplace_back(st.sql, name);
      }
      std::vector<const char*> values;
      values.reserve(st.params.size());
      for (const std::string& v : st.params) values.push_back(v.c_str());
      send_ok = send_ok && PQsendQueryPrepared(c_, name.c_str(), static_cast<int>(values.size()), values.data(),
                                               nullptr, nullptr, 0) == 1;
      sent.push_back({static_cast<int>(i), nullptr});
    }
    if (send_ok && commit) {
      send_ok = PQsendQueryParams(c_, "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
      sent.push_back({-2, nullptr});
    }
    if (!send_ok || PQpipelineSync(c_) != 1) {
      Status st = Error(StrCat("send ", steps.empty() ? "a pipeline" : steps.front().what));
      PQexitPipelineMode(c_);
      return st;
    }
    std::vector<Result> results(steps.size());
    Status first;
    for (const Sent& x : sent) {
      Result r(PQgetResult(c_));
      while (PGresult* extra = PQgetResult(c_)) PQclear(extra);  // the NULL that ends this command's results
      const ExecStatusType st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
      const std::string_view what = x.step >= 0 ? steps[static_cast<size_t>(x.step)].what
                                    : x.step == -1 ? std::string_view("begin")
                                                   : std::string_view("commit");
      if (st == PGRES_PIPELINE_ABORTED) continue;  // after the first error
      if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        if (first.ok()) first = Error(x.prepares ? StrCat("prepare for ", what) : std::string(what), r.get());
        continue;
      }
      if (x.prepares) {
        for (auto& [sql, name] : preparing) {
          if (sql == x.prepares) prepared_.emplace(sql, name);
        }
      } else if (x.step >= 0) {
        results[static_cast<size_t>(x.step)] = std::move(r);
      }
    }
    Result sync(PQgetResult(c_));  // PGRES_PIPELINE_SYNC
    PQexitPipelineMode(c_);
    if (!first.ok()) return first;
    if (commit) in_transaction_ = false;
    return results;
  }

  // A broken connection is reset outside a transaction only (inside one, the transaction is lost anyway).
  Status Usable(std::string_view what) {
    if (PQstatus(c_) == CONNECTION_OK) return absl::OkStatus();
    if (in_transaction_) return Error(what);
    PQreset(c_);
    prepared_.clear();
    if (PQstatus(c_) != CONNECTION_OK) {
      return absl::UnavailableError(
          StrCat("postgresql ", shown_, ": ", what, ": cannot reconnect (", role_, " connection): ", Message()));
    }
    return SimpleOnce("SET client_min_messages = warning", "quiet notices");
  }

  PGconn* c_ = nullptr;
  std::string shown_;
  const char* role_;
  std::unordered_map<const char*, std::string> prepared_;
  bool in_transaction_ = false;
};

// One row of a result, as EventFromRow (store_backend.h) reads it.
struct PgRow {
  const PGresult* r;
  int row;
  int64_t Int(int col) const { return pg::Int(r, row, col); }
  uint64_t U64(int col) const { return pg::U64(r, row, col); }
  std::string Text(int col) const { return pg::Text(r, row, col); }
};

}  // namespace vigil::aggregator::pg
