"""ModelConfig: everything the forward pass needs to know about a model.

``ModelConfig.from_gguf`` is the only place in Anvil that reads GGUF metadata
keys. It follows llama.cpp's loader (``src/llama-model.cpp``) key for key,
including its defaults, so a file means the same thing here as there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from .errors import GGUFError
from .gguf_file import GGUFFile
from .models import FAMILIES

SUPPORTED_ARCHS = tuple(FAMILIES)  # every architecture some family module runs

HYBRID_ARCHS = ("qwen35", "qwen35moe")  # Gated DeltaNet + gated attention (architectures.md §5)

ROPE_NORM = "norm"  # rotate consecutive pairs (2i, 2i+1): llama
ROPE_NEOX = "neox"  # rotate (i, i + n_rot/2): qwen2, qwen3, gemma3


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-Experts FFN (architectures.md §0.6, §3): a router over
    ``n_expert`` SwiGLU experts of width ``n_ff_exp``, ``n_expert_used`` per token."""
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    norm_topk: bool  # renormalise the chosen experts' weights to sum 1 (qwen3moe: always)
    n_ff_shexp: int = 0  # a shared expert of this width beside the routed ones, gated per token (qwen35moe)
    activation: str = "silu"  # the experts' GLU: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: gemma4)
    expert_scale: bool = False  # a per-expert scale on the down projection's output (gemma4's ffn_down_exps.scale)


