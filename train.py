"""piconeox trainer: one GPT-NeoX training loop from a 10K-parameter Pico model to the 1.2B preset.

    accelerate launch train.py --config rp2040-speed          (or ./start_training.sh --config ... --gpus N)

Read top to bottom: flags -> config; `main` -> `run` (preflight / print-plan / train) -> `setup()` builds a `Run`
(data, model, optimizer, checkpointer, resume) -> `train(run)`: `train_step`, then whatever is due (log, eval,
save) -> `finish(run, reason)`: final save, sample text, flush uploads.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from typing import TYPE_CHECKING

# First of all: a stop signal during the imports is one line and 130, not a traceback (a stop of the preflight is the
# supervisor's to say).
if __name__ == "__main__" and "--preflight" not in sys.argv:
    from utils.run.rendezvous import stop_before_start

    stop_before_start()

from configs.flags import overrides_from_args, parse_args
from utils.errors import PiconeoxError, cli, exit_process

if TYPE_CHECKING:  # the types of `Run`'s fields; each is imported where it is built
    import logging

    import torch
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import PreTrainedTokenizerFast

    from configs.presets import RunConfig
    from configs.training import TrainConfig
    from utils.ckpt.checkpointer import Checkpointer, TrainerState
    from utils.data.loader import BlockLoader
    from utils.ema import WeightEMA
    from utils.report.metrics import MetricsWriter
    from utils.report.progress import TrainReport
    from utils.run.budget import TimeBudget
    from utils.run.preemption import StopRequest, StopVote

SAMPLE_SHARE = 0.05  # of a time budget, at most, for the final sample (it has fewer tokens when that is too little)
GC_EVERY = 50  # steps between the loop's garbage collections (automatic gc is off while it runs)


# --- before the launch --------------------------------------------------------------------------------------

def run_dirs(cfg) -> tuple[str, Path, Path]:
    """(run name, checkpoints/<run>, logs/<run>); the name defaults to <preset>-<dataset>."""
    from utils.data.source import data_name

    return cfg.run.folders(f"{cfg.preset}-{data_name(cfg.train)}")


def with_init_from(cfg):
    """(cfg, checked --init-from checkpoint or None): the checkpoint's model shape replaces the preset's."""
    if not cfg.run.init_from:
        return cfg, None
    from configs.model import ModelConfig
    from utils.pretrained import open_pretrained

    pretrained = open_pretrained(cfg.run.init_from)
    return replace(cfg, model=ModelConfig.from_hf(pretrained.hf_config)).validate(), pretrained


# --- setup: one line per component --------------------------------------------------------------------------

@dataclass(kw_only=True)
class Run:
    """The parts of a run in training: what `setup` built and `train` / `finish` use (built by name, never by
    position: many of them share a type)."""

    cfg: RunConfig  # final (vocab, batch for this world size, run settings)
    name: str
    run_dir: Path
    log_dir: Path
    accelerator: Accelerator
    model: torch.nn.Module  # prepared (DDP / FSDP2 wrapped, maybe compiled)
    optimizer: AcceleratedOptimizer  # .optimizer is the torch one
    scheduler: LambdaLR
    train_loader: BlockLoader
    val_loader: BlockLoader
    tokenizer: PreTrainedTokenizerFast
    state: TrainerState  # step, tokens seen, best val loss
    ckpt: Checkpointer  # the checkpoint room's one face: resume, saves, uploads, final/
    ema: WeightEMA | None  # train.ema_decay's average of the weights, None when off
    metrics: MetricsWriter
    log: logging.Logger
    stop: StopRequest  # signals and upload failures ask for a clean stop
    report: TrainReport  # bar, scalars, eval line, summary
    vote: StopVote | None = None  # every rank agrees when to stop; set when the loop starts (its deadline)
    budget: TimeBudget | None = None  # a time budget's clock (train.time_budget_s, or a Slurm job's limit)


def build_model(cfg: RunConfig, pretrained, accelerator: Accelerator, resumed: bool, log: logging.Logger):
    """The model on this rank's device: --init-from's weights, else random ones (a resume loads its own after
    prepare(), each rank its shard); shapes only where prepare() brings rank 0's weights."""
    from configs.model import build_model as from_config
    from configs.plan import use_activation_checkpointing
    from utils.distributed import weights_come_from_rank0
    from utils.lm import checkpoint_activations

    shapes_only = weights_come_from_rank0(accelerator)
    model = pretrained.load_model() if pretrained and not resumed and not shapes_only else \
        from_config(cfg.model, shapes_only=shapes_only)
    model.set_attn_implementation(cfg.train.attention)
    if use_activation_checkpointing(cfg, accelerator, accelerator.device.type == "cuda"):
        checkpoint_activations(model)
        log.info("activation checkpointing on: each layer's activations are recomputed in the backward pass")
    if not shapes_only and not accelerator.is_fsdp2:  # prepare() places FSDP2 shards: never rank 0's full model
        model.to(accelerator.device)
    return model, shapes_only


