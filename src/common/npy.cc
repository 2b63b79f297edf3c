#include "vigil/common/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <charconv>

namespace vigil {
namespace {

struct DescrEntry {
  const char* descr;
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::kFloat32}, {"<f2", DType::kFloat16}, {"<f8", DType::kFloat64}, {"|i1", DType::kInt8},
    {"|u1", DType::kUInt8},   {"<i2", DType::kInt16},   {"<i4", DType::kInt32},   {"<i8", DType::kInt64},
    {"|b1", DType::kBool},
};

std::string_view Strip(std::string_view s, std::string_view chars = " ") {
  const size_t b = s.find_first_not_of(chars);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(chars) - b + 1);
}

// Returns the text between `key':` and the next top-level ',' or '}' of the header dict.
std::string_view HeaderField(std::string_view header, std::string_view key) {
  const std::string quoted = StrCat("'", key, "'");
  size_t p = header.find(quoted);
  if (p == std::string_view::npos) return {};
  p = header.find(':', p + quoted.size());
  if (p == std::string_view::npos) return {};
  std::string_view rest = header.substr(p + 1);
  size_t end = rest[rest.find_first_not_of(' ')] == '(' ? rest.find(')') + 1 : rest.find_first_of(",}");
  return Strip(rest.substr(0, end));
}

}  // namespace

StatusOr<Tensor> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open '", path, "'"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](std::string_view why) { return absl::InvalidArgumentError(StrCat("'", path, "': ", why)); };
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) return bad("not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    return bad(StrCat("unsupported npy version ", major));
  }
  if (bytes.size() < offset + header_len) return bad("truncated header");
  const std::string_view header(bytes.data() + offset, header_len);
  std::string_view descr = HeaderField(header, "descr");
  descr = Strip(descr, "'");
  DType dtype = DType::kUndefined;
  for (const DescrEntry& e : kDescrs) {
    if (descr == e.descr) dtype = e.dtype;
  }
  if (dtype == DType::kUndefined) return bad(StrCat("unsupported dtype '", descr, "'"));
  if (HeaderField(header, "fortran_order") != "False") return bad("Fortran-order arrays are not supported");
  std::string_view shape_text = HeaderField(header, "shape");
  shape_text = Strip(shape_text, "()");
  Shape shape;
  for (size_t pos = 0; pos < shape_text.size();) {
    size_t comma = shape_text.find(',', pos);
    if (comma == std::string_view::npos) comma = shape_text.size();
    const std::string_view part = Strip(shape_text.substr(pos, comma - pos));
    pos = comma + 1;
    if (part.empty()) continue;
    int64_t d = -1;
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), d);
    if (ec != std::errc() || ptr != part.data() + part.size() || d < 0) return bad(StrCat("bad shape '", shape_text, "'"));
    shape.push_back(d);
  }
  Tensor t(dtype, shape);
  const size_t data_offset = offset + header_len;
  if (bytes.size() - data_offset != t.nbytes()) {
    return bad(StrCat("data holds ", bytes.size() - data_offset, " bytes, shape ", ShapeToString(shape),
                            " needs ", t.nbytes()));
  }
  if (t.nbytes()) std::memcpy(t.raw(), bytes.data() + data_offset, t.nbytes());
  return t;
}

Status WriteNpy(const std::string& path, const Tensor& tensor) {
  const char* descr = nullptr;
  for (const DescrEntry& e : kDescrs) {
    if (e.dtype == tensor.dtype()) descr = e.descr;
  }
  if (!descr) return absl::InvalidArgumentError(StrCat("'", path, "': dtype ", DTypeName(tensor.dtype()), " has no npy form"));
  std::string shape = "(";
  for (int64_t d : tensor.shape()) shape += std::to_string(d) + ",";
  if (tensor.rank() > 1) shape.pop_back();
  shape += ")";
  std::string header = StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::NotFoundError(StrCat("cannot write '", path, "'"));
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(tensor.raw()), static_cast<std::streamsize>(tensor.nbytes()));
  if (!out) return absl::InternalError(StrCat("write to '", path, "' failed"));
  return absl::OkStatus();
}

}  // namespace vigil
