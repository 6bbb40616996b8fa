#!/usr/bin/env python3
"""tests/e2e/ckpt_dtype.py IN OUT DTYPE [--master]: a stoke checkpoint with
its model tensors (every one but optimizer.*) stored as DTYPE (F64, F32, BF16
or F16, rounded to nearest even), and the per-tensor CRC-32C list of its
metadata recomputed, the rest as it was: the file a run in another precision
would have written (a bf16 GPU run's, say), for charlm_test's check that
checkpoints load across float precisions. --master adds what a bf16 or fp16
run also writes: each parameter's exact value as optimizer.NAME.master (F32;
a parameter is a name with optimizer.NAME.* entries). Standard library
only."""
import json
import struct
import sys

from tfevents import crc32c  # beside this file: TensorBoard's records use the same CRC-32C

CRC_KEY = "stoke_crc32c"


def decode(raw, dtype):
    if dtype == "F32":
        return list(struct.unpack("<%df" % (len(raw) // 4), raw))
    if dtype == "F64":
        return list(struct.unpack("<%dd" % (len(raw) // 8), raw))
    raise SystemExit("ckpt_dtype: cannot read %s tensors" % dtype)


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (no NaNs here)


def encode(vals, dtype):
    if dtype == "F64":
        return struct.pack("<%dd" % len(vals), *vals)
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "BF16":
        return struct.pack("<%dH" % len(vals), *[bf16(v) for v in vals])
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    raise SystemExit("ckpt_dtype: unknown dtype %s" % dtype)


def main(src, dst, dtype, master=None):
    b = open(src, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    meta = head.pop("__metadata__")
    out, crcs, at = {}, [], 0
    chunks = []
    params = {k[len("optimizer."):k.rindex(".")] for k in head if k.startswith("optimizer.")}
    added = []

    def put(name, t, raw):
        nonlocal at
        out[name] = dict(t, data_offsets=[at, at + len(raw)])
        crcs.append("%s=%08x" % (name, crc32c(raw)))
        chunks.append(raw)
        at += len(raw)

    for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if not name.startswith("optimizer.") and t["dtype"] in ("F32", "F64"):
            vals = decode(raw, t["dtype"])
            if master and name in params:
                added.append("optimizer.%s.master" % name)
                put(added[-1], dict(t, dtype="F32"), encode(vals, "F32"))
            raw = encode(vals, dtype)
            t = dict(t, dtype=dtype)
        put(name, t, raw)
    # the list in the order stoke wrote it (its names), each with its new sum
    order = [kv.split("=")[0] for kv in meta[CRC_KEY].split(";")] + added
    by_name = dict(kv.split("=") for kv in crcs)
    meta[CRC_KEY] = ";".join("%s=%s" % (k, by_name[k]) for k in order)
    h = json.dumps(dict([("__metadata__", meta)] + list(out.items())), separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["--master"]):
        raise SystemExit(__doc__)
    main(*sys.argv[1:4], master=sys.argv[4:] == ["--master"])