def prepare(model, tc: TrainConfig, accelerator: Accelerator, log, budget: TimeBudget | None = None):
    """(model, optimizer, scheduler) wrapped for this world (DDP or FSDP2) and maybe compiled; with a `budget`
    the schedule follows its agreed progress."""
    import torch

    from utils.distributed import compile_layers
    from utils.optim import build_optimizer, build_scheduler
    from utils.sharding import check_prepared

    sharded = accelerator.is_fsdp2
    optimizer = build_optimizer(model, lr=tc.learning_rate, weight_decay=tc.weight_decay, betas=(tc.beta1, tc.beta2),
                                kind=tc.optimizer, muon_lr=tc.muon_lr, muon_momentum=tc.muon_momentum, sharded=sharded)
    scheduler = build_scheduler(optimizer, tc.warmup_steps, tc.max_steps, tc.min_lr_ratio, tc.lr_schedule,
                                tc.decay_fraction, progress=(lambda: budget.progress) if budget else None,
                                steps_too=bool(budget and budget.max_steps_too))
    model, optimizer = accelerator.prepare(model, optimizer)  # the scheduler stays ours: one step per optimizer step
    check_prepared(accelerator, model, sharded)  # still FSDP2 after prepare(), as the start-up line says
    if tc.compile == "on" or (tc.compile == "auto" and accelerator.device.type == "cuda"):
        if accelerator.num_processes > 1 and not accelerator.is_fsdp2:  # DDP: one graph per layer, not per bucket
            compile_layers(accelerator.unwrap_model(model), backend=tc.compile_backend)
            log.info(f"compiled each decoder layer (torch.compile, backend {tc.compile_backend})")
        else:
            model = torch.compile(model, backend=tc.compile_backend)  # after prepare(): keys carry no `_orig_mod.`
            units = check_prepared(accelerator, model, sharded)  # read through the compiled wrapper
            log.info(f"compiled the whole model after prepare() (torch.compile, backend {tc.compile_backend})"
                     + (f"; each of its {units} decoder layer(s) is still an FSDP2 unit" if units else ""))
    return model, optimizer, scheduler


