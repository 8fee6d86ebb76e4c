"""An axolotl YAML (`axolotl train config.yml`), read as axolotl reads it
(axolotl-ai-cloud/axolotl@067b021: src/axolotl/utils/schemas/, utils/config/__init__.py
`normalize_config` / `resolve_dtype`, loaders/model.py, core/builders/base.py).

    base_model (base_model_config)      -> model
    sequence_len (default 512)          -> sequence length
    micro_batch_size (default 1)        -> micro-batch; gradient_accumulation_steps, or batch_size
                                           / micro_batch_size (normalize_config)
    adapter lora | qlora, lora_r,       -> LoRA (peft's defaults r 8, alpha 8 where unset;
      lora_alpha, lora_dropout,            lora_target_linear: every linear layer)
      lora_target_modules, lora_target_linear
    load_in_4bit (qlora) / load_in_8bit -> nf4-dq (loaders/model.py: nf4 with double
                                           quantisation) / int8
    bf16 (true | auto) / fp16 / tf32    -> the weights are loaded in that dtype (resolve_dtype:
                                           torch_dtype bf16 / fp16; fp16 also for load_in_8bit)
                                           and the Trainer autocasts: pure bf16 / fp16; "auto"
                                           is bf16 where the GPU has it, fp16 elsewhere (the
                                           plan adapts per platform)
    gradient_checkpointing (+ _kwargs)  -> full checkpointing, non-reentrant unless
                                           use_reentrant: true (builders/base.py default)
    flash_attention / sdp_attention /   -> attention flash / sdpa / efficient / eager
      xformers_attention / eager_attention / attn_implementation
    optimizer (default adamw_torch_fused) -> the HF Trainer's optim names (common.py)
    deepspeed (a path), fsdp / fsdp_config -> strategy and offload (deepspeed.py, trainer.py)
    num_epochs (default 1) / max_steps  -> epochs (with --dataset-size) / steps
    rl dpo | ipo | orpo | simpo | kto | grpo, trl: {...} -> algorithm dpo / grpo with its rollout
"""
from __future__ import annotations

from .. import algorithm as algo_mod
from ..strategy import DEVICES_PER_NODE
from . import deepspeed as ds_mod
from . import trainer as hf
from .common import known_keys, model_ref
from .reading import Collector, Reading, show

UNMODELLED = {
    "sample_packing_sequentially": (False, None),
    "torch_compile": (False, "torch.compile is not modelled: planned eager"),
    "activation_offloading": (False, "activation offloading is not modelled: planned with the "
                                     "activations on the device"),
    "layer_offloading": (False, "layer offloading is not modelled"),
    "lora_modules_to_save": (None, "modules trained in full beside the adapters (their "
                                   "gradients and optimizer state) are not planned"),
    "peft_use_dora": (False, "DoRA's magnitude vectors and extra activations are not modelled: "
                             "planned as LoRA"),
    "unfrozen_parameters": (None, "training only some parameters (by pattern) is not modelled: "
                                  "planned as the adapter / full training the file sets"),
    "relora": (False, "ReLoRA's merge-and-restart is not modelled: planned as LoRA"),
    "lisa_n_layers": (None, "LISA (layerwise sampling) is not modelled"),
    "liger_rope": (False, "Liger kernels are not modelled"),
    "liger_rms_norm": (False, "Liger kernels are not modelled"),
    "liger_glu_activation": (False, "Liger kernels are not modelled"),
    "liger_layer_norm": (False, "Liger kernels are not modelled"),
    "liger_fused_linear_cross_entropy": (False, "the fused linear cross-entropy (no full "
                                                "logits kept) is not modelled"),
    "cut_cross_entropy": (False, "Cut Cross-Entropy (no full logits kept) is not modelled"),
    "chunked_cross_entropy": (False, "chunked cross-entropy is not modelled"),
    "tiled_mlp": (False, "tiled MLP is not modelled"),
    "lora_mlp_kernel": (False, "axolotl's fused LoRA kernels are not modelled"),
    "lora_qkv_kernel": (False, "axolotl's fused LoRA kernels are not modelled"),
    "lora_o_kernel": (False, "axolotl's fused LoRA kernels are not modelled"),
    "sequence_parallel_degree": (None, "sequence parallelism is not modelled"),
    "context_parallel_size": (None, "context parallelism is not modelled"),
    "tensor_parallel_size": (None, "tensor parallelism is not modelled"),
    "dp_shard_size": (None, "N-D parallelism is not modelled: planned sharded over every "
                            "device"),
    "fp8": (False, "fp8 training is not modelled: planned in bf16"),
    "s2_attention": (False, "shifted-sparse attention is not modelled"),
    "flash_attn_cross_entropy": (False, "flash-attn's fused cross-entropy is not modelled"),
    "flash_attn_fuse_mlp": (False, "flash-attn's fused MLP is not modelled"),
    "gptq": (False, "GPTQ-quantised base weights are not modelled: planned unquantised"),
    "val_set_size": (0, "evaluation passes are not planned (their time)"),
    "qat": (None, "quantisation-aware training is not modelled"),
}
ATTENTION_FLAGS = (("flash_attention", "flash"), ("sdp_attention", "sdpa"),
                   ("xformers_attention", "efficient"), ("flex_attention", "sdpa"),
                   ("eager_attention", "eager"))
