"""GGUF fuzz: corrupt copies of the catalog's tiny model of every supported
architecture, one mutation each, across every section of the file (header,
metadata, tensor table, tensor data) and every kind of damage (truncation,
counts, lengths, types, UTF-8, offsets, alignment, overlaps, NaN/Inf, bad
hyper-parameters, swapped dimensions).

Each case must end in one clean error line naming the file and what is wrong
(the key or tensor, the value found), within a few seconds and with bounded
memory: never a traceback, a hang, an allocation the size of a declared
count, or a silent run that prints garbage. The fields are located with
gguf's own reader on the intact file, then patched byte by byte.
"""

from __future__ import annotations

import contextlib
import io
import math
import struct
import time
import tracemalloc

import pytest
from gguf import GGMLQuantizationType, GGUFReader

from engine import cli

ARCHS = {"llama": "tiny-llama", "qwen2": "tiny-qwen2", "qwen3": "tiny-qwen3", "qwen3moe": "tiny-qwen3moe",
         "gemma3": "tiny-gemma3", "qwen35": "tiny-qwen35", "qwen35moe": "tiny-qwen35moe", "gemma4": "tiny-gemma4moe"}
SECONDS = 10.0  # per case, in process (a clean error takes well under one)
PEAK_BYTES = 1 << 30  # Python/NumPy allocations of one case; a declared 2^40-item array must not get near


