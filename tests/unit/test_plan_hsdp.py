"""configs/plan.py under HSDP: FSDP2 shards over one machine's GPUs, not over all of them."""
import pytest

from configs.plan import format_plan, needs_activation_checkpointing, plan
from configs.presets import resolve_config
from utils.errors import PiconeoxError

GIB = 1024**3


@pytest.fixture(scope="module")
def plans():
    cfg = resolve_config("production")
    return plan(cfg, gpus=16, machines=2), plan(cfg, gpus=8), plan(cfg, gpus=16)


def test_two_machines_of_eight_hold_what_one_machine_of_eight_holds(plans):
    """1.2B on 2 x 8: each GPU keeps 1/8 of weights, gradients and AdamW states (was 1/16: 1.3 GiB too low)."""
    hsdp, one_machine, sixteen = plans
    assert hsdp.shard_gpus == 8 and sixteen.shard_gpus == 16
    for part in ("weights", "grads", "optimizer"):
        assert getattr(hsdp.fsdp, part) == getattr(one_machine.fsdp, part)
    assert 1.2 * GIB < hsdp.fsdp.total - sixteen.fsdp.total < 1.4 * GIB


def test_the_shard_group_decides_activation_checkpointing(plans):
    """A card where the 1/16 estimate fits and the true 1/8 one does not: `auto` must turn checkpointing on."""
    hsdp, _, sixteen = plans
    device = int((hsdp.fsdp.total + sixteen.fsdp.total) / 2 / 0.9)
    assert needs_activation_checkpointing(hsdp, sharded=True, device_bytes=device)
    assert not needs_activation_checkpointing(sixteen, sharded=True, device_bytes=device)


def test_the_table_labels_the_hsdp_column_and_says_what_shards(plans):
    table = format_plan(plans[0])
    assert "DDP       HSDP" in table and "each machine's 8 GPUs shard the state, 2 machines hold replicas" in table
    assert "HSDP" not in format_plan(plans[2])


def test_machines_that_do_not_divide_the_gpus_are_one_error_line():
    with pytest.raises(PiconeoxError, match=r"^--machines 3: must be a whole number >= 1 that divides --gpus 16$"):
        plan(resolve_config("production"), gpus=16, machines=3)
