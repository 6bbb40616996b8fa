#!/usr/bin/env bash
# tools/gpu_stage.sh: build everything with -c opt here and copy what the GPU
# machine needs into .stage/ (ignored by git; name it in the device tool's
# `carry`): the binaries, every plugin, the GPU tests, the PyTorch anchor
# scripts and the photos from ../shared. Then tools/gpu_check.sh runs there.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //tools:train //tools:convert //tools:bench_loader //tools:make_jpeg_bench //tools:plugins //tests/gpu:all //backends/...
rm -rf .stage && mkdir -p .stage/bin/plugins .stage/tests .stage/anchors
cp bazel-bin/tools/train .stage/bin/
for t in convert bench_loader make_jpeg_bench; do cp bazel-bin/tools/$t .stage/bin/; done
cp bazel-bin/tools/plugins/*.so .stage/bin/plugins/
for so in $(find -L bazel-bin/backends -type f -name 'libstoke_*.so'); do cp "$so" .stage/bin/plugins/; done
for t in $(find -L bazel-bin/tests/gpu -maxdepth 1 -type f -perm -u+x -name '*_test'); do cp "$t" .stage/tests/; done
# the data the GPU runs use
mkdir -p .stage/data
cp /usr/share/datasets/fashion-mnist/*.gz .stage/data/ 2>/dev/null || true
mkdir -p .stage/photos && cp ../shared/data/photos/*.jpg .stage/photos/ 2>/dev/null || true
cp -r examples .stage/
# shared libraries the GPU machine (Ubuntu 24.04) may lack: cmocka for the
# test binaries, the CUDA 13 runtime the plugins were built against
mkdir -p .stage/lib
cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 .stage/lib/
cp -L /usr/local/cuda/lib64/libcudart.so.13 .stage/lib/
[ -d ../shared/anchors ] && cp ../shared/anchors/*.py .stage/anchors/ || true
chmod -R u+w .stage
# symbols stay here; the copy that travels is stripped (64 MiB limit)
strip --strip-unneeded .stage/bin/train .stage/bin/plugins/*.so .stage/tests/* 2>/dev/null || true
strip --strip-unneeded .stage/bin/convert .stage/bin/bench_loader .stage/bin/make_jpeg_bench
# the static OpenBLAS in the cpu plugin is large but compresses well
tar -C .stage -cJf .stage/bin.tar.xz bin tests lib && rm -rf .stage/bin .stage/tests .stage/lib
du -sh .stage
