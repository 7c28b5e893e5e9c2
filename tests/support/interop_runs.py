"""A real step folder, best/ and final/ of a random tiny model for each tokenizer kind (train.py's writers)."""
import logging
from itertools import islice

import torch

from configs.model import ModelConfig, build_model
from utils.ckpt.format import manifest, step_dir_name, write_marker
from utils.ckpt.state import Snapshot, rng_state
from utils.ckpt.write import publish_final, write_shards, write_weights
from utils.data.demo_corpus import generate_stories
from utils.data.tokenizers import EOT, build_tokenizer

# char: non-default theta and rotary fraction, so a consumer's defaults would show; byte: tied; bpe: padded vocab
SHAPES = {"char": dict(rotary_pct=0.5, rotary_base=500.0), "byte": dict(tie_word_embeddings=True),
          "bpe": dict(vocab_multiple=64)}
TEXTS = [*islice(generate_stories(), 200), "Café — naïve 🙂"]


def write_run(run_dir, kind):
    """A real step folder, best/ and final/ (train.py's writers) of a random tiny model, and the torch model."""
    from transformers import PreTrainedTokenizerFast


    tok = build_tokenizer(kind, TEXTS, 300 if kind == "bpe" else None)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, pad_token=EOT,
                                     clean_up_tokenization_spaces=False)
    cfg = ModelConfig(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position_embeddings=32,
                      **SHAPES[kind]).with_vocab(tok.get_vocab_size())
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    common = {"loader": ("json", {}), "trainer": ("json", {}), "metrics": ("json", {}), "run_config": ("json", {})}
    snap = dict(step=1, rank=0, world_size=1, rng=rng_state(), common=common, hf_config=model.config,
                tokenizer=hf_tok)
    step = run_dir / step_dir_name(1)
    sharded = Snapshot(state={"model": dict(model.state_dict()), "optim": {}}, weights=None, **snap)
    write_marker(step, 1, 1, manifest(step, write_shards(sharded, step)))
    write_weights(Snapshot(state=None, weights=dict(model.state_dict()), **snap), run_dir / "best")
    publish_final(step, run_dir / "final", True, logging.getLogger("test"))
    return model
