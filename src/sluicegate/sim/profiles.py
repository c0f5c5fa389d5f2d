"""Hardware/model profiles: engine limits, KV capacity and the step-time function.

A profile answers two questions for the engine model: how much fits (KV blocks, batch
limits, LoRA slots) and how long one engine iteration takes. Step time follows vidur's
iteration model (a sum of per-layer operation times; ``vidur/execution_time_predictor/`` in
https://github.com/microsoft/vidur at 7d475133), reduced to four terms::

    step_ms = LIN(n)                                   linear ops (QKV, O, MLP, norms), table
            + layers * (attn_fixed_ms + ctx * kv_bytes_per_layer / bandwidth)   decode attention
            + sum over prefill chunks of 4 * c * (p + c/2) * hidden * layers / flops
            + overhead_ms + ms_per_seq * sequences in the iteration

where ``n`` is the number of tokens in the iteration (prefill-chunk tokens plus one per
decoding sequence), ``ctx`` the total context of the decoding sequences, and a prefill
chunk of ``c`` tokens follows ``p`` tokens already in the KV cache. ``LIN`` interpolates the
measured per-iteration linear-op times of ``data/calibration.csv`` (vidur profiles, MIT) and
extends the least-squares fit beyond the last row. ``docs/simulator.md`` derives each
profile's numbers.
"""

from __future__ import annotations

import bisect
import csv
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

GIB = 1024**3


