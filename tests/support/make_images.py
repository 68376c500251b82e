#!/usr/bin/python3
"""Writes the image variants the decoder tests use, and PIL's decoding of each.

    make_images.py OUT_DIR
    make_images.py --reference FILE...    only PIL's decoding of each FILE (FILE.rgb, FILE.size)

For every NAME.jpg / NAME.png: NAME.rgb, PIL's pixels (EXIF orientation applied,
converted to RGB) as raw bytes, and NAME.size, "width height". For JPEGs also
NAME.q4.rgb / NAME.q4.size: PIL's decode at 1/4 scale (Image.draft, libjpeg's DCT
scaling). Bad inputs (truncated, corrupt, empty, GIF, decompression bombs) are written
as bad-*.  PIL decodes with libjpeg-turbo and zlib: an independent decoder for libspng,
and an independent reader of libjpeg for our use of it (crops, skips, colour, EXIF).
Needs Debian's python3-pil and python3-numpy (run with /usr/bin/python3).
"""
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps


def reference(name):
    """PIL's pixels of an image file (EXIF orientation applied, RGB) and its size."""
    im = ImageOps.exif_transpose(Image.open(name)).convert("RGB")
    with open(name + ".rgb", "wb") as f:
        f.write(im.tobytes())
    with open(name + ".size", "w") as f:
        f.write("%d %d" % im.size)


if sys.argv[1] == "--reference":
    for name in sys.argv[2:]:
        reference(name)
    sys.exit(0)

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def path(name):
    return os.path.join(out, name)


# A photo-like picture: smooth colour fields, edges and noise, 500 x 375.
rng = np.random.default_rng(3)
h, w = 375, 500
y, x = np.mgrid[0:h, 0:w]
pic = np.stack([128 + 60 * np.sin(x * 0.05), 128 + 60 * np.cos(y * 0.07), 128 + 50 * np.sin((x + y) * 0.03)], -1)
pic[(x - 300) ** 2 + (y - 180) ** 2 < 60 ** 2] = (250, 30, 20)
pic += rng.normal(0, 12, (h, w, 3))
img = Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8))

img.save(path("baseline.jpg"), quality=90)
img.save(path("yuv444.jpg"), quality=92, subsampling=0)
img.save(path("progressive.jpg"), quality=85, progressive=True)
img.convert("L").save(path("gray.jpg"), quality=90)
img.convert("CMYK").save(path("cmyk.jpg"), quality=90)
img.resize((37, 23)).save(path("tiny.jpg"), quality=90)  # smaller than one iMCU row of crops
img.save(path("rgb.png"))
img.convert("P").save(path("palette.png"))
img.convert("RGBA").save(path("rgba.png"))
img.convert("L").save(path("gray.png"))
Image.fromarray((np.asarray(img.convert("L"), dtype=np.uint16) * 257)).save(path("gray16.png"))
for o in (2, 3, 5, 6, 8):
    exif = img.getexif()
    exif[0x0112] = o
    img.save(path("exif%d.jpg" % o), quality=90, exif=exif.tobytes())
    if o in (3, 6):
        img.save(path("exif%d.png" % o), exif=exif.tobytes())  # PNG's eXIf chunk
# Restart markers: PIL 9.4 cannot write them; libjpeg-turbo's cjpeg can.
ppm = path("source.ppm")
img.save(ppm)
for name, args in (("restart.jpg", ["-restart", "2"]), ("progressive-restart.jpg", ["-progressive", "-restart", "1"])):
    try:
        with open(path(name), "wb") as f:
            subprocess.run(["cjpeg", "-quality", "90"] + args + [ppm], stdout=f, check=True)
    except (OSError, subprocess.CalledProcessError):
        os.remove(path(name))  # no cjpeg (libjpeg-turbo-progs): the test names what it lacks
os.remove(ppm)

for name in sorted(os.listdir(out)):
    if not name.endswith((".jpg", ".png")):
        continue
    reference(path(name))
    if name.endswith(".jpg") and not name.startswith("exif"):
        q = Image.open(path(name))
        q.draft("RGB", (q.size[0] // 4, q.size[1] // 4))
        q = q.convert("RGB")
        with open(path(name) + ".q4.rgb", "wb") as f:
            f.write(q.tobytes())
        with open(path(name) + ".q4.size", "w") as f:
            f.write("%d %d" % q.size)

# PIL reads a 16-bit PNG as 32-bit integers and clips them when converting to RGB; the
# 8-bit image it was made from (each value times 257) is what a correct reduction gives.
with open(path("gray.png.rgb"), "rb") as f8, open(path("gray16.png.rgb"), "wb") as f16:
    f16.write(f8.read())

# ---- bad inputs ------------------------------------------------------------------------
good = open(path("baseline.jpg"), "rb").read()
open(path("bad-truncated.jpg"), "wb").write(good[: len(good) // 2])
scan = good.index(b"\xff\xda")  # start of scan: corrupt the entropy-coded data after it
corrupt = bytearray(good)
for i in range(scan + 200, len(good) - 2, 97):
    corrupt[i] = 0xFF if corrupt[i] != 0xFF else 0x00
open(path("bad-corrupt.jpg"), "wb").write(bytes(corrupt))
open(path("bad-header.jpg"), "wb").write(b"\xff\xd8\xff\xe0" + b"\x00" * 64)
open(path("bad-empty.jpg"), "wb").write(b"")
img.resize((16, 16)).save(path("bad-animated.gif"))
png = open(path("rgb.png"), "rb").read()
open(path("bad-truncated.png"), "wb").write(png[: len(png) // 2])

# A decompression bomb: a valid header claiming 60000 x 60000 pixels (3.6 gigapixels).
sof = good.index(b"\xff\xc0")
bomb = bytearray(good)
bomb[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)
open(path("bad-bomb.jpg"), "wb").write(bytes(bomb))
ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
chunk = b"IHDR" + ihdr
bomb_png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
open(path("bad-bomb.png"), "wb").write(bomb_png + png[33:])