def setup(cfg, pretrained, cleanup: contextlib.ExitStack, auto_batch: bool = False) -> Run:
    """Build every part of the run, in the order each depends on the last; `cleanup` undoes what needs it."""
    import torch
    import transformers
    from accelerate.utils import set_seed

    from configs.model import count_parameters
    from configs.plan import model_flops_per_token
    from utils.ckpt.checkpointer import Checkpointer, TrainerState, training_parts
    from utils.data.source import DATA_CACHE, local_dataset, make_loaders
    from utils.data.tokenizers import load_tokenizer
    from utils.distributed import rank0_decides
    from utils.run.accelerator import make_accelerator
    from utils.run.allocation import machine_folder
    from utils.ema import WeightEMA
    from utils.lm import auto_micro_batch
    from utils.optim import check_allowed, kept_rates, state_bytes
    from utils.report.metrics import MetricsWriter, peak_flops, setup_logging
    from utils.report.progress import TrainReport, log_start
    from utils.report.trackers import parse_report_to
    from utils.run import runlock
    from utils.run.budget import for_run as time_budget
    from utils.run.lifeline import GraceDeadline
    from utils.run.preemption import StopRequest
    from utils.run.run_folders import claim_run_dirs, keep_earlier_best

    s, tc = cfg.run, cfg.train
    transformers.utils.logging.disable_progress_bar()  # save_pretrained's shard bar would break our own bar
    accelerator = make_accelerator(tc.mixed_precision, torch.cuda.is_available(), s.collective_timeout_minutes,
                                   s.rendezvous_timeout_seconds)
    check_allowed(tc.optimizer, sharded=accelerator.is_fsdp2)  # before the data and the model are built
    set_seed(tc.seed)
    cleanup.callback(torch.set_float32_matmul_precision, torch.get_float32_matmul_precision())  # process-wide
    torch.set_float32_matmul_precision(tc.matmul_precision)

    data_dir = local_dataset(tc, accelerator, s.credentials, machine_folder(DATA_CACHE))  # it decides the vocabulary
    tokenizer = pretrained.load_tokenizer() if pretrained else load_tokenizer(data_dir)
    train_loader, val_loader = make_loaders(data_dir, tc, accelerator)
    cfg = replace(cfg, model=cfg.model.with_vocab(train_loader.vocab_size)).validate()
    name, run_dir, log_dir = run_dirs(cfg)
    runlock.hold_for_run(cleanup, s.output_dir, name, accelerator, s.log_dir)  # every process, while it writes
    # refused before its first step, the run takes back what it created (utils/run/run_folders.py)
    claim = claim_run_dirs(s.resume, run_dir, log_dir, accelerator.is_main_process, cleanup)
    log = setup_logging(log_dir / "training.log", accelerator.is_main_process)
    metrics = MetricsWriter(log_dir, accelerator.is_main_process, parse_report_to(s.report_to))
    cleanup.callback(metrics.close)  # on every exit path: flush TensorBoard, finish the W&B run
    budget = time_budget(tc.time_budget_s, s.grace_seconds, accelerator.is_main_process, log)
    stop = StopRequest(s.grace_seconds)
    cleanup.enter_context(GraceDeadline(stop))  # a stop that cannot finish (a peer gone) ends after the grace
    cleanup.enter_context(stop)  # from here SIGTERM/SIGINT/SIGHUP only ask for a clean stop (at the first micro-step)
    ckpt = cleanup.enter_context(Checkpointer.open(s, name, run_dir, keep_last=tc.keep_last, metrics=metrics,
                                                   best_and_final=tc.best_and_final, accelerator=accelerator, log=log))
    # rank 0 decides, before anything heavy is built, so a bad path fails fast; output_dir may be shared by machines
    resume_from = ckpt.agree(machine_folder(Path(s.output_dir) / ".remote-cache"))
    cfg, tokenizer_sha256 = ckpt.resumed_config(cfg, data_dir)
    if pretrained:
        pretrained.check_dataset(data_dir, tokenizer_sha256)
        log.info(f"--init-from {pretrained.path}: model shape from its config.json ({pretrained.describe()}), not the "
                 f"preset's model section" + ("" if resume_from else "; its weights and tokenizer, a fresh optimizer"))

    model, shapes_only = build_model(cfg, pretrained, accelerator, resume_from is not None, log)
    n_params = count_parameters(model)
    if auto_batch:
        cfg = replace(cfg, train=auto_micro_batch(cfg.train, model, accelerator, shapes_only, log))
        train_loader, val_loader = make_loaders(data_dir, cfg.train, accelerator)
    tc = cfg.train
    model, optimizer, scheduler = prepare(model, tc, accelerator, log, budget)
    log_start(log, name, cfg, train_loader, accelerator, data_dir, n_params)  # after prepare(): what runs
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    ema = WeightEMA(unwrapped, tc.ema_decay) if tc.ema_decay else None  # after prepare(): it mirrors the shards
    state = TrainerState()
    run_config = {**cfg.to_dict(), "data_tokenizer_sha256": tokenizer_sha256, "init_from": s.init_from}
    parts = training_parts(scheduler=scheduler, scaler=accelerator.scaler, loader=train_loader, trainer=state,
                           metrics=metrics, ema=ema, budget=budget)
    ckpt.attach(unwrapped, optimizer.optimizer, parts, run_config=run_config, tokenizer=tokenizer,
                optimizer_bytes=state_bytes(unwrapped, tc.optimizer),
                published="ema" if tc.best_final_weights == "ema" else None)
    if resume_from:
        asked = list(scheduler.base_lrs)
        ckpt.restore(resume_from)
        log.info(f"resumed from {resume_from} at step {state.step} ({state.tokens_seen:,} tokens seen)")
        if note := kept_rates(asked, scheduler.base_lrs):
            log.warning(note)
    if state.step >= tc.max_steps and (budget is None or budget.max_steps_too):
        raise PiconeoxError(f"--max-steps {tc.max_steps}: the resumed run is already at step {state.step}; "
                            "raise --max-steps")
    rank0_decides(lambda: metrics.start(state.step, {**run_config, "run": {
        **run_config["run"], "name": name, "data_dir": str(data_dir), "parameters": n_params,
        "world_size": accelerator.num_processes, "device": accelerator.device.type}}), accelerator.is_main_process)
    if budget:  # the last check: what start-up left of the budget
        open_budget_window(budget, cfg, unwrapped, n_params, accelerator, log)
    claim.accept()  # every check passed: from here on the run's files stay
    if accelerator.is_main_process and s.resume == "auto" and not resume_from:
        keep_earlier_best(run_dir, log)
    cuda = accelerator.device.type == "cuda"  # False with --gpus 0 even where a GPU exists
    report = TrainReport(metrics, log, total_steps=None if budget else tc.max_steps, step=state.step,
                         tokens_per_step=tc.global_batch_tokens, world=accelerator.num_processes,
                         flops_per_token=model_flops_per_token(cfg.model, tc.seq_len),
                         peak=peak_flops(torch.cuda.get_device_name() if cuda else None, tc.mixed_precision),
                         is_main=accelerator.is_main_process)
    return Run(cfg=cfg, name=name, run_dir=run_dir, log_dir=log_dir, accelerator=accelerator, model=model,
               optimizer=optimizer, scheduler=scheduler, train_loader=train_loader, val_loader=val_loader,
               tokenizer=tokenizer, state=state, ckpt=ckpt, ema=ema, metrics=metrics, log=log, stop=stop,
               report=report, budget=budget)


