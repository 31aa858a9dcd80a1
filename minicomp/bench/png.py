"""A small RGB canvas written as PNG with zlib and struct, and a 5x7 bitmap font.

It draws the bench chart where matplotlib is not installed (the GPU machines have none):
filled rectangles, lines and upper-case text are all the chart needs.
"""

from __future__ import annotations

import struct
import zlib

Color = tuple[int, int, int]

# Each glyph is 7 rows of 5 pixels, a row as a hexadecimal 5-bit mask (0x10 is the left
# pixel). Letters are upper case only: text is drawn upper-cased.
_GLYPHS = {
    " ": "00 00 00 00 00 00 00",
    "0": "0E 11 13 15 19 11 0E",
    "1": "04 0C 04 04 04 04 0E",
    "2": "0E 11 01 02 04 08 1F",
    "3": "1F 02 04 02 01 11 0E",
    "4": "02 06 0A 12 1F 02 02",
    "5": "1F 10 1E 01 01 11 0E",
    "6": "06 08 10 1E 11 11 0E",
    "7": "1F 01 02 04 08 08 08",
    "8": "0E 11 11 0E 11 11 0E",
    "9": "0E 11 11 0F 01 02 0C",
    "A": "0E 11 11 11 1F 11 11",
    "B": "1E 11 11 1E 11 11 1E",
    "C": "0E 11 10 10 10 11 0E",
    "D": "1C 12 11 11 11 12 1C",
    "E": "1F 10 10 1E 10 10 1F",
    "F": "1F 10 10 1E 10 10 10",
    "G": "0E 11 10 17 11 11 0F",
    "H": "11 11 11 1F 11 11 11",
    "I": "0E 04 04 04 04 04 0E",
    "J": "07 02 02 02 02 12 0C",
    "K": "11 12 14 18 14 12 11",
    "L": "10 10 10 10 10 10 1F",
    "M": "11 1B 15 15 11 11 11",
    "N": "11 11 19 15 13 11 11",
    "O": "0E 11 11 11 11 11 0E",
    "P": "1E 11 11 1E 10 10 10",
    "Q": "0E 11 11 11 15 12 0D",
    "R": "1E 11 11 1E 14 12 11",
    "S": "0F 10 10 0E 01 01 1E",
    "T": "1F 04 04 04 04 04 04",
    "U": "11 11 11 11 11 11 0E",
    "V": "11 11 11 11 11 0A 04",
    "W": "11 11 11 15 15 15 0A",
    "X": "11 11 0A 04 0A 11 11",
    "Y": "11 11 11 0A 04 04 04",
    "Z": "1F 01 02 04 08 10 1F",
    ".": "00 00 00 00 00 0C 0C",
    ",": "00 00 00 00 0C 04 08",
    "-": "00 00 00 1F 00 00 00",
    "_": "00 00 00 00 00 00 1F",
    "/": "00 01 02 04 08 10 00",
    ":": "00 0C 0C 00 0C 0C 00",
    "(": "02 04 08 08 08 04 02",
    ")": "08 04 02 02 02 04 08",
    "[": "0E 08 08 08 08 08 0E",
    "]": "0E 02 02 02 02 02 0E",
    "%": "18 19 02 04 08 13 03",
    "+": "00 04 04 1F 04 04 00",
    "=": "00 00 1F 00 1F 00 00",
    "<": "02 04 08 10 08 04 02",
    ">": "08 04 02 01 02 04 08",
    "*": "00 04 15 0E 15 04 00",
    "#": "0A 0A 1F 0A 1F 0A 0A",
    "?": "0E 11 01 02 04 00 04",
}
FONT = {ch: tuple(int(row, 16) for row in rows.split()) for ch, rows in _GLYPHS.items()}
GLYPH_W, GLYPH_H = 5, 7


class Canvas:
    """An RGB image in memory, drawn on with rectangles and text, saved as PNG."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)):
        if width <= 0 or height <= 0:
            raise ValueError(f"a canvas needs a positive size, not {width}x{height}")
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(background) * width) for _ in range(height)]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the pixels x0 <= x < x1, y0 <= y < y1 (clipped to the canvas)."""
        x0, x1 = max(0, int(x0)), min(self.width, int(x1))
        y0, y1 = max(0, int(y0)), min(self.height, int(y1))
        if x0 >= x1:
            return
        span = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            self.rows[y][3 * x0 : 3 * x1] = span

    def pixel(self, x: int, y: int) -> Color:
        """The color at (x, y)."""
        r, g, b = self.rows[y][3 * x : 3 * x + 3]
        return r, g, b

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), scale: int = 2) -> int:
        """Draw `text` (upper-cased) with its top-left corner at (x, y); returns the x after it."""
        for ch in text.upper():
            glyph = FONT.get(ch, FONT["?"])
            for row, bits in enumerate(glyph):
                for col in range(GLYPH_W):
                    if bits & (0x10 >> col):
                        px, py = x + col * scale, y + row * scale
                        self.rect(px, py, px + scale, py + scale, color)
            x += (GLYPH_W + 1) * scale
        return x

    def png(self) -> bytes:
        """The image as PNG bytes: 8-bit RGB, no interlace, filter 0 on every row."""
        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 6))
            + _chunk(b"IEND", b"")
        )

    def save(self, path: str) -> None:
        """Write the image to `path` as PNG."""
        with open(path, "wb") as f:
            f.write(self.png())


def text_width(text: str, scale: int = 2) -> int:
    """Pixels `text` takes in Canvas.text at this scale."""
    return len(text) * (GLYPH_W + 1) * scale


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of a PNG this module wrote (8-bit RGB, filter 0 only);
    raises ValueError on anything else. Checks every chunk's CRC."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG: bad signature")
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad CRC in the {kind.decode(errors='replace')} chunk")
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    if (depth, color, interlace) != (8, 2, 0):
        raise ValueError("only 8-bit RGB, non-interlaced PNGs are read")
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = 1 + 3 * width
    if len(raw) != stride * height:
        raise ValueError(f"image data is {len(raw)} bytes, expected {stride * height}")
    rows = []
    for y in range(height):
        line = raw[y * stride : (y + 1) * stride]
        if line[0] != 0:
            raise ValueError(f"row {y} uses filter {line[0]}")
        rows.append(line[1:])
    return width, height, rows
