#!/usr/bin/env bash
# tests/jpeg/pil_test.sh: every valid JPEG is decoded, and decoded as PIL
# (Debian's python3-pil, torchvision's loader) decodes it (issue 15). A
# generated set of every encoding libjpeg-turbo's cjpeg writes (baseline,
# progressive, arithmetic, restart markers, optimized Huffman tables, each
# chroma subsampling, gray, RGB-colorspace JPEGs, float/fast DCT, quality 5
# and 100, smoothing), a CMYK file (inverted Adobe, as Photoshop writes),
# and an EXIF-rotated file, plus the photos in $STOKE_PHOTOS when set
# (../shared/data/photos: --test_env=STOKE_PHOTOS=...), each decoded by
# stoke (decode_dump) and by PIL's Image.open(f).convert("RGB"). The same
# libjpeg-turbo decodes both, so the pixels must be equal; the tolerance is
# 1 (the CMYK to RGB rounding), and the largest difference is printed.
# EXIF orientation is not applied, as torchvision's default loader does
# not (ImageFolder's pil_loader is Image.open + convert("RGB")): a rotated
# file decodes as stored, equal to PIL without ImageOps.exif_transpose.
set -uo pipefail
DUMP=$1 CMYK=$2
PY=/usr/bin/python3
fail() { echo "$1"; echo "[  FAILED  ] 1 test(s), listed above"; exit 1; }
command -v cjpeg > /dev/null || fail "no cjpeg (apt-get install libjpeg-turbo-progs: tools/setup.sh)"
$PY -c 'import PIL' 2> /dev/null || fail "no PIL for $PY (apt-get install python3-pil: tools/setup.sh)"
T=${TEST_TMPDIR:-$(mktemp -d)}/pil
rm -rf "$T" && mkdir -p "$T/in" "$T/out"
# a 61x47 picture of gradients and noise (odd sizes: partial MCUs)
$PY - "$T/src.ppm" <<'PY'
import random, sys
r = random.Random(15)
w, h = 61, 47
px = bytearray()
for y in range(h):
    for x in range(w):
        px += bytes([(x * 4 + r.randrange(24)) % 256, (y * 5 + r.randrange(24)) % 256, (x * y + r.randrange(24)) % 256])
open(sys.argv[1], "wb").write(b"P6\n%d %d\n255\n" % (w, h) + px)
PY
while read -r name opts; do
  cjpeg $opts -outfile "$T/in/$name.jpg" "$T/src.ppm" || fail "cjpeg $opts failed"
done <<'EOF_SET'
baseline
q5 -quality 5
q100 -quality 100
progressive -progressive
arithmetic -arithmetic
progressive_arith -progressive -arithmetic
restart1 -restart 1
restart3b -restart 3b
optimize -optimize
s444 -sample 1x1
s422 -sample 2x1
s440 -sample 1x2
s411 -sample 4x1
s420 -sample 2x2
gray -grayscale
rgb -rgb
dct_float -dct float
dct_fast -dct fast
smooth -smooth 50
baseline_only -baseline -quality 30
EOF_SET
cp "$CMYK" "$T/in/cmyk.jpg"
# EXIF orientation 6 (rotate 90 on display) in an APP1 segment after SOI
$PY - "$T/in/baseline.jpg" "$T/in/exif_rot6.jpg" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0) + struct.pack(">I", 0)
app1 = b"Exif\x00\x00" + tiff
open(sys.argv[2], "wb").write(b[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + b[2:])
PY
if [ -n "${STOKE_PHOTOS:-}" ] && [ -d "$STOKE_PHOTOS" ]; then
  for p in "$STOKE_PHOTOS"/*.jpg; do cp "$p" "$T/in/photo_$(basename "$p")"; done
else
  echo "(no photos: set STOKE_PHOTOS to add them)"
fi
args=()
for f in "$T"/in/*.jpg; do args+=("$f" "$T/out/$(basename "$f" .jpg).ppm"); done
"$DUMP" "${args[@]}" || fail "stoke refused a valid JPEG (above)"
$PY - "$T" <<'PY'
import os, sys
from PIL import Image, ImageOps
t = sys.argv[1]
worst, bad = 0, []
names = sorted(os.listdir(t + "/in"))
for name in names:
    im = Image.open(t + "/in/" + name)
    ref = im.convert("RGB")
    got = Image.open(t + "/out/" + name[:-4] + ".ppm")
    if got.size != ref.size:
        bad.append("%s: stoke %s, PIL %s" % (name, got.size, ref.size)); continue
    d = max(abs(a - b) for a, b in zip(got.tobytes(), ref.tobytes()))
    worst = max(worst, d)
    print("%-32s %-5s %-10s max |stoke - PIL| = %d" % (name, im.mode, "%dx%d" % im.size, d))
    if d > 1: bad.append("%s: differs by %d" % (name, d))
    if name == "exif_rot6.jpg":
        assert ImageOps.exif_transpose(im).size == (im.size[1], im.size[0]), "the EXIF test file is not rotated"
print("%d files, all decoded; largest difference %d (tolerance 1)" % (len(names), worst))
if bad:
    print("FAIL:\n  " + "\n  ".join(bad)); sys.exit(1)
PY
[ $? -eq 0 ] || fail "stoke and PIL differ (above)"
echo "[  PASSED  ] 1 test(s)."
