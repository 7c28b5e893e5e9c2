"""train.py end to end on CPU: learning, exact resume, checkpoints, limits and bad input."""
import json
import shutil

import pytest
import torch

import train
from tests.support.training import SAMPLE, TINY, run
from utils.ckpt.format import (
    DCP_INDEX,
    MARKER,
    check_complete,
    latest_complete,
    manifest,
    rotate,
    step_dir_name,
    step_folders,
    write_marker,
)
from utils.ckpt.parts import Registry, TrainerState, training_parts
from utils.ckpt.write import write_shards

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # each in-process run builds its own Accelerator


def test_loss_falls_and_outputs_exist(tmp_path, tiny_data):
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "30", "--eval-every", "10", "--save-every", "10",
                                *SAMPLE)
    assert code == 0 and len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    logs = tmp_path / "logs" / "run"
    log = (logs / "training.log").read_text()
    assert log.count("perplexity") == 3
    assert "sample:\nOnce upon a time" in log
    assert any(p.name.startswith("events.out.tfevents") for p in logs.rglob("*"))
    assert (logs / "loss.png").stat().st_size > 1000
    assert [s for s, _ in step_folders(run_dir)] == [10, 20, 30]
    for folder in ("best", "final", "step-00000030"):
        assert check_complete(run_dir / folder) is None


def test_eager_attention_and_medium_matmul_precision_learn_what_the_defaults_learn(tmp_path, tiny_data):
    """shakespeare-char's speed settings change how the math runs, not what the model learns."""
    _, default, _ = run(tmp_path / "a", tiny_data, "--max-steps", "6")
    code, fast, _ = run(tmp_path / "b", tiny_data, "--max-steps", "6", "--set", "train.attention=eager",
                        "--set", "train.matmul_precision=medium")
    assert code == 0 and len(fast) == 6
    assert fast == pytest.approx(default, abs=2e-2)  # bfloat16 products where a CPU has AMX
    log = (tmp_path / "b" / "logs" / "run" / "training.log").read_text()
    assert "math: eager attention, float32 matmul precision medium, mixed precision no" in log
    assert torch.get_float32_matmul_precision() == "highest"  # the run restores the process-wide setting


def test_resume_gives_the_losses_of_an_uninterrupted_run(tmp_path, tiny_data):
    """8 steps straight vs the same run stopped after its step-4 checkpoint and resumed: identical losses."""
    common = ("--max-steps", "8", "--save-every", "4", "--eval-every", "2")
    _, straight, run_dir = run(tmp_path, tiny_data, *common)
    for folder in ("step-00000008", "final", "best"):  # as if it had died right after saving step 4
        shutil.rmtree(run_dir / folder)
    code, resumed, _ = run(tmp_path, tiny_data, *common, "--resume", "auto")
    assert code == 0 and len(straight) == 8
    assert len(resumed) == 8  # history.json keeps steps 1-4 and appends the resumed 5-8
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert f"resumed from {run_dir / 'step-00000004'} at step 4" in log  # a fresh start would give the same losses
    assert max(abs(a - b) for a, b in zip(resumed[4:], straight[4:])) < 1e-6


def test_best_and_final_load_with_auto_classes_and_generate(trained, tiny_data):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from utils.generate import main as generate_main
    from utils.generate import sample_text

    run_dir = trained / "ckpt" / "run"
    for folder in ("best", "final"):
        model = AutoModelForCausalLM.from_pretrained(run_dir / folder)
        tok = AutoTokenizer.from_pretrained(run_dir / folder)
        text = sample_text(model, tok, "Once upon a time", max_new_tokens=20, seed=1)
        assert text.startswith("Once upon a time") and len(text) > len("Once upon a time")
    # final/ is also resumable (the sharded state of its step); best/ holds weights only
    assert (run_dir / "final" / DCP_INDEX).exists() and not (run_dir / "best" / DCP_INDEX).exists()
    assert generate_main([str(run_dir / "final"), "--eval-data", str(tiny_data), "--eval-batches", "2"]) == 0
    assert generate_main([str(run_dir), "--max-new-tokens", "3"]) == 0  # a run directory means its best/
    assert generate_main([str(run_dir / "nope")]) == 2


