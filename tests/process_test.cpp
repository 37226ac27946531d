// The driver's child processes (driver/jobs.h, kiln_jobs) and staging directories
// (support/file_io.h): wait statuses in words, run_process's captures, JobRunner's parallel
// jobs, its cleanup of the others when one fails, its messages for a program that fails or
// a child killed by a signal, SIGINT turned into Interrupted with the children gone; and
// (issue 25) nothing a job started outlives kiln, even killed by SIGKILL, stale staging
// directories of dead owners are removed by a lock and not a PID, and concurrent
// publishers leave whole sets. Also run under ASan/UBSan (scripts/test.sh).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "driver/jobs.h"
#include "support/error.h"
#include "support/file_io.h"
#include "support/process.h"
#include "tests/marked_processes.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::wait_for_marked;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(Process, WaitStatusInWords) {
  EXPECT_EQ(describe_wait_status(256), "exited with status 1");  // not "256"
  EXPECT_EQ(describe_wait_status(0), "exited with status 0");
  EXPECT_EQ(describe_wait_status(SIGKILL), "killed by signal 9 (Killed)");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::raise(SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_EQ(describe_wait_status(status), "killed by signal 9 (Killed)");
  EXPECT_EQ(describe_wait_status(3 << 8), "exited with status 3");
}

TEST(Process, CapturesOutputsInputAndEnvironment) {
  ProcessOptions options;
  options.input = "three words here\n";
  options.env = {"KILN_TEST_VALUE=it's $set"};
  const ProcessResult wc = run_process({"wc", "-w"}, options);
  EXPECT_EQ(wc.exit_code(), 0);
  EXPECT_EQ(wc.out, "3\n");
  const ProcessResult env = run_process({"printenv", "KILN_TEST_VALUE"}, options);
  EXPECT_EQ(env.out, "it's $set\n");
  const ProcessResult ls = run_process({"ls", "/no such dir"});
  EXPECT_EQ(ls.exit_code(), 2);
  EXPECT_EQ(ls.out, "");
  EXPECT_THAT(ls.err, HasSubstr("/no such dir"));
  const ProcessResult missing = run_process({"/no/such/program"});
  EXPECT_EQ(missing.exit_code(), -1);
  EXPECT_EQ(missing.error, "cannot run '/no/such/program': No such file or directory");
  EXPECT_EQ(display_command({"cc", "-o", "a b", "it's"}), "cc -o 'a b' 'it'\\''s'");
}

TEST(JobRunner, RunsJobsInParallelAndReportsEach) {
  driver::JobRunner runner;
  std::vector<std::string> finished;
  std::vector<driver::Job> jobs;
  for (int i = 0; i < 4; ++i)
    jobs.push_back({"sleeping", {}, {"sleep", "1"}, "", [&, i](double) {
                      finished.push_back(std::to_string(i));
                    }});
  const auto start = Clock::now();
  runner.run(std::move(jobs), 4);
  EXPECT_LT(seconds_since(start), 3.5);  // not 4 s one after another
  EXPECT_EQ(finished.size(), 4u);
}

TEST(JobRunner, AFailedProgramStopsTheOthers) {
  driver::JobRunner runner;
  std::vector<driver::Job> jobs;
  jobs.push_back({"waiting", [] { ::sleep(60); }, {}, "", {}});
  jobs.push_back({"sleeping", {}, {"sleep", "60"}, "", {}});
  jobs.push_back({"archiving", {}, {"false", "a b"}, "", {}});
  const auto start = Clock::now();
  try {
    runner.run(std::move(jobs), 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "archiving failed (false exited with status 1): false 'a b'");
  }
  EXPECT_LT(seconds_since(start), 30);  // the others were killed, not waited for
}

