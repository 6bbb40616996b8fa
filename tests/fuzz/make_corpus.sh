#!/usr/bin/env bash
# tests/fuzz/make_corpus.sh: regenerates the seed corpora of tests/fuzz
# (committed; run again only to change them): INI files from examples/,
# JPEGs of every kind libjpeg-turbo writes (make_jpeg_seeds.c), stoke
# records, metadata entries and Caffe Datums, token shards, IDX files,
# checkpoints written by tools/train and whole LMDB data sets written by
# tools/convert (built first: bazel build //tools:train //tools:convert)
# and make_lmdb_seeds.c (Caffe databases).
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tests/fuzz/corpus
rm -rf "$C" && mkdir -p "$C"/{ini,jpeg,record,shard,idx,safetensors,lmdb}
cp examples/quickstart.ini examples/mlp.ini examples/fmnist_cnn.ini examples/gpt2_124m.ini examples/resnet50_jpeg.ini "$C/ini/"
printf '[run]\nbackends = cpu\nsteps = 3\n\n[data]\nsource = synthetic\n%%%%\nrun.steps=5\noptimizer.lr=0.1\n' > "$C/ini/overrides.ini"
tmp=$(mktemp -d)
gcc -O1 -o "$tmp/gen" tests/fuzz/make_jpeg_seeds.c -lturbojpeg
"$tmp/gen" "$C/jpeg"
python3 - "$C" <<'PY'
import gzip, struct, sys
C = sys.argv[1]
def rec(enc, label, h, w, c, payload):
    return b"STKR" + struct.pack("<HBBiIIII", 1, enc, 0, label, h, w, c, len(payload)) + payload
open(C + "/record/raw", "wb").write(rec(0, 3, 2, 3, 1, bytes(range(6))))
open(C + "/record/raw_rgb", "wb").write(rec(0, 1, 2, 2, 3, bytes(range(12))))
open(C + "/record/jpeg", "wb").write(rec(1, 7, 16, 16, 3, open(C + "/jpeg/444.jpg", "rb").read()))
open(C + "/record/jpeg_gray", "wb").write(rec(1, 0, 12, 20, 1, open(C + "/jpeg/gray.jpg", "rb").read()))
open(C + "/record/meta", "wb").write(b"STKM" + struct.pack("<HHQIIIIB", 1, 0, 100, 10, 28, 28, 1, 0))
def varint(v):
    out = b""
    while True:
        b = v & 0x7f; v >>= 7
        out += bytes([b | (0x80 if v else 0)])
        if not v: return out
def field(n, wt, payload):
    return varint(n << 3 | wt) + payload
def datum(c, h, w, data, label, encoded=False, floats=None):
    d = field(1, 0, varint(c)) + field(2, 0, varint(h)) + field(3, 0, varint(w))
    d += field(4, 2, varint(len(data)) + data) + field(5, 0, varint(label))
    if floats: d += field(6, 5, struct.pack("<f", floats))
    if encoded: d += field(7, 0, varint(1))
    return d
