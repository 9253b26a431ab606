#!/bin/sh
# The object $2 of the kernels archive $1 (the "avx512-no-bf16" table, src/kernels/linear_avx512_no_bf16.cpp,
# "avx512-no-vbmi" or "avx512-no-vnni", or the latter's indexer dots) holds no instruction matching the extended
# regex $3 (AVX512-BF16, AMX, and for the others VBMI's byte permutes, VNNI's dots), so it runs on AVX-512 CPUs
# without them: the compile refuses such intrinsics on its reachable paths already; this checks the machine code
# itself. It must hold FMAs (its multiplies and scalings), or the object was not found.
set -eu
archive=$1
member=$2
forbidden_regex=$3
code=$(objdump -d --no-show-raw-insn "$archive" | awk -v m="$member:" '$1 == m { inside = 1; next } / file format / { inside = 0 } inside')
fmas=$(printf '%s\n' "$code" | grep -c 'vfmadd' || true)
if [ "$fmas" -eq 0 ]; then
  echo "no FMA in $member of $archive: object missing?" >&2
  exit 1
fi
forbidden=$(printf '%s\n' "$code" | grep -E "$forbidden_regex" || true)
if [ -n "$forbidden" ]; then
  echo "instructions matching $forbidden_regex in $member:" >&2
  printf '%s\n' "$forbidden" | head -20 >&2
  exit 1
fi
echo "$member: $fmas FMAs, none matching $forbidden_regex"
