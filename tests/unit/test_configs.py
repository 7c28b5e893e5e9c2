"""Presets, overrides and validation of configs/."""
import pytest
import torch

from configs.model import MODEL_PRESETS, build_model, count_parameters
from configs.presets import PRESET_NAMES, resolve_config
from utils.errors import PiconeoxError

SMALL_PRESETS = [n for n in PRESET_NAMES if n != "production"]


@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_position_changes_logits(name):
    """Every preset must really encode position: the same tokens at other distances give other logits.

    RoPE is relative, so a uniform shift changes nothing; stretching the distances must.
    """
    cfg = MODEL_PRESETS[name].with_vocab(65)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 8))
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=torch.arange(8)[None]).logits
        b = model(input_ids=ids, position_ids=torch.arange(8)[None] * 3).logits
    assert cfg.rotary_dims >= 2
    assert (a - b).abs().max().item() > 1e-4


def test_rp2040_parameter_counts_match_measured_shapes():
    names = ("rp2040-speed", "rp2040-optimized", "rp2040-quality", "pico-fast", "pico-best")
    counts = {n: count_parameters(build_model(MODEL_PRESETS[n])) for n in names}
    assert counts == {"rp2040-speed": 9248, "rp2040-optimized": 18152, "rp2040-quality": 53448,
                      "pico-fast": 19560, "pico-best": 46448}


@pytest.mark.parametrize("preset", ["shakespeare-char-fast", "shakespeare-char-best"])
def test_time_to_quality_presets_train_on_the_same_data_and_windows_with_a_cheaper_model(preset):
    """shakespeare_char.sh scores these presets against nanoGPT on the same 64-token val windows: the recipes
    may change the model, optimizer and schedule, not the data, tokenizer, window or batch."""
    like, fast = resolve_config("shakespeare-char", None, {}), resolve_config(preset, None, {})
    same = ("data", "tokenizer", "seq_len", "micro_batch_size", "grad_accum_steps", "beta2", "matmul_precision",
            "attention")
    assert [getattr(fast.train, k) for k in same] == [getattr(like.train, k) for k in same]
    assert fast.model.max_position_embeddings == like.model.max_position_embeddings == like.train.seq_len
    cheaper = count_parameters(build_model(fast.model.with_vocab(66))) < count_parameters(
        build_model(like.model.with_vocab(66)))
    assert cheaper and fast.train.max_steps < like.train.max_steps and fast.train.optimizer == "muon"
    assert fast.train.learning_rate > like.train.learning_rate
    assert fast.model.rotary_dims == fast.model.head_dim  # RoPE on every dim: the lever that paid most per step
    assert fast.train.max_steps % fast.train.save_every == 0  # its last step is a full, resumable checkpoint


def test_production_shape_on_meta_device():
    with torch.device("meta"):
        model = build_model(MODEL_PRESETS["production"])
    assert count_parameters(model) == 1_414_647_808
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.25


def test_yaml_and_overrides_apply_in_order(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model:\n  num_layers: 3\ntrain:\n  max_steps: 50\n  learning_rate: 0.002\n")
    cfg = resolve_config("test", str(f), {"train.max_steps": "70", "model.dropout": "0.1"})
    got = (cfg.model.num_layers, cfg.train.max_steps, cfg.train.learning_rate, cfg.model.dropout)
    assert got == (3, 70, 0.002, 0.1)


@pytest.mark.parametrize("preset,overrides,message", [
    ("nope", {}, "unknown preset 'nope'; valid presets: rp2040-speed"),
    ("test", {"model.num_heads": "3"}, "model.num_heads=3 does not divide model.hidden_size=128"),
    ("rp2040-speed", {"model.rotary_pct": "0.25"}, "gives 0 rotary dims"),
    ("test", {"train.seq_len": "4096"}, "train.seq_len=4096 is longer than model.max_position_embeddings=256"),
    ("test", {"train.max_steps": "0"}, "train.max_steps=0: must be a positive integer"),
    ("test", {"model.vocab_multiple": "0"}, "model.vocab_multiple=0: must be a positive integer"),
    ("test", {"train.max_steps": "ten"}, "train.max_steps='ten': expected int"),
    ("test", {"train.bogus": "1"}, "unknown train setting 'bogus'"),
    ("test", {"train.mixed_precision": "fp8"}, "allowed no, fp16, bf16"),
    ("test", {"train.matmul_precision": "low"}, "train.matmul_precision='low': allowed highest, high, medium"),
    ("test", {"train.attention": "flash"}, "train.attention='flash': allowed sdpa, eager"),
    ("test", {"train.compile_backend": "aot"}, "train.compile_backend='aot': allowed inductor, aot_eager"),
    ("test", {"optim.lr": "1"}, "expected model.<name>=<value> or train.<name>=<value>"),
])
def test_impossible_settings_fail_with_one_line(preset, overrides, message):
    with pytest.raises(PiconeoxError) as e:
        resolve_config(preset, None, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_vocab_smaller_than_tokenizer_is_refused():
    with pytest.raises(PiconeoxError, match="model.vocab_size=256 is smaller than the dataset tokenizer's 257"):
        MODEL_PRESETS["rp2040-speed"].with_vocab(257)
    assert MODEL_PRESETS["test"].with_vocab(257).vocab_size == 320  # rounded up to a multiple of 64


def test_bad_yaml_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model: [unclosed\n")
    with pytest.raises(PiconeoxError, match="is not valid YAML"):
        resolve_config("test", str(f))
    with pytest.raises(PiconeoxError, match="does not exist"):
        resolve_config("test", str(tmp_path / "missing.yaml"))


def test_global_batch_fixes_accumulation_per_world_size():
    from configs.training import TrainConfig

    tc = TrainConfig(seq_len=32, micro_batch_size=4, global_batch_tokens=512)
    assert [tc.for_world(w).grad_accum_steps for w in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(PiconeoxError, match="512 is not a whole multiple of .* = 4 x 32 x 8 = 1,024"):
        tc.for_world(8)
    with pytest.raises(PiconeoxError,
                       match="grad_accum_steps=3 disagrees with train.global_batch_tokens=512, which needs 2"):
        TrainConfig(seq_len=32, micro_batch_size=4, grad_accum_steps=3, global_batch_tokens=512).for_world(2)
    # Unset: the batch at the run's start (micro x accum x seq x world), then kept by a resume elsewhere.
    started = TrainConfig(seq_len=32, micro_batch_size=4, grad_accum_steps=1).for_world(2)
    assert started.global_batch_tokens == 256
    assert TrainConfig(seq_len=32, micro_batch_size=4).for_world(1, fixed_global_batch=256).grad_accum_steps == 2
    with pytest.raises(PiconeoxError, match="checkpoint trained with 256 tokens per step"):
        tc.for_world(1, fixed_global_batch=256)
    assert TrainConfig(seq_len=32, global_batch_tokens=32 * 12).largest_micro_batch(world_size=2, limit=5) == 3


