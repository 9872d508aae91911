"""Random-weight GGUF files at real model shapes ("synthetic models").

Quantised tensors are written directly as random blocks whose scale fields are
set so the dequantised weights have zero mean and std ~ GAIN/sqrt(fan_in); no
float weights are ever quantised, so an 8B-shaped file streams out at the speed
of the random generator. All tokenizer.* metadata is copied byte for byte from
a vocab source GGUF (a real model or a llama.cpp vocab-only file).

Determinism: every byte comes from PCG64 raw output (a fixed algorithm, stable
across NumPy versions) seeded by (seed, crc32(tensor name), chunk index), and is
then transformed only with integer ops and elementwise IEEE float32 arithmetic
(no reductions), so (preset, seed, vocab file) -> the same sha256 on any
little-endian machine. The only libm calls (pow for rope_freqs, exp for the
gemma3 head row scales) run in float64 and are rounded to float32, so a
last-ulp libm difference practically never reaches the file.

The GGUF container is serialised here rather than with gguf.GGUFWriter:
GGUFReader needs 6-13 s to parse a vocab file and GGUFWriter packs arrays item
by item and wants whole tensors in memory; a raw KV copy plus a chunked data
stream avoids all three. The layout is GGUF v3 (gguf.GGUF_MAGIC/VERSION).
"""
from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf import LlamaFileType as FT

from .atomic import atomic_open
from .config import ModelConfig, MoEConfig
from .gguf_file import GGUFFile
from .models import family
from .models.weights import GLOBAL

GAIN = 1.0           # weight std = GAIN/sqrt(fan_in): unit-RMS inputs give O(1) outputs
EMBD_STD = 1.0       # x0 (the embedded token) has RMS 1, like one layer's contribution
NORM_JITTER = 0.1    # norm weights uniform in 1 +- 0.1*sqrt(3) (std 0.1), stored as is
BIAS_STD = 0.5       # qwen2 q/k/v biases
TARGET_MARGIN = 1.5  # wanted median top-2 logit gap (see _logit_std)
CHUNK_BYTES = 16 << 20  # generation chunk; part of the seed schedule, never change


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str                 # a family's architecture (engine/models)
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    context_length: int
    rope_freq_base: float
    rms_eps: float
    vocab: str                # smollm2 | gemma3 | qwen2 | llama-bpe
    mix: str | tuple          # "Q4_K_M" or ((role, type name), ...)
    file_type: int            # general.file_type (LlamaFileType)
    tied: bool = False        # no output.weight: the head reuses token_embd
    qkv_bias: bool = False    # qwen2
    rope_freqs: bool = False  # llama-3.1 frequency factors tensor
    sliding_window: int = 0   # gemma3: layers il % 6 < 5 are SWA
    rope_freq_base_swa: float = 0.0
    softcap: float = 0.0      # gemma3 final_logit_softcapping
    logit_std: float | None = None  # pre-softcap logit std; None -> napkin formula
    head_row_sigma: float = 0.0     # log-normal spread of head row norms
    n_expert: int = 0               # MoE (qwen3moe): experts per layer, used per token, expert FFN width
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0             # qwen35moe: the shared expert's width
    # std of the router logits: at 1, the top-k of many experts share the weight almost evenly, so
    # a rounding-sized near-tie at the k-th place swaps 1/k of the FFN output and every
    # implementation (llama.cpp's own settings included) drifts apart within a few tokens; larger,
    # the weight sits on the first few experts, as in trained routers, and a swap at the k-th
    # place moves the output little
    router_gain: float = 1.0
    # A routing code (the untied MoE presets): the last route_code dims of the residual stream carry each
    # token's choice of experts and nothing else, so every engine routes a token alike. The
    # embedding writes ROUTE_CODE_AMP into the dims of n_expert_used experts picked per token
    # (0 in the rest of the code dims); no layer writes the code dims (their rows of every
    # residual-writing matrix are 0; the norms carry 1 there); each router reads its own
    # expert's code dim (route_code_gain) beside its random weights on the other dims.
    # The chosen experts then lead the rest by a set number of logits at every layer, and
    # the random part still weighs them by context. At router gain 1 the k-th and (k+1)-th
    # of 128 experts part by 0.0008 logits or less on 1% of tokens, and rounding re-routes
    # them (reports/notes/cuda-gate-2026-12-04.md §13).
    route_code: int = 0
    # A bias region (the hybrids): the bias_dims dims before the routing code hold BIAS_AMP in
    # every token's embedding and nothing else (no layer writes them; like the "massive
    # activations" of trained models, a constant the layers read as a bias). Only the DeltaNet
    # layers' attn_norm passes them (1 there, 0 in every other norm), and their in-projection
    # reads them as biases: the queries and keys get a shared positive direction (so every key
    # meets a query at a steady angle) and the output gate SiLU(z) a positive offset (a gate that
    # passes, as trained ones mostly do). Random DeltaNet weights otherwise amplify rounding
    # noise 2.5-4x past a dense stack's: q·k of random unit vectors is ~0 and the RMSNorm of
    # Sᵀq scales that near-cancellation back up (reports/notes/cuda-gate-2026-12-04.md §16).
    bias_dims: int = 0
    n_rot: int = 0                  # rotated dims per head (0: all); qwen35 rotates a quarter
    ssm_d_conv: int = 0             # Gated DeltaNet (qwen35): conv taps, key / value heads, head width
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_head: int = 0
    full_attention_interval: int = 0
    # gemma4: sliding layers have heads of head_dim_swa and n_head_kv_swa KV heads (head_dim and
    # n_head_kv are the full layers'); layer il is full iff il % swa_period == swa_period - 1 or
    # it is the last; full layers rotate rope_partial of their dims (through rope_freqs) and have
    # no attn_v; out_scale: a layer_output_scale per layer
    head_dim_swa: int = 0
    n_head_kv_swa: int = 0
    swa_period: int = 0
    rope_partial: float = 0.0
    out_scale: bool = False


_TINY = dict(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)
# The tiny MoE models route by a code (Preset.route_code): with random routers of std 1 the second
# and third of 8 experts near-tie somewhere in every prompt, and a rounding-sized difference
# re-routes a token (reports/notes/cuda-gate-2026-12-04.md §3, §13, §15).
# The routing code (Preset.route_code): the code's value in a chosen expert's dim of the embedding
# (the embedding's other dims have RMS 1), and the chosen experts' lead in router logits at every
# layer. The router reads the code through an RMSNorm, so its weight on the code grows with depth
# as the residual stream's RMS does in these files (residual_rms2), which keeps the lead within
# ~20% of ROUTE_CODE_LEAD. The routers' random part has std 0.5 (their
# router_gain): the chosen set then parts from the rest by ~2-3 logits at the worst of 128-256
# experts (rounding moves a router logit by hundredths to tenths), and the experts left out keep
# 2-10% of the softmax's weight, as in trained routers, so the top-k renormalisation still shows.
ROUTE_CODE_AMP = 2.0
ROUTE_CODE_LEAD = 5.0


def residual_rms2(p: "Preset", il: int) -> float:
    """The residual stream's RMS² where layer ``il``'s router reads it. Fits to the NumPy engine's
    residual: 1.2 + 0.5·layer where the sublayers add their raw outputs (1.06-1.40 +
    0.39-0.69·layer over the tiny and real-shape qwen MoE presets); 1.75 + 2.4·layer in gemma4,
    whose post-norms add each sublayer's output at RMS ~1, two a layer (tiny-gemma4moe:
    1.75, 3.9, 6.0, 9.0 over its four layers)."""
    return 1.75 + 2.4 * il if p.arch == "gemma4" else 1.2 + 0.5 * il


def route_code_gain(p: "Preset", il: int) -> float:
    """The router's weight on its expert's code dim in layer ``il`` (times ``router_input_gain``)."""
    return ROUTE_CODE_LEAD * math.sqrt(residual_rms2(p, il)) / ROUTE_CODE_AMP