def test_checkpoint_of_compiled_model_loads_into_plain_model(tmp_path, tiny_data):
    from accelerate import Accelerator

    from configs.model import MODEL_PRESETS, build_model
    from utils.data.loader import BlockLoader
    from utils.data.tokenizers import load_tokenizer
    from utils.optim import build_optimizer, build_scheduler
    from utils.report.metrics import MetricsWriter

    cfg = MODEL_PRESETS["rp2040-speed"]
    accelerator = Accelerator(cpu=True)
    model = build_model(cfg)
    model, optimizer = accelerator.prepare(model, build_optimizer(model, 1e-3, 0.1, (0.9, 0.95)))
    compiled = torch.compile(model, backend="eager")  # the real inductor costs ~1 min on CPU; the wrapper is the same
    unwrapped = accelerator.unwrap_model(compiled, keep_torch_compile=False)
    loader = BlockLoader(tiny_data, "train", 16, 2)
    parts = training_parts(scheduler=build_scheduler(optimizer, 1, 10, 0.1), scaler=None, loader=loader,
                           trainer=TrainerState(), metrics=MetricsWriter(tmp_path, True))
    snap = Registry(unwrapped, optimizer.optimizer, parts, run_config={},
                    tokenizer=load_tokenizer(tiny_data)).capture(1)
    folder = tmp_path / "step-00000001"
    write_marker(folder, 1, 1, manifest(folder, write_shards(snap, folder)))
    from torch.distributed.checkpoint import FileSystemReader

    from utils.ckpt.load import load_model

    keys = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    assert "model.gpt_neox.embed_in.weight" in keys and not [k for k in keys if "_orig_mod" in k]
    plain = load_model(folder)
    assert type(plain).__name__ == "GPTNeoXForCausalLM"
    assert torch.equal(plain.gpt_neox.embed_in.weight, unwrapped.gpt_neox.embed_in.weight)


def test_time_limit_saves_and_exits_zero(tmp_path, tiny_data):
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "100000", "--max-training-hours", "0.0001")
    assert code == 0 and 0 < len(losses) < 100000
    assert check_complete(run_dir / "final") is None
    assert "time limit of 0.0001 h reached" in (tmp_path / "logs" / "run" / "training.log").read_text()


def test_early_stopping(tmp_path, tiny_data):
    # An lr of 1e-12 cannot move float32 weights, so the val loss never improves after the first eval.
    code, losses, _ = run(tmp_path, tiny_data, "--max-steps", "50", "--eval-every", "2", "--patience", "2",
                          "--lr", "1e-12")
    assert code == 0 and len(losses) == 6
    assert "early stopping" in (tmp_path / "logs" / "run" / "training.log").read_text()


def test_batch_8_equals_batch_4_with_accumulation_2(tmp_path, tiny_data):
    _, big, _ = run(tmp_path / "a", tiny_data, "--max-steps", "6", "--batch-size", "8")
    _, accum, _ = run(tmp_path / "b", tiny_data, "--max-steps", "6", "--batch-size", "4", "--grad-accum", "2")
    assert max(abs(a - b) for a, b in zip(big, accum)) < 1e-4


def test_lr_schedule_at_known_steps(tmp_path, tiny_data):
    from utils.optim import warmup_cosine

    f = warmup_cosine(warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    run(tmp_path, tiny_data, "--max-steps", "8", "--warmup-steps", "4", "--lr", "1e-3")
    history = json.loads((tmp_path / "logs" / "run" / "history.json").read_text())
    lrs = [r["train/lr"] for r in history if "train/lr" in r]
    # the lr logged after optimizer step s is the one the next step uses: factor(s)
    assert lrs[:4] == pytest.approx([1e-3 * f for f in (0.5, 0.75, 1.0, 1.0)])


@pytest.mark.parametrize("extra,message", [
    (["--config", "nope"], "unknown preset 'nope'; valid presets: rp2040-speed"),
    (["--max-steps", "-3"], "train.max_steps=-3: must be a positive integer"),
    (["--set", "train.nope=1"], "unknown train setting 'nope'"),
    (["--resume", "/nonexistent/run"], "--resume /nonexistent/run: no such checkpoint or run directory"),
    (["--mixed-precision", "fp16"], "fp16 needs a CUDA GPU"),
    (["--sample-tokens", "-1"], "run.sample_tokens=-1: must be an integer >= 0"),
])
def test_bad_input_is_one_line(tmp_path, tiny_data, capsys, extra, message):
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "2", *extra)
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and err.startswith("error: ") and "Traceback" not in err


def test_bad_data_and_resume_targets(tmp_path, tiny_data, capsys):
    assert run(tmp_path, tmp_path / "missing")[0] == 2
    assert "no such directory" in capsys.readouterr().err
    # byte tokenizer (256) into a model whose vocab is set below it
    assert run(tmp_path, tiny_data, "--max-steps", "2", "--set", "model.vocab_size=100")[0] == 2
    assert "model.vocab_size=100 is smaller than the dataset tokenizer's 256" in capsys.readouterr().err
    _, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "2", "--save-every", "2")
    (run_dir / "step-00000002" / MARKER).unlink()
    assert run(tmp_path, tiny_data, "--max-steps", "4", "--resume", str(run_dir / "step-00000002"))[0] == 2
    assert "has no COMPLETE marker" in capsys.readouterr().err
    assert run(tmp_path, tiny_data, "--max-steps", "4", "--resume", str(run_dir / "best"))[0] == 2
    assert "a weights-only checkpoint (best/); resume from a step-XXXXXXXX or final/ folder" in capsys.readouterr().err
    assert run(tmp_path, tiny_data, "--max-steps", "4", "--resume", str(run_dir / "final"),
               "--set", "model.intermediate_size=96")[0] == 2
    assert "checkpoint has model.intermediate_size=64, this run has 96" in capsys.readouterr().err


