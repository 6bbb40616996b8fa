"""tests/e2e/browser.py: a page in a real browser for the e2e checks:
Debian's headless chromium takes its screenshot (console errors and failed
loads collected from its log), and the PNG's pixels are decoded with zlib
alone, so a check can count the colors that were drawn."""
import shutil
import struct
import subprocess
import tempfile
import zlib


def screenshot(page, shot, size):
    """Loads file PAGE (absolute path), writes SHOT.png at SIZE ("W,H"):
    (chromium's exit code, its log, the console errors and failed loads);
    (None, "", []) when no chromium is installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        return None, "", []
    profile = tempfile.mkdtemp()
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", f"--window-size={size}", f"--screenshot={shot}", "file://" + page]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log = r.stderr
    errors = [l for l in log.splitlines() if "CONSOLE" in l and ("error" in l.lower() or "Uncaught" in l)
              or "ERR_FILE_NOT_FOUND" in l or "Failed to load resource" in l]
    shutil.rmtree(profile, ignore_errors=True)
    return r.returncode, log, errors


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
