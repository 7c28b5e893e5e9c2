"""Pickles and zips inside a checkpoint, refused before an unpickler or a decompressor sees them: hash bombs in
the index, a record or an older checkpoint's rng-*.pt; DEFLATE records and an index entry reading /dev/zero; a
payload in a tensor slot; index shapes our writer never makes; RNG states of the wrong kind. Each ends in one line.

Every case runs in a forked child (`bounded`, tests/support/hostile_loads.py) under a memory cap and a hang bound.
"""
import io
import json
import pickle
import zipfile

import pytest
import torch

from tests.support.hostile_loads import (assert_one_line, bounded, consolidate, hash_bomb, remark_all,
                                         replace_record, resume)
from tests.support.hostile_pickles import torch_zip
from tests.support.payloads import Payload, torch_bytes
from utils.ckpt.format import DCP_INDEX

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")

STEP = "step-00000010"


# hash bombs: every pickle is bounded before an unpickler sees it; small states are JSON

def test_the_hash_bomb_is_real():
    """On an unguarded unpickler the 1 KB bomb does not finish in 5 s (it would take centuries)."""
    assert bounded(lambda: pickle.loads(hash_bomb()) and 0, deadline=5) == ("timeout", "")


def test_small_states_are_json_and_our_own_pickles_pass_the_bounds(work):
    from utils.ckpt.untrusted.bounded import check_pickle, check_torch_zip

    folder = work / "ckpt" / "run" / STEP
    assert {p.name for p in folder.glob("*.pt")} == set() and (folder / "scheduler.json").is_file()
    check_pickle((folder / DCP_INDEX).read_bytes(), "our own index")
    check_torch_zip(io.BytesIO(torch_bytes({"lr": 1e-3, "betas": (0.9, 0.95), "w": torch.zeros(3)})), "a value")


def test_a_hash_bomb_anywhere_in_a_checkpoint_is_refused_at_once(work, tiny_data):
    folder = work / "ckpt" / "run" / STEP
    index = (folder / DCP_INDEX).read_bytes()
    (folder / DCP_INDEX).write_bytes(hash_bomb())
    remark_all(folder)
    assert_one_line(bounded(consolidate(folder, work / "hf")), str(folder / DCP_INDEX), "unfold into")
    (folder / DCP_INDEX).write_bytes(index)
    replace_record(folder, "optim.param_groups.", torch_zip(hash_bomb()))  # a value record inside the .distcp
    remark_all(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "__0_0.distcp", "unfold into")


def test_an_older_checkpoints_pickled_rng_is_read_bounded(work, tiny_data):
    """rng-*.pt of checkpoints written before the small states became JSON still load (through the bounded reader);
    a bomb there is refused in one line."""
    from utils.ckpt.state import rng_from_json

    folder = work / "ckpt" / "run" / STEP
    state = rng_from_json(json.loads((folder / "rng-00000.json").read_text()))
    (folder / "rng-00000.json").unlink()
    torch.save(state, folder / "rng-00000.pt")
    remark_all(folder)
    from utils.ckpt.load import read_rng
    assert read_rng(folder, 0)["torch"].equal(state["torch"])
    (folder / "rng-00000.pt").write_bytes(torch_zip(hash_bomb()))
    remark_all(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "rng-00000.pt", "unfold into")


# decompression: a DEFLATE record, or a record reading /dev/zero, costs no more than its bytes

def deflated(data: bytes) -> bytes:
    """The torch.save zip `data` with every record DEFLATE-compressed (torch never writes that)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    return buf.getvalue()


def test_a_compressed_record_is_refused_before_it_inflates(work, tiny_data):
    folder = work / "ckpt" / "run" / STEP
    bomb = deflated(torch_bytes(torch.zeros(32 << 20)))  # 128 MB of zeros in ~130 KB
    assert len(bomb) < 1 << 20
    replace_record(folder, "optim.param_groups.", bomb)
    remark_all(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "is compressed")


def test_an_index_entry_reading_dev_zero_is_refused(work):
    import dataclasses

    folder = work / "ckpt" / "run" / STEP
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())
    index = next(i for i in meta.storage_data if i.fqn.startswith("model."))
    meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], relative_path="/dev/zero", offset=0,
                                                   length=2_000_000_000)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    remark_all(folder)
    code, err = bounded(consolidate(folder, work / "hf"))
    assert code == 2 and "Traceback" not in err and err.count("error: ") == 1, err[-2000:]


# harmless but hostile: one line, never a traceback

def test_a_payload_in_a_tensor_slot_is_refused(work):
    folder, flag = work / "ckpt" / "run" / STEP, work / "PWNED"
    replace_record(folder, "model.", torch_bytes(Payload(flag)))
    remark_all(folder)
    assert_one_line(bounded(consolidate(folder, work / "hf")), "refused to load: it asks for posix.system")
    assert not flag.exists()


def index_variants():
    """(what, change to the unpickled index) pairs: shapes an index our writer never makes."""
    import dataclasses

    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def first(meta):
        return next(k for k in meta.state_dict_metadata if k.startswith("model."))

    def chunk_outside(meta):
        m = meta.state_dict_metadata[first(meta)]
        m.chunks = [ChunkStorageMetadata(offsets=torch.Size([5] * len(m.size)), sizes=m.size)]

    return {"a number as an entry": lambda meta: meta.state_dict_metadata.update({first(meta): 5}),
            "a chunk outside its tensor": chunk_outside,
            "a tensor of 4 TB": lambda meta: setattr(meta.state_dict_metadata[  # a shape config.json does not give
                "model.gpt_neox.final_layer_norm.weight"], "size", torch.Size([10**6, 10**6])),
            "a compressing transform": lambda meta: meta.storage_data.update(
                {k: dataclasses.replace(v, transform_descriptors=["zstd"]) for k, v in meta.storage_data.items()}),
            "a list as storage records": lambda meta: setattr(meta, "storage_data", [])}


@pytest.mark.parametrize("what", list(index_variants()))
def test_index_variants_are_one_line(work, what):
    folder = work / "ckpt" / "run" / STEP
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())
    index_variants()[what](meta)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    remark_all(folder)
    assert_one_line(bounded(consolidate(folder, work / "hf")), str(folder / DCP_INDEX))


def test_wrong_rng_contents_are_one_line(work, tiny_data):
    """In today's rng-*.json and in an older checkpoint's rng-*.pt (both read; both checked value by value)."""
    folder = work / "ckpt" / "run" / STEP
    saved = json.loads((folder / "rng-00000.json").read_text())
    (folder / "rng-00000.json").write_text(json.dumps({**saved, "torch": "00ff"}))
    remark_all(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "rng-00000.json: not an RNG state",
                    "torch's state must be")
    (folder / "rng-00000.json").unlink()
    torch.save({"python": 1, "numpy": 2, "torch": 3}, folder / "rng-00000.pt")
    remark_all(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "rng-00000.pt: not an RNG state")
