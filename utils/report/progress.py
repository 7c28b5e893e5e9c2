"""What the training loop says as it goes: the progress bar, tokens/s and MFU, the logged scalars, the eval line,
and the closing summary. Every writer is a no-op off the main process (utils/report/metrics.py)."""
from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

from tqdm.auto import tqdm

from utils.report.metrics import gpu_stats, mfu


class ProgressBar:
    """A tqdm bar over optimizer steps (rate and ETA from tqdm) with loss, average loss, lr and tok/s."""

    _NAMES = {"avg_loss": "avg", "tok_s": "tok/s"}

    def __init__(self, total_steps: int, initial_step: int, is_main: bool):
        self._bar = tqdm(total=total_steps, initial=initial_step, disable=not is_main, unit="step",
                         dynamic_ncols=True, desc="train")

    def update(self, n: int = 1, **postfix: float | None) -> None:
        """Advance `n` steps; postfix keys like loss=, avg_loss=, lr=, tok_s= (None shows n/a)."""
        if postfix:
            self._bar.set_postfix_str(", ".join(f"{self._NAMES.get(k, k)}={_fmt(k, v)}" for k, v in postfix.items()),
                                      refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()



class Throughput:
    """Tokens/s from the steps between two loss reads (the only host syncs), and averaged since the last eval."""

    def __init__(self, step: int, tokens_per_step: int):
        self.tokens_per_step, self.since = tokens_per_step, (time.time(), step)
        self.recent_losses: deque[float] = deque(maxlen=100)  # for the bar's running average
        self.tokens, self.seconds = 0, 0.0

    def read(self, step: int, loss: float) -> tuple[float, float, float]:
        """(seconds per step, tokens/s, running mean loss) at a loss read; GPU work included, .item() waited."""
        steps = step - self.since[1]
        dt = (time.time() - self.since[0]) / steps
        self.since = (time.time(), step)
        self.tokens, self.seconds = self.tokens + steps * self.tokens_per_step, self.seconds + steps * dt
        self.recent_losses.append(loss)
        return dt, self.tokens_per_step / dt, sum(self.recent_losses) / len(self.recent_losses)

    def restart(self, step: int) -> None:
        """Count from now: tokens/s and MFU measure training steps, not an evaluation or a save just done."""
        self.since = (time.time(), step)

    def since_last_eval(self) -> float:
        """Mean tokens/s since the previous call (the eval line's figure, not just this step's)."""
        tok_s, self.tokens, self.seconds = self.tokens / self.seconds, 0, 0.0
        return tok_s

def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if key == "lr":
        return f"{value:.2e}"
    if key == "tok_s":
        return f"{value:,.0f}"
    return f"{value:.4f}"


class TrainReport:
    """The loop's reporting: one call per finished step, per loss read and per evaluation.

    metrics: the MetricsWriter; log: the run's logger; world: processes; flops_per_token and peak: for MFU.
    """

    def __init__(self, metrics, log, *, total_steps: int, step: int, tokens_per_step: int, world: int,
                 flops_per_token: float, peak: float | None, is_main: bool):
        self.metrics, self.log, self.world, self.flops_per_token, self.peak = metrics, log, world, flops_per_token, peak
        self.bar = ProgressBar(total_steps, step, is_main)
        self.speed = Throughput(step, tokens_per_step)

    def loss_read(self, step: int, loss: float, lr: float, grad_norm: float, log_due: bool) -> None:
        """The bar's postfix at every loss read; the step's scalars when logging is due."""
        dt, tok_s, avg_loss = self.speed.read(step, loss)
        self.bar.update(0, loss=loss, avg_loss=avg_loss, lr=lr, tok_s=tok_s)
        if log_due:
            self.metrics.scalars(step, {
                "train/loss": loss, "train/lr": lr, "train/grad_norm": float(grad_norm), "train/step_time_s": dt,
                "train/tokens_per_s": tok_s,
                "train/tokens_per_s_per_device": tok_s / self.world if self.world > 1 else None,  # else the same
                "train/mfu": mfu(tok_s / self.world, self.flops_per_token, self.peak), **gpu_stats()})
            self.log.debug(f"step {step} loss {loss:.6f} lr {lr:.3e}")

    def evaluated(self, step: int, loss: float, val: float, improved: bool, evals_without_improvement: int,
                  best: float | None = None, ema: float | None = None) -> None:
        """The val scalars (`best`: the run's lowest val loss so far, the HParams tab's second metric; `ema`: the
        val loss of the weights' EMA, when kept) and the eval line, with throughput averaged since the last eval."""
        self.metrics.scalars(step, {"val/loss": val, "val/perplexity": math.exp(min(val, 50)), "val/best_loss": best,
                                    "val/loss_ema": ema})
        tok_s = self.speed.since_last_eval()
        util, gpu = mfu(tok_s / self.world, self.flops_per_token, self.peak), gpu_stats()
        gpu_text = ("n/a" if gpu["gpu/util_pct"] is None
                    else f"{gpu['gpu/util_pct']:.0f}% busy, {gpu['gpu/mem_gb']:.1f} GB")
        ema_text = "" if ema is None else f"EMA val loss {ema:.4f}, "
        self.log.info(f"step {step}: train loss {loss:.4f}, val loss {val:.4f}, "
                      f"perplexity {math.exp(min(val, 50)):.2f}, {ema_text}"
                      f"{tok_s:,.0f} tok/s{f' ({tok_s / self.world:,.0f} per device)' if self.world > 1 else ''}, MFU "
                      f"{f'{util:.1%}' if util else 'n/a'}, GPU {gpu_text}"
                      + (" (best)" if improved else f" ({evals_without_improvement} eval(s) without improvement)"))

    def close(self) -> None:
        self.bar.close()

    def summary(self, step: int, reason: str, best_val_loss: float, log_dir: Path, sample: str | None,
                peak_gpu_gb: float | None, plot: bool = True) -> None:
        """Main process, at the end: history.json, loss.png (not `plot`: a stop on a signal, where importing
        matplotlib and drawing took most of what the grace gives a busy machine), the stop line and the sample."""
        self.metrics.save_history(log_dir / "history.json")
        if plot:
            self.metrics.plot(log_dir / "loss.png")
        self.log.info(f"stopped at step {step}: {reason}; best val loss {best_val_loss:.4f}"
                      + (f"; peak GPU memory {peak_gpu_gb:.1f} GB" if peak_gpu_gb is not None else ""))
        if sample is not None:
            self.metrics.text(step, "sample", sample)


def log_start(log, name: str, cfg, train_loader, accelerator, data_dir: Path, n_params: int) -> None:
    """The start-up lines: what trains where, the batch and the math settings."""
    from utils.distributed import group_timeout
    from utils.sharding import describe

    tc, world, timeout = cfg.train, accelerator.num_processes, group_timeout(accelerator)
    log.info(f"run {name}: preset {cfg.preset}, {n_params:,} parameters, data {data_dir} (vocab "
             f"{train_loader.vocab_size}, {train_loader.tokens_per_epoch:,} train tokens), {world} process(es) on "
             f"{accelerator.device} ({describe(accelerator)}), mixed precision {tc.mixed_precision}"
             + (f", collective timeout {timeout.total_seconds() / 60:g} min" if timeout else ""))
    log.info(f"global batch {tc.global_batch_tokens:,} tokens per step = micro batch {tc.micro_batch_size} x "
             f"{tc.grad_accum_steps} accumulation x {world} process(es) x {tc.seq_len} tokens")
    log.info(f"math: {tc.attention} attention, float32 matmul precision {tc.matmul_precision}, "
             f"mixed precision {tc.mixed_precision}")
