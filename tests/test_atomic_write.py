"""paths.atomic_write: a file is replaced whole or not at all (issue 18, item 3)."""
import os
import stat
from unittest import mock

import pytest

from trainplan.paths import atomic_write


def test_writes_a_new_file_with_the_usual_mode(tmp_path):
    path = tmp_path / "plan.md"
    assert atomic_write(path, "# plan\n") == path
    assert path.read_text() == "# plan\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask   # not mkstemp's 0600
    assert os.listdir(tmp_path) == ["plan.md"]


def test_replaces_an_existing_file_keeping_its_mode(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text("old, and longer than the new text\n")
    path.chmod(0o640)
    atomic_write(path, "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_bytes_and_text_in_another_encoding(tmp_path):
    atomic_write(tmp_path / "a.bin", b"\x00\xff")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\xff"
    atomic_write(tmp_path / "b.txt", "é", encoding="latin-1")
    assert (tmp_path / "b.txt").read_bytes() == b"\xe9"


@pytest.mark.parametrize("where", ["trainplan.paths.os.fsync", "trainplan.paths.os.replace"])
def test_a_failure_part_way_leaves_the_old_file_and_no_temp_file(tmp_path, where):
    path = tmp_path / "plan.html"
    path.write_text("the earlier report\n")
    with mock.patch(where, side_effect=OSError(28, "No space left on device")), \
            pytest.raises(OSError, match="No space left"):
        atomic_write(path, "<html>the new one</html>\n")
    assert path.read_text() == "the earlier report\n"
    assert os.listdir(tmp_path) == ["plan.html"]


def test_interrupted_write_leaves_nothing_behind(tmp_path):
    path = tmp_path / "new.json"
    with mock.patch("trainplan.paths.os.fsync", side_effect=KeyboardInterrupt), \
            pytest.raises(KeyboardInterrupt):
        atomic_write(path, "{}\n")
    assert os.listdir(tmp_path) == []


def test_missing_folder_is_an_oserror_and_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "no-such-dir" / "plan.md", "x")
    assert os.listdir(tmp_path) == []


def test_calibration_save_goes_through_it(tmp_path):
    """calibrate.save writes the whole document, and a failed write keeps the old one."""
    from trainplan.measure import calibrate
    path = tmp_path / "calibration.json"
    path.write_text("{\"schema\": \"old\"}\n")
    with mock.patch("trainplan.paths.os.replace", side_effect=OSError(5, "I/O error")), \
            pytest.raises(OSError):
        calibrate.save({}, path, merge=False)
    assert path.read_text() == "{\"schema\": \"old\"}\n"
    calibrate.save({}, path, merge=False)
    assert "accelerators" in path.read_text()
    assert os.listdir(tmp_path) == ["calibration.json"]
