// Issue 25: kiln compile, kiln run and kiln inspect under misuse, each over a generated
// family of variants. A compile signalled (SIGINT, SIGTERM, SIGHUP, SIGKILL) at random
// moments leaves no process and, once a later compile ran, no staging directory behind,
// and the outputs the user had stay whole; two compiles of one library name into one
// directory at once leave one whole set; library names the generated C++ cannot take are
// refused before any work; failing toolchain steps are named in words; the interpreter
// refuses a run above its memory limit before it starts; kiln inspect --memory exits 1 on
// an unsound plan.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/safetensors.h"
#include "tests/cli_run.h"
#include "tests/marked_processes.h"

namespace kiln {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;
using testing::wait_for_marked;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A small model with a few kernels of different kinds (a GEMM, a softmax, an elementwise
// chain): its compile takes seconds, not minutes.
std::string small_module(const std::string& function) {
  return fmt::format(
      "module @m {{\n  symbol B max 4\n"
      "  func @{}(%x: f32[B,16], %w: f32[16,16]) -> (f32[B,16]) {{\n"
      "    %a = matmul(%x, %w) : f32[B,16]\n"
      "    %p = softmax(%a) {{axis = -1}} : f32[B,16]\n"
      "    %r = relu(%p) : f32[B,16]\n"
      "    %e = exp(%r) : f32[B,16]\n"
      "    return %e\n  }}\n}}\n",
      function);
}

// Entries of `dir` whose name holds ".kiln-tmp." (staging directories, temporary files).
std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".kiln-tmp.") != std::string::npos)
      out.push_back(e.path().filename().string());
  return out;
}

class CompileMisuse : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_misuse_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  void write(const std::string& f, const std::string& text) const {
    std::ofstream(path(f), std::ios::binary) << text;
  }
  fs::path dir_;
};

// A family of compiles signalled at random moments of their run (from before the first
// kernel to after the last), cycling through SIGINT, SIGTERM, SIGHUP and SIGKILL. After
// each: every process the compile started is gone (kill -9 included: the children's group
// dies with kiln); after an interrupt no staging directory is left; the library and header
// an earlier compile wrote are still there, whole. A compile after a kill -9 removes the
// staging directory the killed one left, by its free lock.
TEST_F(CompileMisuse, SignalsAtRandomMomentsLeaveNothingBehind) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // kiln keeps a signal ignored when it starts (under nohup, say), and the compiles below
  // inherit this process's dispositions: they start with the defaults, as from a shell.
  struct DefaultSignals {
    int signals[3] = {SIGINT, SIGTERM, SIGHUP};
    sighandler_t former[3];
    DefaultSignals() {
      for (int i = 0; i < 3; ++i) former[i] = ::signal(signals[i], SIG_DFL);
    }
    ~DefaultSignals() {
      for (int i = 0; i < 3; ++i) ::signal(signals[i], former[i]);
    }
  } defaults;
  write("small.kir", small_module("alpha_entry"));
  const std::string out = path("out");
  auto compile = [&](const std::vector<std::string>& prefix, const std::string& marker) {
    std::vector<std::string> argv = prefix;
    for (const std::string& w :
         {testing::kiln_binary(), std::string("compile"), path("small.kir"), std::string("-j"),
          std::string("2"), std::string("-o"), out, std::string("--name"), std::string("m")})
      argv.push_back(w);
    return testing::run_argv(argv, {.env = {marker}});
  };
  const auto start = Clock::now();
  const testing::CliResult first = compile({}, "KILN_MISUSE_MARK=first");
  const double full = seconds_since(start);
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string header = read_all(fs::path(out) / "m.h");
  const std::string library = read_all(fs::path(out) / "libm.a");
  ASSERT_FALSE(header.empty());
  std::mt19937 rng(2025);
  const std::pair<const char*, int> signals[] = {
      {"INT", SIGINT}, {"TERM", SIGTERM}, {"HUP", SIGHUP}, {"KILL", SIGKILL}};
  for (int round = 0; round < 8; ++round) {
    const auto [sig_name, sig] = signals[round % 4];
    const double delay = std::uniform_real_distribution<double>(0.05, full * 1.1)(rng);
    const std::string marker = fmt::format("KILN_MISUSE_MARK={}_{}", ::getpid(), round);
    SCOPED_TRACE(fmt::format("round {}: SIG{} after {:.2f} s of a {:.2f} s compile", round,
                             sig_name, delay, full));
    const testing::CliResult r = compile(
        {"timeout", "--preserve-status", "-s", sig_name, fmt::format("{:.3f}", delay)}, marker);
    // Finished first (exit 0), or died of the signal (128 + its number), never an error.
    // (timeout sends the signal to its own process group too, which SIGKILL ends it with.)
    EXPECT_TRUE(r.status == 0 || r.status == 128 + sig || (sig == SIGKILL && r.signal == SIGKILL))
        << r.status << "\n"
        << r.output;
    EXPECT_THAT(r.output, Not(HasSubstr("kiln: error")));
    const std::vector<pid_t> left = wait_for_marked(marker, 10);
    EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the compile outlived it";
    for (pid_t p : left) ::kill(p, SIGKILL);
    if (sig != SIGKILL) EXPECT_THAT(temporaries(out), ::testing::IsEmpty());
    // The same IR each time: whichever compile published last, the set is whole.
    EXPECT_EQ(read_all(fs::path(out) / "m.h"), header);
    EXPECT_EQ(read_all(fs::path(out) / "libm.a").size(), library.size());
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  // A last compile removes what a kill -9 left; the directory holds the outputs only.
  ASSERT_EQ(compile({}, "KILN_MISUSE_MARK=last").status, 0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"libm.a", "m.h"}));
}

