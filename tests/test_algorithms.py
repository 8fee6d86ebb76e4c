"""Post-training algorithms (algorithm.py, predict/algorithms.py): the job spec, the step's phases
and memory, DPO's two sequences, PPO's models, the ladder's shorter rollouts, the JSON."""
import json

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.algorithm import Rollout
from trainplan.errors import TrainplanError
from trainplan.platforms import host_cpu
from trainplan.estimate import estimate, to_json
from trainplan.plan.fixes import gather_per_token, reference_off
from trainplan.plan.fixes import seq_len as seq_len_rung
from trainplan.predict import Traces
from trainplan.spec import Lora, validate
from trainplan.jobfile import job_from_dict

from conftest import tiny_job
from plan_examples import run_cli

T4 = get_accelerator("t4")
A100 = get_accelerator("a100-sxm4-40gb")
ROLL = Rollout(generations=2, prompt_len=24, completion_len=8)


def grpo(**kw):
    base = dict(algorithm="grpo", rollout=ROLL, seq_len=None, batch_size=2)
    base.update(kw)
    return tiny_job(**base)


def test_yaml_rollout_parses_and_seq_len_is_prompt_plus_completion():
    job = validate(job_from_dict({
        "model": "hf:Qwen/Qwen2.5-0.5B", "algorithm": "grpo",
        "rollout": {"generations": 2, "prompt_len": 512, "completion_len": 128,
                    "engine": "vllm-colocate", "beta": 0.04}}))
    assert job.seq_len == 640 and job.rollout.engine == "vllm-colocate"
    assert job.rollout.beta == 0.04 and job.rollout.gpu_memory_utilization == 0.3


@pytest.mark.parametrize("data, words", [
    ({"algorithm": "grpo", "seq_len": 100, "rollout": {"prompt_len": 64, "completion_len": 64}},
     "prompt_len + completion_len"),
    ({"algorithm": "grpo", "rollout": {"completion_length": 64}}, "completion_len"),
    ({"algorithm": "grpo", "rollout": {"engine": "vllm"}}, "vllm-colocate"),
    ({"algorithm": "grpo", "rollout": {"generations": 0}}, ">= 1"),
    ({"algorithm": "grpo", "rollout": {"beta": -1}}, ">= 0"),
    ({"algorithm": "grpo", "rollout": [1, 2]}, "mapping"),
    ({"algorithm": "sft", "rollout": {"generations": 2}}, "generates nothing"),
    ({"algorithm": "gpro"}, "grpo"),
])
def test_bad_algorithm_input_is_one_clear_error(data, words):
    with pytest.raises(TrainplanError) as e:
        validate(job_from_dict({"model": "hf:Qwen/Qwen2.5-0.5B", **data}))
    assert words in str(e.value)


def test_grpo_phases_sum_to_the_step_and_generation_is_counted():
    est = estimate(grpo(), T4, traces=Traces(), with_max_batch=False)
    ph = est.step_phases_s
    assert set(ph) >= {"generation", "reference", "training"}
    assert ph["generation"] > 0 and ph["reference"] == 0 and ph["old_policy"] == 0
    assert sum(ph.values()) == pytest.approx(est.time.step_time_s)
    g = est.generation
    assert g.sequences == 2 and g.completion_len == 8 and g.prompt_len == 24
    # each device generates what it trains on: batch x accumulation sequences
    est2 = estimate(grpo(grad_accum=3), T4, traces=Traces(), with_max_batch=False)
    assert est2.generation.sequences == 6


def test_a_plan_traces_its_rollout_forwards_with_its_steps_on_all_cores(monkeypatch):
    """traces.in_rounds: the generation forwards a round asks for are made in one trace_all
    call (on all cores) with the training steps they go with (evaluate asks for both where the
    steps are deferred), and give the phases that tracing them one at a time (estimate, outside
    rounds) gives."""
    from trainplan.plan import Planner, make_plan, select_platforms
    import trainplan.trace.derive.inference as generation
    import trainplan.trace.derive.schedule as traces_mod
    from trainplan.trace.parallel import Forward
    monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", "off")
    monkeypatch.setattr(generation, "_MEMO", {})
    calls, real = [], traces_mod.trace_all

    def spy(requests, *a, **kw):
        forwards = sum(isinstance(r, Forward) for r in requests)
        calls.append((len(requests) - forwards, forwards))
        return real(requests, *a, **kw)
    monkeypatch.setattr(traces_mod, "trace_all", spy)
    job = grpo(steps=10)
    plan = make_plan(job, select_platforms(["local-rtx-3090"]), planner=Planner(job))
    # prefill, first and last decode step at once, with the training steps they go with
    assert any(steps and forwards == 3 for steps, forwards in calls), calls
    row = plan.platforms[0]
    monkeypatch.setattr(generation, "_MEMO", {})
    est = estimate(job.with_(batch_size=row.micro_batch_size, grad_accum=row.grad_accum),
                   get_accelerator(row.accelerator_id), traces=Traces(), with_max_batch=False,
                   host_speed=host_cpu(row.platform_id).speed)   # the plan's host, both phases
    assert row.step_phases_s == pytest.approx(est.step_phases_s, rel=1e-12)


def test_beta_runs_the_reference_and_a_full_model_needs_its_copy():
    traces = Traces()
    plain = estimate(grpo(), T4, traces=traces, with_max_batch=False)
    kl = estimate(grpo(rollout=Rollout(2, 24, 8, beta=0.04)), T4, traces=traces,
                  with_max_batch=False)
    assert kl.step_phases_s["reference"] == pytest.approx(plain.time.forward_s)
    assert kl.memory.breakdown_bytes["reference_weights"] == kl.trace.weight_bytes
    assert kl.memory.required_bytes == plain.memory.required_bytes + kl.trace.weight_bytes
    mu = estimate(grpo(rollout=Rollout(2, 24, 8, iterations=2)), T4, traces=traces,
                  with_max_batch=False)
    assert mu.step_phases_s["old_policy"] > 0


