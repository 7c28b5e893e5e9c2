"""gpu_check's first stages: the box (env) and its kernels (bf16 GEMMs at the production shapes, the SDPA backend
torch picks, device-to-pinned-host copies), measured without training."""
from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.gpu_results import GB, record


def stage_env(out: Path, cpu: bool) -> None:
    import accelerate
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not cpu
    mem = Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0]
    record(out, "env", python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
           transformers=transformers.__version__, accelerate=accelerate.__version__,
           gpu=torch.cuda.get_device_name() if cuda else None,
           gpu_memory_gb=torch.cuda.get_device_properties(0).total_memory / GB if cuda else None,
           free_disk_gb=shutil.disk_usage(out).free / GB, ram_gb=int(mem) * 1024 / GB,
           google_cloud_storage=importable("google.cloud.storage"))


def importable(name: str) -> bool:
    """Whether `name` can be imported; find_spec raises (not None) when a parent package lacks it, e.g. `google`
    as a namespace with `google_crc32c`'s or protobuf's parts but no `cloud`."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def timed(fn, repeat: int, sync) -> float:
    """Seconds per call of `fn` (median of `repeat` after one warm-up)."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def stage_kernels(out: Path, cpu: bool) -> None:
    """bf16 GEMMs at the production shapes, the SDPA backend that runs and its speed, device-to-pinned-host GB/s
    (a save's blocking copy)."""
    import torch
    import torch.nn.functional as F

    cuda = torch.cuda.is_available() and not cpu
    dev, dtype, sync = (("cuda", torch.bfloat16, torch.cuda.synchronize) if cuda
                        else ("cpu", torch.float32, lambda: None))
    tokens, h, ffn, vocab = (4 * 2048, 2048, 8192, 50304) if cuda else (256, 128, 512, 256)
    for m, n, k in ((tokens, 3 * h, h), (tokens, ffn, h), (tokens, h, ffn), (tokens, vocab, h)):
        a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
        s = timed(lambda: a @ b, 10 if cuda else 2, sync)
        record(out, "gemm", m=m, n=n, k=k, dtype=str(dtype).removeprefix("torch."), tflops=2 * m * n * k / s / 1e12)
    batch, heads, seq, hd = (4, 16, 2048, 128) if cuda else (2, 4, 128, 32)
    q, k_, v = (torch.randn(batch, heads, seq, hd, device=dev, dtype=dtype) for _ in range(3))
    backend = sdpa_backend(lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=True))
    s = timed(lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=True), 10 if cuda else 2, sync)
    flops = 4 * batch * heads * seq * seq * hd / 2  # causal: half of QK^T and PV
    record(out, "sdpa", backend=backend, batch=batch, heads=heads, seq=seq, head_dim=hd, tflops=flops / s / 1e12)
    size = int(2 * GB) if cuda else int(64e6)  # a save's staging copy: device to pinned host memory
    source = torch.empty(size, dtype=torch.uint8, device=dev)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
    s = timed(lambda: host.copy_(source, non_blocking=cuda), 3, sync)
    record(out, "d2h", pinned=cuda, gb=size / GB, gb_per_s=size / GB / s)


SDPA_OPS = {"_flash_attention": "FLASH_ATTENTION", "_efficient_attention": "EFFICIENT_ATTENTION",
            "_cudnn_attention": "CUDNN_ATTENTION", "_attention_math": "MATH", "_math": "MATH"}


def sdpa_backend(call) -> str | None:
    """The backend torch's own choice runs for `call` (no forcing: torch tries FLASH, EFFICIENT, MATH, then cuDNN),
    read from the aten op the profiler records (`aten::_scaled_dot_product_flash_attention`, ...)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    ops = [e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product")]
    return next((name for op in ops for key, name in SDPA_OPS.items() if key in op), ops[0] if ops else None)