// Two compiles of different modules with one --name into one directory at once, started
// with a random stagger: each exits 0 and the directory ends with one compile's whole set,
// its header and its library naming the same entry point, and nothing else.
TEST_F(CompileMisuse, ConcurrentCompilesOfOneNameLeaveOneWholeSet) {
  write("alpha.kir", small_module("alpha_entry"));
  write("omega.kir", small_module("omega_entry"));
  std::mt19937 rng(7);
  for (int round = 0; round < 2; ++round) {
    const std::string out = path(fmt::format("out{}", round));
    const int stagger_ms = std::uniform_int_distribution<int>(0, 1500)(rng);
    SCOPED_TRACE(
        fmt::format("round {}: the second starts {} ms after the first", round, stagger_ms));
    testing::CliResult a, b;
    std::thread first([&] {
      a = testing::run_argv(
          {"%kiln", "compile", path("alpha.kir"), "-j", "1", "-o", out, "--name", "m"});
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(stagger_ms));
    b = testing::run_argv(
        {"%kiln", "compile", path("omega.kir"), "-j", "1", "-o", out, "--name", "m"});
    first.join();
    EXPECT_EQ(a.status, 0) << a.output;
    EXPECT_EQ(b.status, 0) << b.output;
    const std::string h = read_all(fs::path(out) / "m.h");
    const std::string lib = read_all(fs::path(out) / "libm.a");
    const bool alpha = h.find("alpha_entry") != std::string::npos;
    EXPECT_NE(alpha, h.find("omega_entry") != std::string::npos) << h;
    EXPECT_NE(lib.find(alpha ? "alpha_entry" : "omega_entry"), std::string::npos);
    EXPECT_EQ(lib.find(alpha ? "omega_entry" : "alpha_entry"), std::string::npos)
        << "one compile's library beside the other's header";
    EXPECT_THAT(temporaries(out), ::testing::IsEmpty());
  }
}

// Library names the generated header cannot take (a random sample of the C and C++
// keywords, names the C++ standard reserves, kiln's own names, macros of the headers the
// header includes, in both strict and GNU modes) are refused by name before any work: one
// error line, no kernel compiled, no output directory created.
TEST_F(CompileMisuse, LibraryNamesTheHeaderCannotTakeAreRefusedFirst) {
  write("small.kir", small_module("f"));
  std::vector<std::string> keywords = {
      "alignas",   "alignof",   "and",       "asm",      "auto",      "bool",      "break",
      "case",      "catch",     "char",      "char8_t",  "class",     "concept",   "const",
      "consteval", "constexpr", "constinit", "continue", "co_await",  "decltype",  "default",
      "delete",    "do",        "double",    "else",     "enum",      "explicit",  "export",
      "extern",    "false",     "float",     "for",      "friend",    "goto",      "if",
      "inline",    "int",       "long",      "mutable",  "namespace", "new",       "noexcept",
      "not",       "nullptr",   "operator",  "or",       "private",   "protected", "public",
      "register",  "requires",  "return",    "short",    "signed",    "sizeof",    "static",
      "struct",    "switch",    "template",  "this",     "throw",     "true",      "try",
      "typedef",   "typeid",    "typename",  "union",    "unsigned",  "using",     "virtual",
      "void",      "volatile",  "wchar_t",   "while",    "xor",       "restrict",  "_Bool",
      "_Atomic"};
  std::mt19937 rng(12);
  std::shuffle(keywords.begin(), keywords.end(), rng);
  keywords.resize(16);
  struct Case {
    std::string name, why;
  };
  std::vector<Case> cases;
  for (const std::string& k : keywords) cases.push_back({k, "is a C or C++ keyword"});
  for (const char* r : {"__m", "_Model", "my__model"})
    cases.push_back({r, "is reserved by the C++ standard"});
  for (const char* own : {"kiln", "kiln_model", "kiln_tensor", "kiln_models", "std"})
    cases.push_back({own, "is one of kiln's own names"});
  for (const char* macro : {"NULL", "EOF", "errno", "INT64_MAX", "linux", "unix", "SIZE_MAX"})
    cases.push_back({macro, "is a macro of the C/C++ headers that the generated header includes"});
  for (const char* bad : {"9lives", "a-b", "x.y"}) cases.push_back({bad, "is not a C identifier"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string out = path("never");
    const testing::CliResult r =
        testing::run_argv({"%kiln", "compile", path("small.kir"), "--name", c.name, "-o", out});
    EXPECT_EQ(r.status, 1);
    EXPECT_THAT(r.output, StartsWith("kiln: error: library name '" + c.name + "' " + c.why));
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(fs::exists(out));
  }
}

// A toolchain step that fails is named with its exit status or signal in words, for a
// family of exit codes and signals (a C++ compiler wrapper that fails the glue compile, or
// the shared library's link), never a raw wait status; nothing is left in the output
// directory, which the compile had created.
TEST_F(CompileMisuse, FailedToolchainStepsAreNamedInWords) {
  write("small.kir", small_module("f"));
  std::mt19937 rng(256);
  struct Case {
    std::string step;  // what the wrapper fails on
    std::string end;   // how: "exit N" or "kill -SIG $$"
    std::string said;  // in kiln's message
  };
  std::vector<Case> cases;
  for (int i = 0; i < 3; ++i) {
    const int code = std::uniform_int_distribution<int>(1, 255)(rng);
    cases.push_back(
        {"_glue.cpp", fmt::format("exit {}", code), fmt::format("exited with status {}", code)});
  }
  cases.push_back({"_glue.cpp", "kill -SEGV $$", "killed by signal 11 (Segmentation fault)"});
  cases.push_back({"-shared", "exit 1", "exited with status 1"});
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.step + ": " + c.end);
    const std::string wrapper = path(fmt::format("cxx{}", i));
    write(fmt::format("cxx{}", i), fmt::format("#!/bin/sh\nfor a; do case \"$a\" in *{}) {} ;; "
                                               "esac; done\nexec c++ \"$@\"\n",
                                               c.step, c.end));
    fs::permissions(wrapper, fs::perms::owner_all);
    const std::string out = path("out");
    std::vector<std::string> argv = {"%kiln", "compile", path("small.kir"), "-o", out};
    if (c.step == "-shared") argv.push_back("--emit=static,shared");
    const testing::CliResult r = testing::run_argv(argv, {.env = {"CXX=" + wrapper}});
    EXPECT_EQ(r.status, 1) << r.output;
    const std::string what = c.step == "-shared"
                                 ? "linking the shared library"
                                 : "compiling the generated header and glue of library 'm'";
    EXPECT_THAT(r.output,
                HasSubstr(fmt::format("kiln: error: {} failed (cxx{} {}): ", what, i, c.said)));
    EXPECT_THAT(r.output, Not(HasSubstr("status 256")));
    EXPECT_FALSE(fs::exists(out)) << "a failed compile leaves no output directory it created";
  }
}

