#include "backends/python/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "deuteron/error.h"

namespace deuteron::python {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

// The value text after `'key':` in a header dict, up to the next top-level comma or brace.
std::string dict_value(const std::string& header, const std::string& key, const std::filesystem::path& path) {
  std::string k1 = "'" + key + "'", k2 = "\"" + key + "\"";
  size_t at = header.find(k1);
  if (at == std::string::npos) at = header.find(k2);
  if (at == std::string::npos)
    throw RuntimeError(fmt::format("{}: .npy header has no '{}': {}", path.string(), key, header));
  size_t colon = header.find(':', at + k1.size());
  if (colon == std::string::npos)
    throw RuntimeError(fmt::format("{}: malformed .npy header: {}", path.string(), header));
  size_t i = colon + 1;
  while (i < header.size() && header[i] == ' ') ++i;
  size_t start = i;
  int depth = 0;
  for (; i < header.size(); ++i) {
    char c = header[i];
    if (c == '(' || c == '[')
      ++depth;
    else if (c == ')' || c == ']')
      --depth;
    else if ((c == ',' || c == '}') && depth == 0)
      break;
  }
  std::string v = header.substr(start, i - start);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

std::string npy_descr(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::bf16: return "<u2";
    case DType::f16: return "<f2";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::boolean: return "|b1";
  }
  return "<f4";
}

void write_npy(const std::filesystem::path& path, const Tensor& t) {
  std::string shape;
  if (t.dim() == 1)
    shape = fmt::format("({},)", t.size(0));
  else
    shape = fmt::format("({})", fmt::join(t.sizes(), ", "));
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", npy_descr(t.dtype()), shape);
  size_t total = kMagicLen + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  Tensor c = t.contiguous();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw RuntimeError(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
  f.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  f.write(version, 2);
  uint16_t len = uint16_t(header.size());
  const char len_bytes[2] = {char(len & 0xff), char(len >> 8)};
  f.write(len_bytes, 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(c.data()), std::streamsize(c.nbytes()));
  if (!f) throw RuntimeError(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw RuntimeError(fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string bytes = ss.str();
  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    throw RuntimeError(fmt::format("{} is not a .npy file", path.string()));
  int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, offset;
  auto byte = [&](size_t i) { return size_t(static_cast<unsigned char>(bytes[i])); };
  if (major == 1) {
    header_len = byte(8) | byte(9) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw RuntimeError(fmt::format("{}: truncated .npy header", path.string()));
    header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    offset = 12;
  } else {
    throw RuntimeError(fmt::format("{}: unsupported .npy version {}", path.string(), major));
  }
  if (bytes.size() < offset + header_len)
    throw RuntimeError(fmt::format("{}: truncated .npy header", path.string()));
  std::string header = bytes.substr(offset, header_len);
  NpyArray a;
  std::string descr = dict_value(header, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"'))
    throw RuntimeError(fmt::format("{}: unsupported .npy descr {}", path.string(), descr));
  a.descr = descr.substr(1, descr.size() - 2);
  if (dict_value(header, "fortran_order", path) != "False")
    throw RuntimeError(fmt::format("{}: Fortran-order .npy files are not supported", path.string()));
  std::string shape = dict_value(header, "shape", path);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    throw RuntimeError(fmt::format("{}: malformed .npy shape {}", path.string(), shape));
  std::stringstream dims(shape.substr(1, shape.size() - 2));
  for (std::string item; std::getline(dims, item, ',');) {
    size_t b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    if (b == std::string::npos) continue;
    a.shape.push_back(std::stoll(item.substr(b, e - b + 1)));
  }
  a.data = bytes.substr(offset + header_len);
  return a;
}

void copy_npy_into(const NpyArray& a, const Tensor& out, const std::string& what) {
  if (a.shape != out.sizes())
    throw RuntimeError(fmt::format("{} has shape [{}], expected [{}]", what, fmt::join(a.shape, ", "),
                                   fmt::join(out.sizes(), ", ")));
  if (a.descr != npy_descr(out.dtype()))
    throw RuntimeError(fmt::format("{} has dtype '{}', expected '{}' ({})", what, a.descr,
                                   npy_descr(out.dtype()), dtype_name(out.dtype())));
  if (int64_t(a.data.size()) < out.nbytes())
    throw RuntimeError(
        fmt::format("{} holds {} bytes of data, expected {}", what, a.data.size(), out.nbytes()));
  if (out.is_contiguous()) {
    std::memcpy(out.data(), a.data.data(), size_t(out.nbytes()));
    return;
  }
  // A strided destination: go through a contiguous tensor of the same dtype.
  Tensor tmp = Tensor::empty(out.sizes(), out.dtype());
  std::memcpy(tmp.data(), a.data.data(), size_t(out.nbytes()));
  Tensor dst = out;  // shares the buffer
  for (int64_t i = 0; i < dst.numel(); ++i) dst.set(i, tmp.get(i));
}

}  // namespace deuteron::python
