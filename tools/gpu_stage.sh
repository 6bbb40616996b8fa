#!/usr/bin/env bash
# tools/gpu_stage.sh: build everything with -c opt here and copy what the GPU
# machine needs into .stage/ (ignored by git; name it in the device tool's
# `carry`): the binaries, every plugin, the GPU tests, the PyTorch anchor
# scripts, the photos from ../shared and the GPU-side scripts. Then
# `bash .stage/gpu_check.sh` runs there. STAGE=path stages elsewhere (a
# git worktree stages into an ignored .stage-NAME folder of the main
# checkout, which is what the device tool copies). AB_KEEP=1 keeps the
# build being replaced as before.tar.xz (train, bench, COMMIT and the
# plugins but the cpu one: a few MB; gpu_check.sh unpacks it and sets
# BEFORE for gpu_suite's binab), to A/B two commits' kernels in one call:
#   git checkout OLD; tools/gpu_stage.sh; git checkout NEW; AB_KEEP=1 tools/gpu_stage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ST="${STAGE:-.stage}"
bazel build -c opt //tools:train //tools:generate //tools:launch //tools:bench //tools:convert //tools:bench_loader //tools:make_jpeg_bench //tools:plugin_check //tools:libkernel_trace.so //tools:plugins //tests/gpu:all //backends/... //tests/plugins/newuser:hardswish
before=""
if [ "${AB_KEEP:-0}" = 1 ]; then
  [ -f "$ST/bin.tar.xz" ] || { echo "AB_KEEP=1: no earlier stage in $ST to keep" >&2; exit 1; }
  before=$(mktemp -d)
  tar -C "$before" -xJf "$ST/bin.tar.xz" bin/train bin/bench bin/COMMIT bin/plugins
  rm -f "$before/bin/plugins/libstoke_cpu.so" # the cpu engine (static OpenBLAS, 25 MB) is taken from the new build
  tar -C "$before" -cJf "$before.tar.xz" bin && rm -rf "$before"
  echo "before: $(tar -xJf "$before.tar.xz" -O bin/COMMIT)"
fi
rm -rf $ST && mkdir -p $ST/bin/plugins $ST/tests $ST/anchors
cp bazel-bin/tools/train $ST/bin/
for t in generate launch bench convert bench_loader make_jpeg_bench plugin_check libkernel_trace.so; do cp bazel-bin/tools/$t $ST/bin/; done
# the commit, for tools/bench's reports (the GPU machine has no .git)
echo "$(git rev-parse --short=12 HEAD)$([ -n "$(git status --porcelain --untracked-files=no)" ] && echo -dirty)" > $ST/bin/COMMIT
cp bazel-bin/tools/plugins/*.so $ST/bin/plugins/
for so in $(find -L bazel-bin/backends -type f -name 'libstoke_*.so'); do cp "$so" $ST/bin/plugins/; done
# issue 18's new-user CUDA op plugin (tests/plugins/newuser), for gpu_suite part plugkit
cp bazel-bin/tests/plugins/newuser/libstoke_hardswish.so $ST/bin/plugins/
# the GPU test and bench binaries that tests/gpu/BUILD declares now (bazel-bin keeps the binaries of
# targets since removed: staged, they failed at setup on the GPU)
for t in $(bazel query 'kind("cc_binary|cc_test", //tests/gpu:all)' 2>/dev/null | sed 's|^//tests/gpu:||'); do
  case "$t" in *_test | *_bench) cp "bazel-bin/tests/gpu/$t" $ST/tests/ ;; esac
done
# the data the GPU runs use
mkdir -p $ST/data
cp /usr/share/datasets/fashion-mnist/*.gz $ST/data/ 2>/dev/null || true
mkdir -p $ST/photos && cp ../shared/data/photos/*.jpg $ST/photos/ 2>/dev/null || true
cp -r examples $ST/
cp tools/gpu_check.sh tools/gpu_suite.sh tools/loss_curves.py tools/conv_bench_torch.py tools/torch_op_profile.py tools/kernel_trace.py tools/resnet_matrix_torch.py tools/gpt_ckpt_torch.py tools/test_margins.py \
  tests/e2e/observe_check.py tests/e2e/tfevents.py tools/trace_svg.py tools/nccl_graph_check.py tools/gpt_ddp_torch.py tools/gpt_shapes_torch.py \
  tools/ncu_summary.py tools/gemm_torch.py tools/overlap_torch.py tools/ce_overlap_torch.py $ST/
# shared libraries the GPU machine (Ubuntu 24.04) may lack: cmocka for the
# test binaries, the CUDA 13 runtime the plugins were built against
mkdir -p $ST/lib
cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 $ST/lib/
cp -L /usr/local/cuda/lib64/libcudart.so.13 $ST/lib/
# CUPTI for bin/libkernel_trace.so (gpu_suite part ktrace)
cp -L /usr/local/cuda/lib64/libcupti.so.13 $ST/lib/
[ -d ../shared/anchors ] && cp ../shared/anchors/*.py $ST/anchors/ || true
[ -n "$before" ] && mv "$before.tar.xz" "$ST/before.tar.xz"
chmod -R u+w $ST
# symbols stay here; the copy that travels is stripped (64 MiB limit)
strip --strip-unneeded $ST/bin/train $ST/bin/plugins/*.so $ST/tests/* 2>/dev/null || true
strip --strip-unneeded $ST/bin/launch $ST/bin/bench $ST/bin/convert $ST/bin/bench_loader $ST/bin/make_jpeg_bench
# the static OpenBLAS in the cpu plugin is large but compresses well
tar -C "$ST" -cJf "$ST/bin.tar.xz" bin tests lib && rm -rf "$ST/bin" "$ST/tests" "$ST/lib"
du -sh $ST
