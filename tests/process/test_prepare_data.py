"""prepare_data.py end to end: inputs, document rule, selection, shards, tokenizer reuse, bad input."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.support.paths import REPO
from utils.data.demo_corpus import generate_stories
from utils.data.prepare import prepare
from utils.data.shards import read_manifest, verify_dataset
from utils.data.tokenizers import EOT, load_tokenizer
from utils.errors import PiconeoxError


def stream(data_dir, split):
    """The split's token stream, read straight from its shards."""
    m = read_manifest(data_dir)
    return np.concatenate([np.load(data_dir / s.name) for s in m.split_shards(split)])


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def stories(shared_data):
    """Real TinyStories text with <|endoftext|> separators."""
    return shared_data / "tinystories" / "tinystories_10k.txt"


def test_eot_file_becomes_stripped_documents_each_followed_by_eot(tmp_path, stories):
    data = prepare([str(stories)], "ts", tmp_path, "byte", val_fraction=0, workers=1, shard_tokens=100_000)
    text = stories.read_text(encoding="utf-8")
    docs = [d.strip() for d in text.split(EOT) if d.strip()]
    m = verify_dataset(data, check_crc=True)
    assert m.documents == {"train": len(docs), "val": 0} and len(docs) == 1728
    assert len(m.split_shards("train")) > 10 and all(s.tokens == 100_000 for s in m.shards[:-1])
    decoded = load_tokenizer(data).decode(stream(data, "train").tolist())
    assert decoded == EOT.join(docs) + EOT


def test_plain_file_splits_at_blank_lines(tmp_path, shared_data):
    src = shared_data / "tinyshakespeare" / "input.txt"
    data = prepare([str(src)], "sh", tmp_path, "char", val_fraction=0, workers=1)
    paragraphs = [p.strip() for p in src.read_text().split("\n\n") if p.strip()]
    m = read_manifest(data)
    assert m.documents["train"] == len(paragraphs) == 7222
    assert m.vocab_size == 66 and m.dtype == "uint16"
    assert load_tokenizer(data).decode(stream(data, "train").tolist()) == EOT.join(paragraphs) + EOT


