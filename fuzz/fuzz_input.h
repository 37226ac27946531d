// A reader of fuzzer bytes shared by the fuzz targets: each call takes the next bytes of
// the input (zeros once it is used up), so every input decodes to some choice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kiln::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A value in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    uint64_t v = 0;
    for (int i = 0; i < 8 && (span >> (8 * i)) > 0; ++i) v = (v << 8) | byte();
    return lo + static_cast<int64_t>(v % span);
  }
  int64_t i64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return static_cast<int64_t>(v);
  }
  // Up to `n` of the remaining bytes.
  size_t take(void* out, size_t n) {
    const size_t k = n < size_ - pos_ ? n : size_ - pos_;
    if (k) std::memcpy(out, data_ + pos_, k);
    pos_ += k;
    return k;
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kiln::fuzz
