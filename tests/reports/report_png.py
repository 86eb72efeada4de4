"""A small PNG reader (8-bit greyscale/RGB/RGBA, not interlaced) on zlib and numpy, for tests.

Headless Chromium's screenshots are 8-bit RGBA. Rows with the Sub and Up filters undo in numpy;
Average and Paeth depend on the reconstructed left pixel, so they run per pixel.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

_CHANNELS = {0: 1, 2: 3, 6: 4}


def read_png(path: str | Path) -> np.ndarray:
    """Pixels as a (height, width, channels) uint8 array."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in _CHANNELS or interlace:
        raise ValueError(f"{path}: only 8-bit, non-interlaced grey/RGB/RGBA PNGs are read here")
    bpp = _CHANNELS[colour]
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prior = np.zeros(stride, np.uint8)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: running sum along each channel, mod 256
            cur = np.cumsum(line.reshape(width, bpp).astype(np.uint32), axis=0).astype(np.uint8).reshape(-1)
        elif f == 2:  # Up
            cur = line + prior
        elif f == 3:  # Average: plain ints, since numpy scalar indexing is slow
            li, pi, c = line.tolist(), prior.tolist(), [0] * stride
            for x in range(stride):
                c[x] = (li[x] + (((c[x - bpp] if x >= bpp else 0) + pi[x]) >> 1)) & 255
            cur = np.array(c, np.uint8)
        elif f == 4:  # Paeth
            li, pi, c = line.tolist(), prior.tolist(), [0] * stride
            for x in range(bpp):
                c[x] = (li[x] + pi[x]) & 255
            for x in range(bpp, stride):
                a, b, cc = c[x - bpp], pi[x], pi[x - bpp]
                pa, pb, pc = abs(b - cc), abs(a - cc), abs(a + b - 2 * cc)
                c[x] = (li[x] + (a if pa <= pb and pa <= pc else (b if pb <= pc else cc))) & 255
            cur = np.array(c, np.uint8)
        else:
            raise ValueError(f"{path}: bad filter {f} on row {y}")
        out[y] = cur
        prior = cur
    return out.reshape(height, width, bpp)