def test_directory_and_glob_inputs_read_txt_files_in_sorted_order(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    write(src / "b.txt", "second file")
    write(src / "a.txt", "first file")
    write(src / "sub" / "c.txt", "nested file")
    write(src / "skip.md", "not text input")
    by_dir = prepare([str(src)], "d", tmp_path / "out", val_fraction=0, workers=1)
    by_glob = prepare([str(src / "*.txt")], "g", tmp_path / "out", val_fraction=0, workers=1)
    tok = load_tokenizer(by_dir)
    assert tok.decode(stream(by_dir, "train").tolist()) == f"first file{EOT}second file{EOT}nested file{EOT}"
    assert tok.decode(stream(by_glob, "train").tolist()) == f"first file{EOT}second file{EOT}"


def test_hf_input_reads_a_local_dataset_offline(tmp_path):
    src = tmp_path / "hfdata"
    src.mkdir()
    write(src / "train.txt", "row one\n\nrow two\nrow three\n")
    data = prepare([f"hf:{src}"], "hf", tmp_path / "out", val_fraction=0, workers=1)
    assert read_manifest(data).source == [f"hf:{src}"]
    assert load_tokenizer(data).decode(stream(data, "train").tolist()) == f"row one{EOT}row two{EOT}row three{EOT}"


def test_val_split_and_percent_are_deterministic_by_document(tmp_path, stories):
    def run(name, **kw):
        data = prepare([str(stories)], name, tmp_path, "byte", workers=1, **kw)
        return read_manifest(data).documents, stream(data, "train"), stream(data, "val")

    docs_a, train_a, val_a = run("a", seed=1)
    docs_b, train_b, val_b = run("b", seed=1)
    docs_c, train_c, _ = run("c", seed=2)
    assert docs_a == docs_b and np.array_equal(train_a, train_b) and np.array_equal(val_a, val_b)
    assert not np.array_equal(train_a, train_c)
    assert 0.07 < docs_a["val"] / 1728 < 0.13  # --val-fraction 0.1 by document
    assert (val_a == 255).sum() == docs_a["val"]  # whole documents, each ended by EOT
    docs_p, train_p, _ = run("p", seed=1, dataset_percent=25)
    docs_q, train_q, _ = run("q", seed=1, dataset_percent=25)
    assert 0.20 < (docs_p["train"] + docs_p["val"]) / 1728 < 0.30
    assert docs_p == docs_q and np.array_equal(train_p, train_q)


def test_val_inputs_go_to_val_whole_and_every_input_document_to_train(tmp_path, shared_data, stories):
    val_file = shared_data / "tinystories" / "tinystories_val.txt"
    data = prepare([str(stories)], "ts", tmp_path, "byte", workers=1, val=[str(val_file.parent / "*_val.txt")])
    m = verify_dataset(data, check_crc=True)
    train_docs = [d.strip() for d in stories.read_text(encoding="utf-8").split(EOT) if d.strip()]
    val_docs = [p.strip() for p in re.split(r"\n\s*\n", val_file.read_text(encoding="utf-8")) if p.strip()]
    assert m.documents == {"train": len(train_docs), "val": len(val_docs)} and len(val_docs) > 3000
    assert m.options["val"] == [str(val_file)] and m.options["val_fraction"] == 0
    tok = load_tokenizer(data)
    assert tok.decode(stream(data, "train").tolist()) == EOT.join(train_docs) + EOT
    assert tok.decode(stream(data, "val").tolist()) == EOT.join(val_docs) + EOT


def test_bpe_learns_from_train_text_only(tmp_path, shared_data):
    """A word that only the val text repeats gets no merge: val loss is measured on text the tokenizer never saw."""
    train = shared_data / "tinyshakespeare" / "input.txt"
    val = write(tmp_path / "val.txt", "\n\n".join(["Zyxwvq Zyxwvq Zyxwvq."] * 2000))
    data = prepare([str(train)], "bpe", tmp_path, "bpe", vocab_size=400, workers=1, val=[val])
    tok = load_tokenizer(data)
    assert "Zy" not in tok.decode(stream(data, "train").tolist())
    assert not any("Zyx" in piece or "xwv" in piece for piece in tok.get_vocab())
    assert len(tok.encode(" Zyxwvq")) >= 5  # spelled out from (mostly) single bytes
    assert tok.decode(stream(data, "val").tolist()).count("Zyxwvq") == 6000


def test_tail_split_is_nanogpts_character_split(tmp_path, shared_data):
    src = shared_data / "tinyshakespeare" / "input.txt"
    data = prepare([str(src)], "sh", tmp_path, "char", val_split="tail", workers=1)
    text, m = src.read_text(encoding="utf-8"), read_manifest(data)
    cut = int(len(text) * 0.9)  # nanoGPT's data/shakespeare_char/prepare.py
    assert m.vocab_size == 65 + 1 and m.documents == {"train": 1, "val": 1}
    assert (m.split_tokens("train"), m.split_tokens("val")) == (1_003_854 + 1, 111_540 + 1)
    tok = load_tokenizer(data)
    assert tok.decode(stream(data, "train").tolist()) == text[:cut] + EOT
    assert tok.decode(stream(data, "val").tolist()) == text[cut:] + EOT
    # Several files: the cut runs through their concatenation, so the first file stays whole in train.
    wiki = shared_data / "wikitext-2" / "valid.txt"
    both = prepare([str(src), str(wiki)], "two", tmp_path, "byte", val_split="tail", val_fraction=0.3, workers=1)
    wiki_text = wiki.read_text(encoding="utf-8")
    cut = int((len(text) + len(wiki_text)) * 0.7) - len(text)
    tok = load_tokenizer(both)
    assert tok.decode(stream(both, "train").tolist()) == text + EOT + wiki_text[:cut] + EOT
    assert tok.decode(stream(both, "val").tolist()) == wiki_text[cut:] + EOT


def test_two_workers_write_the_same_shards_as_one(tmp_path, stories):
    one = prepare([str(stories)], "w1", tmp_path, "bpe", vocab_size=512, workers=1)
    two = prepare([str(stories)], "w2", tmp_path, "bpe", vocab_size=512, workers=2)
    assert read_manifest(one).shards == read_manifest(two).shards


def test_demo_input_is_deterministic_stories_and_prepares_in_one_call(tmp_path):
    first = list(generate_stories(200, seed=7))
    assert first == list(generate_stories(200, seed=7)) and first != list(generate_stories(200, seed=8))
    corpus = "".join(generate_stories())
    assert len(corpus) > 4_000_000
    names = {w for w in ("Lily", "Tom", "Spot", "Kitty", "Pip", "Bear") if w in corpus}
    assert len(names) == 6 and corpus.count('"') > 10_000 and "because" in corpus
    data = prepare(["demo"], "demo", tmp_path, workers=2)
    m = verify_dataset(data, check_crc=True)
    assert m.documents["train"] + m.documents["val"] == 12_000 and m.vocab_size == 256
    assert sorted(p.name for p in data.iterdir()) == [".crc32c-index.json", "manifest.json", "tokenizer.json",
                                                      "train_00000.npy", "val_00000.npy"]


def test_existing_tokenizer_is_reused_refused_when_different_and_replaced_on_request(tmp_path):
    src = write(tmp_path / "a.txt", "hello world, hello again\n\nsecond doc " * 20)
    data = prepare([src], "ds", tmp_path, "bpe", vocab_size=270, val_fraction=0, workers=1)
    sha = read_manifest(data).tokenizer_sha256
    prepare([src], "ds", tmp_path, "bpe", vocab_size=270, val_fraction=0, workers=1)  # reused as it is
    assert read_manifest(data).tokenizer_sha256 == sha
    with pytest.raises(PiconeoxError, match="holds a bpe tokenizer with 270 ids, not the char"):
        prepare([src], "ds", tmp_path, "char", val_fraction=0, workers=1)
    with pytest.raises(PiconeoxError, match="not the bpe with 400 ids"):
        prepare([src], "ds", tmp_path, "bpe", vocab_size=400, val_fraction=0, workers=1)
    assert read_manifest(data).tokenizer_sha256 == sha  # the refusals left the dataset as it was
    prepare([src], "ds", tmp_path, "char", val_fraction=0, workers=1, retrain_tokenizer=True)
    assert verify_dataset(data).vocab_size == len(set("hello world, again second doc")) + 1


def test_reused_char_tokenizer_refuses_text_with_new_characters(tmp_path):
    prepare([write(tmp_path / "a.txt", "abc")], "ds", tmp_path, "char", val_fraction=0, workers=1)
    with pytest.raises(PiconeoxError, match=r"no id for 1 characters of this input \('é'\)"):
        prepare([write(tmp_path / "b.txt", "abcé")], "ds", tmp_path, "char", val_fraction=0, workers=1)


def test_undecodable_bytes_stop_with_file_and_offset_and_keep_the_old_dataset(tmp_path):
    good = write(tmp_path / "good.txt", "fine text\n\nmore text")
    data = prepare([good], "ds", tmp_path, val_fraction=0, workers=1, shard_tokens=5)
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"first line\nsecond \xff line\n")
    with pytest.raises(PiconeoxError, match=r"bad.txt: not UTF-8 at byte 18 .*--errors replace"):
        prepare([good, str(bad)], "ds", tmp_path, val_fraction=0, workers=1)
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before
    replaced = prepare([str(bad)], "rep", tmp_path, val_fraction=0, workers=1, errors="replace")
    assert load_tokenizer(replaced).decode(stream(replaced, "train").tolist()) == f"first line\nsecond \ufffd line{EOT}"


