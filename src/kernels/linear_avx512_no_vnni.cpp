// The "avx512-no-vnni" kernel table: the AVX-512 linear files compiled a fourth time, for AVX-512 CPUs with
// F/BW/VL/DQ alone (Skylake-SP), in linear_impl::avx512_no_vnni, under a target string without avx512vnni,
// avx512vbmi and avx512bf16 (linear_avx512_impl.h): the VBMI-free copy of linear_avx512_no_vbmi.cpp with its MXFP4
// blocks on the FMA chain rather than the exact integer dots (the same bits).
#define DSFLASH_AVX512_NO_BF16 1
#define DSFLASH_AVX512_NO_VBMI 1
#define DSFLASH_AVX512_NO_VNNI 1
#include "kernels/linear_avx512.cpp"
#include "kernels/linear_avx512_bf16.cpp"
#include "kernels/linear_avx512_tiled.cpp"
#include "kernels/linear_avx512_rows.cpp"
