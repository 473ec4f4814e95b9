// .npy parsing/serialization and .npz archives through libzip.
#include "kiln/ir/npy.h"

#include <zip.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <memory>

#include "kiln/base/file.h"

namespace kiln::ir {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// numpy writes a few hundred bytes of header for the dtypes kiln reads; a longer one is hostile.
constexpr size_t kMaxNpyHeaderBytes = 1 << 16;

struct NpyDescr {
  DType dtype;
  bool bigEndian;
};

// numpy type strings: byte order ('<', '>', '|', '=') then kind and size ("f4", "i8", "b1").
Result<NpyDescr> parseDescr(const std::string& descr, const std::string& what) {
  if (descr.size() < 3) return invalidInput("{}: unsupported numpy dtype '{}'", what, descr);
  const char order = descr[0];
  const std::string code = descr.substr(1);
  struct Entry {
    std::string_view code;
    DType dtype;
  };
  static constexpr Entry kCodes[] = {
      {"f4", DType::kFloat32}, {"f2", DType::kFloat16}, {"f8", DType::kFloat64},
      {"i8", DType::kInt64},   {"i4", DType::kInt32},   {"i2", DType::kInt16},
      {"i1", DType::kInt8},    {"u8", DType::kUInt64},  {"u4", DType::kUInt32},
      {"u2", DType::kUInt16},  {"u1", DType::kUInt8},   {"b1", DType::kBool},
  };
  for (const auto& entry : kCodes) {
    if (entry.code == code) return NpyDescr{entry.dtype, order == '>'};
  }
  return unsupported(
      "{}: numpy dtype '{}' is not supported (kiln reads float16/32/64, "
      "int8/16/32/64, uint8/16/32/64 and bool)",
      what, descr);
}

std::string descrFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat16:
      return "<f2";
    case DType::kFloat64:
      return "<f8";
    case DType::kInt64:
      return "<i8";
    case DType::kInt32:
      return "<i4";
    case DType::kInt16:
      return "<i2";
    case DType::kInt8:
      return "|i1";
    case DType::kUInt64:
      return "<u8";
    case DType::kUInt32:
      return "<u4";
    case DType::kUInt16:
      return "<u2";
    case DType::kUInt8:
      return "|u1";
    case DType::kBool:
      return "|b1";
    case DType::kBFloat16:
      return "";
  }
  return "";
}

// Reverses the axes of a row-major tensor (turns Fortran-ordered data into C order).
Tensor reverseAxes(const Tensor& input) {
  const Shape& inShape = input.shape();
  std::vector<int64_t> outDims(inShape.dims().rbegin(), inShape.dims().rend());
  Tensor out(input.dtype(), Shape(outDims));
  const size_t size = dtypeSize(input.dtype());
  const auto inStrides = inShape.strides();
  const size_t rank = inShape.rank();
  std::vector<int64_t> index(rank, 0);  // index into the output
  for (int64_t flat = 0; flat < out.elementCount(); ++flat) {
    int64_t source = 0;
    for (size_t axis = 0; axis < rank; ++axis) source += index[axis] * inStrides[rank - 1 - axis];
    std::memcpy(out.mutableRawData() + flat * size, input.rawData() + source * size, size);
    for (size_t axis = rank; axis-- > 0;) {
      if (++index[axis] < outDims[axis]) break;
      index[axis] = 0;
    }
  }
  return out;
}

// The value of `key` in the header's Python dict literal: a quoted string (quotes removed), True,
// False, or a parenthesised tuple. A plain scan, not std::regex, whose backtracking recurses once
// per character and overflows the stack on a long header.
Result<std::string> headerField(const std::string& header, const std::string& key,
                                const std::string& what) {
  for (size_t at = 0; at < header.size(); ++at) {
    const char quote = header[at];
    if (quote != '\'' && quote != '"') continue;
    if (header.compare(at + 1, key.size(), key) != 0 || at + 1 + key.size() >= header.size() ||
        header[at + 1 + key.size()] != quote) {
      continue;
    }
    size_t pos = at + key.size() + 2;
    while (pos < header.size() && std::isspace(static_cast<unsigned char>(header[pos]))) ++pos;
    if (pos >= header.size() || header[pos] != ':') continue;
    ++pos;
    while (pos < header.size() && std::isspace(static_cast<unsigned char>(header[pos]))) ++pos;
    if (pos >= header.size()) break;
    const char first = header[pos];
    if (first == '\'' || first == '"') {
      const size_t end = header.find(first, pos + 1);
      if (end == std::string::npos) break;
      return header.substr(pos + 1, end - pos - 1);
    }
    if (first == '(') {
      const size_t end = header.find(')', pos);
      if (end == std::string::npos) break;
      return header.substr(pos, end - pos + 1);
    }
    for (const char* word : {"True", "False"}) {
      if (header.compare(pos, std::strlen(word), word) == 0) return std::string(word);
    }
    break;
  }
  return invalidInput("{}: .npy header has no '{}' field", what, key);
}

