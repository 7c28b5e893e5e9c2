"""The --device flag of the inference CLIs: checked against this machine before any model is loaded."""
from __future__ import annotations

import re

from utils.errors import PiconeoxError


def resolve_device(name: str | None, flag: str = "--device") -> str:
    """cpu, cuda or cuda:N (N below the GPU count); None means cuda when there is a GPU, else cpu."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name is None:
        return "cuda" if gpus else "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if name != "cpu" and not match:
        raise PiconeoxError(f"{flag} {name!r} is not allowed: use cpu, cuda or cuda:N")
    if match and not gpus:
        raise PiconeoxError(f"{flag} {name}: this machine has no CUDA GPU that torch can use; use --device cpu")
    if match and match.group(1) is not None and int(match.group(1)) >= gpus:
        raise PiconeoxError(f"{flag} {name}: this machine has {gpus} GPU(s), cuda:0 to cuda:{gpus - 1}")
    return name
