"""utils.evaluate: lm-eval tasks and word-level perplexity on our checkpoints, checked against hand computations."""
import json

import pytest
import torch

from tests.support.paths import REPO
from utils.evaluate import main as evaluate_main

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

TASKS = REPO / "tests" / "support" / "lm_eval_tasks"


@pytest.fixture(scope="module")
def run_dir(trained):
    """The session's 10-step run (tests/conftest.py, trained once for every tier): best/, final/ and
    step-00000010/. Evaluation only reads it."""
    return trained / "ckpt" / "run"


def load(folder):
    """Weights and tokenizer of any of our checkpoints (a step folder is sharded: utils.consolidate reads it)."""
    from transformers import AutoTokenizer

    from utils.ckpt.load import load_model

    return load_model(folder).eval(), AutoTokenizer.from_pretrained(folder)


@torch.no_grad()
def continuation_loglik(model, tok, context: str, continuation: str) -> float:
    ctx, whole = tok.encode(context), tok.encode(context + continuation)
    logp = torch.log_softmax(model(input_ids=torch.tensor([whole[:-1]])).logits[0].float(), -1)
    return sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))


def test_local_hellaswag_task_accuracy_equals_a_hand_computation(tmp_path, run_dir):
    out = tmp_path / "results.json"
    assert evaluate_main([str(run_dir / "final"), "--tasks", "tiny_hellaswag", "--include-path", str(TASKS),
                          "--output", str(out)]) == 0
    got = json.loads(out.read_text())["tasks"]["tiny_hellaswag"]

    # HellaSwag scoring by hand: the query is "<activity>: <ctx_a> <Ctx_b>", each ending follows after a space;
    # acc picks the most likely ending, acc_norm the most likely per character of the ending.
    model, tok = load(run_dir / "final")
    items = [json.loads(line) for line in (TASKS / "tiny_hellaswag.jsonl").read_text().splitlines()]
    acc = acc_norm = 0
    for item in items:
        query = f"{item['activity_label']}: {item['ctx_a']} {item['ctx_b'].capitalize()}"
        lls = [continuation_loglik(model, tok, query, " " + ending) for ending in item["endings"]]
        gold = int(item["label"])
        acc += max(range(4), key=lambda i: lls[i]) == gold
        acc_norm += max(range(4), key=lambda i: lls[i] / len(item["endings"][i])) == gold
    assert got["acc,none"] == pytest.approx(acc / len(items))
    assert got["acc_norm,none"] == pytest.approx(acc_norm / len(items))


@torch.no_grad()
def test_word_perplexity_of_wikitext_equals_a_hand_computation(tmp_path, run_dir, shared_data):
    """Rolling windows of the model's 256 positions over ~700 bytes: two full windows and a last partial one."""
    text = (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:700]
    (tmp_path / "wiki.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "ppl.json"
    assert evaluate_main([str(run_dir / "step-00000010"), "--eval-perplexity", str(tmp_path / "wiki.txt"),
                          "--output", str(out)]) == 0
    got = json.loads(out.read_text())["perplexity"]

    model, tok = load(run_dir / "step-00000010")
    ids, ctx = tok.encode(text), model.config.max_position_embeddings
    windows = [([tok.eos_token_id] + ids[:ctx - 1], ids[:ctx])]  # the first token is predicted after <|endoftext|>
    predicted = ctx
    while predicted < len(ids):  # later windows: the full context that precedes their targets
        end = min(predicted + ctx, len(ids))
        windows.append((ids[end - ctx - 1:end - 1], ids[predicted:end]))
        predicted = end
    assert [len(t) for _, t in windows] == [256, 256, len(ids) - 512]
    nll = 0.0
    for inputs, targets in windows:
        logp = torch.log_softmax(model(input_ids=torch.tensor([inputs])).logits[0, -len(targets):].float(), -1)
        nll -= logp[torch.arange(len(targets)), torch.tensor(targets)].sum().item()
    assert sum(len(t) for _, t in windows) == len(ids) == got["tokens"]
    assert got["words"] == len(text.split())
    assert got["word_perplexity"] == pytest.approx(torch.tensor(nll / len(text.split())).exp().item(), rel=1e-4)
    bits_per_byte = nll / len(text.encode()) / torch.log(torch.tensor(2.0)).item()
    assert got["bits_per_byte"] == pytest.approx(bits_per_byte, rel=1e-4)


def test_bad_input_is_one_line(tmp_path, run_dir, capsys):
    for argv, message in [
        ([str(tmp_path / "nope"), "--eval-perplexity", __file__], "no such checkpoint folder"),
        ([str(run_dir), "--eval-perplexity", str(tmp_path / "none.txt")], "--eval-perplexity"),
        ([str(run_dir), "--tasks", "tiny_hellaswag", "--include-path", str(tmp_path / "none")],
         "no such folder of task YAML"),
        ([str(run_dir), "--tasks", "tiny_hellaswag", "--batch-size", "0"],
         "--batch-size '0': must be a positive integer or auto"),
    ]:
        assert evaluate_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_no_lm_eval_warnings_about_the_model_we_hand_it(tmp_path, run_dir, caplog):
    """lm-eval's two warnings about a built model are ours on purpose, so not shown."""
    import logging

    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a cat.\n")
    with caplog.at_level(logging.WARNING):
        assert evaluate_main([str(run_dir / "best"), "--eval-perplexity", str(text), "--device", "cpu"]) == 0
    shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in shown if "pretrained" in m], shown
