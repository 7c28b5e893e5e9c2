"""utils/data/shards.py: shard writing, the manifest, and verify_dataset refusing data that does not match."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import SHARED_DATA, SHARED_DATA_MISSING
from utils.crc import INDEX_NAME, crc32c_file
from utils.data.prepare import prepare
from utils.data.shards import ShardWriter, read_manifest, token_dtype, verify_dataset
from utils.errors import PiconeoxError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """60 KB of real Shakespeare as byte tokens in 1,000-token shards, prepared once."""
    if not SHARED_DATA.is_dir():
        pytest.skip(SHARED_DATA_MISSING)
    tmp = tmp_path_factory.mktemp("shards")
    src = tmp / "src.txt"
    src.write_text((SHARED_DATA / "tinyshakespeare" / "input.txt").read_text()[:60_000])
    return prepare([str(src)], "sh", tmp, "byte", shard_tokens=1000, workers=1)


@pytest.fixture
def dataset(prepared, tmp_path):
    """A copy of `prepared` that the test may break (the copy keeps each file's mtime: the crc index stays valid)."""
    return Path(shutil.copytree(prepared, tmp_path / prepared.name))


def test_dtype_is_uint16_up_to_65536_ids_else_uint32():
    assert token_dtype(256) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def test_shard_writer_cuts_exact_sizes_and_records_them(tmp_path):
    writer = ShardWriter(tmp_path, "train", np.dtype(np.uint16), shard_tokens=4)
    for chunk in ([1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]):
        writer.add(np.array(chunk))
    shards = writer.finish()
    assert [(s.name, s.tokens) for s in shards] == [("train_00000.npy", 4), ("train_00001.npy", 4),
                                                    ("train_00002.npy", 3)]
    assert np.load(tmp_path / "train_00002.npy").tolist() == [9, 10, 11]
    assert all(s.bytes == (tmp_path / s.name).stat().st_size for s in shards)


def test_manifest_round_trips_and_matches_the_files(dataset):
    m = verify_dataset(dataset, check_crc=True, expected_vocab=256)
    assert m.dtype == "uint16" and m.vocab_size == 256 and m.source[0].endswith("src.txt")
    assert {s.split for s in m.shards} == {"train", "val"}
    assert sum(s.tokens for s in m.shards) == sum(len(np.load(dataset / s.name)) for s in m.shards)
    on_disk = json.loads((dataset / "manifest.json").read_text())
    assert read_manifest(dataset).to_dict() == on_disk


def corrupt_missing(d, m):
    (d / m.shards[3].name).unlink()


def corrupt_truncate(d, m):
    path = d / m.shards[3].name
    path.write_bytes(path.read_bytes()[:-2])


def corrupt_flip(d, m):  # same size, different content: only the crc can tell
    path = d / m.shards[3].name
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def corrupt_token(d, m):  # a foreign shard with a consistent manifest entry
    ids = np.load(d / m.shards[3].name)
    ids[5] = 300
    np.save(d / m.shards[3].name, ids)
    raw = json.loads((d / "manifest.json").read_text())
    raw["shards"][3]["crc32c"] = crc32c_file(d / m.shards[3].name)
    (d / "manifest.json").write_text(json.dumps(raw))


def corrupt_crc_in_manifest(d, m):  # the shards are as hashed before (cached), the manifest's value is wrong
    raw = json.loads((d / "manifest.json").read_text())
    raw["shards"][3]["crc32c"] = 0
    (d / "manifest.json").write_text(json.dumps(raw))


def corrupt_tokenizer(d, m):
    (d / "tokenizer.json").write_text((d / "tokenizer.json").read_text().replace("<|endoftext|>", "<|end|>"))


def corrupt_manifest(d, m):
    (d / "manifest.json").write_text('{"vocab_size": 256')


def remove_manifest(d, m):
    (d / "manifest.json").unlink()


@pytest.mark.parametrize("corrupt, deep, message", [
    (corrupt_missing, False, r"train_00003.npy is listed in the manifest but missing"),
    (corrupt_truncate, False, r"train_00003.npy has \d+ bytes, the manifest says \d+"),
    (corrupt_flip, False, r"train_00003.npy has crc32c [0-9a-f]{8}, the manifest says [0-9a-f]{8}"),
    (corrupt_crc_in_manifest, False, r"train_00003.npy has crc32c [0-9a-f]{8}, the manifest says 00000000"),
    (corrupt_token, True, r"train_00003.npy holds token id 300, not below the vocab size 256"),
    (corrupt_tokenizer, False, r"tokenizer.json \(sha256 \w+\) is not the tokenizer the manifest names"),
    (corrupt_manifest, False, r"manifest.json is not a valid manifest"),
    (remove_manifest, False, r"manifest.json not found: .* is not a prepared dataset"),
])
def test_verify_refuses_data_that_does_not_match_the_manifest(dataset, corrupt, deep, message):
    corrupt(dataset, read_manifest(dataset))
    with pytest.raises(PiconeoxError, match=message) as e:
        verify_dataset(dataset, check_crc=deep)
    assert "\n" not in str(e.value)


def test_crc_is_checked_on_first_use_then_cached_by_size_and_mtime(dataset):
    m = read_manifest(dataset)
    index = dataset / INDEX_NAME
    assert set(json.loads(index.read_text())) == {s.name for s in m.shards}  # prepare_data.py hashed them already
    index.unlink()
    verify_dataset(dataset)  # first use: hashes every shard and writes the index again
    assert set(json.loads(index.read_text())) == {s.name for s in m.shards}
    path = dataset / m.shards[3].name
    st = path.stat()
    corrupt_flip(dataset, m)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # rsync's quick check: same size and mtime pass
    verify_dataset(dataset)
    with pytest.raises(PiconeoxError, match="crc32c"):  # the deep check ignores the index
        verify_dataset(dataset, check_crc=True)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(PiconeoxError, match="crc32c"):  # another mtime: hashed again
        verify_dataset(dataset)


def test_verify_refuses_a_vocab_or_tokenizer_the_model_was_not_built_for(dataset):
    with pytest.raises(PiconeoxError, match="has vocab size 256, but the model expects 512"):
        verify_dataset(dataset, expected_vocab=512)
    with pytest.raises(PiconeoxError, match="is not the tokenizer the model was trained with"):
        verify_dataset(dataset, expected_tokenizer_sha256="0" * 64)
