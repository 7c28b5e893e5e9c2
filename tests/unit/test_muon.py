"""Muon (for the layers' matrices, AdamW for the rest) and the warmup-stable-decay schedule: what Muon takes, an
exact resume through the checkpoint's optimizer part, and one-line refusals of bad settings."""
import pytest
import torch

from configs.model import MODEL_PRESETS, build_model
from tests.support.ema_runs import cut_from
from tests.support.training import run
from utils.ckpt.format import step_dir_name
from utils.ckpt.load import read_weights
from utils.ckpt.parts import dcp_keys
from utils.muon import BatchedMuon
from utils.optim import MuonWithAdamW, muon_matrices, warmup_stable_decay

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")
MUON = ("--set", "train.optimizer=muon", "--set", "train.muon_lr=0.02", "--set", "train.lr_schedule=wsd")


def test_muon_takes_the_layers_matrices_and_adamw_the_rest():
    model = build_model(MODEL_PRESETS["test"].with_vocab(256))
    names = {id(p): n for n, p in model.named_parameters()}
    taken = {names[id(p)] for p in muon_matrices(model)}
    assert taken and all(".layers." in n and n.endswith(".weight") for n in taken)
    assert not any("embed" in n or "norm" in n for n in taken)
    opt = MuonWithAdamW(model, 1e-3, 0.1, (0.9, 0.99), 0.02, 0.95)
    groups = [(g["muon"], {names[id(p)] for p in g["params"]}) for g in opt.param_groups]
    assert set().union(*(n for m, n in groups if m)) == taken
    assert set().union(*(n for _, n in groups)) == set(names.values())  # every parameter, once


@pytest.mark.parametrize("nesterov", [True, False])
def test_batched_muon_steps_exactly_as_torchs_muon(nesterov):
    """Batching the Newton-Schulz iteration by shape changes no bit of the update, nor the state's keys, so a
    checkpoint written before it resumes the same (the preset's 4 layers: two shapes, 16 matrices)."""
    import copy

    torch.manual_seed(0)
    ours = build_model(MODEL_PRESETS["shakespeare-char-budget"].with_vocab(66))
    theirs = copy.deepcopy(ours)
    kwargs = dict(lr=0.01, weight_decay=0.1, momentum=0.95, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
    pairs = [(ours, BatchedMuon(muon_matrices(ours), **kwargs)),
             (theirs, torch.optim.Muon(muon_matrices(theirs), **kwargs))]
    assert len({p.shape for p in muon_matrices(ours)}) == 2
    x = torch.randint(0, 66, (4, 32))
    for _ in range(3):
        for model, opt in pairs:
            opt.zero_grad()
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    states = [opt.state_dict()["state"] for _, opt in pairs]
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key]["momentum_buffer"], states[1][key]["momentum_buffer"])


def test_wsd_holds_the_peak_then_decays_linearly_to_the_floor():
    f = warmup_stable_decay(warmup_steps=10, max_steps=100, min_lr_ratio=0.1, decay_fraction=0.2)
    assert f(0) == pytest.approx(0.1) and f(9) == 1.0
    assert f(10) == f(79) == 1.0
    assert f(80) == 1.0 and f(90) == pytest.approx(0.55) and f(100) == pytest.approx(0.1)


def test_muon_resumes_exactly_from_the_checkpoints_optimizer_part(tmp_path, tiny_data):
    common = ("--save-every", "6", "--eval-every", "6", "--max-steps", "12", *MUON)
    code, whole, ref = run(tmp_path / "ref", tiny_data, *common)
    assert code == 0
    keys = dcp_keys(ref / step_dir_name(6))
    assert any(k.endswith("momentum_buffer") and ".layers." in k for k in keys)  # Muon's state is saved
    assert any(k.endswith("exp_avg") and "embed_in" in k for k in keys)  # and AdamW's
    cut_from(tmp_path / "ref", tmp_path / "cut", 6)
    code, rest, cut = run(tmp_path / "cut", tiny_data, "--resume", "auto", *common)
    assert code == 0 and rest == whole and len(whole) == 12
    a, b = read_weights(ref / step_dir_name(12)), read_weights(cut / step_dir_name(12))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_muon_changes_the_run(tmp_path, tiny_data):
    """The setting really reaches the trainer: other losses than AdamW's from the same seed."""
    code, adamw, _ = run(tmp_path / "a", tiny_data, "--max-steps", "4")
    code2, muon, _ = run(tmp_path / "m", tiny_data, "--max-steps", "4", *MUON)
    assert code == code2 == 0 and adamw[0] == muon[0] and adamw[1:] != muon[1:]


@pytest.mark.parametrize("setting, line", [
    ("train.optimizer=sgd", "train.optimizer='sgd': allowed adamw, muon"),
    ("train.lr_schedule=linear", "train.lr_schedule='linear': allowed cosine, wsd"),
    ("train.decay_fraction=0", "train.decay_fraction"),
    ("train.muon_momentum=1", "train.muon_momentum"),
    ("train.muon_lr=-1", "train.muon_lr"),
])
def test_bad_muon_and_schedule_settings_are_one_line(tmp_path, tiny_data, capsys, setting, line):
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "2", "--set", setting)
    err = capsys.readouterr().err
    assert code == 2 and line in err and err.count("\n") == 1 and "Traceback" not in err
