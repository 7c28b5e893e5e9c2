"""start_training.sh: the accelerate line it builds (checked with accelerate's own parser) and bad input. Real
launches through accelerate with a stand-in train.py are in test_launcher_launches.py."""
import os
import shlex
import subprocess

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO

LAUNCHER = REPO / "start_training.sh"


def dry_run(*args: str, fake_gpus: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PICONEOX_FAKE_GPUS")}
    if fake_gpus is not None:
        env["PICONEOX_FAKE_GPUS"] = str(fake_gpus)
    return subprocess.run(["bash", str(LAUNCHER), "--dry-run", *args], capture_output=True, text=True, env=env,
                          timeout=bound(60))


def parse_line(line: str):
    """Split the printed line into env assignments, accelerate's args (parsed by accelerate) and train.py's args."""
    words = shlex.split(line)
    envs = {}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        envs[key] = value
    assert words[1].endswith("utils/launch.py"), line
    script = next(i for i, w in enumerate(words) if w.endswith("train.py"))
    from accelerate.commands.launch import launch_command_parser

    launch = launch_command_parser().parse_args(words[2:script + 1])
    return envs, launch, words[script + 1:]


def launched(*args: str, fake_gpus: int | None = None):
    result = dry_run(*args, fake_gpus=fake_gpus)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    return parse_line(lines[0])


def test_gpus_0_is_one_cpu_process_with_all_cores():
    envs, launch, train = launched("--config", "test", "--gpus", "0")
    assert launch.cpu and not launch.multi_gpu and launch.config_file is None  # --cpu never reads a default file
    assert (launch.num_processes, launch.num_machines) == (1, 1)
    assert (launch.mixed_precision, launch.dynamo_backend) == ("no", "no")
    assert envs == {"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}  # all cores, as nproc counts them
    assert train == ["--config", "test"]


def test_procs_2_uses_the_gloo_recipe_not_cpu_flag():
    # `--cpu --num_processes 2` silently starts one process (STACK_NOTES.md)
    envs, launch, _ = launched("--config", "test", "--gpus", "0", "--procs", "2")
    assert launch.multi_gpu and not launch.cpu and launch.num_processes == 2
    assert launch.main_process_port == 0  # accelerate picks a free port: concurrent runs do not collide
    assert launch.config_file.endswith("configs/accelerate/multi_gpu_ddp.yaml")
    assert envs["ACCELERATE_USE_CPU"] == "true"
    assert envs["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "120"  # room for train.py's save on a signal
    assert envs["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))


def test_one_cpu_process_with_cpu_fsdp_gets_a_process_group_as_one_gpu_would(monkeypatch):
    # FSDP2 needs a group even of one: `--cpu` would start a plain process (gpu_check's CPU mode relies on this)
    monkeypatch.setenv("PICONEOX_CPU_FSDP", "1")
    config = str(REPO / "configs/accelerate/fsdp_production.yaml")
    envs, launch, _ = launched("--config", "test", "--gpus", "0", "--accelerate-config", config)
    assert not launch.cpu and launch.num_processes == 1 and launch.config_file == config
    assert envs["ACCELERATE_USE_CPU"] == "true" and launch.main_process_port == 0
    monkeypatch.delenv("PICONEOX_CPU_FSDP")
    assert launched("--config", "test", "--gpus", "0", "--accelerate-config", config)[1].cpu


def test_gpus_asked_with_no_gpu_visible_is_an_error_not_a_cpu_run():
    result = dry_run("--config", "test", "--gpus", "8", fake_gpus=0)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --gpus 8 asked but no CUDA GPU is visible")
    assert result.stderr.rstrip().endswith("use --gpus 0 to train on the CPU")


def test_gpus_asked_but_torch_sees_none_is_an_error(tmp_path):
    """nvidia-smi lists GPUs but this torch (the CPU build here) sees none: an error, not a silent CPU run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi = bin_dir / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n"
                        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n")
    fake_smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PICONEOX_FAKE_GPUS"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = subprocess.run(["bash", str(LAUNCHER), "--dry-run", "--config", "small", "--gpus", "2"],
                            capture_output=True, text=True, env=env, timeout=bound(120))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("error: --gpus 2 asked but nvidia-smi lists 2 GPU(s) but torch sees none: install the "
                             "CUDA build of torch (README: GPU machines); use --gpus 0 to train on the CPU\n")
    default = subprocess.run(["bash", str(LAUNCHER), "--dry-run", "--config", "small"], capture_output=True, text=True,
                             env=env, timeout=bound(120))
    assert default.returncode == 0 and parse_line(default.stdout.strip())[1].cpu  # no --gpus: what torch sees


def test_gpus_1_is_a_single_gpu_process():
    envs, launch, _ = launched("--config", "small", "--gpus", "1", fake_gpus=8)
    assert not launch.cpu and not launch.multi_gpu and launch.num_processes == 1
    assert launch.config_file.endswith("configs/accelerate/single_gpu.yaml")
    # no CPU settings and no torchrun in a single process; an allocator that grows blocks instead of fragmenting
    assert envs == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_gpus_8_is_ddp_with_mixed_precision_on_both_sides():
    _, launch, train = launched("--config", "small", "--gpus", "8", "--mixed-precision", "bf16", fake_gpus=8)
    assert launch.multi_gpu and launch.num_processes == 8 and launch.num_machines == 1
    assert launch.main_process_port == 0 and launch.config_file.endswith("configs/accelerate/multi_gpu_ddp.yaml")
    assert launch.mixed_precision == "bf16"
    assert train == ["--config", "small", "--mixed-precision", "bf16"]


def test_production_on_several_gpus_defaults_to_fsdp2():
    """1.2B under DDP: 44.5 GiB per GPU and a 5.7 GB model build per GPU in host memory; FSDP2 28.7 GiB, one build."""
    _, launch, _ = launched("--config", "production", "--gpus", "8", fake_gpus=8)
    assert launch.config_file.endswith("configs/accelerate/fsdp_production.yaml") and not launch.multi_gpu
    _, launch, _ = launched("--config", "production", "--gpus", "1", fake_gpus=8)
    assert launch.config_file.endswith("configs/accelerate/single_gpu.yaml")


def test_the_default_sharding_follows_the_model_size_not_the_preset_name():
    """configs/plan.py SHARD_FROM_PARAMETERS: production cut to 4 layers (0.4B) runs DDP, `small` grown to 1.1B
    FSDP2."""
    _, launch, _ = launched("--config", "production", "--gpus", "8", "--", "--set", "model.num_layers=4", fake_gpus=8)
    assert launch.config_file.endswith("configs/accelerate/multi_gpu_ddp.yaml") and launch.multi_gpu
    big = ["--set", "model.hidden_size=4096", "--set", "model.num_heads=32", "--set", "model.intermediate_size=16384",
           "--set", "model.num_layers=5"]
    _, launch, _ = launched("--config", "small", "--gpus", "8", "--", *big, fake_gpus=8)
    assert launch.config_file.endswith("configs/accelerate/fsdp_production.yaml")


def test_train_flags_map_in_order_and_extras_pass_verbatim():
    _, _, train = launched("--config", "test", "--gpus", "0", "--resume", "auto", "--max-steps", "5",
                           "--data", "gs://b/data/x", "--credentials", "k.json", "--no-background-upload", "--",
                           "--compile", "off", "--sample-prompt=a b")
    assert train == ["--config", "test", "--resume", "auto", "--max-steps", "5", "--data", "gs://b/data/x",
                     "--credentials", "k.json", "--no-background-upload", "--compile", "off", "--sample-prompt=a b"]


def test_multi_node_flags_pass_through_and_count_all_processes():
    _, launch, _ = launched("--config", "production", "--gpus", "8", "--num-machines", "2", "--machine-rank", "1",
                            "--main-process-ip", "10.1.2.3", "--main-process-port", "1234", fake_gpus=8)
    assert launch.num_processes == 16 and launch.num_machines == 2
    assert (launch.machine_rank, launch.main_process_ip, launch.main_process_port) == (1, "10.1.2.3", 1234)


def test_multi_node_gloo_binds_to_the_interface_that_reaches_rank_0(monkeypatch):
    """Without GLOO_SOCKET_IFNAME gloo binds to the hostname's address (often 127.0.1.1): unreachable from elsewhere.
    Machine 0 binds to the interface holding --main-process-ip; `lo` is never chosen for several machines."""
    from utils.run.network import interface_addresses

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    multi = ("--config", "production", "--gpus", "8", "--num-machines", "2", "--main-process-ip")
    for name, addr in interface_addresses().items():
        envs, _, _ = launched(*multi, addr, "--machine-rank", "0", fake_gpus=8)
        assert envs.get("GLOO_SOCKET_IFNAME") == (None if name == "lo" else name), (name, addr)
    envs, _, _ = launched(*multi, "127.0.0.1", "--machine-rank", "1", fake_gpus=8)
    assert "GLOO_SOCKET_IFNAME" not in envs  # every machine on this host (a test): gloo's default reaches them
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice stays (inherited, not overridden)
    envs, _, _ = launched(*multi, "localhost", "--machine-rank", "0", fake_gpus=8)
    assert "GLOO_SOCKET_IFNAME" not in envs
    envs, _, _ = launched("--config", "production", "--gpus", "8", fake_gpus=8)
    assert "GLOO_SOCKET_IFNAME" not in envs  # one machine: gloo stays on its default


def test_a_main_process_name_that_resolves_to_loopback_here_is_refused(monkeypatch):
    """Machine 0's own name often maps to 127.0.1.1 in /etc/hosts: its gloo ranks would advertise loopback and the
    other machines' first gloo group would wait an hour. One line, before anything starts."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    result = dry_run("--config", "production", "--gpus", "8", "--num-machines", "2", "--machine-rank", "0",
                     "--main-process-ip", "localhost", fake_gpus=8)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "error: --main-process-ip localhost resolves to 127.0.0.1 (loopback) on this machine"), result.stderr


def test_accelerate_config_file_decides_the_distributed_type():
    from accelerate.commands.launch import _validate_launch_command

    cfg = "configs/accelerate/fsdp_production.yaml"
    _, launch, _ = launched("--config", "production", "--gpus", "4", "--accelerate-config", str(REPO / cfg),
                            fake_gpus=8)
    assert launch.config_file == str(REPO / cfg) and not launch.multi_gpu and launch.num_processes == 4
    launch, _, _ = _validate_launch_command(launch)  # what `accelerate launch` does with the file
    assert launch.use_fsdp and launch.num_processes == 4 and launch.fsdp_version == 2


@pytest.mark.parametrize("args, fake, message", [
    (["--config", "test", "--bogus"], None, "unknown option '--bogus'"),
    (["--config"], None, "--config needs a value"),
    (["--gpus", "1"], None, "missing --config"),
    (["--config", "test", "--gpus", "two"], None, "--gpus 'two' is not a whole number"),
    (["--config", "p", "--gpus", "9"], 8, "--gpus 9 asked but only 8 CUDA GPU(s) are visible"),
    (["--config", "test", "--mixed-precision", "fp8"], None, "allowed: no, fp16, bf16"),
    (["--config", "test", "--procs", "0"], None, "--procs '0' must be >= 1"),
    (["--config", "p", "--gpus", "2", "--procs", "2"], 8, "--procs 2 is for CPU runs"),
    (["--config", "p", "--num-machines", "2", "--machine-rank", "0"], 8, "needs --main-process-ip"),
    (["--config", "p", "--num-machines", "2", "--machine-rank", "2", "--main-process-ip", "h"], 8, "out of range"),
    (["--config", "p", "--machine-rank", "1"], 8, "need --num-machines > 1"),
    (["--config", "p", "--accelerate-config", "nope.yaml"], None, "'nope.yaml' does not exist"),
    (["--config", "p"], "x", "PICONEOX_FAKE_GPUS 'x'"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, fake, message):
    result = dry_run(*args, fake_gpus=fake)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr


def test_help_documents_flags_and_the_fake_gpu_hook():
    result = subprocess.run(["bash", str(LAUNCHER), "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--procs", "--num-machines", "--accelerate-config", "--dry-run", "--credentials", "PICONEOX_FAKE_GPUS",
                 "PICONEOX_CPU_FSDP"):
        assert flag in result.stdout


def test_user_mistakes_stop_at_the_preflight_with_one_line(tmp_path):
    """Before `accelerate launch`: no launcher traceback for a bad preset, data or resume path."""
    for extra, message in ((["--config", "nope"], "error: unknown preset 'nope'"),
                           (["--config", "test", "--data", str(tmp_path / "missing")], "no such directory"),
                           (["--config", "test", "--", "--resume", str(tmp_path / "run")],
                            "no such checkpoint or run directory")):
        proc = subprocess.run([str(REPO / "start_training.sh"), "--gpus", "0", *extra], cwd=tmp_path,
                              capture_output=True, text=True, timeout=bound(60))
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: ") and message in proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_gs_settings_are_refused_before_the_launch(tmp_path):
    """A bad bucket name or unusable credentials: one line from the preflight, before any worker starts."""
    for extra, message in (
        (["--data", "gs://Bad_Bucket/data"], "bad bucket name 'Bad_Bucket'"),
        (["--data", "gs://piconeox-data/tiny", "--credentials", str(tmp_path / "key.json")],
         f"credentials file {tmp_path / 'key.json'} (from --credentials) does not exist"),
        (["--", "--checkpoint-bucket", "gs://x/ckpt"], "bad bucket name 'x'"),
    ):
        proc = subprocess.run([str(LAUNCHER), "--config", "test", "--gpus", "0", "--procs", "2", *extra], cwd=tmp_path,
                              capture_output=True, text=True, timeout=bound(60))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: ") and message in proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_gpu_check_without_a_stage_is_one_line():
    # the CUDA refusal itself: tests/process/test_gpu_check.py::test_gpu_mode_refuses_without_cuda_in_one_line
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=bound(60))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        "error: stage '' is not one of: env, kernels, train, save, resume, fsdp, fsdp-resume, all")
    assert len(proc.stderr.splitlines()) == 1
