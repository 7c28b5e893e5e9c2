"""utils/data/tokenizers.py: the three tokenizers, their saved form, and transformers loading."""
import pytest

from utils.data.tokenizers import (
    EOT,
    build_tokenizer,
    load_tokenizer,
    missing_chars,
    save_tokenizer,
    tokenizer_kind,
)
from utils.errors import PiconeoxError

TRICKY = "Héllo wörld 🎉 “quotes”\n\n  two  spaces\ttab\r\nend . , ! x"


def test_char_tokenizer_is_nanogpt_vocab_plus_eot_and_round_trips(shakespeare):
    text = shakespeare
    tok = build_tokenizer("char", [text], None)
    assert tok.get_vocab_size() == 65 + 1  # nanoGPT's 65 characters, then EOT
    assert tok.token_to_id(EOT) == 65
    ids = tok.encode(text).ids
    assert len(ids) == 1_115_394  # one id per character
    assert tok.decode(ids) == text


def test_byte_tokenizer_ids_are_byte_values_and_eot_is_255():
    tok = build_tokenizer("byte", [], None)
    assert tok.get_vocab_size() == 256 and tok.token_to_id(EOT) == 255
    assert tok.encode(TRICKY).ids == list(TRICKY.encode("utf-8"))
    assert tok.encode("a" + EOT + "b").ids == [97, 255, 98]
    assert tok.decode(tok.encode(TRICKY + EOT).ids, skip_special_tokens=False) == TRICKY + EOT


def test_bpe_trains_to_the_asked_vocab_and_round_trips(shared_data):
    text = (shared_data / "tinystories" / "tinystories_val.txt").read_text(encoding="utf-8")
    docs = text.split("\n\n")
    tok = build_tokenizer("bpe", docs, 1000)
    assert tok.get_vocab_size() == 1000 and tok.token_to_id(EOT) == 0
    ids = tok.encode(text).ids
    assert len(ids) < len(text) / 2.5  # merges compress English text
    assert tok.decode(ids) == text
    assert tokenizer_kind(tok) == "bpe"


def test_bpe_refuses_a_vocab_the_text_cannot_fill():
    with pytest.raises(PiconeoxError, match="--vocab-size 5000 is more than this text supports"):
        build_tokenizer("bpe", ["a short text"], 5000)


def test_bpe_at_the_minimum_vocab_has_bytes_plus_eot():
    tok = build_tokenizer("bpe", ["some text to train on"], 257)
    assert tok.get_vocab_size() == 257
    assert tok.decode(tok.encode(TRICKY).ids) == TRICKY


@pytest.mark.parametrize("kind, vocab, allowed", [
    ("bpe", 256, "257..65535"), ("bpe", 65_536, "257..65535"), ("bpe", None, "required for bpe: give 257..65535"),
    ("byte", 512, "always 256"), ("char", 100, "distinct characters"), ("word", None, "char, byte, bpe")])
def test_impossible_tokenizer_requests_are_refused_with_what_is_allowed(kind, vocab, allowed):
    with pytest.raises(PiconeoxError, match=allowed) as e:
        build_tokenizer(kind, ["text"], vocab)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind, vocab", [("char", None), ("byte", None), ("bpe", 290)])
def test_saved_tokenizer_loads_in_transformers_with_eos_pad_and_exact_decode(tmp_path, kind, vocab):
    tok = build_tokenizer(kind, [TRICKY], vocab)
    save_tokenizer(tok, tmp_path / "tokenizer.json")
    hf = load_tokenizer(tmp_path)
    assert hf.eos_token == EOT and hf.pad_token == EOT and len(hf) == tok.get_vocab_size()
    assert hf.eos_token_id == tok.token_to_id(EOT)
    assert hf.decode(hf.encode(TRICKY + EOT)) == TRICKY + EOT
    assert tokenizer_kind(tok) == kind


def test_load_tokenizer_without_file_names_the_path(tmp_path):
    with pytest.raises(PiconeoxError, match="tokenizer.json not found"):
        load_tokenizer(tmp_path)


def test_char_tokenizer_reports_characters_it_would_drop():
    tok = build_tokenizer("char", ["abc"], None)
    assert missing_chars(tok, ["abcé", "z"]) == {"é", "z"}


