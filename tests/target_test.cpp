// Targets and the CPU: `host` resolves to features this CPU really has, and a library
// built for a feature it lacks is refused at load with an error naming the feature
// (instead of dying with SIGILL in the first kernel).
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "abi_knl.h"
#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "runtime/cpu_features.h"
#include "support/process.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// What `kiln compile --target host` compiles for uses only features CPUID reports (the
// whole suite then runs host kernels: every compiled and JIT kernel test is a check too).
TEST(Target, HostHasOnlyFeaturesTheCpuHas) {
  const std::string host = codegen::resolve_target("host");
  std::printf("[ target   ] host resolves to %s\n", host.c_str());
  EXPECT_THAT(rt::missing_cpu_features(host), ::testing::IsEmpty()) << host;
  EXPECT_EQ(host, codegen::host_target().to_string());
}

// Each feature is checked against CPUID: no machine kiln runs on has Knights Landing's
// AVX512-ER and AVX512-PF.
TEST(Target, MissingFeaturesAreNamed) {
  const std::vector<std::string> missing =
      rt::missing_cpu_features("x86-64-linux-avx-avx2-avx512-avx512_knl-f16c-fma-sse41");
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_THAT(missing[0], HasSubstr("avx512_knl (")) << missing[0];
  EXPECT_THAT(missing[0], HasSubstr("AVX512-ER")) << missing[0];
  EXPECT_THAT(rt::missing_cpu_features("x86-64-linux-sse41-cuda-no_runtime"), ::testing::IsEmpty());
}

