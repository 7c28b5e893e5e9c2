"""Building the Accelerator a run trains with: its FSDP2 settings, its collective timeout, and the checks that
the launched processes really formed one group (launch variables, the gloo interface).

FSDP2 settings come from the accelerate config (`accelerate launch` turns its `fsdp_config` into
ACCELERATE_USE_FSDP / FSDP_* variables); on top of them gradients are reduced in fp32 under mixed
precision (torchtitan's MixedPrecisionPolicy default): accelerate would reduce in the bf16 compute dtype.

Real FSDP2 on CPU, for tests: accelerate 1.15 picks FSDP only for GPU backends (state.py) and turns an
FSDP config on CPU into plain gloo DDP. With PICONEOX_CPU_FSDP=1 (`CPU_FSDP_ENV`) and an FSDP config,
`make_accelerator` switches the accelerator to FSDP2 (`shard_on_cpu`), so `accelerator.prepare()` runs
accelerate's own `fully_shard` wrapping (one unit per GPTNeoXLayer) over gloo, exactly as on GPUs, and the
run stays FSDP2 after it (utils/sharding.py checks; on several machines it is HSDP there too):

    PICONEOX_CPU_FSDP=1 ./start_training.sh --config test --gpus 0 --procs 2 \
        --accelerate-config configs/accelerate/fsdp_production.yaml --data DIR
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta

from utils.distributed import check_timeout
from utils.errors import PiconeoxError

CPU_FSDP_ENV = "PICONEOX_CPU_FSDP"


def fsdp_requested() -> bool:
    """Whether the launch asked for FSDP (an accelerate config with `distributed_type: FSDP`)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def fsdp_plugin(mixed_precision: str):
    """The FSDP plugin from the launch's FSDP_* variables, reducing gradients in fp32; None without FSDP."""
    if not fsdp_requested():
        return None
    import torch
    from accelerate import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin = FullyShardedDataParallelPlugin()
    if mixed_precision != "no":
        compute = {"bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
        # Set before the Accelerator sees it, which then keeps it (set_mixed_precision only fills a None policy).
        plugin.mixed_precision_policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32,
                                                             output_dtype=compute)
    return plugin


def make_accelerator(mixed_precision: str, cuda: bool, timeout_minutes: float,
                     rendezvous_seconds: float = 900.0):
    """The Accelerator, after checking that the launched processes really formed one group.

    `timeout_minutes` bounds every collective wait (default group timeout is 10 min with NCCL); `rendezvous_seconds`
    the wait for the group's other processes, which a stop signal also ends (utils/run/rendezvous.py).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    from utils.run.launch_env import check_launch_env, group_address
    from utils.run.network import check_gloo_ifname
    from utils.run.rendezvous import PeerWait
    from utils.sharding import use_hsdp

    check_timeout(timeout_minutes)
    notice = check_launch_env(timeout=rendezvous_seconds)  # said once a stop signal can end the wait
    check_gloo_ifname(os.environ.get("GLOO_SOCKET_IFNAME"))
    if mixed_precision == "fp16" and not cuda:
        raise PiconeoxError("--mixed-precision fp16 needs a CUDA GPU; on CPU use bf16 or no")
    plugin = fsdp_plugin(mixed_precision)
    with PeerWait(group_address(), rendezvous_seconds, announce=notice or ""):
        accelerator = Accelerator(mixed_precision=mixed_precision, cpu=not cuda, fsdp_plugin=plugin,
                                  kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(minutes=timeout_minutes))])
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:  # e.g. an FSDP config on a box without CUDA: each rank alone
        raise PiconeoxError(f"{launched} processes were launched but they formed a group of "
                            f"{accelerator.num_processes}; without GPUs use ./start_training.sh --gpus 0 --procs N "
                            "(FSDP and multi-GPU configs need CUDA)")
    if plugin is not None and accelerator.distributed_type == DistributedType.MULTI_CPU:
        if os.environ.get(CPU_FSDP_ENV) == "1":
            shard_on_cpu(accelerator, plugin)
        else:
            print("warning: FSDP needs CUDA; this run uses plain data parallelism on the CPU "
                  f"({CPU_FSDP_ENV}=1 shards over gloo, for tests)", file=sys.stderr)
    use_hsdp(accelerator)
    return accelerator


def shard_on_cpu(accelerator, plugin) -> None:
    """Make a gloo (MULTI_CPU) accelerator prepare models with FSDP2 instead of DDP.

    accelerate keeps its state in shared class dictionaries: setting the distributed type and the plugin
    there is all its FSDP2 path (`fsdp2_prepare_model`, DTensor-aware clipping, state dicts) looks at. The type
    goes into PartialState's dictionary too, as AcceleratorState does on GPUs: every `AcceleratorState()` (the
    prepared optimizer makes one) copies PartialState's type over its own, which was MULTI_CPU again.
    """
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if plugin.fsdp_version != 2:
        raise PiconeoxError(f"{CPU_FSDP_ENV}=1 needs fsdp_version: 2 in the accelerate config "
                            f"(got {plugin.fsdp_version})")
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)  # what AcceleratorState does for GPU FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