@cache
def _calibration_columns() -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Columns of the calibration table as (num_tokens, ms) pairs keyed by column name."""
    text = resources.files("sluicegate.sim").joinpath("data/calibration.csv").read_text()
    rows = [line for line in text.splitlines() if line and not line.startswith("#")]
    reader = csv.DictReader(rows)
    table: dict[str, list[tuple[float, float]]] = {}
    for row in reader:
        n = float(row["num_tokens"])
        for name, value in row.items():
            if name != "num_tokens":
                table.setdefault(name, []).append((n, float(value)))
    return {
        name: (tuple(p[0] for p in pts), tuple(p[1] for p in pts)) for name, pts in table.items()
    }


@dataclass(frozen=True, slots=True)
class LinearOpsCurve:
    """Per-iteration linear-op time (ms) as a function of tokens in the batch."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    tail_intercept_ms: float
    tail_slope_ms_per_token: float

    @classmethod
    def from_calibration(
        cls, column: str, intercept_ms: float, slope_us_per_token: float
    ) -> LinearOpsCurve:
        xs, ys = _calibration_columns()[column]
        return cls(xs, ys, intercept_ms, slope_us_per_token / 1000.0)

    @classmethod
    def affine(cls, intercept_ms: float, slope_ms_per_token: float) -> LinearOpsCurve:
        return cls((), (), intercept_ms, slope_ms_per_token)

    def __call__(self, n: float) -> float:
        """Linear-op time in ms for ``n`` batched tokens (0 for an empty batch)."""
        if n <= 0:
            return 0.0
        xs = self.xs
        if not xs or n > xs[-1]:
            return self.tail_intercept_ms + self.tail_slope_ms_per_token * n
        if n <= xs[0]:
            return self.ys[0]
        i = bisect.bisect_left(xs, n)
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.ys[i - 1], self.ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One model on one accelerator, as a vLLM instance would run it.

    Limits mirror vLLM's scheduler options; times are in milliseconds unless a name says
    otherwise.
    """

    name: str
    description: str
    model_name: str
    linear_ops: LinearOpsCurve = field(repr=False)
    num_layers: int
    hidden_size: int
    kv_bytes_per_token_per_layer: int
    memory_bandwidth_bytes_per_s: float
    attention_flops_per_s: float
    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    max_loras: int = 4
    max_lora_rank: int = 16
    lora_load_ms: float = 10.0
    lora_step_factor: float = 1.1
    attention_fixed_ms_per_layer: float = 0.010
    step_overhead_ms: float = 0.3
    step_ms_per_seq: float = 0.0
    """Time (ms) per sequence an iteration schedules (prefilling or decoding): the
    per-request work of a step beside the model — scheduling, sampling, output processing
    and detokenising. Negligible beside a large model's step on a GPU (the built-in
    profiles: 0); a tiny model on CPU spends a good part of each step on it."""
    request_overhead_ms: float = 0.0
    """Time (ms) from a request's arrival until the engine can schedule it, spent outside
    the engine's iterations (the API server parsing and tokenising it and handing it to
    the engine; the first token's way back). It adds to time to first token and occupies
    no engine time. ``sim calibrate`` measures it as the server's TTFT minus its prefill
    time on an idle server."""
    tokenizer: str | None = None
    """A Hugging Face ``tokenizer.json`` the simulator sizes text prompts with, as the real
    server's model does (None: the built-in 4-byte tokens). See ``sim/prompt_tokens.py``."""
    gpu_memory_utilization: float = 0.92
    accelerator: str | None = None
    """Hardware class of the GPU (``h100-80gb``…; :mod:`sluicegate.api.hardware`): the
    class a simulated endpoint of this profile carries (None: unnamed)."""
    cost_per_hour: float | None = None
    """On-demand price of one such GPU, USD per hour (None: no list price cited)."""

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_per_layer * self.num_layers

    def decode_attention_ms(self, decode_seqs: int, decode_context_tokens: int) -> float:
        """Attention time (ms) for ``decode_seqs`` sequences holding ``decode_context_tokens``."""
        if decode_seqs <= 0:
            return 0.0
        read_ms_per_layer = (
            decode_context_tokens
            * self.kv_bytes_per_token_per_layer
            / self.memory_bandwidth_bytes_per_s
            * 1e3
        )
        return self.num_layers * (self.attention_fixed_ms_per_layer + read_ms_per_layer)

    def prefill_attention_flops(self, chunk_tokens: int, cached_tokens: int) -> float:
        """Attention FLOPs of a prefill chunk of ``chunk_tokens`` after ``cached_tokens``."""
        c = chunk_tokens
        return 4.0 * c * (cached_tokens + c / 2.0) * self.hidden_size * self.num_layers

    def step_ms(
        self,
        batched_tokens: int,
        decode_seqs: int,
        decode_context_tokens: int,
        prefill_attention_flops: float,
        with_lora: bool = False,
        prefill_seqs: int = 0,
    ) -> float:
        """Duration (ms) of one iteration; 0 when nothing is batched. ``prefill_seqs``:
        sequences with a prefill chunk in it (beside the ``decode_seqs`` decoding)."""
        if batched_tokens <= 0:
            return 0.0
        ms = (
            self.linear_ops(batched_tokens)
            + self.decode_attention_ms(decode_seqs, decode_context_tokens)
            + prefill_attention_flops / self.attention_flops_per_s * 1e3
        )
        if with_lora:
            ms *= self.lora_step_factor
        return ms + self.step_overhead_ms + self.step_ms_per_seq * (decode_seqs + prefill_seqs)

    def prefill_ms(self, prompt_tokens: int) -> float:
        """Time (ms) of one iteration prefilling a single ``prompt_tokens`` prompt."""
        flops = self.prefill_attention_flops(prompt_tokens, 0)
        return self.step_ms(prompt_tokens, 0, 0, flops, prefill_seqs=1)

    def decode_ms(self, batch: int, context_per_seq: int) -> float:
        """Time (ms) of one decode iteration for ``batch`` sequences of equal context."""
        return self.step_ms(batch, batch, batch * context_per_seq, 0.0)


