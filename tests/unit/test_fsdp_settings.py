"""utils/run/accelerator.py: the FSDP2 plugin that train.py hands to accelerate."""
import pytest
import torch

from utils.distributed import check_timeout
from utils.run.accelerator import fsdp_plugin
from utils.errors import PiconeoxError


@pytest.fixture
def fsdp_launch(monkeypatch):
    """The variables `accelerate launch` sets for configs/accelerate/fsdp_production.yaml."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", "configs/accelerate/fsdp_production.yaml",
                                               "--num_processes", "2", "--mixed_precision", "bf16", "x.py"])
    args, _, _ = _validate_launch_command(args)
    for key, value in prepare_multi_gpu_env(args).items():
        if key.startswith(("FSDP_", "ACCELERATE_USE_FSDP")):
            monkeypatch.setenv(key, value)


def test_gradients_are_reduced_in_fp32_under_bf16(fsdp_launch):
    """accelerate alone would reduce gradients in the bf16 compute dtype (reduce_dtype = param_dtype)."""
    plugin = fsdp_plugin("bf16")
    plugin.set_mixed_precision("bf16")  # what AcceleratorState does with the plugin on GPUs
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert plugin.fsdp_version == 2 and plugin.transformer_cls_names_to_wrap == ["GPTNeoXLayer"]
    assert fsdp_plugin("no").mixed_precision_policy is None  # fp32 everywhere already


def test_no_fsdp_plugin_without_an_fsdp_launch(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert fsdp_plugin("bf16") is None


def test_collective_timeout_must_be_positive():
    with pytest.raises(PiconeoxError, match="--collective-timeout-minutes 0: must be a positive number of minutes"):
        check_timeout(0.0)