def router_input_gain(p: "Preset") -> float:
    """What the router's weights carry beyond a plain GEMV's: gemma4's router reads its input
    scaled by 1/sqrt(n_embd), so its weights carry sqrt(n_embd) back (or its logits, of std
    1/sqrt(n_embd), near-tie everywhere and any rounding re-routes tokens)."""
    return math.sqrt(p.n_embd) if p.arch == "gemma4" else 1.0


# The bias region (Preset.bias_dims): its value in the embedding; the biases it gives the DeltaNet
# in-projection in units of the random part's std (1): BIAS_QK·(0.5..1.5 per head dim) on the
# queries and keys alike, signed by their conv channel's tap sum so that both are positive after
# the conv, and BIAS_Z on the output gate; and the gain of ssm_norm, which keeps the layer's
# write (now ~4·RMSNorm(o) through SiLU(z)) near twice the random layer's. Measured on narrow
# proxies against the exact NumPy engine (§16): the rounding-faithful engine's median spread fell
# from 2.5x the dense proxy's to 0.98x (qwen35-9b), to 1.10x (qwen36-27b), and with the routing
# code from 7.8x to 0.86x (qwen36-35b-a3b).
BIAS_AMP = 1.0
BIAS_QK = 4.0
BIAS_Z = 4.0
BIAS_DN_GAIN = 0.3


def bias_rms(il: int) -> float:
    """The residual stream's RMS entering layer ``il`` of a file with a bias region (its readers'
    weights grow with it, as route_code_gain's do): RMS² grows by ~1 a layer there, the DeltaNet
    layers writing ~1.2 (fits to the NumPy engine's residual over tiny-qwen35 and proxies of
    qwen35-9b and qwen36-27b: 0.98-1.04 a layer past the first)."""
    return math.sqrt(1.0 + il)


# the matrices whose output is added to the residual stream: their rows in the code and bias dims are 0
_RESIDUAL_WRITERS = ("attn_output", "ffn_down", "ffn_down_exps", "ffn_down_shexp", "ssm_out")
# the DeltaNet in-projection's parts and what each reads in the bias region (_regions)
_BIAS_READERS = {"attn_qkv": "bias_qkv", "attn_gate": "bias_gate", "ssm_beta": "bias_zero", "ssm_alpha": "bias_zero"}

PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("tiny-llama", "llama", **_TINY, context_length=131072, rope_freq_base=500000.0,
           rms_eps=1e-5, vocab="smollm2", rope_freqs=True, file_type=FT.MOSTLY_Q4_0,
           mix=(("token_embd", "Q4_1"), ("output", "Q8_0"), ("attn_q", "Q4_0"), ("attn_k", "Q4_0"),
                ("attn_v", "Q8_0"), ("attn_output", "Q5_1"), ("ffn_gate", "Q4_0"),
                ("ffn_up", "Q4_0"), ("ffn_down", "Q5_1"))),
    Preset("tiny-qwen2", "qwen2", **_TINY, context_length=32768, rope_freq_base=1e6, rms_eps=1e-6,
           vocab="qwen2", qkv_bias=True, file_type=FT.MOSTLY_Q5_0,
           mix=(("token_embd", "Q5_0"), ("output", "Q8_0"), ("attn_q", "Q5_0"), ("attn_k", "Q5_0"),
                ("attn_v", "Q8_0"), ("attn_output", "F16"), ("ffn_gate", "Q5_0"),
                ("ffn_up", "Q8_0"), ("ffn_down", "F16"))),
    Preset("tiny-qwen3", "qwen3", **_TINY, context_length=40960, rope_freq_base=1e6, rms_eps=1e-6,
           vocab="qwen2", tied=True, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M),
    # n_head*head_dim = 512 != n_embd: exercises key_length; window 8 so SWA bites on short prompts.
    # Softcap 30 caps logits near 30, so the head is set from a simulation (see _logit_std).
    Preset("tiny-gemma3", "gemma3", n_embd=256, n_layer=6, n_head=8, n_head_kv=2, head_dim=64,
           n_ff=512, context_length=32768, rope_freq_base=1e6, rms_eps=1e-6, vocab="gemma3",
           tied=True, sliding_window=8, rope_freq_base_swa=10000.0, softcap=30.0,
           logit_std=3.5, head_row_sigma=0.3, file_type=FT.MOSTLY_Q5_K_M,
           mix=(("token_embd", "Q5_K"), ("attn_q", "Q5_K"), ("attn_k", "Q5_K"), ("attn_v", "Q6_K"),
                ("attn_output", "BF16"), ("ffn_gate", "Q5_K"), ("ffn_up", "Q5_K"),
                ("ffn_down", "Q6_K"))),
    # Gemma 4: 4 sliding layers (heads of 64, 2 KV heads, window 16) and 2 full ones (heads of
    # 128, 1 KV head, no attn_v, RoPE on a quarter of each head); every layer output scaled.
    # The head is set as tiny-gemma3's (softcap 30 over the same 262144-token vocabulary).
    Preset("tiny-gemma4", "gemma4", n_embd=256, n_layer=6, n_head=4, n_head_kv=1, head_dim=128,
           n_ff=512, context_length=262144, rope_freq_base=1e6, rms_eps=1e-6, vocab="gemma-4",
           tied=True, sliding_window=16, rope_freq_base_swa=10000.0, softcap=30.0, rope_freqs=True,
           head_dim_swa=64, n_head_kv_swa=2, swa_period=3, rope_partial=0.25, out_scale=True,
           logit_std=3.5, head_row_sigma=0.3, file_type=FT.MOSTLY_Q5_K_M,
           mix=(("token_embd", "Q5_K"), ("attn_q", "Q5_K"), ("attn_k", "Q4_K"), ("attn_v", "Q6_K"),
                ("attn_output", "Q8_0"), ("ffn_gate", "Q5_K"), ("ffn_up", "Q4_K"), ("ffn_down", "Q6_K"))),
    # ...with 8 GeGLU experts of width 256 (2 per token) beside a dense MLP of 256 on every layer.
    Preset("tiny-gemma4moe", "gemma4", n_embd=256, n_layer=4, n_head=4, n_head_kv=1, head_dim=128,
           n_ff=256, context_length=262144, rope_freq_base=1e6, rms_eps=1e-6, vocab="gemma-4",
           tied=True, sliding_window=16, rope_freq_base_swa=10000.0, softcap=30.0, rope_freqs=True,
           head_dim_swa=64, n_head_kv_swa=2, swa_period=2, rope_partial=0.25, out_scale=True,
           n_expert=8, n_expert_used=2, n_ff_exp=256, route_code=32, router_gain=0.5,
           logit_std=3.5, head_row_sigma=0.3, file_type=FT.MOSTLY_Q4_K_M,
           mix=(("token_embd", "Q8_0"), ("attn_q", "Q4_K"), ("attn_k", "Q4_K"), ("attn_v", "Q6_K"),
                ("attn_output", "Q5_K"), ("ffn_gate", "Q4_K"), ("ffn_up", "Q4_K"), ("ffn_down", "Q6_K"),
                ("ffn_gate_exps", "Q4_K"), ("ffn_up_exps", "Q5_K"), ("ffn_down_exps", "Q8_0"))),
    # The 8B shapes' head is scaled past the napkin target: at its median 1.5
    # llama.cpp's CUDA references measured median top-2 margins of 1.52-1.56;
    # logit std 17 puts them near 2.5, above the decisive 2.
    # Mixture of experts: 8 SwiGLU experts of width 256, 2 per token, on every layer.
    Preset("tiny-qwen3moe", "qwen3moe", **_TINY, context_length=40960, rope_freq_base=1e6, rms_eps=1e-6,
           vocab="qwen2", n_expert=8, n_expert_used=2, n_ff_exp=256, route_code=32, router_gain=0.5,
           file_type=FT.MOSTLY_Q4_K_M,
           mix=(("token_embd", "Q8_0"), ("output", "Q8_0"), ("attn_q", "Q4_K"), ("attn_k", "Q4_K"),
                ("attn_v", "Q6_K"), ("attn_output", "Q4_K"), ("ffn_gate_exps", "Q4_K"),
                ("ffn_up_exps", "Q4_K"), ("ffn_down_exps", "Q6_K"))),
    # Gated DeltaNet hybrid: layers 0-2 recurrent (2 key / 4 value heads of 32, conv 4), layer 3
    # gated attention rotating 16 of its 64 dims.
    Preset("tiny-qwen35", "qwen35", **_TINY, context_length=262144, rope_freq_base=1e7, rms_eps=1e-6,
           vocab="qwen2", n_rot=16, ssm_d_conv=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head=32,
           full_attention_interval=4, bias_dims=32, file_type=FT.MOSTLY_Q4_K_M,
           mix=(("token_embd", "Q8_0"), ("output", "Q8_0"), ("attn_q", "Q4_K"), ("attn_k", "Q4_K"),
                ("attn_v", "Q6_K"), ("attn_output", "Q4_K"), ("attn_qkv", "Q5_0"), ("attn_gate", "Q4_0"),
                ("ssm_beta", "Q8_0"), ("ssm_alpha", "F32"), ("ssm_conv1d", "F32"), ("ssm_out", "Q8_0"),
                ("ffn_gate", "Q4_K"), ("ffn_up", "Q4_K"), ("ffn_down", "Q6_K"))),
    # ...with routed experts (8 of width 256, 2 per token) and a gated shared expert of width 256.
    Preset("tiny-qwen35moe", "qwen35moe", **_TINY, context_length=262144, rope_freq_base=1e7, rms_eps=1e-6,
           vocab="qwen2", n_rot=16, ssm_d_conv=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head=32,
           full_attention_interval=4, n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256,
           route_code=32, router_gain=0.5, bias_dims=32,
           file_type=FT.MOSTLY_Q4_K_M,
           mix=(("token_embd", "Q8_0"), ("output", "Q8_0"), ("attn_q", "Q4_K"), ("attn_k", "Q4_K"),
                ("attn_v", "Q6_K"), ("attn_output", "Q4_K"), ("attn_qkv", "Q5_0"), ("attn_gate", "Q4_0"),
                ("ssm_beta", "Q8_0"), ("ssm_alpha", "F32"), ("ssm_conv1d", "F32"), ("ssm_out", "Q8_0"),
                ("ffn_gate_exps", "Q4_K"), ("ffn_up_exps", "Q4_K"), ("ffn_down_exps", "Q6_K"),
                ("ffn_gate_shexp", "Q5_K"), ("ffn_up_shexp", "Q5_K"), ("ffn_down_shexp", "Q8_0"))),
    # The real Qwen3.5-9B text shape: 24 Gated DeltaNet layers (16 key / 32 value heads of 128,
    # conv 4) and 8 gated attention layers (16 / 4 heads of 256, rotating 64 dims), FFN 12288;
    # Q4_K_M as llama.cpp assigns it (attn_qkv Q5_K). The vocabulary is llama.cpp's qwen35 test
    # vocabulary (the qwen35 pre-tokenizer over 151936 tokens); the real model has 248320, so
    # its embedding and head are 39% smaller here (8.954B parameters at 248320, 8.164B here).
    Preset("qwen35-9b", "qwen35", n_embd=4096, n_layer=32, n_head=16, n_head_kv=4, head_dim=256,
           n_ff=12288, context_length=262144, rope_freq_base=1e7, rms_eps=1e-6, vocab="qwen35", n_rot=64,
           ssm_d_conv=4, ssm_k_heads=16, ssm_v_heads=32, ssm_head=128, full_attention_interval=4,
           bias_dims=256, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M, logit_std=17.0),
    # Qwen3.6-27B (dense hybrid: 48 DeltaNet layers of 16 key / 48 value heads, 16 gated attention
    # layers of 24 / 4 heads, FFN 17408) and Qwen3.6-35B-A3B (hybrid MoE: 30 + 10 layers, 256
    # experts of width 512, 8 per token, and a gated shared expert of 512), same vocabulary note.
    Preset("qwen36-27b", "qwen35", n_embd=5120, n_layer=64, n_head=24, n_head_kv=4, head_dim=256,
           n_ff=17408, context_length=262144, rope_freq_base=1e7, rms_eps=1e-6, vocab="qwen35", n_rot=64,
           ssm_d_conv=4, ssm_k_heads=16, ssm_v_heads=48, ssm_head=128, full_attention_interval=4,
           bias_dims=256, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M, logit_std=17.0),
    Preset("qwen36-35b-a3b", "qwen35moe", n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256,
           n_ff=512, context_length=262144, rope_freq_base=1e7, rms_eps=1e-6, vocab="qwen35", n_rot=64,
           ssm_d_conv=4, ssm_k_heads=16, ssm_v_heads=32, ssm_head=128, full_attention_interval=4,
           n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, route_code=256, router_gain=0.5,
           bias_dims=256, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M, logit_std=17.0),
    Preset("qwen3-8b", "qwen3", n_embd=4096, n_layer=36, n_head=32, n_head_kv=8, head_dim=128,
           n_ff=12288, context_length=40960, rope_freq_base=1e6, rms_eps=1e-6, vocab="qwen2",
           mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M, logit_std=17.0),
    # The real Qwen3-30B-A3B shape: 128 experts of width 768, 8 per token, on all 48 layers.
    Preset("qwen3moe-30b-a3b", "qwen3moe", n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
           n_ff=6144, context_length=40960, rope_freq_base=1e6, rms_eps=1e-6, vocab="qwen2", n_expert=128,
           n_expert_used=8, n_ff_exp=768, route_code=256, router_gain=0.5, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M,
           logit_std=17.0),
    # Gemma 4 31B (50 sliding layers of 32 heads of 256 over 16 KV heads, window 1024; 10 full
    # ones of 32 heads of 512 over 4, RoPE on 128 of 512 dims; FFN 21504) and 26B-A4B (25 + 5
    # layers, 16 heads over 8 / 2 KV heads, a dense MLP of 2112 beside 128 experts of 704, 8 per
    # token): catalog-shapes.md §5-6, Q4_K_M as llama.cpp assigns it (rows of 2112 and 704 are
    # not whole K-quant blocks: its fallback types).
    Preset("gemma4-31b", "gemma4", n_embd=5376, n_layer=60, n_head=32, n_head_kv=4, head_dim=512,
           n_ff=21504, context_length=262144, rope_freq_base=1e6, rms_eps=1e-6, vocab="gemma-4",
           tied=True, sliding_window=1024, rope_freq_base_swa=10000.0, softcap=30.0, rope_freqs=True,
           head_dim_swa=256, n_head_kv_swa=16, swa_period=6, rope_partial=0.25, out_scale=True,
           logit_std=3.5, head_row_sigma=0.3, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M),
    Preset("gemma4-26b-a4b", "gemma4", n_embd=2816, n_layer=30, n_head=16, n_head_kv=2, head_dim=512,
           n_ff=2112, context_length=262144, rope_freq_base=1e6, rms_eps=1e-6, vocab="gemma-4",
           tied=True, sliding_window=1024, rope_freq_base_swa=10000.0, softcap=30.0, rope_freqs=True,
           head_dim_swa=256, n_head_kv_swa=8, swa_period=6, rope_partial=0.25, out_scale=True,
           n_expert=128, n_expert_used=8, n_ff_exp=704, route_code=256, router_gain=0.5,
           logit_std=3.5, head_row_sigma=0.3, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M),
    Preset("llama3-8b", "llama", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, head_dim=128,
           n_ff=14336, context_length=131072, rope_freq_base=500000.0, rms_eps=1e-5,
           vocab="llama-bpe", rope_freqs=True, mix="Q4_K_M", file_type=FT.MOSTLY_Q4_K_M, logit_std=17.0),
]}


# F32 twins of the tiny presets: llama.cpp multiplies F32 weights in fp32 like
# the NumPy engine (no 8-bit activation rounding), so these pin the arithmetic
# of each architecture to ~1e-4 logits. The small smollm2 vocab keeps them small.
_ROLES = ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
for _name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"):
    PRESETS[f"{_name}-f32"] = replace(PRESETS[_name], name=f"{_name}-f32", vocab="smollm2",
                                      mix=tuple((r, "F32") for r in _ROLES), file_type=FT.ALL_F32)
