"""What a run reports: log file, tracker scalars (TensorBoard, W&B, ...), history.json, loss plot, progress bar,
tokens/s, MFU, GPU stats.

Only the main process writes anything; on other ranks every writer is a no-op, so the training loop can
call them unconditionally.
"""
from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from utils.atomic import atomic_write, atomic_write_json
from utils.diskfull import disk_full, is_no_space, one_line_when_full
from utils.textfile import MAX_JSON_BYTES
from utils.report.trackers import DEFAULT_REPORT_TO, make_tracker, markdown_block, start_tracker

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


class _TqdmHandler(logging.StreamHandler):
    """Console handler that prints above an active tqdm bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


class _LogFile(logging.FileHandler):
    """training.log; a full disk ends the run with one line instead of a logging traceback per record."""

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not is_no_space(error):
            return super().handleError(record)
        logging.getLogger("piconeox").removeHandler(self)
        raise disk_full(Path(self.baseFilename).parent, "training.log")


def setup_logging(log_file: Path, is_main: bool) -> logging.Logger:
    """The "piconeox" logger: console + `log_file` (appended) on the main process, warnings-only console elsewhere.

    Calling it again replaces the handlers (one run per process, but tests call it repeatedly).
    """
    logger = logging.getLogger("piconeox")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.propagate = False
    formatter = logging.Formatter(LOG_FORMAT)
    console = _TqdmHandler()
    console.setFormatter(formatter)
    logger.addHandler(console)
    if is_main:
        log_file = Path(log_file)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = _LogFile(log_file, encoding="utf-8")
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
        logger.setLevel(logging.INFO)
    else:
        logger.setLevel(logging.WARNING)
    return logger


# The history's bound as JSON: half of what a resume reads of metrics.json (utils.textfile.read_json's cap), so a long
# run's own checkpoint stays readable (past 16 MiB a resume refused it).
HISTORY_BYTES = MAX_JSON_BYTES // 2


class MetricsWriter:
    """Every scalar and text of a run goes through here: to each tracker (--report-to; TensorBoard by default,
    W&B, ... see utils/report/trackers.py) and into an in-memory history that becomes history.json and a loss plot.

    The history is progress: `state_dict()` goes into checkpoints (with the W&B run id), and after
    `load_state_dict()` TensorBoard purges events past the restored history (those of the interrupted run)
    and W&B continues the same run.
    """

    def __init__(self, log_dir: Path, is_main: bool, report_to: tuple[str, ...] = (DEFAULT_REPORT_TO,)):
        self.log_dir = Path(log_dir)
        self.is_main = is_main
        self.report_to = tuple(report_to)
        self.history: list[dict[str, float]] = []
        self._history_bytes = 0  # its size as JSON
        self.trackers: list = []  # started by start() or the first write, after a resume has set what they continue
        self._started = False
        self._purge_step: int | None = None
        self._run_ids: dict[str, str] = {}

    def start(self, step: int = 0, config: dict | None = None) -> None:
        """Start the trackers; the resolved config becomes their hparams and a `config` text panel."""
        if not self.is_main or self._started:
            return
        from accelerate import PartialState

        PartialState()  # accelerate's trackers log through its state; a no-op inside a run (Accelerator made it)
        self._started = True
        for name in self.report_to:
            tracker = make_tracker(name, self.log_dir, self._purge_step, self._run_ids.get(name))
            run_id = start_tracker(tracker, config or {})
            self.trackers.append(tracker)
            if run_id:
                self._run_ids[name] = run_id
        if "wandb" in self.report_to and self._purge_step is not None:
            logging.getLogger("piconeox").info(
                f"W&B run {self._run_ids.get('wandb')}: this resume logs again from step {self._purge_step}; W&B "
                "keeps only increasing steps, so steps the interrupted attempt logged past its checkpoint keep that "
                "attempt's values there and this attempt's values for them are dropped (TensorBoard and history.json "
                "hold this attempt's)")
        if config:
            self.text(step, "config", yaml.safe_dump(config, sort_keys=False))

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """Record `values` at `step` in every tracker and the history; None means "not measured" and is skipped."""
        if not self.is_main:
            return
        kept = {k: float(v) for k, v in values.items() if v is not None}
        if not kept:
            return
        self.start()
        with one_line_when_full(self.log_dir, "the TensorBoard/tracker logs"):
            for tracker in self.trackers:
                tracker.log(kept, step=step)
        entry = {"step": int(step), **kept}
        self.history.append(entry)
        self._history_bytes += len(json.dumps(entry)) + 2
        if self._history_bytes > HISTORY_BYTES:
            self._thin_history()

    def _thin_history(self) -> None:
        """Keep the history (it goes into every checkpoint) within HISTORY_BYTES: every other training entry of its
        older half goes; evaluations and the newer half stay."""
        half = len(self.history) // 2
        older = [h for i, h in enumerate(self.history[:half])
                 if i % 2 == 0 or not all(k.startswith("train/") for k in h if k != "step")]
        self.history = older + self.history[half:]
        self._history_bytes = sum(len(json.dumps(h)) + 2 for h in self.history)

    def text(self, step: int, key: str, text: str) -> None:
        """A text panel (shown verbatim) in every tracker: the resolved config, the final sample."""
        if not self.is_main:
            return
        self.start()
        with one_line_when_full(self.log_dir, "the TensorBoard/tracker logs"):
            for tracker in self.trackers:
                tracker.log({key: markdown_block(text)}, step=step)

    def save_history(self, path: Path) -> None:
        """Write the history as JSON (a list of {"step": ..., "<key>": value}) atomically."""
        if self.is_main:
            with one_line_when_full(Path(path).parent, Path(path).name):
                atomic_write_json(path, self.history)

    def plot(self, path: Path) -> None:
        """Write a PNG of train and val loss against step (matplotlib's Agg canvas, no display needed)."""
        if not self.is_main:
            return
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(8, 5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for key, style in (("train/loss", "-"), ("val/loss", "o-")):
            points = [(h["step"], h[key]) for h in self.history if key in h]
            if points:
                steps, losses = zip(*points)
                ax.plot(steps, losses, style, label=key, markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        with one_line_when_full(Path(path).parent, f"the loss plot {Path(path).name}"), atomic_write(path, "wb") as f:
            fig.savefig(f, format="png")

    def state_dict(self) -> dict:
        return {"history": [dict(h) for h in self.history], "tracker_run_ids": dict(self._run_ids)}

    def load_state_dict(self, state: dict) -> None:
        self.history = [dict(h) for h in state["history"]]
        self._history_bytes = sum(len(json.dumps(h)) + 2 for h in self.history)
        self._run_ids = dict(state.get("tracker_run_ids", {}))  # checkpoints from before trackers lack it
        if self.history:
            self._purge_step = self.history[-1]["step"] + 1

    def close(self) -> None:
        """Finish every tracker (flushes TensorBoard, closes the W&B run)."""
        trackers, self.trackers = self.trackers, []
        with one_line_when_full(self.log_dir, "the TensorBoard/tracker logs"):
            for tracker in trackers:
                tracker.finish()


# Dense (no sparsity) 16-bit tensor-core peak per device, FLOP/s, from NVIDIA datasheets; bf16 and fp16
# are equal on these parts. First match wins, so the more specific names come first.
PEAK_FLOPS: list[tuple[str, str, float]] = [
    # (regex on torch.cuda.get_device_name(), label, peak)
    (r"\bB200\b", "B200", 2250e12),
    (r"\bH200 NVL\b", "H200 NVL", 835e12),
    (r"\bH200\b", "H200 SXM", 989e12),
    (r"\bGH200\b", "GH200", 989e12),  # Grace Hopper: an H100-class GPU ("GH200" has no word break before "H200")
    (r"\bH100 NVL\b", "H100 NVL", 835e12),
    (r"\bH800 PCIe\b", "H800 PCIe", 756e12),  # H100 compute with export-limited NVLink
    (r"\bH800\b", "H800 SXM", 989e12),
    (r"\bH100 PCIe\b", "H100 PCIe", 756e12),
    (r"\bH100\b", "H100 SXM", 989e12),
    (r"\bA100\b", "A100", 312e12),
    (r"\bL40S\b", "L40S", 362e12),
    (r"\bL40\b", "L40", 181e12),
    (r"\bL4\b", "L4", 121e12),
    # A10G is an AWS part without a public NVIDIA datasheet: the A10 figure is an upper bound, so its
    # MFU is a lower bound.
    (r"\bA10G?\b", "A10/A10G", 125e12),
    (r"RTX 4090", "RTX 4090", 165e12),  # fp32 accumulate (330 with fp16 accumulate)
    (r"RTX 3090", "RTX 3090", 71e12),  # fp32 accumulate
    (r"\bV100\b", "V100", 125e12),  # fp16 only; SXM2 figure (PCIe: 112)
    (r"\bT4\b", "T4", 65e12),  # fp16 only
]
NO_BF16 = ("V100", "T4")  # pre-Ampere: no bf16 tensor cores


def peak_flops(device_name: str | None, precision: str) -> float | None:
    """Peak dense FLOP/s of one device for `precision` ("bf16", "fp16" or "no"), or None when unknown.

    None for: no device name (CPU), a device not in PEAK_FLOPS, bf16 on a device without bf16 tensor
    cores, and fp32 ("no"), where the tensor-core peak would not be a fair denominator.
    """
    if not device_name or precision not in ("bf16", "fp16"):
        return None
    for pattern, label, peak in PEAK_FLOPS:
        if re.search(pattern, device_name):
            return None if precision == "bf16" and label in NO_BF16 else peak
    return None


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]: achieved model FLOP/s of one device over its peak (None if unknown)."""
    if not peak or tokens_per_s_per_device is None:
        return None
    return tokens_per_s_per_device * flops_per_token / peak


_nvml_handle = None


def gpu_stats() -> dict[str, float | None]:
    """Utilisation (%) and used memory (GB) of this process's CUDA device via nvidia-ml-py; None without CUDA."""
    global _nvml_handle
    stats: dict[str, float | None] = {"gpu/util_pct": None, "gpu/mem_gb": None}
    try:
        import torch

        if not torch.cuda.is_initialized():  # a CPU run, also on a GPU box: asking would open a CUDA context
            return stats
        import pynvml

        if _nvml_handle is None:
            pynvml.nvmlInit()
            _nvml_handle = _nvml_device(pynvml, torch.cuda.current_device())
        stats["gpu/util_pct"] = float(pynvml.nvmlDeviceGetUtilizationRates(_nvml_handle).gpu)
        stats["gpu/mem_gb"] = pynvml.nvmlDeviceGetMemoryInfo(_nvml_handle).used / 1e9
    except Exception:  # no driver, no pynvml, a restricted container: metrics are optional
        pass
    return stats


def _nvml_device(pynvml, cuda_index: int):
    """NVML numbers devices physically; CUDA_VISIBLE_DEVICES renumbers them. Match by PCI bus id."""
    import torch

    try:
        props = torch.cuda.get_device_properties(cuda_index)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
    except (AttributeError, pynvml.NVMLError):  # older torch without PCI ids, or an unknown bus id
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
