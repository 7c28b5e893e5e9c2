"""utils/run/allocation.machine_folder: per-node cache folders that stay apart when nodes share a filesystem and a
hostname."""
import socket

from utils.run.allocation import machine_folder


def test_nodes_sharing_a_hostname_get_their_own_cache(tmp_path):
    host = socket.gethostname()
    assert machine_folder(tmp_path, {}) == tmp_path / host  # one machine: as before
    env = {"PICONEOX_MACHINE_RANK": "1"}
    assert machine_folder(tmp_path, env) == tmp_path / f"{host}.machine-1"  # machines by hand, one host
    env["SLURMD_NODENAME"] = "n2"  # Slurm's node name: stable across jobs, whatever the rank
    assert machine_folder(tmp_path, env) == tmp_path / f"{host}.n2"
    env["SLURMD_NODENAME"] = host.split(".")[0]  # the usual cluster: node name = hostname
    assert machine_folder(tmp_path, env) == tmp_path / host
