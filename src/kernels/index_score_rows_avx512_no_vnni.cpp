// The AVX-512 exact indexer dots compiled for AVX-512 F/BW alone (Skylake-SP): vpmaddubsw instead of vpdpbusd
// (index_score_rows_avx512.cpp says how, and why it stays exact).
#define DSFLASH_INDEX_NO_VNNI 1
#include "index_score_rows_avx512.cpp"
