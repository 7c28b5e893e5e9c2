"""The bounded pickle walk (utils/ckpt/untrusted/bounded.py): what a pickle would build, counted opcode by opcode in
one pass (linear in its bytes), with every limit checked as it goes; nothing is built."""
from __future__ import annotations

import pickletools
import struct
from array import array

MAX_PICKLE_NODES = 5_000_000  # a 1.2B model's index holds ~100,000 objects; its optimizer records ~100
MAX_PICKLE_DEPTH = 100  # what torch writes nests 10 deep
MAX_PICKLE_OPS = 2 * MAX_PICKLE_NODES  # torch writes ~2 an object; each ~1 us to walk (10M: ~12 s, stoppable)
MAX_PICKLE_TEXT = 64 << 20  # bytes of strings in all (a 1.2B model's index: ~1 MB); one decodes to <= 4x its bytes
MAX_HASH_WORK = 1 << 36  # sum over dicts and sets of entries**2: what hash collisions could cost (see check_pickle)
MUTATORS = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}  # fill the object below them
ENTRIES = {"SETITEM": 2, "SETITEMS": 2, "ADDITEMS": 1, "DICT": 2, "FROZENSET": 1}  # stack items per entry
_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: "<B", pickletools.TAKEN_FROM_ARGUMENT4: "<i",
           pickletools.TAKEN_FROM_ARGUMENT4U: "<I", pickletools.TAKEN_FROM_ARGUMENT8U: "<Q"}
_FIXED = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}
NEW, MUTATE, MARK, STOP, PUT, GET, POP, POP_MARK, DUP, PASS, NOTHING = range(11)
_KINDS = {"MARK": MARK, "STOP": STOP, "POP": POP, "POP_MARK": POP_MARK, "DUP": DUP, "READONLY_BUFFER": PASS,
          "PUT": PUT, "BINPUT": PUT, "LONG_BINPUT": PUT, "MEMOIZE": PUT, "GET": GET, "BINGET": GET, "LONG_BINGET": GET}


def _plan(op) -> tuple:
    """(kind, name, stack items it takes below its mark or None, stack items it takes without one, items an entry
    takes, argument: (fixed size, format) or (negative pickletools length code, prefix format) or None)."""
    before, arg = op.stack_before, op.arg
    kind = _KINDS.get(op.name, MUTATE if op.name in MUTATORS else NEW if op.stack_after else NOTHING)
    below = before.index(pickletools.markobject) if pickletools.markobject in before else None
    spec = None if arg is None else (arg.n, _FIXED.get(arg.n) or _PREFIX.get(arg.n))
    return kind, op.name, below, len(before), ENTRIES.get(op.name, 0), spec


_PLANS = {op.code.encode("latin-1")[0]: _plan(op) for op in pickletools.opcodes}
class TooCostly(Exception):
    """What in a pickle is beyond the walk's limits (the message completes "refused to load: ...")."""


def _argument(data: bytes, pos: int, spec: tuple, name: str) -> tuple[int, int]:
    """(position after the argument at `pos`, its value for a memo index, else its bytes of text)."""
    n, fmt = spec
    if n > 0:
        if pos + n > len(data):
            raise ValueError(f"{name} runs past the end")
        return pos + n, struct.unpack_from(fmt, data, pos)[0]
    if n == pickletools.UP_TO_NEWLINE:
        end = pos
        for _ in range(2 if name in ("GLOBAL", "INST") else 1):
            end = data.find(b"\n", end, end + MAX_PICKLE_TEXT + 1) + 1
            if not end:
                raise TooCostly(f"a line longer than {MAX_PICKLE_TEXT:,} bytes (or one without its end)")
        return end, int(data[pos:end]) if name in ("PUT", "GET") else end - pos
    size = struct.calcsize(fmt)
    if pos + size > len(data):
        raise ValueError(f"{name} runs past the end")
    length = struct.unpack_from(fmt, data, pos)[0]
    if length < 0 or pos + size + length > len(data):
        raise ValueError(f"{name} claims {length:,} bytes past the end")
    return pos + size + length, length


