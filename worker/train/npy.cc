#include "worker/train/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <system_error>

namespace geo::train {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// A header is a few hundred bytes; anything near this is not a .npy file.
constexpr size_t kMaxHeader = size_t{1} << 20;

std::string errnoText(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// The value of `key` in the header's dict literal, as written (a quoted
// string without its quotes, True/False, or a parenthesized tuple).
std::optional<std::string_view> dictValue(std::string_view dict, std::string_view key) {
  for (const char quote : {'\'', '"'}) {
    const std::string quoted = fmt::format("{0}{1}{0}", quote, key);
    size_t at = dict.find(quoted);
    if (at == std::string_view::npos) continue;
    at = dict.find(':', at + quoted.size());
    if (at == std::string_view::npos) return std::nullopt;
    ++at;
    while (at < dict.size() && std::isspace(static_cast<unsigned char>(dict[at]))) ++at;
    if (at >= dict.size()) return std::nullopt;
    const char open = dict[at];
    if (open == '\'' || open == '"') {
      const size_t end = dict.find(open, at + 1);
      if (end == std::string_view::npos) return std::nullopt;
      return dict.substr(at + 1, end - at - 1);
    }
    if (open == '(') {
      const size_t end = dict.find(')', at);
      if (end == std::string_view::npos) return std::nullopt;
      return dict.substr(at, end - at + 1);
    }
    size_t end = at;
    while (end < dict.size() && std::isalnum(static_cast<unsigned char>(dict[end]))) ++end;
    return dict.substr(at, end - at);
  }
  return std::nullopt;
}

// "(60000, 784)", "(60000,)", "()".
std::optional<std::vector<int64_t>> parseShape(std::string_view tuple) {
  if (tuple.size() < 2 || tuple.front() != '(' || tuple.back() != ')') return std::nullopt;
  std::vector<int64_t> shape;
  size_t i = 1;
  while (true) {
    while (i < tuple.size() && (std::isspace(static_cast<unsigned char>(tuple[i])) != 0)) ++i;
    if (tuple[i] == ')') break;
    if (std::isdigit(static_cast<unsigned char>(tuple[i])) == 0) return std::nullopt;
    int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(tuple[i])) != 0) {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return std::nullopt;
      v = v * 10 + (tuple[i] - '0');
      ++i;
    }
    // numpy writes a trailing L on Python 2's longs.
    if (tuple[i] == 'L') ++i;
    shape.push_back(v);
    while (i < tuple.size() && (std::isspace(static_cast<unsigned char>(tuple[i])) != 0)) ++i;
    if (tuple[i] == ',') {
      ++i;
      continue;
    }
    if (tuple[i] != ')') return std::nullopt;
    break;
  }
  return shape;
}

struct Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) ::munmap(addr, size);
  }
};

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::string NpyArray::describe() const {
  const char* kind_ = kind == NpyKind::kBool       ? "bool"
                      : kind == NpyKind::kUnsigned ? "uint"
                      : kind == NpyKind::kSigned   ? "int"
                                                   : "float";
  return fmt::format("{}{} [{}]", kind_,
                     kind == NpyKind::kBool ? std::string() : std::to_string(itemSize * 8),
                     fmt::join(shape, ", "));
}

