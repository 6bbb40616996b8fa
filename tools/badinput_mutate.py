#!/usr/bin/env python3
"""tools/badinput_mutate.py: the bad inputs of tools/badinput_campaign.sh,
each from a seed (the same seed gives the same bytes).

  ini SEED IN OUT          a mutated INI file
  ckpt SEED KIND IN OUT    a damaged or crafted checkpoint (KIND below)
  damage SEED FILE N       N random bytes of FILE overwritten in place
  page SEED FILE           one 4096-byte page of FILE zeroed or randomized
  jpeg SEED KIND IN OUT    a damaged JPEG (KIND below)
  idx N OUT_PREFIX         N 8x8 images and labels as IDX files
"""
import random
import struct
import sys

NASTY = [
    "", "-1", "0", "1", "-0", "2147483647", "2147483648", "4294967296", "-2147483649",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "1e309", "-1e309",
    "1e-320", "nan", "inf", "-inf", "0x10", "010", "1,2,,3", ",", " 16 ", "16abc", "1.5",
    "true", "false", "yes", "maybe", "a" * 5000, "\x7f", "\u00e9t\u00e9", "../../../../etc/passwd",
    "/dev/zero", "/proc/self/mem", "/", "cpu,cpu,cpu", "cuda", "none", "%s%n%s", "'; rm -rf /",
    "16 ; comment", "16 # comment", "\t", "1" * 400,
]
KEYS = {
    "run": ["steps", "seed", "log_every", "accumulate", "checkpoint_every", "eval_every", "precision",
            "backends", "resume", "out_dir", "progress", "name", "cuda_graph", "comm", "config_version"],
    "data": ["source", "shape", "classes", "length", "batch_size", "workers", "prefetch", "offset",
             "path", "root", "size", "channels", "train", "cache"],
    "model": ["name", "hidden", "depth", "width", "activation"],
    "optimizer": ["name", "lr", "momentum", "weight_decay", "beta1", "beta2", "eps", "clip", "schedule"],
    "eval_data": ["source", "shape", "classes", "length", "batch_size", "offset"],
    "plugins": ["path"],
}


def ini(seed, src, dst):
    r = random.Random(seed)
    lines = open(src, encoding="utf-8").read().split("\n")
    for _ in range(r.choice([1, 1, 1, 2, 3])):
        kind = r.randrange(13)
        i = r.randrange(len(lines))
        line = lines[i]
        if kind <= 3 and "=" in line:  # a value replaced (the common case)
            lines[i] = line.split("=")[0] + "= " + r.choice(NASTY)
        elif kind == 4:
            del lines[i]
        elif kind == 5:
            lines.insert(i, line)
        elif kind == 6 and "=" in line:  # a key misspelt
            k, v = line.split("=", 1)
            k = k.strip()
            if k:
                j = r.randrange(len(k))
                k = k[:j] + r.choice("abcdefghijklmnopqrstuvwxyz_") + k[j + 1:]
            lines[i] = k + " =" + v
        elif kind == 7:  # a known key in some section
            sec = r.choice(list(KEYS))
            lines.append("[%s]" % sec)
            lines.append("%s = %s" % (r.choice(KEYS[sec]), r.choice(NASTY)))
        elif kind == 8 and line.startswith("["):
            lines[i] = r.choice(["[" + line[1:-1] + "x]", line[:-1], "[]", "[" + "s" * 300 + "]",
                                 "[run] extra", "[[run]]"])
        elif kind == 9:  # random bytes somewhere
            text = "\n".join(lines)
            j = r.randrange(len(text) + 1)
            junk = "".join(chr(r.randrange(1, 256)) for _ in range(r.randrange(1, 16)))
            lines = (text[:j] + junk + text[j:]).split("\n")
        elif kind == 10:  # cut short
            text = "\n".join(lines)
            lines = text[: r.randrange(len(text) + 1)].split("\n")
        elif kind == 11:
            lines.insert(i, r.choice(["x" * 100000, "=", "= 1", "key_without_value", "[run", "\x00\x00",
                                      "; " + "c" * 3000, "  indented = 1", "a.b = c"]))
        else:  # a value repeated into a list
            if "=" in line:
                k, v = line.split("=", 1)
                lines[i] = k + "=" + ",".join([v.strip()] * r.randrange(2, 40))
    with open(dst, "wb") as f:
        f.write("\n".join(lines).encode("utf-8", "surrogateescape"))


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, b[8 : 8 + n].decode(), b[8 + n :]


def write_st(path, header, data, pad=True):
    h = header.rstrip(" ")
    if pad:
        h += " " * (-len(h) % 8)
    hb = h.encode("utf-8", "surrogateescape")
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + data)


META_FIELDS = ["step", "epoch", "seed", "accumulate", "loss_scale", "optimizer", "world", "batch",
               "skipped_steps", "loss_scale_good_steps", "stoke_checkpoint_version"]


