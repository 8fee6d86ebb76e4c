"""Device time of a matrix-multiply or attention kernel from its shape, tiled over the GPU's SMs.

A GEMM kernel (cuBLAS, CUTLASS, cuDNN's implicit GEMM) cuts its M x N output into tiles of
tm x tn; each tile is one thread block, which walks the K dimension and runs on one SM. So with
S SMs and T = batch x ceil(M / tm) x ceil(N / tn) tiles, the kernel runs in ceil(T / S) waves,
the last one partly empty (wave quantisation), and every tile computes its whole tm x tn even
where the matrix ends inside it (tile quantisation). NeuSight (Lee et al., ASPLOS 2025,
arXiv:2407.13853) predicts GEMMs to a few percent on GPUs it was not fitted on this way. Per wave:

    t_wave = 2 tm tn K_s x (tiles an SM runs at once) / (P_sm x e_max x e_tile) + tile_s

P_sm is the SM's share of the dense peak for the dtype (the catalog's rate x the sustained clock
/ S); e_max the device's measured best-shape matmul ceiling (timing.matmul_ceiling: a large
square GEMM on the biggest tile reaches it); tile_s the fixed time of a wave (the pipeline's
prologue before the first multiply and the epilogue that writes the tile: memory latency and
stores, not multiplies, so a time, fitted); e_tile = 1 for the biggest tile and less for smaller
ones, which read more operand bytes per multiply: a tile's operand reuse is its harmonic size
h = tm tn / (tm + tn) (64 for 128 x 128), and e_tile = (h / (h + h_half)) / (h_max / (h_max +
h_half)), h_half fitted. Small tiles run several to an SM (occupancy); narrow ones (down to 64 x
8, cuBLAS's skinny kernels) serve a GEMM with few columns. Where the tiles fill less than the
SMs, cuBLAS splits K over s thread blocks and sums their partial tiles (s x M x N fp32 written
and read back): K_s = ceil(K / s). The split is not capped below what fills the device:
CUTLASS's GemmSplitKParallel takes any `split_k_slices` (NVIDIA/cutlass
examples/06_splitK_gemm), and cuDNN's weight gradients split their reduction over the N x Ho x Wo
pixels (its computeWgradSplitKOffset kernels); a ResNet stem's weight gradient at batch 512 (a
64 x 147 output, 6.4M pixels reduced) fills the SMs only at a split in the hundreds, where 16
left it at a quarter of the rate. The partial tiles' traffic prices a split out wherever the
tiles already fill the device. The library picks its tile and split by heuristics close to
the fastest one; this model takes the fastest candidate (TILES) and split. The kernel never
beats the bandwidth: at least its bytes / (bandwidth x STREAM fraction).

Attention (FlashAttention-2, PyTorch's memory-efficient and cuDNN kernels) is tiled over
(batch x heads) x query blocks of `ATTN_BLOCK_Q` rows: the same wave quantisation over its work
items, at the fused kernel's ceiling (timing.attention_emax) for the head dimension D and the
keys S a work item walks: e = [D / (D + d_half)] / [128 / (128 + d_half)] x S / (S + s_half),
d_half and s_half read off FlashAttention-2's published throughput (efficiency.json).

Hardware facts (SMs, clock, L2) are data/gpu_kernels.csv rows (accelerators.kernel_facts); a GPU
without a row is timed as a whole device (one wave per op: no quantisation).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..trace.shapes import ATTN_INTS, GEMM_INTS

# thread-block tiles (tm, tn) of the GEMM kernels cuBLAS and CUTLASS pick from on Volta through
# Hopper (CUTLASS's default sm70/sm75/sm80/sm90 configurations, and cuBLAS's skinny kernels seen
# in public profiles, e.g. 64x8: docs/kernel_ceilings_research.md section d); both orientations
TILES = np.array([(256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64),
                  (128, 32), (32, 128), (64, 16), (16, 64), (64, 8), (8, 64)], float)
MAX_TILES_PER_SM = 8       # thread blocks an SM holds at once, at most
SPLITS = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256], float)  # K splits
MIN_SPLIT_K = 128          # no split leaves a block fewer than this many of K
ATTN_BLOCK_Q = 128         # FlashAttention-2's forward query block (sm80+, D <= 128)
# ATen/native/cuda/MultiTensorApply.cuh: depth_to_max_tensors, depth_to_max_blocks, kChunkSize
MAX_TENSORS = (110, 64, 48, 36, 30)
MAX_BLOCKS = 320
CHUNK = 65536


@functools.lru_cache(maxsize=64)
def tile_efficiency(h_half: float) -> np.ndarray:
    """e_tile of each of TILES (module docstring): 1 for the largest harmonic size."""
    h = TILES[:, 0] * TILES[:, 1] / (TILES[:, 0] + TILES[:, 1])
    e = h / (h + h_half)
    return e / e.max()


def gemm_rows(shape_col: np.ndarray, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every GEMM of the ops `ops` (indices into an op table), as (op index per GEMM, an
    array of (batch, M, N, K) rows); an op without a shape (a table made before shapes were
    traced) has none."""
    owner, dims = [], []
    for i in ops:
        sh = shape_col[i]
        for j in range(0, len(sh) - GEMM_INTS + 1, GEMM_INTS):
            owner.append(i)
            dims.append(sh[j:j + 4])
    return (np.asarray(owner, dtype=np.int64),
            np.asarray(dims, dtype=float).reshape(-1, 4))


