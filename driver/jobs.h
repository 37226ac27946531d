// The driver's child processes: Halide compiles forked into children and toolchain programs
// run from their argv (no shell), several at once, each job's child leading its own process
// group (so what it starts, such as llc or ld, goes with it). A JobRunner kills and reaps
// every group still running when a job fails, when an exception leaves it, and on
// SIGINT/SIGTERM/SIGHUP, which it turns into Interrupted; when kiln dies without a chance to do so
// (SIGKILL), each group kills itself (the child's PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace kiln::driver {

struct Job {
  std::string what;  // for messages: "compiling kernel X", "archiving"
  // Either work run in a forked child (a kiln::Error it throws becomes the job's error; a
  // crash or an exit, e.g. LLVM's on a failed write, is reported with its status)...
  std::function<void()> work;
  // ...or a program run from its argv (argv[0] looked up in PATH); `hint` follows its
  // "cannot run" message.
  std::vector<std::string> argv;
  std::string hint;
  std::function<void(double seconds)> done;  // in kiln, when the job succeeded; may be empty
};

// SIGINT, SIGTERM or SIGHUP arrived; the children are gone when this is thrown.
struct Interrupted : std::exception {
  explicit Interrupted(int s) : signal(s) {}
  const char* what() const noexcept override { return "interrupted"; }
  int signal;
};

// While one exists, SIGINT, SIGTERM and SIGHUP (unless they were ignored) and SIGCHLD are caught;
// its destructor kills and reaps what still runs and restores their former dispositions.
// One at a time.
class JobRunner {
 public:
  JobRunner();
  ~JobRunner();
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Runs `jobs`, at most `parallel` at once, started in order; returns when all succeeded.
  // On the first failure the others are killed and reaped and kiln::Error names the job
  // ("compiling the generated glue and header failed (c++ exited with status 1): ...").
  void run(std::vector<Job> jobs, int parallel);
  // Throws Interrupted if SIGINT, SIGTERM or SIGHUP arrived.
  void check_interrupt() const;

 private:
  struct Running;
  void start(Job& job, std::vector<Running>& running);
  void kill_all(std::vector<Running>& running);
};

// Runs `argv` to its end in this process's own group with its standard streams inherited
// (for a forked job's child, where no JobRunner is active); throws kiln::Error naming `what`
// when it cannot start or does not exit with status 0.
void run_program(const std::vector<std::string>& argv, const std::string& what,
                 const std::string& hint = "");

// How many jobs run at once by default: the CPUs this process may use.
int default_jobs();

}  // namespace kiln::driver
