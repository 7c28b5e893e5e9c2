"""Loading a checkpoint never runs code from it: every pickle in a checkpoint is read through an allowlist.

A step folder is trusted by its COMPLETE marker, but anyone can recompute crc32c values: a checkpoint from a team
bucket, a colleague's `--resume gs://` or a download to consolidate is data, never code. A checkpoint holds
pickles in three places, and each is read here with only the types our own writer puts there:

- `.metadata`, the DCP index: `SafeFileSystemReader` unpickles only torch.distributed.checkpoint's metadata
  dataclasses, torch.Size, dtypes, layouts and paths (torch's own reader is a plain `pickle.load`).
- non-tensor values inside the `.distcp` shards (the optimizer's hyperparameters): `SafeLoadPlanner` loads them
  with `torch.load(weights_only=True)` (DCP's default planner uses `weights_only=False`).
- `scheduler.pt`, `scaler.pt`, `rng-*.pt`: `load_small_state`, `torch.load(weights_only=True)` plus NumPy's
  array reconstruction (the NumPy RNG state is an array). Tensors everywhere load with `weights_only=True`.

Anything else is refused with `UnsafeCheckpoint`: one line naming the file and the global it asked for.
Checkpoints written by earlier versions hold nothing else, so they load unchanged.
"""
from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.utils import _ReaderView

from utils.ckpt.untrusted.bounded import MAX_HASH_WORK_UNWATCHED, check_pickle, check_torch_zip
from utils.ckpt.untrusted.index_check import check_storage, index_problem
from utils.ckpt.untrusted.pickle_walk import MAX_HASH_WORK
from utils.ckpt.untrusted.refusal import UnsafeCheckpoint, refusal  # noqa: F401 (the door names its refusal)
from utils.ckpt.untrusted.stoppable import stoppable
from utils.ckpt.untrusted.typed import index_problem as index_kinds_problem, record_problem, value_problem
from utils.errors import PiconeoxError, first_line

MAX_INDEX_BYTES = 1 << 30  # a 1.2B model's .metadata is ~1 MB
MAX_VALUE_BYTES = 1 << 20  # a non-tensor value (an optimizer hyperparameter) is a few hundred bytes
MAX_SAME_HASH = 8  # keys of one dict or set with one hash: distinct keys share a 64-bit hash only when made to