@dataclass(frozen=True)
class GemmGrid:
    """Each GEMM x tile x split-K candidate, what no parameter changes: the tile work its waves
    do (waves x tiles an SM runs at once x 2 tm tn), the K each block walks, and the bytes of a
    split's partial tiles (inf where a split leaves a block too little of K)."""

    work: np.ndarray         # (G, tiles, splits)
    k_split: np.ndarray
    waves: np.ndarray
    partial_bytes: np.ndarray


def gemm_grid(dims: np.ndarray, sms: int) -> GemmGrid:
    b, m, n, k = (dims[:, i, None, None] for i in range(4))
    tm, tn = TILES[None, :, 0, None], TILES[None, :, 1, None]
    s = SPLITS[None, None, :]
    per_sm = np.clip(np.floor(128 * 128 / (tm * tn)), 1.0, MAX_TILES_PER_SM)  # small tiles share
    blocks = b * np.ceil(m / tm) * np.ceil(n / tn)                            # an SM
    waves = np.ceil(blocks * s / (sms * per_sm))
    partial = np.where(s > 1, 8.0 * s * b * m * n, 0.0)
    partial = np.where((s == 1) | (k / s >= MIN_SPLIT_K), partial, np.inf)
    return GemmGrid(waves * per_sm * 2.0 * tm * tn, np.ceil(k / s), waves, partial)


def gemm_candidates(grid: GemmGrid, rate: np.ndarray, sms: int, tile_s: float, h_half: float,
                    bandwidth: float) -> np.ndarray:
    """Seconds of each GEMM (the rows of `grid`) at each tile and split of K, (G, tiles,
    splits): on `sms` SMs, `rate` the FLOP/s the whole device reaches on it at the best tile
    (peak x ceiling, per GEMM), a split's partial tiles (fp32, written and read back once) at
    `bandwidth` (module docstring)."""
    r_sm = (rate[:, None, None] / sms) * tile_efficiency(h_half)[None, :, None]
    return grid.work * grid.k_split / r_sm + grid.waves * tile_s + grid.partial_bytes / bandwidth


def gemm_seconds(grid: GemmGrid, rate: np.ndarray, sms: int, tile_s: float, h_half: float,
                 bandwidth: float) -> np.ndarray:
    """Seconds of each GEMM's compute at its fastest tile and split of K (gemm_candidates).
    Without the kernel's bandwidth floor and fixed time, which the caller adds."""
    if not len(rate):
        return np.zeros(0)
    return gemm_candidates(grid, rate, sms, tile_s, h_half, bandwidth).min(axis=(1, 2))


def attention_quantisation(shape: tuple, sms: int, backward: bool) -> float:
    """How much longer than its FLOPs at full occupancy an attention kernel runs: its work items
    (batch x heads x query blocks forward; key blocks backward, where FlashAttention-2
    parallelises over keys) in whole waves over the SMs, >= 1."""
    if len(shape) < ATTN_INTS or sms <= 0:
        return 1.0
    b, h, _hkv, s_q, s_k = shape[:5]
    items = b * h * math.ceil((s_k if backward else s_q) / ATTN_BLOCK_Q)
    if items <= 0:
        return 1.0
    return math.ceil(items / sms) * sms / items


def attention_keys(shape: tuple) -> float:
    """Keys one work item (a query block) walks: all S_k, or under a causal mask the mean over
    the query blocks of the key blocks at or below the diagonal, (n + 1) / 2 of n blocks."""
    if len(shape) < ATTN_INTS:
        return 1024.0
    s_q, s_k, causal = shape[3], shape[4], shape[7]
    if not causal:
        return float(s_k)
    n = max(1, math.ceil(max(s_q, s_k) / ATTN_BLOCK_Q))
    return (n + 1) / 2 * s_k / n


def foreach_launches(shape: tuple, elements: float) -> int:
    """Kernels one multi-tensor op launches: multi_tensor_apply fills a launch with at most
    MAX_TENSORS[depth - 1] tensors and MAX_BLOCKS chunks of CHUNK elements, depth = the tensor
    lists it reads and writes (shape[1])."""
    if not shape:
        return 1
    tensors = shape[0]
    depth = shape[1] if len(shape) > 1 else 1
    max_tensors = MAX_TENSORS[min(max(depth, 1), len(MAX_TENSORS)) - 1]
    return max(1, math.ceil(tensors / max_tensors), math.ceil(elements / CHUNK / MAX_BLOCKS))
