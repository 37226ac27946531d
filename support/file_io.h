// Writing files so that a failure never leaves a truncated one: every file kiln writes
// (IR, outputs, headers, libraries) goes through write_file_atomically, and whole output
// directories through a StagingDir. Header-only (POSIX), usable from every layer.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "support/error.h"

namespace kiln {

namespace file_io_detail {

// Writes all of `data` to `fd`; returns 0 or the errno of the failure.
inline int write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// A name beside `path` that no other writer uses: PATH.kiln-tmp.PID.N
inline std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".kiln-tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace file_io_detail

// Writes `data` to `path`. A regular file (or a new one) is written under a temporary
// name beside it and renamed over `path` only once every byte is written and the file
// closed, so `path` is either as it was or complete. Anything else that exists at `path`
// (a device such as /dev/null or /dev/full, a pipe) is written in place. Every failure
// throws kiln::Error naming the path and the reason (e.g. "No space left on device").
inline void write_file_atomically(const std::string& path, std::string_view data) {
  using file_io_detail::write_all;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) fail("cannot write '{}': it is a directory", path);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot write '{}': {}", path, std::strerror(errno));
    int err = write_all(fd, data);
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err) fail("cannot write '{}': {}", path, std::strerror(err));
    return;
  }
  const std::string temp = file_io_detail::temporary_name(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot write '{}': {}", path, std::strerror(errno));
  int err = write_all(fd, data);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(temp.c_str());
    fail("cannot write '{}': {}", path, std::strerror(err));
  }
}

// Writes to standard output and flushes it; a failure (a full disk behind a redirection,
// a closed pipe) throws kiln::Error.
inline void write_stdout(std::string_view data) {
  errno = 0;
  bool ok = data.empty() || std::fwrite(data.data(), 1, data.size(), stdout) == data.size();
  ok = std::fflush(stdout) == 0 && ok && !std::ferror(stdout);
  if (!ok)
    fail("cannot write to standard output: {}", errno ? std::strerror(errno) : "write error");
}

// A directory beside the final outputs in which a multi-file result is built; each
// finished file is moved into place with `publish` (a rename, atomic per file). Removed
// with whatever is left in it when it goes out of scope, so a failure leaves the output
// directory as it was.
class StagingDir {
 public:
  // Creates `.NAME.kiln-tmp.PID` in `out_dir` (which must exist).
  StagingDir(const std::filesystem::path& out_dir, const std::string& name)
      : out_dir_(out_dir),
        path_(out_dir / ("." + name + ".kiln-tmp." + std::to_string(::getpid()))) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directory(path_, ec);
    if (ec) fail("cannot create '{}': {}", path_.string(), ec.message());
  }
  ~StagingDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Moves `file` (a name in the staging directory) to the same name in the output
  // directory, replacing what was there; returns the final path.
  std::filesystem::path publish(const std::string& file) const {
    const std::filesystem::path to = out_dir_ / file;
    std::error_code ec;
    std::filesystem::rename(path_ / file, to, ec);
    if (ec) fail("cannot write '{}': {}", to.string(), ec.message());
    return to;
  }

 private:
  std::filesystem::path out_dir_, path_;
};

}  // namespace kiln
