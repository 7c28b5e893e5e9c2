"""The checks of a launch's settings, called in-process: TMPDIR, --main-process-ip, --accelerate-config, the run
locks' guard, GLOO_SOCKET_IFNAME, leftover torchrun variables, WANDB_MODE and lm-eval task files. Each refusal is one
PiconeoxError line naming the value (the CLIs print it as `error: ...`, exit 2) and leaves everything as it was."""
import tempfile
from pathlib import Path

import pytest

from utils.errors import PiconeoxError


def test_an_unusable_tmpdir_falls_back_with_one_warning(monkeypatch, tmp_path, capsys):
    """The launcher's temporary note: a missing TMPDIR, or one that is a file, was a raw mktemp line."""
    from utils.preflight import temp_note

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for bad in (tmp_path / "missing", a_file):
        monkeypatch.setenv("TMPDIR", str(bad))
        monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its choice
        note = Path(temp_note())
        assert note.is_file() and note.parent != bad
        note.unlink()
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"warning: TMPDIR {bad} is missing, read-only or full" in err, err
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert Path(temp_note()).parent == tmp_path and capsys.readouterr().err == ""
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(tmp_path / "missing")])
    with pytest.raises(PiconeoxError, match="no folder for temporary files: TMPDIR=.*set TMPDIR to a writable"):
        temp_note()


