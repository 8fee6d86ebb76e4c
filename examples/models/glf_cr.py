"""A GLF-CR-shaped cloud-removal network, written for trainplan (seed 003's model; our own code).

GLF-CR (global-local fusion for cloud removal, Xu et al. 2022) restores a cloudy Sentinel-2
optical image (13 bands) with a co-registered Sentinel-1 SAR image (2 bands). Its shape, which is
all a memory and time plan needs, with the published hyper-parameters as defaults:

    space-to-depth by 2 (pixel unshuffle): 128 x 128 crops become 64 x 64 maps of 4x the bands
    shallow features per stream: 5x5 conv to G0 = 96 channels, then 3x3 conv
    D = 6 residual dense blocks (Zhang et al., "Residual Dense Network", 2018), each of
        C = 5 dense layers of growth G = 48 on both streams; every dense layer fuses SAR into the
        optical features with a windowed transformer block (8 x 8 windows, 8 heads, MLP ratio 2:
        Swin-style) and ends with a 3x3 local fusion conv and a residual
    global feature fusion: concat of the D block outputs -> 1x1 -> 3x3, plus the shallow features
    tail: 3x3 conv to 4 x 13 channels, pixel shuffle back to 128 x 128, added to the cloudy input

It is not the authors' code; it has their layer types, widths and data flow, so its parameters,
activations and FLOPs scale the same way. The loss trainplan traces is the mean of the output
(a surrogate that back-propagates through every output, as an L1 loss would).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WindowBlock(nn.Module):
    """Transformer block over non-overlapping w x w windows: LN, MHSA on [optical | SAR] keys and
    values with optical queries, LN, MLP. Input and output (B, C, H, W)."""

    def __init__(self, dim: int, heads: int, window: int, mlp_ratio: float):
        super().__init__()
        self.heads, self.window = heads, window
        self.norm_q, self.norm_kv = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(),
                                 nn.Linear(int(dim * mlp_ratio), dim))

    def _windows(self, x):                       # (B, C, H, W) -> (B * nW, w*w, C)
        b, c, h, w = x.shape
        ws = self.window
        x = x.view(b, c, h // ws, ws, w // ws, ws).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(-1, ws * ws, c)

    def forward(self, opt, sar):
        b, c, h, w = opt.shape
        ws, nh = self.window, self.heads
        x = self._windows(opt)                                             # (B*nW, T, C)
        y = self._windows(sar)
        q = self.q(self.norm_q(x)).view(x.shape[0], -1, nh, c // nh).transpose(1, 2)
        kv = self.kv(self.norm_kv(torch.cat([x, y], dim=1)))               # (B*nW, 2T, 2C)
        k, v = kv.view(x.shape[0], -1, 2, nh, c // nh).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)                        # (B*nW, nh, T, d)
        x = x + self.proj(a.transpose(1, 2).reshape(x.shape))
        x = x + self.mlp(self.norm2(x))
        x = x.view(b, h // ws, w // ws, ws, ws, c).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(b, c, h, w)


class DenseLayer(nn.Module):
    """One dense layer on both streams: 3x3 conv + ReLU each, SAR fused into optical by
    attention, outputs concatenated to the inputs (growth G per stream)."""

    def __init__(self, cin: int, growth: int, heads: int, window: int, mlp_ratio: float):
        super().__init__()
        self.conv = nn.Conv2d(cin, growth, 3, padding=1)
        self.conv_sar = nn.Conv2d(cin, growth, 3, padding=1)
        self.fuse = WindowBlock(growth, heads, window, mlp_ratio)

    def forward(self, opt, sar):
        o = F.relu(self.conv(opt))
        s = F.relu(self.conv_sar(sar))
        return torch.cat([opt, self.fuse(o, s)], 1), torch.cat([sar, s], 1)


class RDB(nn.Module):
    def __init__(self, g0: int, growth: int, layers: int, heads: int, window: int, mlp_ratio: float):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(g0 + i * growth, growth, heads, window, mlp_ratio)
                                    for i in range(layers))
        self.lff = nn.Conv2d(g0 + layers * growth, g0, 3, padding=1)
        self.lff_sar = nn.Conv2d(g0 + layers * growth, g0, 3, padding=1)

    def forward(self, opt, sar):
        o, s = opt, sar
        for layer in self.layers:
            o, s = layer(o, s)
        return opt + self.lff(o), sar + self.lff_sar(s)


class GLFCR(nn.Module):
    def __init__(self, optical_bands: int = 13, sar_bands: int = 2, g0: int = 96, blocks: int = 6,
                 layers: int = 5, growth: int = 48, heads: int = 8, window: int = 8,
                 mlp_ratio: float = 2.0):
        super().__init__()
        self.sfe1 = nn.Conv2d(4 * optical_bands, g0, 5, padding=2)
        self.sfe2 = nn.Conv2d(g0, g0, 3, padding=1)
        self.sfe1_sar = nn.Conv2d(4 * sar_bands, g0, 5, padding=2)
        self.sfe2_sar = nn.Conv2d(g0, g0, 3, padding=1)
        self.blocks = nn.ModuleList(RDB(g0, growth, layers, heads, window, mlp_ratio)
                                    for _ in range(blocks))
        self.gff = nn.Sequential(nn.Conv2d(blocks * g0, g0, 1), nn.Conv2d(g0, g0, 3, padding=1))
        self.tail = nn.Conv2d(g0, 4 * optical_bands, 3, padding=1)

    def forward(self, optical, sar):
        f1 = self.sfe1(F.pixel_unshuffle(optical, 2))                      # (B, G0, H/2, W/2)
        o = self.sfe2(f1)
        s = self.sfe2_sar(self.sfe1_sar(F.pixel_unshuffle(sar, 2)))
        outs = []
        for block in self.blocks:
            o, s = block(o, s)
            outs.append(o)
        o = self.gff(torch.cat(outs, 1)) + f1
        return optical + F.pixel_shuffle(self.tail(o), 2)


def build(**kw) -> GLFCR:
    """trainplan factory: the job's `model_args` are passed here."""
    return GLFCR(**kw)
