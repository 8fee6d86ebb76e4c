"""A `py:` model whose own code fails is reported as the user's error (issue 18, item 1): the
file and line in their code, the exception, the likely fix; exit 2, no traceback."""
import re
import sys
from pathlib import Path

import pytest

from trainplan.cli.main import main
from trainplan.models.custom import PINNED_PAIR, _pinned_pair

ROOT = Path(__file__).resolve().parents[1]
INPUTS = "inputs:\n  - {name: x, shape: [batch, 4], dtype: float32}\n"


def run_job(capsys, tmp_path, source: str, model: str = "py:usermodel.py:build",
            extra: str = "") -> tuple[int, str]:
    (tmp_path / "usermodel.py").write_text(source)
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {model}\n{INPUTS}{extra}")
    code = main(["inspect", "--job", str(job)])
    return code, capsys.readouterr().err


@pytest.fixture(autouse=True)
def _forget_user_modules():
    yield
    for name in ("usermodel", "userpkg_models"):
        sys.modules.pop(name, None)


def pinned() -> dict[str, str]:
    pins = dict(re.findall(r"^(torch|torchvision)==(\S+)", (ROOT / "constraints.txt").read_text(),
                           re.M))
    assert set(pins) == {"torch", "torchvision"}
    return pins


def test_torchvision_mismatch_on_import_names_the_matched_pair(capsys, tmp_path):
    # what `import torchvision` raises when it was built for another torch
    code, err = run_job(capsys, tmp_path,
                        "import torch\n"
                        "\n"
                        "def _import_torchvision():\n"
                        "    raise RuntimeError('operator torchvision::nms does not exist')\n"
                        "\n"
                        "_import_torchvision()\n"
                        "def build():\n    return torch.nn.Linear(4, 4)\n")
    assert code == 2 and err.startswith("trainplan: error: Your model code raised RuntimeError")
    assert f"{tmp_path / 'usermodel.py'}, line 4, in _import_torchvision" in err
    assert "operator torchvision::nms does not exist" in err
    assert "torch and torchvision do not match" in err
    assert "pip install -c constraints.txt torch torchvision" in err
    pins = pinned()
    assert f"torch=={pins['torch']}" in err and f"torchvision=={pins['torchvision']}" in err
    assert "Traceback" not in err


def test_pins_are_read_from_constraints_txt():
    assert _pinned_pair() == pinned()
    assert PINNED_PAIR == pinned()      # the fallback for an installed copy matches too


def test_import_error_inside_user_module_is_theirs(capsys, tmp_path):
    code, err = run_job(capsys, tmp_path,
                        "import torch\nimport not_a_real_package_xyz\n"
                        "def build():\n    return torch.nn.Linear(4, 4)\n")
    assert code == 2 and "ModuleNotFoundError" in err
    assert f"{tmp_path / 'usermodel.py'}, line 2" in err
    assert "pip install not_a_real_package_xyz" in err


def test_any_exception_on_import_is_reported_with_its_line(capsys, tmp_path):
    code, err = run_job(capsys, tmp_path, "import torch\nWIDTH = undefined_name * 2\n"
                                          "def build():\n    return torch.nn.Linear(4, 4)\n")
    assert code == 2 and "NameError" in err and "undefined_name" in err
    assert f"usermodel.py, line 2" in err and "importing usermodel.py" in err
    assert "usermodel" not in sys.modules          # no half-run module left behind


def test_factory_that_raises_is_reported_with_its_line(capsys, tmp_path):
    code, err = run_job(capsys, tmp_path,
                        "import torch\n"
                        "def build(width=4):\n"
                        "    hidden = width // 0\n"
                        "    return torch.nn.Linear(width, hidden)\n")
    assert code == 2
    assert "Your model code raised ZeroDivisionError while calling usermodel.py:build" in err
    assert f"{tmp_path / 'usermodel.py'}, line 3, in build" in err
    assert "To fix: fix the error at" in err and "Traceback" not in err


def test_factory_given_the_wrong_model_args(capsys, tmp_path):
    code, err = run_job(capsys, tmp_path, "import torch\ndef build(width=4):\n"
                                          "    return torch.nn.Linear(width, 4)\n",
                        extra="model_args: {depth: 3}\n")
    assert code == 2 and "TypeError" in err and "depth" in err
    assert "model_args match the factory's parameters" in err


def test_dotted_module_on_the_job_path(capsys, tmp_path):
    (tmp_path / "userpkg_models.py").write_text("def make():\n    raise ValueError('bad width')\n")
    code, err = run_job(capsys, tmp_path, "", model="py:userpkg_models:make")
    assert code == 2 and "ValueError" in err and "bad width" in err
    assert f"{tmp_path / 'userpkg_models.py'}, line 2, in make" in err


def test_missing_dotted_module_is_not_blamed_on_user_code(capsys, tmp_path):
    code, err = run_job(capsys, tmp_path, "", model="py:no_such_module_xyz:make")
    assert code == 2 and "Cannot import 'no_such_module_xyz': no such module" in err
