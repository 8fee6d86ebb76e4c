"""Mixture-of-Experts layers on fake tensors: the routing assumption, and the grouped GEMM.

transformers >= 5 stores a MoE layer's experts as 3-D parameters (`gate_up_proj` (E, 2I, H),
`down_proj` (E, H, I)) in classes decorated with `@use_experts_implementation`
(transformers/integrations/moe.py). Their default forward, `grouped_mm_experts_forward`
(`get_correct_experts_implementation` picks "grouped_mm" for every such class), sorts the
T x k (token, expert) pairs by expert, counts them per expert with `histc`, and runs each
projection as one `torch._grouped_mm` whose `offs` mark where each expert's rows end. No tensor
*shape* there depends on the router's choices: the grouped GEMM's input and output have T x k
rows whatever the split. Only the split itself is data (which fake tensors do not have).

Routing assumption (stated in every MoE trace's notes):

* default, dropless (transformers, Megatron-Core's default): every token goes to its top-k
  experts and nothing is dropped; the T x k pairs are spread uniformly, T*k/E per expert. The
  grouped GEMMs' FLOPs are 2 x (T*k) x in x out whatever the split (the kernel computes each
  expert's rows once), their activations hold T*k rows.
* capacity factor c >= 1 (GShard/Switch, DeepSpeed-MoE `capacity_factor`, Megatron
  `--moe-expert-capacity-factor` with `--moe-pad-expert-input-to-capacity`): every expert gets a
  buffer of C = ceil(c*T*k/E) rows (the busiest expert may take c times the uniform share;
  tokens over capacity are dropped, unused slots are padding), so the experts' GEMMs, FLOPs and
  saved activations are those of E*C rows, c times the dropless ones. Traced by
  `capacity_experts_forward` below, which replaces the experts' forward.

Parameters are not affected: every expert is a parameter of every device (no expert
parallelism here), so weights, gradients and optimizer states count all E experts while
activations and FLOPs count the routed rows only.

CUDA's `_grouped_mm` takes fp32, fp16 and bf16 operands (aten/src/ATen/native/GroupedMMUtils.h,
`_grouped_mm_validate_inputs`): bf16 runs the CUTLASS grouped kernel on sm90/sm100, any other
dtype the fallback, one `mm` per group (`_grouped_mm_fallback`). PyTorch's meta kernel accepts
bf16 only (torch/_meta_registrations.py `_meta_grouped_mm_common`), so under AMP, where
transformers calls `_grouped_mm(input.to(weight.dtype), weight)` with the fp32 master weight
(autocast has no rule for `_grouped_mm`: it is on none of the CUDA autocast lists), the fake
device raised "Expected inputs of BF16 type". `grouped_mm_fake` gives the CUDA kernel's output
instead (counters.py calls it): under AMP the experts really compute, and keep their
activations, in fp32.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..errors import TrainplanError

aten = torch.ops.aten
GROUPED_MM = aten._grouped_mm.default


@dataclass(frozen=True)
class Routing:
    """How tokens are assumed to reach the experts (fake tensors carry no router output).

    capacity_factor: None for dropless routing (every token's top-k experts compute it; the
        pairs are spread uniformly, T*k/E per expert); c >= 1 for capacity-based dispatch with
        C = ceil(c * T*k/E) rows per expert.
    """

    capacity_factor: float | None = None

    def __post_init__(self):
        c = self.capacity_factor
        if c is not None and not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 1):
            raise TrainplanError(f"MoE capacity factor {c!r} is below 1.",
                                 allowed="a number >= 1 (1.0 = exactly the uniform share), or "
                                         "none for dropless routing",
                                 fix="use e.g. 1.25, as GShard/Switch/DeepSpeed-MoE do")

    def rows_per_expert(self, pairs: int, experts: int) -> float:
        """Rows each expert computes for `pairs` = tokens x top_k routed pairs: the uniform share
        T*k/E (dropless), or the capacity C = ceil(c * T*k/E)."""
        if self.capacity_factor is None:
            return pairs / experts
        return capacity(pairs, experts, self.capacity_factor)


def capacity(pairs: int, experts: int, factor: float) -> int:
    """Expert capacity C = ceil(c * T*k / E) (GShard eq. / Switch Transformer's
    `expert_capacity = tokens_per_batch / num_experts * capacity_factor`), at least 1."""
    return max(1, math.ceil(factor * pairs / experts - 1e-9))


def routing_for(job) -> Routing:
    """The routing assumption of `job` (Job.moe_capacity_factor)."""
    return Routing(job.moe_capacity_factor)


# -- the experts modules of a model -------------------------------------------------------------

def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Modules built by transformers' `@use_experts_implementation` (3-D expert weights)."""
    return [(n, m) for n, m in model.named_modules()
            if hasattr(m, "_is_expert_parallel") and hasattr(m, "num_experts")
            and (hasattr(m, "down_proj") or hasattr(m, "up_proj"))]


