// The "avx512-no-vbmi" kernel table: the AVX-512 linear files compiled a third time, for AVX-512 CPUs with VNNI but
// neither VBMI nor AVX512-BF16 (Cascade Lake), in linear_impl::avx512_no_vbmi, under a target string without
// avx512vbmi and avx512bf16 (linear_avx512_impl.h): the bf16-free copy of linear_avx512_no_bf16.cpp with its byte
// lookups on vpermt2w / vpshufb, and row-major weights on the avx2 table.
#define DSFLASH_AVX512_NO_BF16 1
#define DSFLASH_AVX512_NO_VBMI 1
#include "kernels/linear_avx512.cpp"
#include "kernels/linear_avx512_bf16.cpp"
#include "kernels/linear_avx512_tiled.cpp"
#include "kernels/linear_avx512_rows.cpp"
