// vigil/common/npy.h — read and write NumPy .npy files (tensors exchanged with test oracles).
//
// Format: NumPy's "npy" format, versions 1.0–3.0 (numpy.lib.format; NEP 1): magic "\x93NUMPY",
// version, little-endian header length, a Python dict literal {'descr', 'fortran_order', 'shape'},
// then the raw C-order data. Supported descr: <f4 <f2 <f8 |i1 |u1 <i2 <i4 <i8 |b1 (little endian).
// Errors: NotFound (file), InvalidArgument naming the file and what is wrong (bad magic, Fortran
// order, unsupported dtype, size mismatch). Thread-safety: free functions, no shared state.
#pragma once

#include <string>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"

namespace vigil {

StatusOr<Tensor> ReadNpy(const std::string& path);
Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace vigil
