"""The training algorithm: what one optimizer step runs besides the traced forward/backward.

    algorithm  per optimizer step, on each device                        as TRL runs it
    sft        the traced step (forward, backward, optimizer)            SFTTrainer / Trainer
    grpo       generate the completions (prompts x generations), the    GRPOTrainer
               reference model's log-probs when beta > 0, the old
               policy's when iterations > 1, then the traced step on
               prompt + completion
    dpo        the reference's log-probs of chosen and rejected, then     DPOTrainer
               the traced step on both (2 sequences per sample)
    ppo        generate, then reference, reward and value forwards,      PPOTrainer
               then the traced step for the policy and one more for the
               value model (the same architecture, a scalar head)

Defaults are TRL's (huggingface/trl@006d32c9 trl/trainer/grpo_config.py): num_generations 8,
max_completion_length 256, beta 0.0 (no reference model loaded), num_iterations 1,
ds3_gather_for_generation True, use_vllm False (`model.generate` in the training process),
vllm_gpu_memory_utilization 0.3 for the colocated engine. Sequences are counted as TRL counts them:
`batch_size` is completions per device per micro-batch (GRPO, PPO) or preference pairs (DPO), and
one optimizer step's generation batch is what that step trains on (steps_per_generation =
gradient accumulation steps, TRL's default).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import TrainplanError, unknown

ALGORITHMS = ("sft", "grpo", "dpo", "ppo")
ENGINES = ("hf", "vllm-colocate", "vllm-server")
GENERATES = ("grpo", "ppo")          # algorithms that sample completions every step


@dataclass(frozen=True)
class Rollout:
    """What a post-training step generates and scores (TRL's GRPOConfig names in brackets)."""

    generations: int = 8                  # completions per prompt [num_generations]
    prompt_len: int = 512                 # prompt tokens [max_prompt_length]
    completion_len: int = 256             # generated tokens [max_completion_length]
    engine: str = "hf"                    # hf: model.generate; vllm-colocate; vllm-server
    gpu_memory_utilization: float = 0.3   # vllm-colocate's share of each device
    beta: float = 0.0                     # KL coefficient: > 0 runs the reference model
    iterations: int = 1                   # [num_iterations]: > 1 runs the old policy's forward
    gather_for_generation: bool = True    # ZeRO-3 [ds3_gather_for_generation]

    @property
    def seq_len(self) -> int:
        """What the policy trains on: prompt + completion."""
        return self.prompt_len + self.completion_len


KEYS = {f.name for f in fields(Rollout)}
_INTS = ("generations", "prompt_len", "completion_len", "iterations")


def parse_rollout(data, where: str) -> Rollout:
    """A `rollout:` mapping from a job file (or flags) -> Rollout, every value checked."""
    example = "rollout: {generations: 2, prompt_len: 4096, completion_len: 768}"
    if not isinstance(data, dict):
        raise TrainplanError(f"{where}: rollout must be a mapping of settings, got {data!r}.",
                             fix=f"write it like `{example}`")
    kw = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key not in KEYS:
            raise unknown("rollout setting", key, sorted(KEYS), n=1,
                          what=f"{where}: unknown rollout setting {k!r}.",
                          allowed=", ".join(sorted(KEYS)))
        kw[key] = v
    for k in _INTS:
        if k in kw and not (isinstance(kw[k], int) and not isinstance(kw[k], bool) and kw[k] >= 1):
            raise TrainplanError(f"{where}: rollout {k} must be a whole number >= 1, got "
                                 f"{kw[k]!r}.", fix=f"write it like `{k}: 2`")
    if "engine" in kw and kw["engine"] not in ENGINES:
        raise unknown("rollout engine", str(kw["engine"]), ENGINES, n=1,
                      what=f"{where}: rollout engine {kw['engine']!r} is not one trainplan "
                           "models.", allowed=", ".join(ENGINES))
    u = kw.get("gpu_memory_utilization")
    if u is not None and not (isinstance(u, (int, float)) and not isinstance(u, bool)
                              and 0 < u < 1):
        raise TrainplanError(f"{where}: rollout gpu_memory_utilization must be in (0, 1), got "
                             f"{u!r}.", fix="write it like `gpu_memory_utilization: 0.3`")
    b = kw.get("beta")
    if b is not None and not (isinstance(b, (int, float)) and not isinstance(b, bool) and b >= 0):
        raise TrainplanError(f"{where}: rollout beta must be a number >= 0, got {b!r}.",
                             fix="write it like `beta: 0.04` (0: no reference model)")
    g = kw.get("gather_for_generation")
    if g is not None and not isinstance(g, bool):
        raise TrainplanError(f"{where}: rollout gather_for_generation must be true or false.",
                             fix="write it like `gather_for_generation: false`")
    return Rollout(**kw)


def check(algorithm: str, rollout: Rollout | None, seq_len: int | None) -> None:
    """The algorithm is known, and a generating one's lengths agree with seq_len."""
    if algorithm not in ALGORITHMS:
        raise unknown("algorithm", str(algorithm), ALGORITHMS, n=1,
                      what=f"--algorithm {algorithm!r} is not one trainplan models.",
                      allowed=", ".join(ALGORITHMS))
    if rollout is not None and algorithm not in GENERATES:
        raise TrainplanError(f"a rollout is set but algorithm {algorithm} generates nothing.",
                             allowed="rollout with algorithm: " + " or ".join(GENERATES),
                             fix="set algorithm: grpo, or drop the rollout settings")
    if algorithm in GENERATES and rollout is not None and seq_len and seq_len != rollout.seq_len:
        raise TrainplanError(
            f"seq_len {seq_len} is not prompt_len + completion_len "
            f"({rollout.prompt_len} + {rollout.completion_len} = {rollout.seq_len}): the policy "
            "trains on the prompt and its completion.",
            fix=f"drop seq_len (it is {rollout.seq_len}), or change the rollout lengths")


def sequences_per_sample(algorithm: str) -> int:
    """Sequences the policy's forward takes per sample: DPO concatenates chosen and rejected."""
    return 2 if algorithm == "dpo" else 1
