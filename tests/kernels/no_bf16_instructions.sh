#!/bin/sh
# The "avx512-no-bf16" table's object (src/kernels/linear_avx512_no_bf16.cpp, in the kernels archive given as $1)
# holds no AVX512-BF16 or AMX instruction, so it runs on AVX-512 CPUs without them (Ice Lake-SP): the compile
# refuses such intrinsics on its reachable paths already; this checks the machine code itself. It must hold FMAs
# (its multiplies), or the object was not found.
set -eu
archive=$1
member=linear_avx512_no_bf16.cpp.o
code=$(objdump -d --no-show-raw-insn "$archive" | awk -v m="$member:" '$1 == m { inside = 1; next } / file format / { inside = 0 } inside')
fmas=$(printf '%s\n' "$code" | grep -c 'vfmadd' || true)
if [ "$fmas" -eq 0 ]; then
  echo "no FMA in $member of $archive: object missing?" >&2
  exit 1
fi
forbidden=$(printf '%s\n' "$code" | grep -E 'vdpbf16ps|vcvtne2ps2bf16|vcvtneps2bf16|tdpb|tileload|tilestore|ldtilecfg|sttilecfg|tilerelease|tilezero' || true)
if [ -n "$forbidden" ]; then
  echo "bf16 / AMX instructions in $member:" >&2
  printf '%s\n' "$forbidden" | head -20 >&2
  exit 1
fi
echo "$member: $fmas FMAs, no AVX512-BF16 or AMX instruction"
