"""Every process group of a run (the Accelerator's collective timeout, the checkpoint savers' gloo group, FSDP2's
mesh groups) and the "rank 0 decides, everyone learns" helpers. Building the Accelerator itself is a run's setup:
utils/run/accelerator.py.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable, TypeVar

from utils.errors import PiconeoxError

T = TypeVar("T")


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
