"""The loaders' clean refusals: a hostile checkpoint, model folder or
dataset runs no code, never hangs, never takes memory out of proportion to its size, and ends in one line.

Every case runs in a forked child (`bounded`): its address space is capped at its size at the fork plus
EXTRA_MEMORY (RLIMIT_AS), it is SIGKILLed after its deadline, and stdin is closed. A case that would hang
or bloat on an unguarded loader fails its assertion instead of stalling the suite.
"""
import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from tests.support.bounds import bound
from tests.support.hostile_pickles import in_child, torch_zip
from tests.support.payloads import Payload, torch_bytes
from tests.support.training import run
from utils.ckpt.format import DCP_INDEX, MARKER, manifest, read_marker, write_marker

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")

STEP = "step-00000010"
EXTRA_MEMORY = 3 << 30
DEADLINE = bound(45)  # seconds: a refusal takes a few; an unguarded loader hangs for minutes


def bounded(call, deadline: float = DEADLINE, nofile: int | None = None) -> tuple[int | str, str]:
    """(exit code, or "timeout"; its stderr) of `call()` in a forked child with RLIMIT_AS = its size + EXTRA_MEMORY
    (and RLIMIT_NOFILE = `nofile`), killed after `deadline` seconds."""
    return in_child(call, EXTRA_MEMORY, deadline, nofile)


def assert_one_line(result, *words):
    code, err = result
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err[-3000:])
    assert all(w in errors[0] for w in words), errors[0]


def remark(folder: Path) -> None:
    """Recompute the COMPLETE marker over what the folder now holds (anyone can)."""
    marker = read_marker(folder)
    names = [p.name for p in folder.iterdir() if p.is_file() and p.name != MARKER]
    write_marker(folder, marker["step"], marker["world_size"], manifest(folder, sorted(names)))


def hash_bomb() -> bytes:
    """1 KB, no globals: 64 tuples nested through the memo, used as a dict key (2**64 steps to hash)."""
    t = ()
    for _ in range(64):
        t = (t, t)
    return b"\x80\x02}" + pickle.dumps(t, protocol=2)[2:-1] + b"K\x01s."


def replace_record(folder: Path, fqn_start: str, data: bytes) -> None:
    """Point the index entry of the first record named `fqn_start...` at `data`, appended to its .distcp file."""
    import dataclasses

    meta = pickle.loads((folder / DCP_INDEX).read_bytes())  # our own fixture's index: trusted
    index = next(i for i in meta.storage_data if i.fqn.startswith(fqn_start))
    path = folder / meta.storage_data[index].relative_path
    meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], offset=path.stat().st_size,
                                                   length=len(data))
    with open(path, "ab") as f:
        f.write(data)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))



@pytest.fixture
def work(tmp_path, trained):
    shutil.copytree(trained / "ckpt", tmp_path / "ckpt")
    return tmp_path


def generate(folder, *extra):
    from utils.generate import main
    return lambda: main([str(folder), "--max-new-tokens", "2", *extra])


def consolidate(folder, out):
    from utils.consolidate import main
    return lambda: main([str(folder), "--out", str(out)])


def resume(work, data, folder):
    return lambda: run(work, data, "--max-steps", "12", "--resume", str(folder))[0]


# 1. auto_map: a folder naming its own code is refused before transformers could ask to run it

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


# 2. hash bombs: every pickle is bounded before an unpickler sees it; small states are JSON

def test_the_hash_bomb_is_real():
    """On an unguarded unpickler the 1 KB bomb does not finish in 5 s (it would take centuries)."""
    assert bounded(lambda: pickle.loads(hash_bomb()) and 0, deadline=5) == ("timeout", "")


def test_small_states_are_json_and_our_own_pickles_pass_the_bounds(work):
    from utils.ckpt.untrusted.bounded import check_pickle, check_torch_zip

    folder = work / "ckpt" / "run" / STEP
    assert {p.name for p in folder.glob("*.pt")} == set() and (folder / "scheduler.json").is_file()
    check_pickle((folder / DCP_INDEX).read_bytes(), "our own index")
    check_torch_zip(io.BytesIO(torch_bytes({"lr": 1e-3, "betas": (0.9, 0.95), "w": torch.zeros(3)})), "a value")


