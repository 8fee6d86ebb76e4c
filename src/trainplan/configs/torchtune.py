"""A torchtune recipe config (`tune run <recipe> --config <file>`), read as the recipes read it
(pytorch/torchtune@bd2a0fc: recipes/*.py, recipes/configs/, torchtune/models/*/_model_builders.py).

    model._component_ torchtune.models.<family>.[lora_|qlora_]<name> -> model (the bundled hub
        config of the same architecture), LoRA, QLoRA (torchao NF4: torchtune's `quantize_base`)
    model.lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout                  -> LoRA on q/k/v_proj, o_proj (output_proj), the MLP
                                         (w1, w2, w3: gate/down/up_proj) and the head
    tokenizer.max_seq_len             -> sequence length (null: the data's own lengths)
    batch_size, gradient_accumulation_steps, epochs, max_steps_per_epoch
    dtype bf16 | fp32                 -> pure bf16 (torchtune has no autocast) | fp32
    enable_activation_checkpointing   -> full checkpointing (ac_mode selective: ac_option op
      ac_mode, ac_option                 selective, K every-K)
    optimizer._component_             -> torch.optim.AdamW / SGD, bitsandbytes' and torchao's
                                         8-bit and paged AdamW
    clip_grad_norm                    -> gradient clipping (none when absent or null)
    the recipe (from the config's `tune run` line, else its file name): *_single_device -> one
        device; *_distributed -> FSDP2 (fully_shard) over --nproc_per_node devices, the
        gradients reduce-scattered on every micro-batch (no no_sync: sync_each_batch),
        fsdp_cpu_offload -> offload optimizer+params; *dpo* -> algorithm dpo
"""
from __future__ import annotations

import re
from pathlib import Path

from ..spec import checkpointing_label
from .common import known_keys, planned_seq_len
from .reading import Collector, Reading
from .trainer import read_clipping

# torchtune model builder -> the bundled hub config of the same architecture
MODELS = {
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B", "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B", "llama3_70b": "meta-llama/Meta-Llama-3-70B",
    "llama2_7b": "meta-llama/Llama-2-7b-hf", "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B", "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_1_5b_instruct": "Qwen/Qwen2.5-1.5B-Instruct", "qwen2_5_3b": "Qwen/Qwen2.5-3B",
    "qwen2_5_7b_base": "Qwen/Qwen2.5-7B", "qwen2_5_7b_instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2_5_14b_base": "Qwen/Qwen2.5-14B", "qwen2_5_14b_instruct": "Qwen/Qwen2.5-14B-Instruct",
    "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b", "gemma2_9b": "google/gemma-2-9b",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
}
ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
MLP = "gate_proj,up_proj,down_proj"
OPTIMIZERS = {"torch.optim.adamw": "adamw", "torch.optim.adam": "adam",
              "torch.optim.sgd": "sgd", "bitsandbytes.optim.pagedadamw8bit": "paged-adamw-8bit",
              "bitsandbytes.optim.pagedadamw": "paged-adamw",
              "bitsandbytes.optim.pagedadamw32bit": "paged-adamw",
              "bitsandbytes.optim.adamw8bit": "adamw-8bit",
              "torchao.optim.adamw8bit": "adamw-8bit",
              "torchao.prototype.low_bit_optim.adamw8bit": "adamw-8bit",
              "torch.optim.adafactor": "adafactor", "bitsandbytes.optim.lion": "lion"}
UNMODELLED = {
    "enable_activation_offloading": (False, "activation offloading is not modelled: planned "
                                            "with the activations on the device"),
    "compile": (False, "torch.compile is not modelled: planned eager"),
    "optimizer_in_bwd": (False, "the optimizer step fused into backward (each gradient freed "
                                "as it is used) is not modelled: planned with every gradient "
                                "held until the step"),
    "enable_fp8_training": (False, "fp8 training is not modelled: planned in bf16"),
    "tensor_parallel_dim": (1, "tensor parallelism is not modelled"),
    "context_parallel_dim": (1, "context parallelism is not modelled"),
    "custom_sharded_layers": (None, None),
}
RUN = re.compile(r"tune run\s+((?:--(?:nproc_per_node|nnodes)[ =]\d+\s+)*)([a-z0-9_]+)")


def family(base: str) -> str:
    """The torchtune.models package of a builder: qwen2_5_0_5b -> qwen2_5, llama3_2_1b ->
    llama3_2, phi3_mini -> phi3."""
    return "qwen2_5" if base.startswith("qwen2_5") else base.rsplit("_", 1)[0]


