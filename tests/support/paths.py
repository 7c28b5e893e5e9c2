"""Where the repository and the shared real text are, and the skip reason that says where to get it."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
# The skip reason says where each file comes from (docs/development.md, "Tests": without ../shared).
SHARED_DATA_MISSING = (
    f"real text not found at {SHARED_DATA}: put Tiny Shakespeare there as tinyshakespeare/input.txt "
    "(https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt), TinyStories "
    "as tinystories/tinystories_10k.txt and tinystories_val.txt (https://huggingface.co/datasets/roneneldan/TinyStories)"
    " and WikiText-2 as wikitext-2/valid.txt and test.txt (https://github.com/pytorch/examples, "
    "word_language_model/data/wikitext-2)")
