// The driver's processes and templates: wait statuses in words, run_process's captures,
// JobRunner's parallel jobs, its cleanup of the others when one fails, its messages for a
// program that fails or a child killed by a signal, SIGINT turned into Interrupted with
// the children gone, and the template renderer.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "driver/jobs.h"
#include "driver/templates.h"
#include "support/error.h"
#include "support/process.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
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

TEST(Templates, RenderReplacesNamedPlaceholders) {
  const std::string text =
      driver::render("model_method_into.h.in", {{"function", "f"},
                                                {"params", "const kiln::Input& x"},
                                                {"out_params", ", kiln::Tensor<float>& y"},
                                                {"args", "x"},
                                                {"out_args", "y"},
                                                {"outputs", "y: f32[2]"},
                                                {"its", "its"}});
  EXPECT_EQ(
      text,
      "  /* The same into y: f32[2], reusing its storage: no allocation once large enough. */\n"
      "  void f(const kiln::Input& x, kiln::Tensor<float>& y) { run(\"f\", {x}, {y}); }\n");
  EXPECT_THAT(std::string(driver::template_text("model.h.in")),
              StartsWith("// Generated by kiln compile: model '@name@'"));
}

}  // namespace
}  // namespace kiln
