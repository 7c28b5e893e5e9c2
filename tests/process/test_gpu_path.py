"""The GPU path's CPU-checkable contracts: what a lent GPU box without network needs to import, and
what the launcher sets up for multi-node gloo groups."""
import subprocess
import sys

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.training import TINY

# A meta-path hook that refuses the Google client libraries, as on a box where they are not installed. Not
# google_crc32c: a hard requirement (every checkpoint's COMPLETE marker records CRC32C, and config validation
# imports it), in requirements.txt and shipped to a lent GPU box by benchmarks/gpu_wheels.sh.
BLOCK_GCS = """
import sys
class NoGoogleClients:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[:2] in (["google", "cloud"], ["google", "auth"], ["google", "api_core"],
                                   ["google", "oauth2"]):
            raise ImportError(f"{name} is not installed on this box")
sys.meta_path.insert(0, NoGoogleClients())
"""


def test_train_imports_and_runs_locally_without_google_client_libraries(tmp_path, tiny_data):
    script = BLOCK_GCS + f"""
import train
from tests.support.paths import REPO
from tests.support.paths import REPO
code = train.main({[*TINY, "--data", str(tiny_data), "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
                    str(tmp_path / "logs"), "--run-name", "run", "--max-steps", "1", "--save-every", "1",
                    "--report-to", "none"]!r})
assert not [m for m in sys.modules if m.startswith(("google.cloud", "google.auth"))], "a Google client was imported"
assert "google_crc32c" in sys.modules  # the one Google package a run needs (see BLOCK_GCS)
sys.exit(code)
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=bound(150))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ckpt" / "run" / "final" / "COMPLETE").is_file()


def test_the_launchers_preflight_imports_no_torch(tmp_path, tiny_data):
    """start_training.sh runs `train.py --preflight` once per machine before every launch: its checks (folders, data,
    the run lock) need no torch, whose import costs seconds and ~200 MB there (every launch
    in the suite paid it)."""
    script = f"""
import sys
import train
code = train.main({["--config", "test", "--data", str(tiny_data), "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
                    str(tmp_path / "logs"), "--preflight", "--processes", "2"]!r})
assert code == 0, code
heavy = [m for m in ("torch", "transformers", "accelerate") if m in sys.modules]
assert not heavy, f"the preflight imported {{heavy}}"
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=bound(150))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_ddp_compile_is_regional_and_keeps_the_saved_keys():
    """Finding 9: under DDP each decoder layer is compiled on its own, in place, so no graph spans DDP's gradient
    buckets and the saved keys stay plain. Structure only: running the compiled layers costs tens of seconds of
    compile on CPU (a GPU run of benchmarks/gpu_check.sh counts its graphs and recompiles)."""
    import torch

    from configs.model import ModelConfig, build_model
    from utils.distributed import compile_layers

    model = build_model(ModelConfig(hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64,
                                    max_position_embeddings=32, vocab_size=256))
    keys = list(model.state_dict())
    compile_layers(model)
    layers = model.gpt_neox.layers
    assert len(layers) == 3 and all(layer._compiled_call_impl is not None for layer in layers)
    assert model._compiled_call_impl is None and model.gpt_neox.embed_in._compiled_call_impl is None
    assert not isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    assert list(model.state_dict()) == keys and not [k for k in keys if "_orig_mod." in k]


def test_a_cpu_run_on_a_gpu_box_opens_no_cuda_context(monkeypatch, tmp_path, tiny_data):
    """torch.cuda.is_available() is True on a GPU box for a --gpus 0 run too: the uploader thread, the staging
    copy, the RNG capture and the GPU stats key on the run's device, or every rank opens a context on GPU 0."""
    import torch

    from configs.model import ModelConfig, build_model
    from utils.ckpt.parts import Registry
    from utils.ckpt.state import set_rng_state
    from utils.ckpt.uploader import CheckpointUploader, SaveRequest
    from utils.data.tokenizers import load_tokenizer
    from utils.optim import build_optimizer
    from utils.report.metrics import gpu_stats

    touched = []

    def opens_a_context(name):
        def call(*args, **kwargs):
            touched.append(name)
            raise RuntimeError(f"torch.cuda.{name} on a CPU run")
        return call

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    import torch._dynamo  # noqa: F401 (imported later it would trip over the stand-ins below)

    for name in ("current_device", "set_device", "get_rng_state", "set_rng_state", "synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, opens_a_context(name))
    model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                                    max_position_embeddings=32, vocab_size=256))
    optimizer = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
    model(torch.zeros(1, 8, dtype=torch.long)).logits.sum().backward()
    optimizer.step()
    snapshot = Registry(model, optimizer, {}, run_config={}, tokenizer=load_tokenizer(tiny_data)).capture(1)
    assert "cuda" not in snapshot.rng
    set_rng_state(snapshot.rng)
    assert gpu_stats() == {"gpu/util_pct": None, "gpu/mem_gb": None}
    with CheckpointUploader(None, keep_local=1, progress=False, device=torch.device("cpu")) as uploader:
        uploader.submit(SaveRequest(snapshot, tmp_path / "step-00000001"))  # DCP's writer asked torch.cuda too
        del snapshot
        uploader.flush()
        [result] = uploader.poll()
    assert result.ok and touched == [], (result.error, touched)


def test_ddp_with_per_layer_compile_makes_one_graph_per_layer_not_one_per_bucket(tmp_path, monkeypatch):
    """Dynamo's DDP optimizer splits a compiled region at DDP's gradient buckets: with buckets smaller than a layer
    (as at 1.2B: 200 MB layers, 25 MiB buckets) every layer became several graphs. Counted by a backend that only
    records the graphs it is given (no inductor compile on CPU)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from configs.model import ModelConfig, build_model
    from utils.distributed import compile_layers

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(torch._dynamo.config, "optimize_ddp", torch._dynamo.config.optimize_ddp)  # restored after
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch._dynamo.reset()
        model = build_model(ModelConfig(hidden_size=384, num_layers=2, num_heads=4, intermediate_size=1536,
                                        max_position_embeddings=32, vocab_size=256))
        layer_mb = sum(p.numel() * 4 for p in model.gpt_neox.layers[0].parameters()) / 2**20
        ddp = DistributedDataParallel(model, bucket_cap_mb=layer_mb / 4)  # 4+ buckets per layer (7 MB)
        compile_layers(model, backend=counting)
        ddp(torch.zeros(2, 16, dtype=torch.long)).logits.sum().backward()
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    assert len(graphs) == 1, [len(g.graph.nodes) for g in graphs]  # one layer graph, which every layer reuses
    assert all(p.grad is not None for p in model.parameters())
