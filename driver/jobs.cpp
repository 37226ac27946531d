// The driver's child processes (see jobs.h): forked Halide compiles and spawned programs,
// their process groups, the wait for them, and SIGINT/SIGTERM.
#include "driver/jobs.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "support/error.h"
#include "support/process.h"

extern char** environ;

namespace kiln::driver {
namespace {

using Clock = std::chrono::steady_clock;

// What the signal handler shares with the runner: the signal that asks kiln to stop, and
// a pipe it writes a byte to (for that signal and for SIGCHLD) so that poll wakes.
volatile sig_atomic_t g_signal = 0;
int g_wake[2] = {-1, -1};
bool g_active = false;

constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
struct sigaction g_former[std::size(kCaught)];
bool g_installed[std::size(kCaught)] = {};

void on_signal(int signal) {
  const int saved = errno;
  if (signal != SIGCHLD) g_signal = signal;
  const char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(g_wake[1], &byte, 1);
  errno = saved;
}

void restore_signals() {
  for (size_t i = 0; i < std::size(kCaught); ++i)
    if (g_installed[i]) ::sigaction(kCaught[i], &g_former[i], nullptr);
}

std::string program_name(const std::vector<std::string>& argv) {
  const std::string& p = argv[0];
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// posix_spawnp of `argv` with the environment inherited, in this process's group. Returns
// the pid, or throws naming `what`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& what,
            const std::string& hint) {
  std::vector<std::string> args = argv;
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, c_args[0], nullptr, &attr, c_args.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    fail("{} failed: cannot run '{}': {}{}", what, argv[0], std::strerror(rc),
         hint.empty() ? "" : " (" + hint + ")");
  return pid;
}

// In a job's child, the leader of its process group: when kiln dies, even by SIGKILL, the
// kernel sends the child SIGTERM (PR_SET_PDEATHSIG), on which it kills its whole group, so
// that nothing a job started (a compiler, llc, ld) outlives kiln or writes into its staging
// directory afterwards.
void kill_own_group(int) { ::kill(0, SIGKILL); }

void die_with_parent(pid_t parent) {
  struct sigaction action {};
  action.sa_handler = kill_own_group;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::kill(0, SIGKILL);  // kiln died before prctl
}

// A program job's child: runs `argv` in a grandchild (same process group, so that the
// group kill above reaches it and what it starts) and ends as it ended: the same exit
// status, or killed by the same signal. A program that cannot start is reported through
// `message_fd` (then exit status 1).
[[noreturn]] void supervise(const Job& job, int message_fd) {
  std::vector<std::string> args = job.argv;
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) ::_exit(1);
  const pid_t pid = ::fork();
  if (pid < 0) ::_exit(1);
  if (pid == 0) {
    ::signal(SIGTERM, SIG_DFL);
    ::execvp(c_args[0], c_args.data());
    const int err = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(exec_pipe[1]);
  int err = 0;
  ssize_t got;
  while ((got = ::read(exec_pipe[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof err)) {
    const std::string message =
        fmt::format("{} failed: cannot run '{}': {}{}", job.what, job.argv[0], std::strerror(err),
                    job.hint.empty() ? "" : " (" + job.hint + ")");
    [[maybe_unused]] ssize_t n = ::write(message_fd, message.data(), message.size());
    ::_exit(1);
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    ::signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    ::raise(sig);
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

[[noreturn]] void program_failed(const Job& job, int status) {
  fail("{} failed ({} {}): {}", job.what, program_name(job.argv), describe_wait_status(status),
       display_command(job.argv));
}

}  // namespace

struct JobRunner::Running {
  Job* job = nullptr;
  pid_t pid = -1;
  int message_fd = -1;  // a forked job's error message arrives here
  std::string message;
  Clock::time_point start;
};

JobRunner::JobRunner() {
  KILN_ASSERT(!g_active, "one JobRunner at a time");
  if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0)
    fail("cannot create a pipe: {}", std::strerror(errno));
  g_active = true;
  g_signal = 0;
  for (size_t i = 0; i < std::size(kCaught); ++i) {
    ::sigaction(kCaught[i], nullptr, &g_former[i]);
    // A signal ignored when kiln started (a background job's SIGINT) stays ignored.
    if (kCaught[i] != SIGCHLD && g_former[i].sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | (kCaught[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    g_installed[i] = ::sigaction(kCaught[i], &action, nullptr) == 0;
  }
}

JobRunner::~JobRunner() {
  restore_signals();
  for (bool& b : g_installed) b = false;
  ::close(g_wake[0]);
  ::close(g_wake[1]);
  g_wake[0] = g_wake[1] = -1;
  g_active = false;
}

void JobRunner::check_interrupt() const {
  if (g_signal) throw Interrupted(g_signal);
}

void JobRunner::start(Job& job, std::vector<Running>& running) {
  Running r;
  r.job = &job;
  r.start = Clock::now();
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    fail("{}: cannot create a pipe: {}", job.what, std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail("{}: cannot fork: {}", job.what, std::strerror(err));
  }
  if (pid == 0) {
    // The child: its own group (what it starts goes with it), which dies with kiln, kiln's
    // former signal dispositions, and the message of an exception written to kiln.
    ::setpgid(0, 0);
    restore_signals();
    die_with_parent(parent);
    ::close(g_wake[0]);
    ::close(g_wake[1]);
    ::close(fds[0]);
    if (!job.work) supervise(job, fds[1]);
    int status = 0;
    try {
      job.work();
    } catch (const std::exception& e) {
      const std::string message = e.what();
      [[maybe_unused]] ssize_t n = ::write(fds[1], message.data(), message.size());
      status = 1;
    } catch (...) {
      status = 1;
    }
    ::_exit(status);
  }
  ::setpgid(pid, pid);  // also here, so that the group exists before kill_all can need it
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  r.pid = pid;
  r.message_fd = fds[0];
  running.push_back(std::move(r));
}

void JobRunner::kill_all(std::vector<Running>& running) {
  for (const Running& r : running) {
    ::kill(-r.pid, SIGKILL);
    ::kill(r.pid, SIGKILL);
  }
  for (Running& r : running) {
    int status = 0;
    while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (r.message_fd >= 0) ::close(r.message_fd);
  }
  running.clear();
}

void JobRunner::run(std::vector<Job> jobs, int parallel) {
  if (parallel < 1) parallel = 1;
  std::vector<Running> running;
  // Whatever leaves this function (a failed job, an exception, an interrupt) leaves no
  // child behind.
  struct KillOnExit {
    JobRunner* runner;
    std::vector<Running>* running;
    ~KillOnExit() { runner->kill_all(*running); }
  } kill_on_exit{this, &running};

  auto read_message = [](Running& r) {
    char buffer[4096];
    while (r.message_fd >= 0) {
      const ssize_t n = ::read(r.message_fd, buffer, sizeof buffer);
      if (n > 0) {
        r.message.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      ::close(r.message_fd);  // end of file (or an error): the child has closed it
      r.message_fd = -1;
    }
  };

  size_t next = 0;
  while (next < jobs.size() || !running.empty()) {
    check_interrupt();
    while (running.size() < static_cast<size_t>(parallel) && next < jobs.size())
      start(jobs[next++], running);
    std::vector<pollfd> fds = {{g_wake[0], POLLIN, 0}};
    for (const Running& r : running)
      if (r.message_fd >= 0) fds.push_back({r.message_fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR)
      fail("waiting for the compiler's child processes: {}", std::strerror(errno));
    char drain[64];
    while (::read(g_wake[0], drain, sizeof drain) > 0) {
    }
    for (size_t i = 0; i < running.size(); ++i) {
      Running& r = running[i];
      read_message(r);
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      if (r.message_fd >= 0) ::fcntl(r.message_fd, F_SETFL, 0);  // it exited: read to the end
      read_message(r);
      Running done = std::move(r);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i--));
      const Job& job = *done.job;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        if (job.done) job.done(std::chrono::duration<double>(Clock::now() - done.start).count());
        continue;
      }
      if (!done.message.empty()) throw Error(done.message);
      if (!job.work) program_failed(job, status);
      fail("{} failed: its process {}; see its message above", job.what,
           describe_wait_status(status));
    }
  }
}

void run_program(const std::vector<std::string>& argv, const std::string& what,
                 const std::string& hint) {
  const pid_t pid = spawn(argv, what, hint);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) fail("{} failed: cannot wait for it: {}", what, std::strerror(errno));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    program_failed(Job{what, {}, argv, hint, {}}, status);
}

int default_jobs() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace kiln::driver
