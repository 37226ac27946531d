#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "runtime/json.h"
#include "support/error.h"
#include "support/file_io.h"
#include "support/read_file.h"

namespace kiln::rt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

namespace {

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64,
                                DType::i32, DType::i16, DType::i8,   DType::u8,  DType::boolean};

constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// A tensor name for messages: names come from hostile files and may be huge.
std::string show(std::string_view name) {
  constexpr size_t kLimit = 200;
  if (name.size() <= kLimit) return std::string(name);
  return fmt::format("{}... ({} bytes)", name.substr(0, kLimit), name.size());
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += fmt::format("{}", shape[i]);
  }
  out += "]";
  return out;
}

std::string supported_dtypes() {
  std::string out;
  for (DType d : kAllDTypes) {
    if (!out.empty()) out += ", ";
    out += dtype_name(d);
  }
  return out;
}

// "a json array" etc.
std::string json_kind(const json::Value& v) {
  return fmt::format("a json {}", json::kind_name(v.kind()));
}

// Element count of a shape with non-negative dims; nullopt if it exceeds int64.
std::optional<uint64_t> checked_numel(const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  uint64_t n = 1;
  for (int64_t d : shape) {
    uint64_t u = static_cast<uint64_t>(d);
    if (n > kInt64Max / u) return std::nullopt;
    n *= u;
  }
  return n;
}

// Byte size of numel elements of dtype; nullopt if it exceeds int64.
std::optional<uint64_t> checked_nbytes(uint64_t numel, DType dtype) {
  uint64_t size = dtype_size(dtype);
  if (numel > kInt64Max / size) return std::nullopt;
  return numel * size;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i16:
      return 2;
    case DType::i8:
      return 1;
    case DType::u8:
      return 1;
    case DType::boolean:
      return 1;
  }
  KILN_ASSERT(false, fmt::format("bad DType {}", static_cast<int>(dtype)));
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::f64:
      return "F64";
    case DType::i64:
      return "I64";
    case DType::i32:
      return "I32";
    case DType::i16:
      return "I16";
    case DType::i8:
      return "I8";
    case DType::u8:
      return "U8";
    case DType::boolean:
      return "BOOL";
  }
  KILN_ASSERT(false, fmt::format("bad DType {}", static_cast<int>(dtype)));
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  // Wrapping unsigned arithmetic: no UB even for an unvalidated shape.
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

// ---------------------------------------------------------------------------------------
// Loading

namespace {

class HeaderParser {
 public:
  HeaderParser(const std::string& label, uint64_t data_size)
      : label_(label), data_size_(data_size) {}