class Cost:
    """What a pickle builds, counted as it is walked: objects created (each once, reachable or not), the largest
    object unfolded (each shared reference counted again: what hashing or traversing it visits), its nesting,
    and its dicts' and sets' entries squared (what inserting colliding keys costs)."""

    def __init__(self):
        self.size, self.depth, self.used = array("q"), array("B"), bytearray()  # per object
        self.stack, self.marks, self.memo = array("q"), array("q"), array("q")
        self.entries: dict[int, int] = {}
        self.hash_work = 0

    @property
    def objects(self) -> int:
        return len(self.size)

    def new(self, kids) -> int:
        """A new object holding `kids`; refused when it is one too many, too large unfolded or too deep."""
        node = len(self.size)
        if node >= MAX_PICKLE_NODES:
            raise TooCostly(f"it builds more than {MAX_PICKLE_NODES:,} objects")
        self.size.append(1)
        self.depth.append(1)
        self.used.append(0)
        self.fill(node, kids)
        return node

    def fill(self, node: int, kids) -> None:
        """`kids` go into `node`, which nothing holds yet (pickle writes an object whole before it is used: one
        changed once inside another would change what was counted, or contain itself)."""
        size, depth, used = self.size, self.depth, self.used
        total, deepest = size[node], depth[node]
        for kid in kids:
            used[kid] = 1
            total += size[kid]
            deepest = max(deepest, depth[kid] + 1)
        if used[node]:
            raise TooCostly("an object is changed after it was put inside another (or contains itself)")
        if total > MAX_PICKLE_NODES:
            raise TooCostly(f"its objects unfold into more than {MAX_PICKLE_NODES:,} (each shared reference "
                            "counted again)")
        if deepest > MAX_PICKLE_DEPTH:
            raise TooCostly(f"its objects are nested more than {MAX_PICKLE_DEPTH} deep")
        size[node], depth[node] = total, deepest

    def add_entries(self, node: int, count: int) -> None:
        before = self.entries.get(node, 0)
        self.entries[node] = after = before + count
        self.hash_work += after * after - before * before
        if self.hash_work > MAX_HASH_WORK:
            raise TooCostly(f"its dicts and sets hold too many entries ({after:,} in one; entries squared, summed "
                            f"over them all, may be at most {MAX_HASH_WORK:,})")


def pickle_cost(data: bytes) -> Cost:
    """The Cost of unpickling `data`, in one pass over its opcodes (the unpickler's stack, with objects as
    numbers); TooCostly as soon as a limit is passed, ValueError (or KeyError, IndexError) when it is no pickle."""
    cost, pos, text = Cost(), 0, MAX_PICKLE_TEXT
    stack, marks, memo, plans, end = cost.stack, cost.marks, cost.memo, _PLANS, len(data)
    for _ in range(MAX_PICKLE_OPS):
        if pos >= end:
            raise ValueError("no STOP")
        plan = plans.get(data[pos])
        if plan is None:
            raise ValueError(f"no pickle opcode at byte {pos}")
        kind, name, below, taken, per_entry, spec = plan
        pos += 1
        if spec is not None:
            pos, value = _argument(data, pos, spec, name)
            if spec[0] < 0 and kind != PUT and kind != GET:
                text -= value
                if text < 0:
                    raise TooCostly(f"it holds more than {MAX_PICKLE_TEXT:,} bytes of strings")
        fence = marks[-1] if marks else 0
        if kind == NEW and not taken and below is None:  # a literal (most opcodes): nothing to take
            stack.append(cost.new(()))
        elif kind == NOTHING:
            continue
        elif kind == MARK:
            marks.append(len(stack))
        elif kind == PUT:
            index = len(memo) if spec is None else value
            if len(stack) <= fence or not 0 <= index <= len(memo):  # pickle numbers its memo 0, 1, 2, ...
                raise ValueError(f"{name} {index} on an empty stack or beyond the memo's {len(memo)} entries")
            if index == len(memo):
                memo.append(stack[-1])
            else:
                memo[index] = stack[-1]
        elif kind == GET:
            stack.append(memo[value])
        elif kind == POP and marks and fence == len(stack):
            marks.pop()
        elif kind == STOP:
            if len(stack) <= fence:
                raise ValueError("STOP on an empty stack")
            return cost
        else:
            _apply(cost, kind, name, below, taken, per_entry, fence)
    raise TooCostly(f"it has more than {MAX_PICKLE_OPS:,} opcodes")


def _apply(cost: Cost, kind: int, name: str, below, taken: int, per_entry: int, fence: int) -> None:
    """An opcode that takes objects off the stack: build, fill, copy or drop them."""
    stack, marks = cost.stack, cost.marks
    if below is not None:
        start = marks.pop() - below
        if start < (marks[-1] if marks else 0):
            raise ValueError(f"{name} on a short stack")
    else:
        start = len(stack) - taken
        if start < fence:
            raise ValueError(f"{name} on a short stack")
    consumed = stack[start:]
    del stack[start:]
    if kind == NEW:
        node = cost.new(consumed)
        if per_entry:
            cost.add_entries(node, len(consumed) // per_entry)
        stack.append(node)
    elif kind == MUTATE:
        cost.fill(consumed[0], consumed[1:])
        if per_entry:
            cost.add_entries(consumed[0], (len(consumed) - 1) // per_entry)
        stack.append(consumed[0])
    elif kind == DUP:
        stack.extend(consumed * 2)
    elif kind == PASS:
        stack.extend(consumed)
