// test_certs.h — certificates for TLS tests: transport's throwaway certificates (vigil/transport/throwaway_certs.h:
// what each file is, key type, validity) under the tests' names.
#pragma once

#include <string>

#include "vigil/transport/throwaway_certs.h"

namespace vigil::testing {

using TestCerts = transport::ThrowawayCerts;

inline StatusOr<TestCerts> MakeTestCerts(const std::string& dir) { return transport::MakeThrowawayCerts(dir); }

}  // namespace vigil::testing