// kiln's own features for the bf16 and int8 kernels (compiled for LLVM's cooperlake) are
// CPUID's flags: the load check of such a library (the same check as avx512_knl's below)
// refuses it exactly where the CPU lacks AVX512-BF16 or AVX512-VNNI.
TEST(Target, PackedWeightFeaturesAreCpuidFlags) {
  EXPECT_EQ(rt::missing_cpu_features("x86-64-linux-avx512_vnni").empty(),
            __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"));
  EXPECT_EQ(rt::missing_cpu_features("x86-64-linux-avx512_bf16").empty(),
            __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16") &&
                __builtin_cpu_supports("avx512bw"));
  for (const std::string feature : {"avx512_vnni", "avx512_bf16"}) {
    const std::string lacks = rt::missing_cpu_features("x86-64-linux-" + feature).empty()
                                  ? "none"
                                  : rt::missing_cpu_features("x86-64-linux-" + feature)[0];
    std::printf("[ target   ] %s: this CPU lacks %s\n", feature.c_str(), lacks.c_str());
  }
}

// A library compiled for avx512_knl is refused by name when it is loaded.
TEST(Target, LibraryForAMissingFeatureIsRefusedAtLoad) {
  char* error = nullptr;
  kiln_model* model = abi_knl_create(nullptr, &error);
  EXPECT_EQ(model, nullptr);
  ASSERT_NE(error, nullptr);
  const std::string message = error;
  kiln_free_error(error);
  EXPECT_THAT(message, HasSubstr("model 'abi_dtypes' was compiled for target "
                                 "x86-64-linux-avx-avx2-avx512-avx512_knl-f16c-fma-sse41, but "
                                 "this CPU lacks avx512_knl (AVX512-ER"));
  EXPECT_THAT(message, HasSubstr("compile it again with --target host"));
  kiln_model_destroy(model);
  // Through the generated class: the same message as an exception.
  try {
    kiln_models::abi_knl m(nullptr);
    ADD_FAILURE() << "created a model for a CPU feature this machine lacks";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

// The bf16 kernels are compiled for LLVM's cooperlake (AVX-512 with BF16): a disassembly of
// a bf16 library has vdpbf16ps and no AVX512-FP16 instruction (Halide's sapphirerapids CPU
// may emit those; AMD Zen 4/5 lack them) and no AMX one. The f32 golden library is scanned
// the same way. objdump comes with binutils, which the compiler needs anyway.
std::map<std::string, int> mnemonics(const std::string& library) {
  std::map<std::string, int> count;
  const ProcessResult objdump = run_process({"objdump", "-d", "--no-show-raw-insn", library});
  const std::regex insn(R"(^\s+[0-9a-f]+:\s+([a-z][a-z0-9]*))");
  std::smatch m;
  std::istringstream lines(objdump.out);
  for (std::string line; std::getline(lines, line);)
    if (std::regex_search(line, m, insn)) ++count[m[1].str()];
  return count;
}

// AVX512-FP16 (vaddph, vfmadd231sh, vmovw, vcvtw2ph, ...; not F16C's vcvtps2ph) and AMX.
bool fp16_or_amx(const std::string& mnemonic) {
  static const std::regex fp16(R"(^v\w*(ph|sh)$|^vmovw$|^tile\w*$|^tdp\w*$)");
  return mnemonic != "vcvtps2ph" && std::regex_match(mnemonic, fp16);
}

TEST(Target, Bf16AndInt8LibrariesUseOnlyCooperlakeInstructions) {
  for (const char* fp16 : {"vaddph", "vfmadd231sh", "vmovw", "vcvtw2ph", "vmovsh", "tileloadd"})
    EXPECT_TRUE(fp16_or_amx(fp16)) << fp16;
  for (const char* fine : {"vcvtps2ph", "vcvtph2ps", "vdpbf16ps", "vfmadd231ps", "vpunpckhwd"})
    EXPECT_FALSE(fp16_or_amx(fine)) << fine;
  const std::string dir = std::string(KILN_BINARY_DIR) + "/tests/";
  for (const std::string lib :
       {"bf16_tiny.kiln/libbf16_tiny.a", "bf16fma_small.kiln/libbf16fma_small.a",
        "int8_tiny.kiln/libint8_tiny.a", "golden_tiny.kiln/libgolden_tiny.a"}) {
    const std::map<std::string, int> count = mnemonics(dir + lib);
    int total = 0;
    for (const auto& [name, n] : count) {
      total += n;
      EXPECT_FALSE(fp16_or_amx(name)) << lib << ": " << n << " x " << name;
    }
    ASSERT_GT(total, 1000) << "could not disassemble " << lib;
    // bf16fma_: the products on FMAs (--bf16-products fma), no vdpbf16ps; int8_ (the default
    // --bf16-products auto): attention's bf16 form has vdpbf16ps.
    const bool bf16 = lib.rfind("bf16_", 0) == 0, int8 = lib.rfind("int8", 0) == 0;
    EXPECT_EQ(count.count("vdpbf16ps") > 0, bf16 || int8) << lib;
    EXPECT_GT(count.count("vfmadd231ps") ? count.at("vfmadd231ps") : 0, 0) << lib;
    // int8: the products are vpdpbusd (AVX512-VNNI), never widened to f32.
    EXPECT_EQ(count.count("vpdpbusd") > 0, int8) << lib;
    std::printf(
        "[ target   ] %s: %d instructions, %d vdpbf16ps, %d vpdpbusd, no AVX512-FP16 or AMX\n",
        lib.c_str(), total, count.count("vdpbf16ps") ? count.at("vdpbf16ps") : 0,
        count.count("vpdpbusd") ? count.at("vpdpbusd") : 0);
  }
}

// The f32 linears of a model library prefetch the next weight panel with prefetcht0 (locality
// 3, raised in LLVM IR from Halide 14's prefetchnta, codegen/kernels.cpp) where the target has
// Skylake's AVX-512, which tests/abi/linears.kir's 512 × 512 kernel uses (8 panels); none of
// them prefetches with prefetchnta.
TEST(Target, F32LinearsPrefetchTheNextPanelIntoTheCaches) {
  const std::string lib = std::string(KILN_BINARY_DIR) + "/tests/f32_linears.kiln/libf32_linears.a";
  const std::map<std::string, int> count = mnemonics(lib);
  ASSERT_GT(count.size(), 10u) << "could not disassemble " << lib;
  const auto n = [&](const char* m) { return count.count(m) ? count.at(m) : 0; };
  const bool avx512 = codegen::host_target().has_feature(Halide::Target::AVX512_Skylake);
  EXPECT_EQ(n("prefetcht0") > 0, avx512) << lib;
  EXPECT_EQ(n("prefetchnta"), 0) << lib;
  std::printf("[ target   ] %s: %d prefetcht0\n", lib.c_str(), n("prefetcht0"));
}

// The threads per block a GPU kernel launches are measured from the lowered pipeline, as
// Halide sizes the launch: each thread dimension's largest extent over the stages. A stage
// with 64 threads in one dimension next to one with 8 × 8 launches 64 × 8 (a GPU attention
// schedule with 64 threads in one stage and 1 × 64 in another launched 64 × 64 = 4096, which
// OpenCL on pocl ran and an H200 refused with CUDA_ERROR_INVALID_VALUE).
TEST(GpuLaunch, BlockThreadsAreWhatHalideLaunches) {
  const Halide::Target cuda = Halide::Target("host-cuda-cuda_capability_86");
  auto threads_of = [&](bool same_dims) {
    Halide::Var x("x"), y("y"), xo("xo"), xi("xi"), yi("yi");
    Halide::ImageParam in(Halide::Float(32), 1, "in");
    Halide::Func f("f"), out("out");
    f(x) = in(x)*2.0f;
    out(x) = f(x) + 1.0f;
    out.split(x, xo, xi, 64).gpu_blocks(xo).gpu_threads(xi);
    f.compute_at(out, xo);
    if (same_dims)
      f.split(x, y, yi, 64).gpu_threads(yi);
    else  // f's 64 threads as 8 × 8: the block becomes 64 × 8
      f.split(x, y, yi, 8).gpu_threads(yi, y);
    return codegen::gpu_block_threads(out.compile_to_module({in}, "k", cuda));
  };
  EXPECT_THAT(threads_of(true), ::testing::ElementsAre(64));
  EXPECT_THAT(threads_of(false), ::testing::ElementsAre(64 * 8));
}

// Every GPU kernel kind, with the variants that change its schedule, launches at most
// kGpuMaxThreadsPerBlock threads per block and no more than it declares (what compile_kernel
// checked before it measured).
TEST(GpuLaunch, EveryGpuKernelLaunchesWhatItDeclares) {
  const Halide::Target cuda =
      Halide::Target("host-cuda-cuda_capability_86").with_feature(Halide::Target::NoRuntime);
  std::vector<std::pair<std::string, codegen::KernelSpec>> specs;
  for (int64_t K : {512, 2048})
    specs.push_back({"linear K " + std::to_string(K), codegen::LinearKernel{K, 512}});
  for (bool causal : {false, true})
    for (bool pad : {false, true}) {
      codegen::AttentionKernel a{8, 64, 64, causal, pad, 0.125};
      specs.push_back(
          {"attention causal " + std::to_string(causal) + " pad " + std::to_string(pad), a});
      a.fill_inf = true;
      specs.push_back(
          {"attention fill_inf causal " + std::to_string(causal) + " pad " + std::to_string(pad),
           a});
    }
  codegen::AttentionKernel gqa{8, 64, 64, true, false, 0.125};
  gqa.kv_heads = 2;
  gqa.bias = true;
  gqa.window = 16;
  specs.push_back({"attention gqa bias window", gqa});
  codegen::AttentionKernel qpad{8, 64, 64, false, true, 0.125};
  qpad.query_padding = true;
  specs.push_back({"attention query padding", qpad});
  for (bool memory : {false, true}) {
    codegen::StepAttentionKernel st{8, 64, 64, memory, 0.125};
    specs.push_back({std::string("step attention ") + (memory ? "memory" : "cache"), st});
  }
  specs.push_back({"layernorm", codegen::LayerNormKernel{512}});
  codegen::LayerNormKernel add_ln{512};
  add_ln.with_add = add_ln.with_sum = true;
  specs.push_back({"add_layernorm with sum", add_ln});
  for (const auto& [name, spec] : specs) {
    codegen::KernelPipeline kp = codegen::build_kernel(spec, cuda);
    const std::vector<int64_t> launched =
        codegen::gpu_block_threads(kp.pipeline.compile_to_module(kp.args, "k", cuda));
    ASSERT_FALSE(launched.empty()) << name << ": no GPU kernel";
    for (const int64_t n : launched) {
      EXPECT_GE(n, 1) << name;
      EXPECT_LE(n, codegen::kGpuMaxThreadsPerBlock) << name;
      EXPECT_LE(n, kp.gpu_threads) << name << ": launches more threads than it declares";
    }
    std::printf(
        "[ gpu      ] %s: blocks of %s threads (declared %d)\n", name.c_str(),
        [&] {
          std::string t;
          for (const int64_t n : launched) t += (t.empty() ? "" : ", ") + std::to_string(n);
          return t;
        }()
            .c_str(),
        kp.gpu_threads);
  }
}

}  // namespace
}  // namespace kiln
