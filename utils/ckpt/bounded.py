"""What a file from a checkpoint, a model folder or a dataset may cost to read: no file hangs a loader or takes
memory out of proportion to its size, whatever its bytes.

- A pickle (DCP's `.metadata`, each record of a `.distcp`, an older `.pt` small state, `pytorch_model.bin`) is
  walked opcode by opcode first (pickletools builds nothing): its objects, each shared reference counted again,
  may number at most MAX_PICKLE_NODES and nest at most MAX_PICKLE_DEPTH deep. A 1 KB pickle of 64 tuples nested
  through the memo is 2**64 objects to hash: it would hang any unpickler inside C, where no signal handler runs.
- A torch zip (what torch.save writes) must store its records as they are: a DEFLATE record would be inflated
  by torch.load (~1,000x), and torch itself never compresses one.
- JSON is read by utils.textfile.read_json: up to a size, and nesting too deep to parse is one line.
"""
from __future__ import annotations

import hashlib
import io
import pickletools
import zipfile
from collections import OrderedDict

from utils.errors import PiconeoxError

MAX_PICKLE_NODES = 5_000_000  # a 1.2B model's index holds ~100,000 objects; its optimizer records ~100
MAX_PICKLE_DEPTH = 100  # what torch writes nests 10 deep
MUTATORS = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}  # fill the object below them
_MARK = -1
_PASSED: OrderedDict[bytes, None] = OrderedDict()  # digests of the pickles check_pickle let through, newest last


def pickle_graph(data: bytes) -> tuple[list[list[int]], int]:
    """(children of every object, the root) of the pickle `data`: the unpickler's stack, with objects as numbers."""
    children: list[list[int]] = []
    stack: list[int] = []
    memo: dict = {}
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name == "STOP":
            return children, stack[-1]
        if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[arg if arg is not None else len(memo)] = stack[-1]
            continue
        if name in ("GET", "BINGET", "LONG_BINGET", "MARK", "DUP"):
            stack.append(memo[arg] if name.endswith("GET") else _MARK if name == "MARK" else stack[-1])
            continue
        if pickletools.markobject in op.stack_before:
            top = len(stack) - 1 - stack[::-1].index(_MARK)
            below = op.stack_before.index(pickletools.markobject)
            if top < below:
                raise ValueError(f"{name} on a short stack")
            consumed = stack[top - below:top] + stack[top + 1:]
            del stack[top - below:]
        else:
            n = len(op.stack_before)
            consumed = stack[len(stack) - n:] if n else []
            del stack[len(stack) - n:len(stack) if n else 0]
        if len(consumed) < len(op.stack_before) - 2 * (pickletools.markobject in op.stack_before) or \
                _MARK in consumed:
            raise ValueError(f"{name} on a malformed stack")
        if name in MUTATORS or name == "READONLY_BUFFER":
            children[consumed[0]].extend(consumed[1:])
            stack.append(consumed[0])
        elif op.stack_after:
            children.append(consumed)
            stack.append(len(children) - 1)
    raise ValueError("no STOP")


def pickle_cost(data: bytes) -> tuple[int, int]:
    """(objects counting every shared reference again, nesting depth) of the pickle `data`, building nothing."""
    children, root = pickle_graph(data)
    size, depth, state = [0] * len(children), [0] * len(children), [0] * len(children)  # state: 1 open, 2 done
    work = [(root, False)]
    while work:
        node, close = work.pop()
        if close:
            kids = children[node]
            size[node] = 1 + sum(size[c] for c in kids)
            depth[node] = 1 + max((depth[c] for c in kids), default=0)
            state[node] = 2
        elif state[node] == 1:
            raise ValueError("an object that contains itself")
        elif state[node] == 0:
            state[node] = 1
            work.append((node, True))
            work.extend((c, False) for c in children[node] if state[c] != 2)
    return size[root], depth[root]


def check_pickle(data: bytes, path, item: str = "") -> None:
    """Refuse, in one line, a pickle whose objects could not be built and hashed in time proportional to its size.
    Bytes that passed once pass again without the walk (a resume reads one `.metadata` up to three times)."""
    digest = hashlib.blake2b(data, digest_size=16).digest()  # ~1 ms for a 1.2B model's index; the walk ~1-3 s
    if digest in _PASSED:
        return
    where = f"{path}{f' ({item})' if item else ''}"
    try:
        nodes, depth = pickle_cost(data)
    except (ValueError, KeyError, IndexError) as e:  # pickletools' and the simulated stack's errors
        raise PiconeoxError(f"{where}: not a readable pickle ({str(e)[:200]})") from None
    if nodes > MAX_PICKLE_NODES or depth > MAX_PICKLE_DEPTH:
        raise PiconeoxError(f"{where}: refused to load: its {len(data):,} bytes unfold into {nodes:,} objects nested "
                            f"{depth} deep (allowed: {MAX_PICKLE_NODES:,} objects, {MAX_PICKLE_DEPTH} deep); a "
                            "checkpoint's pickles are small and flat")
    _PASSED[digest] = None
    if len(_PASSED) > 64:
        _PASSED.popitem(last=False)


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
            check_pickle(z.read(pkl[0]), path, item)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise PiconeoxError(f"{where}: not a readable torch.save file ({str(e)[:200]}); piconeox reads only torch's "
                            "zip format") from None
    finally:
        if isinstance(source, io.IOBase):
            source.seek(0)

