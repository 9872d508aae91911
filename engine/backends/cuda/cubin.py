"""What a compiled kernel holds on an SM, read from its cubin (no GPU), and
how many of its blocks an SM can hold, alone or beside another kernel's.

Under programmatic dependent launch a kernel's blocks start, and request
their weights, while the kernel before it runs, but only where an SM has
room for them beside that kernel's blocks. Whether it has is a matter of
registers, shared memory and warps, which ptxas fixes: this module reads
them from the cubin's ELF (the ``.nv.info`` attributes ptxas writes, the
``.nv.shared.<kernel>`` section) and applies the SM's limits
(``python -m engine launches --resources``).

The limits are sm_90's (H100, H200) as NVIDIA's occupancy calculator states
them: a 64K-register file in four sub-partitions of 16K, registers given to
a warp in units of 256, 228 KB of shared memory of which each block takes 1 KB
more than it asks for, 64 warps and 32 blocks.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ...errors import AnvilError

# .nv.info attributes (EIATTR_*): a 4-byte symbol index, then a 4-byte value
_REGCOUNT, _FRAME_SIZE = 0x2F, 0x11
_EIFMT_SVAL, _EIFMT_HVAL, _EIFMT_BVAL = 4, 3, 2


@dataclass(frozen=True)
class KernelResources:
    registers: int  # a thread's
    local_bytes: int  # a thread's stack frame: spilled registers and local arrays
    static_shared: int  # bytes a block declares (__shared__), beside the launch's dynamic shared memory and the
                        # SM's reserve


@dataclass(frozen=True)
class SM:
    registers: int = 65536
    subpartitions: int = 4
    register_unit: int = 256  # registers go to a warp in units of this many
    shared: int = 228 * 1024
    shared_reserved: int = 1024  # a block's, beside what it asks for
    warps: int = 64
    blocks: int = 32


H200 = SM()


def _sections(elf: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, link) of each ELF64 section, in order."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise AnvilError("cubin: not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQII", elf, shoff + i * entsize) for i in range(count)]
    strings = heads[names][4]

    def name(at: int) -> str:
        return elf[strings + at:elf.index(b"\0", strings + at)].decode()

    return [(name(h[0]), h[1], h[4], h[5], h[6]) for h in heads]


def resources(cubin: bytes) -> dict[str, KernelResources]:
    """Each kernel's resources in ``cubin``, by name."""
    secs = _sections(cubin)
    by_name = {s[0]: s for s in secs}
    symtab = next((s for s in secs if s[1] == 2), None)  # SHT_SYMTAB
    if symtab is None or ".nv.info" not in by_name:
        raise AnvilError("cubin: no symbol table or .nv.info section")
    strtab = secs[symtab[4]][2]
    symbols = []
    for i in range(symtab[3] // 24):
        at = struct.unpack_from("<I", cubin, symtab[2] + 24 * i)[0]
        symbols.append(cubin[strtab + at:cubin.index(b"\0", strtab + at)].decode())
    attrs: dict[str, dict[int, int]] = {}
    _, _, off, size, _ = by_name[".nv.info"]
    end = off + size
    while off < end:
        fmt, attr = cubin[off], cubin[off + 1]
        if fmt == _EIFMT_SVAL:
            n = struct.unpack_from("<H", cubin, off + 2)[0]
            if n == 8:
                sym, value = struct.unpack_from("<II", cubin, off + 4)
                attrs.setdefault(symbols[sym], {})[attr] = value
            off += 4 + n
        else:
            off += 4 if fmt == _EIFMT_HVAL else 3 if fmt == _EIFMT_BVAL else 2
    # a kernel's .nv.shared section spans the block's reserved shared memory too
    # (sm_80+: a .nv.shared.reserved section, the SM's shared_reserved bytes)
    reserved = H200.shared_reserved if any(s[0].startswith(".nv.shared.reserved") for s in secs) else 0

    def static_shared(name: str) -> int:
        sec = by_name.get(f".nv.shared.{name}")
        return max(0, sec[3] - reserved) if sec else 0

    return {name: KernelResources(a.get(_REGCOUNT, 0), a.get(_FRAME_SIZE, 0), static_shared(name))
            for name, a in attrs.items() if _REGCOUNT in a}


@dataclass(frozen=True)
class Footprint:
    """What one block of a launch takes of an SM."""
    warps: int
    warp_registers: int  # a warp's, in whole allocation units
    shared: int  # with the block's reserve


def footprint(res: KernelResources, threads: int, dynamic_shared: int, sm: SM = H200) -> Footprint:
    return Footprint(math.ceil(threads / 32), math.ceil(res.registers * 32 / sm.register_unit) * sm.register_unit,
                     res.static_shared + dynamic_shared + sm.shared_reserved)


def blocks_beside(new: Footprint, held: list[tuple[Footprint, int]] = (), sm: SM = H200) -> int:
    """Blocks of ``new`` an SM can take while it holds ``held`` (footprint,
    count of blocks) pairs. A sub-partition's register file serves the warps
    placed on it; a block's warps go to the sub-partitions in turn, so a
    block of w warps needs ceil(w / 4) warps' registers on the fullest one."""
    per_sub = sm.registers // sm.subpartitions

    def sub_load(fp: Footprint, count: int) -> int:  # registers on the fullest sub-partition
        return math.ceil(fp.warps * count / sm.subpartitions) * fp.warp_registers

    used_regs = sum(sub_load(fp, c) for fp, c in held)
    used_shared = sum(fp.shared * c for fp, c in held)
    used_warps = sum(fp.warps * c for fp, c in held)
    used_blocks = sum(c for _, c in held)
    n = 0
    while (used_blocks + n + 1 <= sm.blocks and used_warps + new.warps * (n + 1) <= sm.warps
           and used_shared + new.shared * (n + 1) <= sm.shared
           and used_regs + sub_load(new, n + 1) <= per_sub):
        n += 1
    return n
