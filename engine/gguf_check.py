"""Check a GGUF file's layout before anything is allocated or trusted.

``gguf.GGUFReader`` allocates what a file declares (an array of 2^62 floats
is a hang, not an error) and decodes strings without a check. This walk
reads only fixed-size fields and bounds every count and length by the bytes
left in the file before going on, the way llama.cpp's ``gguf_init_from_file``
does, and adds what the loader then assumes: UTF-8 strings, known value and
tensor types, tensor extents that are aligned, inside the data section,
non-overlapping and consistent with their type and shape. Every problem is
one ``GGUFError`` naming the key or tensor, the value found and what was
expected.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from .errors import GGUFError

# bytes of each scalar value type; STRING and ARRAY are variable
_SCALAR = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
           GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
           GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
MAX_DIMS = 4
MAX_ELEMENTS = 1 << 62  # far past any real tensor; keeps byte sizes inside int64 as llama.cpp requires


class _Cursor:
    def __init__(self, path: Path, buf):
        self.path, self.buf, self.pos = path, buf, 0
        self.string_arrays: dict[int, int] = {}  # a string array's offset (its item type) -> its end

    def fail(self, what: str):
        raise GGUFError(self.path, what)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            self.fail(f"truncated or corrupt: {what} needs {n} bytes at offset {self.pos}, "
                      f"the file has {len(self.buf) - self.pos} left")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out[0] if len(out) == 1 else out

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"the length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 (byte {raw[e.start]:#04x} at position {e.start})")

    def value(self, vtype: int, what: str, depth: int = 0):
        """Skip (or, for the few read later here, return) one value of ``vtype``."""
        try:
            t = GGUFValueType(vtype)
        except ValueError:
            self.fail(f"{what} has unknown value type {vtype}")
        if t in _SCALAR:
            fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[_SCALAR[t]]
            return self.unpack(fmt, what)
        if t == GGUFValueType.STRING:
            return self.string(what)
        # an array: its item type and count, each bounded before anything is read
        start = self.pos
        itype, count = self.unpack("<IQ", f"the array header of {what}")
        if depth:
            self.fail(f"{what} is an array of arrays (not supported)")
        try:
            it = GGUFValueType(itype)
        except ValueError:
            self.fail(f"{what} is an array of unknown value type {itype}")
        least = _SCALAR.get(it, 8)  # a string is at least its 8-byte length
        if count * least > len(self.buf) - self.pos:
            self.fail(f"{what} declares {count} items of {it.name}, more than the {len(self.buf) - self.pos} "
                      f"bytes left in the file can hold")
        if it in _SCALAR:
            self.pos += count * least
        elif it == GGUFValueType.STRING:
            self._strings(count, what)
            self.string_arrays[start] = self.pos
        else:
            for i in range(count):
                self.value(itype, f"{what}[{i}]", depth + 1)
        return None

    def _strings(self, count: int, what: str) -> None:
        """An array of strings (a vocabulary: 10^5 of them): the lengths walked
        and bounded in one tight loop, then all of them checked as UTF-8 at
        once, their 8-byte length fields blanked to ASCII spaces (a character
        cannot run across a space, so the whole decodes only if each string
        does); on failure, string by string, to name the bad one."""
        buf, pos, end, unpack = self.buf, self.pos, len(self.buf), struct.Struct("<Q").unpack_from
        start, heads = pos, []
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8, f"the length of {what}[{i}]")
            (n,) = unpack(buf, pos)
            heads.append(pos)
            pos += 8
            if n > end - pos:
                self.pos = pos
                self.need(n, f"{what}[{i}]")
            pos += n
        region = np.frombuffer(buf[start:pos], np.uint8).copy()
        if heads:
            region[(np.asarray(heads) - start)[:, None] + np.arange(8)] = 0x20
        try:
            str(region, "utf-8")
        except UnicodeDecodeError:
            for i, h in enumerate(heads):
                (n,) = unpack(buf, h)
                try:
                    str(buf[h + 8:h + 8 + n], "utf-8")
                except UnicodeDecodeError as e:
                    self.fail(f"{what}[{i}] is not valid UTF-8 (byte {buf[h + 8 + e.start]:#04x} at position "
                              f"{e.start})")
        self.pos = pos


def check_layout(path: Path) -> dict[int, int]:
    """Raise ``GGUFError`` at the first layout problem of the GGUF at ``path``.
    Returns where each string array (a vocabulary, its merges) ends, by the
    offset of its header: the reader then skips them without a second walk."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFError(path, "truncated or corrupt: the file is empty") from None
    view = memoryview(buf)
    try:
        cursor = _Cursor(path, view)
        _check(cursor)
        return cursor.string_arrays
    finally:
        view.release()  # before the map closes (an error's traceback still holds the cursor)
        buf.close()