def ckpt(seed, kind, src, dst):
    """KIND: truncate, flip (a bit anywhere), dataflip (a bit of the data
    section: must be detected), meta (a run-state field crafted, checksum
    dropped), header (the JSON edited), hlen (the length field)."""
    r = random.Random(seed)
    b, n, h, data = read_st(src)
    if kind == "truncate":
        open(dst, "wb").write(b[: r.randrange(len(b))])
    elif kind in ("flip", "dataflip"):
        lo = 8 + n if kind == "dataflip" else 0
        i = r.randrange(lo, len(b))
        bb = bytearray(b)
        bb[i] ^= 1 << r.randrange(8)
        open(dst, "wb").write(bytes(bb))
    elif kind == "meta":
        import re
        field = r.choice(META_FIELDS)
        value = r.choice(NASTY + ["-5", "1", "2", "100000", "999999999999"])
        h = re.sub(r',"stoke_meta_crc32c":"[0-9a-f]*"', "", h)
        pat = '"%s":"' % field
        if pat in h:
            j = h.index(pat) + len(pat)
            k = h.index('"', j)
            v = value.replace("\\", "\\\\").replace('"', '\\"')
            v = "".join(c if 0x20 <= ord(c) < 0x7f else "\\u%04x" % (ord(c) & 0xffff) for c in v)
            h = h[:j] + v + h[k:]
        write_st(dst, h, data)
    elif kind == "header":
        edits = [
            lambda t: t.replace('"F32"', r.choice(['"F64"', '"X"', '""', '"F32 "', '"I64"']), 1),
            lambda t: t.replace('"shape":[', '"shape":[' + r.choice(["0,", "1,", "99999999,", "-1,", "1,1,1,1,1,1,1,1,1,"]), 1),
            lambda t: t.replace('"data_offsets":[0,', '"data_offsets":[' + r.choice(["1,", "-1,", "99999999999999999999,", "0,0,"]), 1),
            lambda t: t.replace('"dtype"', '"dtype":"F32","dtype"', 1),
            lambda t: t.replace("{", "{" * r.randrange(1, 200), 1),
            lambda t: t[: r.randrange(len(t))],
            lambda t: t.replace('":', '":' + r.choice(["[", "{", "null,", "1e999,"]), 1),
            lambda t: t + r.choice(["x", "}", ",", "\x00"]),
            lambda t: t.replace('"__metadata__"', '"__metadata__x"', 1),
            lambda t: t.replace('"', "\\u0022", 1),
            lambda t: t[:-1] + ',"extra":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
            lambda t: t.replace("data_offsets", "data_offsetz", 1),
        ]
        h2 = r.choice(edits)(h.rstrip(" "))
        write_st(dst, h2, data, pad=r.random() < 0.5)
    elif kind == "hlen":
        v = r.choice([0, 1, 7, n - 1, n + 1, len(b) - 8, len(b) - 7, 2**63, 2**64 - 1, 2**32])
        open(dst, "wb").write(struct.pack("<Q", v % 2**64) + b[8:])
    else:
        raise SystemExit("unknown checkpoint kind " + kind)


def damage(seed, path, count):
    r = random.Random(seed)
    bb = bytearray(open(path, "rb").read())
    for _ in range(count):
        if bb:
            bb[r.randrange(len(bb))] = r.randrange(256)
    open(path, "wb").write(bytes(bb))


def page(seed, path):
    r = random.Random(seed)
    bb = bytearray(open(path, "rb").read())
    pages = len(bb) // 4096
    p = r.randrange(pages)
    fill = bytes(4096) if r.random() < 0.5 else bytes(r.randrange(256) for _ in range(4096))
    bb[p * 4096 : (p + 1) * 4096] = fill
    open(path, "wb").write(bytes(bb))


def jpeg(seed, kind, src, dst):
    """KIND: truncate, flip (random bytes), header (SOF size fields), zero, junk."""
    r = random.Random(seed)
    b = bytearray(open(src, "rb").read())
    if kind == "truncate":
        b = b[: r.randrange(2, len(b))]
    elif kind == "flip":
        for _ in range(r.randrange(1, 20)):
            b[r.randrange(len(b))] = r.randrange(256)
    elif kind == "header":
        for i in range(len(b) - 9):
            if b[i] == 0xFF and b[i + 1] in (0xC0, 0xC1, 0xC2):  # SOF: height at +5, width at +7
                field = r.choice([5, 7, 9])
                v = r.choice([0, 1, 65535, 65500, 30000])
                if field == 9:
                    b[i + 9] = r.choice([0, 2, 5, 255])  # components
                else:
                    b[i + field : i + field + 2] = struct.pack(">H", v)
                break
    elif kind == "zero":
        b = bytearray()
    elif kind == "junk":
        b = bytearray(r.randrange(256) for _ in range(r.randrange(1, 5000)))
        if r.random() < 0.5:
            b[0:2] = b"\xff\xd8"
    else:
        raise SystemExit("unknown jpeg kind " + kind)
    open(dst, "wb").write(bytes(b))


def idx(n, prefix):
    r = random.Random(n)
    labels = bytes(r.randrange(4) for _ in range(n))
    images = bytes(min(255, (labels[i] * 60 + r.randrange(40))) for i in range(n) for _ in range(64))
    open(prefix + "-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 8, 8) + images)
    open(prefix + "-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + labels)


def main(a):
    cmd = a[0]
    if cmd == "ini":
        ini(int(a[1]), a[2], a[3])
    elif cmd == "ckpt":
        ckpt(int(a[1]), a[2], a[3], a[4])
    elif cmd == "damage":
        damage(int(a[1]), a[2], int(a[3]))
    elif cmd == "page":
        page(int(a[1]), a[2])
    elif cmd == "jpeg":
        jpeg(int(a[1]), a[2], a[3], a[4])
    elif cmd == "idx":
        idx(int(a[1]), a[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
