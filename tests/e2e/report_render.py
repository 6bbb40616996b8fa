"""tests/e2e/report_render.py: report.html in a real browser: Debian's
headless chromium loads the page, which must log no console error and no
failed request, and takes a screenshot; the screenshot must show the plots'
lines (pixels of the train-loss blue and the eval red, counted in the PNG,
decoded here with zlib alone). Prints cmocka-style lines.

    python3 report_render.py PAGE.html SHOT.png
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

page, shot = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
browser = shutil.which("chromium") or shutil.which("chromium-browser")
if not browser:
    print("[  FAILED  ] report in a browser: no chromium (tools/setup.sh installs Debian's)")
    sys.exit(1)
profile = tempfile.mkdtemp()
cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
       "--enable-logging=stderr", "--v=0", "--window-size=1360,2200", f"--screenshot={shot}", "file://" + page]
r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
log = r.stderr
errors = [l for l in log.splitlines() if "CONSOLE" in l and ("error" in l.lower() or "Uncaught" in l)
          or "ERR_FILE_NOT_FOUND" in l or "Failed to load resource" in l]
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(f"[       OK ] {name}" if ok else f"[  FAILED  ] {name}: {detail}")
    passed, failed = passed + bool(ok), failed + (not ok)


check("report in a browser: chromium rendered a screenshot", r.returncode == 0 and os.path.exists(shot),
      (r.returncode, log[-800:]))
check("report in a browser: no console error, no failed load", not errors, errors[:3])


def pixels(path):
    """RGB(A) rows of an 8-bit PNG: (width, height, channels, bytes)."""
    d = open(path, "rb").read()
    assert d[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat = 8, b""
    while at < len(d):
        n, kind = struct.unpack(">I4s", d[at:at + 8])
        body = d[at + 8:at + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    ch = {2: 3, 6: 4}[color]
    assert depth == 8
    raw, stride, out, prev = zlib.decompress(idat), w * ch, bytearray(), bytearray(w * ch)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - ch] if i >= ch else 0
            b = prev[i]
            c = prev[i - ch] if i >= ch else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, ch, out


if os.path.exists(shot):
    w, h, ch, px = pixels(shot)
    blue = red = 0
    for i in range(0, len(px), ch * 2):  # every other pixel
        r_, g, b = px[i], px[i + 1], px[i + 2]
        blue += b > r_ + 50 and b > g + 10 and r_ < 150
        red += r_ > 180 and g < 140 and b < 140
    check("report in a browser: the plots' lines are on the screenshot (blue and red pixels)",
          blue > 500 and red > 50, (w, h, blue, red))
print(f"[  PASSED  ] {passed} test(s).")
if failed:
    print(f"[  FAILED  ] {failed} test(s), listed above")
sys.exit(1 if failed else 0)