open(C + "/record/datum", "wb").write(datum(3, 2, 2, bytes(range(12)), 4))
open(C + "/record/datum_encoded", "wb").write(datum(0, 0, 0, open(C + "/jpeg/420.jpg", "rb").read(), 2, encoded=True))
open(C + "/record/datum_float", "wb").write(datum(1, 1, 1, b"\x05", 1, floats=1.5))
hdr = lambda n, ver=1: struct.pack("<iii", 20240520, ver, n) + bytes(1012)
open(C + "/shard/small", "wb").write(hdr(8) + struct.pack("<8H", 1, 2, 3, 50256, 0, 9, 10, 11))
open(C + "/shard/empty", "wb").write(hdr(0))
open(C + "/shard/llama", "wb").write(hdr(2, 7) + bytes(8))
img = struct.pack(">IIII", 0x803, 3, 4, 4) + bytes(range(48))
lab = struct.pack(">II", 0x801, 3) + bytes([0, 1, 2])
open(C + "/idx/images", "wb").write(b"\x00" + img)
open(C + "/idx/labels", "wb").write(b"\x01" + lab)
open(C + "/idx/images_gz", "wb").write(b"\x00" + gzip.compress(img, mtime=0))
open(C + "/idx/labels_gz", "wb").write(b"\x01" + gzip.compress(lab, mtime=0))
PY
T=bazel-bin/tools/train
if [ -x "$T" ]; then
  ini=$tmp/t.ini
  printf '[run]\nbackends = cpu\nsteps = 2\nseed = 1\nprogress = off\n[data]\nsource = synthetic\nshape = 4\nclasses = 3\nlength = 64\nbatch_size = 8\n[model]\nname = mlp\nhidden = 4\n[optimizer]\nname = %s\nlr = 0.1\n' sgd > "$ini"
  "$T" "$ini" "run.out_dir=$tmp/a" > /dev/null
  cp "$tmp/a/checkpoint.safetensors" "$C/safetensors/sgd.safetensors"
  sed -i 's/name = sgd/name = adamw/' "$ini"
  "$T" "$ini" "run.out_dir=$tmp/b" > /dev/null
  cp "$tmp/b/checkpoint.safetensors" "$C/safetensors/adamw.safetensors"
else
  echo "make_corpus: no $T (bazel build //tools:train): checkpoint seeds not made" >&2
fi
python3 - "$C" <<'PY'
import struct, sys
C = sys.argv[1]
def st(h, data=b""):
    hb = h.encode(); hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data
open(C + "/safetensors/plain", "wb").write(st('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(8)))
open(C + "/safetensors/empty", "wb").write(st("{}"))
PY
# whole LMDB data sets (a data.mdb each): stoke raw records on one leaf
# page and on several (a branch page), JPEG records, raw records on
# overflow pages; Caffe Datum databases
CV=bazel-bin/tools/convert
if [ -x "$CV" ]; then
  python3 - "$tmp" <<'PY'
import os, struct, sys
t = sys.argv[1]
for name, n in (("small", 20), ("pages", 120)):
    open(f"{t}/{name}-images", "wb").write(struct.pack(">IIII", 0x803, n, 8, 8) + bytes((i * 7) % 256 for i in range(n * 64)))
    open(f"{t}/{name}-labels", "wb").write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
for c in ("root/c0", "root/c1", "big/c0"):
    os.makedirs(f"{t}/{c}")
PY
  cp "$C/jpeg/444.jpg" "$tmp/root/c0/a.jpg"
  cp "$C/jpeg/gray.jpg" "$tmp/root/c0/b.jpg"
  cp "$C/jpeg/420.jpg" "$tmp/root/c1/c.jpg"
  cp "$C/jpeg/420.jpg" "$tmp/big/c0/c.jpg"
  for name in small pages; do
    "$CV" idx --images "$tmp/$name-images" --labels "$tmp/$name-labels" --out "$tmp/$name" > /dev/null
    cp "$tmp/$name/data.mdb" "$C/lmdb/idx_$name"
  done
  "$CV" folder --root "$tmp/root" --out "$tmp/jpeg" --size 16x16 --encoding jpeg --quality 50 --threads 1 > /dev/null
  cp "$tmp/jpeg/data.mdb" "$C/lmdb/folder_jpeg"
  "$CV" folder --root "$tmp/big" --out "$tmp/big.lmdb" --size 48x48 --encoding raw --threads 1 > /dev/null
  cp "$tmp/big.lmdb/data.mdb" "$C/lmdb/folder_overflow"
else
  echo "make_corpus: no $CV (bazel build //tools:convert): stoke LMDB seeds not made" >&2
fi
gcc -O1 -o "$tmp/lmdb_gen" tests/fuzz/make_lmdb_seeds.c -l:liblmdb.a -lpthread
"$tmp/lmdb_gen" "$C/lmdb" "$C/jpeg/420.jpg"
rm -rf "$tmp"
ls -R "$C" | wc -l
