// Reading and writing safetensors files (https://github.com/huggingface/safetensors):
//
//   [u64 little-endian N][N bytes of JSON header][data section]
//
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) plus an optional "__metadata__" object of
// string -> string. Files are treated as hostile: everything is validated on load and
// every problem is a kiln::Error naming the file label, the tensor and the numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/mapped_file.h"

namespace kiln::rt {

enum class DType { f32, f16, bf16, f64, i64, i32, i16, i8, u8, boolean };

// Bytes per element.
size_t dtype_size(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8",
// "BOOL".
const char* dtype_name(DType dtype);
// Inverse of dtype_name; nullopt for an unknown or unsupported spelling.
std::optional<DType> dtype_from_name(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section, [begin, end)

  int64_t numel() const;  // product of shape (1 for a scalar)
  uint64_t nbytes() const { return end - begin; }
};

class SafeTensors {
 public:
  // Largest header accepted, in bytes (the reference implementation's limit).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  // Validates a whole file, mapped (mapped_file.h: read-only, shared with every process that
  // maps it; a FIFO is read instead); the path is the label. "-" is not special.
  static SafeTensors load(const std::string& path);
  // Validates `bytes`, a whole safetensors file; `label` names it in messages.
  static SafeTensors from_bytes(std::vector<uint8_t> bytes, std::string label);

  // In file header order, "__metadata__" excluded.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorInfo* find(std::string_view name) const;
  // Throws kiln::Error "safetensors 'L' has no tensor 'x'" if absent.
  const TensorInfo& at(std::string_view name) const;
  // The tensor's raw (little-endian) bytes.
  std::span<const uint8_t> bytes(const TensorInfo& tensor) const;

  // Copies with conversion. to_f32 requires F32; to_i64 accepts I64 or I32.
  std::vector<float> to_f32(const TensorInfo& tensor) const;
  std::vector<int64_t> to_i64(const TensorInfo& tensor) const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& label() const { return label_; }
  // The file's mapping (nullptr for bytes read into memory): tensors bound to its pages keep
  // it alive, and bytes only copied out of it can be released (MappedFile::release).
  const std::shared_ptr<const MappedFile>& mapping() const { return mapped_; }
  // The offset of `tensor`'s bytes in the file.
  uint64_t file_offset(const TensorInfo& tensor) const { return data_start_ + tensor.begin; }

 private:
  SafeTensors() = default;
  // Validates the file in data()/size() (from_bytes and load).
  static SafeTensors validate(SafeTensors st);
  const uint8_t* data() const { return mapped_ ? mapped_->data() : owned_.data(); }
  size_t size() const { return mapped_ ? mapped_->size() : owned_.size(); }

  std::string label_;
  std::vector<uint8_t> owned_;                // the whole file, read into memory, or
  std::shared_ptr<const MappedFile> mapped_;  // the whole file, mapped
  size_t data_start_ = 0;                     // offset of the data section in the file
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

struct TensorData {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian elements, numel(shape) * dtype_size(dtype) bytes
};

// A whole safetensors file: header JSON padded with spaces to a multiple of 8 bytes, then
// the tensors' data contiguously in the given order. Checks names (valid UTF-8, unique, not
// "__metadata__"), shapes and data sizes; "__metadata__" is written only if non-empty.
std::vector<uint8_t> serialize_safetensors(const std::vector<TensorData>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Builders; check that values.size() equals the shape's element count.
TensorData make_f32(std::string name, std::vector<int64_t> shape, const std::vector<float>& values);
TensorData make_i64(std::string name, std::vector<int64_t> shape,
                    const std::vector<int64_t>& values);

}  // namespace kiln::rt
