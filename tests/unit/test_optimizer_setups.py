"""What an optimizer allows and costs, asked of utils/optim.py alone: the state bytes the plan counts, the
layouts a run refuses, and `--print-plan` refusing a setup the launch would refuse."""
import torch

import train
from configs.model import MODEL_PRESETS, build_model
from configs.plan import format_plan, plan
from configs.presets import resolve_config
from utils.optim import build_optimizer, muon_matrices, refusal, state_bytes


def measured_state_bytes(kind: str) -> tuple[int, int]:
    """(bytes of state a real optimizer holds after one step, what `state_bytes` says) for the test model."""
    torch.manual_seed(0)
    model = build_model(MODEL_PRESETS["test"].with_vocab(256))
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), kind=kind, muon_lr=0.02)
    x = torch.randint(0, 256, (2, 16))
    model(input_ids=x, labels=x).loss.backward()
    optimizer.step()
    held = sum(t.numel() * t.element_size() for st in optimizer.state.values() for k, t in st.items() if k != "step")
    return held, state_bytes(model, kind)


def test_state_bytes_is_what_each_optimizer_really_holds():
    adamw, muon = measured_state_bytes("adamw"), measured_state_bytes("muon")
    assert adamw[0] == adamw[1] and muon[0] == muon[1]
    model = build_model(MODEL_PRESETS["test"].with_vocab(256))
    total, matrices = (sum(p.numel() for p in ps) for ps in (model.parameters(), muon_matrices(model)))
    assert adamw[1] == 8 * total and muon[1] == 4 * matrices + 8 * (total - matrices) and matrices > total // 2


def test_the_plan_counts_the_optimizers_own_state():
    adamw = plan(resolve_config("small"), gpus=2)
    muon = plan(resolve_config("small", overrides={"train.optimizer": "muon"}), gpus=2)
    with torch.device("meta"):
        model = build_model(resolve_config("small").model.with_vocab(adamw.vocab_size))
    assert adamw.ddp.optimizer == state_bytes(model, "adamw") and muon.ddp.optimizer == state_bytes(model, "muon")
    assert muon.ddp.optimizer < adamw.ddp.optimizer and muon.ddp.weights == adamw.ddp.weights


def test_the_plan_has_no_fsdp_column_for_an_optimizer_that_refuses_it():
    muon = plan(resolve_config("small", overrides={"train.optimizer": "muon"}), gpus=8)
    text = format_plan(muon)
    assert muon.fsdp is None and "FSDP" not in text.split("(no FSDP column")[0]
    assert f"(no FSDP column: {refusal('muon', sharded=True)})" in text
    assert refusal("adamw", sharded=True) is None and refusal("muon", sharded=False) is None


def test_print_plan_refuses_muon_where_the_launch_shards(capsys):
    code = train.main(["--config", "production", "--print-plan", "--gpus", "8", "--set", "train.optimizer=muon"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and captured.err.count("\n") == 1
    assert "--gpus 8: start_training.sh shards" in captured.err
    assert "train.optimizer=muon: not with FSDP2" in captured.err
    assert train.main(["--config", "small", "--print-plan", "--gpus", "8", "--set", "train.optimizer=muon"]) == 0
    assert "Muon+AdamW states" in capsys.readouterr().out