# The hybrids' and the MoE models' twins (every role of their mix in F32): the CUDA
# engine's tests and its catalog gate hold the hybrid prefill (the chunked delta
# rule) and the expert kernels to fp32 arithmetic with them, none of the roundings
# of a quantised file between.
for _name in ("tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3moe", "tiny-gemma4moe"):
    PRESETS[f"{_name}-f32"] = replace(PRESETS[_name], name=f"{_name}-f32", vocab="smollm2",
                                      mix=tuple((r, "F32") for r, _ in PRESETS[_name].mix), file_type=FT.ALL_F32)

# ---------------------------------------------------------------- tensor plan

def _more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _q4_k_m(role: str, il: int, p: Preset, wv: tuple[int, int] | None = None) -> T:
    """src/llama-quant.cpp llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M (non-falcon; its
    n_expert == 8 bumps do not apply to the presets here, and the router stays F32). ``wv``: this
    attn_v's index among the file's attn_v tensors and their count (llama.cpp counts attn_v
    tensors, not layers: a hybrid has them on its attention layers only)."""
    if role == "output" or (role == "token_embd" and p.tied):
        return T.Q6_K        # the OUTPUT rule; a tied token_embd is quantised as the head
    if role == "attn_v":
        return T.Q6_K if _more_bits(*(wv or (il, p.n_layer))) else T.Q4_K
    if role in ("ffn_down", "ffn_down_exps", "ffn_down_shexp") and _more_bits(il, p.n_layer):
        return T.Q6_K        # name.find("ffn_down"): experts and the shared expert too, by layer
    if role == "attn_qkv":
        return T.Q5_K        # ATTENTION_QKV (the Gated DeltaNet in-projection)
    if role == "ssm_conv1d":
        return T.F32         # "do not quantize Mamba/Kimi's small conv1d weights"
    return T.Q4_K            # token_embd (untied) keeps the default type


def preset_config(p: Preset, n_vocab: int) -> ModelConfig:
    """The ModelConfig of a file of preset ``p``: the metadata this module
    writes, read by config.py (the one reader of GGUF keys), plus which
    optional tensors the preset carries (config.py learns those from the
    tensor table, which is not written yet)."""
    import tempfile

    kvs = _metadata(p, n_vocab)
    with tempfile.TemporaryDirectory(prefix="anvil-synth-") as d:
        path = Path(d) / "metadata.gguf"
        path.write_bytes(struct.pack("<IIQQ", GGUF_MAGIC, GGUF_VERSION, 0, len(kvs)) + b"".join(kvs))
        cfg = ModelConfig.from_gguf(GGUFFile(path))
    cfg = replace(cfg, qkv_bias=p.qkv_bias, has_rope_freqs=p.rope_freqs, tied_output=p.tied)
    if p.arch == "gemma4":  # tensors decide: no attn_v on full layers, the output scales, the experts
        cfg = replace(cfg, layer_shapes=tuple(replace(s, v_from_k=not cfg.swa_window[il], out_scale=p.out_scale)
                                              for il, s in enumerate(cfg.layer_shapes)))
        if p.n_expert:
            cfg = replace(cfg, moe=MoEConfig(p.n_expert, p.n_expert_used, p.n_ff_exp, norm_topk=True,
                                             activation="gelu_tanh", expert_scale=True))
    return cfg


def _converter_order(specs: list) -> list:
    """A bias right after its weight, as llama.cpp's converters write them."""
    weights = {s.gguf_name.removesuffix(".weight") for s in specs if s.gguf_name.endswith(".weight")}
    biases = {s.gguf_name.removesuffix(".bias"): s for s in specs
              if s.gguf_name.endswith(".bias") and s.gguf_name.removesuffix(".bias") in weights}
    out = []
    for s in specs:
        if s not in biases.values():  # a bias of no weight (ssm_dt.bias) stays where it is declared
            out.append(s)
            if s.gguf_name.removesuffix(".weight") in biases:
                out.append(biases[s.gguf_name.removesuffix(".weight")])
    return out


def tensor_plan(p: Preset, n_vocab: int) -> list[tuple[str, tuple[int, ...], T, str, float]]:
    """(name, ne (ne0 first), type, init kind, std) for every tensor, in file
    order. Names and shapes are the family's (``layer_tensors``); the types
    and initial values are this module's choice per role."""
    cfg = preset_config(p, n_vocab)
    E = p.n_embd
    mix = None if p.mix == "Q4_K_M" else {r: T[t] for r, t in p.mix}

    fam = family(cfg.arch)
    wv_layers = [i for i in range(cfg.n_layer)  # the layers with an attn_v tensor, in file order
                 if any(s.gguf_name.endswith("attn_v.weight") and s.required(cfg.layer(i))
                        for s in fam.layer_tensors(cfg, i).values())]

    def qtype(role: str, il: int = -1, n_in: int = 0) -> T:
        if role == "ffn_gate_inp":
            return T.F32  # the router: llama.cpp's quantizer never quantises it
        if mix is not None:
            return mix[role]
        qt = _q4_k_m(role, il, p, (wv_layers.index(il), len(wv_layers)) if role == "attn_v" else None)
        # tensor_type_fallback: a row that is not whole 256-blocks takes a 32-block type
        return {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}[qt] if n_in % GGML_QUANT_SIZES[qt][0] else qt

    def ne(shape) -> tuple[int, ...]:  # GGUF order: ne0 (the row length) first
        return tuple(reversed(shape))

    # logit std = std(head) * sqrt(n_embd) * rms(output_norm weight), see _logit_std.
    # Untied: output_norm ~1 and the head std sets the logit std. Tied: the
    # embedding must keep x0 at RMS ~1 (gemma3 scales x0 by sqrt(n_embd)), and
    # output_norm gets the gain. Its signs are random then: with all-positive
    # weights the final state's own-embedding component gives the input token
    # a logit bonus of ~ sqrt(n_embd) * cos(h, x0) * logit_std, which made tied
    # files echo their input (99% repeats at gain 1); a small x0 instead lets the
    # context swamp the token's identity (23-47% repeats). Random signs make the
    # bonus sum g_i e_i^2 zero-mean, giving untied-like behaviour.
    rms_g = math.sqrt(1 + NORM_JITTER ** 2)
    embd_std = EMBD_STD / cfg.embd_scale  # gemma3 scales x0 by sqrt(n_embd)
    head_std = embd_std if p.tied else _logit_std(p, n_vocab) / (math.sqrt(E) * rms_g)
    out_gain = _logit_std(p, n_vocab) / (embd_std * math.sqrt(E) * rms_g) if p.tied else 1.0
    regions = p.route_code or p.bias_dims
    if regions:
        _check_regions(p, [qtype(r) for r in ("token_embd", "attn_qkv", "attn_gate") if r == "token_embd" or p.ssm_d_conv])
    out = [("token_embd.weight", ne(GLOBAL["token_embd"].shape(cfg)), qtype("token_embd"),
            ("head_code" if regions else "head") if p.tied else "embd_code" if regions else "weight", embd_std)]
    if GLOBAL["rope_freqs"].required(cfg):
        out.append(("rope_freqs.weight", ne(GLOBAL["rope_freqs"].shape(cfg)), T.F32, "rope_freqs", 0.0))
    for il in range(cfg.n_layer):
        lc = cfg.layer(il)
        for spec in _converter_order([s for s in fam.layer_tensors(cfg, il).values() if s.required(lc)]):
            name, shape = spec.gguf_name.format(i=il), spec.shape(lc)
            if len(shape) == 1:
                bias = name.endswith(".bias")
                if name.endswith("ffn_gate_inp_shexp.weight"):  # a vector of weights: a gate logit ~N(0, 1)
                    out.append((name, ne(shape), T.F32, "bias", GAIN / math.sqrt(shape[0])))
                    continue
                kind = "bias" if bias else "decay" if name.endswith(".ssm_a") else "norm"
                if p.bias_dims and cfg.recurrent[il] and name.endswith("attn_norm.weight"):
                    kind = "norm_bias"  # the one norm that passes the bias region
                gain = BIAS_DN_GAIN if p.bias_dims and name.endswith("ssm_norm.weight") else 0.0
                if cfg.attn_scale == 1.0 and name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
                    # no 1/sqrt(d) on q·k (gemma4): the Q and K norms carry d^-1/4 each, so
                    # attention logits have unit std instead of sqrt(d) (a near-argmax softmax
                    # that turns rounding noise into different attention choices)
                    gain = shape[0] ** -0.25
                out.append((name, ne(shape), T.F32, kind, BIAS_STD if bias else gain))
            else:  # role: "attn_q" of blk.N.attn_q.weight; unit-RMS inputs give O(1) outputs
                std = GAIN / math.sqrt(shape[-1])
                if name.endswith("ffn_gate_inp.weight"):
                    std *= router_input_gain(p)
                    std *= p.router_gain
                role = name.split(".")[2]
                kind = "writer" if regions and role in _RESIDUAL_WRITERS else "weight"
                if p.route_code and role == "ffn_gate_inp":
                    kind = "router_code"
                if p.bias_dims:
                    kind = _BIAS_READERS.get(role, kind)
                out.append((name, ne(shape), qtype(role, il, shape[-1]), kind, std))
    out.append(("output_norm.weight", ne(GLOBAL["output_norm"].shape(cfg)), T.F32,
                "norm_signed" if p.tied else "norm", out_gain))
    if not p.tied:
        out.append(("output.weight", ne(GLOBAL["output"].shape(cfg)), qtype("output"), "head", head_std))
    return out


