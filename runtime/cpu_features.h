// Which x86 features of a Halide target string the CPU running this code lacks, read
// from CPUID (and XGETBV for the OS's vector state). The compiler resolves `host` with it
// (Halide 14 reports avx512_sapphirerapids on AMD Zen 4/5, which lack AVX512-FP16, and
// LLVM's sapphirerapids may emit it), and the runtime refuses a library built for a
// feature the CPU lacks with a clear error instead of dying with SIGILL.
#pragma once

#include <string>
#include <vector>

namespace kiln::rt {

// For each x86 feature named in `halide_target` (e.g. "x86-64-linux-avx-avx2-fma") that
// the CPU lacks, its name and what is missing: "avx512_sapphirerapids (AVX512-FP16)".
// Non-x86 features (cuda, no_runtime, ...) are ignored; on a non-x86 build, empty.
// The environment variable KILN_CPU_LACKS (CPUID flags as named here, comma-separated, e.g.
// "AVX512-VNNI,AVX512-BF16"), read once, makes the CPU count as lacking them: how a library
// is refused on a CPU without a feature is tested on one that has it.
std::vector<std::string> missing_cpu_features(const std::string& halide_target);

}  // namespace kiln::rt