def open_budget_window(budget: TimeBudget, cfg: RunConfig, unwrapped, n_params: int, accelerator, log):
    """Estimate what follows the last step (an evaluation, with the EMA's a second; the sample; the save) from
    timed forward passes on every rank, then open the training window on rank 0's clock: one line on every rank
    when start-up left no time to train."""
    from utils.distributed import rank0_decides
    from utils.lm import forward_seconds

    tc, s, device = cfg.train, cfg.run, accelerator.device
    evals = 2 if tc.ema_decay else 1  # the EMA's weights are evaluated too
    # the uncompiled model: a compiled one would compile an eval graph here (its estimate errs long, not short)
    eval_s = evals * tc.eval_batches * forward_seconds(unwrapped, tc.micro_batch_size, tc.seq_len, device)
    sample_len = len(s.sample_prompt) + s.sample_tokens // 2  # the sample's average context, at most a char a token
    budget.token_s = forward_seconds(unwrapped, 1, sample_len, device) if s.sample_tokens else 0.0
    sample_s = min(s.sample_tokens * budget.token_s, SAMPLE_SHARE * budget.seconds)  # the sample shrinks to fit
    budget.plan_finish(eval_s=eval_s, sample_s=sample_s, save_s=n_params * 16 / 200e6)  # state at 200 MB/s
    rank0_decides(budget.start_training, accelerator.is_main_process)
    log.info(f"{budget.source}: start-up took {budget.spent():.1f} s ({time.process_time():.1f} CPU s); training for "
             f"{budget.stop_at() - budget.clock():.1f} s, then about {budget.reserve:.1f} s for the final evaluation "
             f"({eval_s:.1f} s), sample ({sample_s:.1f} s) and save")