  TensorInfo parse_tensor(const std::string& name, const json::Value& entry) {
    const std::string n = show(name);
    if (!entry.is_object()) {
      fail("safetensors '{}': tensor '{}' entry is {}, expected an object", label_, n,
           json_kind(entry));
    }
    const json::Value* dtype_v = nullptr;
    const json::Value* shape_v = nullptr;
    const json::Value* offsets_v = nullptr;
    for (const auto& [key, value] : entry.as_object()) {
      if (key == "dtype") {
        dtype_v = &value;
      } else if (key == "shape") {
        shape_v = &value;
      } else if (key == "data_offsets") {
        offsets_v = &value;
      } else {
        fail(
            "safetensors '{}': tensor '{}' has unexpected key '{}' (expected dtype, shape, "
            "data_offsets)",
            label_, n, show(key));
      }
    }
    if (!dtype_v) fail("safetensors '{}': tensor '{}' is missing 'dtype'", label_, n);
    if (!shape_v) fail("safetensors '{}': tensor '{}' is missing 'shape'", label_, n);
    if (!offsets_v) fail("safetensors '{}': tensor '{}' is missing 'data_offsets'", label_, n);

    TensorInfo info;
    info.name = name;

    // dtype
    if (!dtype_v->is_string()) {
      fail("safetensors '{}': tensor '{}' dtype is {}, expected a string", label_, n,
           json_kind(*dtype_v));
    }
    std::optional<DType> dtype = dtype_from_name(dtype_v->as_string());
    if (!dtype) {
      fail("safetensors '{}': tensor '{}' has unknown dtype '{}' (supported: {})", label_, n,
           show(dtype_v->as_string()), supported_dtypes());
    }
    info.dtype = *dtype;

    // shape
    if (!shape_v->is_array()) {
      fail("safetensors '{}': tensor '{}' shape is {}, expected an array of integers", label_, n,
           json_kind(*shape_v));
    }
    const json::Value::Array& dims = shape_v->as_array();
    for (size_t i = 0; i < dims.size(); ++i) {
      if (!dims[i].is_int()) {
        fail("safetensors '{}': tensor '{}' shape dimension {} is {}, expected an integer", label_,
             n, i, json_kind(dims[i]));
      }
      info.shape.push_back(dims[i].as_int());
    }
    for (size_t i = 0; i < info.shape.size(); ++i) {
      if (info.shape[i] < 0) {
        fail("safetensors '{}': tensor '{}' shape {} has negative dimension {} at index {}", label_,
             n, format_shape(info.shape), info.shape[i], i);
      }
    }
    std::optional<uint64_t> numel = checked_numel(info.shape);
    if (!numel) {
      fail("safetensors '{}': tensor '{}' shape {} element count overflows int64", label_, n,
           format_shape(info.shape));
    }
    std::optional<uint64_t> nbytes = checked_nbytes(*numel, info.dtype);
    if (!nbytes) {
      fail(
          "safetensors '{}': tensor '{}' shape {} with dtype {} has {} elements, whose byte size "
          "overflows int64",
          label_, n, format_shape(info.shape), dtype_name(info.dtype), *numel);
    }

    // data_offsets
    if (!offsets_v->is_array()) {
      fail("safetensors '{}': tensor '{}' data_offsets is {}, expected [begin, end]", label_, n,
           json_kind(*offsets_v));
    }
    const json::Value::Array& offs = offsets_v->as_array();
    if (offs.size() != 2) {
      fail("safetensors '{}': tensor '{}' data_offsets has {} elements, expected 2 [begin, end]",
           label_, n, offs.size());
    }
    uint64_t bounds[2];
    for (size_t i = 0; i < 2; ++i) {
      if (!offs[i].is_int()) {
        fail(
            "safetensors '{}': tensor '{}' data_offsets[{}] is {}, expected a non-negative "
            "integer",
            label_, n, i, json_kind(offs[i]));
      }
      if (offs[i].as_int() < 0) {
        fail(
            "safetensors '{}': tensor '{}' data_offsets[{}] is {}, expected a non-negative "
            "integer",
            label_, n, i, offs[i].as_int());
      }
      bounds[i] = static_cast<uint64_t>(offs[i].as_int());
    }
    info.begin = bounds[0];
    info.end = bounds[1];
    if (info.begin > info.end) {
      fail("safetensors '{}': tensor '{}' data offsets [{}, {}) have begin after end", label_, n,
           info.begin, info.end);
    }
    if (info.end - info.begin != *nbytes) {
      fail(
          "safetensors '{}': tensor '{}' data offsets [{}, {}) hold {} bytes, but shape {} with "
          "dtype {} needs {} bytes",
          label_, n, info.begin, info.end, info.end - info.begin, format_shape(info.shape),
          dtype_name(info.dtype), *nbytes);
    }
    if (info.end > data_size_) {
      fail("safetensors '{}': tensor '{}' data offsets [{}, {}) exceed data section of {} bytes",
           label_, n, info.begin, info.end, data_size_);
    }
    return info;
  }

  std::map<std::string, std::string> parse_metadata(const json::Value& value) {
    if (!value.is_object()) {
      fail("safetensors '{}': __metadata__ is {}, expected an object of strings", label_,
           json_kind(value));
    }
    std::map<std::string, std::string> out;
    for (const auto& [key, v] : value.as_object()) {
      if (!v.is_string()) {
        fail("safetensors '{}': __metadata__ key '{}' has {} value, expected a string", label_,
             show(key), json_kind(v));
      }
      out.emplace(key, v.as_string());
    }
    return out;
  }

 private:
  const std::string& label_;
  uint64_t data_size_;
};

}  // namespace

SafeTensors SafeTensors::from_bytes(std::vector<uint8_t> bytes, std::string label) {
  SafeTensors st;
  st.label_ = std::move(label);
  st.owned_ = std::move(bytes);
  return validate(std::move(st));
}

