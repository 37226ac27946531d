// Writing files so that a failure never leaves a truncated one: every file kiln writes
// (IR, outputs, headers, libraries) goes through write_file_atomically, and whole output
// directories through a StagingDir. Header-only (POSIX), usable from every layer.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
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
#include <utility>

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

// An exclusive flock(2) on a file or directory, held while this object lives. The kernel
// releases it when its holder dies, however it dies (SIGKILL included): a lock tells a
// live owner from a dead one where a PID, which can be reused, cannot.
class FileLock {
 public:
  FileLock() = default;
  // Locks `path` (it must exist), waiting for another holder when `wait`; held() says
  // whether it got the lock. Throws kiln::Error when `path` cannot be opened.
  FileLock(const std::string& path, bool wait) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open '{}' to lock it: {}", path, std::strerror(errno));
    int rc;
    while ((rc = ::flock(fd_, LOCK_EX | (wait ? 0 : LOCK_NB))) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK) fail("cannot lock '{}': {}", path, std::strerror(err));
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A directory beside the final outputs in which a multi-file result is built; each
// finished file is moved into place with `publish` (a rename, atomic per file). Removed
// with whatever is left in it when it goes out of scope, so a failure leaves the output
// directory as it was.
//
// Its owner holds a lock on it (FileLock) for its whole life, and so do the owner's forked
// children. A staging directory whose lock is free belongs to a process that is gone (a
// kill -9, a power cut): the next StagingDir in the same output directory removes it.
// Creating one, removing stale ones and publishing happen under a lock on the output
// directory itself, so two processes writing the same outputs at once (two compiles of
// one library name) publish one complete set after the other, never a mix.
class StagingDir {
 public:
  // Creates `.NAME.kiln-tmp.PID` in `out_dir` (which must exist), after removing the
  // stale staging directories there.
  StagingDir(const std::filesystem::path& out_dir, const std::string& name)
      : out_dir_(out_dir), path_(out_dir / ("." + name + kInfix + std::to_string(::getpid()))) {
    const FileLock dir_lock = lock_output();
    remove_stale(out_dir);
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);  // this PID's, from a dead process
    std::filesystem::create_directory(path_, ec);
    if (ec) fail("cannot create '{}': {}", path_.string(), ec.message());
    lock_ = FileLock(path_.string(), false);
  }
  ~StagingDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The lock on the output directory: hold it while publishing a set of files, so that
  // another process's set is not published in between.
  FileLock lock_output() const { return FileLock(out_dir_.string(), true); }
  // Moves `file` (a name in the staging directory) to the same name in the output
  // directory, replacing what was there; returns the final path.
  std::filesystem::path publish(const std::string& file) const {
    const std::filesystem::path to = out_dir_ / file;
    std::error_code ec;
    std::filesystem::rename(path_ / file, to, ec);
    if (ec) fail("cannot write '{}': {}", to.string(), ec.message());
    return to;
  }

  // Removes every staging directory in `out_dir` whose owner is gone (its lock is free);
  // returns how many. Called with the output directory locked.
  static int remove_stale(const std::filesystem::path& out_dir) {
    int removed = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
      const std::string file = entry.path().filename().string();
      std::error_code type_ec;
      if (file.empty() || file[0] != '.' || file.find(kInfix) == std::string::npos ||
          !entry.is_directory(type_ec))
        continue;
      try {
        const FileLock owner(entry.path().string(), false);
        if (!owner.held()) continue;  // its owner is alive
        std::error_code rm_ec;
        std::filesystem::remove_all(entry.path(), rm_ec);
        removed += !rm_ec;
      } catch (const Error&) {
        continue;  // gone meanwhile, or unreadable: not ours to judge
      }
    }
    return removed;
  }

 private:
  static constexpr const char* kInfix = ".kiln-tmp.";
  std::filesystem::path out_dir_, path_;
  FileLock lock_;
};

}  // namespace kiln