def expert_footprint(model: torch.nn.Module, tokens: int, top_k: int | None
                     ) -> tuple[int, int, int]:
    """(bytes of expert parameters as stored, of those trainable, elements an expert-parallel
    all-to-all sends per direction for one micro-batch: T x k x hidden summed over MoE layers)."""
    stored = trainable = dispatch = 0
    for _n, m in experts_modules(model):
        ps = list(m.parameters(recurse=False)) or list(m.parameters())
        stored += sum(p.numel() * p.element_size() for p in ps)
        trainable += sum(p.numel() * p.element_size() for p in ps if p.requires_grad)
        hidden = getattr(m, "hidden_dim", None) or getattr(m, "hidden_size", None) or (
            m.down_proj.shape[1] if hasattr(m, "down_proj") else 0)
        dispatch += tokens * (top_k or 1) * int(hidden)
    return stored, trainable, dispatch


def _legacy_moe(model: torch.nn.Module) -> str | None:
    """A transformers 4.x sparse-MoE block (an expert loop over `torch.where`/`nonzero`)."""
    for m in model.modules():
        name = type(m).__name__
        if "SparseMoe" in name or name.endswith("MoeBlock") or name.endswith("MoEBlock"):
            if isinstance(getattr(m, "experts", None), torch.nn.ModuleList):
                return name
    return None


def configure(model: torch.nn.Module, routing: Routing, top_k: int | None = None) -> list[str]:
    """Make every experts module of `model` run the grouped-GEMM path under `routing`; returns
    the notes that state the assumption (empty for a model without experts).

    Dropless: transformers' own `grouped_mm_experts_forward`, what a GPU run executes by
    default (set explicitly: a config asking for the "eager" expert loop would index experts by
    `nonzero`, which has no shape on fake tensors). Capacity factor: `capacity_experts_forward`.
    """
    mods = experts_modules(model)
    if not mods:
        legacy = _legacy_moe(model)
        if legacy:
            raise TrainplanError(
                f"{legacy} loops over experts with data-dependent indexing (torch.where / "
                "nonzero), which fake tensors cannot size.",
                fix="use transformers >= 5, whose MoE layers run grouped GEMMs "
                    "(experts_implementation='grouped_mm')")
        return []
    from transformers.integrations.moe import grouped_mm_experts_forward
    for _name, m in mods:
        if routing.capacity_factor is None:
            m.forward = functools.partial(grouped_mm_experts_forward, m)
        else:
            m.forward = functools.partial(capacity_experts_forward, m,
                                          capacity_factor=routing.capacity_factor)
    e = {m.num_experts for _n, m in mods}
    experts = "/".join(str(x) for x in sorted(e))
    k = f"top-{top_k}" if top_k else "top-k"
    if routing.capacity_factor is None:
        how = (f"MoE routing assumed uniform and dropless: each token's {k} experts compute it, "
               f"each of the {experts} experts gets T*k/E of the T*k (token, expert) pairs "
               "(transformers' grouped_mm experts); weights, gradients and optimizer states count "
               "every expert, activations and FLOPs the routed pairs only")
    else:
        how = (f"MoE routing with capacity factor {routing.capacity_factor:g}: each of the "
               f"{experts} experts computes a padded buffer of ceil({routing.capacity_factor:g} "
               f"x T*k/E) rows ({k}); activations and expert FLOPs scale with it")
    return [how]


def top_k_of(config) -> int | None:
    """The number of experts each token is routed to, from the model's config."""
    get = getattr(config, "get_text_config", None)
    cfg = get() if get else config
    for key in ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k",
                "experts_per_token"):
        v = getattr(cfg, key, None)
        if isinstance(v, int):
            return v
    return None


