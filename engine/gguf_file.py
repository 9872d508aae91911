"""Open and validate a GGUF file; look up its metadata and tensors.

The file is memory-mapped through ``gguf.GGUFReader``: opening a multi-GB
model costs nothing until a tensor is read. Every failure is turned into a
``GGUFError`` naming the file and the key or tensor at fault.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from . import quants
from .errors import GGUFError
from .gguf_check import check_layout
from .quants import QType

GGUF_MAGIC = b"GGUF"
_MISSING = object()


class _Reader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map, with arrays read
    whole.

    The reader slices its map once per metadata item; on an ``np.memmap``
    every slice pays for the subclass's bookkeeping, which makes a 262k-token
    vocabulary take ~15 s to open. A plain view of the same mapping (still not
    a copy) takes ~2 s, and arrays kept whole (below) a fraction of a second.
    """

    def __init__(self, path: Path, string_arrays: dict[int, int]):
        self._string_ends = string_arrays  # check_layout's: where each string array ends
        super().__init__(path, "r")

    @property
    def data(self):
        return self._plain

    @data.setter
    def data(self, mapped):
        self._mapped = mapped
        self._plain = mapped.view(np.ndarray)

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        """An array of scalars or strings (a vocabulary's tokens, scores and
        types: 10^5 items each) as one part, not the reader's two NumPy views
        an item (~1 s per 262k-token vocabulary, paid by every process that
        opened such a file): a scalar array's items, whose ``contents()`` is
        the whole list; a string array's bytes, which ``GGUFFile.get``
        decodes when asked (``string_items``). check_layout has bounded every
        count and length, and walked the strings, before this runs."""
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, n = GGUFValueType(int(raw_itype[0])), int(alen[0])
        scalar = self.gguf_scalar_to_np.get(itype)
        types = [GGUFValueType.ARRAY, itype]
        if itype == GGUFValueType.STRING and n and orig_offs in self._string_ends:
            end = self._string_ends[orig_offs]
            return end - orig_offs, [raw_itype, alen, self.data[orig_offs + 12:end]], [2], types
        if n == 0 or scalar is None:
            return super()._get_field_parts(orig_offs, raw_type)
        dt = np.dtype(scalar).newbyteorder(self.byte_order)
        offs = orig_offs + 12
        return n * dt.itemsize + 12, [raw_itype, alen, self.data[offs:offs + n * dt.itemsize].view(dt)], [2], types

    @staticmethod
    def kept_whole(field) -> bool:
        """A string array read as one part: the key's name (2 parts), its type,
        then the array's item type, count and bytes (``data`` points at those)."""
        return field.types == [GGUFValueType.ARRAY, GGUFValueType.STRING] and field.data == [5]

    def string_items(self, field) -> list[str]:
        """The strings of a string-array field read by ``_get_field_parts``."""
        raw, n = field.parts[-1].tobytes(), int(field.parts[-2][0])
        little = (self.byte_order == "I") == (sys.byteorder == "little")
        length = struct.Struct("<Q" if little else ">Q").unpack_from
        out, pos = [], 0
        for _ in range(n):
            (size,) = length(raw, pos)
            out.append(raw[pos + 8:pos + 8 + size].decode("utf-8"))
            pos += 8 + size
        return out


class GGUFFile:
    """A validated, memory-mapped GGUF file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if self.path.is_dir():
            raise GGUFError(self.path, "is a directory, not a GGUF file")
        if not self.path.is_file():
            raise GGUFError(self.path, "no such file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFError(self.path, f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        # bounds, types, UTF-8 and tensor extents, before the reader allocates
        string_arrays = check_layout(self.path)
        try:
            self._reader = _Reader(self.path, string_arrays)
        except Exception as e:  # the reader raises ValueError/IndexError/struct errors on a cut-off file
            raise GGUFError(self.path, f"truncated or corrupt GGUF ({type(e).__name__}: {e})") from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._check_extents()

    def _check_extents(self) -> None:
        # The reader maps tensor data lazily; a file cut short inside the data
        # section only shows up here, as a tensor whose bytes run past the end.
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            end = t.data_offset + t.n_bytes
            if end > size or t.data.nbytes != t.n_bytes:
                raise GGUFError(self.path, f"truncated: tensor '{t.name}' needs bytes up to {end}, file has {size}")

    # ---- metadata -------------------------------------------------------
    def has_key(self, key: str) -> bool:
        return key in self._reader.fields

    def get(self, key: str, default=_MISSING):
        """The value of metadata ``key`` as a Python scalar, str or list."""
        field = self._reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise GGUFError(self.path, f"missing required key '{key}'")
            return default
        if self._reader.kept_whole(field):
            return self._reader.string_items(field)
        return field.contents()

    def array_len(self, key: str) -> int | None:
        """Length of an array-valued key without decoding it (a 262k-token
        vocabulary takes a while to turn into Python strings)."""
        field = self._reader.fields.get(key)
        if field is None:
            return None
        return int(field.parts[4][0]) if field.types[0] == GGUFValueType.ARRAY else len(field.data)

    def keys(self) -> list[str]:
        return list(self._reader.fields)

    # ---- tensors --------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def _tensor(self, name: str):
        t = self._tensors.get(name)
        if t is None:
            raise GGUFError(self.path, f"missing tensor '{name}'")
        return t

    def tensor_type(self, name: str) -> QType:
        t = self._tensor(name)
        try:
            qtype = QType(int(t.tensor_type))
        except ValueError:
            raise GGUFError(self.path, f"tensor '{name}' has unsupported type {t.tensor_type.name}") from None
        if qtype not in quants.SUPPORTED:
            raise GGUFError(self.path, f"tensor '{name}' has unsupported type {qtype.name}")
        return qtype

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """NumPy (row-major) shape: GGUF's ne order reversed, so a weight
        ``{n_in, n_out}`` is ``(n_out, n_in)`` and ``y = W @ x``."""
        return tuple(int(n) for n in reversed(self._tensor(name).shape.tolist()))

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored (memory-mapped, not copied)."""
        return self._tensor(name).data

    def check_shape(self, name: str, expected: tuple[int, ...]) -> None:
        actual = self.tensor_shape(name)
        if actual != tuple(expected):
            # report in GGUF's own ne order, the order tools like gguf-dump print
            raise GGUFError(
                self.path,
                f"tensor '{name}' has shape {list(reversed(actual))}, expected {list(reversed(tuple(expected)))} (GGUF ne order)",
            )

    def dequantize(self, name: str, expected: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as float32 in NumPy shape, after checking its shape."""
        if expected is not None:
            self.check_shape(name, expected)
        return quants.dequantize(self.raw(name), self.tensor_type(name), self.tensor_shape(name))
