// src/aggregator/dashboard_assets.h — the dashboard's files (src/aggregator/dashboard/), compiled into the binary
// by cmake/EmbedAssets.cmake at build time (no front-end build step; nothing is fetched at run time).
// Served by the aggregator: index.html at `/`, the others at `/ui/<name>`.
#pragma once

#include <cstddef>

namespace vigil::aggregator {

struct DashboardAsset {
  const char* path;           // "/index.html", "/app.js", …
  const char* mime;           // Content-Type
  const unsigned char* data;  // the file's bytes (static storage)
  size_t size;
};

extern const DashboardAsset kDashboardAssets[];
extern const size_t kDashboardAssetCount;

}  // namespace vigil::aggregator
