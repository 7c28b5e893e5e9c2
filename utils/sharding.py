"""How FSDP2 lays the model over the ranks: full shard on one machine, HSDP on several (shard inside a machine,
replicate across machines), parameters kept gathered across the no-sync micro-steps of a step, and the check
that accelerate still runs its FSDP2 path after `prepare()`.

Traffic per optimizer step (N parameters, A micro-steps; bf16 all-gathers, fp32 gradient reductions): full shard
with every layer resharded after its backward all-gathers the weights A times (A x 2N bytes) and reduce-scatters
once (4N); kept gathered across the no-sync micro-steps it all-gathers once. Across machines that is the difference
between 1.5x and 0.75x DDP's all-reduce at A = 4; HSDP moves only the fp32 all-reduce of the gradient shards
between machines (DDP's 4N in total) and keeps every all-gather on the machine (docs/gpus.md "Several machines").
"""
from __future__ import annotations

import contextlib
import os

from utils.errors import PiconeoxError


def hsdp_shape(world: int, local_world: int) -> tuple[int, int] | None:
    """(replicas, shards) when FSDP2 runs on several machines with several processes each, else None (full shard).

    One process per machine has nothing to shard inside a machine: full shard over the machines then.
    """
    machines = world // max(local_world, 1)
    if machines > 1 and local_world > 1 and machines * local_world == world:
        return machines, local_world
    return None


def use_hsdp(accelerator) -> None:
    """Give an FSDP2 accelerator a (replicas x shards) device mesh when the launch spans several machines.

    torchrun numbers ranks machine by machine, so each row of the mesh is one machine. What `Accelerator(
    parallelism_config=...)` does in its constructor, done after the CPU harness has switched the state to FSDP2
    (accelerate refuses a mesh for MULTI_CPU): one path for GPUs and the CPU tests.
    """
    from accelerate import ParallelismConfig

    shape = hsdp_shape(accelerator.num_processes, int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes)))
    if shape is None or not accelerator.is_fsdp2:
        return
    config = ParallelismConfig(dp_replicate_size=shape[0], dp_shard_size=shape[1])
    accelerator.state.parallelism_config = config
    accelerator.state.device_mesh = config.get_device_mesh(accelerator.device.type)
    config._validate_accelerator(accelerator)


def describe(accelerator) -> str:
    """How the model is spread over the processes, for the start-up log line."""
    if accelerator.is_fsdp2:
        config = accelerator.parallelism_config
        if config is not None and config.dp_replicate_enabled:
            return (f"FSDP2 HSDP mesh: {config.dp_replicate_size} replicas (machines) x {config.dp_shard_size} "
                    "shards (processes per machine)")
        return f"FSDP2 fully_shard over {accelerator.num_processes} process(es)"
    if accelerator.num_processes > 1:
        return "DDP"
    return "single process"


def check_prepared(accelerator, model, sharded: bool) -> int:
    """After `prepare()` (and after a compile): a run that was set up for FSDP2 still is (accelerate re-reads its
    state when it wraps the optimizer; a silent fall back to MULTI_CPU skips every FSDP2 branch: no_sync, clipping,
    state dicts), and every decoder layer is an FSDP2 unit of its own (else one unit gathers the whole model at
    once). Returns the number of decoder layers that are FSDP2 units (0 when not `sharded`)."""
    from torch.distributed.tensor import DTensor

    if not sharded:
        return 0
    weights_sharded = all(isinstance(p, DTensor) for p in model.parameters())
    if not (accelerator.is_fsdp2 and weights_sharded):
        raise PiconeoxError(f"FSDP2 was set up but after prepare() accelerate runs {accelerator.distributed_type} "
                            f"(parameters sharded: {weights_sharded}); this accelerate version is not supported")
    layers = model.gpt_neox.layers  # through a compiled wrapper too: it forwards attributes to the model
    loose = [i for i, layer in enumerate(layers) if not hasattr(layer, "_get_fsdp_state")
             or layer._get_fsdp_state()._fsdp_param_group is None]
    if loose:
        raise PiconeoxError(f"FSDP2: decoder layer(s) {', '.join(map(str, loose))} of {len(layers)} are not "
                            "fully_shard units after prepare(); the accelerate config's fsdp_transformer_layer_cls_"
                            "to_wrap must name GPTNeoXLayer")
    return len(layers)


@contextlib.contextmanager
def micro_step(accelerator, model, last: bool):
    """One micro-step of an optimizer step: gradients sync only on the `last` one.

    Under FSDP2 the parameters also stay gathered from one micro-step to the next (no all-gather per micro-step;
    the gathered bf16 weights are in memory anyway at the end of each forward, since every layer keeps them from
    its forward to its backward), and are resharded after the last backward.
    """
    if last:
        if accelerator.is_fsdp2:
            model.set_reshard_after_backward(True)
        yield
        return
    if accelerator.is_fsdp2:
        model.set_reshard_after_backward(False)
    with accelerator.no_sync(model):
        yield
