// Running a program from its argv, never through a shell: the wording of wait statuses
// ("exited with status 1", "killed by signal 9 (Killed)"), an argv as one line for
// messages, and run_process, which runs a program to its end and captures what it
// printed (the tests run kiln and other tools with it). Header-only (POSIX).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

extern char** environ;

namespace kiln {

// How a child ended, from its waitpid status: "exited with status 1", "killed by signal 9
// (Killed)".
inline std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  if (WIFSTOPPED(status)) return fmt::format("stopped by signal {}", WSTOPSIG(status));
  return fmt::format("ended with wait status {:#x}", status);
}

// `argv` as one line for a message: each word that holds anything but letters, digits and
// _+-./:=@, in single quotes (a quote inside as '\'').
inline std::string display_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& word : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !word.empty();
    for (char c : word)
      if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("_+-./:=@,", c))
        plain = false;
    if (plain) {
      out += word;
      continue;
    }
    out += '\'';
    for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

struct ProcessOptions {
  std::optional<std::string> input;  // written to its standard input (else /dev/null)
  std::string input_path;            // or this file as its standard input
  std::string output_path;       // its standard output goes to this file (truncated), not captured
  bool join_stderr = false;      // standard error into `out` (with output_path: it alone)
  std::vector<std::string> env;  // NAME=VALUE entries set in its environment
  long long file_size_limit = -1;  // RLIMIT_FSIZE in bytes (SIGXFSZ ignored), -1: unchanged
};

struct ProcessResult {
  int wait_status = 0;  // waitpid's status
  std::string out;      // its standard output (and standard error with join_stderr)
  std::string err;      // its standard error
  std::string error;    // why it could not be started, or ""

  bool exited() const { return error.empty() && WIFEXITED(wait_status); }
  // The exit status, or -1 when it did not exit (killed by a signal, or never started).
  int exit_code() const { return exited() ? WEXITSTATUS(wait_status) : -1; }
  // The signal that killed it, or 0.
  int term_signal() const {
    return error.empty() && WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0;
  }
};

// Runs `argv` (argv[0] looked up in PATH when it has no '/') to its end, with the
// environment, file size limit and standard streams `options` asks for.
inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const ProcessOptions& options = {}) {
  ProcessResult result;
  if (argv.empty()) {
    result.error = "no program to run";
    return result;
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe
  // calls.
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const std::string& set : options.env)
      if (entry.substr(0, entry.find('=') + 1) == set.substr(0, set.find('=') + 1)) replaced = true;
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), options.env.begin(), options.env.end());
  std::vector<char*> c_env, c_argv;
  for (std::string& e : env) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  std::vector<std::string> args = argv;
  for (std::string& a : args) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);

  auto close_fd = [](int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  };
  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1},
      exec_pipe[2] = {-1, -1};
  int in_file = -1, out_file = -1;
  auto close_all = [&] {
    for (int* fds : {in_pipe, out_pipe, err_pipe, exec_pipe}) close_fd(fds[0]), close_fd(fds[1]);
    close_fd(in_file);
    close_fd(out_file);
  };
  auto failed = [&](const std::string& what) {
    result.error = fmt::format("{}: {}", what, std::strerror(errno));
    close_all();
    return result;
  };
  if (options.input && ::pipe2(in_pipe, O_CLOEXEC) != 0) return failed("pipe");
  if (!options.input) {
    const std::string from = options.input_path.empty() ? "/dev/null" : options.input_path;
    in_file = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in_file < 0) return failed("cannot open '" + from + "'");
  }
  if (!options.output_path.empty()) {
    out_file = ::open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (out_file < 0) return failed("cannot open '" + options.output_path + "'");
  }
  // The captured output (standard output, or standard error alone when standard output
  // goes to a file and join_stderr is set).
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return failed("pipe");
  if (!options.join_stderr && ::pipe2(err_pipe, O_CLOEXEC) != 0) return failed("pipe");
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) return failed("pipe");

  const pid_t pid = ::fork();
  if (pid < 0) return failed("fork");
  if (pid == 0) {
    const int stdin_fd = options.input ? in_pipe[0] : in_file;
    const int stdout_fd = out_file >= 0 ? out_file : out_pipe[1];
    const int stderr_fd = options.join_stderr ? out_pipe[1] : err_pipe[1];
    bool ok = ::dup2(stdin_fd, 0) >= 0 && ::dup2(stdout_fd, 1) >= 0 &&
              (stderr_fd < 0 || ::dup2(stderr_fd, 2) >= 0);
    if (ok && options.file_size_limit >= 0) {
      ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
      const rlimit limit{static_cast<rlim_t>(options.file_size_limit),
                         static_cast<rlim_t>(options.file_size_limit)};
      ok = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
    }
    if (ok) ::execvpe(c_argv[0], c_argv.data(), c_env.data());
    const int err = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  close_fd(exec_pipe[1]);
  close_fd(in_pipe[0]);
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  close_fd(in_file);
  close_fd(out_file);

  // Feed standard input and drain both outputs together, so that neither side blocks.
  size_t written = 0;
  if (in_pipe[1] >= 0) ::fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  const sighandler_t old_pipe = ::signal(SIGPIPE, SIG_IGN);  // it may not read its input
  while (in_pipe[1] >= 0 || out_pipe[0] >= 0 || err_pipe[0] >= 0) {
    if (in_pipe[1] >= 0 && written == options.input->size()) {
      close_fd(in_pipe[1]);
      continue;
    }
    pollfd fds[3] = {{in_pipe[1], POLLOUT, 0}, {out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) {
      const ssize_t n =
          ::write(in_pipe[1], options.input->data() + written, options.input->size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) close_fd(in_pipe[1]);
    }
    char buffer[4096];
    for (int i : {1, 2}) {
      if (!fds[i].revents) continue;
      int& fd = i == 1 ? out_pipe[0] : err_pipe[0];
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n > 0)
        (i == 1 ? result.out : result.err).append(buffer, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR)
        close_fd(fd);
    }
  }
  ::signal(SIGPIPE, old_pipe);
  int exec_errno = 0;
  const bool exec_failed = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno) > 0;
  close_all();
  while (::waitpid(pid, &result.wait_status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed)
    result.error = fmt::format("cannot run '{}': {}", argv[0], std::strerror(exec_errno));
  return result;
}

}  // namespace kiln