Result<std::vector<int64_t>> parseShapeTuple(const std::string& tuple, const std::string& what) {
  if (tuple.size() < 2 || tuple.front() != '(' || tuple.back() != ')') {
    return invalidInput("{}: .npy shape '{}' is not a tuple", what, tuple);
  }
  std::vector<int64_t> dims;
  std::string inner = tuple.substr(1, tuple.size() - 2);
  size_t pos = 0;
  while (pos < inner.size()) {
    const size_t comma = inner.find(',', pos);
    std::string item =
        inner.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    // Spaces around a dimension are allowed, not inside it: numpy reads "(99 9,)" as an error.
    const auto isSpace = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    const auto first = std::find_if_not(item.begin(), item.end(), isSpace);
    const auto last = std::find_if_not(item.rbegin(), item.rend(), isSpace).base();
    item = first < last ? std::string(first, last) : std::string();
    if (!item.empty()) {
      if (!std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          item.size() > 18) {
        return invalidInput("{}: .npy shape {} is malformed", what, tuple);
      }
      dims.push_back(std::stoll(item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return dims;
}

}  // namespace

Result<Tensor> parseNpy(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return invalidInput("{}: not a .npy file (bad magic)", what);
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t headerLength = 0;
  size_t headerStart = 0;
  if (major == 1) {
    headerLength = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    headerStart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return invalidInput("{}: truncated .npy header", what);
    for (int i = 0; i < 4; ++i)
      headerLength |= size_t{static_cast<uint8_t>(bytes[8 + i])} << (8 * i);
    headerStart = 12;
  } else {
    return unsupported("{}: .npy format version {} is not supported", what, major);
  }
  if (headerLength > kMaxNpyHeaderBytes) {
    return invalidInput("{}: .npy header of {} bytes is longer than kiln reads ({})", what,
                        headerLength, kMaxNpyHeaderBytes);
  }
  if (bytes.size() < headerStart + headerLength) {
    return invalidInput("{}: truncated .npy header", what);
  }
  const std::string header(bytes.substr(headerStart, headerLength));
  KILN_ASSIGN_OR_RETURN(std::string descrText, headerField(header, "descr", what));
  KILN_ASSIGN_OR_RETURN(std::string fortran, headerField(header, "fortran_order", what));
  KILN_ASSIGN_OR_RETURN(std::string shapeText, headerField(header, "shape", what));
  KILN_ASSIGN_OR_RETURN(NpyDescr descr, parseDescr(descrText, what));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, parseShapeTuple(shapeText, what));
  const bool fortranOrder = fortran == "True";
  Shape storedShape(fortranOrder ? std::vector<int64_t>(dims.rbegin(), dims.rend()) : dims);
  // The data present is checked against the shape before anything is allocated.
  auto counted = storedShape.checkedElementCount();
  if (!counted.isOk()) return counted.status().withContext(what);
  const size_t needed = static_cast<size_t>(*counted) * dtypeSize(descr.dtype);
  const std::string_view data = bytes.substr(headerStart + headerLength);
  if (data.size() != needed) {
    return invalidInput("{}: .npy data holds {} bytes, but shape {} of {} needs {}", what,
                        data.size(), Shape(dims).toString(), dtypeName(descr.dtype), needed);
  }
  auto allocated = Tensor::allocate(descr.dtype, storedShape);
  if (!allocated.isOk()) return allocated.status().withContext(what);
  Tensor tensor = std::move(allocated).value();
  std::memcpy(tensor.mutableRawData(), data.data(), data.size());
  const size_t size = dtypeSize(descr.dtype);
  if (descr.bigEndian && size > 1) {
    std::byte* raw = tensor.mutableRawData();
    for (int64_t i = 0; i < tensor.elementCount(); ++i)
      std::reverse(raw + i * size, raw + (i + 1) * size);
  }
  return fortranOrder ? reverseAxes(tensor) : tensor;
}

Result<std::string> serializeNpy(const Tensor& tensor) {
  const std::string descr = descrFor(tensor.dtype());
  if (descr.empty()) {
    return unsupported("{} tensors cannot be written as .npy (numpy has no such dtype)",
                       dtypeName(tensor.dtype()));
  }
  std::string shape = "(";
  for (int64_t dim : tensor.shape().dims()) shape += std::to_string(dim) + ", ";
  if (tensor.rank() > 1) shape.resize(shape.size() - 2);
  if (tensor.rank() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  // Pad with spaces and a newline so the data starts on a 64-byte boundary.
  const bool v2 = header.size() + 11 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out(kMagic);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  const size_t length = header.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i)
    out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  out += header;
  out.append(reinterpret_cast<const char*>(tensor.rawData()), tensor.byteSize());
  return out;
}

Result<Tensor> readNpy(const fs::path& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(path));
  return parseNpy(bytes, path.string());
}

Status writeNpy(const fs::path& path, const Tensor& tensor) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, serializeNpy(tensor));
  return writeFileAtomically(path, bytes);
}

