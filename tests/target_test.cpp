// Targets and the CPU: `host` resolves to features this CPU really has, and a library
// built for a feature it lacks is refused at load with an error naming the feature
// (instead of dying with SIGILL in the first kernel).
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "abi_knl.h"
#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "runtime/cpu_features.h"

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

}  // namespace
}  // namespace kiln
