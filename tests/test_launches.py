"""Launches per decode step, counted on the CPU: the CUDA backend runs one
decode step on a recording device (engine/backends/cuda/recording.py), so the
kernels a step's graph holds are known without a GPU. These pin the fusions:
undoing one adds launches to every layer of every token."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from engine import cli
from engine.errors import AnvilError
from engine.backends.cuda.recording import decode_launches
from harness import catalog


def _path(name):
    return catalog.model_path(name, progress=False)


def test_the_command_counts_a_step(capsys):
    assert cli.main(["launches", str(_path("tiny-qwen3")), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["launches_per_token"] == sum(out["kernels"].values()) and out["n_layer"] == 4
    # per layer: the Q/K norm with RoPE and the attention itself; the residual
    # adds inside the Wo and W_down GEMVs, so two plain norms (and the output norm) ...
    # (in the layers with a V GEMV of its own, that GEMV forms the heads: Folded)
    assert out["kernels"]["attention_decode"] == 4
    assert out["kernels"]["qk_norm_rope_neox"] + out["kernels"]["gemv_heads_q6_k"] == 4
    # (the FFN norm is the gate/up GEMV's own: Folded)
    assert out["kernels"]["rms_norm"] == 4 + 1 and "add_rms_norm" not in out["kernels"]
    # ... and once a step: the argmax, which also advances the graph's own inputs (token, position)
    assert out["kernels"]["argmax_blocks"] == 1 and "advance" not in out["kernels"]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama", "tiny-gemma4", "tiny-qwen35"])
def test_decode_attention_stores_the_step_rows(name):
    """A decode step's K/V rows go into the cache inside the attention kernel:
    no kv_store launch in the step (prefill still stores with it)."""
    counts, n_layer = decode_launches(_path(name))
    assert counts["attention_decode"] >= 1 and counts["kv_store"] == 0, counts


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gemma4", "tiny-gemma4moe"])
def test_gemma_post_norms_run_inside_the_residual_adds(name):
    """No standalone add or scale per layer: each post-norm, residual add and
    (gemma4) layer-output scale is one add_rms_norm launch."""
    counts, n_layer = decode_launches(_path(name))
    assert counts["add"] == 0 and counts["mul_rows"] == 0, counts
    moe = name.endswith("moe")
    assert counts["add_rms_norm"] == (3 if moe else 2) * n_layer, counts
    # standalone norms: each layer's attention input norm (and gemma4's V norm), the output norm; the
    # MoE layers' router and expert input norms are the add_rms_norm's, the dense branch's the norm_add's
    assert counts["rms_norm"] == (2 if name.startswith("tiny-gemma4") else 1) * n_layer + 1, counts


def test_moe_routing_is_one_launch_per_layer():
    counts, n_layer = decode_launches(_path("tiny-qwen3moe"))
    assert counts["moe_router_f32"] == n_layer and counts["moe_route"] == 0 and not any("gemm" in k for k in counts)


def test_attention_splits_merge_in_the_kernel():
    """A long context splits the decode attention and its last split block
    merges them: no combine launch, whatever the context."""
    short, n_layer = decode_launches(_path("tiny-llama"), n_ctx=64)
    long, _ = decode_launches(_path("tiny-llama"), n_ctx=4096)
    assert long["attention_decode"] == short["attention_decode"] == n_layer
    assert sum(long.values()) == sum(short.values()) and not any("combine" in k for k in long)


@pytest.mark.parametrize("name,act", [("tiny-qwen3", "silu"), ("tiny-gemma3", "gelu")])
def test_glu_runs_inside_the_gemv(name, act):
    """Gate and up of one type: one GEMV launch with the GLU in its epilogue
    (the experts' moe_glu likewise), no separate GLU kernel."""
    counts, n_layer = decode_launches(_path(name))
    assert sum(v for k, v in counts.items() if k.startswith(f"gemv_glu_{act}_")) == n_layer, counts
    assert counts["silu_mul"] == counts["gelu_tanh_mul"] == 0, counts


def test_projections_of_one_type_share_a_launch():
    """Q, K and V in one GEMV launch where they are of one type; where V's
    type differs (Q4_K_M's Q6_K V in half the layers), Q and K in one and V
    in another: a launch per run of consecutive types. Then the output
    projection, the GLU GEMV, the down projection per layer, and the head."""
    from engine.gguf_file import GGUFFile

    path = _path("tiny-qwen3")
    counts, n_layer = decode_launches(path)
    gf = GGUFFile(path)
    runs = 0
    for il in range(n_layer):
        types = [gf.tensor_type(f"blk.{il}.attn_{p}.weight") for p in "qkv"]
        runs += 1 + sum(a != b for a, b in zip(types, types[1:]))
    assert n_layer < runs < 3 * n_layer  # the file mixes types in some layers, not all (else this pins nothing)
    assert sum(v for k, v in counts.items() if k.startswith("gemv_")) == runs + 3 * n_layer + 1, counts


def test_prefill_rounds_each_input_once_and_dequantises_each_run_once():
    """A prefill GEMM group (Q/K/V, gate/up) reads its input in bf16, rounded
    once, and dequantises each run of one-type weights stored back to back
    with one launch (a dequant per run, whatever the group's size). The norms,
    the tensor-core attention and the GLU write their bf16 copy themselves
    (PRODUCERS_WRITE_BF16): no f32_to_bf16 is left. Every bf16 GEMM reads an
    array that one of those launches wrote. The down projection adds into the
    residual stream in its GEMM's epilogue: no add."""
    from collections import Counter

    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.gguf_file import GGUFFile
    from engine.model import Model

    class Cublas(RecordingCublas):
        def __init__(self):
            super().__init__()
            self.inputs = []

        def gemm(self, x, w, y, T, n_in, n_out, dtype="bf16", accumulate=False):
            self.inputs.append((x.ptr, dtype))

    path = _path("tiny-qwen3")
    dev, cublas = RecordingDevice(), Cublas()
    written, launch = set(), dev.launch

    def spy(fn, grid, block, args, shared=0):  # the bf16 arrays kernels write: (y of f32_to_bf16, yb of the others)
        bf16 = [a for a in args if getattr(a, "dtype", None) == np.uint16]
        if fn[1] in ("f32_to_bf16", "rms_norm", "silu_mul", "attention_prefill_tc"):
            written.update(a.ptr for a in bf16)
        return launch(fn, grid, block, args, shared)

    dev.launch = spy
    m = Model(path, backend="cuda", eager=True, device=dev, cublas=cublas)
    m.forward(list(range(1, 65)))
    counts, n_layer = Counter(name for (_, name), *_ in dev.launches), m.config.n_layer
    assert counts["f32_to_bf16"] == 0 and counts["attention_prefill_tc"] == n_layer and counts["add"] == 0, counts
    assert cublas.inputs and all(dt == "bf16" and ptr in written for ptr, dt in cublas.inputs), cublas.inputs
    gf = GGUFFile(path)
    runs = 0
    for il in range(n_layer):
        for group in (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",)):
            types = [gf.tensor_type(f"blk.{il}.{t}.weight") for t in group]
            runs += 1 + sum(a != b for a, b in zip(types, types[1:]))
    assert sum(v for k, v in counts.items() if k.startswith("dequant_")) == runs, counts


def test_prefill_bf16_copy_is_dropped_when_written_in_place(monkeypatch):
    """A bf16 copy belongs to the array its kernel wrote, as that kernel left
    it: each operator that changes an array in place drops the array's copy
    (a GEMM then converts again), a new layer or pass drops them all, and none
    is made where a GEMV reads the array (decode), for a 3-D array, or with
    PRODUCERS_WRITE_BF16 off. A misaligned copy is refused by the launchers."""
    import engine.backends.cuda as cuda_backend
    from engine.backends.cuda.device import DArray
    from engine.backends.cuda.launchers import elementwise, norm
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    dev = RecordingDevice()
    m = Model(_path("tiny-qwen3"), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
    ops, n = cuda_backend.Ops(m.backend), m.config.n_embd
    T, hd = 8, m.config.head_dim
    x, w = dev.empty((T, n)), dev.empty((n,))
    rot = cuda_backend.Rotation(cuda_backend.Positions(dev.empty((T,), np.int32), T), 10000.0, 1.0, None,
                                "neox", hd)

    def copied(shape=(T, n)):  # a fresh 2-D array with a bf16 copy
        y = ops.rms_norm(dev.empty(shape), None, 1e-6)
        assert id(y) in ops._bf16
        return y

    heads = lambda y: y.reshape(T, y.shape[1] // hd, hd)  # a view: another object, the same memory
    in_place = {  # each changes (a view of) its argument in place
        "add_rms_norm": lambda y: ops.add_rms_norm(y, x, w, 1e-6),
        "norm_add": lambda y: ops.norm_add(y, x, w, 1e-6),
        "softcap": lambda y: ops.softcap(y, 30.0),
        "matmul into the residual": lambda y: ops.matmul(x, m.layers[0].wo, add=y),
        "rope of its heads": lambda y: ops.rope(rot, heads(y)),
        "qk_norm_rope of its heads": lambda y: ops.qk_norm_rope(rot, heads(y), heads(copied()), dev.empty((hd,)),
                                                                  dev.empty((hd,)), 1e-6),
    }
    for name, op in in_place.items():
        y = copied()
        op(y)
        assert id(y) not in ops._bf16, f"{name} left a stale bf16 copy"
    kept = copied()
    ops.softcap(dev.empty((T, n)), 30.0)  # another array: no copy dropped
    assert id(kept) in ops._bf16
    ops.end_layer(x)
    assert not ops._bf16, "end_layer kept a copy"
    copied()
    ops.embed(m.glob.token_embd, dev.empty((T,), np.int32))
    assert not ops._bf16, "a new pass kept a copy"
    ops.rms_norm(dev.empty((1, n)), w, 1e-6)  # one row: a GEMV's input
    ops.rms_norm(dev.empty((T, 2, n // 2)), None, 1e-6)  # per-head norms
    assert not ops._bf16
    monkeypatch.setattr(cuda_backend, "PRODUCERS_WRITE_BF16", False)
    ops.rms_norm(x, w, 1e-6)
    assert not ops._bf16
    odd = DArray(dev.empty((T * n + 4,), np.uint16).ptr + 2, (T, n), np.dtype(np.uint16), dev)
    with pytest.raises(AnvilError, match="aligned"):
        norm.rms_norm(dev, x, w, dev.empty((T, n)), 1e-6, yb=odd)
    with pytest.raises(AnvilError, match="aligned"):
        elementwise.silu_mul(dev, x, x, dev.empty((T, n)), yb=odd)


def test_deltanet_l2_norms_are_one_launch_each():
    """Q's and K's L2 norms: one norm launch each (the 1/√S factor as its
    weight), no separate scaling."""
    counts, n_layer = decode_launches(_path("tiny-qwen35"))
    assert counts["scale"] == 0, counts


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama", "tiny-qwen2", "tiny-gemma3", "tiny-qwen3moe", "tiny-qwen35"])
def test_decode_ffn_norm_folds_into_gate_up(name):
    """A decode step of the llama family and of dense qwen35 launches no FFN
    input norm: the gate/up GEMV reads x through it (gemv.cu GEMV_NORM), its
    launch carrying the norm's weight; the attention input and output norms
    still launch.
    Families whose FFN norm is add_rms_norm's keep it. Prefill (more rows)
    keeps every norm."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    dev = RecordingDevice()
    m = Model(_path(name), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
    m.forward(list(range(1, 9)))
    prefill = Counter(k for (_, k), *_ in dev.launches)
    first, launched, launch = len(dev.launches), [], dev.launch

    def spy(fn, grid, block, args, shared=0):
        launched.append((fn[1], args))
        return launch(fn, grid, block, args, shared)

    dev.launch = spy
    m.decode_next(4)
    counts, n_layer = Counter(k for (_, k), *_ in dev.launches[first:]), m.config.n_layer
    llama = m.config.arch in ("llama", "qwen2", "qwen3")
    if llama:
        assert counts["rms_norm"] == n_layer + 1 and prefill["rms_norm"] >= 2 * n_layer, (counts, prefill)
    if llama or m.config.arch == "qwen35":  # (dense qwen35: after either mixer)
        assert counts["add_rms_norm"] == 0, counts
        # (gate and up not stored back to back: two GEMVs, each carrying it, then the GLU kernel)
        carried = {_norm_weight(k, args).ptr for k, args in launched if _norm_weight(k, args)}
        assert carried == {m.layers[i].ffn_norm.ptr for i in range(n_layer)}, "gate/up should carry the FFN norms"
    else:
        assert not any(_norm_weight(k, args) for k, args in launched), "no GEMV of this family should carry a norm"


def _norm_weight(kernel: str, args):
    """The norm weight a GEMV launch carries (gemv.cu: nw), or None."""
    if not kernel.startswith("gemv"):
        return None
    nw = args[5 if kernel.startswith("gemv_glu") else 6]
    return nw if hasattr(nw, "ptr") else None


def test_a_folded_norm_read_later_is_an_error():
    """A norm that the gate/up GEMV folded in is dropped at the next other
    operator; an operator reading its output after that raises (its memory
    holds nothing), and one reading it before any GEMV gets it launched, as
    does a GEMV that does not fold (matmul)."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.errors import AnvilError
    from engine.model import Model

    dev = RecordingDevice()
    m = Model(_path("tiny-qwen3"), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
    m.forward([1, 2])
    ops, w = m.ops, m.layers[0]
    x = ops._ops._empty((1, m.config.n_embd))
    n = ops.rms_norm(x, w.ffn_norm, 1e-6)
    before = len(dev.launches)
    ops.add(n, n)  # read before any GEMV: launched first
    assert [k for (_, k), *_ in dev.launches[before:]] == ["rms_norm", "add"]
    n = ops.rms_norm(x, w.ffn_norm, 1e-6)
    ops.glu(n, w.w_gate, w.w_up, "silu")
    ops.add(x, x)  # another operator: the folded norm is dropped
    with pytest.raises(AnvilError, match="folded"):
        ops.add(n, n)
    n = ops.rms_norm(x, w.attn_norm, 1e-6)
    before = len(dev.launches)
    ops.matmuls(n, (w.wq, w.wk))  # no fold: the norm first
    assert [k for (_, k), *_ in dev.launches[before:]][0] == "rms_norm"


def test_diff_traces_every_norm():
    """harness diff traces the operators themselves (every norm launched, so
    every traced output is written), and leaves the model's folded ones in
    place after."""
    from engine.backends.cuda import Folded
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model
    from harness import diff

    dev = RecordingDevice()
    m = Model(_path("tiny-qwen3"), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
    first = len(dev.launches)
    diff.engine_tensors(m, [1, 2, 3])
    counts = Counter(k for (_, k), *_ in dev.launches[first:])
    assert counts["rms_norm"] == 2 * m.config.n_layer + 1 and isinstance(m.ops, Folded), counts


def test_a_long_prompt_runs_in_the_backends_micro_batches(monkeypatch):
    """The CUDA backend's micro-batch is its own (``ubatch``, 4096 by
    default): a prompt of ubatch + 100 tokens is two prefill passes, each
    dequantising the weights once, where the NumPy micro-batch would make it
    nine. The workspace holds one micro-batch, no more than the context."""
    import engine.backends.cuda as cuda
    from engine.backends.cuda import UBATCH
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    sized = []  # the tokens each workspace was sized for
    monkeypatch.setattr(cuda, "workspace_bytes", lambda cfg, tokens: sized.append(tokens) or 256 << 20)

    def passes(n_ctx, n_tokens, **options):
        dev = RecordingDevice()
        m = Model(_path("tiny-qwen3"), n_ctx=n_ctx, backend="cuda", eager=True, device=dev, cublas=RecordingCublas(),
                  **options)
        m.forward(list(np.arange(n_tokens) % 1000 + 1))
        counts = Counter(name for (_, name), *_ in dev.launches)
        assert counts["attention_prefill_tc"] % m.config.n_layer == 0, counts
        return counts["attention_prefill_tc"] // m.config.n_layer, m.backend

    n, b = passes(2 * UBATCH, UBATCH + 100)
    assert n == 2 and b.ubatch == UBATCH
    assert passes(2 * UBATCH, UBATCH + 100, ubatch=512)[0] == 9
    assert passes(1024, 1000)[0] == 1
    assert sized == [UBATCH, 512, 1024]


def test_the_workspace_grows_with_the_micro_batch():
    """12 rows of the widest activation a token (at least 256 MB): qwen3-8b's
    FFN of 12288 at 4096 tokens is 2.4 GB, 8 times its 512 tokens'."""
    from engine.backends.cuda import workspace_bytes
    from engine.config import ModelConfig
    from engine.gguf_file import GGUFFile

    cfg = ModelConfig.from_gguf(GGUFFile(_path("tiny-qwen3")))
    wide = replace(cfg, n_ff=12288)
    assert workspace_bytes(wide, 4096) == 12 * 4 * 4096 * 12288 == 8 * workspace_bytes(wide, 512)
    assert workspace_bytes(cfg, 4096) == 256 << 20  # the tiny shape: the least


def test_a_micro_batch_out_of_range_is_refused(monkeypatch):
    """At least NumPy's (harness diff traces one NumPy micro-batch on both
    backends), at most 16384; and a MoE model's micro-batch whose (token,
    expert) pairs moe_sort could not hold is refused at load, before any
    layer of a prompt has run."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    def load(name, **options):
        return Model(_path(name), backend="cuda", eager=True, device=RecordingDevice(), cublas=RecordingCublas(),
                     **options)

    for bad in (256, 16385):
        with pytest.raises(AnvilError, match=f"ubatch {bad}: a micro-batch must be 512 to 16384 tokens"):
            load("tiny-qwen3", ubatch=bad)
    monkeypatch.setattr(RecordingDevice, "max_shared", 16 * 1024)  # tiny-qwen3moe: 2 of 8 experts a token
    with pytest.raises(AnvilError, match=r"ubatch 4096: a micro-batch of 4096 tokens has 8192 \(token, expert\) "
                                         r"pairs, more than moe_sort sorts in a block's 16384 bytes"):
        load("tiny-qwen3moe", n_ctx=8192)
    assert load("tiny-qwen3moe", n_ctx=8192, ubatch=1024).backend.ubatch == 1024  # 2048 pairs: 8 KB


def test_prefill_graphs_are_kept_per_length_up_to_four_and_the_full_micro_batch():
    """Captured prefill passes (a recording device's capture runs the pass
    and returns a token): one per length from 512 tokens, the first four
    lengths; a fifth runs eagerly, except the full micro-batch, which always
    gets one; shorter pieces never do, and a length seen again replays."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    dev = RecordingDevice()
    captured, replayed = [], []
    dev.capture = lambda fn: (fn(), captured.append(len(captured)))[1] or f"graph {len(captured)}"
    dev.replay = replayed.append
    m = Model(_path("tiny-qwen3"), n_ctx=8192, backend="cuda", device=dev, cublas=RecordingCublas())
    for n in (100, 512, 600, 700, 800, 900, 600, 4096):
        m.reset()
        m.forward(list(np.arange(n) % 1000 + 1))
    assert sorted(m.backend.pf_graphs) == [512, 600, 700, 800, 4096]
    assert len(captured) == 5 and replayed == [m.backend.pf_graphs[600].graph]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama", "tiny-gemma3"])
def test_later_projections_of_one_input_run_beside_the_first(name, monkeypatch):
    """A decode ``matmuls`` whose weights take several launches (Q4_K_M: Q/K
    stacked, then V in Q6_K) launches each after the first with
    GEMV_LATE_WAIT (launchers/gemv.py overlap=): it reads the same x and
    waits for the launch before only at its end. The first launch, every
    other GEMV and prefill wait as always; OVERLAP_RUNS off, none does."""
    import engine.backends.cuda as cuda_backend
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    def step(on):
        monkeypatch.setattr(cuda_backend, "OVERLAP_RUNS", on)
        dev = RecordingDevice()
        m = Model(_path(name), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
        m.forward(list(range(1, 9)))
        first = len(dev.launches)
        m.decode_next(4)
        return m, [k for k, *_ in dev.launches[first:]], [k for k, *_ in dev.launches[:first]]

    m, launches, prefill = step(True)
    late = [i for i, k in enumerate(launches) if k.defines.get("GEMV_LATE_WAIT")]
    assert late and not any(k.defines.get("GEMV_LATE_WAIT") for k in prefill)
    for i in late:  # right after a GEMV of the same step's attention input, never first
        assert launches[i][1].startswith("gemv_") and launches[i - 1][1].startswith("gemv_")
        assert not launches[i - 1].defines.get("GEMV_LATE_WAIT")
    assert len(late) == sum(1 for il in range(m.config.n_layer)
                            if len({m.layers[il].wq.qtype, m.layers[il].wk.qtype, m.layers[il].wv.qtype}) > 1)
    _, unlaunched, _ = step(False)  # (and the heads their own launch in every layer: len(late) more)
    assert len(unlaunched) == len(launches) + len(late)
    assert not any(k.defines.get("GEMV_LATE_WAIT") for k in unlaunched)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_the_v_gemv_forms_the_heads(name, monkeypatch):
    """A decode step's layers whose V is a GEMV launch of its own (another
    type than Q/K) launch no qk_norm_rope or rope: the V GEMV, beside the
    Q/K GEMV, forms the heads after its wait (gemv.cu GEMV_HEADS), given the
    Q/K GEMV's outputs and (qwen3, gemma3) the norm weights. The other
    layers launch them as before; with HEADS_IN_GEMV off, every layer does."""
    import engine.backends.cuda as cuda_backend
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    def step():
        dev = RecordingDevice()
        m = Model(_path(name), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
        m.forward([1, 2, 3])
        first = len(dev.launches)
        launched, launch = [], dev.launch

        def spy(fn, grid, block, args, shared=0):
            launched.append((fn[1], args))
            return launch(fn, grid, block, args, shared)

        dev.launch = spy
        m.decode_next(4)
        return m, launched

    m, launched = step()
    cfg = m.config
    apart = [i for i, w in enumerate(m.layers)
             if cuda_backend._stack((w.wq, w.wk, w.wv), (w.bq, w.bk, w.bv)) is False]
    assert apart, f"{name}: no layer with a V GEMV of its own to test"
    formed = [(i, args) for i, (k, args) in enumerate(launched) if k.startswith("gemv_heads_")]
    separate = [k for k, _ in launched if k.startswith(("qk_norm_rope", "rope_"))]
    assert len(formed) == len(apart) and len(separate) == cfg.n_layer - len(apart), (formed, separate)
    for i, args in formed:
        qk = launched[i - 1]  # the Q/K GEMV, launched right before
        assert qk[0].startswith("gemv_") and args[8].ptr == qk[1][2].ptr, "the heads are the Q/K GEMV's output"
        assert args[9].ptr == args[8].ptr + 4 * cfg.n_head * cfg.head_dim  # K after Q
        assert args[11:13] == (cfg.n_head, cfg.n_head_kv) or list(args[11:13]) == [cfg.n_head, cfg.n_head_kv]
        assert hasattr(args[18], "ptr") == cfg.qk_norm, "the norm weights where the model has Q/K norms"
    monkeypatch.setattr(cuda_backend, "HEADS_IN_GEMV", False)
    m, launched = step()
    assert not any(k.startswith("gemv_heads_") for k, _ in launched)
    assert sum(k.startswith(("qk_norm_rope", "rope_")) for k, _ in launched) == cfg.n_layer


def test_a_held_gemv_launches_before_any_other_operator():
    """The V GEMV that matmuls holds back is launched as it was (beside the
    Q/K GEMV, no heads) before any operator but the heads' own, and at the
    end of a pass; heads it would write itself are not folded."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    dev = RecordingDevice()
    m = Model(_path("tiny-qwen3"), backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
    m.forward([1, 2])
    ops = m.ops
    w = next(w for w in m.layers if w.wv.qtype != w.wk.qtype)
    x = ops._ops._empty((1, m.config.n_embd))
    kernels = lambda before: [k for (_, k), *_ in dev.launches[before:]]

    before = len(dev.launches)
    q, k, v = ops.matmuls(x, (w.wq, w.wk, w.wv))
    assert len(kernels(before)) == 1  # Q/K only
    ops.add(v, v)
    assert kernels(before)[1:] == ["gemv_q6_k", "add"]

    before = len(dev.launches)
    q, k, v = ops.matmuls(x, (w.wq, w.wk, w.wv))
    ops.settle()
    assert kernels(before)[1:] == ["gemv_q6_k"]

    before = len(dev.launches)
    q, k, v = ops.matmuls(x, (w.wq, w.wk, w.wv))
    rot = m.cache.layers[0].rope(m.backend.inputs(np.array([5]), 5)[1])
    hd = m.config.head_dim
    ops.rope(rot, q.reshape(1, q.size // hd, hd), v.reshape(1, v.size // hd, hd))  # V: the held GEMV's own output
    assert kernels(before)[1:] == ["gemv_q6_k", "rope_neox", "rope_neox"]  # launched first; then each rotated


def test_float_expert_weights_reach_the_grouped_gemm_aligned():
    """F32 expert tensors (the MoE F32 twins) start 32-byte aligned on the
    device, as the grouped expert GEMM's float rows need: a prefill of one
    runs its launchers' checks (the recording device) without a refusal."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    for name in ("tiny-gemma4moe-f32", "tiny-qwen3moe-f32"):
        m = Model(_path(name), backend="cuda", eager=True, device=RecordingDevice(), cublas=RecordingCublas())
        assert all(w.data.ptr % 32 == 0 for layer in m.layers for w in vars(layer).values()
                   if getattr(w, "n_expert", 0))
        m.forward(list(range(40)))  # 40 tokens x 2 experts: the grouped GEMM