def capacity_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor, *, capacity_factor: float
                             ) -> torch.Tensor:
    """Capacity-based dispatch with transformers' grouped GEMMs: the T*k pairs, sorted by expert
    as `grouped_mm_experts_forward` sorts them, fill E buffers of C = ceil(c*T*k/E) rows
    (gathered: Megatron's permute with padding); each projection is one grouped GEMM over the
    E*C rows; the weighted rows are summed back onto their tokens with scatter_add (Megatron's
    `unpermute`; its backward keeps only the indices, as transformers' reshape-and-sum). Which pair
    lands in which slot is the router's data, which fake tensors do not have: the gather
    indices stand for it, only their count (E*C) matters."""
    from transformers.integrations.moe import _grouped_linear
    device = hidden_states.device
    num_tokens, num_top_k = hidden_states.size(0), top_k_index.size(-1)
    experts = self.num_experts
    pairs = num_tokens * num_top_k
    cap = capacity(pairs, experts, capacity_factor)
    sample_weights = top_k_weights.reshape(-1)
    _expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
    slot = torch.arange(experts * cap, device=device) % pairs   # slot -> sorted pair (stand-in)
    pair = perm[slot]
    token = pair // num_top_k
    dispatched = hidden_states[token]                          # (E*C, H)
    weights = sample_weights[pair]
    offsets = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * cap
    slot_expert = torch.arange(experts * cap, device=device) // cap
    if self.has_gate:
        w_up = self.gate_up_proj
        b_up = self.gate_up_proj_bias[slot_expert] if self.has_bias else None
    else:
        w_up = self.up_proj
        b_up = self.up_proj_bias[slot_expert] if self.has_bias else None
    out = _grouped_linear(dispatched, w_up, offsets, bias=b_up, is_transposed=self.is_transposed)
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    b_down = self.down_proj_bias[slot_expert] if self.has_bias else None
    out = _grouped_linear(out, self.down_proj, offsets, bias=b_down,
                          is_transposed=self.is_transposed)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    out = out * weights.unsqueeze(-1)
    combined = torch.zeros(num_tokens, out.size(-1), device=device, dtype=out.dtype)
    combined = combined.scatter_add(0, token.unsqueeze(1).expand(-1, out.size(-1)), out)
    return combined.to(hidden_states.dtype)


# -- the grouped GEMM kernel ----------------------------------------------------------------------

def _args(args, kwargs):
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    bias = args[3] if len(args) > 3 else kwargs.get("bias")
    out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
    return a, b, offs, bias, out_dtype


def grouped_mm_fake(*args, **kwargs) -> torch.Tensor:
    """`aten._grouped_mm` as CUDA runs it, for operands the meta kernel refuses (fp32, fp16): the
    checks of `_grouped_mm_validate_inputs` and the output of `create_grouped_gemm_output_tensor`
    (aten/src/ATen/native/GroupedMMUtils.h; rows padded to 16 bytes for TMA). Called inside the
    fake mode, so the output is a fake tensor."""
    a, b, offs, bias, out_dtype = _args(args, kwargs)
    ok = (torch.float32, torch.float16, torch.bfloat16)
    if a.dtype not in ok or b.dtype not in ok:
        raise RuntimeError(f"_grouped_mm: expected float32, bfloat16 or float16 operands, got "
                           f"{a.dtype} and {b.dtype}")
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise RuntimeError("_grouped_mm: mat_a and mat_b have to be 2 or 3d")
    a2, b2 = a.dim() == 2, b.dim() == 2
    if (not a2 or not b2) and a.size(-1) != b.size(-2):
        raise RuntimeError("_grouped_mm: contraction dimension of mat_a and mat_b must match")
    if (offs is not None) != (a2 or b2):
        raise RuntimeError("_grouped_mm: offsets are needed exactly when a matrix is 2d")
    if bias is not None:
        raise RuntimeError("_grouped_mm: bias not supported yet")
    dtype = out_dtype or a.dtype
    if dtype != a.dtype:
        raise RuntimeError("_grouped_mm: output dtype must match mat_a's dtype")
    if a2:
        size = [offs.size(0), a.size(0), b.size(1)] if b2 else [a.size(0), b.size(-1)]
    else:
        size = [a.size(1), b.size(1)] if b2 else [a.size(0), a.size(1), b.size(-1)]
    align = 16 // dtype.itemsize
    padded = (size[-1] + align - 1) // align * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=a.device)


def needs_fake(args, kwargs) -> bool:
    """True where PyTorch's meta kernel would refuse operands the CUDA kernel takes."""
    a, b = args[0], args[1]
    return not (a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16)


def grouped_mm_flops(args, kwargs) -> float:
    """FLOPs of one grouped GEMM: 2 x rows x in x out summed over the groups.

    2d x 3d (the forward, and the backward's input gradient): (R, K) rows split by `offs` over E
    (K, N) matrices: 2*R*K*N. All R rows are assumed routed (offs[-1] = R: nothing is dropped,
    no expert-parallel sentinel rows; see the module docstring). 2d x 2d (the weight gradient):
    (K, R) x (R, N) split along R into E (K, N) results: 2*K*R*N. 3d x 2d: 2*M*K*R. 3d x 3d: a
    batched GEMM, 2*E*M*K*N.
    """
    a, b, _offs, _bias, _dt = _args(args, kwargs)
    if a.dim() == 2 and b.dim() == 2:
        return 2.0 * a.size(0) * a.size(1) * b.size(1)
    if a.dim() == 2:
        return 2.0 * a.size(0) * a.size(1) * b.size(-1)
    if b.dim() == 2:
        return 2.0 * a.size(1) * a.size(2) * b.size(1)
    return 2.0 * a.size(0) * a.size(1) * a.size(2) * b.size(-1)
