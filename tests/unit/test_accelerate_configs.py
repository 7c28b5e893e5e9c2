"""configs/accelerate/*.yaml load with accelerate's own parser and launch validation, and the FSDP file
builds a plugin that wraps the GPTNeoXLayer our models really contain."""
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType

from tests.support.paths import REPO

CONFIGS = REPO / "configs" / "accelerate"
EXPECTED = {
    "single_gpu.yaml": (DistributedType.NO, 1, 1),
    "multi_gpu_ddp.yaml": (DistributedType.MULTI_GPU, 8, 1),
    "fsdp_production.yaml": (DistributedType.FSDP, 8, 1),
    "multi_node_template.yaml": (DistributedType.MULTI_GPU, 16, 2),
}


def validated(path: Path):
    """The arguments `accelerate launch --config_file path train.py` ends up with."""
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    return _validate_launch_command(args)[0]


def test_every_file_is_known():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_loads_with_accelerates_parser_and_is_commented(name):
    path = CONFIGS / name
    kind, processes, machines = EXPECTED[name]
    cfg = load_config_from_file(str(path))
    assert (cfg.distributed_type, cfg.num_processes, cfg.num_machines) == (kind, processes, machines)
    assert cfg.dynamo_config == {}  # train.py compiles after prepare(); accelerate must not
    assert path.read_text().startswith("# ")
    args = validated(path)
    assert args.num_processes == processes and args.dynamo_backend.upper() == "NO"


def test_multi_node_template_names_its_rendezvous():
    args = validated(CONFIGS / "multi_node_template.yaml")
    assert args.multi_gpu and args.num_machines == 2
    assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (0, "10.0.0.1", 29500)


def test_fsdp_production_is_fsdp2_full_shard_bf16_sharded_state_wrapping_gptneox_layers(monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import StateDictType

    args = validated(CONFIGS / "fsdp_production.yaml")
    assert args.use_fsdp and args.mixed_precision == "bf16"
    for key, value in prepare_multi_gpu_env(args).items():  # the env accelerate hands to every rank
        if key.startswith("FSDP_"):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is False  # one all-gather per layer and micro-step, not two
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.transformer_cls_names_to_wrap == ["GPTNeoXLayer"]

    import torch
    from accelerate.utils.dataclasses import get_module_class_from_name

    from configs.model import TEST, build_model

    with torch.device("meta"):
        model = build_model(TEST.with_vocab(256))
    layer_cls = get_module_class_from_name(model, "GPTNeoXLayer")
    assert layer_cls is not None and sum(isinstance(m, layer_cls) for m in model.modules()) == TEST.num_layers
