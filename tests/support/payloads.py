"""What an attacker hides in a pickled file."""
import io
import os
from pathlib import Path

import torch


class Payload:
    """What an attacker hides in a checkpoint: unpickling it runs a shell command (here, one creating `flag`)."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return os.system, (f"touch {self.flag}",)


def torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
