"""Contracts other inference engines rely on (benchmarks/interop.sh runs the engines themselves):
every HF folder we write (step folder, best/, final/, utils.consolidate's output) carries config keys that
transformers 4.x and 5.x read as the same model, a tokenizer class both resolve and Pythia's special tokens;
the GGUF of utils.to_gguf holds the checkpoint's metadata, tokens and tensors, for all three tokenizer kinds."""
import json

import numpy as np
import pytest
import torch

from tests.support.interop_runs import SHAPES, write_run
from utils.ckpt.format import check_complete
from utils.data.tokenizers import EOT, byte_to_unicode


@pytest.fixture(scope="module", params=sorted(SHAPES))
def run(request, tmp_path_factory):
    """(kind, run dir, torch model, utils.consolidate's output folder)."""
    from utils.consolidate import main as consolidate_main

    run_dir = tmp_path_factory.mktemp(f"run-{request.param}")
    model = write_run(run_dir, request.param)
    assert consolidate_main([str(run_dir / "step-00000001"), "--out", str(run_dir / "hf")]) == 0
    return request.param, run_dir, model, run_dir / "hf"


@pytest.mark.parametrize("folder", ["step-00000001", "best", "final", "hf"])
def test_hf_folder_reads_the_same_in_transformers_4_and_5(run, folder):
    from transformers import AutoTokenizer, GPTNeoXConfig

    kind, run_dir, model, _ = run
    path = run_dir / folder
    assert check_complete(path, verify=True) is None  # rewritten before the marker: the crc32c still hold
    raw = json.loads((path / "config.json").read_text())
    rope = model.config.rope_parameters
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    # transformers 4.x reads only the legacy keys: they must give the model's rotary dims and theta
    assert int(head_dim * raw["rotary_pct"]) == int(head_dim * rope["partial_rotary_factor"])
    assert raw["rotary_emb_base"] == rope["rope_theta"] == SHAPES[kind].get("rotary_base", 10000.0)
    assert GPTNeoXConfig.from_pretrained(path).rope_parameters == rope  # and 5.x still reads rope_parameters
    assert raw["use_cache"] is True
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(path)
    eot = tok.convert_tokens_to_ids(EOT)
    assert (tok.bos_token, tok.eos_token, tok.unk_token) == (EOT, EOT, EOT)
    generation = json.loads((path / "generation_config.json").read_text())
    for cfg in (raw, generation):
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (eot, eot)


def test_saved_folder_loads_as_the_model(run):
    from transformers import AutoModelForCausalLM

    _, run_dir, model, hf = run
    x = torch.tensor([[1, 2, 3, 4]])
    for path in (run_dir / "best", run_dir / "final", hf):
        loaded = AutoModelForCausalLM.from_pretrained(path).eval()
        assert loaded.config.use_cache
        assert torch.equal(loaded(input_ids=x).logits, model(input_ids=x).logits)


def export(run, tmp_path, out_type="f32"):
    from gguf import GGUFReader

    from utils.to_gguf import main

    _, run_dir, _, _ = run
    out = tmp_path / f"model-{out_type}.gguf"
    assert main([str(run_dir / "best"), "--out", str(out), "--type", out_type]) == 0
    reader = GGUFReader(out)
    return reader, {f.name: f.contents() for f in reader.fields.values()}


def test_gguf_metadata_and_tokens_match_the_checkpoint(run, tmp_path):
    from transformers import AutoTokenizer

    kind, run_dir, model, _ = run
    _, meta = export(run, tmp_path)
    cfg = model.config
    rope = cfg.rope_parameters
    assert meta["general.architecture"] == "gptneox"
    assert meta["gptneox.rope.freq_base"] == rope["rope_theta"]
    assert meta["gptneox.rope.dimension_count"] == int(cfg.hidden_size // cfg.num_attention_heads
                                                       * rope["partial_rotary_factor"])
    assert (meta["gptneox.embedding_length"], meta["gptneox.block_count"], meta["gptneox.context_length"]) == \
        (cfg.hidden_size, cfg.num_hidden_layers, cfg.max_position_embeddings)
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    tok = AutoTokenizer.from_pretrained(run_dir / "best")
    eot = tok.convert_tokens_to_ids(EOT)
    assert meta["tokenizer.ggml.eos_token_id"] == meta["tokenizer.ggml.bos_token_id"] == eot
    assert meta["tokenizer.ggml.add_bos_token"] is False
    texts = meta["tokenizer.ggml.tokens"]
    assert len(texts) == cfg.vocab_size and texts[eot] == EOT and meta["tokenizer.ggml.merges"]
    # llama.cpp decodes a token's text byte-level: every id must give the bytes our tokenizer gives it
    to_byte = {c: b for b, c in byte_to_unicode().items()}
    for i, ours in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        want = ours.encode("utf-8") if kind == "char" else bytes(to_byte[c] for c in ours)
        assert i == eot or bytes(to_byte[c] for c in texts[i]) == want, (kind, i, texts[i])
    if kind == "char":  # multi-byte characters are reached by merges of their bytes
        table = byte_to_unicode()
        assert " ".join([table[0xC3], table[0xA9]]) in meta["tokenizer.ggml.merges"]  # é


def test_gguf_tensors_match_the_checkpoint(run, tmp_path):
    _, _, model, _ = run
    reader, _ = export(run, tmp_path)
    tensors = {t.name: np.asarray(t.data).reshape([int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    heads, hidden = model.config.num_attention_heads, model.config.hidden_size
    qkv = sd["gpt_neox.layers.1.attention.query_key_value.weight"].reshape(heads, 3, hidden // heads, hidden)
    assert np.array_equal(tensors["blk.1.attn_qkv.weight"], qkv.transpose(1, 0, 2, 3).reshape(3 * hidden, hidden))
    assert np.array_equal(tensors["token_embd.weight"], sd["gpt_neox.embed_in.weight"])
    assert np.array_equal(tensors["output.weight"], model.get_output_embeddings().weight.detach().numpy())
    assert np.array_equal(tensors["blk.0.ffn_down.bias"], sd["gpt_neox.layers.0.mlp.dense_4h_to_h.bias"])
    assert len(tensors) == 1 + 12 * model.config.num_hidden_layers + 3  # embeddings, blocks, norm and output


def test_gguf_types_and_refusals(run, tmp_path, capsys):
    from gguf import GGMLQuantizationType as Q

    from utils.errors import PiconeoxError
    from utils.interop.gguf_export import check_expressible
    from utils.to_gguf import main

    _, run_dir, model, _ = run
    reader, _ = export(run, tmp_path, "f16")
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_up.weight"] == Q.F16 and types["blk.0.ffn_up.bias"] == Q.F32
    reader, _ = export(run, tmp_path, "q8_0")  # rows of 16 are no q8_0 block (32): f16 instead, like llama.cpp
    assert {t.tensor_type for t in reader.tensors} <= {Q.F16, Q.F32, Q.Q8_0}
    capsys.readouterr()
    assert main([str(run_dir / "best"), "--out", str(tmp_path / "x.gguf"), "--type", "q4_k"]) == 2
    assert capsys.readouterr().err == "error: --type 'q4_k' is not one of f32, f16, q8_0\n"
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "x.gguf")]) == 2
    assert not (tmp_path / "x.gguf").exists()
    cfg = model.config.__class__(**{**model.config.to_dict(), "hidden_act": "relu"})
    with pytest.raises(PiconeoxError, match="hidden_act 'relu'"):
        check_expressible(cfg)
