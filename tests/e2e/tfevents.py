"""tests/e2e/tfevents.py: a TensorBoard event file reader in pure Python
(no tensorflow, no protobuf package): TFRecord framing with both masked
CRC-32C checks, Event and Summary decoded by field number from
tensorflow/core/util/event.proto and framework/summary.proto. Written
independently of core/tensorboard.c to test it.

    python3 tfevents.py FILE   prints step, tag, value per scalar
"""
import struct
import sys


def _crc32c_table():
    t = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    """Each record's payload; raises ValueError on a bad checksum."""
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: record header cut short at byte {at}")
        (n,) = struct.unpack_from("<Q", data, at)
        (c_len,) = struct.unpack_from("<I", data, at + 8)
        if c_len != masked_crc(data[at:at + 8]):
            raise ValueError(f"{path}: bad length checksum at byte {at}")
        body = data[at + 12:at + 12 + n]
        (c_body,) = struct.unpack_from("<I", data, at + 12 + n)
        if c_body != masked_crc(body):
            raise ValueError(f"{path}: bad data checksum at byte {at}")
        yield body
        at += 16 + n


def _fields(buf):
    """(field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = _varint(buf, i)
        elif w == 1:
            v, i = buf[i:i + 8], i + 8
        elif w == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif w == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {w} not expected")
        yield f, w, v


def _varint(buf, i):
    v = s = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << s
        s += 7
        if not b & 0x80:
            return v, i


def events(path):
    """Each event as a dict: wall_time, step, file_version, scalars {tag: value}."""
    for body in records(path):
        ev = {"wall_time": None, "step": 0, "file_version": None, "scalars": {}}
        for f, w, v in _fields(body):
            if f == 1 and w == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif f == 2 and w == 0:
                ev["step"] = v
            elif f == 3 and w == 2:
                ev["file_version"] = v.decode()
            elif f == 5 and w == 2:
                for vf, vw, val in _fields(v):
                    if vf != 1 or vw != 2:
                        continue
                    tag, x = None, None
                    for ff, fw, fv in _fields(val):
                        if ff == 1 and fw == 2:
                            tag = fv.decode()
                        elif ff == 2 and fw == 5:
                            x = struct.unpack("<f", fv)[0]
                    ev["scalars"][tag] = x
        yield ev


if __name__ == "__main__":
    for ev in events(sys.argv[1]):
        for tag, x in ev["scalars"].items():
            print(ev["step"], tag, x)
