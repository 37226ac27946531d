// Which instruction a bf16 model's products run on (CompileOptions::bf16_products): AVX512-BF16's
// vdpbf16ps (32 products per instruction) or f32 FMAs on the widened weights (16). On AMD Zen 4
// vdpbf16ps issues as often as an FMA, twice the products; on Intel Sapphire/Emerald Rapids it
// issues once per 2 cycles and FMAs twice per cycle, so that FMAs do twice its products
// (measured, bench/README.md). "auto" measures the machine kiln runs on.
#pragma once

#include <string>

namespace kiln::driver {

// Products per nanosecond of one thread issuing independent vdpbf16ps, then vfmadd231ps (zmm),
// over about a millisecond each; both 0 where the CPU lacks AVX512-BF16 (or is not x86-64).
struct Bf16ProductRates {
  double dot = 0, fma = 0;
};
Bf16ProductRates measure_bf16_product_rates();

// "dot" or "fma" for `choice` ("dot", "fma" or "auto"; anything else is refused with an error
// naming the values): auto is "fma" when the target is the host and its FMAs do more products
// per nanosecond than vdpbf16ps (by 10%: the two are measured back to back, under the same
// load), else "dot". `why` (may be null) gets a line for the user saying what was measured.
std::string resolve_bf16_products(const std::string& choice, const std::string& target,
                                  std::string* why);

}  // namespace kiln::driver