def test_a_hash_bomb_anywhere_in_a_checkpoint_is_refused_at_once(work, tiny_data):
    folder = work / "ckpt" / "run" / STEP
    index = (folder / DCP_INDEX).read_bytes()
    (folder / DCP_INDEX).write_bytes(hash_bomb())
    remark(folder)
    assert_one_line(bounded(consolidate(folder, work / "hf")), str(folder / DCP_INDEX), "unfold into")
    (folder / DCP_INDEX).write_bytes(index)
    replace_record(folder, "optim.param_groups.", torch_zip(hash_bomb()))  # a value record inside the .distcp
    remark(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "__0_0.distcp", "unfold into")


def test_an_older_checkpoints_pickled_rng_is_read_bounded(work, tiny_data):
    """rng-*.pt of checkpoints written before the small states became JSON still load (through the bounded reader);
    a bomb there is refused in one line."""
    from utils.ckpt.state import rng_from_json

    folder = work / "ckpt" / "run" / STEP
    state = rng_from_json(json.loads((folder / "rng-00000.json").read_text()))
    (folder / "rng-00000.json").unlink()
    torch.save(state, folder / "rng-00000.pt")
    remark(folder)
    from utils.ckpt.load import read_rng
    assert read_rng(folder, 0)["torch"].equal(state["torch"])
    (folder / "rng-00000.pt").write_bytes(torch_zip(hash_bomb()))
    remark(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "rng-00000.pt", "unfold into")


# 3. decompression: a DEFLATE record, or a record reading /dev/zero, costs no more than its bytes

