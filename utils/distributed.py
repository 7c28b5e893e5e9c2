"""Every process group of a run (the Accelerator's, with its FSDP2 settings and collective timeout, and the
checkpoint savers' gloo group) and the "rank 0 decides, everyone learns" helpers.

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
from typing import Callable, TypeVar

from utils.errors import PiconeoxError

CPU_FSDP_ENV = "PICONEOX_CPU_FSDP"
T = TypeVar("T")


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


def make_accelerator(mixed_precision: str, cuda: bool, timeout_minutes: float):
    """The Accelerator, after checking that the launched processes really formed one group.

    `timeout_minutes` bounds every collective wait (default group timeout is 10 min with NCCL).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    from utils.run.launch_env import check_launch_env
    from utils.run.network import check_gloo_ifname
    from utils.sharding import use_hsdp

    check_timeout(timeout_minutes)
    if notice := check_launch_env():
        print(notice, file=sys.stderr, flush=True)
    check_gloo_ifname(os.environ.get("GLOO_SOCKET_IFNAME"))
    if mixed_precision == "fp16" and not cuda:
        raise PiconeoxError("--mixed-precision fp16 needs a CUDA GPU; on CPU use bf16 or no")
    plugin = fsdp_plugin(mixed_precision)
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


def group_timeout(accelerator, group=None, on_device: bool = False) -> timedelta | None:
    """A process group's collective timeout as its backend holds it (default: the run's group on the run's
    device; a gloo side group on the CPU, a mesh group `on_device`); None without a group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if group is None:
        return dist.group.WORLD._get_backend(accelerator.device).options._timeout
    return group._get_backend(accelerator.device if on_device else torch.device("cpu")).options._timeout


def mesh_groups(model) -> dict[str, object]:
    """FSDP2's own process groups of a prepared model, made by its DeviceMesh: {"shard": ..., "replicate": ...}
    (replicate under HSDP only); {} under DDP. They carry the step's all-gathers and reduce-scatters."""
    groups = {}
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        params = state and state._fsdp_param_group
        for name in ("shard", "replicate") if params else ():
            if (group := getattr(params.mesh_info, f"{name}_process_group", None)) is not None:
                groups.setdefault(name, group)
    return groups


def shorten_timeout(minutes: float, groups=()) -> None:
    """After the first step: the run's collectives fail within `minutes` on a hang, instead of the start-up timeout
    that had to cover a resume download and the compile; the default group and `groups` (FSDP2's mesh groups, which
    DeviceMesh made with the backend's default), after a barrier so that no collective is in flight (torchtitan)."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        nccl = dist.get_backend() == "nccl"
        dist.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)
        for group in (None, *groups):
            dist.distributed_c10d._set_pg_timeout(timedelta(minutes=minutes), group)


def timeouts_line(accelerator, vote_group, saver_group, from_step: int, mesh: dict | None = None) -> str:
    """The log line saying every group's collective timeout once the run's has been shortened."""
    minutes = [group_timeout(accelerator, g).total_seconds() / 60 for g in (None, vote_group, saver_group)]
    own = "".join(f"FSDP2 {name} group {group_timeout(accelerator, g, on_device=True).total_seconds() / 60:g} min, "
                  for name, g in (mesh or {}).items())
    return (f"collective timeout {minutes[0]:g} min from step {from_step} on ({own}stop vote {minutes[1]:g} min, "
            f"checkpoint savers {minutes[2]:g} min)")


TIMEOUT_MINUTES = (0.5, 7 * 24 * 60)  # shorter fails healthy steps and saves; longer overflows timedelta/c10d


def check_timeout(minutes: float, flag: str = "--collective-timeout-minutes", default: float = 60) -> None:
    """A timeout flag must be a number of minutes from 0.5 (a step, a save's collective) to a week."""
    import math

    low, high = TIMEOUT_MINUTES
    if not (math.isfinite(minutes) and low <= minutes <= high):
        raise PiconeoxError(f"{flag} {minutes:g}: must be a positive number of minutes from {low:g} to {high:g} "
                            f"(a week; default {default:g})")


def cpu_group(timeout: timedelta | None = None):
    """A gloo group of every rank for side traffic on the CPU (None when not distributed): its collectives never
    interleave with the training's, nor wait for the GPU stream."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


def _world(group=None) -> int:
    """Processes in `group` (the default group when None); 1 without torch.distributed."""
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def broadcast_object(obj: T, group=None) -> T:
    """Rank 0's `obj` on every rank of `group` (picklable; returned as is in a single process)."""
    if _world(group) == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def gather_object(obj, group=None) -> list | None:
    """Every rank's `obj` in rank order, on rank 0; None elsewhere."""
    if _world(group) == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * dist.get_world_size(group) if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out


def all_gather_object(obj, group=None) -> list:
    """Every rank's `obj` in rank order, on every rank."""
    if _world(group) == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def rank0_decides(decide: Callable[[], T], is_main: bool) -> T:
    """`decide()` runs on rank 0 only and every rank learns its result, or the same PiconeoxError line.

    No rank waits in a collective while another does long work: only the decision travels.
    """
    result, error = None, None
    if is_main:
        try:
            result = decide()
        except PiconeoxError as e:
            error = str(e)
    result, error = broadcast_object((result, error))
    if error:
        raise PiconeoxError(error if is_main else f"rank 0: {error}")
    return result


def weights_come_from_rank0(accelerator) -> bool:
    """FSDP2 with cpu_ram_efficient_loading: prepare() shards rank 0's weights to every rank, so the others
    build shapes only (the host holds one fp32 model, not one per rank)."""
    plugin = accelerator.state.fsdp_plugin if accelerator.is_fsdp2 else None
    return bool(plugin and plugin.cpu_ram_efficient_loading and not accelerator.is_main_process)


def compile_layers(model, backend: str | object = "inductor") -> None:
    """Compile each GPT-NeoX decoder layer in place (torchtitan's regional compile), for DDP.

    Compiled whole, a DDP model's graph is split at every 25 MiB gradient bucket (70-200 subgraphs at 1.2B, each
    compiled on every (re)start of every rank). One layer is one graph that every layer reuses, and DDP's hooks
    overlap the all-reduce with it as in eager mode: a layer's gradients are ready together at the end of its
    backward, while the next layer's backward runs. Dynamo's DDP optimizer would still split each layer at the
    buckets (a 1.2B layer is 200 MB: 8 graphs), so it is off. In place: the module tree and its saved keys stay
    as they are (no `_orig_mod.`).
    """
    import torch._dynamo

    torch._dynamo.config.optimize_ddp = False
    for layer in model.gpt_neox.layers:
        layer.compile(backend=backend)
