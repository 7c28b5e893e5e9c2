"""What other tools read that is not an HF folder: GGUF files (the HF config keys every transformers version
understands are part of writing an HF folder: utils/ckpt/hf/portable.py)."""
