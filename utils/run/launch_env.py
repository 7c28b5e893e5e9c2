"""The process-group variables a training process inherits, checked before any group forms.

torchrun (and so `accelerate launch`, start_training.sh) sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
TORCHELASTIC_RUN_ID for each process it starts. The same variables left exported in a shell (a copied torchrun
recipe, an earlier job's environment) turn a plain `python train.py` into one rank of a group nobody started: it
waits for the others until the collective timeout (an hour), saying nothing. So: without a launcher, an incomplete
set is refused in one line, and a complete one (a group started by hand, as the tests do) is announced.
"""
from __future__ import annotations

import os
from typing import Mapping

from utils.errors import PiconeoxError

GROUP_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def group_address(env: Mapping[str, str] = os.environ) -> str:
    """Who a process waits for while its group forms, for the lines that say so."""
    rank, world = env.get("RANK", "0"), env.get("WORLD_SIZE", "1")
    where = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    return f"the other {int(world) - 1 if world.isdigit() else '?'} process(es) of the group at {where} (this is " \
        f"rank {rank} of {world})"


def check_launch_env(env: Mapping[str, str] = os.environ, timeout: float = 900.0) -> str | None:
    """None for a single process or a launcher's process; the line announcing a group formed by hand from the
    environment; PiconeoxError for a set of variables that forms no group (leftovers). accelerate starts a group
    when WORLD_SIZE > 1 or LOCAL_RANK is set."""
    world, rank, local = env.get("WORLD_SIZE", ""), env.get("RANK", ""), env.get("LOCAL_RANK", "-1")
    if "TORCHELASTIC_RUN_ID" in env or (world in ("", "1") and local == "-1"):
        return None  # started by torchrun / accelerate launch, or no group asked for
    shown = " ".join(f"{k}={env[k]}" for k in GROUP_VARS if k in env)
    unset = f"unset {' '.join(k for k in GROUP_VARS if k in env)} to train in one process"
    if not world.isdigit() or not rank.isdigit() or not int(rank) < int(world):
        raise PiconeoxError(f"{shown} in the environment forms no process group (WORLD_SIZE processes, RANK "
                            f"0..WORLD_SIZE-1) and no launcher started this process: {unset}, or start several "
                            "processes with ./start_training.sh")
    if missing := [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]:
        raise PiconeoxError(f"{shown} in the environment but no {' or '.join(missing)}, and no launcher started this "
                            f"process (leftovers of an earlier torchrun?): {unset}, or start several processes with "
                            "./start_training.sh")
    port = env["MASTER_PORT"]
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise PiconeoxError(f"MASTER_PORT={port!r} in the environment is no TCP port (1..65535): set the port rank 0 "
                            f"listens on, or {unset}")
    if int(world) == 1:
        return None
    return (f"train.py: process group from the environment, no launcher ({shown}): rank {rank} of {world} waits for "
            f"the others at {env['MASTER_ADDR']}:{env['MASTER_PORT']} (at most {timeout:g} s: "
            f"--rendezvous-timeout-seconds; Ctrl-C stops waiting); {unset}")
