// CPUID checks behind cpu_features.h.
#include "runtime/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <sstream>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln::rt {

#if defined(__x86_64__) || defined(__i386__)
namespace {

struct Cpu {
  uint32_t l1_ecx = 0, l7_ebx = 0, l7_ecx = 0, l7_edx = 0, l7s1_eax = 0, ext_ecx = 0;
  bool ymm_state = false, zmm_state = false;  // the OS saves AVX / AVX-512 registers

  Cpu() {
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) l1_ecx = c;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) l7_ebx = b, l7_ecx = c, l7_edx = d;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) l7s1_eax = a;
    if (__get_cpuid(0x80000001, &a, &b, &c, &d)) ext_ecx = c;
    if (l1_ecx & (1u << 27)) {  // OSXSAVE: XGETBV tells which register states the OS keeps
      uint32_t lo, hi;
      __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      ymm_state = (lo & 0x6) == 0x6;
      zmm_state = (lo & 0xe6) == 0xe6;
    }
  }
};

// One CPUID bit: the register word it is in, its position, and the register state the
// OS must save for it to be usable.
struct Flag {
  const char* name;
  uint32_t Cpu::*word;
  int bit;
  enum State { none, ymm, zmm } state = none;
  bool in(const Cpu& c) const {
    const bool os = state == none || (state == ymm ? c.ymm_state : c.zmm_state);
    return ((c.*word >> bit) & 1u) && os && !hidden();
  }
  // Named in KILN_CPU_LACKS (see cpu_features.h).
  bool hidden() const {
    static const std::string lacks = [] {
      const char* v = std::getenv("KILN_CPU_LACKS");
      return v ? "," + std::string(v) + "," : std::string();
    }();
    return !lacks.empty() && lacks.find("," + std::string(name) + ",") != std::string::npos;
  }
};

// The CPU flags each Halide feature lets LLVM use (Halide 14's x86 feature set; for
// avx512_sapphirerapids, LLVM's sapphirerapids CPU, which includes AVX512-FP16).
const Flag kSSE41{"SSE4.1", &Cpu::l1_ecx, 19};
const Flag kAVX{"AVX", &Cpu::l1_ecx, 28, Flag::ymm};
const Flag kAVX2{"AVX2", &Cpu::l7_ebx, 5, Flag::ymm};
const Flag kFMA{"FMA", &Cpu::l1_ecx, 12};
const Flag kFMA4{"FMA4", &Cpu::ext_ecx, 16};
const Flag kF16C{"F16C", &Cpu::l1_ecx, 29};
const Flag kF{"AVX512-F", &Cpu::l7_ebx, 16, Flag::zmm};
const Flag kCD{"AVX512-CD", &Cpu::l7_ebx, 28};
const Flag kER{"AVX512-ER", &Cpu::l7_ebx, 27};
const Flag kPF{"AVX512-PF", &Cpu::l7_ebx, 26};
const Flag kBW{"AVX512-BW", &Cpu::l7_ebx, 30};
const Flag kDQ{"AVX512-DQ", &Cpu::l7_ebx, 17};
const Flag kVL{"AVX512-VL", &Cpu::l7_ebx, 31};
const Flag kIFMA{"AVX512-IFMA", &Cpu::l7_ebx, 21};
const Flag kVBMI{"AVX512-VBMI", &Cpu::l7_ecx, 1};
const Flag kVNNI{"AVX512-VNNI", &Cpu::l7_ecx, 11};
const Flag kBF16{"AVX512-BF16", &Cpu::l7s1_eax, 5};
const Flag kFP16{"AVX512-FP16", &Cpu::l7_edx, 23};

struct Feature {
  const char* name;
  std::vector<Flag> flags;
};

const std::vector<Feature>& features() {
  static const std::vector<Feature> all = {
      {"sse41", {kSSE41}},
      {"avx", {kAVX}},
      {"avx2", {kAVX2}},
      {"fma", {kFMA}},
      {"fma4", {kFMA4}},
      {"f16c", {kF16C}},
      {"avx512", {kF, kCD}},
      {"avx512_knl", {kF, kCD, kER, kPF}},
      {"avx512_skylake", {kF, kCD, kBW, kDQ, kVL}},
      {"avx512_cannonlake", {kF, kCD, kBW, kDQ, kVL, kIFMA, kVBMI}},
      {"avx512_sapphirerapids", {kF, kCD, kBW, kDQ, kVL, kIFMA, kVBMI, kVNNI, kBF16, kFP16}},
      // kiln's own: the bf16 linear kernels, compiled for LLVM's cooperlake.
      {"avx512_bf16", {kF, kCD, kBW, kDQ, kVL, kVNNI, kBF16}},
      // kiln's own: the int8 linear kernels, compiled for cooperlake too (vpdpbusd).
      {"avx512_vnni", {kF, kCD, kBW, kDQ, kVL, kVNNI}},
  };
  return all;
}

}  // namespace

std::vector<std::string> missing_cpu_features(const std::string& halide_target) {
  static const Cpu cpu;
  std::vector<std::string> missing;
  std::stringstream parts(halide_target);
  for (std::string part; std::getline(parts, part, '-');)
    for (const Feature& f : features()) {
      if (part != f.name) continue;
      std::string lacks;
      for (const Flag& flag : f.flags)
        if (!flag.in(cpu)) lacks += (lacks.empty() ? "" : ", ") + std::string(flag.name);
      if (!lacks.empty()) missing.push_back(part + " (" + lacks + ")");
    }
  return missing;
}
#else
std::vector<std::string> missing_cpu_features(const std::string&) { return {}; }
#endif

}  // namespace kiln::rt