// A family of memory plans (random chains of elementwise ops over f32[16], one 64-byte slot
// each): with every value at its own offset the plan is sound (exit 0); with two values
// that are live at once at one offset, unsound: the report is printed and a kiln: error
// line names the function (exit 1).
TEST_F(CompileMisuse, InspectMemoryExitsOneOnUnsoundPlans) {
  std::mt19937 rng(64);
  int unsound_cases = 0;
  for (int round = 0; round < 12; ++round) {
    const int n = std::uniform_int_distribution<int>(3, 7)(rng);
    // Op i defines v[i+1] from one or two earlier values (v[0] is the input).
    std::vector<std::vector<int>> reads(n);
    for (int i = 0; i < n; ++i) {
      reads[i].push_back(i);  // the previous value, so the chain is connected
      if (i > 0 && rng() % 2) reads[i].push_back(std::uniform_int_distribution<int>(0, i - 1)(rng));
    }
    std::vector<int> last(n + 1, 0);  // last op reading value v; n for the result
    for (int i = 0; i < n; ++i)
      for (int v : reads[i]) last[v] = std::max(last[v], i);
    last[n] = n;
    std::vector<int> offset(n + 1);
    for (int v = 1; v <= n; ++v) offset[v] = 64 * (v - 1);
    // Two op results u < w with u still read after w is defined share an offset.
    std::vector<std::pair<int, int>> clashes;
    for (int u = 1; u <= n; ++u)
      for (int w = u + 1; w < n; ++w)  // w: not the result (results get no offset)
        if (last[u] > w - 1) clashes.emplace_back(u, w);
    const bool unsound = !clashes.empty() && round % 2 == 0;
    if (unsound) {
      const auto [u, w] = clashes[rng() % clashes.size()];
      offset[w] = offset[u];
      ++unsound_cases;
    }
    std::string text =
        fmt::format("module @m {{\n  func @f(%v0: f32[16]) -> (f32[16]) arena {} {{\n", 64 * n);
    for (int i = 0; i < n; ++i) {
      const int v = i + 1;
      const std::string op = reads[i].size() == 1
                                 ? fmt::format("neg(%v{})", reads[i][0])
                                 : fmt::format("add(%v{}, %v{})", reads[i][0], reads[i][1]);
      text += fmt::format("    %v{} = {} : f32[16]{}\n", v, op,
                          v == n ? "" : fmt::format(" at {}", offset[v]));
    }
    text += fmt::format("    return %v{}\n  }}\n}}\n", n);
    write("plan.kir", text);
    SCOPED_TRACE(text);
    const testing::CliResult r =
        testing::run_argv({"%kiln", "inspect", path("plan.kir"), "--memory"});
    if (unsound) {
      EXPECT_EQ(r.status, 1) << r.output;
      EXPECT_THAT(r.output, HasSubstr("plan check: 1 problem(s)"));
      EXPECT_THAT(r.output, HasSubstr("kiln: error: inspect: the memory plan of function 'f' "
                                      "(1: "));
      EXPECT_THAT(r.output, EndsWith("is unsound (run 'kiln opt' to plan it again)\n"));
    } else {
      EXPECT_EQ(r.status, 0) << r.output;
      EXPECT_THAT(r.output, HasSubstr("plan check: sound"));
    }
  }
  EXPECT_GT(unsound_cases, 2);
}

