"""configs/plan.py: the 1.2B plan on 8 GPUs from the meta device, checked against hand calculations."""
import resource

import pytest

from configs.plan import format_plan, needs_activation_checkpointing, plan
from configs.presets import resolve_config
from utils.errors import PiconeoxError

P, LAYER = 1_414_647_808, 50_358_272  # Pythia-1.4B shape, untied (STACK_NOTES.md)


@pytest.fixture(scope="module")
def production_plan():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    p = plan(resolve_config("production"), gpus=8)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 1024**2, f"peak RSS grew {grown / 1024**2:.1f} GiB: weights were allocated"  # fp32 would be 5.3 GiB
    return p


def test_production_on_8_gpus_counts_and_tokens(production_plan):
    p = production_plan
    assert (p.parameters, p.layer_parameters, p.vocab_size) == (P, LAYER, 50304)
    assert p.batch_tokens == 4 * 8 * 8 * 2048 == 524_288  # micro batch x accum x GPUs x seq
    assert (p.steps, p.total_tokens) == (100_000, 524_288 * 100_000)
    assert p.flops_per_token == 9_077_710_848


def test_production_memory_by_hand(production_plan):
    p, s, b, h, L, V = production_plan, 2048, 4, 2048, 24, 50304
    assert (p.ddp.weights, p.ddp.grads, p.ddp.optimizer) == (4 * P, 4 * P, 8 * P)
    # every layer stays gathered in bf16 from its forward to its backward (reshard_after_forward: false)
    assert (p.fsdp.weights, p.fsdp.grads, p.fsdp.optimizer) == (4 * P // 8 + 2 * P, 4 * P // 8, 8 * P // 8)
    logits = s * b * V * 14  # bf16 logits, accelerate's fp32 copy, the loss's fp32 upcast, the saved log-softmax
    assert p.ddp.activations == p.fsdp.activations == L * 34 * s * b * h + logits
    assert p.ddp.activations_checkpointed == L * 2 * s * b * h + 34 * s * b * h + logits
    # DDP's all-reduce buckets; FSDP2's unsharded fp32 accumulators over the 8 micro-steps
    assert p.ddp.buffers == p.fsdp.buffers == 4 * P
    assert p.fsdp.total_checkpointed < p.fsdp.total < p.ddp.total
    assert 17 < p.fsdp.total_checkpointed / 1024**3 < 18 and 44 < p.ddp.total / 1024**3 < 45


def test_auto_checkpointing_turns_on_where_the_full_count_does_not_fit(production_plan):
    """On a 48 GB card DDP needs ~44.5 GiB without checkpointing: beyond 90% of it, so `auto` must turn it on
    (leaving out the buckets and the fp32 logits copy said 37.7 GiB, and the run ran out of memory at step 1)."""
    assert needs_activation_checkpointing(production_plan, sharded=False, device_bytes=48 * 1024**3)
    assert not needs_activation_checkpointing(production_plan, sharded=True, device_bytes=48 * 1024**3)
    assert not needs_activation_checkpointing(production_plan, sharded=False, device_bytes=80 * 1024**3)


def test_format_plan_is_a_readable_table(production_plan):
    text = format_plan(production_plan)
    for needle in ("'production' on 8 GPU(s)", "1,414,647,808", "524,288 tokens/step", "52,428,800,000",
                   "memory per GPU (GiB)", "DDP", "FSDP", "with act. checkpointing"):
        assert needle in text
    total_row = next(line for line in text.splitlines() if line.strip().startswith("total"))
    assert total_row.split()[1:] == ["44.47", "28.66"]  # GiB per GPU: DDP, FSDP


def test_fp32_doubles_activation_bytes():
    bf16 = plan(resolve_config("test", overrides={"train.mixed_precision": "bf16"}), gpus=0)
    fp32 = plan(resolve_config("test", overrides={"train.mixed_precision": "no"}), gpus=0)
    logits = lambda p, bytes_: p.seq_len * p.micro_batch_size * p.vocab_size * bytes_  # noqa: E731
    assert fp32.ddp.activations - logits(fp32, 8) == 2 * (bf16.ddp.activations - logits(bf16, 14))
    assert "CPU (1 process)" in format_plan(fp32) and "(MiB)" in format_plan(fp32)


def test_vocab_comes_from_the_tokenizer_when_given():
    assert plan(resolve_config("test"), gpus=0, tokenizer_vocab=300).vocab_size == 320  # rounded up to 64
    with pytest.raises(PiconeoxError, match="smaller than the dataset tokenizer's 60000"):
        plan(resolve_config("production"), gpus=8, tokenizer_vocab=60000)


def test_negative_gpus_is_a_user_error():
    with pytest.raises(PiconeoxError, match="--gpus -1"):
        plan(resolve_config("test"), gpus=-1)


@pytest.mark.parametrize("gpus, accum", [(1, 64), (8, 8), (16, 4), (64, 1)])
def test_production_keeps_its_global_batch_on_any_gpu_count(gpus, accum):
    """Tokens per step are the recipe's, not a product that grows with the world size."""
    p = plan(resolve_config("production"), gpus=gpus)
    assert (p.batch_tokens, p.grad_accum_steps) == (524_288, accum)


def test_a_global_batch_that_does_not_divide_is_one_error_line():
    with pytest.raises(PiconeoxError, match=r"train.global_batch_tokens=524,288 is not a whole multiple of "
                                            r"micro_batch_size x seq_len x processes = 4 x 2048 x 3 = 24,576"):
        plan(resolve_config("production"), gpus=3)
