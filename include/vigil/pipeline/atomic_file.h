// vigil/pipeline/atomic_file.h — whole-file writes that a crash cannot tear.
//
// WriteFileAtomic writes `content` to "<path>.tmp", fsyncs it, renames it over `path` and fsyncs the
// directory, so after a crash (process or power) the file holds the old or the new content, never a
// mix, and the rename itself is durable. Errors: Internal naming the path and the OS reason.
// Thread-safety: safe for different paths; one writer per path at a time.
#pragma once

#include <string>

#include "vigil/common/status.h"

namespace vigil::pipeline {

Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace vigil::pipeline
