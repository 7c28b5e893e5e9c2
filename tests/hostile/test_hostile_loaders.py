"""The loaders' clean refusals on model folders, JSON and datasets: a folder naming its own code (auto_map), sizes
checked before anything of their size is built, too many shards, bad JSON and tokenizers, a hostile scheduler
state. Nothing runs code, hangs, or takes memory out of proportion to its size; each ends in one line. The pickles
and zips inside a checkpoint are test_hostile_pickles_and_zips.py.

Every case runs in a forked child (`bounded`, tests/support/hostile_loads.py): its address space is capped at its
size at the fork plus EXTRA_MEMORY (RLIMIT_AS), it is SIGKILLed after its deadline, and stdin is closed. A case
that would hang or bloat on an unguarded loader fails its assertion instead of stalling the suite.
"""
import json
import shutil

import pytest
import torch

from tests.support.hostile_loads import assert_one_line, bounded, consolidate, generate, remark_all, resume
from tests.support.training import run
from utils.ckpt.format import MARKER

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")

STEP = "step-00000010"


# auto_map: a folder naming its own code is refused before transformers could ask to run it

def test_a_folder_with_auto_map_is_refused_and_nothing_asks(work, tiny_data):
    from utils.evaluate import main as evaluate_main
    from utils.pretrained import open_pretrained
    from utils.to_gguf import main as gguf_main

    folder, flag = work / "evil", work / "PWNED"
    shutil.copytree(work / "ckpt" / "run" / "best", folder)
    (folder / MARKER).unlink()  # a downloaded Hugging Face folder
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.M"})
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok.update(auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    tok.pop("tokenizer_class", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    (folder / "evil.py").write_text(f"import os\nos.system('touch {flag}')\n")
    text = work / "text.txt"
    text.write_text("Once upon a time.\n")
    for call in (generate(folder), lambda: gguf_main([str(folder), "--out", str(work / "m.gguf")]),
                 lambda: evaluate_main([str(folder), "--eval-perplexity", str(text)])):
        assert_one_line(bounded(call), "auto_map", "never runs a folder's code")
    assert_one_line(bounded(lambda: run(work, tiny_data, "--max-steps", "1", "--init-from", str(folder))[0]),
                    "--init-from", "auto_map")
    config.pop("auto_map")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="auto_map"):  # the tokenizer's auto_map alone is refused too
        open_pretrained(folder)
    tok.pop("auto_map")
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(Exception, match="model_type 'llama' is not GPT-NeoX"):
        open_pretrained(folder)
    assert not flag.exists()


# sizes: config.json, tokenizer.json and manifest.json are checked before anything of their size is built

def test_sizes_are_checked_before_anything_is_built(work):
    from tokenizers import Tokenizer

    from rp2040.export import main as export_main

    best, step = work / "ckpt" / "run" / "best", work / "ckpt" / "run" / STEP
    for folder, layers, words in ((best, 100_000, ("num_hidden_layers 100000", "1..1,024")),
                                  (step, 1000, ("says 1000 layers, the weights hold 1",))):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        remark_all(folder)
        assert_one_line(bounded(generate(folder)), *words)
        if folder == step:
            assert_one_line(bounded(consolidate(folder, work / "hf")), *words)
        (folder / "config.json").write_text(json.dumps(config))
        remark_all(folder)
    tok = json.loads((best / "tokenizer.json").read_text())
    tok["model"]["merges"] = ["a b"] * 2_097_153  # utils.data.tokenizer_check.MAX_TOKENS + 1, under 16 MiB
    (best / "tokenizer.json").write_text(json.dumps(tok))
    remark_all(best)
    for call in (generate(best), lambda: export_main([str(best), "--out", str(work / "pico")])):
        assert_one_line(bounded(call), "2,097,153 merges entries, more than the 2,097,152 allowed")
    shutil.copy(step / "tokenizer.json", best / "tokenizer.json")
    wide = Tokenizer.from_file(str(best / "tokenizer.json"))
    wide.add_tokens([f"<extra{i}>" for i in range(10)])  # ids 256..265: beyond the model's 256 rows
    wide.save(str(best / "tokenizer.json"))
    remark_all(best)
    assert_one_line(bounded(generate(best)), "vocab mismatch: the tokenizer has 266 ids but the model's embedding "
                    "has 256 rows")


def test_a_manifest_of_too_many_shards_is_refused_at_once(work, tiny_data):
    data = work / "data"
    shutil.copytree(tiny_data, data)
    manifest_json = json.loads((data / "manifest.json").read_text())
    manifest_json["shards"] = manifest_json["shards"][:1] * 100_001  # utils.data.shards.MAX_SHARDS + 1
    (data / "manifest.json").write_text(json.dumps(manifest_json))
    assert_one_line(bounded(generate(work / "ckpt" / "run" / "best", "--eval-data", str(data))),
                    "100,001 shards, more than the 100,000 allowed")


# too many open files: shards open lazily, a few at a time

def test_training_on_200_shards_under_ulimit_64(tmp_path, tiny_data):
    from utils.data.prepare import prepare

    data = prepare(["demo"], name="many", out_dir=tmp_path / "data", tokenizer="byte", dataset_percent=5,
                   shard_tokens=1200)
    assert len(list(data.glob("train_*.npy"))) >= 200
    code, err = bounded(lambda: run(tmp_path, data, "--max-steps", "3", "--save-every", "3", "--eval-every", "3",
                                    "--sample-prompt", "")[0], nofile=64)
    assert code == 0, err[-3000:]


# the loaders' clean refusals: hostile but harmless inputs end in one line, never a traceback

def test_bad_json_and_tokenizers_are_one_line(work, tiny_data):
    best, step = work / "ckpt" / "run" / "best", work / "ckpt" / "run" / STEP
    deep = "[" * 100_000 + "]" * 100_000
    (best / "config.json").write_text(deep)
    remark_all(best)
    assert_one_line(bounded(generate(best)), "config.json is not valid JSON (nested too deep to read)")
    (step / "trainer.json").write_text(deep)
    remark_all(step)
    assert_one_line(bounded(resume(work, tiny_data, step)), "trainer.json is not valid JSON")
    (step / MARKER).write_text(deep)
    assert_one_line(bounded(generate(step)), "COMPLETE is unreadable")
    shutil.copy(step / "config.json", best / "config.json")
    (best / "tokenizer.json").write_text("this is not JSON")
    remark_all(best)
    assert_one_line(bounded(generate(best)), "tokenizer.json is not valid JSON")


def test_a_hostile_scheduler_state_is_refused_before_the_run_starts(work, tiny_data):
    """LambdaLR.load_state_dict sets every key as an attribute: only the scheduler's own keys and kinds load.
    Also as an older checkpoint's scheduler.pt; nothing of the refused run is kept."""
    folder = work / "ckpt" / "run" / STEP
    saved = json.loads((folder / "scheduler.json").read_text())
    fresh = lambda: run(work, tiny_data, "--max-steps", "12", "--resume", str(folder), name="r")[0]  # noqa: E731
    for name, state in (("scheduler.json", {**saved, "step": "not a method any more"}),
                        ("scheduler.pt", {**saved, "base_lrs": ["abc", "def"]})):
        (folder / "scheduler.json").unlink(missing_ok=True)
        if name.endswith(".pt"):
            torch.save(state, folder / name)
        else:
            (folder / name).write_text(json.dumps(state))
        remark_all(folder)
        assert_one_line(bounded(fresh), f"{name}: not a scheduler state this run can load")
        assert not (work / "logs" / "r").exists() and not (work / "ckpt" / "r").exists()


def test_an_empty_error_message_still_makes_a_line():
    from utils.errors import first_line

    assert first_line(MemoryError()) == "MemoryError" and first_line(ValueError("a\nb")) == "a"
