// vigil/common/status.h — errors as values.
//
// vigil uses abseil's Status / StatusOr (absl/status) as its error type: a code plus a message.
// Each layer that returns an error adds what it knows, so a message reads like
// "model yolov8n.onnx: node '/model.22/Mul_2' (Mul): inputs [1,4,8400] and [1,5] do not broadcast".
// Exceptions never cross a module boundary; code that calls a throwing library converts at the call.
//
// Thread-safety: Status and StatusOr are values; distinct objects may be used from any thread.
#pragma once

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace vigil {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

// Returns `s` with "context: " prepended to its message (the code is kept). OK stays OK.
inline Status Annotate(const Status& s, std::string_view context) {
  if (s.ok()) return s;
  return Status(s.code(), absl::StrCat(context, ": ", s.message()));
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
