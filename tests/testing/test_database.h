// tests/testing/test_database.h — a fresh, empty database of either storage engine for one test
// (aggregator/store.h), with an independent look at it through the engine's own client library.
//
// SQLite: a file in a temporary folder. PostgreSQL: a schema of its own (t_<random>) in the database named by
// VIGIL_TEST_POSTGRES (a libpq URL; scripts/test.sh starts a server with scripts/postgres.sh and sets it), the
// store pointed at it through the URL's search_path option; dropped with everything in it at the end.
// Without VIGIL_TEST_POSTGRES the PostgreSQL cases skip, with a message — unless VIGIL_REQUIRE_POSTGRES=1
// (scripts/test.sh sets it), where they fail, so CI never passes by skipping them.
// Not thread-safe; one per test.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>
#ifdef VIGIL_HAVE_POSTGRES
#include <libpq-fe.h>
#endif

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

namespace vigil::testing {

enum class Engine { kSqlite, kPostgres };

// The first column of the first row of `sql` in the SQLite file `path`, opened read-only (-1: no row).
inline int64_t QuerySqliteInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  int64_t v = -1;
  if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

inline std::string EngineName(const ::testing::TestParamInfo<Engine>& info) {
  return info.param == Engine::kSqlite ? "SQLite" : "PostgreSQL";
}

class TestDatabase {
 public:
  // Returns false (after GTEST_SKIP or a failure) when the engine cannot be had here.
  bool Create(Engine engine) {
    engine_ = engine;
    const std::string tag = std::to_string(std::random_device{}());
    if (engine == Engine::kSqlite) {
      dir_ = std::filesystem::path(::testing::TempDir()) / ("vigil_db_" + tag);
      std::filesystem::create_directories(dir_);
      target_ = (dir_ / "agg.db").string();
      return true;
    }
    const char* url = std::getenv("VIGIL_TEST_POSTGRES");
    const char* require = std::getenv("VIGIL_REQUIRE_POSTGRES");
    const bool required = require != nullptr && std::string(require) == "1";
#ifdef VIGIL_HAVE_POSTGRES
    if (url == nullptr || *url == '\0') {
      if (required) ADD_FAILURE() << "VIGIL_REQUIRE_POSTGRES=1 but VIGIL_TEST_POSTGRES is not set";
      else [] { GTEST_SKIP() << "PostgreSQL: set VIGIL_TEST_POSTGRES to a libpq URL (scripts/postgres.sh start DIR prints one)"; }();
      return false;
    }
    base_url_ = url;
    schema_ = "t_" + tag;
    if (!Exec("CREATE SCHEMA " + schema_)) return false;
    target_ = base_url_ + (base_url_.find('?') == std::string::npos ? "?" : "&") + "options=-csearch_path%3D" + schema_ +
              "&application_name=" + schema_;
    return true;
#else
    (void)url;
    if (required) ADD_FAILURE() << "VIGIL_REQUIRE_POSTGRES=1 but this build has no libpq";
    else [] { GTEST_SKIP() << "PostgreSQL: this build has no libpq (VIGIL_WITH_POSTGRES)"; }();
    return false;
#endif
  }
  ~TestDatabase() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    if (!schema_.empty()) Exec("DROP SCHEMA " + schema_ + " CASCADE");
  }

  Engine engine() const { return engine_; }
  const std::string& target() const { return target_; }  // what Store::Open takes
  const std::filesystem::path& dir() const { return dir_; }  // SQLite only
  const std::string& schema() const { return schema_; }  // PostgreSQL: also the store's application_name

  // The first column of the first row of `sql`, as an integer (-1: no row).
  int64_t Query(const std::string& sql) {
    if (engine_ == Engine::kSqlite) return QuerySqliteInt(target_, sql);
#ifdef VIGIL_HAVE_POSTGRES
    PGconn* c = PQconnectdb(target_.c_str());
    PGresult* r = PQexec(c, sql.c_str());
    EXPECT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << sql << ": " << PQerrorMessage(c);
    int64_t v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) v = std::strtoll(PQgetvalue(r, 0, 0), nullptr, 10);
    PQclear(r);
    PQfinish(c);
    return v;
#else
    return -1;
#endif
  }
  // Runs statements; false (with a test failure) on an error.
  bool Exec(const std::string& sql) {
    if (engine_ == Engine::kSqlite) {
      sqlite3* db = nullptr;
      sqlite3_open(target_.c_str(), &db);
      char* err = nullptr;
      const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
      EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << (err ? err : "");
      sqlite3_free(err);
      sqlite3_close(db);
      return rc == SQLITE_OK;
    }
#ifdef VIGIL_HAVE_POSTGRES
    PGconn* c = PQconnectdb(target_.empty() ? base_url_.c_str() : target_.c_str());
    PGresult* r = PQexec(c, sql.c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    EXPECT_TRUE(ok) << sql << ": " << PQerrorMessage(c);
    PQclear(r);
    PQfinish(c);
    return ok;
#else
    return false;
#endif
  }

 private:
  Engine engine_ = Engine::kSqlite;
  std::filesystem::path dir_;
  std::string target_, base_url_, schema_;
};

}  // namespace vigil::testing
