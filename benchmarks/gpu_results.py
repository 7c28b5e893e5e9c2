"""What benchmarks/gpu_check.sh records: the keys of each measurement and the one way a stage writes one (a JSON line
in OUT/results.jsonl, a readable row on stdout)."""
from __future__ import annotations

import json
from pathlib import Path

# a training run's (train, fsdp): ok = exited 0 within --limit-s; recompiles and graph breaks from TORCH_LOGS
RUN = ["ok", "wall_s", "first_step_s", "tok_s", "mfu", "peak_alloc_gb", "peak_reserved_gb", "recompiles",
       "graph_breaks"]
# the first save allocates and pins the staging buffers, a later one reuses them
SAVES = ["blocking_first_s", "blocking_later_s"]
# Every key each stage's lines carry, GPU and CPU mode alike (tests/process/test_gpu_check.py holds the CPU mode to it).
KEYS = {
    "env": ["python", "torch", "cuda", "transformers", "accelerate", "gpu", "gpu_memory_gb", "free_disk_gb",
            "ram_gb", "google_cloud_storage"],
    "gemm": ["m", "n", "k", "dtype", "tflops"],
    "sdpa": ["backend", "batch", "heads", "seq", "head_dim", "tflops"],
    "d2h": ["pinned", "gb", "gb_per_s"],
    "train": ["variant", "micro_batch", "compile", *RUN],
    "save": ["ok", *SAVES, "write_s", "write_gb_per_s", "crc32c_gb_per_s", "step_ratio_during_write",
             "steps_during_write", "staged_gb", "checkpoint_gb", "noise_floor_max_dloss"],
    "resume": ["ok", "resume_max_dloss"],
    "fsdp": [*RUN, *SAVES, "checkpoint_gb"],
    "fsdp-resume": ["ok", "resume_max_dloss"],
}
GB = 1e9


def record(out: Path, kind: str, **values) -> None:
    """Append one measurement (exactly the keys of KEYS[kind]) and print it readably."""
    assert sorted(values) == sorted(KEYS[kind]), (kind, sorted(values))
    with open(out / "results.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"stage": kind, **values}) + "\n")
    print(f"{kind:<11} " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()),
          flush=True)