def test_a_rerun_with_fewer_shards_removes_the_stale_ones(tmp_path):
    src = write(tmp_path / "a.txt", "x" * 100)
    data = prepare([src], "ds", tmp_path, val_fraction=0, workers=1, shard_tokens=10)
    assert len(read_manifest(data).shards) == 11
    prepare([src], "ds", tmp_path, val_fraction=0, workers=1, shard_tokens=60)
    assert sorted(p.name for p in data.glob("*.npy")) == ["train_00000.npy", "train_00001.npy"]
    verify_dataset(data, check_crc=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(inputs=["missing.txt"]), "input 'missing.txt' not found: give a text file, a glob"),
    (dict(inputs=["nothing*.txt"]), "input glob 'nothing\\*.txt' matches no files"),
    (dict(inputs=[]), "no input given"),
    (dict(inputs=["EMPTY"]), "empty.txt is empty"),
    (dict(inputs=["BLANK"]), "give no training text"),
    (dict(inputs=["hf:"]), "names no dataset"),
    (dict(tokenizer="bpe", vocab_size=70_000), "--vocab-size 70000 is out of range for bpe: give 257..65535"),
    (dict(tokenizer="bpe", vocab_size=100), "--vocab-size 100 is out of range for bpe"),
    (dict(dataset_percent=0), "--dataset-percent 0 is out of range: give 1..100"),
    (dict(dataset_percent=101), "--dataset-percent 101 is out of range"),
    (dict(val_fraction=1.0), "--val-fraction 1.0 is out of range"),
    (dict(val_fraction=0.1), "put none of the 1 documents in val"),
    (dict(name="../x"), "--name '../x' is not allowed"),
    (dict(shard_tokens=0), "--shard-tokens 0 is out of range"),
    (dict(workers=0), "--workers 0 is out of range"),
    (dict(val=["BLANK"]), "--val .*blank.txt gives no documents"),
    (dict(val=["nothing*.txt"]), "input glob 'nothing\\*.txt' matches no files"),
    (dict(val=["demo"]), "--val takes text files and globs; demo is not one"),
    (dict(val=["ONE"], val_fraction=0.2), "--val and --val-fraction 0.2 both choose the val text"),
    (dict(val=["ONE"], val_split="tail"), "--val and --val-split tail both choose the val text"),
    (dict(val_split="random"), "--val-split 'random' is not one of documents, tail"),
    (dict(val_split="tail", dataset_percent=50), "--val-split tail cuts the whole text: it needs"),
    (dict(inputs=["demo"], val_split="tail", val_fraction=0.1), "--val-split tail cuts text files; input demo"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, kwargs, message):
    (tmp_path / "empty.txt").write_bytes(b"")
    write(tmp_path / "blank.txt", "  \n\n \n")
    write(tmp_path / "one.txt", "a single document")
    files = {"EMPTY": str(tmp_path / "empty.txt"), "BLANK": str(tmp_path / "blank.txt"),
             "ONE": str(tmp_path / "one.txt")}
    inputs = [files.get(i, i) for i in kwargs.pop("inputs", ["ONE"])]
    if "val" in kwargs:
        kwargs["val"] = [files.get(i, i) for i in kwargs["val"]]
    args = dict(name="ds", out_dir=tmp_path / "out", val_fraction=0, workers=1) | kwargs
    with pytest.raises(PiconeoxError, match=message) as e:
        prepare(inputs, **args)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_prints_one_error_line_and_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "prepare_data.py", str(tmp_path / "nope.txt"), "--name", "x",
                        "--out-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"error: input '{tmp_path / 'nope.txt'}' not found: give a "
                                                 "text file, a glob, a directory of .txt files, "
                                                 "hf:<dataset>[:<config>] or demo")
    assert not any(tmp_path.iterdir())


