"""HF model folders: what one must be before a model is built from it (`hf_folder`), the config keys every
transformers version reads (`portable`)."""
