"""The values a wait for peers and the scheduler's variables rest on, checked in-process: the gloo error of a dead
peer as one line (exit 1), MASTER_PORT for a group from the environment, the rendezvous bound, and Slurm's ids."""
import pytest

from utils.errors import PEER_LOST, PiconeoxError, cli
from utils.run.allocation import detect
from utils.run.launch_env import check_launch_env
from utils.run.rendezvous import check_rendezvous_timeout

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:58042. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
        "before reporting an error. GLHF!")


def test_a_dead_peers_gloo_error_is_one_line_and_exit_1(capsys):
    @cli
    def main(argv=None):
        raise RuntimeError(GLOO)

    assert main() == PEER_LOST == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: another process of the run is gone (gloo: Connection closed by peer "
                                "[127.0.0.1]:58042); this one stops too, without a save: the last complete checkpoint "
                                "stays, and --resume auto continues it"]


def test_any_other_runtime_error_keeps_its_traceback():
    @cli
    def main(argv=None):
        raise RuntimeError("a bug of ours")

    with pytest.raises(RuntimeError, match="a bug of ours"):
        main()


@pytest.mark.parametrize("port", ["0", "65536", "99999", "x"])
def test_master_port_of_a_group_from_the_environment_must_be_a_port(port):
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    with pytest.raises(PiconeoxError, match=f"MASTER_PORT='{port}' in the environment is no TCP port"):
        check_launch_env(env)


def test_the_group_notice_says_the_bound_and_how_to_stop_waiting():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert "(at most 60 s: --rendezvous-timeout-seconds; Ctrl-C stops waiting)" in check_launch_env(env, timeout=60)


@pytest.mark.parametrize("seconds", [0, 0.5, -1, float("nan"), float("inf"), 10**7])
def test_the_rendezvous_bound_is_1_s_to_a_week(seconds):
    with pytest.raises(PiconeoxError, match="--rendezvous-timeout-seconds"):
        check_rendezvous_timeout(seconds)


def test_slurm_job_ids_are_32_bit_and_a_federations_ten_digits_fit():
    two_nodes = {"SLURM_STEP_ID": "0", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2",
                 "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-2]"}
    found = detect({**two_nodes, "SLURM_JOB_ID": "4294967295"}, first_address=lambda nodes: "10.0.0.1")
    assert (found.machines, found.rank, found.ip) == (2, 1, "10.0.0.1") and 10000 <= found.port < 30000
    with pytest.raises(PiconeoxError, match="SLURM_JOB_ID='4294967296' in the environment is not a whole number"):
        detect({**two_nodes, "SLURM_JOB_ID": "4294967296"}, first_address=lambda nodes: "10.0.0.1")