# --- the loop -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepResult:
    """What one optimizer step gives the loop; both stay on the device until a log, eval or save reads them."""

    loss_sum: torch.Tensor  # the micro-steps' losses summed (their mean is loss_sum / grad_accum_steps)
    grad_norm: torch.Tensor | float  # the gradients' total norm before clipping


def train_step(run: Run, batches) -> StepResult | None:
    """One optimizer step over grad_accum_steps micro-batches, or None when the ranks agreed to stop inside it
    (the half-done step is dropped: a resume reads its batches again)."""
    import torch

    from utils import lm
    from utils.ckpt.checkpointer import rng_state, set_rng_state
    from utils.sharding import micro_step

    tc, acc = run.cfg.train, run.accelerator
    # Only a stop between micro-steps leaves a half-done step to rewind; with one micro-step there is none.
    start = (run.train_loader.state_dict(), rng_state()) if tc.grad_accum_steps > 1 else None
    loss_sum = torch.zeros((), device=acc.device)
    for micro in range(tc.grad_accum_steps):
        if run.vote():
            break
        x, y = lm.to_device(next(batches), acc.device)
        with micro_step(acc, run.model, last=micro == tc.grad_accum_steps - 1):
            with acc.autocast():
                loss = lm.lm_loss(run.model, x, y)
            acc.backward(loss / tc.grad_accum_steps)
        loss_sum += loss.detach()
    if run.vote.stopping:
        if start is not None:
            run.train_loader.load_state_dict(start[0])
            set_rng_state(start[1])
        run.optimizer.zero_grad(set_to_none=True)
        return None
    grad_norm = acc.clip_grad_norm_(run.model.parameters(), tc.grad_clip)
    run.optimizer.step()
    if run.budget is not None:  # the lr of the next step follows rank 0's clock, as every rank agreed it
        run.budget.progress = run.vote.progress
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    if run.ema is not None:
        run.ema.update()
    run.vote()  # a stop asked for during this step is agreed before the next one starts, not after it
    return StepResult(loss_sum=loss_sum, grad_norm=grad_norm)


def train(run: Run) -> str:
    """The loop: `train_step`, then whatever is due (log, eval, save). Returns why it ended."""
    import time as clock

    from utils.distributed import mesh_groups, shorten_timeout, timeouts_line
    from utils.run.budget import describe
    from utils.run.preemption import StopVote

    tc, state, budget = run.cfg.train, run.state, run.budget
    deadline = clock.time() + tc.max_training_hours * 3600 - state.train_seconds if tc.max_training_hours else math.inf
    # Signals on any rank, the time limit and a budget's progress on rank 0's clock; a hung rank fails the vote as
    # fast as a step.
    run.vote = StopVote(run.stop, run.accelerator, deadline, timedelta(minutes=run.cfg.run.step_timeout_minutes),
                        progress=budget.progress_at if budget and run.accelerator.is_main_process else None)
    first_step = state.step + 1  # compiled and warmed up after this one: collectives get the short timeout
    limit = math.inf if budget and not budget.max_steps_too else tc.max_steps
    batches = iter(run.train_loader)
    run.model.train()
    while state.step < limit:
        t0 = clock.time()
        if reason := run.ckpt.poll(state.step):  # too many failed saves: a stop that the vote spreads to all ranks
            run.stop.request(reason)
        result = train_step(run, batches)
        if result is None:
            break
        state.step += 1
        state.tokens_seen += tc.global_batch_tokens
        state.train_seconds += clock.time() - t0
        if budget is not None:
            budget.note_step(clock.time() - t0)
        run.report.bar.update(1)
        if state.step % GC_EVERY == 0:
            gc.collect(1)
        if state.step == first_step and run.accelerator.num_processes > 1:
            mesh = mesh_groups(run.model)
            shorten_timeout(run.cfg.run.step_timeout_minutes, mesh.values())
            run.log.info(timeouts_line(run.accelerator, run.vote.group, run.ckpt.saver_group, first_step + 1, mesh))
        last = state.step == limit or (budget is not None and budget.progress >= 1.0)  # the vote agreed it
        log_due = state.step % tc.log_every == 0 or last
        eval_due = state.step % tc.eval_every == 0 or last
        save_due = state.step % tc.save_every == 0
        if not (log_due or eval_due or save_due):
            continue  # no host sync on other steps: the GPU keeps its queue of work
        loss = read_loss(run, result.loss_sum)
        run.report.loss_read(state.step, loss, run.scheduler.get_last_lr()[0], result.grad_norm, log_due)
        if eval_due and (ended := evaluate(run, loss)) is not None:
            return ended
        if save_due:
            run.ckpt.save(state.step)
        if eval_due or save_due:
            run.report.speed.restart(state.step)
        if last and budget is not None and budget.progress >= 1.0:
            return f"time budget of {describe(budget.seconds)} reached"
    return "max steps reached"