Status parseNpyHeader(std::string_view head, size_t fileBytes, const std::filesystem::path& path,
                      NpyArray& out, size_t* dataOffset) {
  const std::string file = path.string();
  if (head.size() < 10 || head.substr(0, kMagic.size()) != kMagic) {
    return dataLoss(fmt::format(
        "{}: not a .npy file (it does not start with \\x93NUMPY; write it with numpy.save)", file));
  }
  const auto major = static_cast<unsigned char>(head[6]);
  size_t headerLen = 0, prefix = 0;
  if (major == 1) {
    headerLen = static_cast<unsigned char>(head[8]) |
                (static_cast<size_t>(static_cast<unsigned char>(head[9])) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (head.size() < 12) return dataLoss(fmt::format("{}: the .npy header is cut short", file));
    for (int b = 3; b >= 0; --b)
      headerLen = (headerLen << 8) | static_cast<unsigned char>(head[8 + b]);
    prefix = 12;
  } else {
    return dataLoss(fmt::format("{}: .npy format version {}.{} is not supported (allowed: 1, 2, 3)",
                                file, major,
                                static_cast<unsigned>(static_cast<unsigned char>(head[7]))));
  }
  if (headerLen > kMaxHeader || prefix + headerLen > head.size()) {
    return dataLoss(fmt::format("{}: the .npy header claims {} bytes, more than the file holds",
                                file, headerLen));
  }
  const std::string_view dict = head.substr(prefix, headerLen);
  const auto descr = dictValue(dict, "descr");
  const auto fortran = dictValue(dict, "fortran_order");
  const auto shapeText = dictValue(dict, "shape");
  if (!descr || !fortran || !shapeText) {
    return dataLoss(fmt::format("{}: the .npy header {} lacks descr, fortran_order or shape", file,
                                std::string(dict.substr(0, 200))));
  }
  out.path = path;
  out.descr = std::string(*descr);
  if (*fortran != "False") {
    return invalidArgument(fmt::format(
        "{}: the array is in Fortran order (allowed: C order; save numpy.ascontiguousarray(a))",
        file));
  }
  const auto shape = parseShape(*shapeText);
  if (!shape) {
    return dataLoss(
        fmt::format("{}: the .npy shape {} cannot be read", file, std::string(*shapeText)));
  }
  out.shape = *shape;
  // dtype: byte order, kind, size ("<f4"). '|' (no order) and '=' (native,
  // little-endian on every machine this runs on) are as good as '<'.
  const std::string& d = out.descr;
  const bool known = d.size() == 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=') &&
                     std::string_view("buif").find(d[1]) != std::string_view::npos &&
                     std::isdigit(static_cast<unsigned char>(d[2])) != 0;
  if (!known) {
    return invalidArgument(fmt::format(
        "{}: dtype {} is not supported (allowed: little-endian bool, integers and floats such as "
        "<f4, <i8, |u1{}; convert with a.astype(\"<f4\"))",
        file, d, d.size() == 3 && d[0] == '>' ? "; this one is big-endian" : ""));
  }
  out.itemSize = static_cast<size_t>(d[2] - '0');
  out.kind = d[1] == 'b'   ? NpyKind::kBool
             : d[1] == 'u' ? NpyKind::kUnsigned
             : d[1] == 'i' ? NpyKind::kSigned
                           : NpyKind::kFloat;
  const bool sizeOk =
      out.kind == NpyKind::kBool ? out.itemSize == 1
      : out.kind == NpyKind::kFloat
          ? (out.itemSize == 2 || out.itemSize == 4 || out.itemSize == 8)
          : (out.itemSize == 1 || out.itemSize == 2 || out.itemSize == 4 || out.itemSize == 8);
  if (!sizeOk) {
    return invalidArgument(
        fmt::format("{}: dtype {} is not supported (allowed: 1-, 2-, 4- or 8-byte "
                    "integers, 2-, 4- or 8-byte floats)",
                    file, d));
  }
  // The payload: elements × itemSize, with an overflow check on the way.
  uint64_t elements = 1;
  for (const int64_t dim : out.shape) {
    if (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return dataLoss(
          fmt::format("{}: the shape ({}) overflows", file, fmt::join(out.shape, ", ")));
    }
    elements *= static_cast<uint64_t>(dim);
  }
  const size_t offset = prefix + headerLen;
  const uint64_t expected = elements * out.itemSize;
  if (fileBytes < offset || fileBytes - offset != expected) {
    return dataLoss(fmt::format(
        "{}: holds {} bytes of data where its header ({} [{}]) says {} ({})", file,
        fileBytes < offset ? 0 : fileBytes - offset, out.descr, fmt::join(out.shape, ", "),
        expected, fileBytes - offset < expected ? "truncated" : "trailing bytes"));
  }
  out.bytes = expected;
  *dataOffset = offset;
  return {};
}

StatusOr<MappedFile> mapFile(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return notFound(fmt::format("{}: no such file", path.string()));
    if (err == EACCES) {
      return Status(StatusCode::kPermissionDenied,
                    fmt::format("{}: may not be read ({})", path.string(), errnoText(err)));
    }
    return dataLoss(fmt::format("{}: cannot be opened: {}", path.string(), errnoText(err)));
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return dataLoss(fmt::format("{}: not a regular file", path.string()));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return dataLoss(fmt::format("{}: the file is empty", path.string()));
  auto mapping = std::make_shared<Mapping>();
  mapping->addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping->addr == MAP_FAILED) {
    return dataLoss(fmt::format("{}: cannot be mapped: {}", path.string(), errnoText(errno)));
  }
  mapping->size = size;
  MappedFile out;
  out.data = static_cast<const std::byte*>(mapping->addr);
  out.size = size;
  out.mapping = std::shared_ptr<const void>(mapping, mapping->addr);
  return out;
}

StatusOr<NpyArray> openNpy(const std::filesystem::path& path) {
  auto file = mapFile(path);
  if (!file.ok()) return file.status();
  NpyArray out;
  size_t offset = 0;
  const std::string_view head(reinterpret_cast<const char*>(file->data),
                              std::min(file->size, kMaxHeader + 12));
  GEO_RETURN_IF_ERROR(parseNpyHeader(head, file->size, path, out, &offset));
  out.data = file->data + offset;
  out.mapping = std::move(file->mapping);
  return out;
}

}  // namespace geo::train
