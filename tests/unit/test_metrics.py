"""utils/report/metrics.py: log file, TensorBoard events, history.json, loss plot, progress bar, FLOPs/MFU,
GPU stats."""
import json
import logging

import pytest
import torch

from configs.model import MODEL_PRESETS, PRODUCTION, build_model, count_parameters
from configs.plan import matmul_params, model_flops_per_token
from utils.report.metrics import MetricsWriter, gpu_stats, mfu, peak_flops, setup_logging
from utils.report.progress import ProgressBar


def read_scalars(log_dir, key):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, pytest.approx(e.value)) for e in acc.Scalars(key)]


def test_logging_goes_to_console_and_file_on_main_only(tmp_path, capsys):
    log = setup_logging(tmp_path / "logs" / "training.log", is_main=True)
    log = setup_logging(tmp_path / "logs" / "training.log", is_main=True)  # again: no duplicate handlers
    log.info("step 1 loss 2.5")
    lines = (tmp_path / "logs" / "training.log").read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith("INFO step 1 loss 2.5")
    assert capsys.readouterr().err.count("step 1 loss 2.5") == 1

    other = setup_logging(tmp_path / "rank1" / "training.log", is_main=False)
    other.info("not shown")
    other.warning("shown")
    assert not (tmp_path / "rank1").exists()
    assert capsys.readouterr().err.strip().endswith("WARNING shown")
    logging.getLogger("piconeox").handlers.clear()


def test_writer_makes_tensorboard_events_history_and_plot(tmp_path):
    w = MetricsWriter(tmp_path / "tb", is_main=True)
    for step, loss in [(10, 5.0), (20, 4.0), (30, 3.5)]:
        w.scalars(step, {"train/loss": loss, "train/lr": 1e-3, "gpu/util_pct": None})
    w.scalars(30, {"val/loss": 3.7, "val/perplexity": 40.4})
    w.save_history(tmp_path / "history.json")
    w.plot(tmp_path / "loss.png")
    w.close()

    assert read_scalars(tmp_path / "tb", "train/loss") == [(10, 5.0), (20, 4.0), (30, 3.5)]
    assert read_scalars(tmp_path / "tb", "val/perplexity") == [(30, 40.4)]
    history = json.loads((tmp_path / "history.json").read_text())
    assert history[0] == {"step": 10, "train/loss": 5.0, "train/lr": 1e-3}  # None was skipped
    assert history[-1] == {"step": 30, "val/loss": 3.7, "val/perplexity": 40.4}
    from matplotlib.image import imread

    assert imread(tmp_path / "loss.png").shape[:2] == (500, 800)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json", "loss.png", "tb"]  # no temp files left


def test_other_ranks_write_nothing(tmp_path):
    w = MetricsWriter(tmp_path / "tb", is_main=False)
    w.scalars(1, {"train/loss": 1.0})
    w.save_history(tmp_path / "history.json")
    w.plot(tmp_path / "loss.png")
    w.close()
    assert list(tmp_path.iterdir()) == [] and w.history == []


def test_resume_restores_history_and_purges_events_of_the_interrupted_run(tmp_path):
    first = MetricsWriter(tmp_path, is_main=True)
    first.scalars(10, {"train/loss": 5.0})
    state = first.state_dict()  # saved with the step-10 checkpoint
    first.scalars(20, {"train/loss": 4.0})  # logged, then the run died before its next checkpoint
    first.close()

    resumed = MetricsWriter(tmp_path, is_main=True)
    resumed.load_state_dict(state)
    resumed.scalars(20, {"train/loss": 4.5})
    resumed.close()
    assert [h["step"] for h in resumed.history] == [10, 20]
    assert read_scalars(tmp_path, "train/loss") == [(10, 5.0), (20, 4.5)]


def test_progress_bar_shows_postfix_rate_and_na(capsys):
    bar = ProgressBar(total_steps=100, initial_step=40, is_main=True)
    bar.update(2, loss=2.34567, avg_loss=2.5, lr=3e-4, tok_s=12345.6)
    bar.close()  # the final render shows the last postfix
    err = capsys.readouterr().err
    assert "42/100" in err and "step/s" in err
    assert "loss=2.3457, avg=2.5000, lr=3.00e-04, tok/s=12,346" in err

    bar = ProgressBar(total_steps=100, initial_step=0, is_main=True)
    bar.update(1, loss=2.3, tok_s=None)
    bar.close()
    assert "tok/s=n/a" in capsys.readouterr().err

    quiet = ProgressBar(total_steps=10, initial_step=0, is_main=False)
    quiet.update(1, loss=1.0)
    quiet.close()
    assert capsys.readouterr().err == ""


def test_production_flops_per_token_by_hand():
    h, L, i, V, T = 2048, 24, 8192, 50304, 2048
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    assert per_layer == 50_358_272
    n = L * per_layer + 2 * h + V * h  # blocks + final norm + lm_head; the input embedding is a lookup
    assert n == 1_311_625_216
    assert matmul_params(PRODUCTION) == n
    assert model_flops_per_token(PRODUCTION, T) == 6 * n + 12 * L * h * T == 9_077_710_848


@pytest.mark.parametrize("name", [n for n in MODEL_PRESETS if n != "production"])
def test_matmul_params_match_the_real_model(name):
    cfg = MODEL_PRESETS[name].with_vocab(256)
    with torch.device("meta"):
        model = build_model(cfg)
    embedding = cfg.vocab_size * cfg.hidden_size
    # untied: everything but embed_in; tied: lm_head is embed_in, counted once, and it is a matmul
    expected = count_parameters(model) - (0 if cfg.tie_word_embeddings else embedding)
    assert matmul_params(cfg) == expected


@pytest.mark.parametrize("device, precision, peak", [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H100 PCIe", "fp16", 756e12),
    ("NVIDIA H200", "bf16", 989e12),
    ("NVIDIA GH200 480GB", "bf16", 989e12),
    ("NVIDIA H800", "bf16", 989e12),
    ("NVIDIA H800 PCIe", "bf16", 756e12),
    ("NVIDIA L4", "bf16", 121e12),
    ("NVIDIA L40S", "bf16", 362e12),
    ("NVIDIA GeForce RTX 4090", "bf16", 165e12),
    ("Tesla V100-SXM2-16GB", "fp16", 125e12),
    ("Tesla V100-SXM2-16GB", "bf16", None),  # no bf16 tensor cores
    ("NVIDIA A100-SXM4-80GB", "no", None),  # fp32: no fair tensor-core peak
    ("Some Future GPU", "bf16", None),
    (None, "bf16", None),  # CPU
])
def test_peak_flops_table(device, precision, peak):
    assert peak_flops(device, precision) == peak


def test_mfu_by_hand_and_unknown_peak():
    fpt = model_flops_per_token(PRODUCTION, 2048)
    assert mfu(3000.0, fpt, 312e12) == pytest.approx(3000 * 9_077_710_848 / 312e12)  # ~0.087 on an A100
    assert mfu(3000.0, fpt, None) is None


def test_gpu_stats_without_cuda_are_none():
    assert not torch.cuda.is_available()
    assert gpu_stats() == {"gpu/util_pct": None, "gpu/mem_gb": None}