def test_cli_writes_the_manifest_with_options_and_source(tmp_path):
    src = write(tmp_path / "a.txt", "one\n\ntwo\n\nthree\n\nfour")
    r = subprocess.run([sys.executable, "prepare_data.py", src, "--name", "x", "--out-dir", str(tmp_path),
                        "--tokenizer", "bpe", "--vocab-size", "260", "--val-fraction", "0.5", "--seed", "0",
                        "--workers", "1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_text())
    assert manifest["source"] == [src] and manifest["vocab_size"] == 260 and manifest["dtype"] == "uint16"
    assert manifest["options"] == {"tokenizer": "bpe", "vocab_size": 260, "shard_tokens": 50_000_000,
                                   "dataset_percent": 100.0, "val_fraction": 0.5, "seed": 0, "errors": "strict",
                                   "val": [], "val_split": "documents"}
    assert "train" in r.stdout and "vocab 260" in r.stdout


def test_cli_val_takes_several_files_and_tail_needs_no_val(tmp_path, shared_data):
    wiki = shared_data / "wikitext-2"
    r = subprocess.run([sys.executable, "prepare_data.py", str(wiki / "test.txt"), "--val", str(wiki / "valid.txt"),
                        str(wiki / "test.txt"), "--name", "w", "--out-dir", str(tmp_path), "--workers", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "error: --val file(s) are also inputs: " + str(wiki / "test.txt")
    r = subprocess.run([sys.executable, "prepare_data.py", str(wiki / "test.txt"), "--val", str(wiki / "valid.txt"),
                        "--name", "w", "--out-dir", str(tmp_path), "--workers", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert read_manifest(tmp_path / "w").options["val"] == [str(wiki / "valid.txt")]
