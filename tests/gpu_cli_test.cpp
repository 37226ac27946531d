// `kiln run --compiled` with libraries compiled for GPU targets (issue 14), end to end through
// the CLI: tests/gpu/norms.kir and tests/gpu/linears.kir compiled by `kiln compile --target
// host-opencl --emit=shared` run on the OpenCL device (pocl in the suite) and match the
// interpreter (`kiln run`) on random inputs of odd sizes; without an OpenCL platform the run
// is a clear error. A CUDA library is run as well: on a machine without a CUDA driver it is a
// clear error with exit status 1, never a crash; with one, it matches the interpreter. kiln
// runs compiled libraries in kiln-run, which links no libHalide (checked here with ldd).
// Tests that need an OpenCL device skip, saying so, where there is none.
#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli_run.h"
#include "ir/parser.h"
#include "opencl_device.h"
#include "runtime/safetensors.h"
#include "support/read_file.h"

namespace kiln {
namespace {

using testing::CliResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_cli;

std::string gpu_kir(const std::string& f) { return std::string(KILN_TEST_DATA_DIR) + "/gpu/" + f; }

ir::Module read_kir(const std::string& file) {
  const std::vector<uint8_t> text = read_input_file(file);
  return ir::parse_and_verify(std::string(text.begin(), text.end()), file);
}

// Random f32 values in [-1, 1).
std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// Writes random inputs of `function` (symbols bound to `sizes`; ids in [0, V)) to `path`.
void write_random_inputs(const ir::Module& m, const std::string& function,
                         const std::map<std::string, int64_t>& sizes, uint32_t seed,
                         const std::string& path) {
  const ir::Function& f = *m.find_function(function);
  std::mt19937 rng(seed);
  std::vector<rt::TensorData> tensors;
  for (ir::ValueId p : f.params) {
    const ir::TensorType& type = f.type(p);
    std::vector<int64_t> shape;
    int64_t n = 1;
    for (const ir::Dim& d : type.shape) {
      shape.push_back(d.is_symbolic() ? sizes.at(d.symbol) : d.value);
      n *= shape.back();
    }
    if (type.dtype == ir::DType::f32) {
      tensors.push_back(rt::make_f32(f.values[p].name, shape, random_floats(n, rng)));
    } else {
      std::uniform_int_distribution<int64_t> u(0, sizes.at("V") - 1);
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int64_t& x : v) x = u(rng);
      tensors.push_back(rt::make_i64(f.values[p].name, shape, v));
    }
  }
  rt::write_safetensors(path, tensors);
}

// Random weights of every weight the module declares (none for norms.kir).
void write_random_weights(const ir::Module& m, uint32_t seed, const std::string& path) {
  std::mt19937 rng(seed);
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights) {
    std::vector<int64_t> shape;
    for (const ir::Dim& d : w.type.shape) shape.push_back(d.value);
    tensors.push_back(rt::make_f32(w.name, shape, random_floats(ir::static_numel(w.type), rng)));
  }
  rt::write_safetensors(path, tensors);
}

class GpuCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(KILN_GPU_TEST_DIR) /
           ("kiln_gpu_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  std::filesystem::path dir_;

  // Compiles `kir` for `target` into path(out) as a shared library.
  CliResult compile(const std::string& kir, const std::string& target, const std::string& out) {
    return run_cli("%kiln compile " + kir + " --target " + target + " --emit=shared -o " +
                   path(out));
  }

  // Runs `function` of `kir` with the interpreter and of the library in path(out) with
  // `kiln run --compiled` on the same random inputs (symbols bound to `sizes`), and expects
  // every output to match within `atol`.
  void expect_compiled_matches(const std::string& kir, const ir::Module& m, const std::string& out,
                               const std::string& function,
                               const std::map<std::string, int64_t>& sizes, double atol) {
    SCOPED_TRACE(function);
    const std::string in = path(function + ".in.safetensors");
    const std::string ref = path(function + ".ref.safetensors");
    write_random_inputs(m, function, sizes, /*seed=*/7, in);
    const std::string args =
        " --function " + function + " --weights " + path("w.safetensors") + " --inputs " + in;
    const CliResult interpreted = run_cli("%kiln run " + kir + args + " -o " + ref);
    ASSERT_EQ(interpreted.status, 0) << interpreted.output;
    const CliResult compiled = run_cli("%kiln run --compiled " + path(out) + args + " --expect " +
                                       ref + " --atol " + std::to_string(atol));
    EXPECT_EQ(compiled.status, 0) << compiled.output;
    EXPECT_THAT(compiled.output, HasSubstr("match <= "));
    EXPECT_THAT(compiled.output, Not(HasSubstr("MISMATCH")));
    // One line per output of the function, each a match.
    size_t matches = 0;
    for (size_t at = 0; (at = compiled.output.find("(match <= ", at)) != std::string::npos; ++at)
      ++matches;
    EXPECT_EQ(matches, m.find_function(function)->results.size()) << compiled.output;
  }
};

// kiln-run, which runs every compiled library, links no libHalide (nor any LLVM): a GPU
// driver's LLVM (pocl's) next to libHalide's crashes.
TEST_F(GpuCli, KilnRunLinksNoHalide) {
  const CliResult ldd = run_cli("ldd " + std::string(KILN_BINARY_DIR) + "/tools/kiln-run");
  ASSERT_EQ(ldd.status, 0) << ldd.output;
  EXPECT_THAT(ldd.output, HasSubstr("libc.so"));
  EXPECT_THAT(ldd.output, Not(HasSubstr("Halide")));
  EXPECT_THAT(ldd.output, Not(HasSubstr("LLVM")));
  // kiln itself does link it (kiln compile), so it must hand compiled runs over.
  const CliResult kiln = run_cli("ldd " + testing::kiln_binary());
  EXPECT_THAT(kiln.output, HasSubstr("Halide"));
}

// The kernels of norms.kir (layernorm, add_layernorm with its sum, elementwise, gather),
// compiled for OpenCL, through `kiln run --compiled` on pocl.
TEST_F(GpuCli, OpenCLNormsMatchInterpreter) {
  if (!testing::opencl_device_present()) GTEST_SKIP() << "no OpenCL device";
  const std::string kir = gpu_kir("norms.kir");
  const CliResult c = compile(kir, "host-opencl", "out");
  ASSERT_EQ(c.status, 0) << c.output;
  const ir::Module m = read_kir(kir);
  write_random_weights(m, 1, path("w.safetensors"));
  // Within the CPU kernels' tolerance (1e-5 on unit-scale data).
  for (const char* f : {"norm7", "norm129", "chain"})
    expect_compiled_matches(kir, m, "out", f, {{"R", 33}}, 1e-5);
  for (const char* f : {"residual", "positions", "lookup"})
    expect_compiled_matches(kir, m, "out", f, {{"B", 3}, {"S", 7}, {"V", 9}}, 1e-5);
}

// The linear kernels of linears.kir (bias, relu and gelu epilogues, packed weights), compiled
// for OpenCL, with random weights, through `kiln run --compiled` on pocl.
TEST_F(GpuCli, OpenCLLinearsMatchInterpreter) {
  if (!testing::opencl_device_present()) GTEST_SKIP() << "no OpenCL device";
  const std::string kir = gpu_kir("linears.kir");
  const CliResult c = compile(kir, "host-opencl", "out");
  ASSERT_EQ(c.status, 0) << c.output;
  const ir::Module m = read_kir(kir);
  write_random_weights(m, 2, path("w.safetensors"));
  // Sums of up to 129 products of unit-scale values (outputs up to about 10).
  for (const ir::Function& f : m.functions)
    for (int64_t rows : {1, 33})
      expect_compiled_matches(kir, m, "out", f.name, {{"M", rows}}, 1e-4);
}

