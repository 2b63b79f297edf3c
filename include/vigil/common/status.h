// vigil/common/status.h — errors as values.
//
// vigil uses abseil's Status / StatusOr (absl/status) as its error type: a code plus a message.
// Each layer that returns an error adds what it knows, so a message reads like
// "model yolov8n.onnx: node '/model.22/Mul_2' (Mul): inputs [1,4,8400] and [1,5] do not broadcast".
// Exceptions never cross a module boundary; code that calls a throwing library converts at the call.
//
// Thread-safety: Status and StatusOr are values; distinct objects may be used from any thread.
#pragma once

#include <cstdint>
#include <sstream>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vigil {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

// NOTE: Debian 12's abseil (20220623) is built with its own absl::string_view, a type distinct
// from std::string_view: absl::StrCat, absl::StrSplit, absl::SimpleAtoi etc. do not accept a
// std::string_view. Use vigil::StrCat below (any streamable values) and the standard library.

// Concatenates the streamed forms of `args` ("node '", name, "' has ", 3, " inputs").
// int8_t/uint8_t print as numbers.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  auto put = [&os](const auto& a) {
    using T = std::decay_t<decltype(a)>;
    if constexpr (std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>) os << static_cast<int>(a);
    else os << a;
  };
  (put(args), ...);
  return os.str();
}

// Returns `s` with "context: " prepended to its message (the code is kept). OK stays OK.
inline Status Annotate(const Status& s, std::string_view context) {
  if (s.ok()) return s;
  return Status(s.code(), StrCat(context, ": ", std::string(s.message())));
}

}  // namespace vigil

// Returns from the current function when `expr` (a Status) is not OK.
#define VIGIL_RETURN_IF_ERROR(expr)                   \
  do {                                                \
    ::vigil::Status _vigil_st = (expr);               \
    if (!_vigil_st.ok()) return _vigil_st;            \
  } while (0)

#define VIGIL_CONCAT_INNER_(a, b) a##b
#define VIGIL_CONCAT_(a, b) VIGIL_CONCAT_INNER_(a, b)

// `VIGIL_ASSIGN_OR_RETURN(auto x, F());` — declares/assigns from a StatusOr or returns its error.
#define VIGIL_ASSIGN_OR_RETURN(lhs, expr) \
  VIGIL_ASSIGN_OR_RETURN_IMPL_(VIGIL_CONCAT_(_vigil_sor_, __LINE__), lhs, expr)
#define VIGIL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
