"""HSDP's own process groups (issue 42, item 6): FSDP2's shard and replicate groups, made by DeviceMesh with the
backend's default timeout, get --step-timeout-minutes after the first step like every other group of the run."""
from tests.support.ranks import machines


def test_the_shard_and_replicate_groups_of_hsdp_get_the_step_timeout(tmp_path, tiny_data):
    """2 machines x 2 processes; the timeouts line reads each group's timeout back from its backend (the groups
    found in each layer's FSDP state, `_fsdp_param_group.mesh_info`): 3 min, not gloo's default 30 (the savers keep
    --collective-timeout-minutes: a save may take long)."""
    machines(tmp_path, tiny_data, 2, "--step-timeout-minutes", "3", "--max-steps", "3", "--save-every", "100",
             "--eval-every", "100")
    log = (tmp_path / "machine0" / "logs" / "run" / "training.log").read_text()
    assert ("collective timeout 3 min from step 2 on (FSDP2 shard group 3 min, FSDP2 replicate group 3 min, stop vote "
            "3 min, checkpoint savers 60 min)") in log, log[-3000:]