def deflated(data: bytes) -> bytes:
    """The torch.save zip `data` with every record DEFLATE-compressed (torch never writes that)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    return buf.getvalue()


def test_a_compressed_record_is_refused_before_it_inflates(work, tiny_data):
    folder = work / "ckpt" / "run" / STEP
    bomb = deflated(torch_bytes(torch.zeros(32 << 20)))  # 128 MB of zeros in ~130 KB
    assert len(bomb) < 1 << 20
    replace_record(folder, "optim.param_groups.", bomb)
    remark(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "is compressed")


def test_an_index_entry_reading_dev_zero_is_refused(work):
    import dataclasses

    folder = work / "ckpt" / "run" / STEP
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())
    index = next(i for i in meta.storage_data if i.fqn.startswith("model."))
    meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], relative_path="/dev/zero", offset=0,
                                                   length=2_000_000_000)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    remark(folder)
    code, err = bounded(consolidate(folder, work / "hf"))
    assert code == 2 and "Traceback" not in err and err.count("error: ") == 1, err[-2000:]


# 4. sizes: config.json, tokenizer.json and manifest.json are checked before anything of their size is built

def test_sizes_are_checked_before_anything_is_built(work):
    from tokenizers import Tokenizer

    from rp2040.export import main as export_main

    best, step = work / "ckpt" / "run" / "best", work / "ckpt" / "run" / STEP
    for folder, layers, words in ((best, 100_000, ("num_hidden_layers 100000", "1..1,024")),
                                  (step, 1000, ("says 1000 layers, the weights hold 1",))):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        remark(folder)
        assert_one_line(bounded(generate(folder)), *words)
        if folder == step:
            assert_one_line(bounded(consolidate(folder, work / "hf")), *words)
        (folder / "config.json").write_text(json.dumps(config))
        remark(folder)
    tok = json.loads((best / "tokenizer.json").read_text())
    tok["model"]["merges"] = ["a b"] * 2_097_153  # utils.data.tokenizer_check.MAX_TOKENS + 1, under 16 MiB
    (best / "tokenizer.json").write_text(json.dumps(tok))
    remark(best)
    for call in (generate(best), lambda: export_main([str(best), "--out", str(work / "pico")])):
        assert_one_line(bounded(call), "2,097,153 merges entries, more than the 2,097,152 allowed")
    shutil.copy(step / "tokenizer.json", best / "tokenizer.json")
    wide = Tokenizer.from_file(str(best / "tokenizer.json"))
    wide.add_tokens([f"<extra{i}>" for i in range(10)])  # ids 256..265: beyond the model's 256 rows
    wide.save(str(best / "tokenizer.json"))
    remark(best)
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


# 5. too many open files: shards open lazily, a few at a time

def test_training_on_200_shards_under_ulimit_64(tmp_path, tiny_data):
    from utils.data.prepare import prepare

    data = prepare(["demo"], name="many", out_dir=tmp_path / "data", tokenizer="byte", dataset_percent=5,
                   shard_tokens=1200)
    assert len(list(data.glob("train_*.npy"))) >= 200
    code, err = bounded(lambda: run(tmp_path, data, "--max-steps", "3", "--save-every", "3", "--eval-every", "3",
                                    "--sample-prompt", "")[0], nofile=64)
    assert code == 0, err[-3000:]


# 10. the loaders' clean refusals: hostile but harmless inputs end in one line, never a traceback

def test_a_payload_in_a_tensor_slot_is_refused(work):
    folder, flag = work / "ckpt" / "run" / STEP, work / "PWNED"
    replace_record(folder, "model.", torch_bytes(Payload(flag)))
    remark(folder)
    assert_one_line(bounded(consolidate(folder, work / "hf")), "refused to load: it asks for posix.system")
    assert not flag.exists()


def index_variants():
    """(what, change to the unpickled index) pairs: shapes an index our writer never makes."""
    import dataclasses

    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def first(meta):
        return next(k for k in meta.state_dict_metadata if k.startswith("model."))

    def chunk_outside(meta):
        m = meta.state_dict_metadata[first(meta)]
        m.chunks = [ChunkStorageMetadata(offsets=torch.Size([5] * len(m.size)), sizes=m.size)]

    return {"a number as an entry": lambda meta: meta.state_dict_metadata.update({first(meta): 5}),
            "a chunk outside its tensor": chunk_outside,
            "a tensor of 4 TB": lambda meta: setattr(meta.state_dict_metadata[  # a shape config.json does not give
                "model.gpt_neox.final_layer_norm.weight"], "size", torch.Size([10**6, 10**6])),
            "a compressing transform": lambda meta: meta.storage_data.update(
                {k: dataclasses.replace(v, transform_descriptors=["zstd"]) for k, v in meta.storage_data.items()}),
            "a list as storage records": lambda meta: setattr(meta, "storage_data", [])}


@pytest.mark.parametrize("what", list(index_variants()))
def test_index_variants_are_one_line(work, what):
    folder = work / "ckpt" / "run" / STEP
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())
    index_variants()[what](meta)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    remark(folder)
    assert_one_line(bounded(consolidate(folder, work / "hf")), str(folder / DCP_INDEX))


def test_bad_json_and_tokenizers_are_one_line(work, tiny_data):
    best, step = work / "ckpt" / "run" / "best", work / "ckpt" / "run" / STEP
    deep = "[" * 100_000 + "]" * 100_000
    (best / "config.json").write_text(deep)
    remark(best)
    assert_one_line(bounded(generate(best)), "config.json is not valid JSON (nested too deep to read)")
    (step / "trainer.json").write_text(deep)
    remark(step)
    assert_one_line(bounded(resume(work, tiny_data, step)), "trainer.json is not valid JSON")
    (step / MARKER).write_text(deep)
    assert_one_line(bounded(generate(step)), "COMPLETE is unreadable")
    shutil.copy(step / "config.json", best / "config.json")
    (best / "tokenizer.json").write_text("this is not JSON")
    remark(best)
    assert_one_line(bounded(generate(best)), "tokenizer.json is not valid JSON")


def test_wrong_rng_contents_are_one_line(work, tiny_data):
    """In today's rng-*.json and in an older checkpoint's rng-*.pt (both read; both checked value by value)."""
    folder = work / "ckpt" / "run" / STEP
    saved = json.loads((folder / "rng-00000.json").read_text())
    (folder / "rng-00000.json").write_text(json.dumps({**saved, "torch": "00ff"}))
    remark(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "rng-00000.json: not an RNG state",
                    "torch's state must be")
    (folder / "rng-00000.json").unlink()
    torch.save({"python": 1, "numpy": 2, "torch": 3}, folder / "rng-00000.pt")
    remark(folder)
    assert_one_line(bounded(resume(work, tiny_data, folder)), "rng-00000.pt: not an RNG state")


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
        remark(folder)
        assert_one_line(bounded(fresh), f"{name}: not a scheduler state this run can load")
        assert not (work / "logs" / "r").exists() and not (work / "ckpt" / "r").exists()


def test_an_empty_error_message_still_makes_a_line():
    from utils.errors import first_line

    assert first_line(MemoryError()) == "MemoryError" and first_line(ValueError("a\nb")) == "a"
