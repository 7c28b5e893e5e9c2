"""utils/atomic.py, utils/crc.py: atomic writes and the GCS form of crc32c."""
import os

import google_crc32c
import pytest

from utils.atomic import atomic_write, atomic_write_json
from utils.crc import crc32c_b64, crc32c_file, crc32c_from_b64


def test_atomic_write_replaces_whole_file_and_keeps_umask_permissions(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"old")
    with atomic_write(path) as f:
        f.write(b"new contents")
        assert path.read_bytes() == b"old"  # readers see the old file until the rename
    assert path.read_bytes() == b"new contents"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["x.bin"]


def test_atomic_write_failure_keeps_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"step": 1})
    with pytest.raises(RuntimeError):
        with atomic_write(path, "w") as f:
            f.write('{"step": 2, "half')
            raise RuntimeError("disk full")
    assert path.read_text() == '{\n  "step": 1\n}\n'
    assert os.listdir(tmp_path) == ["x.json"]


def test_crc32c_matches_the_standard_check_value_and_gcs_base64(tmp_path):
    path = tmp_path / "check"
    path.write_bytes(b"123456789")  # the CRC-32C catalogue check input
    assert crc32c_file(path) == 0xE3069283
    assert crc32c_b64(0xE3069283) == "4waSgw=="
    assert crc32c_from_b64("4waSgw==") == 0xE3069283


def test_crc32c_streams_files_larger_than_one_chunk(tmp_path):
    path = tmp_path / "big"
    data = os.urandom(3 * (1 << 20) + 7)
    path.write_bytes(data)
    assert crc32c_file(path) == google_crc32c.value(data)
