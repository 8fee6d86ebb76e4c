"""The reference transformer's fused cross-entropy (`loss: fused`, models/fused_loss.py): the
loss and gradient PyTorch's gives, traced as one kernel a pass over the logits."""
import torch
import torch.nn.functional as F

from trainplan.cli.main import main
from trainplan.models.fused_loss import cross_entropy
from trainplan.spec import Job

from conftest import tiny_job, trace

VOCAB, BATCH, SEQ = 1024, 2, 32


def test_loss_and_gradient_are_pytorchs():
    torch.manual_seed(0)
    logits = torch.randn(7, 13, requires_grad=True)
    labels = torch.tensor([3, -100, 0, 12, 5, -100, 7])
    ours = cross_entropy(logits, labels)
    ours.backward()
    grad = logits.grad.clone()
    logits.grad = None
    theirs = F.cross_entropy(logits, labels)
    theirs.backward()
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert torch.allclose(grad, logits.grad, atol=1e-6)
    half = logits.detach().bfloat16().requires_grad_()
    cross_entropy(half, labels).backward()
    assert half.grad.dtype == torch.bfloat16       # the gradient in the logits' dtype


def _job(loss: str) -> Job:
    return tiny_job(vocab_size=VOCAB, loss=loss, batch_size=BATCH, seq_len=SEQ,
                    precision="bf16-amp")


def _over_logits(tr) -> dict:
    """The loss's ops (the model's own, after its head, and their backward) that move at least
    the shifted logits' bytes in bf16: name -> bytes."""
    full = BATCH * (SEQ - 1) * VOCAB * 2
    out: dict[str, float] = {}
    for r in tr.ops:
        if r.phase != "optimizer" and r.module in ("ReferenceTransformer", "Global") \
                and r.bytes >= full:
            out[r.name] = out.get(r.name, 0.0) + r.bytes
    return out


def test_traced_as_one_kernel_a_pass_over_the_bf16_logits():
    tr = trace(_job("fused"), autocast=torch.bfloat16)
    fwd = [r for r in tr.ops if r.name == "fused_cross_entropy"]
    bwd = [r for r in tr.ops if r.name == "fused_cross_entropy_backward"]
    assert [r.phase for r in fwd] == ["forward"] and [r.phase for r in bwd] == ["backward"]
    rows, logits = BATCH * SEQ, BATCH * SEQ * VOCAB * 2          # bf16 logits, every position
    # forward: the logits and int64 labels read, each row's loss and log-sum-exp written (fp32)
    assert fwd[0].bytes == logits + rows * 8 + 2 * rows * 4 and fwd[0].dtype == "bfloat16"
    # backward: the row gradients, logits, log-sum-exp and labels read, the logits' gradient
    assert bwd[0].bytes == rows * 4 + logits + rows * 4 + rows * 8 + logits
    # nothing else passes over the logits: no fp32 copy, log-softmax or shifted-logits copy
    assert set(_over_logits(tr)) == {"fused_cross_entropy", "fused_cross_entropy_backward"}


def test_pytorchs_loss_passes_over_the_logits_several_times_in_fp32():
    ours = _over_logits(trace(_job("fused"), autocast=torch.bfloat16))
    torchs = _over_logits(trace(_job("torch"), autocast=torch.bfloat16))
    assert {"_log_softmax", "_log_softmax_backward_data"} <= set(torchs)
    assert sum(torchs.values()) > 5 * sum(ours.values())


def test_a_job_file_names_the_loss(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    base = ("model: transformer\ntransformer: {hidden_size: 64, num_layers: 2, num_heads: 4, "
            "vocab_size: 1024, kind: decoder, loss: %s}\nbatch_size: 2\nseq_len: 32\n")
    job.write_text(base % "fused")
    assert main(["estimate", str(job), "--gpu", "t4"]) == 0
    capsys.readouterr()
    job.write_text(base % "fuse")
    assert main(["estimate", str(job), "--gpu", "t4"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'fused'" in err and "Allowed: torch, fused" in err
