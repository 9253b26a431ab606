// Internals shared by the SIMD linear kernels (not part of the contract; tests use it to reach every
// version this CPU can run). Each ISA file returns its table, or nullptr when the CPU lacks the features.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/linear.h"

namespace dsflash::linear_impl {

// x86-64-v3: AVX2 + FMA + F16C (the build baseline). nullptr on other CPUs.
const LinearKernels* avx2_kernels();
// AVX-512 F/BW/VL/DQ + BF16 + VBMI (Zen 4/5, Sapphire Rapids and later). nullptr when absent.
const LinearKernels* avx512_kernels();

// Every table this CPU runs, fastest first (always ends with the reference).
std::vector<const LinearKernels*> available_kernels();

}  // namespace dsflash::linear_impl