def test_with_lora_the_reference_is_the_base_with_adapters_off():
    job = grpo(model="hf:openai-community/gpt2", transformer=None, seq_len=None,
               lora=Lora(rank=4, targets="c_attn"), rollout=Rollout(2, 24, 8, beta=0.04))
    est = estimate(validate(job), T4, traces=Traces(), with_max_batch=False)
    assert "reference_weights" not in est.memory.breakdown_bytes
    assert est.step_phases_s["reference"] > 0


def test_colocated_vllm_keeps_its_share_of_the_device():
    job = grpo(rollout=Rollout(2, 24, 8, engine="vllm-colocate", gpu_memory_utilization=0.25))
    est = estimate(job, T4, traces=Traces(), with_max_batch=False)
    share = est.memory.breakdown_bytes["generation_engine"]
    assert share == int(0.25 * T4.usable_memory_bytes)
    assert est.memory.required_bytes >= share


def test_dpo_traces_chosen_and_rejected_and_runs_the_reference():
    traces = Traces()
    dpo = estimate(tiny_job(algorithm="dpo", batch_size=2), T4, traces=traces,
                   with_max_batch=False)
    sft = estimate(tiny_job(batch_size=4), T4, traces=traces, with_max_batch=False)
    assert dpo.trace.flops == sft.trace.flops        # 2 pairs = 4 sequences
    assert dpo.step_phases_s["reference"] > 0 and dpo.step_phases_s["generation"] == 0
    assert dpo.generation is None


def test_ppo_trains_a_value_model_beside_the_policy():
    est = estimate(tiny_job(algorithm="ppo", rollout=ROLL, seq_len=None), T4, traces=Traces(),
                   with_max_batch=False)
    ph = est.step_phases_s
    assert ph["reward"] > 0 and ph["value"] > 0 and ph["generation"] > 0
    assert {"value_model", "reward_weights", "reference_weights"} <= set(
        est.memory.breakdown_bytes)


def test_the_ladder_shortens_prompt_and_completion_together():
    job = validate(tiny_job(algorithm="grpo", seq_len=None,
                            rollout=Rollout(2, prompt_len=256, completion_len=128)))
    step = seq_len_rung(job, T4, 1)
    assert step.job.rollout.prompt_len == 128 and step.job.rollout.completion_len == 64
    assert step.job.seq_len == 192 and step.setting == {
        "prompt_len": 128, "completion_len": 64, "seq_len": 192}
    validate(step.job)       # still a consistent job


def test_the_ladder_drops_the_reference_copy_and_the_whole_model_gather():
    kl = validate(grpo(rollout=Rollout(2, 24, 8, beta=0.04)))
    step = reference_off(kl, T4, 1)
    assert step.job.rollout.beta == 0 and step.changes_training and step.setting == {"beta": 0.0}
    traces = Traces()
    before = estimate(kl, T4, traces=traces, with_max_batch=False).memory.required_bytes
    after = estimate(step.job, T4, traces=traces, with_max_batch=False)
    assert before - after.memory.required_bytes == after.trace.weight_bytes
    assert reference_off(validate(grpo()), T4, 1) is None              # beta 0 already
    assert reference_off(kl.with_(lora=Lora(rank=4)), T4, 1) is None   # no copy with LoRA
    z3 = validate(grpo(gpus=2, strategy="zero3"))
    step = gather_per_token(z3, T4, 2)
    assert step.job.rollout.gather_for_generation is False and not step.changes_training
    assert gather_per_token(z3, T4, 1) is None
    assert gather_per_token(validate(grpo(gpus=2, strategy="ddp")), T4, 2) is None
    once = estimate(z3, T4, traces=traces, with_max_batch=False)
    per_token = estimate(step.job, T4, traces=traces, with_max_batch=False)
    assert per_token.step_phases_s["generation"] > once.step_phases_s["generation"]


def test_estimate_json_has_the_phases(capsys):
    code, out, err = run_cli(capsys, "estimate", "--model", "hf:openai-community/gpt2", "--gpu",
                             "t4", "--algorithm", "grpo", "--generations", "2", "--prompt-len",
                             "32", "--completion-len", "16", "--batch-size", "2",
                             "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    assert d["algorithm"] == "grpo" and d["generation"]["tokens_per_s"] > 0
    assert sum(d["step_phases_s"].values()) == pytest.approx(d["step_time_s"])
    sft = to_json(estimate(tiny_job(), T4, traces=Traces(), with_max_batch=False))
    assert sft["step_phases_s"]["training"] == sft["step_time_s"]
    assert sft["step_phases_s"]["generation"] == 0


def test_estimate_task_generate(capsys):
    code, out, err = run_cli(capsys, "estimate", "--task", "generate", "--model",
                             "hf:openai-community/gpt2", "--gpu", "t4", "--batch-size", "4",
                             "--prompt-len", "64", "--completion-len", "32", "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    assert d["task"] == "generate" and d["sequences"] == 4 and d["fits"]
    # the KV cache closed form: 2 x layers x heads x head_dim x tokens x 2 bytes (fp32 job: 4)
    assert d["kv_cache_bytes"] == 2 * 12 * 12 * 64 * 4 * (64 + 32) * 4
    assert d["decode_s"] >= 31 * d["weight_bytes"] / T4.memory_bandwidth_bytes_per_s
