"""The one learning-rate range, without torch: configs/training.py checks a run's settings against it on every
launch (the preflight included, which must not import torch), and utils/ckpt/ranges.py every rate a resume reads.
utils/optim.py, whose optimizers it bounds, re-exports it.
"""

# No optimizer of this repo trains above it (1e308 made the next checkpoint non-finite). One range for both ends: a
# run's settings are checked against it (configs/training.py), and so is every learning rate its resume reads
# (utils/ckpt/ranges.py): a run must never write a checkpoint its own resume refuses.
MAX_LR = 10.0