// The interpreter's memory limit over a family of sizes: f(x) = exp(x) + neg(exp(x)) peaks
// at op 2 with x's copy freed and three f32[N] values live (12 N bytes). kiln run refuses
// --max-memory 12N-1 before running, naming the op and the total, and runs at 12N; a run
// the machine cannot give the memory names the op; sizes that are not sizes are refused by
// name.
TEST_F(CompileMisuse, RunRefusesAboveItsMemoryLimitBeforeStarting) {
  std::mt19937 rng(8);
  rt::write_safetensors(path("none.safetensors"), {});
  for (int round = 0; round < 4; ++round) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1000, 200000)(rng);
    SCOPED_TRACE(n);
    write("f.kir", fmt::format("module @m {{\n  func @f(%x: f32[{0}]) -> (f32[{0}]) {{\n"
                               "    %a = exp(%x) : f32[{0}]\n    %b = neg(%a) : f32[{0}]\n"
                               "    %c = add(%a, %b) : f32[{0}]\n    return %c\n  }}\n}}\n",
                               n));
    rt::write_safetensors(
        path("in.safetensors"),
        {rt::make_f32("x", {n}, std::vector<float>(static_cast<size_t>(n), 0.5f))});
    auto run = [&](int64_t limit) {
      return testing::run_argv({"%kiln", "run", path("f.kir"), "--function", "f", "--weights",
                                path("none.safetensors"), "--inputs", path("in.safetensors"),
                                "--max-memory", std::to_string(limit)});
    };
    const testing::CliResult refused = run(12 * n - 1);
    EXPECT_EQ(refused.status, 1);
    EXPECT_EQ(refused.output,
              fmt::format("kiln: error: line 5: function 'f', op 2 (%c = add): the interpreter "
                          "needs {} bytes for the values live at this op, above its limit of {} "
                          "bytes (kiln run --max-memory raises it)\n",
                          12 * n, 12 * n - 1));
    const testing::CliResult ok = run(12 * n);
    EXPECT_EQ(ok.status, 0) << ok.output;
  }
  // Under the limit but more than the machine gives (an address-space limit of 2 GB): the
  // op that could not get its memory is named, not "std::bad_alloc".
  for (int round = 0; round < 2; ++round) {
    const int64_t n = std::uniform_int_distribution<int64_t>(600'000'000, 900'000'000)(rng);
    write("big.kir", fmt::format("module @m {{\n  func @f() -> (f32[{0}]) {{\n    %c = constant() "
                                 "{{value = 1.0}} : f32[{0}]\n    return %c\n  }}\n}}\n",
                                 n));
    const testing::CliResult r = testing::run_argv(
        {"prlimit", "--as=2000000000", testing::kiln_binary(), "run", path("big.kir"), "--function",
         "f", "--weights", path("none.safetensors"), "--inputs", path("none.safetensors"),
         "--max-memory", "100G"});
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(r.output, fmt::format("kiln: error: line 3: function 'f', op 0 (%c = constant): out "
                                    "of memory (the values live at the interpreter's peak need {} "
                                    "bytes; the machine could not give them)\n",
                                    4 * n));
  }
  for (const char* bad : {"0", "-1", "8X", "1.5G", "99999999999T"}) {
    const testing::CliResult r = testing::run_argv(
        {"%kiln", "run", path("f.kir"), "--function", "f", "--weights", path("none.safetensors"),
         "--inputs", path("in.safetensors"), "--max-memory", bad});
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_THAT(r.output, StartsWith("kiln: error: "));
    EXPECT_THAT(r.output, HasSubstr(fmt::format("got '{}'", bad)));
  }
}

}  // namespace
}  // namespace kiln