def evaluate(run: Run, loss: float) -> str | None:
    """Val loss of the weights (and of their EMA), best/ when the published ones improved; a reason to end the
    loop (early stopping, or the ranks agreed to stop inside the evaluation), else None."""
    from utils import lm

    acc, tc, state = run.accelerator, run.cfg.train, run.state

    def val_loss():
        return lm.evaluate(run.model, run.val_loader.eval_batches(tc.eval_batches), acc.device,
                           autocast=acc.autocast, vote=run.vote, reduce=lambda t: acc.reduce(t, "mean"))

    started = time.monotonic()
    val, ema_val = val_loss(), None
    if val is not None and run.ema is not None:
        with run.ema.swapped_in():
            ema_val = val_loss()
    if run.budget is not None:  # the final evaluation will cost what this one did
        run.budget.plan_finish(eval_s=time.monotonic() - started)
    if val is None or (run.ema is not None and ema_val is None):
        return "stopped during an evaluation"  # `finish` says why (a signal, the time limit)
    judged = ema_val if tc.best_final_weights == "ema" else val  # best/ follows the weights it publishes
    improved = judged < state.best_val_loss
    state.best_val_loss = min(judged, state.best_val_loss)
    state.evals_without_improvement = 0 if improved else state.evals_without_improvement + 1
    run.report.evaluated(state.step, loss, val, improved, state.evals_without_improvement, state.best_val_loss,
                         ema=ema_val)
    if improved and tc.best_and_final:
        run.ckpt.save_best(state.step)
    if tc.patience and state.evals_without_improvement >= tc.patience:
        return f"early stopping: no val improvement in {tc.patience} evaluations"
    return None


def read_loss(run: Run, loss_sum) -> float:
    """The step's mean loss over ranks (a host sync); a NaN or inf stops the run and names the step."""
    from utils.lm import TrainingDiverged

    loss = run.accelerator.reduce(loss_sum / run.cfg.train.grad_accum_steps, "mean").item()
    if not math.isfinite(loss):
        raise TrainingDiverged(f"loss is {loss} at step {run.state.step}; stopped without saving "
                               f"(the last good checkpoint is {run.ckpt.latest() or 'none'})")
    return loss


# --- the end ------------------------------------------------------------------------------------------------