@dataclass(frozen=True)
class SSMConfig:
    """Gated DeltaNet linear attention (architectures.md §5.4): ``n_v_heads``
    value heads of width ``head_v``, each reading key head ``h mod n_k_heads``
    (width ``head_k``), a causal depthwise conv of ``d_conv`` taps over q, k, v."""
    d_conv: int     # ssm.conv_kernel
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    head_k: int     # ssm.state_size
    head_v: int     # ssm.inner_size / time_step_rank

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v

    @property
    def conv_dim(self) -> int:  # q, k and v side by side
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class LayerShape:
    """What differs between the layers of one model (gemma4: sliding and full
    layers have their own head width, KV heads and RoPE). ``ModelConfig.layer(il)``
    is the config with these in place."""
    head_dim: int
    n_head_kv: int
    n_rot: int
    has_rope_freqs: bool  # the frequency-divisor tensor applies to this layer's RoPE
    v_from_k: bool        # no attn_v: the values are the K projection (gemma4's full layers)
    out_scale: bool       # a layer_output_scale scalar multiplies the layer's output


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/value head dimension
    n_ff: int
    n_rot: int
    rope_type: str
    rms_eps: float
    # per layer: RoPE base and frequency scale (gemma3 SWA layers differ)
    rope_base: tuple[float, ...]
    rope_scale: tuple[float, ...]
    has_rope_freqs: bool  # llama-3.1 style frequency divisors tensor
    # per layer: sliding-window size, 0 = full causal attention
    swa_window: tuple[int, ...]
    attn_scale: float  # multiplies q·k
    embd_scale: float  # multiplies the token embedding (gemma: sqrt(n_embd)), 1.0 otherwise
    final_softcap: float  # 0 = none
    activation: str  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    qk_norm: bool  # per-head RMSNorm on Q and K before RoPE (qwen3, gemma3)
    post_norms: bool  # RMSNorm on attention and FFN outputs (gemma3)
    qkv_bias: bool
    output_bias: bool
    tied_output: bool  # head reuses token_embd
    bos_token_id: int | None
    eos_token_id: int | None
    moe: MoEConfig | None = None  # the MoE group, for architectures with routed experts
    ssm: SSMConfig | None = None  # the Gated DeltaNet group, for hybrids (qwen35)
    recurrent: tuple[bool, ...] = ()  # per layer: a recurrent (DeltaNet) layer rather than softmax attention
    attn_gate: bool = False  # the Q projection interleaves a sigmoid output gate per head (qwen35)
    v_norm: bool = False  # V is RMS-normed per head without a weight (gemma4)
    v_from_k: bool = False  # see LayerShape (per layer: read through layer(il))
    out_scale: bool = False  # see LayerShape
    layer_shapes: tuple[LayerShape, ...] = ()  # per layer, where layers differ; () = all alike

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def layer(self, il: int) -> "ModelConfig":
        """The config as layer ``il`` sees it: its own ``LayerShape`` in place
        (the config itself when every layer is alike)."""
        return self._layer_views[il] if self.layer_shapes else self

    @cached_property
    def _layer_views(self) -> tuple["ModelConfig", ...]:
        return tuple(replace(self, layer_shapes=(), head_dim=s.head_dim, n_head_kv=s.n_head_kv, n_rot=s.n_rot,
                             has_rope_freqs=s.has_rope_freqs, v_from_k=s.v_from_k, out_scale=s.out_scale)
                     for s in self.layer_shapes)

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "ModelConfig":
        arch = gf.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise GGUFError(gf.path, f"unsupported architecture '{arch}' (key general.architecture; supported: {', '.join(SUPPORTED_ARCHS)})")

        def key(name, default=...):
            full = f"{arch}.{name}"
            return gf.get(full) if default is ... else gf.get(full, default)

        def positive_int(name, value):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                stored = "" if isinstance(value, int) else f" (stored as {type(value).__name__})"
                raise GGUFError(gf.path, f"key '{arch}.{name}' must be a positive integer, got {value!r}{stored}")
            return value

        def real(name, value, *, zero_ok=False):
            """A float key (llama.cpp reads these as FLOAT32 only) that is
            finite and positive (or zero, where zero means "none")."""
            if isinstance(value, bool) or not isinstance(value, float):
                raise GGUFError(gf.path, f"key '{arch}.{name}' must be a float32, got {value!r} "
                                         f"({type(value).__name__})")
            if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
                raise GGUFError(gf.path, f"key '{arch}.{name}' must be finite and "
                                         f"{'>= 0' if zero_ok else '> 0'}, got {value!r}")
            return value

        n_embd = positive_int("embedding_length", key("embedding_length"))
        n_layer = positive_int("block_count", key("block_count"))
        # multi-token-prediction blocks (Qwen3.5's MTP) are counted in block_count but come after
        # the model's layers and are not part of its forward pass (llama_hparams::n_layer()): not run
        n_mtp = key("nextn_predict_layers", 0)
        if isinstance(n_mtp, bool) or not isinstance(n_mtp, int) or not 0 <= n_mtp < n_layer:
            raise GGUFError(gf.path, f"key '{arch}.nextn_predict_layers' must be an integer in 0..{n_layer - 1} "
                                     f"(block_count - 1), got {n_mtp!r}")
        n_layer -= n_mtp
        n_head = positive_int("attention.head_count", _scalar(gf, f"{arch}.attention.head_count", key("attention.head_count")))
        heads_kv = key("attention.head_count_kv", n_head)
        if arch == "gemma4" and isinstance(heads_kv, list):  # per layer: read in _gemma4
            heads_kv = heads_kv[0] if heads_kv else None
        n_head_kv = positive_int("attention.head_count_kv", _scalar(gf, f"{arch}.attention.head_count_kv", heads_kv))
        if n_head % n_head_kv:
            raise GGUFError(gf.path, f"key '{arch}.attention.head_count' ({n_head}) is not a multiple of head_count_kv ({n_head_kv})")
        n_ff = positive_int("feed_forward_length", _scalar(gf, f"{arch}.feed_forward_length", key("feed_forward_length")))
        head_dim = positive_int("attention.key_length", key("attention.key_length", n_embd // n_head))
        head_dim_v = key("attention.value_length", head_dim)
        if head_dim_v != head_dim:
            raise GGUFError(gf.path, f"key '{arch}.attention.value_length' ({head_dim_v}) != key_length ({head_dim}): unsupported")
        n_rot = key("rope.dimension_count", head_dim)
        if arch in HYBRID_ARCHS:  # partial rotation: the first n_rot dims of each head
            if isinstance(n_rot, bool) or not isinstance(n_rot, int) or not 0 < n_rot <= head_dim or n_rot % 2:
                raise GGUFError(gf.path, f"key '{arch}.rope.dimension_count' must be an even integer in 2..{head_dim} "
                                         f"(the head dim), got {n_rot!r}")
        elif n_rot != head_dim:
            # llama.cpp itself refuses this for llama; the other three are never partial
            raise GGUFError(gf.path, f"key '{arch}.rope.dimension_count' ({n_rot}) != head dim ({head_dim}): partial RoPE unsupported")
        rms_eps = real("attention.layer_norm_rms_epsilon", key("attention.layer_norm_rms_epsilon"))

        n_vocab = gf.array_len("tokenizer.ggml.tokens") or key("vocab_size", None)
        if n_vocab is None:
            n_vocab = gf.tensor_shape("token_embd.weight")[0]

        # RoPE frequency scaling: llama.cpp's default type is linear with
        # factor 1; YaRN and LongRoPE are not implemented here.
        scaling = key("rope.scaling.type", "linear")
        if scaling not in ("none", "linear"):
            raise GGUFError(gf.path, f"key '{arch}.rope.scaling.type' = '{scaling}' is not supported (only none/linear)")
        factor = real("rope.scaling.factor", key("rope.scaling.factor", key("rope.scale_linear", 0.0)), zero_ok=True)
        freq_scale = 1.0 if scaling == "none" or not factor else 1.0 / float(factor)
        freq_base = real("rope.freq_base", key("rope.freq_base", 10000.0))

        swa_window = [0] * n_layer
        rope_base = [freq_base] * n_layer
        rope_scale = [freq_scale] * n_layer
        attn_scale = 1.0 / math.sqrt(head_dim)
        embd_scale, softcap, activation = 1.0, 0.0, "silu"
        if arch == "gemma3":
            window = key("attention.sliding_window", 0)
            if isinstance(window, bool) or not isinstance(window, int) or window < 0:
                raise GGUFError(gf.path, f"key '{arch}.attention.sliding_window' must be a non-negative integer, "
                                         f"got {window!r}")
            if window:
                swa = _gemma3_swa_pattern(gf, arch, n_layer)
                base_swa = real("rope.freq_base_swa", key("rope.freq_base_swa", 10000.0))
                for il in range(n_layer):
                    if swa[il]:
                        # SWA layers use their own base and never scale (llama_model::get_rope_freq_*)
                        swa_window[il], rope_base[il], rope_scale[il] = int(window), base_swa, 1.0
            # the 27B model scales by n_embd/n_head (integer division) instead of head_dim
            attn_scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else head_dim)
            embd_scale = math.sqrt(n_embd)
            softcap = real("final_logit_softcapping", key("final_logit_softcapping", 0.0), zero_ok=True)
            activation = "gelu_tanh"

        gemma4 = {}
        if arch == "gemma4":
            gemma4 = _gemma4(gf, arch, key, positive_int, real, n_layer, n_head, head_dim, n_rot, freq_base, freq_scale)
            swa_window, rope_base, rope_scale = gemma4.pop("swa_window"), gemma4.pop("rope_base"), gemma4.pop("rope_scale")
            attn_scale = 1.0  # the Q/K norms replace 1/sqrt(d) (f_attention_scale = 1.0)
            embd_scale = math.sqrt(n_embd)
            # absent, the key keeps llama.cpp's default of 30 (gemma4 does not reset it, unlike gemma3)
            softcap = real("final_logit_softcapping", key("final_logit_softcapping", 30.0), zero_ok=True)
            activation = "gelu_tanh"

        moe = None
        if arch == "gemma4" and gf.has_tensor("blk.0.ffn_gate_inp.weight"):
            if gf.has_tensor("blk.0.ffn_gate_up_exps.weight"):
                raise GGUFError(gf.path, "tensor 'blk.0.ffn_gate_up_exps.weight' (merged gate/up experts) is not "
                                         "supported; convert with separate ffn_gate_exps and ffn_up_exps")
            n_expert = positive_int("expert_count", key("expert_count"))
            n_used = positive_int("expert_used_count", key("expert_used_count"))
            if n_used > n_expert:
                raise GGUFError(gf.path, f"key '{arch}.expert_used_count' ({n_used}) exceeds expert_count ({n_expert})")
            n_ff_exp = positive_int("expert_feed_forward_length",
                                    _scalar(gf, f"{arch}.expert_feed_forward_length", key("expert_feed_forward_length")))
            # build_moe_ffn with norm_w = true, GELU experts; the dense FFN runs beside them
            moe = MoEConfig(n_expert, n_used, n_ff_exp, norm_topk=True, activation="gelu_tanh",
                            expert_scale=gf.has_tensor("blk.0.ffn_down_exps.scale"))
        if arch in ("qwen3moe", "qwen35moe"):
            n_expert = positive_int("expert_count", key("expert_count"))
            n_used = positive_int("expert_used_count", key("expert_used_count"))
            if n_used > n_expert:
                raise GGUFError(gf.path, f"key '{arch}.expert_used_count' ({n_used}) exceeds expert_count ({n_expert})")
            n_ff_exp = positive_int("expert_feed_forward_length",
                                    _scalar(gf, f"{arch}.expert_feed_forward_length",
                                            key("expert_feed_forward_length", n_ff // n_used)))
            # llama.cpp hard-codes norm_w = true for both (HF's norm_topk_prob is not read)
            n_ff_shexp = 0
            if arch == "qwen35moe":
                n_ff_shexp = positive_int("expert_shared_feed_forward_length",
                                          key("expert_shared_feed_forward_length", n_ff))
            moe = MoEConfig(n_expert, n_used, n_ff_exp, norm_topk=True, n_ff_shexp=n_ff_shexp)

        ssm, recurrent = None, [False] * n_layer
        if arch in HYBRID_ARCHS:
            ssm, recurrent = _deltanet(gf, arch, key, positive_int, n_layer)

        fields = dict(
            arch=arch, moe=moe, ssm=ssm, recurrent=tuple(recurrent), attn_gate=arch in HYBRID_ARCHS, n_vocab=int(n_vocab), n_ctx_train=positive_int("context_length", key("context_length")),
            n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
            n_ff=n_ff, n_rot=n_rot, rope_type=ROPE_NORM if arch == "llama" else ROPE_NEOX, rms_eps=rms_eps,
            rope_base=tuple(rope_base), rope_scale=tuple(rope_scale),
            has_rope_freqs=arch == "llama" and gf.has_tensor("rope_freqs.weight"),
            swa_window=tuple(swa_window), attn_scale=attn_scale, embd_scale=embd_scale,
            final_softcap=softcap, activation=activation,
            qk_norm=arch in ("qwen3", "qwen3moe", "gemma3", "gemma4", *HYBRID_ARCHS),
            post_norms=arch in ("gemma3", "gemma4"), v_norm=arch == "gemma4",
            qkv_bias=gf.has_tensor("blk.0.attn_q.bias"),
            output_bias=arch == "qwen2" and gf.has_tensor("output.bias"),
            tied_output=not gf.has_tensor("output.weight"),
            bos_token_id=gf.get("tokenizer.ggml.bos_token_id", None),
            eos_token_id=gf.get("tokenizer.ggml.eos_token_id", None),
        )
        return cls(**fields | gemma4)


def _deltanet(gf: GGUFFile, arch: str, key, positive_int, n_layer: int) -> tuple[SSMConfig, list[bool]]:
    """The Gated DeltaNet group and which layers are recurrent
    (llama_model_qwen35::load_arch_hparams): ``attention.recurrent_layers``
    (a bool per layer) if present, else layer il is recurrent iff
    (il + 1) % full_attention_interval != 0."""
    d_conv = positive_int("ssm.conv_kernel", key("ssm.conv_kernel"))
    d_inner = positive_int("ssm.inner_size", key("ssm.inner_size"))
    head_k = positive_int("ssm.state_size", key("ssm.state_size"))
    n_v = positive_int("ssm.time_step_rank", key("ssm.time_step_rank"))
    n_k = positive_int("ssm.group_count", key("ssm.group_count"))
    if d_inner % n_v or n_v % n_k:
        raise GGUFError(gf.path, f"key '{arch}.ssm.inner_size' ({d_inner}) must be a multiple of time_step_rank "
                                 f"({n_v}), and that of group_count ({n_k})")
    if d_inner // n_v != head_k:  # llama.cpp's fused and chunked paths both assert it
        raise GGUFError(gf.path, f"value head width {d_inner // n_v} (ssm.inner_size / time_step_rank) != "
                                 f"key head width {head_k} (key '{arch}.ssm.state_size'): unsupported")
    sections = key("rope.dimension_sections")  # required by llama.cpp; text positions use none of them
    if not isinstance(sections, list) or len(sections) != 4 or any(isinstance(v, bool) or not isinstance(v, int)
                                                                    or v < 0 for v in sections):
        raise GGUFError(gf.path, f"key '{arch}.rope.dimension_sections' must be 4 non-negative integers, got {sections!r}")
    layers = key("attention.recurrent_layers", None)
    if layers is not None:
        if not isinstance(layers, list) or len(layers) < n_layer:
            raise GGUFError(gf.path, f"key '{arch}.attention.recurrent_layers' must list {n_layer} layers")
        recurrent = [bool(v) for v in layers[:n_layer]]
    else:
        interval = positive_int("full_attention_interval", key("full_attention_interval", 4))
        recurrent = [(il + 1) % interval != 0 for il in range(n_layer)]
    return SSMConfig(d_conv, n_k, n_v, head_k, d_inner // n_v), recurrent


def _gemma4(gf: GGUFFile, arch: str, key, positive_int, real, n_layer: int, n_head: int, head_dim: int,
            n_rot: int, freq_base: float, freq_scale: float) -> dict:
    """Gemma 4's layers (llama_model_gemma4::load_arch_hparams, architectures.md §6.1): a required
    bool per layer saying which slide (``attention.sliding_window_pattern``), each kind with its
    own head width (``key_length_swa`` on sliding layers), KV heads (``head_count_kv``, a
    per-layer array) and RoPE: sliding layers ``rope.freq_base_swa`` (default 1e4) unscaled,
    full ones ``rope.freq_base`` with the ``rope_freqs`` divisors (proportional RoPE).
    Returns the ModelConfig fields they set."""
    def per_layer(name, value):
        if isinstance(value, list):
            if len(value) < n_layer:
                raise GGUFError(gf.path, f"key '{arch}.{name}' has {len(value)} entries for {n_layer} layers")
            return [positive_int(name, v) for v in value[:n_layer]]
        return [positive_int(name, value)] * n_layer

    pattern = key("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) < n_layer or not all(isinstance(v, bool) for v in pattern):
        raise GGUFError(gf.path, f"key '{arch}.attention.sliding_window_pattern' must be a bool per layer "
                                 f"({n_layer}), got {pattern!r}"[:300])
    swa = pattern[:n_layer]
    window = positive_int("attention.sliding_window", key("attention.sliding_window"))
    for name in ("attention.shared_kv_layers", "embedding_length_per_layer_input"):
        value = key(name, 0)
        if value != 0:  # E2B/E4B features: KV sharing, per-layer embeddings
            raise GGUFError(gf.path, f"key '{arch}.{name}' = {value!r}: only 0 is supported")
    if gf.has_tensor("blk.0.attn_qkv.weight"):
        raise GGUFError(gf.path, "tensor 'blk.0.attn_qkv.weight' (fused QKV) is not supported for gemma4")
    head_swa = positive_int("attention.key_length_swa", key("attention.key_length_swa"))
    if key("attention.value_length_swa") != head_swa:
        raise GGUFError(gf.path, f"key '{arch}.attention.value_length_swa' must equal key_length_swa ({head_swa})")
    # partial rotation is written as frequency divisors (1e30 = unrotated), never as a short n_rot
    rot_swa = key("rope.dimension_count_swa", n_rot)
    if n_rot != head_dim or rot_swa != head_swa:
        raise GGUFError(gf.path, f"keys '{arch}.rope.dimension_count' ({n_rot}) and rope.dimension_count_swa "
                                 f"({rot_swa}) must equal the head widths {head_dim} and {head_swa}")
    heads_kv = per_layer("attention.head_count_kv", key("attention.head_count_kv", n_head))
    for il, h in enumerate(heads_kv):
        if n_head % h:
            raise GGUFError(gf.path, f"key '{arch}.attention.head_count' ({n_head}) is not a multiple of "
                                     f"head_count_kv ({h}) of layer {il}")
    base_swa = real("rope.freq_base_swa", key("rope.freq_base_swa", 10000.0))
    shapes = tuple(LayerShape(head_dim=head_swa if swa[il] else head_dim, n_head_kv=heads_kv[il],
                              n_rot=head_swa if swa[il] else head_dim, has_rope_freqs=not swa[il],
                              v_from_k=not gf.has_tensor(f"blk.{il}.attn_v.weight"),
                              out_scale=gf.has_tensor(f"blk.{il}.layer_output_scale.weight"))
                   for il in range(n_layer))
    full = [il for il in range(n_layer) if not swa[il]]
    return {"layer_shapes": shapes, "has_rope_freqs": bool(full),
            "n_head_kv": heads_kv[full[0]] if full else heads_kv[0],
            "swa_window": [window if s else 0 for s in swa],
            "rope_base": [base_swa if s else freq_base for s in swa],
            "rope_scale": [1.0 if s else freq_scale for s in swa]}


def _scalar(gf: GGUFFile, full_key: str, value):
    """Per-layer arrays (allowed by llama.cpp for some keys) must be uniform here."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise GGUFError(gf.path, f"key '{full_key}' varies per layer ({value[:8]}...): unsupported")
        return value[0]
    return value


def _gemma3_swa_pattern(gf: GGUFFile, arch: str, n_layer: int) -> list[bool]:
    """Which layers use the sliding window (llama_hparams::set_swa_pattern).

    The key may be a bool array (one per layer) or a period n: layer il is SWA
    iff il % n < n - 1. Converted Gemma 3 files carry no key: period 6.
    """
    pattern = gf.get(f"{arch}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) < n_layer:
            raise GGUFError(gf.path, f"key '{arch}.attention.sliding_window_pattern' has {len(pattern)} entries for {n_layer} layers")
        return [bool(p) for p in pattern[:n_layer]]
    n = int(pattern)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]
