"""BlockLoader: packed (input_ids, labels) batches from memory-mapped shards (at most MAX_OPEN_SHARDS open at once),
with an exact resume point.

The shards of a split form one token stream. Block i is tokens [i*T, i*T + T + 1) of it (T = seq_len),
so blocks run across document and shard boundaries and labels are the inputs shifted by one. Each epoch
visits the blocks in a permutation seeded by seed + epoch. A step takes the next batch_size * world_size
blocks of that permutation and rank r keeps the slice [r*B, (r+1)*B): the ranks together see exactly
what one rank with batch world_size * B would see, so the position (epoch, blocks consumed) does not
depend on the world size and a run can resume on a different number of GPUs.
"""
from __future__ import annotations

import functools
import os
from typing import Iterator

import numpy as np
import torch

from utils.errors import PiconeoxError
from utils.data.shards import SPLITS, open_shard, verify_dataset

STATE_KEYS = ("epoch", "blocks_consumed", "seq_len", "seed")
MAX_OPEN_SHARDS = 32


class BlockLoader:
    """Infinite iterator over (input_ids, labels) LongTensor pairs of shape [batch_size, seq_len]."""

    def __init__(self, data_dir: str | os.PathLike, split: str, seq_len: int, batch_size: int, *,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 verify_crc: bool = False):
        for flag, value in (("seq_len", seq_len), ("batch_size", batch_size), ("world_size", world_size)):
            if value < 1:
                raise PiconeoxError(f"{flag} {value} is out of range: give 1 or more")
        if not 0 <= rank < world_size:
            raise PiconeoxError(f"rank {rank} is out of range for world size {world_size}: give 0..{world_size - 1}")
        if seed < 0:
            raise PiconeoxError(f"seed {seed} is out of range: give 0 or more")
        if split not in SPLITS:
            raise PiconeoxError(f"split {split!r} is not one of {', '.join(SPLITS)}")
        manifest = verify_dataset(data_dir, check_crc=verify_crc)
        shards = manifest.split_shards(split)
        if not shards:
            raise PiconeoxError(f"{data_dir} has no {split!r} shards (was it prepared with --val-fraction 0?)")
        self.data_dir, self.split = data_dir, split
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.vocab_size = manifest.vocab_size
        # Shards open on first use and at most MAX_OPEN_SHARDS at once: each map holds a file descriptor, and a
        # 51B-token dataset of 1,369 shards must train under the common `ulimit -n 1024`.
        self._shard = functools.lru_cache(maxsize=MAX_OPEN_SHARDS)(lambda i: open_shard(data_dir, shards[i]))
        self._starts = np.cumsum([0] + [s.tokens for s in shards])  # stream offset of each shard
        self.blocks_per_epoch = max(0, (int(self._starts[-1]) - 1) // seq_len)
        self.tokens_per_epoch = self.blocks_per_epoch * seq_len
        if self.blocks_per_epoch < self._global_batch:
            raise PiconeoxError(
                f"split {split!r} of {data_dir} has {self._starts[-1]:,} tokens = {self.blocks_per_epoch} blocks "
                f"of seq_len {seq_len}, fewer than batch_size * world_size = {self._global_batch}: "
                "use more data or a smaller seq_len/batch")
        self.epoch = 0
        self.blocks_consumed = 0  # of this epoch, summed over all ranks
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)

    @property
    def _global_batch(self) -> int:
        return self.batch_size * self.world_size

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = self.blocks_per_epoch
            self._order = (np.random.default_rng(self.seed + epoch).permutation(n) if self.shuffle
                           else np.arange(n, dtype=np.int64))
            self._order_epoch = epoch
        return self._order

    def _read_block(self, block: int, out: np.ndarray) -> None:
        """Copy the T + 1 tokens of `block` into `out`, crossing shard boundaries as needed."""
        pos, end, filled = block * self.seq_len, block * self.seq_len + self.seq_len + 1, 0
        shard = int(np.searchsorted(self._starts, pos, side="right")) - 1
        while pos < end:
            offset = pos - int(self._starts[shard])
            piece = self._shard(shard)[offset: offset + end - pos]
            out[filled: filled + len(piece)] = piece
            filled, pos, shard = filled + len(piece), pos + len(piece), shard + 1

    def _batch(self, blocks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.empty((len(blocks), self.seq_len + 1), dtype=np.int64)
        for row, block in zip(rows, blocks):
            self._read_block(int(block), row)
        top = int(rows.max())
        if top >= self.vocab_size:  # a foreign or corrupt shard would otherwise crash the embedding
            raise PiconeoxError(f"{self.data_dir}: split {self.split!r} holds token id {top}, not below the vocab "
                                f"size {self.vocab_size}: prepare the data again")
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def _rank_slice(self, first: int) -> slice:
        start = first + self.rank * self.batch_size
        return slice(start, start + self.batch_size)

    def __iter__(self) -> "BlockLoader":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.blocks_consumed + self._global_batch > self.blocks_per_epoch:  # drop_last, next epoch
            self.epoch, self.blocks_consumed = self.epoch + 1, 0
        blocks = self._epoch_order(self.epoch)[self._rank_slice(self.blocks_consumed)]
        self.blocks_consumed += self._global_batch
        return self._batch(blocks)

    def eval_batches(self, max_batches: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The first `max_batches` batches in natural block order (this rank's slices); no state change."""
        for step in range(min(max_batches, self.blocks_per_epoch // self._global_batch)):
            first = step * self._global_batch
            yield self._batch(np.arange(first, first + self._global_batch)[self._rank_slice(0)])

    def state_dict(self) -> dict[str, int]:
        """The position as plain ints; valid for any batch_size/world_size with the same seq_len and seed."""
        return {"epoch": self.epoch, "blocks_consumed": self.blocks_consumed,
                "seq_len": self.seq_len, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Jump to a saved position without reading the data before it."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise PiconeoxError(f"loader state lacks {', '.join(missing)}: expected keys {', '.join(STATE_KEYS)}")
        for key in ("seq_len", "seed"):
            if state[key] != getattr(self, key):
                raise PiconeoxError(f"loader state was saved with {key} {state[key]}, this loader has "
                                    f"{key} {getattr(self, key)}: they must match to resume")
        if not (0 <= state["epoch"] and 0 <= state["blocks_consumed"] <= self.blocks_per_epoch):
            raise PiconeoxError(f"loader state epoch {state['epoch']}, blocks_consumed {state['blocks_consumed']} "
                                f"does not fit split {self.split!r} ({self.blocks_per_epoch} blocks per epoch): "
                                "the dataset changed since it was saved")
        self.epoch, self.blocks_consumed = int(state["epoch"]), int(state["blocks_consumed"])