def looks_like(data: dict) -> bool:
    model = data.get("model")
    return isinstance(model, dict) and "_component_" in model and (
        str(model["_component_"]).startswith("torchtune.") or "tokenizer" in data)


def recipe_of(text: str, path: str) -> tuple[str, int | None]:
    """(recipe name, --nproc_per_node) from the config's own `tune run` line, else its name."""
    m = RUN.search(text)
    if m:
        flags = dict(re.findall(r"--(nproc_per_node|nnodes)[ =](\d+)", m.group(1)))
        n = int(flags.get("nproc_per_node", 0)) * int(flags.get("nnodes", 1))
        return m.group(2), n or None
    name = Path(path).stem
    kind = "lora" if "lora" in name else "full"
    where = "single_device" if name.endswith("single_device") else "distributed"
    return (f"lora_dpo_{where}" if "dpo" in name else f"{kind}_finetune_{where}"), None


def read(data: dict, path: str, text: str = "") -> Reading:
    keys, _ = known_keys("torchtune")
    c = Collector("torchtune", path, data, set(keys))
    recipe, nproc = recipe_of(text, path)
    c.assume(f"recipe {recipe}" + (f" on {nproc} devices" if nproc else "")
             + " (from the config's `tune run` line)" if RUN.search(text) else
             f"recipe {recipe} (from the file's name)")
    _model(c)
    tok = c.section("tokenizer")
    n = tok.take("max_seq_len")
    if n is None:
        n = planned_seq_len(c.reading.settings.get("model", ""))
        c.assume(f"tokenizer.max_seq_len null: samples keep the data's lengths; planned at {n} "
                 "tokens (trainplan's default): pass --seq-len for your data's")
        c.set(seq_len=n)
    else:
        n = tok.int_("max_seq_len", n)
        tok.read("max_seq_len", n, f"sequence length {n}", seq_len=n)
    b = c.int_("batch_size", c.take("batch_size", 1))
    c.read("batch_size", b, f"micro-batch {b}", batch_size=b)
    if c.has("gradient_accumulation_steps"):
        g = c.int_("gradient_accumulation_steps", c.take("gradient_accumulation_steps"))
        c.read("gradient_accumulation_steps", g, f"gradient accumulation {g}", grad_accum=g)
    _steps(c)
    dtype = str(c.take("dtype", "fp32")).lower()
    prec = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32",
            "fp16": "fp16", "float16": "fp16"}.get(dtype)
    if prec is None:
        raise c.error("dtype", f"{dtype!r} is not a torchtune dtype.", allowed="bf16, fp32")
    c.read("dtype", dtype, f"precision {prec} (pure: torchtune casts the model, no autocast)"
           if prec != "fp32" else "precision fp32", precision=prec)
    ac = c.take("enable_activation_checkpointing")
    mode = c.take("ac_mode")
    option = c.take("ac_option")
    if ac:
        level = _ac_level(c, mode, option)
        c.read("enable_activation_checkpointing", ac, checkpointing_label(level),
               grad_checkpointing=level)
    elif ac is not None:
        c.read("enable_activation_checkpointing", ac, "no checkpointing",
               grad_checkpointing="none")
    _optimizer(c)
    read_clipping(c, "clip_grad_norm", default=None)     # the recipes' cfg.get(..., None)
    _recipe(c, recipe, nproc)
    ds = c.section("dataset") if isinstance(c.data.get("dataset"), dict) else None
    if ds is not None and ds.take("packed"):
        ds.read("packed", True, "every sequence is max_seq_len tokens of packed samples, as "
                                "planned")
    loss = c.section("loss") if isinstance(c.data.get("loss"), dict) else None
    if loss is not None and "LinearCrossEntropy" in str(loss.data.get("_component_", "")):
        loss.unmodelled("_component_", loss.take("_component_"), "the chunked linear "
                        "cross-entropy (no full logits kept) is not modelled")
    c.unmodelled_table({k: v for k, v in UNMODELLED.items() if v[1]})
    return c.finish()