def _logit_std(p: Preset, n_vocab: int) -> float:
    """Std of the pre-softcap logits the head is scaled for.

    Napkin math: the final RMSNorm gives h with unit RMS, so for a fixed h the
    logits l_v = sum_i w_vi g_i h_i are iid over v (rows are independent) and
    ~N(0, s^2) with s = std(w_out) * sqrt(n_embd) * rms(g), rms(g) = sqrt(1+0.1^2).
    The top of N Gaussians sits near s*sqrt(2 ln N) and the top-2 gap is about
    Exp(mean = s/sqrt(2 ln N)), median ln2 * s/sqrt(2 ln N). For median 1.5:
    N=49152 -> s=10.0, N=151936 -> s=10.6 (simulated median 1.43-1.52); ~5% of
    steps still fall below 0.1. Argmax identity depends only on h's direction,
    so prompts/steps still give different tokens; top-1 prob is ~0.5-0.9.

    With a softcap c, l -> c*tanh(l/c) compresses the top: for N=262144, c=30
    and Gaussian rows the capped median gap peaks at ~0.5 (s=5-6). Spreading
    the head row norms log-normally (sigma 0.3) fattens the tail: s=3.5 gives a
    simulated capped median of 0.88, 7% of gaps < 0.1, 249 distinct argmaxes
    in 300 random h (preset fields logit_std / head_row_sigma).

    Measured: llama.cpp (CPU) vs an exact float64 forward of the tiny presets
    differ by 0.09-0.24 logits RMS, ~1-2% of the logit std (its 8-bit activation
    quantisation). That noise scales with the head like the margin does, so the
    scale buys margins in absolute logits, not a better margin/noise ratio.
    """
    if p.logit_std is not None:
        return p.logit_std
    return TARGET_MARGIN * math.sqrt(2 * math.log(n_vocab)) / math.log(2)


