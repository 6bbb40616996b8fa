#!/usr/bin/env bash
# tests/plugins/newuser/build.sh STOKE OUT: the new user's plugins built out
# of tree with plugins/README.md's commands, nothing else: the hardswish op
# (nvcc for the cuda kernels, cc for the rest, the shared CUDA runtime) and
# the rings source (cc), into OUT beside a copy of rings.ini. STOKE is the
# stoke checkout (its core/sdk is all they include); NVCC overrides the
# compiler (default /usr/local/cuda/bin/nvcc).
set -euo pipefail
stoke="$1" out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
nvcc="${NVCC:-/usr/local/cuda/bin/nvcc}"
mkdir -p "$out"
"$nvcc" -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden \
  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -I "$stoke/core/sdk" -c "$here/hardswish.cu" -o "$out/hardswish_cu.o"
cc -std=gnu11 -O2 -shared -fPIC -fvisibility=hidden -DHARDSWISH_CUDA \
  -I "$stoke/core/sdk" "$here/hardswish.c" "$out/hardswish_cu.o" \
  -L/usr/local/cuda/lib64 -lcudart -o "$out/libstoke_hardswish.so"
cc -std=gnu11 -O2 -shared -fPIC -fvisibility=hidden -I "$stoke/core/sdk" "$here/rings.c" -lm -o "$out/libstoke_rings.so"
cp "$here/rings.ini" "$out/"