TEST(JobRunner, ChildErrorsAndSignalsAreNamed) {
  driver::JobRunner runner;
  auto message = [&](driver::Job job) {
    std::vector<driver::Job> jobs;
    jobs.push_back(std::move(job));
    try {
      runner.run(std::move(jobs), 1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({"compiling kernel k", [] { fail("halide failed to compile kernel k"); }}),
            "halide failed to compile kernel k");
  EXPECT_EQ(message({"compiling kernel k", [] { ::raise(SIGKILL); }}),
            "compiling kernel k failed: its process killed by signal 9 (Killed); see its message "
            "above");
  EXPECT_EQ(message({"compiling kernel k", [] { ::_exit(3); }}),
            "compiling kernel k failed: its process exited with status 3; see its message above");
  EXPECT_EQ(message({"linking", {}, {"/no/such/c++", "-o", "x"}, "is it installed?"}),
            "linking failed: cannot run '/no/such/c++': No such file or directory (is it "
            "installed?)");
  // A program run inside a forked job (llc in a kernel's child).
  EXPECT_EQ(message({"compiling kernel k",
                     [] { driver::run_program({"false"}, "compiling kernel k with llc-14"); }}),
            "compiling kernel k with llc-14 failed (false exited with status 1): false");
}

// SIGINT while jobs run: the runner kills and reaps its children and throws Interrupted
// (kiln compile then re-raises the signal). Run in a child so that the signal is its own.
TEST(JobRunner, SigintKillsTheChildrenAndInterrupts) {
  const std::string pid_file =
      (std::filesystem::temp_directory_path() / ("kiln_driver_test_" + std::to_string(::getpid())))
          .string();
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // As from a shell: a SIGINT ignored when the test starts (a background job of a
    // non-interactive shell, `cmd &`, starts with it ignored) stays ignored in kiln, which is
    // not what this test is about.
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
    int code = 3;
    try {
      driver::JobRunner runner;
      std::vector<driver::Job> jobs;
      jobs.push_back({"waiting", [&] {
                        std::ofstream(pid_file) << ::getpid();
                        ::sleep(60);
                      }});
      jobs.push_back({"sleeping", {}, {"sleep", "60"}, "", {}});
      runner.run(std::move(jobs), 2);
      code = 1;
    } catch (const driver::Interrupted& i) {
      code = i.signal == SIGINT ? 42 : 2;
    } catch (...) {
    }
    ::_exit(code);
  }
  // Once the forked job runs, interrupt.
  while (!std::filesystem::exists(pid_file) && seconds_since(start) < 20) ::usleep(20000);
  ::usleep(100000);
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_EQ(describe_wait_status(status), "exited with status 42");
  EXPECT_LT(seconds_since(start), 30);
  std::ifstream in(pid_file);
  pid_t job = 0;
  in >> job;
  std::filesystem::remove(pid_file);
  ASSERT_GT(job, 0);
  EXPECT_NE(::kill(job, 0), 0) << "the forked job is still running";
}

// ---------------------------------------------------------------------------------
// Issue 25: children die with kiln however it dies, and staging directories.

// A family of runs: a process running a JobRunner (forked jobs that start programs, as a
// kernel's child starts llc, and program jobs that start their own children, as c++ starts
// cc1plus and ld) is signalled at a random moment with SIGKILL, SIGINT, SIGTERM or SIGHUP.
// Every process it started, at any depth, is gone soon after; an interrupt is reported as
// Interrupted with that signal.
TEST(JobRunner, NothingOutlivesKillOrInterruptAtRandomMoments) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  std::mt19937 rng(2511);
  const int signals[] = {SIGKILL, SIGINT, SIGTERM, SIGHUP};
  for (int round = 0; round < 8; ++round) {
    const int sig = signals[round % 4];
    const int delay_ms = std::uniform_int_distribution<int>(0, 400)(rng);
    const int parallel = std::uniform_int_distribution<int>(1, 3)(rng);
    const std::string marker = fmt::format("KILN_PROCESS_TEST_MARK={}_{}", ::getpid(), round);
    SCOPED_TRACE(
        fmt::format("round {}: signal {} after {} ms, {} at once", round, sig, delay_ms, parallel));
    const pid_t kiln = ::fork();
    ASSERT_GE(kiln, 0);
    if (kiln == 0) {
      // As kiln started from a shell: a signal ignored when it starts (under nohup, say)
      // stays ignored, which is not what this test is about.
      for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
      ::putenv(const_cast<char*>(marker.c_str()));
      int code = 3;
      try {
        driver::JobRunner runner;
        std::vector<driver::Job> jobs;
        for (int j = 0; j < 4; ++j) {
          if (j % 2 == 0)
            jobs.push_back({"a forked job", [] {
                              driver::run_program({"sleep", "60"}, "sleeping");
                            }});
          else
            jobs.push_back(
                {"a program job", {}, {"sh", "-c", "sleep 60 & sleep 60; wait"}, "", {}});
        }
        runner.run(std::move(jobs), parallel);
        code = 1;
      } catch (const driver::Interrupted& i) {
        code = 100 + i.signal;
      } catch (...) {
      }
      ::_exit(code);
    }
    ::usleep(static_cast<useconds_t>(delay_ms) * 1000);
    ::kill(kiln, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(kiln, &status, 0), kiln);
    if (sig == SIGKILL) {
      EXPECT_EQ(describe_wait_status(status), "killed by signal 9 (Killed)");
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 100 + sig) {
      // A signal before the runner installed its handlers ends the process by it.
      ADD_FAILURE() << describe_wait_status(status);
    } else if (!WIFEXITED(status)) {
      EXPECT_EQ(WTERMSIG(status), sig) << describe_wait_status(status);
    }
    const std::vector<pid_t> left = wait_for_marked(marker, 10);
    EXPECT_TRUE(left.empty()) << left.size() << " process(es) outlived it, e.g. " << left[0];
    for (pid_t p : left) ::kill(p, SIGKILL);
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// A family of output directories with staging directories of dead owners (killed, never
// cleaned up) and of live ones, in random numbers: a new StagingDir removes exactly the
// dead owners' and leaves the live owners' alone.
TEST(StagingDir, RemovesStaleDirectoriesOfDeadOwnersOnly) {
  std::mt19937 rng(25);
  for (int round = 0; round < 6; ++round) {
    const std::filesystem::path out = std::filesystem::temp_directory_path() /
                                      fmt::format("kiln_process_test_{}_{}", ::getpid(), round);
    std::filesystem::remove_all(out);
    std::filesystem::create_directories(out);
    const int dead = std::uniform_int_distribution<int>(0, 4)(rng);
    const int alive = std::uniform_int_distribution<int>(0, 3)(rng);
    SCOPED_TRACE(fmt::format("round {}: {} dead, {} alive owners", round, dead, alive));
    // Every owner creates its staging directory first (a later StagingDir would clean up
    // after an owner that is already dead); then the dead ones die by SIGKILL, no
    // destructor run, and the live ones wait.
    std::vector<pid_t> owners;
    std::vector<int> release;  // write end of the pipe each owner waits on
    for (int i = 0; i < dead + alive; ++i) {
      const bool dies = i < dead;
      int ready[2], hold[2];
      ASSERT_EQ(::pipe(ready), 0);
      ASSERT_EQ(::pipe(hold), 0);
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        for (int fd : release) ::close(fd);  // the other owners' pipes: theirs to end
        ::close(hold[1]);
        {
          StagingDir stage(out, fmt::format("m{}", i % 2));  // names may repeat
          std::ofstream(stage.path() / "half_written.o") << "partial";
          char byte = 1;
          [[maybe_unused]] ssize_t n = ::write(ready[1], &byte, 1);
          n = ::read(hold[0], &byte, 1);
          if (dies) ::raise(SIGKILL);
        }
        ::_exit(0);
      }
      ::close(ready[1]);
      ::close(hold[0]);
      char byte;
      ASSERT_EQ(::read(ready[0], &byte, 1), 1);
      ::close(ready[0]);
      owners.push_back(pid);
      release.push_back(hold[1]);
    }
    for (int i = 0; i < dead; ++i) {
      ::close(release[static_cast<size_t>(i)]);
      ::waitpid(owners[static_cast<size_t>(i)], nullptr, 0);
    }
    auto staging_dirs = [&] {
      int n = 0;
      for (const auto& e : std::filesystem::directory_iterator(out))
        n += e.path().filename().string().find(".kiln-tmp.") != std::string::npos;
      return n;
    };
    EXPECT_EQ(staging_dirs(), dead + alive);
    {
      StagingDir mine(out, "m0");
      EXPECT_EQ(staging_dirs(), alive + 1);  // the dead owners' are gone, mine is there
    }
    EXPECT_EQ(staging_dirs(), alive);
    for (int i = dead; i < dead + alive; ++i) {
      ::close(release[static_cast<size_t>(i)]);
      ::waitpid(owners[static_cast<size_t>(i)], nullptr, 0);
    }
    EXPECT_EQ(StagingDir::remove_stale(out), 0);  // live owners clean up after themselves
    EXPECT_EQ(staging_dirs(), 0);
    std::filesystem::remove_all(out);
  }
}

// Two processes publish sets of files with the same names into one directory at once, each
// set tagged with its writer and round, at random moments: under the output directory's
// lock every set is published whole, so at the end (and whenever a set is complete) the
// files agree on one writer's round.
TEST(StagingDir, ConcurrentPublishersLeaveOneWholeSet) {
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / fmt::format("kiln_publish_test_{}", ::getpid());
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  const std::vector<std::string> files = {"libm.a", "libm.so", "m.h"};
  std::vector<pid_t> writers;
  for (int w = 0; w < 2; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::mt19937 rng(static_cast<unsigned>(w * 7 + 1));
      for (int round = 0; round < 40; ++round) {
        StagingDir stage(out, "m");
        for (const std::string& f : files)
          std::ofstream(stage.path() / f) << "writer " << w << " round " << round;
        ::usleep(std::uniform_int_distribution<useconds_t>(0, 3000)(rng));
        const FileLock lock = stage.lock_output();
        for (const std::string& f : files) {
          stage.publish(f);
          ::usleep(std::uniform_int_distribution<useconds_t>(0, 500)(rng));
        }
      }
      ::_exit(0);
    }
    writers.push_back(pid);
  }
  // A reader that takes the same lock sees whole sets only.
  int checks = 0;
  for (int i = 0; i < 60; ++i) {
    {
      const FileLock lock(out.string(), true);
      std::set<std::string> tags;
      for (const std::string& f : files) {
        std::ifstream in(out / f);
        std::string tag((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!tag.empty()) tags.insert(tag);
      }
      if (!tags.empty()) {
        ++checks;
        EXPECT_EQ(tags.size(), 1u) << *tags.begin() << " beside " << *tags.rbegin();
      }
    }
    ::usleep(1000);
  }
  for (pid_t p : writers) {
    int status = 0;
    ::waitpid(p, &status, 0);
    EXPECT_EQ(describe_wait_status(status), "exited with status 0");
  }
  EXPECT_GT(checks, 0);
  std::set<std::string> tags;
  for (const std::string& f : files) {
    std::ifstream in(out / f);
    tags.insert(
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  }
  EXPECT_EQ(tags.size(), 1u);
  int leftovers = 0;
  for (const auto& e : std::filesystem::directory_iterator(out))
    leftovers += e.path().filename().string().find(".kiln-tmp.") != std::string::npos;
  EXPECT_EQ(leftovers, 0);
  std::filesystem::remove_all(out);
}

// Wait statuses of a family of exit codes and signals read as words, never a raw status
// ("exit status 256"), and a program job that ends so is named with them.
TEST(JobRunner, EveryExitCodeAndSignalIsNamedInWords) {
  driver::JobRunner runner;
  std::mt19937 rng(256);
  for (int i = 0; i < 6; ++i) {
    const int code = std::uniform_int_distribution<int>(1, 255)(rng);
    std::vector<driver::Job> jobs;
    jobs.push_back(
        {"linking the shared library", {}, {"sh", "-c", fmt::format("exit {}", code)}, "", {}});
    try {
      runner.run(std::move(jobs), 1);
      ADD_FAILURE() << "no error for exit " << code;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("linking the shared library failed (sh exited with status {}): sh -c "
                            "'exit {}'",
                            code, code));
    }
  }
  for (int sig : {SIGSEGV, SIGABRT, SIGTERM, SIGKILL}) {
    std::vector<driver::Job> jobs;
    jobs.push_back({"archiving", {}, {"sh", "-c", fmt::format("kill -{} $$", sig)}, "", {}});
    try {
      runner.run(std::move(jobs), 1);
      ADD_FAILURE() << "no error for signal " << sig;
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()),
                  HasSubstr(fmt::format("(sh killed by signal {} ({}))", sig, ::strsignal(sig))));
    }
  }
}

}  // namespace
}  // namespace kiln