namespace {
struct ZipCloser {
  void operator()(zip_t* archive) const { zip_discard(archive); }
};
using ZipPtr = std::unique_ptr<zip_t, ZipCloser>;

std::string zipErrorText(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string text = zip_error_strerror(&error);
  zip_error_fini(&error);
  return text;
}
}  // namespace

Result<NamedTensors> readNpz(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return ioError("'{}' does not exist", path.string());
  int errorCode = 0;
  ZipPtr archive(zip_open(path.c_str(), ZIP_RDONLY, &errorCode));
  if (!archive) {
    return invalidInput("'{}' is not a readable .npz (zip) archive: {}", path.string(),
                        zipErrorText(errorCode));
  }
  NamedTensors tensors;
  const zip_int64_t count = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < count; ++i) {
    zip_stat_t stat;
    if (zip_stat_index(archive.get(), i, 0, &stat) != 0) {
      return invalidInput("'{}': cannot read entry {}: {}", path.string(), i,
                          zip_strerror(archive.get()));
    }
    std::string name = stat.name;
    const std::string what = path.string() + ":" + name;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".npy") name.resize(name.size() - 4);
    if (stat.size > static_cast<zip_uint64_t>(kMaxTensorElements)) {
      return invalidInput("{}: entry is too large ({} bytes)", what, stat.size);
    }
    zip_file_t* file = zip_fopen_index(archive.get(), i, 0);
    if (!file) return invalidInput("{}: {}", what, zip_strerror(archive.get()));
    // Read as the bytes come, never trusting the size the archive declares for an allocation:
    // memory follows what the entry really holds.
    std::string bytes;
    char chunk[1 << 16];
    zip_int64_t read = 0;
    while ((read = zip_fread(file, chunk, sizeof chunk)) > 0) {
      bytes.append(chunk, static_cast<size_t>(read));
      if (bytes.size() > stat.size) break;
    }
    zip_fclose(file);
    if (read < 0 || bytes.size() != stat.size) {
      return invalidInput("{}: entry is truncated or corrupt", what);
    }
    KILN_ASSIGN_OR_RETURN(Tensor tensor, parseNpy(bytes, what));
    tensors.emplace_back(name, std::move(tensor));
  }
  return tensors;
}

Status writeNpz(const fs::path& path, const NamedTensors& tensors, bool compressed) {
  std::vector<std::string> buffers;
  buffers.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    auto bytes = serializeNpy(tensor);
    if (!bytes.isOk()) return bytes.status().withContext("tensor '" + name + "'");
    buffers.push_back(std::move(bytes).value());
  }
  const fs::path temporary = temporaryPathFor(path);
  int errorCode = 0;
  ZipPtr archive(zip_open(temporary.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &errorCode));
  if (!archive) {
    return ioError("cannot write '{}': {}", path.string(), zipErrorText(errorCode));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    zip_source_t* source =
        zip_source_buffer(archive.get(), buffers[i].data(), buffers[i].size(), 0);
    const std::string entry = tensors[i].first + ".npy";
    const zip_int64_t index =
        source ? zip_file_add(archive.get(), entry.c_str(), source, ZIP_FL_ENC_UTF_8) : -1;
    if (index < 0) {
      if (source) zip_source_free(source);
      return ioError("cannot add '{}' to '{}': {}", entry, path.string(),
                     zip_strerror(archive.get()));
    }
    zip_set_file_compression(archive.get(), index, compressed ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
  }
  if (zip_close(archive.get()) != 0) {
    const std::string message = zip_strerror(archive.get());
    std::error_code ec;
    fs::remove(temporary, ec);
    return ioError("cannot write '{}': {}", path.string(), message);
  }
  archive.release();  // zip_close freed it
  return commitTemporary(temporary, path);
}

Result<NamedTensors> readTensorFile(const fs::path& path, const std::string& defaultName) {
  if (path.extension() == ".npz") return readNpz(path);
  if (path.extension() == ".npy") {
    KILN_ASSIGN_OR_RETURN(Tensor tensor, readNpy(path));
    return NamedTensors{{defaultName, std::move(tensor)}};
  }
  return invalidInput("'{}': tensor files must end in .npy or .npz", path.string());
}

}  // namespace kiln::ir