std::string golden(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// Issue 14's acceptance: the whole tiny golden model compiled for host-opencl matches the
// PyTorch goldens within 1e-4 through `kiln run --compiled` (both batches, forward and
// encode), and `kiln translate` with it gives the reference beam search's ids.
TEST_F(GpuCli, OpenCLTinyGoldenMatchesPyTorch) {
  if (!testing::opencl_device_present()) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(run_cli("%kiln emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  const CliResult c = compile(path("tiny.kir"), "host-opencl", "out");
  ASSERT_EQ(c.status, 0) << c.output;
  for (const char* batch : {"tiny_b1", "tiny_b2"})
    for (const char* fn : {"forward", "encode"}) {
      const CliResult r =
          run_cli("%kiln run --compiled " + path("out") + " --function " + fn + " --weights " +
                  golden("tiny.weights.safetensors") + " --inputs " +
                  golden(std::string(batch) + ".inputs.safetensors") + " --expect " +
                  golden(std::string(batch) + ".expected.safetensors") + " --atol 1e-4");
      EXPECT_EQ(r.status, 0) << batch << " " << fn << ": " << r.output;
      EXPECT_THAT(r.output, HasSubstr("(match <= 0.0001)")) << batch << " " << fn;
    }
  // Beam search over prepare and decode_step on the device (tests/golden/tiny_decode.safetensors,
  // case beam_c: start 1, end 32; its smallest score margin is 1.4e-3).
  const CliResult t = run_cli(
      "%kiln translate --compiled " + path("out") + " --weights " +
      golden("tiny.weights.safetensors") + " --inputs " + golden("tiny_decode.safetensors") +
      " --beam 3 --num-hypotheses 2 --max-len 10 --min-len 1 --length-penalty 0.6 --start-id 1 "
      "--end-id 32 -o " +
      path("beam.safetensors"));
  ASSERT_EQ(t.status, 0) << t.output;
  rt::SafeTensors got = rt::SafeTensors::load(path("beam.safetensors"));
  rt::SafeTensors want = rt::SafeTensors::load(golden("tiny_decode.safetensors"));
  EXPECT_EQ(got.to_i64(got.at("ids")), want.to_i64(want.at("beam_c.ids")));
  EXPECT_EQ(got.to_i64(got.at("lengths")), want.to_i64(want.at("beam_c.lengths")));
}

// The small golden model likewise (forward and encode against PyTorch within 1e-4), and the
// odd random config of tests/CMakeLists.txt's gpu_odd (d_k 7, d_ff 13, odd vocabularies, pad
// id 2) on random weights against the interpreter, forward and encode at batch 3.
TEST_F(GpuCli, OpenCLSmallGoldenAndOddConfigMatch) {
  if (!testing::opencl_device_present()) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(run_cli("%kiln emit transformer --config small -o " + path("small.kir")).status, 0);
  CliResult c = compile(path("small.kir"), "host-opencl", "small");
  ASSERT_EQ(c.status, 0) << c.output;
  for (const char* fn : {"forward", "encode"}) {
    const CliResult r = run_cli("%kiln run --compiled " + path("small") + " --function " + fn +
                                " --weights " + golden("small.weights.safetensors") + " --inputs " +
                                golden("small_b1.inputs.safetensors") + " --expect " +
                                golden("small_b1.expected.safetensors") + " --atol 1e-4");
    EXPECT_EQ(r.status, 0) << fn << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("(match <= 0.0001)")) << fn;
  }
  ASSERT_EQ(run_cli("%kiln emit transformer --config tiny --set d_model=21 --set heads=3 "
                    "--set d_ff=13 --set src_vocab=17 --set tgt_vocab=19 --set enc_layers=1 "
                    "--set dec_layers=2 --set pad_id=2 --set max_len=12 --set max_batch=3 -o " +
                    path("odd.kir"))
                .status,
            0);
  c = compile(path("odd.kir"), "host-opencl", "odd");
  ASSERT_EQ(c.status, 0) << c.output;
  const ir::Module m = read_kir(path("odd.kir"));
  write_random_weights(m, 3, path("w.safetensors"));
  // Ids below 17, the smaller vocabulary; pad id 2 among them.
  for (const char* fn : {"forward", "encode"})
    expect_compiled_matches(path("odd.kir"), m, "odd", fn,
                            {{"B", 3}, {"S", 11}, {"T", 5}, {"V", 17}}, 1e-4);
}

// With no OpenCL platform visible (the ICD loader reads its vendors from an empty folder),
// running an OpenCL library is an error naming the failure, exit status 1, not a crash.
TEST_F(GpuCli, OpenCLWithoutDeviceIsAnError) {
  const std::string kir = gpu_kir("norms.kir");
  const CliResult c = compile(kir, "host-opencl", "out");
  ASSERT_EQ(c.status, 0) << c.output;
  const ir::Module m = read_kir(kir);
  write_random_weights(m, 1, path("w.safetensors"));
  write_random_inputs(m, "norm7", {{"R", 5}}, 3, path("in.safetensors"));
  std::filesystem::create_directories(path("no_vendors"));
  const CliResult r = run_cli("OCL_ICD_VENDORS=" + path("no_vendors") + " %kiln run --compiled " +
                              path("out") + " --function norm7 --weights " + path("w.safetensors") +
                              " --inputs " + path("in.safetensors"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.signal, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::StartsWith("kiln: error: ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("OpenCL")) << r.output;
}

// A CUDA library (the PTX of norms.kir) through `kiln run --compiled`: without a CUDA driver
// (libcuda.so.1) the run is an error naming CUDA, exit status 1, not a crash; with one, it
// matches the interpreter.
TEST_F(GpuCli, CudaRunsOrIsAClearError) {
  const std::string kir = gpu_kir("norms.kir");
  const CliResult c = compile(kir, "host-cuda-cuda_capability_86", "cuda");
  ASSERT_EQ(c.status, 0) << c.output;
  const ir::Module m = read_kir(kir);
  write_random_weights(m, 1, path("w.safetensors"));
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver) {
    dlclose(driver);
    expect_compiled_matches(kir, m, "cuda", "norm129", {{"R", 33}}, 1e-5);
    return;
  }
  write_random_inputs(m, "norm129", {{"R", 33}}, 3, path("in.safetensors"));
  const CliResult r =
      run_cli("%kiln run --compiled " + path("cuda") + " --function norm129 --weights " +
              path("w.safetensors") + " --inputs " + path("in.safetensors"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.signal, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::StartsWith("kiln: error: ")) << r.output;
  EXPECT_THAT(r.output, ::testing::ContainsRegex("[Cc][Uu][Dd][Aa]")) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;  // one line
}

// kiln without kiln-run beside it: `kiln run --compiled` and `kiln translate` say what is
// missing (exit status 1); everything else still works.
TEST_F(GpuCli, MissingKilnRunIsAnError) {
  std::filesystem::create_directories(path("bin"));
  std::error_code ec;
  std::filesystem::create_hard_link(testing::kiln_binary(), path("bin/kiln"), ec);
  if (ec) std::filesystem::copy_file(testing::kiln_binary(), path("bin/kiln"));
  const std::string kiln = path("bin/kiln");
  const std::string message = "cannot run '" + path("bin/kiln-run") +
                              "', which runs compiled libraries for kiln (installed next to it): "
                              "No such file or directory\n";
  const CliResult r = run_cli(kiln + " run --compiled " + path("out") +
                              " --weights w.safetensors --inputs in.safetensors");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output, "kiln: error: run: " + message);
  const CliResult t = run_cli(kiln + " translate --compiled " + path("out"));
  EXPECT_EQ(t.status, 1) << t.output;
  EXPECT_EQ(t.output, "kiln: error: translate: " + message);
  const CliResult models = run_cli(kiln + " models");
  EXPECT_EQ(models.status, 0) << models.output;
  EXPECT_THAT(models.output, HasSubstr("transformer"));
}

}  // namespace
}  // namespace kiln
