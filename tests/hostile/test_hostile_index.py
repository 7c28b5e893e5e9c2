"""Nothing is allocated from an index whose chunks do not cover each tensor exactly (an uncovered
element was written out as whatever the heap held), and a part that stands in for the model's weights (EMA) must
have the model's names, shapes and dtypes."""
import dataclasses
import pickle
import shutil

import pytest
import torch

from utils.ckpt.format import DCP_INDEX, MARKER, manifest, read_marker, write_marker

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")
STEP = "step-00000010"
EMBED = "gpt_neox.embed_in.weight"


def remark(folder) -> None:
    """Recompute the COMPLETE marker over what the folder now holds (anyone can)."""
    marker = read_marker(folder)
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MARKER)
    write_marker(folder, marker["step"], marker["world_size"], manifest(folder, names))


def with_ema(folder, change=None) -> None:
    """Give the (trusted, our own) index an `ema.` part reading the model's records; `change(meta)` edits it."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    meta = pickle.loads((folder / DCP_INDEX).read_bytes())
    for key, m in list(meta.state_dict_metadata.items()):
        if key.startswith("model."):
            meta.state_dict_metadata["ema." + key[6:]] = dataclasses.replace(m, chunks=list(m.chunks))
    for index, info in list(meta.storage_data.items()):
        if index.fqn.startswith("model."):
            meta.storage_data[MetadataIndex("ema." + index.fqn[6:], index.offset, index.index)] = info
    if change:
        change(meta)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    remark(folder)


def consolidate(folder, out, *extra) -> int:
    from utils.consolidate import main
    return main([str(folder), "--out", str(out), *extra])


@pytest.fixture
def step(tmp_path, trained):
    shutil.copytree(trained / "ckpt" / "run" / STEP, tmp_path / STEP)
    return tmp_path / STEP


def test_an_ema_part_of_the_models_shapes_consolidates(step, tmp_path):
    from safetensors.torch import load_file

    with_ema(step)
    assert consolidate(step, tmp_path / "hf", "--weights", "ema") == 0
    assert load_file(tmp_path / "hf" / "model.safetensors")[EMBED].shape[1] > 0


def widen(meta):
    """One more column than the chunks hold: the column was uninitialized heap memory in model.safetensors."""
    m = meta.state_dict_metadata["ema." + EMBED]
    m.size = torch.Size([m.size[0], m.size[1] + 1])


def overlap(meta):
    m = meta.state_dict_metadata["model." + EMBED]
    m.chunks = m.chunks * 2


def missing(meta):
    del meta.state_dict_metadata["ema." + EMBED]


def gap(meta):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    m = meta.state_dict_metadata["model." + EMBED]
    rows, cols = m.size
    m.chunks = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([rows // 2, cols])),
                ChunkStorageMetadata(torch.Size([rows // 2 + 1, 0]), torch.Size([rows - rows // 2 - 1, cols]))]


@pytest.mark.parametrize("change,words", [(widen, "cover"), (overlap, "overlap"), (gap, "leave a gap"),
                                          (missing, "ema weights hold nothing")])
def test_an_index_that_does_not_tile_or_match_is_one_line(step, tmp_path, capsys, change, words):
    with_ema(step, change)
    assert consolidate(step, tmp_path / "hf", "--weights", "ema") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "hf").exists()


def synthetic(folder, size, chunks, offset=0, length=10):
    """A one-tensor index (`model.w`, float32 of `size`, `chunks` as (offsets, sizes)) over a 100-byte shard."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)

    folder.mkdir(exist_ok=True)
    (folder / "__0_0.distcp").write_bytes(bytes(100))
    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(size),
                                  [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in chunks])
    info = _StorageInfo("__0_0.distcp", offset, length)
    meta = Metadata({"model.w": entry}, storage_data={MetadataIndex("model.w", torch.Size([0] * len(size))): info})
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    return folder


@pytest.mark.parametrize("size,chunks,offset,length,words", [
    ([2], [([0], [2])], 0, 10 ** 5000, "an integer of 16,610 bits"),  # was a ValueError traceback printing it
    ([2], [([0], [2])], -10 ** 5000, 10, "an integer of 16,610 bits"),
    ([1 << 32, 1 << 32], [([0, 0], [1 << 32, 1 << 32])], 0, 10, "73,786,976,294,838,206,464 bytes"),  # numel wraps
    ([4, 4], [([0, 0], [2, 2]), ([0, 2], [2, 2]), ([2, 0], [2, 2]), ([2, 2], [2, 2])], 0, 10, "slabs along one"),
    ([3, 4], [([0, 0], [2, 4]), ([2, 0], [2, 4])], 0, 10, "inside it"),
    ([], [([], []), ([], [])], 0, 10, "overlap"),
], ids=["huge length", "huge offset", "numel past 2**64", "a grid", "a chunk past the end", "a scalar twice"])
def test_index_numbers_are_checked_and_shown_in_one_line(tmp_path, size, chunks, offset, length, words):
    from utils.ckpt.load import read_weights
    from utils.errors import PiconeoxError

    with pytest.raises(PiconeoxError, match=words):
        read_weights(synthetic(tmp_path / "step", size, chunks, offset, length))


def test_uneven_shards_and_other_slabs_tile(tmp_path):
    from utils.ckpt.untrusted.index_check import index_problem

    for size, chunks in (([3, 4], [([0, 0], [1, 4]), ([1, 0], [2, 4]), ([3, 0], [0, 4])]),  # an empty last shard
                         ([4, 4], [([0, 2], [4, 2]), ([0, 0], [4, 2])]), ([], [([], [])]), ([0, 3], [])):
        synthetic(tmp_path / "step", size, chunks)
        assert index_problem(pickle.loads((tmp_path / "step" / DCP_INDEX).read_bytes())) is None, (size, chunks)
