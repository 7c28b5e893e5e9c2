"""What a file from a checkpoint, a model folder or a dataset may cost to read: no file hangs a loader or takes
memory out of proportion to its size, whatever its bytes.

- A pickle (DCP's `.metadata`, each record of a `.distcp`, an older `.pt` small state, `pytorch_model.bin`) is
  walked opcode by opcode first (utils/ckpt/untrusted/pickle_walk.py: one pass, nothing built, every limit checked as it
  goes): at most MAX_PICKLE_OPS opcodes and MAX_PICKLE_TEXT bytes of strings; at most MAX_PICKLE_NODES objects
  created, none of which unfolds (each shared reference counted again) into more, or nests more than
  MAX_PICKLE_DEPTH deep. A 1 KB pickle of 64 tuples nested through the memo is 2**64 objects to hash: it would
  hang any unpickler inside C, where no signal handler runs.
- Hash collisions: 74,000 int keys that all hash to 0 cost 74,000**2 / 2 comparisons to put in one dict. What an
  unpickler we cannot watch builds (torch.load) may hold at most MAX_HASH_WORK_UNWATCHED entries squared, summed
  over its dicts and sets (<= ~3 s of colliding inserts); the index's own unpickler counts equal hashes as it
  builds (safe_load.MetadataUnpickler) and is allowed pickle_walk.MAX_HASH_WORK.
- A torch zip (what torch.save writes) must store its records as they are: a DEFLATE record would be inflated
  by torch.load (~1,000x), and torch itself never compresses one; its data.pkl holds at most MAX_DATA_PKL_BYTES.
- JSON is read by utils.textfile.read_json: up to a size, and nesting too deep to parse is one line.
"""
from __future__ import annotations

import hashlib
import io
import zipfile
from collections import OrderedDict

from utils.ckpt.untrusted.pickle_walk import MAX_PICKLE_DEPTH, MAX_PICKLE_NODES, TooCostly, pickle_cost  # noqa: F401 (tests)
from utils.errors import PiconeoxError

MAX_HASH_WORK_UNWATCHED = 1 << 28  # one dict of 16,384 colliding keys: ~3.4 s here; a 1.2B state dict: ~400 keys
MAX_DATA_PKL_BYTES = 64 << 20  # torch.save writes ~100 bytes a tensor: a 1.2B model's data.pkl is ~50 KB
_PASSED: OrderedDict[tuple, int] = OrderedDict()  # (digest, hash budget): hash work, of the pickles that passed


def check_pickle(data: bytes, path, item: str = "", hash_work: int = MAX_HASH_WORK_UNWATCHED) -> int:
    """Refuse, in one line, a pickle whose objects could not be built and hashed in time proportional to its size
    (`hash_work`: what its dicts' and sets' entries squared may sum to); else return what they sum to. Bytes that
    passed once pass again without the walk (a resume reads one `.metadata` up to three times)."""
    key = (hashlib.blake2b(data, digest_size=16).digest(), hash_work)  # ~1 ms for a 1.2B model's index
    if key in _PASSED:
        return _PASSED[key]
    where = f"{path}{f' ({item})' if item else ''}"
    try:
        cost = pickle_cost(data)
        if cost.hash_work > hash_work:
            raise TooCostly(f"its dicts and sets hold too many entries (entries squared, summed over them all: "
                            f"{cost.hash_work:,}; allowed: {hash_work:,})")
    except TooCostly as e:
        raise PiconeoxError(f"{where}: refused to load: {e}; a checkpoint's pickles are small and flat") from None
    except (ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError) as e:  # the opcodes' and the stack's
        raise PiconeoxError(f"{where}: not a readable pickle ({str(e)[:200]})") from None
    _PASSED[key] = cost.hash_work
    if len(_PASSED) > 64:
        _PASSED.popitem(last=False)
    return cost.hash_work


def check_torch_zip(source, path, item: str = "") -> None:
    """`source` (a path or a seekable binary file) is a torch.save zip whose records are all stored uncompressed,
    and whose pickle passes check_pickle; else one PiconeoxError line. `source` is rewound afterwards."""
    where = f"{path}{f' ({item})' if item else ''}"
    try:
        with zipfile.ZipFile(source) as z:
            infos = z.infolist()
            packed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
            if packed:
                raise PiconeoxError(f"{where}: refused to load: record {packed[0]} is compressed (method "
                                    f"{infos[0].compress_type}); torch.save writes records stored as they are, and "
                                    "inflating one could take ~1,000x its size")
            pkl = [i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(pkl) != 1:
                raise PiconeoxError(f"{where}: not a torch.save file (no data.pkl record)")
            if max(pkl[0].file_size, pkl[0].compress_size) > MAX_DATA_PKL_BYTES:
                raise PiconeoxError(f"{where}: refused to load: its data.pkl claims {pkl[0].file_size:,} bytes; at "
                                    f"most {MAX_DATA_PKL_BYTES:,} are read (torch.save writes ~100 a tensor)")
            check_pickle(z.read(pkl[0]), path, item)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise PiconeoxError(f"{where}: not a readable torch.save file ({str(e)[:200]}); piconeox reads only torch's "
                            "zip format") from None
    finally:
        if isinstance(source, io.IOBase):
            source.seek(0)

