"""What other tools read: GGUF files and HF config keys every transformers version understands."""
