#!/usr/bin/env bash
# tools/setup.sh: installs everything stoke needs on Debian 12 (the CUDA
# toolkit is expected in /usr/local/cuda). Safe to run again.
set -euo pipefail
pkgs=(
  bazel-bootstrap bazel-platforms  # Bazel 4.2.3 and @platforms, offline
  build-essential                  # gcc, make
  libcmocka-dev                    # unit tests
  libopenblas-dev                  # CPU backend GEMM (cblas.h)
  libopenblas-serial-dev           # the serial OpenBLAS the cpu plugin links (backends/cpu/blas.c)
  libinih-dev                      # INI config
  liblmdb-dev                      # LMDB data source
  libturbojpeg0-dev libjpeg62-turbo-dev  # JPEG decoding
  zlib1g-dev                       # gzipped IDX files
  dataset-fashion-mnist            # the e2e accuracy tests (real data)
  fortunes                         # English text for the byte-level language model (examples/charlm.ini)
  libpcre2-dev                     # GPT-2's pre-tokenizing regex (tools/convert text --tokenizer gpt2)
  clang libclang-rt-14-dev         # libFuzzer and the sanitizers for the fuzz targets (tools/fuzz.sh)
  python3-pil libjpeg-turbo-progs  # tests/jpeg:pil_test: stoke's JPEG decode against PIL's, files from cjpeg
  chromium                         # report.html rendered headless in tests/e2e:observe_test
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node and npm run the GPT-2 tokenizer test's reference (npm's gpt-3-encoder);
# installed from Debian only where no node is on the PATH at all
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "stoke setup: installing ${missing[*]}" >&2
  if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/tmp/stoke-apt.log 2>&1; then
    $sudo apt-get update -q >>/tmp/stoke-apt.log 2>&1
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>/tmp/stoke-apt.log 2>&1 ||
      { cat /tmp/stoke-apt.log >&2; echo "stoke setup: apt-get failed (log above)" >&2; exit 1; }
  fi
fi
[ -d /usr/local/cuda/include ] || echo "stoke setup: note: no CUDA toolkit in /usr/local/cuda; GPU plugins will not build" >&2
exit 0