def kv_blocks_for(
    gpu_memory_gib: float,
    utilization: float,
    reserved_gib: float,
    kv_bytes_per_token: int,
    block_size: int = 16,
) -> int:
    """KV blocks vLLM would allocate: (memory * utilization - reserved) / bytes per block."""
    kv_bytes = (gpu_memory_gib * utilization - reserved_gib) * GIB
    return int(kv_bytes // (kv_bytes_per_token * block_size))


# H100 80 GB as vLLM sees it (79.18 GiB) and the non-KV memory of an 8B model under vLLM:
# weights 14.99 + activation peak 4.76 + non-torch 0.13 GiB (measured for Llama-3.1-8B on
# vLLM 0.11.0 by llm-d-benchmark,
# https://github.com/llm-d/llm-d-benchmark/blob/87ab01be/config_explorer/empirical-vllm-memory-results.md).
# Llama-2-7B's weights are 12.55 GiB.
_H100_GIB = 79.18
_ACTIVATION_AND_RUNTIME_GIB = 4.76 + 0.13
_H100_BW = 2.7e12
_H100_ATTN_FLOPS = 300e12
# A100 80 GB: the same memory split, bandwidth fitted to vidur's A100 attention samples
# (``data/profiling/compute/a100/*/attention.csv``: ~1.6 TB/s effective);
# attention FLOP rate assumed at the same ~30 % of dense bf16 peak as on H100.
_A100_BW = 1.6e12
_A100_40GB_GIB = 39.39
_A100_ATTN_FLOPS = 95e12
# A40 48 GB (GDDR6; 46,068 MiB = 44.99 GiB as the driver reports it with ECC on): 696 GB/s
# and 149.7 TFLOP/s dense bf16 peak (NVIDIA A40 data sheet,
# https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf);
# the same ~80 % / ~30 % effective shares as above.
_A40_GIB = 44.99
_A40_BW = 0.56e12
_A40_ATTN_FLOPS = 45e12
# On-demand list prices per GPU-hour (USD): Modal's per-second GPU prices × 3,600
# (https://modal.com/pricing, as listed in 2026: H100 $0.001097/s, A100 80 GB $0.000694/s).
# Modal lists no A40 (nor A100 40 GB): those profiles carry no cost.
_H100_COST = 3.95
_A100_COST = 2.50

_LLAMA2_7B_KV_LAYER = 16_384  # 2 (K, V) * 32 KV heads * 128 dims * 2 bytes
_LLAMA3_8B_KV_LAYER = 4_096  # 2 (K, V) * 8 KV heads * 128 dims * 2 bytes


@dataclass(frozen=True, slots=True)
class _Model:
    model_name: str
    label: str
    weights_gib: float
    kv_bytes_per_token_per_layer: int
    max_model_len: int


@dataclass(frozen=True, slots=True)
class _Gpu:
    label: str
    memory_gib: float
    bandwidth_bytes_per_s: float
    attention_flops_per_s: float
    max_num_seqs: int
    """vLLM 0.32 `vllm serve` defaults: 1024 sequences and 8192 batched tokens on a
    >= 70 GiB non-A100 GPU, 256 / 2048 on A100 and other GPUs
    (https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/engine/arg_utils.py)."""
    max_num_batched_tokens: int
    accelerator: str
    """Its hardware class (:mod:`sluicegate.api.hardware`)."""
    cost_per_hour: float | None = None


_LLAMA2_7B = _Model("meta-llama/Llama-2-7b-hf", "Llama-2-7B", 12.55, _LLAMA2_7B_KV_LAYER, 4096)
_LLAMA3_8B = _Model("meta-llama/Meta-Llama-3-8B", "Llama-3-8B", 14.99, _LLAMA3_8B_KV_LAYER, 8192)
_H100 = _Gpu(
    "H100 80GB", _H100_GIB, _H100_BW, _H100_ATTN_FLOPS, 1024, 8192, "h100-80gb", _H100_COST
)
_A100 = _Gpu("A100 80GB", _H100_GIB, _A100_BW, _A100_ATTN_FLOPS, 256, 2048, "a100-80gb", _A100_COST)
_A100_40GB = replace(
    _A100, label="A100 40GB", memory_gib=_A100_40GB_GIB, accelerator="a100-40gb", cost_per_hour=None
)
_A40 = _Gpu("A40 48GB", _A40_GIB, _A40_BW, _A40_ATTN_FLOPS, 256, 2048, "a40-48gb")


def _profile(
    name: str, model: _Model, gpu: _Gpu, column: str, fit: tuple[float, float]
) -> EngineProfile:
    """``model`` on one ``gpu`` with vLLM's defaults; linear-layer times from the
    calibration ``column`` fitted with ``fit`` (see LinearOpsCurve.from_calibration)."""
    kv_layer = model.kv_bytes_per_token_per_layer
    return EngineProfile(
        name=name,
        description=f"{model.label} on one {gpu.label}, vLLM 0.32 defaults",
        model_name=model.model_name,
        linear_ops=LinearOpsCurve.from_calibration(column, *fit),
        num_layers=32,
        hidden_size=4096,
        kv_bytes_per_token_per_layer=kv_layer,
        memory_bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s,
        attention_flops_per_s=gpu.attention_flops_per_s,
        num_gpu_blocks=kv_blocks_for(
            gpu.memory_gib, 0.92, model.weights_gib + _ACTIVATION_AND_RUNTIME_GIB, kv_layer * 32
        ),
        max_num_seqs=gpu.max_num_seqs,
        max_num_batched_tokens=gpu.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        accelerator=gpu.accelerator,
        cost_per_hour=gpu.cost_per_hour,
    )


# Qwen2.5-32B on two H100s, tensor parallel 2 — the set-up of llm-d's precise prefix-cache
# benchmark ("KV-Cache Wins You Can See", 2025-09-24, https://llm-d.ai/blog/kvcache-wins-you-can-see:
# 8 pods of 2 × H100, Qwen-32B, 307,328 tokens of KV cache per pod).
# LIN(n): vidur's H100 measurements of the closest dense model it profiles at TP 2,
# CodeLlama-34B (data/profiling/compute/h100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv,
# rows num_tensor_parallel_workers = 2, https://github.com/microsoft/vidur at 7d475133):
# 48 layers × the per-layer medians of the same ops as calibration.csv, scaled by the ratio
# of the two models' linear-layer weights (Qwen2.5-32B: 64 layers, hidden 5120, 8 KV heads
# of 128, FFN 27648 — its config.json on the model hub; CodeLlama-34B: 48, 8192, 8 × 128,
# 22016): 31.2 B / 33.2 B = 0.939; plus two all-reduces per layer (64 × 2) of n × 5120
# bf16 values between two H100s, vidur's network/h100_dgx/all_reduce.csv (num_workers 2).
# Points (tokens, ms) and the least-squares fit of every profiled n ≥ 512.
_QWEN32B_TP2_LIN = (
    (1, 13.03), (16, 13.68), (32, 17.38), (64, 18.50), (128, 16.63), (256, 22.59),
    (384, 28.72), (512, 32.30), (768, 46.94), (1024, 61.01), (1536, 90.66),
    (2048, 112.11), (3072, 172.77), (4096, 223.06),
)  # fmt: skip
_QWEN32B_TP2_FIT = (9.41, 52.74)  # ms + µs per token


def _qwen32b_2x_h100() -> EngineProfile:
    """Qwen2.5-32B, two H100 80 GB, tensor parallel 2 (see the comment above for LIN).

    KV: 307,328 tokens (the published per-pod size) = 19,208 blocks of 16; 2 · 8 KV heads
    · 128 · 2 bytes = 4,096 bytes per token per layer, 64 layers. Each GPU holds half the
    heads and reads its half of the KV in decode: the pair's bandwidth and attention FLOP
    rate are twice one H100's (the same per-GPU assumptions as the 8B profiles). Batch
    limits: vLLM 0.32 defaults on H100; context: Qwen2.5-32B's 32,768.
    """
    xs = tuple(float(n) for n, _ in _QWEN32B_TP2_LIN)
    ys = tuple(ms for _, ms in _QWEN32B_TP2_LIN)
    return EngineProfile(
        name="qwen2.5-32b-2xh100-tp2",
        description="Qwen2.5-32B on two H100 80GB, tensor parallel 2, vLLM 0.32 defaults",
        model_name="Qwen/Qwen2.5-32B",
        linear_ops=LinearOpsCurve(xs, ys, _QWEN32B_TP2_FIT[0], _QWEN32B_TP2_FIT[1] / 1000.0),
        num_layers=64,
        hidden_size=5120,
        kv_bytes_per_token_per_layer=4_096,
        memory_bandwidth_bytes_per_s=2 * _H100_BW,
        attention_flops_per_s=2 * _H100_ATTN_FLOPS,
        num_gpu_blocks=307_328 // 16,
        max_num_seqs=_H100.max_num_seqs,
        max_num_batched_tokens=_H100.max_num_batched_tokens,
        max_model_len=32_768,
    )


def _builtin_profiles() -> dict[str, EngineProfile]:
    profiles = [
        _profile("llama2-7b-h100", _LLAMA2_7B, _H100, "h100_llama2_7b_ms", (2.87, 20.45)),
        _profile("llama3-8b-h100", _LLAMA3_8B, _H100, "h100_llama3_8b_est_ms", (4.51, 21.21)),
        replace(
            _profile("llama3.1-8b-h100", _LLAMA3_8B, _H100, "h100_llama3_8b_est_ms", (4.51, 21.21)),
            # Llama-3.1-8B: Llama-3-8B's architecture with a 128K context; the memory
            # split above was measured on it (with max-model-len 16000).
            description="Llama-3.1-8B (128K context) on one H100 80GB, vLLM 0.32 defaults",
            model_name="meta-llama/Llama-3.1-8B",
            max_model_len=131_072,
        ),
        _profile("llama2-7b-a100", _LLAMA2_7B, _A100, "a100_llama2_7b_ms", (2.14, 64.62)),
        _profile("llama3-8b-a100", _LLAMA3_8B, _A100, "a100_llama3_8b_ms", (6.40, 67.19)),
        # The 40 GB A100: the same compute, the KV cache of 39.39 GiB usable memory.
        _profile("llama3-8b-a100-40gb", _LLAMA3_8B, _A100_40GB, "a100_llama3_8b_ms", (6.40, 67.19)),
        _qwen32b_2x_h100(),
        # A40: vidur's measured A40 Llama-2-7B profile
        # (data/profiling/compute/a40/meta-llama/Llama-2-7b-hf/mlp.csv at 7d475133); for
        # Llama-3-8B scaled by the A100 Llama-3-8B / Llama-2-7B ratio, as on H100.
        _profile("llama2-7b-a40", _LLAMA2_7B, _A40, "a40_llama2_7b_ms", (4.99, 127.09)),
        _profile("llama3-8b-a40", _LLAMA3_8B, _A40, "a40_llama3_8b_est_ms", (14.18, 133.54)),
        EngineProfile(
            name="tiny",
            description="a toy engine for fast tests: 8,192-token KV, 16 sequences, ~2 ms steps",
            model_name="tiny-llama",
            linear_ops=LinearOpsCurve.affine(1.5, 0.004),
            num_layers=4,
            hidden_size=512,
            kv_bytes_per_token_per_layer=2_048,
            memory_bandwidth_bytes_per_s=2.7e11,
            attention_flops_per_s=30e12,
            num_gpu_blocks=512,
            block_size=16,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            max_model_len=4096,
            max_loras=2,
            lora_load_ms=5.0,
            step_overhead_ms=0.2,
        ),
    ]
    return {p.name: p for p in profiles}


PROFILES: dict[str, EngineProfile] = _builtin_profiles()


def profile_mix(text: str) -> list[tuple[EngineProfile, int | None]]:
    """The profiles of a pool as ``--profile`` gives them: ``NAME`` or ``NAME:COUNT``
    entries joined by ``,`` (e.g. ``llama3-8b-h100:2,llama3-8b-a100:4``), in order; a
    count is None where not given. Raises ``KeyError`` for an unknown profile and
    ``ValueError`` for a malformed entry."""
    out: list[tuple[EngineProfile, int | None]] = []
    for entry in text.split(","):
        name, colon, count = entry.strip().partition(":")
        if not name or (colon and not (count.isdigit() and int(count) >= 1)):
            raise ValueError(
                f"profile entry {entry!r} is not NAME or NAME:COUNT (a count of at least 1)"
            )
        out.append((get_profile(name), int(count) if colon else None))
    return out


def get_profile(name: str) -> EngineProfile:
    """The built-in profile called ``name``; raises ``KeyError`` naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown engine profile {name!r}; known profiles: {known}") from None
