// The "avx512-no-bf16" kernel table: the AVX-512 linear files compiled a second time for AVX-512 CPUs without
// AVX512-BF16 (Ice Lake-SP and its client siblings), in linear_impl::avx512_no_bf16, under a target string without
// avx512bf16, so that any bf16 instruction left on its paths fails this file's compile (linear_avx512_impl.h).
// One translation unit: the files share no file-local name. linear_avx512_row_major.cpp and linear_amx.cpp
// are not part of it (vdpbf16ps and AMX tiles throughout; this table takes the multi-row path for row-major weights).
#define DSFLASH_AVX512_NO_BF16 1
#include "kernels/linear_avx512.cpp"
#include "kernels/linear_avx512_bf16.cpp"
#include "kernels/linear_avx512_tiled.cpp"
#include "kernels/linear_avx512_rows.cpp"
