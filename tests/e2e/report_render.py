"""tests/e2e/report_render.py: report.html in a real browser: Debian's
headless chromium loads the page, which must log no console error and no
failed request, and takes a screenshot; the screenshot must show the plots'
lines (pixels of the train-loss blue and the eval red, counted in the PNG,
decoded here with zlib alone). Prints cmocka-style lines.

    python3 report_render.py PAGE.html SHOT.png
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browser import pixels, screenshot  # noqa: E402

page, shot = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
r, log, errors = screenshot(page, shot, "1360,2200")
if r is None:
    print("[  FAILED  ] report in a browser: no chromium (tools/setup.sh installs Debian's)")
    sys.exit(1)
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(f"[       OK ] {name}" if ok else f"[  FAILED  ] {name}: {detail}")
    passed, failed = passed + bool(ok), failed + (not ok)


check("report in a browser: chromium rendered a screenshot", r == 0 and os.path.exists(shot),
      (r, log[-800:]))
check("report in a browser: no console error, no failed load", not errors, errors[:3])


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