SafeTensors SafeTensors::validate(SafeTensors st) {
  const std::string& L = st.label_;
  const uint64_t file_size = st.size();

  if (file_size < 8) {
    fail("safetensors '{}': file is {} bytes, too short for the 8-byte header length", L,
         file_size);
  }
  const uint64_t header_len = read_u64_le(st.data());
  if (header_len > kMaxHeaderBytes) {
    fail("safetensors '{}': header length {} exceeds the limit of {} bytes", L, header_len,
         kMaxHeaderBytes);
  }
  if (header_len > file_size - 8) {
    fail(
        "safetensors '{}': header length {} exceeds the {} bytes after the length prefix "
        "(file truncated?)",
        L, header_len, file_size - 8);
  }
  st.data_start_ = static_cast<size_t>(8 + header_len);
  const uint64_t data_size = file_size - st.data_start_;

  std::string_view header_text(reinterpret_cast<const char*>(st.data() + 8),
                               static_cast<size_t>(header_len));
  json::Value header;
  try {
    header = json::parse(header_text);
  } catch (const json::ParseError& e) {
    fail("safetensors '{}': header ({} bytes) is not valid json: {} at header byte {}", L,
         header_len, e.detail(), e.offset());
  }
  if (!header.is_object()) {
    fail("safetensors '{}': header is {}, expected an object", L, json_kind(header));
  }

  HeaderParser parser(L, data_size);
  for (const auto& [name, entry] : header.as_object()) {
    if (name == "__metadata__") {
      st.metadata_ = parser.parse_metadata(entry);
      continue;
    }
    st.tensors_.push_back(parser.parse_tensor(name, entry));
  }

  // Non-empty byte ranges must be disjoint. Sorted by begin, a range overlaps an earlier one
  // iff it starts before the furthest end seen so far.
  std::vector<size_t> order;
  order.reserve(st.tensors_.size());
  for (size_t i = 0; i < st.tensors_.size(); ++i) {
    if (st.tensors_[i].begin != st.tensors_[i].end) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TensorInfo& x = st.tensors_[a];
    const TensorInfo& y = st.tensors_[b];
    return x.begin != y.begin ? x.begin < y.begin : a < b;
  });
  const TensorInfo* furthest = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = st.tensors_[i];
    if (furthest && t.begin < furthest->end) {
      fail("safetensors '{}': tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", L,
           show(furthest->name), furthest->begin, furthest->end, show(t.name), t.begin, t.end);
    }
    if (!furthest || t.end > furthest->end) furthest = &t;
  }

  for (size_t i = 0; i < st.tensors_.size(); ++i) st.index_.emplace(st.tensors_[i].name, i);
  return st;
}

SafeTensors SafeTensors::load(const std::string& path) {
  // A directory, a device (/dev/zero never ends) or a file larger than memory is an error
  // naming the path.
  // "-" is a file of that name here, not standard input.
  const std::string file = path == "-" ? "./-" : path;
  // A regular file is mapped (its pages shared with every process mapping it); a pipe is read.
  if (!is_regular_file(file)) return from_bytes(read_input_file(file, "safetensors file"), path);
  SafeTensors st;
  st.label_ = path;
  st.mapped_ = MappedFile::map(file, "safetensors file");
  return validate(std::move(st));
}

const TensorInfo* SafeTensors::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafeTensors::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("safetensors '{}' has no tensor '{}'", label_, show(name));
  return *t;
}

std::span<const uint8_t> SafeTensors::bytes(const TensorInfo& tensor) const {
  const uint64_t data_size = size() - data_start_;
  if (tensor.begin > tensor.end || tensor.end > data_size) {
    fail(
        "safetensors '{}': tensor '{}' byte range [{}, {}) is outside the data section of {} "
        "bytes",
        label_, show(tensor.name), tensor.begin, tensor.end, data_size);
  }
  return std::span<const uint8_t>(data() + data_start_ + tensor.begin,
                                  static_cast<size_t>(tensor.end - tensor.begin));
}

std::vector<float> SafeTensors::to_f32(const TensorInfo& tensor) const {
  if (tensor.dtype != DType::f32) {
    fail("safetensors '{}': tensor '{}' has dtype {}, expected F32", label_, show(tensor.name),
         dtype_name(tensor.dtype));
  }
  std::span<const uint8_t> raw = bytes(tensor);
  std::vector<float> out(raw.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), raw.data(), out.size() * sizeof(float));
  return out;
}