METADATA_MODULE = "torch.distributed.checkpoint.metadata"
METADATA_TYPES = ("Metadata", "StorageMeta", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties",
                  "TensorStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
OTHER_METADATA_GLOBALS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                          ("torch.serialization", "_get_layout"),  # layouts pickle as a lookup by name
                          ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # the checkpoint_id it was saved to
                          ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath")}  # Python >= 3.13


def metadata_globals() -> frozenset[tuple[str, str]]:
    """(module, name) of every global a DCP `.metadata` written by torch may reference."""
    dtypes = {("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    return frozenset({(METADATA_MODULE, name) for name in METADATA_TYPES} | OTHER_METADATA_GLOBALS | dtypes)


class Allowlisted:
    """An unpickler that builds only the allowlisted types; any other global (os.system, builtins.eval, ...) is
    refused."""

    def __init__(self, file, path):
        super().__init__(file)
        self.path, self.allowed = path, metadata_globals()

    def find_class(self, module: str, name: str):
        if (module, name) not in self.allowed:
            raise refusal(self.path, f"{module}.{name}")
        return super().find_class(module, name)


class MetadataUnpickler(Allowlisted, pickle.Unpickler):
    """The C unpickler, for an index whose dicts and sets the walk bounded to bounded.MAX_HASH_WORK_UNWATCHED
    (entries squared: <= ~3 s of colliding inserts, where no signal is handled): a 1.2B model on 8 ranks."""


class WatchedMetadataUnpickler(Allowlisted, pickle._Unpickler):
    """Python's own unpickler, for a larger index (more ranks): a signal stops it between opcodes, and every key
    put into a dict or set is hashed first: more than MAX_SAME_HASH keys of one hash (a collision attack,
    quadratic to insert) are refused. ~3x slower than the C one."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, path):
        super().__init__(file, path)
        self.hashes = {}

    def count_keys(self, target, keys) -> None:
        counts = self.hashes.setdefault(id(target), {})
        for key in keys:
            h = hash(key)
            counts[h] = n = counts.get(h, 0) + 1
            if n > MAX_SAME_HASH:
                raise PiconeoxError(f"{self.path}: refused to load: more than {MAX_SAME_HASH} keys of one dict or "
                                    "set share one hash (colliding keys cost their count squared to insert)")

    def load_setitem(self):
        self.count_keys(self.stack[-3], self.stack[-2:-1])
        pickle._Unpickler.load_setitem(self)

    def load_setitems(self):
        self.count_keys(self.metastack[-1][-1], self.stack[::2])
        pickle._Unpickler.load_setitems(self)

    def load_additems(self):
        self.count_keys(self.metastack[-1][-1], self.stack)
        pickle._Unpickler.load_additems(self)

    def load_dict(self):
        self.count_keys(object(), self.stack[::2])
        pickle._Unpickler.load_dict(self)

    def load_frozenset(self):
        self.count_keys(object(), self.stack)
        pickle._Unpickler.load_frozenset(self)

    for _op, _load in ((pickle.SETITEM, load_setitem), (pickle.SETITEMS, load_setitems), (pickle.DICT, load_dict),
                       (pickle.ADDITEMS, load_additems), (pickle.FROZENSET, load_frozenset)):
        dispatch[_op[0]] = _load
    del _op, _load


class RecordView(_ReaderView):
    """DCP's view of one record of a .distcp file, but SEEK_END counts back from the record's end (zipfile seeks
    there to find the directory; DCP's own view counts forward)."""

    def seek(self, offset: int, whence: int = os.SEEK_SET, /) -> int:
        return super().seek(self.len + offset) if whence == os.SEEK_END else super().seek(offset, whence)


class SafeFileSystemReader(FileSystemReader):
    """torch's FileSystemReader with `.metadata` read by `MetadataUnpickler` instead of `pickle.load` (after
    check_pickle bounds it) and every record checked before it is loaded (`read_data`)."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with stoppable(path):
            return self._read_metadata(path)

    def _read_metadata(self, path):
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        with self.fs.create_stream(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size  # read what it holds: f.read(MAX + 1) reserved 1 GiB up front
            if size > MAX_INDEX_BYTES:
                raise PiconeoxError(f"{path}: more than {MAX_INDEX_BYTES:,} bytes, not a checkpoint index")
            data = f.read(size)
        work = check_pickle(data, path, hash_work=MAX_HASH_WORK)  # bounded before any object is built
        unpickler = MetadataUnpickler if work <= MAX_HASH_WORK_UNWATCHED else WatchedMetadataUnpickler
        try:
            metadata = unpickler(io.BytesIO(data), path).load()
        except PiconeoxError:
            raise
        except Exception as e:  # truncated or not a pickle at all: the unpickler's errors vary
            why = f"{type(e).__name__}: {first_line(e, 200)}"
            raise PiconeoxError(f"{path}: not a readable checkpoint index ({why})") from None
        if not isinstance(metadata, Metadata):
            raise PiconeoxError(f"{path}: not a checkpoint index (holds a {type(metadata).__name__})")
        if why := index_problem(metadata):
            raise PiconeoxError(f"{path}: not a checkpoint index piconeox wrote: {why}")
        check_storage(Path(self.path), metadata, path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


    def read_data(self, plan, planner):
        """DCP's read, but every record is checked before torch.load sees it (utils/ckpt/untrusted/bounded.py): a value
        record is read only up to MAX_VALUE_BYTES, a tensor record must be a torch zip of stored records."""
        from torch.distributed._shard._utils import narrow_tensor_by_index
        from torch.distributed.checkpoint.planner import LoadItemType
        from torch.futures import Future

        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_file.items():
            path = Path(self.path) / name
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                for item in items:
                    info = self.storage_data[item.storage_index]
                    if not 0 <= info.offset <= info.offset + info.length <= size:  # /dev/zero has size 0
                        raise PiconeoxError(f"{path}: record {item.dest_index.fqn} claims bytes {info.offset:,} to "
                                            f"{info.offset + info.length:,} of a file of {size:,}")
                    view = RecordView(f, info.offset, info.length)
                    if item.type == LoadItemType.BYTE_IO:
                        if info.length > MAX_VALUE_BYTES:
                            raise PiconeoxError(f"{path}: value {item.dest_index.fqn} claims {info.length:,} bytes; "
                                                f"at most {MAX_VALUE_BYTES:,} are read")
                        planner.load_bytes(item, io.BytesIO(view.read(info.length)))
                        continue
                    record = weights_only_load(view, path, item=item.dest_index.fqn)
                    if why := record_problem(record, planner.metadata, item.storage_index):
                        raise PiconeoxError(f"{path}: record {item.dest_index.fqn} {why}")
                    tensor = narrow_tensor_by_index(record, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != tensor.size():
                        raise PiconeoxError(f"{path}: {item.dest_index.fqn} holds {list(tensor.size())} values "
                                            f"where the model has {list(target.size())}")
                    target.copy_(tensor)
                    planner.commit_tensor(item, target)
        done: Future = Future()
        done.set_result(None)
        return done


def weights_only_load(source, path, allow=(), item: str = "", mmap: bool = False):
    """`torch.load(weights_only=True)` of `source` (the file `path`, or its part `item`) with the extra globals
    `allow`, once check_torch_zip has bounded it; a refusal is one UnsafeCheckpoint line. `mmap`: tensors stay
    on disk (`source` a path)."""
    with stoppable(path):
        return _weights_only_load(source, path, allow, item, mmap)


def _weights_only_load(source, path, allow, item: str, mmap: bool):
    check_torch_zip(source, path, item)  # stored records only, a pickle of bounded size and depth
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:  # torch's message is a paragraph: keep the global it names
        found = (re.search(r"GLOBAL (\S+)", str(e)) or re.search(r"got <class '([^']+)'>", str(e))
                 or re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(e)))
        what = found.group(1) if found else "an object torch.load(weights_only=True) refuses"
        raise refusal(path, what + (f" (in {item})" if item else "")) from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise PiconeoxError(f"{path}: not a readable state file ({first_line(e, 200)})") from None


def load_small_state(path: Path):
    """scheduler.pt, scaler.pt or rng-*.pt: numbers, tensors and the NumPy RNG's array, nothing else."""
    import numpy as np

    return weights_only_load(path, path, allow=(np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                                                   np.dtypes.UInt32DType))


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values (BYTE_IO items) load with `weights_only=True`, and
    every value must be of the kind the state being loaded holds at its place (utils/ckpt/typed.py): the index's
    entries before anything is read, each value as it is read."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = Path(folder)

    def create_local_plan(self):
        if why := index_kinds_problem(self.state_dict, self.metadata.state_dict_metadata):
            raise PiconeoxError(f"{self.folder / '.metadata'}: {why}")
        return super().create_local_plan()

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        path = self.folder / self.metadata.storage_data[read_item.storage_index].relative_path
        key = read_item.dest_index.fqn
        obj = weights_only_load(value, path, item=key)
        if why := value_problem(obj, self.state_dict[key], key):  # the run's own value at that place
            raise PiconeoxError(f"{path}: record {key} {why}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_dcp(state: dict, folder: Path, no_dist: bool) -> None:
    """`dcp.load(state)` from `folder` (in place) through the safe reader and planner. An error on any rank is
    raised as itself (our one-line errors first), not as DCP's dump of every rank's traceback."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = SafeFileSystemReader(str(folder))
    reader.read_metadata()  # a refusal here raised inside dcp.load would be folded into an AssertionError
    try:
        with stoppable(folder):
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(folder), no_dist=no_dist)
    except CheckpointException as e:  # a BaseException: DCP wraps every rank's error in it
        errors = [exc for exc, _ in e.failures.values()]
        raise next((exc for exc in errors if isinstance(exc, PiconeoxError)), errors[0]) from None
