"""What a run reports: metrics and trackers, the progress bar, TensorBoard hparams, the closing summary."""
