"""utils/data/loader.py: packed blocks, seeded order, rank split, exact resume, eval batches, refusals."""
import json
from collections import Counter

import numpy as np
import pytest
import torch

from utils.crc import crc32c_file
from utils.data.loader import BlockLoader
from utils.data.prepare import prepare
from utils.data.shards import read_manifest, write_manifest
from utils.data.tokenizers import EOT, load_tokenizer
from utils.errors import PiconeoxError

T = 16  # seq_len for the small dataset


@pytest.fixture
def small(tmp_path, shared_data):
    """40 KB of real Shakespeare, byte tokens, 3,000-token shards: blocks cross shards, epochs are short."""
    src = tmp_path / "src.txt"
    src.write_text((shared_data / "tinyshakespeare" / "input.txt").read_text()[:40_000])
    return prepare([str(src)], "small", tmp_path, "byte", shard_tokens=3000, val_fraction=0.1, workers=1)


def split_stream(data_dir, split):
    m = read_manifest(data_dir)
    return np.concatenate([np.load(data_dir / s.name) for s in m.split_shards(split)]).astype(np.int64)


def natural_blocks(data_dir, split):
    """Multiset of every block's input tokens, read straight from the shards."""
    ids = split_stream(data_dir, split)
    return Counter(tuple(ids[i * T: i * T + T].tolist()) for i in range((len(ids) - 1) // T))


def rows(batches):
    return [tuple(r) for x in batches for r in x.tolist()]


def take(loader, n):
    return [next(loader) for _ in range(n)]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


def test_blocks_are_the_packed_stream_with_labels_shifted_by_one(small):
    loader = BlockLoader(small, "train", T, 4, shuffle=False)
    ids = split_stream(small, "train")
    assert loader.vocab_size == 256 and loader.blocks_per_epoch == (len(ids) - 1) // T
    assert loader.tokens_per_epoch == loader.blocks_per_epoch * T
    x, y = next(loader)
    assert x.dtype == torch.long and x.shape == y.shape == (4, T)
    for row in range(4):
        assert x[row].tolist() == ids[row * T: row * T + T].tolist()
        assert y[row].tolist() == ids[row * T + 1: row * T + T + 1].tolist()


def test_text_to_shards_to_loader_decodes_to_the_original_text(tmp_path, shared_data):
    src = shared_data / "tinystories" / "tinystories_10k.txt"  # non-ASCII quotes, EOT separated
    data = prepare([str(src)], "ts", tmp_path, "byte", val_fraction=0, shard_tokens=200_000, workers=1)
    loader = BlockLoader(data, "train", 256, 64, shuffle=False)
    batches = list(loader.eval_batches(10**9))
    # natural order: the labels of block i are tokens i*T+1 .. i*T+T, so they tile the stream after token 0
    ids = batches[0][0][0, :1].tolist() + torch.cat([y for _, y in batches]).flatten().tolist()
    covered = loader.blocks_per_epoch // 64 * 64 * 256 + 1
    assert len(ids) == covered > 0.99 * len(split_stream(data, "train"))
    tail = split_stream(data, "train")[covered:].tolist()  # < 64 blocks that drop_last leaves out
    text = src.read_text(encoding="utf-8")
    expected = EOT.join(d.strip() for d in text.split(EOT) if d.strip()) + EOT
    assert load_tokenizer(data).decode(ids + tail) == expected


def test_each_epoch_is_a_new_permutation_of_all_blocks(small):
    loader = BlockLoader(small, "train", T, 8, seed=5)
    per_epoch = loader.blocks_per_epoch // 8
    epochs = [rows(x for x, _ in take(loader, per_epoch)) for _ in range(2)]
    for seen in epochs:  # every block once, except the < 8 that drop_last leaves out
        assert len(seen) == loader.blocks_per_epoch - loader.blocks_per_epoch % 8
        assert not Counter(seen) - natural_blocks(small, "train")
    assert epochs[0] != epochs[1]  # seed + epoch reshuffles
    assert loader.state_dict() == {"epoch": 1, "blocks_consumed": per_epoch * 8, "seq_len": T, "seed": 5}
    next(loader)
    assert loader.state_dict() == {"epoch": 2, "blocks_consumed": 8, "seq_len": T, "seed": 5}


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_after_40_batches_gives_the_same_next_8(small, world_size):
    def loaders():  # seq_len 256: ~140 blocks, so 40 steps of 3 * world_size blocks cross epochs
        return [BlockLoader(small, "train", 256, 3, seed=11, rank=r, world_size=world_size)
                for r in range(world_size)]

    straight = loaders()
    expected = [take(loader, 48)[40:] for loader in straight]
    interrupted = loaders()
    for loader in interrupted:
        take(loader, 40)
    saved = [json.loads(json.dumps(loader.state_dict())) for loader in interrupted]  # as in a checkpoint
    resumed = loaders()
    for loader, state in zip(resumed, saved):
        loader.load_state_dict(state)
    assert all(same(take(loader, 8), exp) for loader, exp in zip(resumed, expected))
    assert [loader.state_dict() for loader in resumed] == [loader.state_dict() for loader in straight]
    assert straight[0].state_dict()["epoch"] >= 1  # the 48 batches crossed an epoch boundary


def test_two_ranks_are_disjoint_complete_and_equal_one_rank_with_double_batch(small):
    ranks = [BlockLoader(small, "train", T, 4, seed=3, rank=r, world_size=2) for r in range(2)]
    single = BlockLoader(small, "train", T, 8, seed=3)
    seen = []
    for _ in range(single.blocks_per_epoch // 8):
        (x0, y0), (x1, y1), (x, y) = next(ranks[0]), next(ranks[1]), next(single)
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
        seen += rows([x0, x1])
    assert len(seen) == single.blocks_per_epoch - single.blocks_per_epoch % 8
    assert not Counter(seen) - natural_blocks(small, "train")  # no block twice, none made up
    assert ranks[0].state_dict() == ranks[1].state_dict() == single.state_dict()


def test_a_state_saved_with_two_ranks_resumes_on_one_rank(small):
    ranks = [BlockLoader(small, "train", T, 2, seed=9, rank=r, world_size=2) for r in range(2)]
    for loader in ranks:
        take(loader, 25)
    one = BlockLoader(small, "train", T, 4, seed=9)
    one.load_state_dict(ranks[0].state_dict())
    for x, _ in take(one, 5):
        assert torch.equal(x, torch.cat([next(ranks[0])[0], next(ranks[1])[0]]))


def test_eval_batches_are_natural_order_and_leave_the_position_alone(small):
    loader = BlockLoader(small, "val", T, 2, seed=1)
    take(loader, 3)
    state = loader.state_dict()
    ids = split_stream(small, "val")
    batches = list(loader.eval_batches(4))
    assert len(batches) == 4 and loader.state_dict() == state
    assert batches[1][0][0].tolist() == ids[2 * T: 3 * T].tolist()
    assert len(list(loader.eval_batches(10**6))) == loader.blocks_per_epoch // 2
    rank1 = BlockLoader(small, "val", T, 1, rank=1, world_size=2)
    assert next(rank1.eval_batches(1))[0][0].tolist() == ids[T: 2 * T].tolist()


def test_load_state_refuses_another_seq_len_or_seed(small):
    state = BlockLoader(small, "train", T, 2, seed=1).state_dict()
    with pytest.raises(PiconeoxError, match="saved with seq_len 16, this loader has seq_len 32"):
        BlockLoader(small, "train", 32, 2, seed=1).load_state_dict(state)
    with pytest.raises(PiconeoxError, match="saved with seed 1, this loader has seed 2"):
        BlockLoader(small, "train", T, 2, seed=2).load_state_dict(state)
    with pytest.raises(PiconeoxError, match="the dataset changed"):
        BlockLoader(small, "train", T, 2, seed=1).load_state_dict(state | {"blocks_consumed": 10**9})


@pytest.mark.parametrize("kwargs, message", [
    (dict(seq_len=0), "seq_len 0 is out of range"),
    (dict(rank=2, world_size=2), "rank 2 is out of range for world size 2: give 0..1"),
    (dict(split="test"), "split 'test' is not one of train, val"),
    (dict(seq_len=8192, batch_size=8), "fewer than batch_size \\* world_size = 8"),
])
def test_bad_loader_arguments_are_refused(small, kwargs, message):
    args = dict(split="train", seq_len=T, batch_size=2) | kwargs
    with pytest.raises(PiconeoxError, match=message):
        BlockLoader(small, **args)


def test_opening_checks_the_files_and_batches_check_token_ids(small):
    data = small
    m = read_manifest(data)
    path = data / m.shards[0].name
    ids = np.load(path)
    ids[T + 3] = 999  # same size: the crc32c check on opening sees it
    np.save(path, ids)
    with pytest.raises(PiconeoxError, match="crc32c"):
        BlockLoader(data, "train", T, 1)
    m.shards[0].crc32c = crc32c_file(path)  # a foreign shard with a consistent manifest: the batches see it
    write_manifest(data, m)
    loader = BlockLoader(data, "train", T, 1, shuffle=False)
    next(loader)
    with pytest.raises(PiconeoxError, match="token id 999, not below the vocab size 256"):
        next(loader)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(PiconeoxError, match="bytes, the manifest says"):
        BlockLoader(data, "train", T, 1)


def test_val_fraction_zero_has_no_val_split(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("some words " * 500)
    data = prepare([str(src)], "nv", tmp_path, val_fraction=0, workers=1)
    with pytest.raises(PiconeoxError, match="has no 'val' shards"):
        BlockLoader(data, "val", 8, 1)
