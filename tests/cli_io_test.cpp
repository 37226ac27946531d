// The `kiln` CLI when writing fails or results are dishonest: every failed write (a full
// device, a file size limit, a full standard output) exits 1 with a `kiln: error:` line
// and leaves no partial file; a failed `kiln compile` leaves the output directory as it
// was; `--expect` counts NaN as a mismatch.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli_run.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::run_cli;
using ::testing::StartsWith;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every regular file under `dir`, by relative path, with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? read_file(e.path()) : "";
  return files;
}

std::string source(const std::string& f) { return std::string(KILN_TEST_DATA_DIR) + "/" + f; }

// Options under which a write past `blocks` KiB fails with EFBIG ("File too large")
// instead of killing the process (SIGXFSZ ignored, which kiln inherits).
testing::CliOptions file_size_limit(int blocks) { return {.file_size_limit = blocks * 1024LL}; }

class CliIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_cli_io_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  fs::path dir_;
};

// Writing IR to a full device or a full standard output is an error, not exit 0.
TEST_F(CliIoTest, FullDeviceAndFullStandardOutputAreErrors) {
  auto r = run_cli("%kiln opt " + source("abi/dtypes.kir") + " -o /dev/full");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output, "kiln: error: cannot write '/dev/full': No space left on device\n");
  r = run_cli("%kiln emit transformer --config tiny", {.stdout_path = "/dev/full"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output, "kiln: error: cannot write to standard output: No space left on device\n");
  r = run_cli("%kiln inspect " + source("abi/dtypes.kir") + " --ops", {.stdout_path = "/dev/full"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, StartsWith("kiln: error: cannot write to standard output"));
}

// A write that fails midway leaves the file as it was before (here: absent, then an
// earlier complete version), and no temporary file beside it.
TEST_F(CliIoTest, FailedWritesLeaveNoPartialFile) {
  const std::string kir = path("m.kir");
  auto r = run_cli("%kiln emit transformer --config tiny -o " + kir, file_size_limit(0));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output, "kiln: error: cannot write '" + kir + "': File too large\n");
  EXPECT_TRUE(snapshot(dir_).empty());

  ASSERT_EQ(run_cli("%kiln emit transformer --config tiny -o " + kir).status, 0);
  const auto before = snapshot(dir_);
  r = run_cli("%kiln emit transformer --config small -o " + kir, file_size_limit(1));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(snapshot(dir_), before);

  // kiln run -o: the outputs file too.
  rt::write_safetensors(path("w.safetensors"), {});
  rt::write_safetensors(path("in.safetensors"),
                        {rt::make_f32("x", {3, 5}, std::vector<float>(15, 1.f))});
  const auto inputs = snapshot(dir_);
  r = run_cli("%kiln run " + source("abi/dtypes.kir") + " --function floats --weights " +
                  path("w.safetensors") + " --inputs " + path("in.safetensors") + " -o " +
                  path("out.safetensors"),
              file_size_limit(0));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("kiln: error: cannot write '" + path("out.safetensors") +
                                  "': File too large"));
  EXPECT_EQ(snapshot(dir_), inputs);
}

// A compile that fails (a file it cannot write; a target the host cannot link; no working
// C++ compiler) exits 1 naming the step and leaves an earlier library,
// its header and the directory as they were.
TEST_F(CliIoTest, FailedCompileLeavesTheOutputDirectoryAsItWas) {
  const std::string out = path("out");
  auto r = run_cli("%kiln compile " + source("abi/dtypes.kir") + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto good = snapshot(out);
  ASSERT_TRUE(good.count("libabi_dtypes.a") && good.count("abi_dtypes.h"));

  // The generated header is the first file a compile writes (before its glue and kernels).
  r = run_cli("%kiln compile " + source("abi/dtypes.kir") + " -j 1 -o " + out, file_size_limit(0));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.signal, 0);
  EXPECT_THAT(r.output, HasSubstr("kiln: error: cannot write '"));
  EXPECT_THAT(r.output, HasSubstr("abi_dtypes.h': File too large"));
  EXPECT_EQ(snapshot(out), good);

  // A target whose objects the host linker cannot link: the shared library fails last.
  r = run_cli("%kiln compile " + source("abi/dtypes.kir") +
              " --target arm-64-linux --emit=static,shared -o " + out);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("kiln: error: linking the shared library failed"));
  EXPECT_EQ(snapshot(out), good);

  r = run_cli("CXX=/bin/false %kiln compile " + source("abi/dtypes.kir") +
              " --emit=static,shared,ir -o " + out);
  EXPECT_EQ(r.status, 1) << r.output;
  // The compiler is first run to check the library name against the header's macros
  // (compile_misuse_test.cpp fails the glue compile itself).
  EXPECT_EQ(r.output,
            "kiln: error: cannot preprocess kiln/runtime.h with '/bin/false' (exited with status "
            "1): is a C++ compiler installed?\n");
  EXPECT_EQ(snapshot(out), good);
}

// --expect: NaN where a number is expected is a mismatch (max(err, NaN) once read 0).
TEST_F(CliIoTest, ExpectCountsNanAsMismatch) {
  std::ofstream(path("sqrt.kir")) << "module @m {\n"
                                     "  func @f(%x: f32[2]) -> (f32[2]) {\n"
                                     "    %y = sqrt(%x) : f32[2]\n"
                                     "    return %y\n"
                                     "  }\n"
                                     "}\n";
  rt::write_safetensors(path("w.safetensors"), {});
  rt::write_safetensors(path("in.safetensors"), {rt::make_f32("x", {2}, {-1.f, 4.f})});
  rt::write_safetensors(path("nan.safetensors"), {rt::make_f32("y", {2}, {NAN, 2.f})});
  rt::write_safetensors(path("zero.safetensors"), {rt::make_f32("y", {2}, {0.f, 2.f})});
  const std::string run = "%kiln run " + path("sqrt.kir") + " --function f --weights " +
                          path("w.safetensors") + " --inputs " + path("in.safetensors");
  auto r = run_cli(run + " --expect " + path("zero.safetensors"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("y: 1 NaN or infinite element(s) where " +
                                  path("zero.safetensors") + " has another value (MISMATCH)"));
  EXPECT_THAT(r.output, HasSubstr("(MISMATCH <= 0.0001)"));
  // NaN where NaN is expected matches.
  r = run_cli(run + " --expect " + path("nan.safetensors"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("y: max abs error 0 vs " + path("nan.safetensors") + " (match <= 0.0001)"));
}

}  // namespace
}  // namespace kiln