def _model(c: Collector) -> None:
    m = c.section("model")
    comp = str(m.take("_component_", ""))
    builder = comp.rsplit(".", 1)[-1]
    kind = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith(
        "lora_") else "full"
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    if base not in MODELS:
        from ..errors import suggestion
        raise m.error("_component_", f"{comp} is not a torchtune model trainplan has a config "
                      "for." + suggestion(base, MODELS, show=str),
                      allowed=", ".join(sorted(MODELS)),
                      fix="use one of these builders, or give the model with --model "
                          "hf:<hub id>")
    hub = MODELS[base]
    m.read("_component_", comp, f"model hf:{hub} (the same architecture)"
           + {"lora": ", LoRA", "qlora": ", QLoRA (torchao NF4 base)", "full": ""}[kind],
           model=f"hf:{hub}")
    if kind == "full":
        return
    attn = m.take("lora_attn_modules", ["q_proj", "v_proj"])
    targets = [ATTN.get(str(a), str(a)) for a in attn]
    if m.take("apply_lora_to_mlp"):
        targets.append(MLP)
    if m.take("apply_lora_to_output"):
        targets.append("lm_head")
    rank = m.int_("lora_rank", m.take("lora_rank", 8))
    alpha = m.number("lora_alpha", m.take("lora_alpha", 16))
    dropout = m.number("lora_dropout", m.take("lora_dropout", 0.0))
    spec = ",".join(targets)
    m.read("lora_rank", rank, f"LoRA rank {rank}, alpha {alpha:g}, on {spec}",
           lora={"rank": rank, "alpha": alpha, "targets": spec, "dropout": dropout})
    for key in ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_alpha",
                "lora_dropout"):
        if key in m.data:
            m.read(key, m.data[key], "(in the LoRA above)")
    if kind == "qlora" or m.take("quantize_base"):
        c.set(quantize="torchao-nf4")
    if m.take("use_dora"):
        m.unmodelled("use_dora", True, "DoRA is not modelled: planned as LoRA")


def _steps(c: Collector) -> None:
    epochs = c.take("epochs", 1)
    per = c.take("max_steps_per_epoch")
    if per is not None:
        per = c.int_("max_steps_per_epoch", per)
        c.read("max_steps_per_epoch", per, f"{epochs * per:g} optimizer steps "
                                           f"({epochs} epoch(s) x {per})",
               steps=int(epochs * per))
        if "epochs" in c.data:
            c.used.add("epochs")
    else:
        e = c.number("epochs", epochs)
        c.read("epochs", epochs, f"{e:g} epochs (with --dataset-size N for the steps)",
               epochs=e)


def _ac_level(c: Collector, mode, option) -> str:
    """torchtune's `ac_mode: selective` with `ac_option` (training/_activation_checkpointing.py
    `checkpoint_wrapper`): "op" is torchtitan's op-level policy; a whole number K checkpoints
    every K-th layer (0 or none: every layer)."""
    if str(mode).lower() != "selective":
        return "full"
    if str(option).lower() == "op":
        return "selective"
    if option is None:
        return "full"
    if isinstance(option, str) and option.strip().isdigit():
        option = int(option)
    k = c.int_("ac_option", option, at_least=0)
    return f"every-{k}" if k > 1 else "full"


def _optimizer(c: Collector) -> None:
    if not isinstance(c.data.get("optimizer"), dict):
        return
    o = c.section("optimizer")
    comp = str(o.take("_component_", ""))
    name = OPTIMIZERS.get(comp.lower())
    if name:
        why = " (planned as foreach; the fused kernel keeps no whole-group temporaries)" if \
            o.data.get("fused") else ""
        o.read("_component_", comp, f"optimizer {name}{why}", optimizer=name)
    else:
        o.unmodelled("_component_", comp, "not an optimizer trainplan models: planned as AdamW")
        c.set(optimizer="adamw")


def _recipe(c: Collector, recipe: str, nproc: int | None) -> None:
    if "dpo" in recipe:
        c.set(algorithm="dpo")
    elif "ppo" in recipe or "grpo" in recipe or "distill" in recipe or "_kd" in recipe:
        c.assume(f"recipe {recipe}: its extra models (reward, value, teacher) are not planned; "
                 "planned as fine-tuning")
    if recipe.endswith("distributed") or (nproc or 1) > 1:
        # the recipe calls backward on every micro-batch outside any no_sync: FSDP2 reduce-
        # scatters each one's gradients (recipes/full_finetune_distributed.py train())
        kw = {"strategy": "fsdp", "sync_each_batch": True}
        if nproc:
            kw["gpus"] = nproc
        c.set(**kw)
        if c.take("fsdp_cpu_offload"):
            c.read("fsdp_cpu_offload", True, "offload optimizer+params (FSDP2's CPU offload)",
                   offload="optimizer+params")
        r = c.take("fsdp_reshard_after_forward", True)
        if r is False:
            c.read("fsdp_reshard_after_forward", False, "strategy zero2 (weights kept whole "
                                                         "after forward)", strategy="zero2")
