// A file mapped read-only and shared (mmap PROT_READ, MAP_SHARED): its pages are the page
// cache's, so every process that maps one file holds one copy of it in memory. What the
// runtime reads weights from (safetensors.h, weights.h).
//
// Caveat: a mapping is the file as it is now. A file rewritten in place while mapped changes
// under the reader, and one truncated while mapped makes a read past its new end a SIGBUS:
// replace such a file (write a new one, rename it over the old) instead of rewriting it.
// Sizes are validated against the file's size when it is mapped, never after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln::rt {

class MappedFile {
 public:
  // Maps all of the regular file `path`; `what` names its kind in errors ("safetensors file"):
  //   cannot open safetensors file 'P': No such file or directory
  //   safetensors file 'P' is a directory
  //   safetensors file 'P' is not a regular file
  // An empty file maps to no bytes (data() is nullptr).
  static std::shared_ptr<const MappedFile> map(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside [begin, end) from this process's memory (they stay in the
  // page cache and are read again if touched): for bytes read once, such as those copied into
  // a laid-out weight.
  void release(size_t begin, size_t end) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Whether `path` is a regular file (not a directory, a device or a FIFO): what map() takes.
bool is_regular_file(const std::string& path);

}  // namespace kiln::rt
