"""Older PyTorch and transformers releases keep tensors today's do not (issue 39's QLoRA rows:
LitGPT's tables ran torch 2.1.0, fms-acceleration's transformers 4.48.1). Each rule is a
`KernelSemantics` field, off by default (today's releases); these check what each one adds to a
traced step, in closed form."""
import pytest

from trainplan.spec import Job, Lora, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

B, T, H, L, V = 2, 32, 64, 2, 512          # tests/data/tiny-llama: hidden 64, 2 blocks, vocab 512


def _job(**kw):
    base = dict(model="hf:tests/data/tiny-llama", batch_size=B, seq_len=T, optimizer="adamw")
    base.update(kw)
    return validate(Job(**base))


@pytest.mark.parametrize("precision", ["fp32", "bf16-amp"])
def test_mean_keeps_its_input_before_torch_2_2(precision):
    """transformers' LlamaRMSNorm computes `hidden.float().pow(2).mean(-1, keepdim=True)`; before
    torch 2.2 MeanBackward1 saved its input (the fp32 squares) to read its element count, so each
    of the 2L + 1 norms keeps one more fp32 (b, s, h) until its backward; the FLOPs are the
    same."""
    autocast = "bfloat16" if precision == "bf16-amp" else None
    job = _job(precision=precision)
    today = trace_step(job, KernelSemantics(attention="efficient", autocast_dtype=autocast))
    old = trace_step(job, KernelSemantics(attention="efficient", autocast_dtype=autocast,
                                          mean_keeps_input=True))
    assert old.activation_bytes - today.activation_bytes == (2 * L + 1) * B * T * H * 4
    assert old.flops == today.flops
    assert old.semantics.key() != today.semantics.key()     # stored apart (trace/store.py)


def test_causal_lm_loss_before_transformers_4_49_copies_the_shifted_logits():
    """transformers 4.48's ForCausalLMLoss shifts with `logits[..., :-1, :].contiguous()`: a
    second fp32 copy of all but the last token's logits, alive with the fp32 logits and
    log-softmax's output at the end of the forward (4.49 pads the labels and views the logits).
    The forward peak rises by that copy, less the one token per sample whose log-probabilities
    the shifted loss no longer computes, within the labels' few bytes; the backward keeps
    nothing more."""
    job = _job(precision="bf16", lora=Lora(rank=4, alpha=8, targets="q,v"),
               grad_checkpointing="full")
    today = trace_step(job, KernelSemantics(attention="flash"))
    old = trace_step(job, KernelSemantics(attention="flash", hf_loss_copies_logits=True))
    copy = B * (T - 1) * V * 4
    rise = old.phase_peaks["forward"][0] - today.phase_peaks["forward"][0]
    assert abs(rise - (copy - B * V * 4)) <= 1024
    assert old.activation_bytes == today.activation_bytes - B * V * 4
    assert old.peak_phase == "forward" and today.peak_phase == "backward"


def test_only_a_causal_lm_takes_the_old_loss():
    """A sequence classifier's loss is not ForCausalLMLoss: the rule leaves its step alone."""
    job = _job(precision="fp32", task="seq-classification", batch_size=1)   # no pad token
    today = trace_step(job, KernelSemantics(attention="efficient"))
    old = trace_step(job, KernelSemantics(attention="efficient", hf_loss_copies_logits=True))
    assert old.phase_peaks == today.phase_peaks
