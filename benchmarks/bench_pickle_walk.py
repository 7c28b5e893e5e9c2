"""How the bounded pickle walk's time grows with its input: each hostile shape at n and 2n,
walked in this process; a ratio near 2 is linear, near 4 quadratic.

    .venv/bin/python benchmarks/bench_pickle_walk.py [--size BYTES]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.hostile_pickles import (colliding_dict, long_walk, mark_tuple_pairs,  # noqa: E402
                                           objects_left_on_the_stack)
from utils.ckpt.untrusted.pickle_walk import TooCostly, pickle_cost  # noqa: E402

SHAPES = {"EMPTY_TUPLE then MARK TUPLE pairs": mark_tuple_pairs,
          "MARK POP_MARK pairs": lambda size: long_walk(size // 2),
          "Nones left on the stack": objects_left_on_the_stack,
          "a dict of int keys hashing to 0": lambda size: colliding_dict(size // 13)}


def walk_seconds(data: bytes) -> float:
    start = time.perf_counter()
    try:
        pickle_cost(data)
    except TooCostly:
        pass
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1 << 20, help="bytes of the smaller input (default 1 MiB)")
    size = p.parse_args().size
    print(f"{'shape':40} {'n s':>8} {'2n s':>8} {'ratio':>6}")
    for name, make in SHAPES.items():
        one, two = walk_seconds(make(size)), walk_seconds(make(2 * size))
        print(f"{name:40} {one:8.3f} {two:8.3f} {two / one:6.2f}")


if __name__ == "__main__":
    main()
