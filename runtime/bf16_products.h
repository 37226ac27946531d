// Which instruction a bf16 model's products run on: AVX512-BF16's vdpbf16ps (32 products per
// instruction) or f32 FMAs on the widened weights (16; LinearKernel::bf16_fma). On AMD Zen 4
// vdpbf16ps issues as often as an FMA, twice the products; on Intel Sapphire/Emerald Rapids it
// issues once per 2 cycles and FMAs twice per cycle, so that FMAs do twice its products
// (measured, bench/README.md). A library compiled with `--bf16-products auto` holds both forms
// (Plan::fma_functions) and the runtime picks one when the model is created, by measuring the
// CPU it runs on. An int8 library compiled so holds both forms of its attention (bf16 products
// on vdpbf16ps, or f32), its linears int8 in both.
#pragma once

#include <string>

namespace kiln::rt {

// Products per nanosecond of one thread issuing independent vdpbf16ps, then vfmadd231ps (zmm),
// over about a millisecond in all; both 0 where the CPU lacks AVX512-BF16 (or is not x86-64).
struct Bf16ProductRates {
  double dot = 0, fma = 0;
};
Bf16ProductRates measure_bf16_product_rates();

// The FMAs do more products per nanosecond than vdpbf16ps, by 10% (the two are measured back
// to back, under the same load).
inline bool fma_products_faster(const Bf16ProductRates& r) { return r.fma > 1.1 * r.dot; }

// The form for measured rates: "fma" where the FMAs are faster or the CPU has no AVX512-BF16
// (rates 0: an int8 library with both forms of its attention loads on a CPU with AVX512-VNNI
// alone, and must not run vdpbf16ps there), else "dot".
inline const char* choose_bf16_products(const Bf16ProductRates& r) {
  return r.dot == 0 || fma_products_faster(r) ? "fma" : "dot";
}

// The form a library with both forms runs on this CPU: "dot" or "fma". The environment
// variable KILN_BF16_PRODUCTS ("dot" or "fma") chooses where it is set (another value, or dot
// on a CPU without AVX512-BF16, is an error naming it); else the rates above, measured once per
// process.
std::string bf16_products_for_this_cpu();

}  // namespace kiln::rt
