// Built without libpq (VIGIL_WITH_POSTGRES=OFF or libpq-dev missing): a PostgreSQL target is refused.
#include "aggregator/store_backend.h"

namespace vigil::aggregator {

StatusOr<std::unique_ptr<StoreBackend>> OpenPostgresBackend(const std::string&, const std::string& shown,
                                                            const StoreOptions&) {
  return absl::UnimplementedError(StrCat("database ", shown,
                                         ": this vigil was built without PostgreSQL (libpq); rebuild with "
                                         "libpq-dev installed (VIGIL_WITH_POSTGRES=ON) or use a SQLite file"));
}

}  // namespace vigil::aggregator
