"""tools/pil_loader_bench.py: the Python/PIL input pipeline stoke's loader is
compared with on a CPU machine without PyTorch: the same work per image as
torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor
(decode, crop, bilinear resize, flip, uint8 HWC array, then floats in
[0, 1]), over a JPEG class folder, in N worker processes, batches of 256.
Usage: /usr/bin/python3 tools/pil_loader_bench.py ROOT [WORKERS] [IMAGES]
(Debian's python3 with python3-pil and python3-numpy)
Prints one JSON line: images/s and per-worker images/s."""
import glob
import json
import math
import os
import random
import sys
import time
from multiprocessing import Pool

import numpy as np
from PIL import Image


def rrc_params(w, h, rnd, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params."""
    area = w * h
    for _ in range(10):
        a = area * rnd.uniform(*scale)
        r = math.exp(rnd.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(a * r))), int(round(math.sqrt(a / r)))
        if 0 < cw <= w and 0 < ch <= h:
            return rnd.randint(0, w - cw), rnd.randint(0, h - ch), cw, ch
    s = min(w, h)
    return (w - s) // 2, (h - s) // 2, s, s


def load(args):
    path, seed = args
    rnd = random.Random(seed)
    img = Image.open(path).convert("RGB")
    x, y, cw, ch = rrc_params(img.width, img.height, rnd)
    img = img.resize((224, 224), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    if rnd.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    a = np.asarray(img, dtype=np.uint8)
    return (a.astype(np.float32) / 255.0).shape  # ToTensor's float conversion


def main():
    root = sys.argv[1]
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))[:count]
    with Pool(workers) as p:
        list(p.imap(load, [(f, i) for i, f in enumerate(files[:64])], chunksize=8))  # warm-up
        t = time.time()
        for b in range(0, len(files), 256):
            list(p.imap(load, [(f, i) for i, f in enumerate(files[b:b + 256], b)], chunksize=8))
        el = time.time() - t
    print(json.dumps({"pipeline": "python3 + PIL %s, %d processes" % (Image.__version__, workers),
                      "images": len(files), "images_per_s": round(len(files) / el, 1),
                      "per_worker": round(len(files) / el / workers, 1)}))


if __name__ == "__main__":
    main()