ATTN_IMPL = {"flash_attention_2": "flash", "flash_attention_3": "flash", "flash": "flash",
             "sdpa": "sdpa", "eager": "eager", "flex_attention": "sdpa", "xformers": "efficient"}
RL = {"dpo": "dpo", "ipo": "dpo", "orpo": "dpo", "simpo": "dpo", "kto": "dpo", "gdpo": "dpo",
      "grpo": "grpo"}
RL_WHY = {"orpo": "ORPO runs chosen and rejected through the policy without a reference model: "
                  "planned as DPO (whose reference forward it does not pay)",
          "simpo": "SimPO runs chosen and rejected without a reference model: planned as DPO",
          "kto": "KTO trains on one completion a sample and runs a no-grad KL forward: planned "
                 "as DPO (two sequences a sample, an upper bound)",
          "gdpo": "planned as DPO"}


def looks_like(data: dict) -> bool:
    return "base_model" in data and bool({"micro_batch_size", "sequence_len", "datasets",
                                          "adapter", "num_epochs"} & set(data))


def read(data: dict, path: str, deepspeed: str | None = None) -> Reading:
    keys, sections = known_keys("axolotl")
    c = Collector("axolotl", path, data, set(keys))
    _model(c)
    seq = c.take("sequence_len")
    if seq is None:
        c.assume("sequence_len not set: 512")
        c.set(seq_len=512)
    else:
        c.read("sequence_len", c.int_("sequence_len", seq), f"sequence length {seq}",
               seq_len=seq)
    mbs = hf.read_batch(c, "micro_batch_size", 1)
    if c.has("gradient_accumulation_steps"):
        gas = hf.read_accum(c)
    elif c.has("batch_size"):
        b = c.int_("batch_size", c.take("batch_size"))
        gas = max(1, b // mbs)
        c.read("batch_size", b, f"gradient accumulation {gas} (batch_size / micro_batch_size)",
               grad_accum=gas)
    else:
        gas = 1
    _precision(c)
    hf.read_checkpointing(c, "gradient_checkpointing", False, reentrant=False)
    _attention(c)
    _adapter(c)
    hf.read_optim(c, "optimizer", "adamw_torch_fused")
    clip = hf.read_clipping(c, passes_zero=False)      # `if cfg.max_grad_norm:`
    _packing(c)
    hf.read_steps(c, "max_steps", "num_epochs", 1.0)
    hf.read_fsdp(c, "fsdp", "fsdp_config", set(sections.get("fsdp_config", ())),
                 config_enables=True)
    hf.read_accelerator_config(c)
    if c.has("fsdp_version"):
        c.read("fsdp_version", c.take("fsdp_version"), "FSDP1 and FSDP2 are planned alike")
    _hybrid(c)
    prec = c.reading.settings.get("precision", "fp32")
    beside = ds_mod.Trainer("axolotl", micro_batch=mbs, grad_accum=gas,
                            bf16=prec.startswith("bf16"), fp16=prec.startswith("fp16"),
                            max_grad_norm=clip)
    hf.read_deepspeed(c, "deepspeed", beside, deepspeed)
    _rl(c, sections)
    c.unmodelled_table({k: v for k, v in UNMODELLED.items() if v[1]})
    return c.finish()


def _hybrid(c: Collector) -> None:
    """axolotl's N-D parallelism with FSDP: `dp_replicate_size` replicas, each sharded over
    `dp_shard_size` GPUs, is hybrid sharding (strategy hsdp: sharded within a node of
    DEVICES_PER_NODE GPUs, replicated across nodes); shard groups of another size are planned
    as a node's."""
    if not c.has("dp_replicate_size") or c.reading.settings.get("strategy") != "fsdp":
        return
    replicas = c.int_("dp_replicate_size", c.take("dp_replicate_size"))
    if replicas < 2:
        c.read("dp_replicate_size", replicas, "one replica: FSDP over every GPU")
        return
    c.read("dp_replicate_size", replicas, f"{replicas} replicas, each sharded: strategy hsdp",
           strategy="hsdp")
    if c.has("dp_shard_size"):
        shard = c.int_("dp_shard_size", c.take("dp_shard_size"))
        if shard == DEVICES_PER_NODE:
            c.read("dp_shard_size", shard, f"each replica sharded over a node's {shard} GPUs")
        else:
            c.unmodelled("dp_shard_size", shard, f"shard groups of {shard} GPUs: planned as a "
                         f"node's {DEVICES_PER_NODE}")


def _model(c: Collector) -> None:
    key = "base_model_config" if c.has("base_model_config") else "base_model"
    name = c.take(key)
    if name is None:
        raise c.error("base_model", "is missing: axolotl needs the model to fine-tune.",
                      fix="add `base_model: <hub id>` (e.g. meta-llama/Llama-3.2-1B)")
    model, meaning = model_ref(name, f"axolotl config {c.reading.path}: {key}", hf.base_dir(c))
    c.read(key, name, meaning, model=model)
    if key == "base_model_config":
        c.read("base_model", c.take("base_model"), "weights only (the architecture is "
                                                   "base_model_config's)")


def _precision(c: Collector) -> None:
    bf16 = c.take("bf16", c.take("bfloat16"))
    fp16 = c.take("fp16", c.take("float16"))
    tf32 = c.take("tf32")
    if bf16 == "auto" and not fp16:
        c.read("bf16", "auto", "precision bf16 (where the GPU has bf16; fp16 elsewhere, as "
                               "the plan adapts per platform): weights loaded in bf16",
               precision="bf16")
    elif bf16 and bf16 != "auto":
        c.read("bf16" if "bf16" in c.data else "bfloat16", bf16,
               "precision bf16 (weights loaded in bf16; the Trainer's autocast on top)",
               precision="bf16")
    elif fp16:
        c.read("fp16" if "fp16" in c.data else "float16", fp16, "precision fp16 (weights loaded "
               "in fp16; the Trainer's autocast on top)", precision="fp16")
    elif c.data.get("load_in_8bit"):
        c.assume("load_in_8bit without bf16: the weights left unquantised load in fp16 "
                 "(resolve_dtype)")
        c.set(precision="fp16")
    elif tf32:
        c.read("tf32", tf32, "precision tf32 (fp32 weights, TF32 matmuls)", precision="tf32")
    else:
        c.assume("no bf16 / fp16: weights in fp32")
        c.set(precision="fp32")
    if tf32 is not None and "tf32" not in {f.key for f in c.reading.read}:
        c.used.add("tf32")


def _attention(c: Collector) -> None:
    impl = c.take("attn_implementation")
    if impl is not None:
        att = ATTN_IMPL.get(str(impl).lower())
        if att:
            c.read("attn_implementation", impl, f"attention {att}", attention=att)
        else:
            c.unmodelled("attn_implementation", impl, "not an attention kernel trainplan "
                         "models: planned with the target's default")
    for key, att in ATTENTION_FLAGS:
        if c.take(key):
            c.read(key, True, f"attention {att}" + (" (flex attention planned as SDPA)"
                                                   if key == "flex_attention" else ""),
                   attention=att)


def _adapter(c: Collector) -> None:
    adapter = c.take("adapter")
    q4, q8 = c.take("load_in_4bit"), c.take("load_in_8bit")
    if adapter in (None, "", False):
        if q4 or q8:
            c.unmodelled("load_in_4bit" if q4 else "load_in_8bit", True, "a quantised base "
                         "needs an adapter to train; planned unquantised")
        return
    if str(adapter).lower() not in ("lora", "qlora"):
        c.unmodelled("adapter", adapter, "not an adapter trainplan models (LoRA, QLoRA): "
                                         "planned as full training")
        return
    r = c.int_("lora_r", c.take("lora_r", 8))
    alpha = c.take("lora_alpha", 8)
    dropout = c.take("lora_dropout", 0.0)
    targets = c.take("lora_target_modules")
    linear = c.take("lora_target_linear")
    if linear:
        spec = "all-linear"
    elif targets:
        spec = ",".join(targets) if isinstance(targets, list) else str(targets)
    else:
        spec = "q_proj,v_proj"
        c.assume("no lora_target_modules: peft's default for the architecture (q_proj, v_proj "
                 "in Llama/Mistral/Qwen2/Gemma)")
    lora = {"rank": r, "alpha": float(alpha), "targets": spec, "dropout": float(dropout)}
    c.read("adapter", adapter, f"LoRA rank {r}, alpha {show(alpha)}, on {spec}", lora=lora)
    for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                "lora_target_linear"):
        if key in c.data:
            c.read(key, c.data[key], "(in the LoRA above)")
    if str(adapter).lower() == "qlora" or q4:
        c.read("load_in_4bit" if q4 else "adapter", True if q4 else adapter,
               "4-bit NF4 base weights, double-quantised (axolotl's BitsAndBytesConfig)",
               quantize="nf4-dq")
    elif q8:
        c.read("load_in_8bit", q8, "8-bit LLM.int8 base weights", quantize="int8")
    c.assume("LoRA weights in fp32 (peft's autocast_adapter_dtype): planned in the job's "
             "precision (adapters are a small share of the memory)")


