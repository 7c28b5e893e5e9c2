"""Experiment trackers for --report-to: accelerate's tracker classes (TensorBoard by default, W&B, MLflow, ...).

`MetricsWriter` (utils/report/metrics.py) is the one place every scalar and text of a run goes through; it hands
each of them to every tracker made here, so no tracker gets a subset.

W&B without network: `WANDB_MODE=offline` writes the run under logs/<run>/wandb/ (or `WANDB_DIR`), and
`wandb sync logs/<run>/wandb/offline-run-*` uploads it later. `WANDB_PROJECT` names the project (default
piconeox); the W&B run is named after the piconeox run, and a resumed run continues the same W&B run.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from utils.errors import PiconeoxError
from utils.report.tb_hparams import write_hparams

DEFAULT_REPORT_TO = "tensorboard"


def tracker_names() -> list[str]:
    """Every tracker accelerate knows (installed or not)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return sorted(LOGGER_TYPE_TO_CLASS)


def parse_report_to(value: str) -> tuple[str, ...]:
    """`tensorboard,wandb` -> ("tensorboard", "wandb"); `none` -> (). Unknown or uninstalled trackers: one line."""
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    if names == ("none",):
        return ()
    if names == (DEFAULT_REPORT_TO,) and importlib.util.find_spec("tensorboard"):
        return names  # the default, checked without importing accelerate (and torch): --print-* stay instant
    from accelerate.tracking import get_available_trackers

    known, installed = tracker_names(), {str(t) for t in get_available_trackers()}
    for name in names:
        if name not in known:
            raise PiconeoxError(f"--report-to {name!r}: allowed {', '.join(known)} (comma-separated), or none")
        if name not in installed:
            raise PiconeoxError(f"--report-to {name}: its package is not installed "
                                f"(pip install {name.replace('_', '-')})")
    if not names:
        raise PiconeoxError(f"--report-to {value!r}: name at least one of {', '.join(known)}, or none")
    return names


WANDB_LOGIN_HINT = ("; log in with `wandb login` or WANDB_API_KEY, or set WANDB_MODE=offline and upload later with "
                    "`wandb sync`")


WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")  # wandb's Settings.mode (case matters)


def check_wandb_mode() -> str:
    """WANDB_MODE when W&B takes it (it fails with a "validation error for Settings" that does not name it)."""
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:  # set but empty fails in W&B too
        raise PiconeoxError(f"--report-to wandb: WANDB_MODE={mode!r} is not a W&B mode; allowed: "
                            f"{', '.join(WANDB_MODES)} (or unset it for online)")
    return mode or "online"


def check_wandb_login() -> None:
    """--report-to wandb, before the launch: W&B must start without a prompt, so offline/disabled mode or a key
    for its host (WANDB_API_KEY, `wandb login`'s ~/.netrc), found as wandb.init finds it (the key is not sent)."""
    if check_wandb_mode() in ("offline", "disabled", "dryrun"):
        return
    try:
        import wandb
        from wandb.sdk.lib.wbauth.authenticate import authenticate_session
    except ImportError:  # another W&B version: the run's own start reports it, one step later
        return
    try:
        found = authenticate_session(host=wandb.setup().settings.base_url, source="piconeox", prompt=False,
                                     update_session=False)
    except Exception as e:  # a key in a bad format
        raise PiconeoxError(f"--report-to wandb: {str(e).splitlines()[0].rstrip('.')}{WANDB_LOGIN_HINT}") from None
    if found is None:
        raise PiconeoxError(f"--report-to wandb: No API key configured{WANDB_LOGIN_HINT}")


def make_tracker(name: str, log_dir: Path, purge_step: int | None, run_id: str | None):
    """An unstarted accelerate tracker writing the run whose logs live in `log_dir` (logs/<run>)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, TensorBoardTracker, WandBTracker

    run = log_dir.name
    if name == "tensorboard":  # events straight into logs/<run>/; a resume drops the interrupted run's tail
        return TensorBoardTracker(run, log_dir.parent, purge_step=purge_step)
    if name == "wandb":
        check_wandb_mode()
        return WandBTracker(os.environ.get("WANDB_PROJECT", "piconeox"), name=run, id=run_id, resume="allow",
                            dir=os.environ.get("WANDB_DIR") or str(log_dir))
    cls = LOGGER_TYPE_TO_CLASS[name]
    return cls(run, log_dir.parent) if cls.requires_logging_directory else cls(run)


def start_tracker(tracker, config: dict) -> str | None:
    """Start `tracker` and store the flattened run config; returns the run id to resume with (W&B), if any."""
    try:
        tracker.start()
        if tracker.name == "tensorboard":  # into the run itself, val/loss as its metric (report/tb_hparams.py)
            write_hparams(tracker.writer, flat_config(config))
        else:
            tracker.store_init_configuration(flat_config(config))
    except Exception as e:  # a tracker's own setup problem (no W&B login, a bad URI): the user fixes it
        hint = WANDB_LOGIN_HINT if tracker.name == "wandb" else ""
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PiconeoxError(f"--report-to {tracker.name}: {why}{hint}") from None
    return getattr(tracker.tracker, "id", None) if tracker.name == "wandb" else None


def flat_config(config: dict, prefix: str = "") -> dict:
    """{"model": {"hidden_size": 8}} -> {"model.hidden_size": 8}; values a tracker's hparams accept (None -> "none")."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            plain = isinstance(value, (bool, int, float, str))
            out[f"{prefix}{key}"] = "none" if value is None else value if plain else str(value)
    return out


def markdown_block(text: str) -> str:
    """Text shown verbatim in TensorBoard's markdown text panel: an indented code block."""
    return "\n".join("    " + line for line in text.splitlines())