std::vector<int64_t> SafeTensors::to_i64(const TensorInfo& tensor) const {
  std::span<const uint8_t> raw;
  if (tensor.dtype == DType::i64) {
    raw = bytes(tensor);
    std::vector<int64_t> out(raw.size() / sizeof(int64_t));
    if (!out.empty()) std::memcpy(out.data(), raw.data(), out.size() * sizeof(int64_t));
    return out;
  }
  if (tensor.dtype == DType::i32) {
    raw = bytes(tensor);
    std::vector<int64_t> out(raw.size() / sizeof(int32_t));
    for (size_t i = 0; i < out.size(); ++i) {
      int32_t v;
      std::memcpy(&v, raw.data() + i * sizeof(int32_t), sizeof(v));
      out[i] = v;
    }
    return out;
  }
  fail("safetensors '{}': tensor '{}' has dtype {}, expected I64 or I32", label_, show(tensor.name),
       dtype_name(tensor.dtype));
}

// ---------------------------------------------------------------------------------------
// Writing

std::vector<uint8_t> serialize_safetensors(const std::vector<TensorData>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  auto check_utf8 = [](std::string_view what, const std::string& s) {
    try {
      json::parse(json::quote(s));
    } catch (const json::ParseError& e) {
      fail("serialize_safetensors: {} '{}' is not valid utf-8 ({})", what, show(s), e.detail());
    }
  };

  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_meta = true;
    for (const auto& [key, value] : metadata) {
      check_utf8("metadata key", key);
      check_utf8("metadata value", value);
      if (!first_meta) header += ",";
      first_meta = false;
      header += json::quote(key);
      header += ":";
      header += json::quote(value);
    }
    header += "}";
    first = false;
  }

  std::map<std::string_view, size_t> seen;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorData& t = tensors[i];
    const std::string n = show(t.name);
    if (t.name == "__metadata__") {
      fail("serialize_safetensors: tensor {} is named '__metadata__', which is reserved", i);
    }
    check_utf8("tensor name", t.name);
    if (auto [it, inserted] = seen.emplace(t.name, i); !inserted) {
      fail("serialize_safetensors: duplicate tensor name '{}' (tensors {} and {})", n, it->second,
           i);
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        fail("serialize_safetensors: tensor '{}' shape {} has negative dimension {}", n,
             format_shape(t.shape), d);
      }
    }
    std::optional<uint64_t> numel = checked_numel(t.shape);
    std::optional<uint64_t> nbytes = numel ? checked_nbytes(*numel, t.dtype) : std::nullopt;
    if (!nbytes) {
      fail("serialize_safetensors: tensor '{}' shape {} with dtype {} is too large", n,
           format_shape(t.shape), dtype_name(t.dtype));
    }
    if (t.data.size() != *nbytes) {
      fail(
          "serialize_safetensors: tensor '{}' has {} bytes of data, but shape {} with dtype {} "
          "needs {} bytes",
          n, t.data.size(), format_shape(t.shape), dtype_name(t.dtype), *nbytes);
    }
    if (!first) header += ",";
    first = false;
    header += json::quote(t.name);
    header += fmt::format(":{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
                          dtype_name(t.dtype), format_shape(t.shape), offset, offset + *nbytes);
    offset += *nbytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > SafeTensors::kMaxHeaderBytes) {
    fail("serialize_safetensors: header of {} bytes exceeds the limit of {} bytes", header.size(),
         SafeTensors::kMaxHeaderBytes);
  }

  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + static_cast<size_t>(offset));
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(len >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (const TensorData& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> bytes = serialize_safetensors(tensors, metadata);
  write_file_atomically(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

namespace {

template <typename T>
TensorData make_tensor(const char* fn, DType dtype, std::string name, std::vector<int64_t> shape,
                       const std::vector<T>& values) {
  for (int64_t d : shape) {
    if (d < 0) {
      fail("{}: tensor '{}' shape {} has negative dimension {}", fn, show(name),
           format_shape(shape), d);
    }
  }
  std::optional<uint64_t> numel = checked_numel(shape);
  if (!numel || *numel != values.size()) {
    fail("{}: tensor '{}' shape {} has {} elements, but {} values were given", fn, show(name),
         format_shape(shape), numel ? fmt::format("{}", *numel) : std::string("too many"),
         values.size());
  }
  TensorData t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

}  // namespace

TensorData make_f32(std::string name, std::vector<int64_t> shape,
                    const std::vector<float>& values) {
  return make_tensor("make_f32", DType::f32, std::move(name), std::move(shape), values);
}

TensorData make_i64(std::string name, std::vector<int64_t> shape,
                    const std::vector<int64_t>& values) {
  return make_tensor("make_i64", DType::i64, std::move(name), std::move(shape), values);
}

}  // namespace kiln::rt