def _packing(c: Collector) -> None:
    packing, pad = c.take("sample_packing"), c.take("pad_to_sequence_len")
    if packing:
        c.read("sample_packing", packing, "every micro-batch is sequence_len tokens of packed "
                                          "samples, as planned")
    elif pad:
        c.read("pad_to_sequence_len", pad, "every sample padded to sequence_len, as planned")
    else:
        c.assume("no sample_packing / pad_to_sequence_len: batches are padded to their "
                 "longest sample; planned at sequence_len, the longest a batch can be")


def _rl(c: Collector, sections: dict) -> None:
    rl = c.take("rl")
    trl = c.section("trl", set(sections.get("trl", ())))
    vllm = c.section("vllm", set(sections.get("vllm", ())))
    if rl in (None, False, ""):
        return
    name = str(rl).lower()
    if name not in RL:
        c.unmodelled("rl", rl, "not an algorithm trainplan models: planned as SFT")
        return
    algorithm = RL[name]
    if name in RL_WHY:
        c.unmodelled("rl", rl, RL_WHY[name])
        c.set(algorithm=algorithm)
    else:
        c.read("rl", rl, f"algorithm {algorithm}", algorithm=algorithm)
    beta = c.take("rl_beta", c.take("dpo_beta"))
    if algorithm != "grpo":
        return
    seq = c.reading.settings.get("seq_len") or 512
    kw: dict = {}
    if trl.has("num_generations"):
        kw["generations"] = trl.int_("num_generations", trl.take("num_generations"))
        trl.read("num_generations", kw["generations"], f"{kw['generations']} completions a "
                                                       "prompt")
    if trl.has("max_completion_length"):
        kw["completion_len"] = trl.int_("max_completion_length",
                                        trl.take("max_completion_length"))
        trl.read("max_completion_length", kw["completion_len"],
                 f"{kw['completion_len']} generated tokens")
    completion = kw.get("completion_len", algo_mod.Rollout().completion_len)
    kw["prompt_len"] = max(1, seq - completion) if seq > completion else seq
    c.assume(f"prompts: sequence_len - max_completion_length = {kw['prompt_len']} tokens "
             "(axolotl truncates prompts to fit sequence_len)")
    b = trl.take("beta", beta)
    if b is not None:
        kw["beta"] = trl.number("beta", b)
        trl.read("beta", b, f"KL coefficient {b}" + (": the reference model runs"
                                                     if kw["beta"] > 0 else ""))
    if trl.has("num_iterations"):
        kw["iterations"] = trl.int_("num_iterations", trl.take("num_iterations"))
        trl.read("num_iterations", kw["iterations"], f"{kw['iterations']} iterations a "
                                                     "generation")
    if trl.take("use_vllm"):
        mode = str(trl.take("vllm_mode", "server")).lower()
        kw["engine"] = "vllm-colocate" if mode == "colocate" else "vllm-server"
        trl.read("use_vllm", True, f"generation engine {kw['engine']}")
        if "vllm_mode" in trl.data:
            trl.read("vllm_mode", trl.data["vllm_mode"], f"engine {kw['engine']}")
        if vllm.has("gpu_memory_utilization") and mode == "colocate":
            u = vllm.number("gpu_memory_utilization", vllm.take("gpu_memory_utilization"))
            kw["gpu_memory_utilization"] = u
            vllm.read("gpu_memory_utilization", u, f"vLLM holds {u:.0%} of each device")
    c.set(rollout=kw, seq_len=None)