class Layout:
    """Where each field of an intact GGUF lies (absolute byte offsets)."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.data_start = r.data_offset
        self.kv = {}  # key -> (offset of its type, offset of its value)
        for name, f in r.fields.items():
            if name.startswith("GGUF."):
                continue
            type_at = f.offset + 8 + len(name.encode())
            self.kv[name] = (type_at, type_at + 4)
        self.tensors = {}  # name -> dict(ndims=, dims=, type=, offset=, data=, nbytes=, shape=)
        for t in r.tensors:
            at = t.field.offset + 8 + len(t.name.encode())
            n = len(t.shape)
            self.tensors[t.name] = {"ndims": at, "dims": at + 4, "type": at + 4 + 8 * n, "offset": at + 8 + 8 * n,
                                    "data": int(t.data_offset), "nbytes": int(t.n_bytes),
                                    "shape": [int(d) for d in t.shape], "qtype": t.tensor_type}
        self.order = [t.name for t in r.tensors]
        # the layers with softmax attention (a hybrid's are every 4th): names the renames use
        attn = sorted({int(n.split(".")[1]) for n in self.order if n.endswith(".attn_k.weight")})
        a0, a1 = attn[0], attn[1] if len(attn) > 1 else attn[0]
        self.names = {"k0": f"blk.{a0}.attn_k.weight", "q0": f"blk.{a0}.attn_q.weight",
                      "k1": f"blk.{a1}.attn_k.weight", "x1": f"blk.{a1}.attn_x.weight"}


def put(buf: bytearray, at: int, fmt: str, value) -> None:
    struct.pack_into(fmt, buf, at, value)


def norm_tensor(lay: Layout) -> str:
    return next(n for n in lay.order if n.endswith("attn_norm.weight"))


def ffn_up(lay: Layout, *, square_ok: bool = True) -> str:
    """The first FFN up-projection: a dense one, or a MoE's 3-D expert stack
    (not square: one whose swapped dimensions differ)."""
    return next(n for n in lay.order if n.endswith(("ffn_up.weight", "ffn_up_exps.weight"))
                and (square_ok or len(set(lay.tensors[n]["shape"])) > 1))


# Each mutation: (id, function(buf, layout, arch) -> bytes, what the one line must say). In the
# functions, `buf` is a mutable copy of the intact file.
def _truncate_header(buf, lay, arch):
    return bytes(buf[:lay.tensors[lay.order[len(lay.order) // 2]]["dims"]])


def _truncate_data(buf, lay, arch):
    return bytes(buf[:lay.data_start + (len(buf) - lay.data_start) * 6 // 10])


def _header(field_at: int, fmt: str, value):
    def mutate(buf, lay, arch):
        put(buf, field_at, fmt, value)
        return bytes(buf)
    return mutate


def _kv_value(key: str, fmt: str, value, *, into_type=None):
    def mutate(buf, lay, arch):
        type_at, value_at = lay.kv[key.format(arch=arch)]
        if into_type is not None:
            put(buf, type_at, "<I", into_type)
        if fmt:
            put(buf, value_at, fmt, value)
        return bytes(buf)
    return mutate


def _first_byte_of_string(key: str, byte: int):
    def mutate(buf, lay, arch):
        _, value_at = lay.kv[key.format(arch=arch)]
        buf[value_at + 8] = byte  # after the string's 8-byte length
        return bytes(buf)
    return mutate


def _array_count(key: str, count: int):
    def mutate(buf, lay, arch):
        _, value_at = lay.kv[key.format(arch=arch)]
        put(buf, value_at + 4, "<Q", count)  # after the item type
        return bytes(buf)
    return mutate


def _array_first(key: str, fmt: str, value):
    def mutate(buf, lay, arch):
        _, value_at = lay.kv[key.format(arch=arch)]
        put(buf, value_at + 12, fmt, value)  # after the item type and the count
        return bytes(buf)
    return mutate


def _tensor_field(pick, field: str, fmt: str, value_of):
    def mutate(buf, lay, arch):
        t = lay.tensors[pick(lay)]
        put(buf, t[field], fmt, value_of(t, lay))
        return bytes(buf)
    return mutate


def _tensor_value(pick, value: float):
    def mutate(buf, lay, arch):
        t = lay.tensors[pick(lay)]
        assert t["qtype"] == GGMLQuantizationType.F32
        put(buf, t["data"] + 4 * 3, "<f", value)
        return bytes(buf)
    return mutate


def _swap_dims(pick):
    def mutate(buf, lay, arch):
        t = lay.tensors[pick(lay)]
        i = next(i for i in range(len(t["shape"]) - 1) if t["shape"][i] != t["shape"][i + 1])
        put(buf, t["dims"] + 8 * i, "<Q", t["shape"][i + 1])  # the first two neighbouring dims that differ
        put(buf, t["dims"] + 8 * i + 8, "<Q", t["shape"][i])
        return bytes(buf)
    return mutate


def _rename_tensor(old_: str, new_: str):
    """Rename a tensor in place (names of the same length; {k0} etc.: Layout.names)."""
    def mutate(buf, lay, arch):
        old, new = (n.format(**lay.names) for n in (old_, new_))
        assert len(old) == len(new)
        at = lay.tensors[old]["ndims"] - len(old)
        buf[at:at + len(old)] = new.encode()
        return bytes(buf)
    return mutate


def _rename_key(old: str, new: str):
    def mutate(buf, lay, arch):
        o, n = old.format(arch=arch), new.format(arch=arch)
        assert len(o) == len(n)
        at = lay.kv[o][0] - len(o)
        buf[at:at + len(o)] = n.encode()
        return bytes(buf)
    return mutate


def _other_type(t, lay):
    """A valid type id of another byte size, so the tensor no longer fills its extent."""
    return int(GGMLQuantizationType.Q8_0 if t["qtype"] != GGMLQuantizationType.Q8_0 else GGMLQuantizationType.Q4_0)


def _overlap(t, lay):
    first = lay.tensors[lay.order[0]]
    return first["data"] - lay.data_start  # the first tensor's offset: the two overlap


MUTATIONS = [
    # -- the header
    ("truncated in the tensor table", _truncate_header, "truncated or corrupt"),
    ("truncated in the tensor data", _truncate_data, "truncated or corrupt"),
    ("version 1", _header(4, "<I", 1), "GGUF version 1 is not supported"),
    ("tensor count 2^61", _header(8, "<Q", 1 << 61), "tensors, more than the"),
    ("key count 2^61", _header(16, "<Q", 1 << 61), "keys and"),
    # -- the metadata
    ("architecture not UTF-8", _first_byte_of_string("general.architecture", 0xC3), "not valid UTF-8"),
    ("name not UTF-8", _first_byte_of_string("general.name", 0xFF), "key 'general.name' is not valid UTF-8"),
    ("name length 2^40", _kv_value("general.name", "<Q", 1 << 40), "truncated or corrupt"),
    ("token list of 2^40 strings", _array_count("tokenizer.ggml.tokens", 1 << 40), "declares 1099511627776 items"),
    ("token list of unknown item type", _kv_value("tokenizer.ggml.tokens", "<I", 41), "array of unknown value type 41"),
    ("block_count of unknown value type", _kv_value("{arch}.block_count", "", None, into_type=99),
     "unknown value type 99"),
    ("block_count stored as float32", _kv_value("{arch}.block_count", "", None, into_type=6),
     "'{arch}.block_count' must be a positive integer, got "),  # the layer count's bits read as a float
    ("rms epsilon NaN", _kv_value("{arch}.attention.layer_norm_rms_epsilon", "<f", math.nan),
     "'{arch}.attention.layer_norm_rms_epsilon' must be finite and > 0, got nan"),
    ("rope base -1", _kv_value("{arch}.rope.freq_base", "<f", -1.0), "'{arch}.rope.freq_base' must be finite and > 0"),
    ("head_count_kv 3", _kv_value("{arch}.attention.head_count_kv", "<I", 3), "is not a multiple of head_count_kv (3)"),
    ("a key listed twice", _rename_key("{arch}.rope.freq_base", "{arch}.context_length"),
     "key '{arch}.context_length' appears twice"),
    ("head_count 0", _kv_value("{arch}.attention.head_count", "<I", 0), "must be a positive integer, got 0"),
    ("embedding length off by one", _kv_value("{arch}.embedding_length", "<I", 255), "shape"),
    # -- the tensor table
    ("norm with 5 dimensions", _tensor_field(norm_tensor, "ndims", "<I", lambda t, l: 5), "has 5 dimensions"),
    ("norm of unknown type", _tensor_field(norm_tensor, "type", "<I", lambda t, l: 99), "unknown type id 99"),
    ("ffn_up retyped", _tensor_field(ffn_up, "type", "<I", _other_type), "ffn_up"),
    ("norm offset misaligned", _tensor_field(norm_tensor, "offset", "<Q", lambda t, l: t["data"] - l.data_start + 8),
     "not a multiple of the alignment"),
    ("norm overlaps the first tensor", _tensor_field(norm_tensor, "offset", "<Q", _overlap), "overlaps"),
    ("norm offset wraps past 2^64", _tensor_field(norm_tensor, "offset", "<Q", lambda t, l: (1 << 64) - 32),
     "truncated or corrupt"),
    ("ffn_up dimensions swapped", _swap_dims(lambda lay: ffn_up(lay, square_ok=False)), "ffn_up"),
    ("a tensor listed twice", _rename_tensor("{k0}", "{q0}"), "tensor '{q0}' appears twice"),
    ("a layer's tensor missing", _rename_tensor("{k1}", "{x1}"), "{k1}"),
    # -- the tensor data
    ("NaN in a norm", _tensor_value(norm_tensor, math.nan), "non-finite"),
    ("+Inf in the output norm", _tensor_value(lambda lay: "output_norm.weight", math.inf), "non-finite"),
]
# the keys only some architectures read
_MOE = [
    ("more experts used than exist", _kv_value("{arch}.expert_used_count", "<I", 9),
     "key '{arch}.expert_used_count' (9) exceeds expert_count (8)"),
    ("no experts", _kv_value("{arch}.expert_count", "<I", 0), "key '{arch}.expert_count' must be a positive integer"),
]
_HYBRID = [  # Gated DeltaNet layers (qwen35, qwen35moe)
    ("conv kernel 0", _kv_value("{arch}.ssm.conv_kernel", "<I", 0),
     "key '{arch}.ssm.conv_kernel' must be a positive integer, got 0"),
    ("no full-attention layers", _kv_value("{arch}.full_attention_interval", "<I", 0),
     "key '{arch}.full_attention_interval' must be a positive integer, got 0"),
    ("state size off by one", _kv_value("{arch}.ssm.state_size", "<I", 33),
     "value head width 32 (ssm.inner_size / time_step_rank) != key head width 33 (key '{arch}.ssm.state_size')"),
    ("inner size off by one", _kv_value("{arch}.ssm.inner_size", "<I", 127),
     "key '{arch}.ssm.inner_size' (127) must be a multiple of time_step_rank (4)"),
    ("key groups not dividing the value heads", _kv_value("{arch}.ssm.group_count", "<I", 3),
     "and that of group_count (3)"),
    ("M-RoPE sections of 2^40 items", _array_count("{arch}.rope.dimension_sections", 1 << 40),
     "declares 1099511627776 items"),
    ("NaN in ssm_a", _tensor_value(lambda lay: "blk.0.ssm_a", math.nan), "non-finite"),
]
ARCH_MUTATIONS = {
    "qwen3moe": _MOE + [
        ("expert width off by one", _kv_value("{arch}.expert_feed_forward_length", "<I", 255), "ffn_gate_exps.weight")],
    "qwen35": _HYBRID,
    "qwen35moe": _HYBRID + _MOE,
    "gemma4": _MOE + [
        ("head_count_kv of layer 0: 3", _array_first("{arch}.attention.head_count_kv", "<i", 3),
         "is not a multiple of head_count_kv (3)"),
        ("final softcap NaN", _kv_value("{arch}.final_logit_softcapping", "<f", math.nan),
         "'{arch}.final_logit_softcapping' must be finite and >= 0, got nan"),
        ("NaN in the router's input scale", _tensor_value(lambda lay: "blk.0.ffn_gate_inp.scale", math.nan),
         "non-finite"),
    ],
}
# gemma4's head_count_kv is per layer (an array): its first item is patched above instead
SKIP = {("gemma4", "head_count_kv 3")}
CASES = [(arch, *m) for arch in ARCHS for m in MUTATIONS + ARCH_MUTATIONS.get(arch, []) if (arch, m[0]) not in SKIP]


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    """arch -> (file bytes, layout) of the catalog's tiny preset of that
    architecture (its shapes and quant mix) written with a 512-token
    vocabulary: a 262k-token one would spend seconds per case in the reader."""
    from gguf import GGUFWriter

    from engine import synth

    d = tmp_path_factory.mktemp("fuzz")
    w = GGUFWriter(str(d / "vocab.gguf"), "llama")
    w.add_token_list([f"t{i}" for i in range(512)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = {}
    for arch, name in ARCHS.items():
        p = d / f"{arch}.gguf"
        synth.write_synthetic(name, p, vocab_gguf=d / "vocab.gguf")
        out[arch] = (p.read_bytes(), Layout(p))
    return out


def run_engine(path) -> tuple[int, str, float, int]:
    """`python -m engine generate` in this process: (exit status, stderr, seconds, peak traced bytes)."""
    err = io.StringIO()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main(["generate", str(path), "--prompt-ids", "1,2,3", "-n", "2", "--backend", "numpy", "--json"])
    finally:
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return rc, err.getvalue(), seconds, peak


def test_every_section_and_architecture_is_covered():
    assert len(CASES) >= 50 and {a for a, *_ in CASES} == set(ARCHS)


@pytest.mark.parametrize("arch", ARCHS)
def test_intact_files_run(intact, tmp_path, arch):
    """The control: each unmutated file generates."""
    p = tmp_path / f"{arch}.gguf"
    p.write_bytes(intact[arch][0])
    rc, err, _, _ = run_engine(p)
    assert rc == 0, err


@pytest.mark.parametrize("arch,case,mutate,says", CASES, ids=[f"{a}: {c}" for a, c, *_ in CASES])
def test_mutation_is_one_clear_line(intact, tmp_path, arch, case, mutate, says):
    data, lay = intact[arch]
    p = tmp_path / f"{arch}-bad.gguf"
    p.write_bytes(mutate(bytearray(data), lay, arch))
    rc, err, seconds, peak = run_engine(p)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"error: {p}: ") and says.format(arch=arch, **lay.names) in lines[0], lines[0]
    if "stored as float32" in case:
        assert lines[0].endswith("(stored as float)"), lines[0]
    assert seconds < SECONDS and peak < PEAK_BYTES, (seconds, peak)
