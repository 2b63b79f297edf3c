// onnx_import.h — reads an ONNX ModelProto (protobuf, Debian libonnx's onnx-ml.pb.h) into a Graph.
//
// The file is parsed directly; libonnx's checker is not used (Debian's 1.12 rejects IR > 8 while
// current exports are IR 9/10). Supported: IR 3+, ai.onnx opsets 7..21 (YOLO exports use 11..20),
// initializers as raw_data or typed fields (float, float16, int8/uint8, int32, int64, double, bool),
// Constant nodes turned into initializers, attributes of every non-graph kind, metadata_props.
// External data (initializers in side files, ONNX external_data: location relative to the model's
// folder, offset, length) is read by ImportOnnxFile; a location outside that folder is InvalidArgument.
// Not supported (Unimplemented, naming the node or tensor): external data given to ImportOnnxBytes
// without a folder, sparse initializers, graph-valued attributes (If/Loop/Scan bodies).
//
// Errors: NotFound (path missing/unreadable), InvalidArgument ("not an ONNX model" when the bytes
// do not parse, with the file name; truncated files fail to parse), and the above.
// Thread-safety: free functions without shared state.
#pragma once

#include <string>
#include <string_view>

#include "vigil/common/status.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

StatusOr<Graph> ImportOnnxFile(const std::string& path);
// `source_name` names the model in error messages; `external_dir` is where external data lives
// (empty: external data is an error).
StatusOr<Graph> ImportOnnxBytes(std::string_view bytes, std::string_view source_name,
                                const std::string& external_dir = "");

}  // namespace vigil::infer
