"""Dequantised twins: a quantised GGUF with every tensor stored as F32.

On the CPU, llama.cpp rounds every activation vector to 8 bits before a
quantised matmul (architectures.md §8), which puts a ~1-logit noise floor
under any comparison on quantised weights. Its F32 path multiplies in fp32,
as the NumPy engine does. A twin holds the very weights the engine computes
with (dequantised by Anvil's own bit-exact code), with every metadata byte
copied from the original, so llama.cpp's outputs on the twin are what the
NumPy engine on the *original* file must reproduce to float32 precision.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType

from engine.atomic import atomic_open
from engine.gguf_file import GGUFFile

_HEADER = 24  # magic, version, n_tensors, n_kv


def write_f32_twin(src: str | os.PathLike, dst: str | os.PathLike) -> str:
    """Write ``src``'s F32 twin to ``dst`` atomically; returns its sha256."""
    gf = GGUFFile(src)
    reader = gf._reader
    names = gf.tensor_names()
    first_info = reader.tensors[0].field.offset if names else None
    mm = reader.data
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
    kv_bytes = bytes(mm[_HEADER:first_info])  # every key/value exactly as stored
    align = reader.alignment
    pad = lambda n: -n % align  # noqa: E731

    infos, offset = bytearray(), 0
    for name in names:
        ne = [int(n) for n in reversed(gf.tensor_shape(name))]  # GGUF order: ne0 first
        nm = name.encode()
        infos += struct.pack("<Q", len(nm)) + nm + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", GGMLQuantizationType.F32, offset)
        n = 4 * int(np.prod(ne))
        offset += n + pad(n)
    head = mm[:4].tobytes() + struct.pack("<IQQ", version, n_tensors, n_kv) + kv_bytes + bytes(infos)
    head += bytes(pad(len(head)))

    h = hashlib.sha256()
    with atomic_open(dst) as f:
        for chunk in _chunks(gf, names, head, pad):
            f.write(chunk)
            h.update(chunk)
    return h.hexdigest()


def _chunks(gf: GGUFFile, names, head: bytes, pad):
    yield head
    for name in names:
        data = np.ascontiguousarray(gf.dequantize(name), dtype="<f4").tobytes()
        yield data
        yield bytes(pad(len(data)))