def test_nan_loss_stops_and_names_the_step(tmp_path, tiny_data, capsys):
    code, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "30", "--save-every", "1", "--lr", "10",
                           "--warmup-steps", "0", "--set", "train.grad_clip=1e30", "--set", "train.weight_decay=1e30")
    err = capsys.readouterr().err
    assert code == 2 and "at step" in err and "stopped without saving" in err
    assert latest_complete(run_dir) is not None  # the last good checkpoint is kept
    assert not (run_dir / "final").exists()


def test_print_plan_for_production_on_8_gpus_allocates_nothing(capsys):
    assert train.main(["--config", "production", "--print-plan", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "1,414,647,808" in out and "524,288 tokens/step" in out and "FSDP" in out


def test_resume_refuses_data_with_another_tokenizer(tmp_path, tiny_data, char_data, capsys):
    _, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "2", "--save-every", "2")
    other = char_data
    code = train.main([*TINY, "--data", str(other), "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
                       str(tmp_path / "logs"), "--run-name", "run", "--max-steps", "4", "--resume",
                       str(run_dir / "step-00000002"), "--set", "model.vocab_size=256"])
    err = capsys.readouterr().err
    assert code == 2 and "is not the tokenizer the model was trained with" in err


def test_activation_checkpointing_gives_the_same_losses(tmp_path, tiny_data):
    _, off, _ = run(tmp_path / "off", tiny_data, "--max-steps", "5")
    _, on, _ = run(tmp_path / "on", tiny_data, "--max-steps", "5", "--set", "train.activation_checkpointing=on")
    assert "activation checkpointing on" in (tmp_path / "on" / "logs" / "run" / "training.log").read_text()
    assert max(abs(a - b) for a, b in zip(on, off)) < 1e-5
    _, auto, _ = run(tmp_path / "auto", tiny_data, "--max-steps", "2", "--set", "train.activation_checkpointing=auto")
    assert "activation checkpointing on" not in (tmp_path / "auto" / "logs" / "run" / "training.log").read_text()


def test_production_turns_activation_checkpointing_on_for_small_gpus():
    from configs.plan import GIB, needs_activation_checkpointing, plan
    from configs.presets import resolve_config

    cfg = resolve_config("production")
    assert cfg.train.activation_checkpointing == "auto"
    p = plan(cfg, gpus=8)  # DDP ~44.5 GiB, FSDP ~28.7 GiB per GPU without checkpointing (the fuller count)
    assert needs_activation_checkpointing(p, sharded=False, device_bytes=40 * GIB)
    assert not needs_activation_checkpointing(p, sharded=False, device_bytes=80 * GIB)
    assert needs_activation_checkpointing(p, sharded=True, device_bytes=16 * GIB)
    assert not needs_activation_checkpointing(p, sharded=True, device_bytes=40 * GIB)


def test_cpu_fallbacks_are_reported(tmp_path, tiny_data):
    """--batch-size auto, MFU and GPU stats need CUDA: on CPU the run goes on and says so."""
    code, losses, _ = run(tmp_path, tiny_data, "--max-steps", "2", "--eval-every", "2", "--batch-size", "auto")
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert code == 0 and len(losses) == 2
    assert "--batch-size auto: micro batch 8 (no CUDA: the preset's size; auto needs a GPU to measure)" in log
    assert "MFU n/a, GPU n/a" in log
    assert "sample:" not in log  # --sample-tokens 0 (run()'s): no end-of-run sample


def test_rotate_also_removes_leftovers_of_interrupted_writes(tmp_path):
    for step in (1, 2, 3):
        folder = tmp_path / step_dir_name(step)
        folder.mkdir()
        (folder / MARKER).write_text(json.dumps({"step": step, "files": {}}))
    (tmp_path / ".step-00000001.tmp").mkdir()  # a write killed half-way
    (tmp_path / ".step-00000003.tmp").mkdir()  # newer than the cutoff: kept
    rotate(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-00000003.tmp", "step-00000002", "step-00000003"]


def test_data_as_a_file_url(tmp_path, tiny_data):
    """README promises that any dataset location may be a file:///path."""
    code, losses, _ = run(tmp_path, f"file://{tiny_data}", "--max-steps", "2", "--eval-every", "2")
    assert code == 0 and len(losses) == 2