def finish(run: Run, reason: str) -> int:
    """Save the last step, sample while the saves flush, publish final/ and say where everything is."""
    import torch

    from utils.distributed import rank0_decides
    from utils.report.summary import log_sample, next_commands, where_things_are

    run.report.close()
    run.vote.close()
    tc, state, stop, log = run.cfg.train, run.state, run.stop, run.log
    preempted = run.vote.stopping and not run.vote.time_up  # a signal or upload failures: the grace budget applies
    if run.vote.time_up:
        reason = f"time limit of {tc.max_training_hours:g} h reached"
    elif preempted:
        reason = f"{stop.reason}; stopped cleanly"
        log.info(f"{stop.reason}: saving step {state.step} and flushing uploads (grace {stop.grace_seconds:g} s)")
    sample, tokens = [], run.cfg.run.sample_tokens
    if run.budget is not None and tokens and not preempted:  # as many as the budget has room for, rank 0 decides
        tokens = rank0_decides(lambda: run.budget.sample_tokens(tokens), run.accelerator.is_main_process)
    deadline = None  # and where no forward is a collective, it also ends when the budget's time does
    if run.budget is not None and not run.accelerator.is_fsdp2:
        deadline = run.budget.sample_deadline()

    def sample_text():  # a preempted run has no time for a sample; otherwise it overlaps the upload flush
        if not preempted and tokens:
            model = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
            sample.append(log_sample(model, run.tokenizer, run.cfg.run.sample_prompt, tokens, tc.seed, log, deadline,
                                     None if run.accelerator.is_fsdp2 else lambda: stop.requested))

    stop.doing = lambda: f"saving step {state.step} ({run.ckpt.phase or 'copying its state'})"
    code = run.ckpt.finish(state.step, consolidate=not preempted, timeout=stop.remaining, meanwhile=sample_text)
    stop.saved, stop.doing = code, "writing the closing lines"
    if run.accelerator.is_main_process:
        cuda = run.accelerator.device.type == "cuda"
        run.report.summary(state.step, reason, state.best_val_loss, run.log_dir, sample[0] if sample else None,
                           torch.cuda.max_memory_allocated() / 1e9 if cuda else None, plot=not preempted)
        run.metrics.close()
    stop.outcome = code  # the run has ended: a signal from here on (a late Ctrl-C) changes nothing...
    if run.accelerator.is_main_process:  # ...so the lines that say so come after it
        log.info(where_things_are(run.run_dir, run.log_dir, run.cfg.run.log_dir))
        log.info(next_commands(run.cfg.preset, run.run_dir, stopped=run.vote.stopping,
                               last=None if tc.best_and_final else run.ckpt.step_folder(state.step)))
    if run.budget is not None and run.accelerator.is_main_process:
        log.info(f"{run.budget.source}: {run.budget.spent():.1f} s of the {run.budget.seconds:g} s budget used, "
                 f"start-up and final save included (this process: {run.budget.clock() - run.budget.started:.1f} s)")
    stop.doing = "waiting for the other processes to leave the process group"
    run.accelerator.wait_for_everyone()  # tear the process group down together: a rank leaving alone can abort
    run.accelerator.end_training()
    return code


def run(args) -> int:
    """--preflight, --print-plan, or a training run; `cleanup` closes the checkpointer (a flush) and the signal
    handlers on every exit path."""
    from configs.presets import resolve_config

    cfg, pretrained = with_init_from(resolve_config(args.config, args.config_file, overrides_from_args(args)))
    if args.preflight:
        from utils.preflight import preflight

        synced = preflight(cfg, pretrained, run_dirs(cfg), args.processes)
        if synced is not None:
            print(synced)  # start_training.sh passes this folder as the run's --data
        return 0
    if args.print_sharding:
        from configs.plan import default_sharding

        print(default_sharding(cfg, args.gpus))
        return 0
    if args.print_plan:
        from configs.plan import format_plan, launch_refusal, plan

        if why := launch_refusal(cfg, args.gpus):  # the plan of a run the launch refuses would mislead
            raise PiconeoxError(why)
        print(format_plan(plan(cfg, gpus=args.gpus, machines=args.machines), cfg.train.time_budget_s))
        return 0
    with contextlib.ExitStack() as cleanup:
        r = setup(cfg, pretrained, cleanup, auto_batch=args.micro_batch_size == "auto")
        # Automatic gc would run at a different moment on every rank, and the others wait for it in the next
        # collective: the loop collects at the same steps everywhere instead (torchtitan does the same).
        gc.disable()
        cleanup.callback(gc.enable)
        return finish(r, train(r))


@cli
def main(argv=None) -> int:
    from utils.run.rendezvous import main_started

    main_started()  # a stop signal from here on is a KeyboardInterrupt that `cli` reports, after the cleanup
    return run(parse_args(argv, __doc__))


if __name__ == "__main__":
    from utils.run.lifeline import bind_worker

    bind_worker()  # SIGTERM (a clean stop) when the process that started this one dies
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_process(main())
