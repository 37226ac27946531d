// Reading a whole input file that may be hostile: a directory, a device that never ends
// (/dev/zero) or a file larger than memory is a kiln::Error naming the path, never an
// exception from the standard library (basic_filebuf::underflow, std::bad_alloc).
// Header-only (POSIX), usable from every layer.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "support/error.h"

namespace kiln {

// Reads all of `path` ("-" is standard input) into memory. `what` names the kind of file
// in messages ("" for none, "safetensors file"):
//   cannot open 'P': No such file or directory
//   'P' is a directory
//   'P' is not a regular file            (a device; pipes and FIFOs are read)
//   'P' does not fit in memory (read N bytes)
inline std::vector<uint8_t> read_input_file(const std::string& path, const std::string& what = "") {
  const std::string label = (what.empty() ? "" : what + " ") + "'" + path + "'";
  std::FILE* raw = stdin;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> owned(nullptr, std::fclose);
  if (path != "-") {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) fail("cannot open {}: {}", label, std::strerror(errno));
    if (S_ISDIR(st.st_mode)) fail("{} is a directory", label);
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) fail("{} is not a regular file", label);
    owned.reset(std::fopen(path.c_str(), "rb"));
    if (!owned) fail("cannot open {}: {}", label, std::strerror(errno));
    raw = owned.get();
  }
  std::vector<uint8_t> bytes;
  constexpr size_t kChunk = size_t{1} << 20;
  try {
    while (true) {
      const size_t old_size = bytes.size();
      bytes.resize(old_size + kChunk);
      const size_t got = std::fread(bytes.data() + old_size, 1, kChunk, raw);
      bytes.resize(old_size + got);
      if (got < kChunk) break;
    }
  } catch (const std::bad_alloc&) {
    fail("{} does not fit in memory (read {} bytes)", label, bytes.size());
  } catch (const std::length_error&) {
    fail("{} does not fit in memory (read {} bytes)", label, bytes.size());
  }
  if (std::ferror(raw)) fail("cannot read {}: {}", label, std::strerror(errno));
  return bytes;
}

}  // namespace kiln
