"""`trainplan probe-data` and the input-pipeline term of the step-time model."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from trainplan.accelerators import get_accelerator
from trainplan.cli.main import main
from trainplan.dataprobe import batch_samples, probe
from trainplan.errors import TrainplanError
from trainplan.spec import Job, validate
from trainplan.predict.timing import input_pipeline

SLEEP_S = 0.002          # per sample: one worker can deliver at most 500 samples/s


class SleepyImages(Dataset):
    """A tiny dataset whose every sample costs SLEEP_S of 'decoding'."""

    def __init__(self, n: int = 400):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        import time
        time.sleep(SLEEP_S)
        return torch.zeros(3, 8, 8), i % 10


LOADER_MODULE = textwrap.dedent(f"""
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class SleepyImages(Dataset):
        def __len__(self):
            return 400
        def __getitem__(self, i):
            time.sleep({SLEEP_S})
            return torch.zeros(3, 8, 8), i % 10

    def make_loader():
        return DataLoader(SleepyImages(), batch_size=16, num_workers=2)

    def make_dataset():
        return SleepyImages()

    def needs_args(root):
        return SleepyImages()
""")


def test_rate_of_one_worker_is_bounded_by_per_sample_cost():
    res = probe(SleepyImages(), batch_size=16, max_s=1.0)
    assert res.samples == 16 * res.batches
    assert 0.3 / SLEEP_S < res.samples_per_s_per_worker <= 1.0 / SLEEP_S
    assert res.to_json()["samples_per_s_per_worker"] == res.samples_per_s_per_worker


def test_dataloader_with_workers_is_measured_single_process():
    dl = DataLoader(SleepyImages(), batch_size=8, num_workers=2)
    res = probe(dl, max_s=0.5)
    assert res.batch_size == 8
    assert res.samples_per_s_per_worker <= 1.0 / SLEEP_S     # one process, not two


def test_batch_samples_shapes():
    assert batch_samples(torch.zeros(7, 3)) == 7
    assert batch_samples((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert batch_samples({"input_ids": torch.zeros(4, 9), "labels": torch.zeros(4, 9)}) == 4
    assert batch_samples([1, 2, 3]) == 3


def test_empty_loader_is_an_error():
    with pytest.raises(TrainplanError, match="no batches"):
        probe(SleepyImages(n=8), batch_size=8, warmup=1)


def test_cli_probe_json(tmp_path, capsys):
    mod = tmp_path / "loaders.py"
    mod.write_text(LOADER_MODULE)
    rc = main(["probe-data", "--loader", f"py:{mod}:make_loader", "--seconds", "0.5",
               "--format", "json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rate = out["probe"]["samples_per_s_per_worker"]
    assert 0.3 / SLEEP_S < rate <= 1.0 / SLEEP_S
    assert out["probe"]["batch_size"] == 16 and out["estimate"] is None


def test_cli_probe_bad_loader(tmp_path, capsys):
    mod = tmp_path / "loaders.py"
    mod.write_text(LOADER_MODULE)
    assert main(["probe-data", "--loader", f"py:{mod}:needs_args"]) == 2
    assert "without arguments" in capsys.readouterr().err
    assert main(["probe-data", "--loader", "loaders_without_factory"]) == 2
    assert "must name a factory" in capsys.readouterr().err


def test_cli_probe_with_model_says_whether_gpu_waits(tmp_path, capsys):
    mod = tmp_path / "loaders.py"
    mod.write_text(LOADER_MODULE)
    rc = main(["probe-data", "--loader", f"py:{mod}:make_dataset", "--seconds", "0.3",
               "--model", "timm:resnet18", "--image-size", "64", "--batch-size", "16",
               "--precision", "fp16-amp", "--gpu", "a100", "--num-workers", "2",
               "--format", "json"])
    assert rc == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    # <= 1000 samples/s from 2 workers; an A100 does a 64 px ResNet-18 step of 16 in well under
    # 16 ms, so it waits for data
    assert est["workers_per_loader"] == 2
    assert est["data_wait_s"] > 0 and est["bound"] == "data"


def _job(**kw):
    return validate(Job(model="timm:resnet18", batch_size=32, **kw))


def test_input_pipeline_workers_and_cores():
    a100 = get_accelerator("a100")
    assert input_pipeline(_job(), 1, a100) is None                       # no rate given
    p = input_pipeline(_job(samples_per_s_per_worker=100.0, num_workers=4), 1, a100)
    assert (p.workers, p.samples_per_s, p.load_s) == (4, 400.0, 32 / 400.0)
    # 2 DDP processes on a 4-core host: (4 - 2) // 2 = 1 worker each
    p = input_pipeline(_job(samples_per_s_per_worker=100.0, num_workers=4, gpus=2,
                            strategy="ddp"), 2, a100, cpu_cores=4)
    assert p.loaders == 2 and p.workers == 1 and any("CPU cores" in n for n in p.notes)
    # DataParallel: one loader feeds both devices
    p = input_pipeline(_job(samples_per_s_per_worker=100.0, num_workers=2, gpus=2,
                            strategy="dp"), 2, a100)
    assert p.loaders == 1 and p.samples_per_step == 64
    p = input_pipeline(_job(samples_per_s_per_worker=100.0), 1, a100)
    assert p.workers == 0 and any("default 0" in n for n in p.notes)
