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


def check_launch_env(env: Mapping[str, str] = os.environ) -> str | None:
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
    if int(world) == 1:
        return None
    return (f"train.py: process group from the environment, no launcher ({shown}): rank {rank} of {world} waits for "
            f"the others at {env['MASTER_ADDR']}:{env['MASTER_PORT']}; {unset}")