def _rope_freqs(p: Preset) -> np.ndarray:
    """Llama-3.1 rope factors as conversion/llama.py computes them (factor 8, low 1, high 4, orig 8192);
    gemma4's proportional RoPE as conversion/gemma.py writes it: divisor 1 on the first
    rope_partial of the pairs, 1e30 (no rotation) on the rest."""
    if p.rope_partial:
        n_rot = int(p.head_dim * p.rope_partial) // 2
        return np.array([1.0] * n_rot + [1e30] * (p.head_dim // 2 - n_rot), dtype=np.float32)
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    out = []
    for i in range(0, p.head_dim, 2):
        wavelen = 2 * math.pi / (1.0 / p.rope_freq_base ** (i / p.head_dim))
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# ---------------------------------------------------------- quantised blocks
# Each type's blocks start as random bytes; the random bits already sitting in
# the scale fields then become jitter/sign, and are overwritten with the real
# scales. Quant values are uniform, so with d=1: E[(q-8)^2] = 21.25+0.25 for
# Q4_0, (q-16)^2 -> 85.5 (Q5_0), int8 -> 5461.5 (Q8_0), (q-32)^2 -> 341.5 (Q6_K).
# Types with an offset (Q4_1, Q5_1, Q4_K, Q5_K) centre it: m = -7.5d / -15.5d,
# dmin*mn = 7.5d*(sc + delta) so sub-blocks are nearly, not exactly, symmetric
# (an engine that swaps scale and min still gets different numbers).

_JK = 1 << 15  # d jitter: j = 0.75 + 0.5*k/_JK, k uniform 0.._JK-1
_J2 = 0.75 ** 2 + 2 * 0.75 * (0.5 / _JK) * (_JK - 1) / 2 + (0.5 / _JK) ** 2 * (_JK - 1) * (2 * _JK - 1) / 6
_SC2 = sum((8 + b % 53) ** 2 for b in range(256)) / 256          # E[sc^2], K-quant 6-bit scales
_S62 = sum((16 + k % 112) ** 2 for k in range(128)) / 128        # E[s^2], Q6_K int8 scales
_DELTA2 = 2.5   # E[(a-b)^2], a, b uniform {0..3}: mn - sc offset
_UNIT_VAR = {   # E[w^2] / E[d^2] for the block distributions below
    T.Q4_0: 21.5, T.Q5_0: 85.5, T.Q8_0: 5461.5, T.Q4_1: 21.25, T.Q5_1: 85.25,
    T.Q4_K: _SC2 * 21.25 + 7.5 ** 2 * _DELTA2, T.Q5_K: _SC2 * 85.25 + 15.5 ** 2 * _DELTA2,
    T.Q6_K: _S62 * 341.5,
}
QUANT_TYPES = tuple(_UNIT_VAR)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float16)


def _put(blk: np.ndarray, off: int, x: np.ndarray) -> None:
    blk[:, off:off + 2] = x.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _u16(blk: np.ndarray, off: int) -> np.ndarray:
    return blk[:, off].astype(np.uint32) | (blk[:, off + 1].astype(np.uint32) << 8)


def fill_blocks(qt: T, blk: np.ndarray, std: np.ndarray) -> None:
    """Turn random (nb, type_size) bytes into blocks whose weights have std `std` (per block), in place."""
    r = _u16(blk, 208 if qt == T.Q6_K else 0)
    jit = (np.float32(0.75) + np.float32(0.5 / _JK) * (r & (_JK - 1)).astype(np.float32))
    d = std.astype(np.float32) * np.float32(1 / math.sqrt(_UNIT_VAR[qt] * _J2)) * jit
    if qt in (T.Q4_0, T.Q5_0, T.Q8_0, T.Q4_1, T.Q5_1):
        d = np.where(r >> 15, -d, d)  # random sign: cancels the -0.5 mean of the symmetric types
        _put(blk, 0, d)
        if qt in (T.Q4_1, T.Q5_1):    # m centres q on the rounded d
            _put(blk, 2, _f16(d).astype(np.float32) * np.float32(-7.5 if qt == T.Q4_1 else -15.5))
    elif qt in (T.Q4_K, T.Q5_K):
        s = blk[:, 4:16]
        sc = (np.uint8(8) + s[:, :8] % np.uint8(53)).astype(np.int16)        # 8..60
        nib = np.concatenate([s[:, 8:12] & 15, s[:, 8:12] >> 4], axis=1).astype(np.int16)
        mn = (sc + (nib & 3) - (nib >> 2)).astype(np.uint8)                  # sc-3..sc+3
        sc = sc.astype(np.uint8)
        packed = np.empty_like(s)
        packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)          # get_scale_min_k4 inverse
        packed[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
        packed[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
        blk[:, 4:16] = packed
        _put(blk, 0, d)
        _put(blk, 2, _f16(d).astype(np.float32) * np.float32(7.5 if qt == T.Q4_K else 15.5))
    elif qt == T.Q6_K:
        s = blk[:, 192:208]
        mag = (np.uint8(16) + (s & 127) % np.uint8(112)).astype(np.int16)    # 16..127
        blk[:, 192:208] = np.where(s >> 7, -mag, mag).astype(np.int8).view(np.uint8)
        _put(blk, 208, d)
    else:
        raise ValueError(f"no random-block recipe for {qt.name}")


def _float_values(raw: np.ndarray, n: int, std: np.ndarray | float, qt: T) -> np.ndarray:
    """Uniform(-sqrt3*std, sqrt3*std) from raw uint64s; exact float32 ops only."""
    u = (raw[:n] >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -23) - np.float32(1.0)
    x = u * (np.asarray(std, dtype=np.float32) * np.float32(math.sqrt(3)))
    if qt == T.F32:
        return x
    if qt == T.F16:
        return x.astype(np.float16)
    bits = x.view(np.uint32)  # BF16: round to nearest even on the top 16 bits
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def _raw(seed: int, name: str, *extra: int, n: int) -> np.ndarray:
    ss = np.random.SeedSequence([seed, zlib.crc32(name.encode()), *extra])
    return np.random.PCG64(ss).random_raw(n)


def _row_scales(seed: int, name: str, rows: int, sigma: float) -> np.ndarray:
    """exp(sigma*z - sigma^2) with z ~ Irwin-Hall(4) standardised: E[r^2] = 1."""
    if sigma == 0:
        return np.ones(rows, np.float32)
    u = (_raw(seed, name, 1 << 31, n=4 * rows) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    u = u.reshape(rows, 4)
    z = (((u[:, 0] + u[:, 1]) + u[:, 2]) + u[:, 3] - 2.0) * math.sqrt(3.0)  # fixed summation order
    return np.exp(sigma * z - sigma * sigma).astype(np.float32)


def _tensor_chunks(seed: int, name: str, ne: tuple, qt: T, kind: str, std: float, p: Preset):
    """The tensor's bytes as jobs, one per chunk (chunking depends on the shape only): each job
    makes its chunk from the seed alone, so they may run in any order, at once."""
    if kind == "rope_freqs":
        yield lambda: _rope_freqs(p).tobytes()
        return
    n_el = math.prod(ne)
    if kind.startswith("norm"):  # ~1 (gemma's stored 1+w included), times the gain (output_norm only)
        def norm() -> bytes:
            raw = _raw(seed, name, 0, n=n_el)
            x = (_float_values(raw, n_el, NORM_JITTER, T.F32) + np.float32(1.0)) * np.float32(std or 1.0)
            x = np.where(raw & np.uint64(1), -x, x) if kind == "norm_signed" else x
            if ne == (p.n_embd,):
                lo, code = p.n_embd - p.route_code - p.bias_dims, p.n_embd - p.route_code
                x[lo:code] = 1.0 if kind == "norm_bias" else 0.0  # the bias region reaches the DeltaNet alone
                x[code:] = 1.0  # the code reaches every router as the embedding wrote it
                if kind == "norm_signed":  # a tied head (the embedding's rows) reads neither region
                    x[lo:] = 0.0
            return x.tobytes()
        yield norm
        return
    if kind == "bias":
        yield lambda: _float_values(_raw(seed, name, 0, n=n_el), n_el, std, T.F32).tobytes()
        return
    if kind == "decay":  # DeltaNet's ssm_a = -exp(A_log): -0.05..-0.5, a memory of a few tokens
        yield lambda: (-(0.05 + 0.45 * (_raw(seed, name, 0, n=n_el) >> np.uint64(11)).astype(np.float64)
                         * 2.0 ** -53)).astype(np.float32).tobytes()
        return
    blk_el, blk_bytes = GGML_QUANT_SIZES[qt]
    bpr = ne[0] // blk_el                               # blocks per row
    row_bytes = bpr * blk_bytes
    rows = math.prod(ne[1:])
    rows_per_chunk = max(1, CHUNK_BYTES // row_bytes)
    rscale = _row_scales(seed, name, rows, p.head_row_sigma if kind.startswith("head") else 0.0) * np.float32(std)

    def chunk(ci: int, r0: int) -> np.ndarray:
        r1 = min(rows, r0 + rows_per_chunk)
        nb = (r1 - r0) * bpr
        if qt in (T.F32, T.F16, T.BF16):
            n = nb * blk_el
            rows_x = _float_values(_raw(seed, name, 0, ci, n=n), n, np.repeat(rscale[r0:r1], ne[0]), qt)
            rows_x = rows_x.reshape(r1 - r0, ne[0])
        else:
            raw = _raw(seed, name, 0, ci, n=(nb * blk_bytes + 7) // 8).view(np.uint8)
            rows_x = raw[:nb * blk_bytes].reshape(nb, blk_bytes)
            fill_blocks(qt, rows_x, np.repeat(rscale[r0:r1], bpr))
            rows_x = rows_x.reshape(r1 - r0, row_bytes)
        if kind != "weight" and kind != "head":
            _regions(rows_x, r0, ne, qt, kind, seed, name, ci, p, std)
        return rows_x.reshape(-1)

    for ci, r0 in enumerate(range(0, rows, rows_per_chunk)):
        yield lambda ci=ci, r0=r0: chunk(ci, r0)


def _check_regions(p: Preset, types: list[T]) -> None:
    """The routing code and the bias region: whole blocks of every type that carries them (a tied
    head reads neither: output_norm is 0 there); the code needs experts, the bias DeltaNet."""
    blk = max(GGML_QUANT_SIZES[t][0] for t in types)
    C, R = p.route_code, p.bias_dims
    if C % blk or R % blk or not C + R < p.n_embd:
        raise ValueError(f"preset {p.name}: route_code {C} and bias_dims {R} need whole blocks of "
                         f"{', '.join(t.name for t in types)} within n_embd ({p.n_embd})")
    if C and not 0 < p.n_expert <= C:
        raise ValueError(f"preset {p.name}: route_code {C} needs an MoE model of at most {C} experts")
    if R and not p.ssm_d_conv:
        raise ValueError(f"preset {p.name}: bias_dims {R} needs a Gated DeltaNet hybrid")


def _code_blocks(qt: T, v: np.ndarray) -> np.ndarray:
    """Blocks of type ``qt`` that dequantise to ``v`` ([rows, n]; in each block the values are 0
    or one amplitude a, of either sign), as ``[rows, n // block, type_size]`` bytes: a at the
    type's top level (d = a / top, d signed), 0 exact."""
    rows, n = v.shape
    blk_el, blk_bytes = GGML_QUANT_SIZES[qt]
    vb = v.reshape(-1, blk_el)
    a = vb[np.arange(len(vb)), np.abs(vb).argmax(axis=1)].astype(np.float32)  # each block's amplitude
    on = vb != 0
    out = np.zeros((len(vb), blk_bytes), np.uint8)

    def nibbles(q):  # element j low nibble of byte j, element j + half the high one
        h = q.shape[1] // 2
        return (q[:, :h] | (q[:, h:] << 4)).astype(np.uint8)

    if qt == T.Q8_0:                       # d·q, q int8
        _put(out, 0, _f16(a / np.float32(127)))
        out[:, 2:] = np.where(on, 127, 0).astype(np.int8).view(np.uint8)
    elif qt in (T.Q4_0, T.Q5_0):           # d·(q - 8) / d·(q - 16): a at the top code, 0 at the middle
        mid = 8 if qt == T.Q4_0 else 16
        _put(out, 0, _f16(a / np.float32(mid - 1)))
        q = np.where(on, 2 * mid - 1, mid).astype(np.uint32)
        if qt == T.Q5_0:                   # element j's 5th bit is bit j of qh
            qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
            out[:, 2:6] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
        out[:, 6 if qt == T.Q5_0 else 2:] = nibbles(q & 15)
    elif qt in (T.Q4_K, T.Q5_K):           # d·sc·q - dmin·m with every sc 1, m 0, dmin 0
        top = 15 if qt == T.Q4_K else 31
        _put(out, 0, _f16(a / np.float32(top)))
        out[:, 4:16] = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)  # get_scale_min_k4's layout
        q = np.where(on, top, 0).astype(np.uint8).reshape(-1, 4, 2, 32)  # 64-value chunks: low, high nibbles
        out[:, -128:] = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
        if qt == T.Q5_K:                   # qh[l]: bit 2j for value 64j + l, bit 2j+1 for 64j + 32 + l
            hi = (q >> 4).astype(np.uint8)
            sh = np.arange(4, dtype=np.uint8)[None, :, None] * 2
            out[:, 16:48] = ((hi[:, :, 0] << sh) | (hi[:, :, 1] << (sh + 1))).sum(axis=1, dtype=np.uint8)
    elif qt == T.Q6_K:                     # d·sc·(q - 32), every sc 1: a at q 63, 0 at q 32
        _put(out, 208, _f16(a / np.float32(31)))
        out[:, 192:208] = 1
        q = np.where(on, 63, 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # element 128n + 32g + l
        lo, hi = q & 15, q >> 4
        out[:, :128] = (lo[:, :, :2] | (lo[:, :, 2:] << 4)).reshape(-1, 128)  # ql[64n + 32(g&1) + l]
        sh = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
        out[:, 128:192] = (hi << sh).sum(axis=2, dtype=np.uint8).reshape(-1, 64)  # qh[32n + l]: bits 2g
    else:
        raise ValueError(f"no code block recipe for {qt.name}")
    return out.reshape(rows, n // blk_el, blk_bytes)


def _put_cols(rows_x: np.ndarray, col0: int, v: np.ndarray, qt: T) -> None:
    """Write values ``v`` ([rows, n]) into columns col0.. of rows [rows, values or row bytes]."""
    if qt in (T.F32, T.F16):
        rows_x[:, col0:col0 + v.shape[1]] = v.astype(rows_x.dtype)
    else:
        blk_el, blk_bytes = GGML_QUANT_SIZES[qt]
        b0 = col0 // blk_el * blk_bytes
        rows_x[:, b0:b0 + v.shape[1] // blk_el * blk_bytes] = _code_blocks(qt, v).reshape(len(v), -1)


def _uniform(seed: int, name: str, *extra: int, n: int) -> np.ndarray:
    return ((_raw(seed, name, *extra, n=n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53).astype(np.float32)


@lru_cache(maxsize=4)
def _conv_tap_sign(seed: int, il: int, p: Preset) -> np.ndarray:
    """The sign of each conv channel's tap sum in layer ``il`` (the conv's own values, F32; every
    chunk of attn_qkv's rows asks)."""
    name = f"blk.{il}.ssm_conv1d.weight"
    conv_dim = 2 * p.ssm_k_heads * p.ssm_head + p.ssm_v_heads * p.ssm_head
    w = np.concatenate([np.frombuffer(make(), np.float32) for make in
                        _tensor_chunks(seed, name, (p.ssm_d_conv, conv_dim), T.F32, "weight", 1.0, p)])
    return np.where(w.reshape(conv_dim, p.ssm_d_conv).sum(axis=1) < 0, np.float32(-1), np.float32(1))


def _regions(rows_x: np.ndarray, r0: int, ne: tuple, qt: T, kind: str, seed: int, name: str, ci: int,
             p: Preset, std: float) -> None:
    """Write the routing code (Preset.route_code) and the bias region (Preset.bias_dims) into rows
    r0.. of a tensor, in place: ``rows_x`` is [rows, values] (float types) or [rows, row bytes].
    ``std``: the tensor's (the embedding's is EMBD_STD over the scale x0 takes: gemma's sqrt(n_embd),
    which the regions' values are divided by as well)."""
    rows, C, R, E = rows_x.shape[0], p.route_code, p.bias_dims, p.n_embd
    lo = E - C - R                              # the bias region, then the code
    if kind == "writer":      # rows (ne1 = the residual dim, any expert) in either region: all 0
        out_dim = (r0 + np.arange(rows)) % ne[1]
        rows_x[out_dim >= lo] = 0
    elif kind == "router_code":  # F32 [n_expert, n_embd]: expert e reads code dim e alone there
        rows_x[:, E - C:] = 0
        gain = route_code_gain(p, int(name.split(".")[1])) * router_input_gain(p)
        rows_x[np.arange(rows), E - C + r0 + np.arange(rows)] = np.float32(gain)
    elif kind in ("embd_code", "head_code"):  # token rows: BIAS_AMP in the bias region; n_expert_used
        unit = std / EMBD_STD                 # experts picked by the largest of n_expert draws in the code
        v = np.zeros((rows, R + C), np.float32)
        v[:, :R] = np.float32(BIAS_AMP * unit)
        if C:
            draws = _raw(seed, name, 2, ci, n=rows * p.n_expert).reshape(rows, p.n_expert)
            chosen = np.argsort(draws, axis=1, kind="stable")[:, -p.n_expert_used:]
            np.put_along_axis(v[:, R:], chosen, np.float32(ROUTE_CODE_AMP * unit), axis=1)
        _put_cols(rows_x, lo, v, qt)
    elif kind.startswith("bias_"):  # the DeltaNet in-projection: one value per row across the region
        il = int(name.split(".")[1])
        unit = np.float32(bias_rms(il) / (R * BIAS_AMP))  # a weight giving a bias of 1 through RMSNorm
        r = r0 + np.arange(rows)
        c = np.zeros(rows, np.float32)
        if kind == "bias_qkv":                  # rows [q | k | v]: q and k alike per head dim, v none
            kd = p.ssm_k_heads * p.ssm_head
            qk = r < 2 * kd
            mag = np.float32(0.5) + _uniform(seed, f"blk.{il}.bias_qk", n=kd)
            c[qk] = np.float32(BIAS_QK) * mag[r[qk] % kd] * _conv_tap_sign(seed, il, p)[r[qk]]
        elif kind == "bias_gate":
            c[:] = np.float32(BIAS_Z)
        _put_cols(rows_x, lo, np.repeat((c * unit)[:, None], R, axis=1), qt)
    else:
        raise ValueError(kind)


# ------------------------------------------------------------- GGUF plumbing

_SCALAR = {V.UINT8: 1, V.INT8: 1, V.UINT16: 2, V.INT16: 2, V.UINT32: 4, V.INT32: 4,
           V.FLOAT32: 4, V.BOOL: 1, V.UINT64: 8, V.INT64: 8, V.FLOAT64: 8}


@lru_cache(maxsize=8)
def _tokenizer_kv_cached(path: str, _size: int, _mtime: int) -> tuple[tuple[bytes, ...], int]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        magic, _ver, _nt, n_kv = struct.unpack_from("<IIQQ", m, 0)
        if magic != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        off, kvs, n_vocab = 24, [], None

        def skip(off: int, vt: int) -> int:
            if vt in _SCALAR:
                return off + _SCALAR[vt]
            if vt == V.STRING:
                return off + 8 + struct.unpack_from("<Q", m, off)[0]
            raise ValueError(f"{path}: unexpected GGUF value type {vt}")

        for _ in range(n_kv):
            start = off
            (klen,) = struct.unpack_from("<Q", m, off)
            key = bytes(m[off + 8:off + 8 + klen]).decode()
            (vt,) = struct.unpack_from("<I", m, off + 8 + klen)
            off += 12 + klen
            if vt == V.ARRAY:
                it, n = struct.unpack_from("<IQ", m, off)
                off += 12
                if it in _SCALAR:
                    off += n * _SCALAR[it]
                else:
                    for _ in range(n):
                        off = skip(off, it)
                if key == "tokenizer.ggml.tokens":
                    n_vocab = n
            else:
                off = skip(off, vt)
            if key.startswith("tokenizer."):
                kvs.append(bytes(m[start:off]))
    if not n_vocab:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens")
    return tuple(kvs), n_vocab


def tokenizer_kv(vocab_gguf) -> tuple[tuple[bytes, ...], int]:
    """Raw serialised tokenizer.* key/values of a GGUF, and len(tokenizer.ggml.tokens)."""
    st = os.stat(vocab_gguf)
    return _tokenizer_kv_cached(str(Path(vocab_gguf).resolve()), st.st_size, st.st_mtime_ns)


def _kv(key: str, vt: V, val) -> bytes:
    k = key.encode()
    head = struct.pack("<Q", len(k)) + k + struct.pack("<I", vt)
    if vt == V.STRING:
        s = val.encode()
        return head + struct.pack("<Q", len(s)) + s
    if vt == V.ARRAY and all(isinstance(v, bool) for v in val):  # of BOOL
        return head + struct.pack("<IQ", V.BOOL, len(val)) + bytes(int(v) for v in val)
    if vt == V.ARRAY:  # of INT32
        return head + struct.pack("<IQ", V.INT32, len(val)) + struct.pack(f"<{len(val)}i", *val)
    return head + struct.pack({V.UINT32: "<I", V.FLOAT32: "<f"}[vt], val)


def _metadata(p: Preset, n_vocab: int) -> list[bytes]:
    a = p.arch
    kv = [_kv("general.architecture", V.STRING, a), _kv("general.name", V.STRING, f"anvil-synth-{p.name}"),
          _kv("general.file_type", V.UINT32, int(p.file_type)), _kv("general.quantization_version", V.UINT32, 2)]
    for k, v in (("context_length", p.context_length), ("embedding_length", p.n_embd),
                 ("block_count", p.n_layer), ("feed_forward_length", p.n_ff),
                 ("attention.head_count", p.n_head), ("attention.head_count_kv", p.n_head_kv),
                 ("attention.key_length", p.head_dim), ("attention.value_length", p.head_dim),
                 ("rope.dimension_count", p.n_rot or p.head_dim), ("vocab_size", n_vocab)):
        if not (p.swa_period and k == "attention.head_count_kv"):  # gemma4: an array, per layer (below)
            kv.append(_kv(f"{a}.{k}", V.UINT32, v))
    kv.append(_kv(f"{a}.rope.freq_base", V.FLOAT32, p.rope_freq_base))
    kv.append(_kv(f"{a}.attention.layer_norm_rms_epsilon", V.FLOAT32, p.rms_eps))
    if p.swa_period:  # gemma4: per-layer kinds and the sliding layers' own heads (conversion/gemma.py)
        swa = [il % p.swa_period != p.swa_period - 1 and il != p.n_layer - 1 for il in range(p.n_layer)]
        kv.append(_kv(f"{a}.attention.sliding_window_pattern", V.ARRAY, swa))
        kv.append(_kv(f"{a}.attention.head_count_kv", V.ARRAY, [p.n_head_kv_swa if s else p.n_head_kv for s in swa]))
        for k, v in (("attention.key_length_swa", p.head_dim_swa), ("attention.value_length_swa", p.head_dim_swa),
                     ("rope.dimension_count_swa", p.head_dim_swa), ("embedding_length_per_layer_input", 0)):
            kv.append(_kv(f"{a}.{k}", V.UINT32, v))
    if p.sliding_window:
        kv.append(_kv(f"{a}.attention.sliding_window", V.UINT32, p.sliding_window))
        kv.append(_kv(f"{a}.rope.freq_base_swa", V.FLOAT32, p.rope_freq_base_swa))
    if p.softcap:
        kv.append(_kv(f"{a}.final_logit_softcapping", V.FLOAT32, p.softcap))
    if p.n_expert:
        for k, v in (("expert_count", p.n_expert), ("expert_used_count", p.n_expert_used),
                     ("expert_feed_forward_length", p.n_ff_exp)):
            kv.append(_kv(f"{a}.{k}", V.UINT32, v))
        if p.n_ff_shexp:
            kv.append(_kv(f"{a}.expert_shared_feed_forward_length", V.UINT32, p.n_ff_shexp))
    if p.ssm_d_conv:
        for k, v in (("ssm.conv_kernel", p.ssm_d_conv), ("ssm.state_size", p.ssm_head),
                     ("ssm.group_count", p.ssm_k_heads), ("ssm.time_step_rank", p.ssm_v_heads),
                     ("ssm.inner_size", p.ssm_v_heads * p.ssm_head),
                     ("full_attention_interval", p.full_attention_interval)):
            kv.append(_kv(f"{a}.{k}", V.UINT32, v))
        # M-RoPE sections over the rotated pairs (the converter's 11/11/10 split, scaled); text
        # positions are the same in every section, so they change nothing here
        third = ((p.n_rot or p.head_dim) // 2 + 2) // 3
        kv.append(_kv(f"{a}.rope.dimension_sections", V.ARRAY,
                      [third, third, (p.n_rot or p.head_dim) // 2 - 2 * third, 0]))
    return kv


def _nbytes(ne: tuple, qt: T) -> int:
    blk_el, blk_bytes = GGML_QUANT_SIZES[qt]
    assert ne[0] % blk_el == 0, (ne, qt.name)
    return math.prod(ne) // blk_el * blk_bytes


def write_synthetic(preset: Preset | str, out_path, *, vocab_gguf, seed: int = 0,
                    logit_scale: float | None = None, progress=None) -> dict:
    """Write a random-weight GGUF for `preset` atomically; returns path, sha256, bytes, preset, seed, n_params.

    logit_scale overrides the pre-softcap logit std the head is scaled for (see _logit_std).
    progress(written, total): called every few seconds while the file is written.
    """
    p = PRESETS[preset] if isinstance(preset, str) else preset
    if logit_scale is not None:
        p = replace(p, logit_std=float(logit_scale))
    tok_kvs, n_vocab = tokenizer_kv(vocab_gguf)
    plan = tensor_plan(p, n_vocab)
    kvs = _metadata(p, n_vocab) + list(tok_kvs)

    align = GGUF_DEFAULT_ALIGNMENT
    pad = lambda n: -n % align  # noqa: E731
    header = bytearray(struct.pack("<IIQQ", GGUF_MAGIC, GGUF_VERSION, len(plan), len(kvs)))
    for b in kvs:
        header += b
    offset = 0
    for name, ne, qt, _, _ in plan:
        nm = name.encode()
        header += struct.pack("<Q", len(nm)) + nm + struct.pack("<I", len(ne))
        header += struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", qt, offset)
        offset += _nbytes(ne, qt) + pad(_nbytes(ne, qt))
    header += bytes(pad(len(header)))

    out = Path(out_path)
    h, total = hashlib.sha256(), 0
    # Chunks are made on the CPUs (NumPy's generators and array ops release the GIL), then
    # written here and hashed on a thread of their own (both release it too), in file order,
    # 2 chunks a worker ahead. 16 workers at most: past a few, the write is what waits, and
    # each worker holds up to 2 x CHUNK_BYTES.
    workers = min(16, os.cpu_count() or 1)
    with atomic_open(out) as f, ThreadPoolExecutor(workers) as pool, ThreadPoolExecutor(1) as hasher:
        hashed: deque = deque()

        def emit(b) -> int:
            nonlocal total
            mv = memoryview(b).cast("B")
            hashed.append(hasher.submit(h.update, mv))  # one thread: the updates run in order
            f.write(mv)
            while len(hashed) > 4:
                hashed.popleft().result()
            total += len(mv)
            return len(mv)
        emit(bytes(header))
        size, last = offset + len(header), time.monotonic()

        def jobs():  # every tensor's chunks in file order, then (its entry, None): its end
            for entry in plan:
                name, ne, qt, kind, std = entry
                yield from ((entry, job) for job in _tensor_chunks(seed, name, ne, qt, kind, std, p))
                yield entry, None

        n = 0
        ahead: deque = deque()

        def drain(keep: int) -> None:
            nonlocal n, last
            while len(ahead) > keep:
                (name, ne, qt, _, _), made = ahead.popleft()
                if made is not None:
                    n += emit(made.result())
                    continue
                assert n == _nbytes(ne, qt), name
                emit(bytes(pad(n)))
                n = 0
                if progress is not None and time.monotonic() - last > 5:
                    progress(total, size)
                    last = time.monotonic()

        for entry, job in jobs():
            ahead.append((entry, None if job is None else pool.submit(job)))
            drain(2 * workers)
        drain(0)
        while hashed:
            hashed.popleft().result()
    return {"path": str(out), "sha256": h.hexdigest(), "bytes": total, "preset": p.name,
            "seed": seed, "n_params": sum(math.prod(ne) for _, ne, *_ in plan)}