def _check(c: _Cursor) -> None:
    magic = c.unpack("<4s", "the magic")
    if magic != b"GGUF":
        c.fail(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = c.unpack("<I", "the version")
    if version not in (2, 3):
        c.fail(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.unpack("<QQ", "the tensor and key counts")
    left = len(c.buf) - c.pos
    if n_kv * 8 > left or n_tensors * 24 > left:  # each entry takes at least this many bytes
        c.fail(f"truncated or corrupt: the header declares {n_kv} keys and {n_tensors} tensors, "
               f"more than the {left} bytes left can hold")

    alignment = GGUF_DEFAULT_ALIGNMENT
    keys = set()
    for i in range(n_kv):
        key = c.string(f"the name of key #{i}")
        if key in keys:
            c.fail(f"key '{key}' appears twice (key #{i} repeats an earlier key)")
        keys.add(key)
        vtype = c.unpack("<I", f"the type of key '{key}'")
        v = c.value(vtype, f"key '{key}'")
        if key == "general.alignment":
            if vtype != GGUFValueType.UINT32 or not v or v & (v - 1):
                c.fail(f"key 'general.alignment' must be a UINT32 power of two, got {v!r}")
            alignment = v

    tensors, names = [], set()
    for i in range(n_tensors):
        name = c.string(f"the name of tensor #{i}")
        if name in names:
            c.fail(f"tensor '{name}' appears twice (tensor #{i} repeats an earlier tensor)")
        names.add(name)
        n_dims = c.unpack("<I", f"the dimension count of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            c.fail(f"tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS})")
        ne = [c.unpack("<Q", f"the shape of tensor '{name}'") for _ in range(n_dims)]
        ttype, offset = c.unpack("<IQ", f"the type and offset of tensor '{name}'")
        try:
            qt = GGMLQuantizationType(ttype)
        except ValueError:
            c.fail(f"tensor '{name}' has unknown type id {ttype}")
        n = 1
        for d in ne:
            if d == 0 or d > MAX_ELEMENTS:
                c.fail(f"tensor '{name}' has shape {ne} (every dimension must be 1..2^62)")
            n *= d
        block, block_bytes = GGML_QUANT_SIZES[qt]
        if n > MAX_ELEMENTS or ne[0] % block:
            c.fail(f"tensor '{name}' has shape {ne}: {qt.name} needs a first dimension that is a multiple of "
                   f"{block} and at most 2^62 elements")
        if offset % alignment:
            c.fail(f"tensor '{name}' starts at data offset {offset}, not a multiple of the alignment {alignment}")
        tensors.append((offset, n // block * block_bytes, name))

    data_start = c.pos + (-c.pos % alignment)
    data_size = len(c.buf) - data_start
    for offset, size, name in tensors:  # wild offsets first: they would pass for gaps once sorted
        if offset + size > data_size:
            c.fail(f"truncated or corrupt: tensor '{name}' needs bytes up to {data_start + offset + size}, "
                   f"the file has {len(c.buf)}")
    end, prev = 0, None
    for offset, size, name in sorted(tensors):
        if offset < end:
            c.fail(f"tensor '{name}' (data offset {offset}) overlaps tensor '{prev}' (which ends at {end}): "
                   f"a wrong type or shape?")
        if offset - end >= alignment:
            # writers pack tensors back to back, padded to the alignment: a
            # larger gap means the tensor before it reads fewer bytes than
            # were written for it (its type or shape was changed)
            c.fail(f"tensor '{prev or name}' ends {offset - end} bytes before the next tensor starts "
                   f"(more than the alignment {alignment}): its type or shape does not match its data")
        end, prev = offset + size, name
    if prev is not None and data_size - end >= alignment:
        c.fail(f"tensor '{prev}' ends {data_size - end} bytes before the end of the file (more than the alignment "
               f"{alignment}): its type or shape does not match its data")
