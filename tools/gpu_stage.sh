#!/usr/bin/env bash
# tools/gpu_stage.sh: build everything with -c opt here and copy what the GPU
# machine needs into .stage/ (ignored by git; name it in the device tool's
# `carry`): the binaries, every plugin, the GPU tests, the PyTorch anchor
# scripts and the photos from ../shared. Then tools/gpu_check.sh runs there.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //tools:train //tools:plugins //tests/gpu:all //backends/...
rm -rf .stage && mkdir -p .stage/bin/plugins .stage/tests .stage/anchors
cp bazel-bin/tools/train .stage/bin/
[ -e bazel-bin/tools/convert ] && cp bazel-bin/tools/convert .stage/bin/ || true
cp bazel-bin/tools/plugins/*.so .stage/bin/plugins/
for so in $(find -L bazel-bin/backends -name 'libstoke_*.so'); do cp "$so" .stage/bin/plugins/; done
for t in $(find -L bazel-bin/tests/gpu -maxdepth 1 -type f -perm -u+x -name '*_test'); do cp "$t" .stage/tests/; done
cp -r examples .stage/
[ -d ../shared/anchors ] && cp ../shared/anchors/*.py .stage/anchors/ || true
chmod -R u+w .stage
du -sh .stage