@pytest.mark.parametrize("host, message", [
    ("999.1.1.1", "'999.1.1.1' is not an IPv4 address"),
    ("10.0.0", "'10.0.0' is not an IPv4 address"),
    ("10.0.0.1:29500", "carries a port: pass --main-process-ip 10.0.0.1 --main-process-port 29500"),
    ("[fd00::1]:29500", "carries a port: pass --main-process-ip fd00::1 --main-process-port 29500"),
    ("no-such-host.invalid", "'no-such-host.invalid' does not resolve on this machine"),
    (" ", "is empty"),
    ("0.0.0.0", "is no machine's address"),
    ("224.0.0.1", "is no machine's address"),
])
def test_a_main_process_ip_no_machine_can_dial_is_refused(host, message):
    """Unchecked, it was a warning and exit 0, then a rendezvous that never forms."""
    from utils.run.network import check_main_process_ip

    with pytest.raises(PiconeoxError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_main_process_ip(host)


def test_main_process_addresses_and_names_that_resolve_pass():
    from utils.run.network import check_main_process_ip

    for host in ("10.1.2.3", "127.0.0.1", "localhost", "fd00::1"):
        check_main_process_ip(host)


def test_a_scheduler_master_name_not_in_dns_yet_is_a_warning_not_a_refusal(monkeypatch, capsys):
    """Kubernetes publishes the master pod's service name once that pod is up: a worker's launcher that starts
    first must not exit over it; the same name typed as a flag is still refused."""
    from utils.run import network

    name = "trainer-master-0.trainer.invalid"
    monkeypatch.setenv("MASTER_ADDR", name)
    assert network.main([name]) == 0
    assert "does not resolve yet" in capsys.readouterr().err
    monkeypatch.delenv("MASTER_ADDR")
    assert network.main([name]) == 2
    assert "does not resolve on this machine" in capsys.readouterr().err


@pytest.mark.parametrize("text, gpus, message", [
    ("a: [1, 2\n", 0, "is not YAML at line 2"),
    ("", 0, "holds no settings (empty)"),
    ("- MULTI_GPU\n", 0, "holds no settings (list)"),
    ("distributed_type: MULTI_GPU\ngpu_ids: '0'\n", 0, "has gpu_ids: 0, but this run is on the CPU (--gpus 0)"),
    ("distributed_type: MULTI_GPU\ngpu_ids: 0,1\n", 4, "has gpu_ids: 0,1, 2 GPU(s) for --gpus 4"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n", 8, "asks for distributed_type DEEPSPEED"),
    ("distributed_type: FSDP\ndeepspeed_config:\n  zero_stage: 2\n", 8, "asks for deepspeed_config"),
    ("distributed_type: XLA\n", 8, "asks for distributed_type XLA"),
    ("distributed_type: MULTI_GPU\ncompute_environment: AMAZON_SAGEMAKER\n", 8,
     "asks for compute_environment AMAZON_SAGEMAKER"),
    ("distributed_type: multi_gpu\n", 0, "is refused by accelerate: 'multi_gpu' is not a valid DistributedType"),
    ("distributed_typ: FSDP\n", 0, "is refused by accelerate: A `distributed_type` must be specified"),
    ("distributed_type: FSDP\nfsdp_confg: {}\n", 0, "is refused by accelerate: The config file had unknown keys"),
])
def test_an_accelerate_config_we_do_not_run_is_refused(tmp_path, text, gpus, message):
    """Unchecked: accelerate's traceback after the preflight passed, or a DeepSpeed config silently ignored."""
    from utils.preflight import check_accelerate_config

    path = tmp_path / "acc.yaml"
    path.write_text(text)
    with pytest.raises(PiconeoxError, match=f"--accelerate-config '{path}' " + message.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[")):
        check_accelerate_config(str(path), gpus)


def test_an_accelerate_config_folder_json_or_binary_says_what_it_is(tmp_path):
    from utils.preflight import check_accelerate_config

    (tmp_path / "bad.json").write_text('{"distributed_type": "MULTI_GPU"')
    (tmp_path / "image.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    for path, message in [(tmp_path, "is a folder, not a config file"), (tmp_path / "bad.json", "is not JSON"),
                          (tmp_path / "image.yaml", "is not a text file"), (tmp_path / "nope.yaml", "does not exist"),
                          (Path("/dev/null"), "is not a regular file")]:
        with pytest.raises(PiconeoxError, match=message):
            check_accelerate_config(str(path), 0)


def test_the_repositorys_accelerate_configs_pass():
    from tests.support.paths import REPO
    from utils.preflight import check_accelerate_config

    for path in sorted((REPO / "configs" / "accelerate").glob("*.yaml")):
        check_accelerate_config(str(path), 8)
    check_accelerate_config(str(REPO / "configs" / "accelerate" / "multi_gpu_ddp.yaml"), 0)  # --procs 2 on CPU


def test_a_guard_that_is_a_folder_is_one_line(tmp_path):
    """Unchecked, os.open on the folder was an IsADirectoryError traceback."""
    from utils.run import runlock

    (tmp_path / "ckpt" / ".locks" / ".guard").mkdir(parents=True)
    with pytest.raises(PiconeoxError, match=r"\.locks/\.guard is a folder, not the run locks' guard file"):
        with runlock.holding(tmp_path / "ckpt", "run", "test"):
            pass
    assert (tmp_path / "ckpt" / ".locks" / ".guard").is_dir()


def test_gloo_socket_ifname_must_name_an_interface_here():
    """Unchecked, gloo raised in every rank (a traceback each) after the launch."""
    import socket

    from utils.run.network import check_gloo_ifname

    here = sorted(name for _, name in socket.if_nameindex())
    for ok in (None, "", here[0], ",".join(here)):
        check_gloo_ifname(ok)
    for bad, named in (("eth-nope", "eth-nope"), (f"{here[0]},nope0", "nope0")):
        with pytest.raises(PiconeoxError, match=f"GLOO_SOCKET_IFNAME='{bad}' names no network interface .*'{named}'"):
            check_gloo_ifname(bad)


@pytest.mark.parametrize("env, outcome", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "but no MASTER_ADDR or MASTER_PORT, and no launcher"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}, "but no MASTER_PORT"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "forms no process group"),
    ({"WORLD_SIZE": "two"}, "forms no process group"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK=0 in the environment forms no process group"),
    ({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}, "but no MASTER_ADDR or MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}, None),
    ({"RANK": "0", "WORLD_SIZE": "1"}, None),
    ({"RANK": "3"}, None),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "train.py: process group from the environment, no launcher"),
])
def test_leftover_torchrun_variables_are_refused_or_announced(env, outcome):
    """Unchecked, RANK/WORLD_SIZE left in a shell made a plain train.py wait silently (or raise in accelerate)."""
    from utils.run.launch_env import check_launch_env

    if outcome is None or outcome.startswith("train.py"):
        notice = check_launch_env(env)
        assert notice == outcome if outcome is None else outcome in notice and "waits for the others" in notice
    else:
        with pytest.raises(PiconeoxError, match=outcome):
            check_launch_env(env)


def test_plain_train_py_with_leftover_rank_variables_is_one_line(monkeypatch, tmp_path, tiny_data, capsys,
                                                                 fresh_accelerate_state):
    from tests.support.training import run

    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "1")
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "RANK=0 WORLD_SIZE=2 in the environment" in err, err
    assert not run_dir.exists()


def test_a_bogus_wandb_mode_is_named(monkeypatch):
    """Unchecked, W&B's own "1 validation error for Settings" did not say which setting."""
    from utils.report.trackers import check_wandb_login, check_wandb_mode

    for bad in ("bogus", "Offline", ""):
        monkeypatch.setenv("WANDB_MODE", bad)
        for check in (check_wandb_mode, check_wandb_login):
            with pytest.raises(PiconeoxError, match=f"WANDB_MODE='{bad}' is not a W&B mode; allowed: online, offline"):
                check()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert check_wandb_mode() == "offline"
    check_wandb_login()


def test_a_broken_task_yaml_is_named(tmp_path):
    """lm-eval skips a task YAML it cannot read without a word: unchecked, it was "not an lm-eval task"."""
    import shutil

    from tests.support.paths import REPO
    from utils.evaluate import task_manager

    tasks = tmp_path / "tasks"
    shutil.copytree(REPO / "tests" / "support" / "lm_eval_tasks", tasks)
    good = (tasks / "tiny_hellaswag.yaml").read_text()
    assert "tiny_hellaswag" in task_manager(["tiny_hellaswag"], str(tasks)).all_tasks
    for broken, why in ((good.replace("output_type: multiple_choice", "output_type: [multiple_choice"),
                         "tiny_hellaswag.yaml: while parsing a flow sequence"),
                        (good.replace("task: tiny_hellaswag", "name: tiny_hellaswag"),
                         "tiny_hellaswag.yaml: no `task:` or `group:` key")):
        (tasks / "tiny_hellaswag.yaml").write_text(broken)
        with pytest.raises(PiconeoxError, match=f"lm-eval skipped 1 file.* of --include-path {tasks}: {why}"):
            task_manager(["tiny_hellaswag"], str(tasks))
