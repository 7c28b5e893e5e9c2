"""utils/storage/sync.host_dir: per-node cache folders that stay apart when nodes share a filesystem and a hostname."""
import socket

from utils.storage.sync import host_dir


def test_nodes_sharing_a_hostname_get_their_own_cache(tmp_path, monkeypatch):
    host = socket.gethostname()
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.delenv("PICONEOX_MACHINE_RANK", raising=False)
    assert host_dir(tmp_path) == tmp_path / host  # one machine: as before
    monkeypatch.setenv("PICONEOX_MACHINE_RANK", "1")
    assert host_dir(tmp_path) == tmp_path / f"{host}.machine-1"  # machines by hand, one host
    monkeypatch.setenv("SLURMD_NODENAME", "n2")  # Slurm's node name: stable across jobs, whatever the rank
    assert host_dir(tmp_path) == tmp_path / f"{host}.n2"
    monkeypatch.setenv("SLURMD_NODENAME", host.split(".")[0])  # the usual cluster: node name = hostname
    assert host_dir(tmp_path) == tmp_path / host
