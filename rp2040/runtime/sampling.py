"""Choosing the next token: greedy, or temperature and top-k in integers, with a seedable xorshift32.

O(vocab) passes, no sorting and no allocation per token (rp2040/FORMAT.md, spec rp2040/reference.py):
the k-th largest logit in one pass through a k-entry min-heap, then one pass summing exp-table
weights exp((z - max) / T) of the tokens at or above it and one finding where a uniform draw falls. The RNG is our own, so MicroPython and CPython draw the same numbers for the same seed.
f32 models' float logits are first rounded to the same fixed point (value * 2**16).
"""
from array import array

from . import intkernels as IK
from .fixed import ACT_FRAC, EXP_TABLE, INV_T_FRAC, MULT_MAX

class Sampler:
    """Picks a token from logits. temperature <= 0 or top_k == 1 is greedy; top_k = 0 means all.

    A temperature below 1/8 samples as greedy (1/T must fit its fixed point)."""

    def __init__(self, vocab, temperature=0.0, top_k=0, seed=0):
        if not (temperature >= 0 and temperature - temperature == 0):  # refuses nan and inf
            raise ValueError("temperature %r: must be a finite number >= 0 (0 = greedy)" % temperature)
        if top_k < 0 or top_k > vocab:
            raise ValueError("top_k %r: must be between 0 (all tokens) and the vocab size %d" % (top_k, vocab))
        self.temperature = temperature
        self.top_k = top_k if top_k < vocab else 0
        self.inv_t = int((1 << INV_T_FRAC) / temperature + 0.5) if temperature > 0 else 0
        self.greedy = temperature <= 0 or top_k == 1 or self.inv_t > MULT_MAX
        self.rng = array("I", [(seed & 0xFFFFFFFF) or 0x9E3779B9])  # the state must never be 0
        self.exp = array("i", EXP_TABLE)
        self.z = None  # int copy of float logits (f32 models), made on first use
        self.heap = array("i", range(self.top_k))

    def __call__(self, logits):
        z, n = logits, len(logits)
        if not isinstance(logits[0], int):
            if self.z is None:
                self.z = array("i", range(n))
            z = self.z
            unit = 1 << ACT_FRAC
            for i in range(n):
                v = logits[i] * unit
                z[i] = int(v) if -1e9 < v < 1e9 else (-1000000000 if v < 0 else 1000000000)
        best = IK.argmax(z, n)
        if self.greedy:
            return best
        tau = IK.kth_largest(z, n, self.top_k, self.heap) if self.top_k else -(1 << 30)
        return IK.draw(z, n, z[best], tau, self.inv_t, self.exp, 0, self.rng)

    def state_dict(self):
        return {"rng": {"state": self.rng[0]}}

    def load_state_dict(self, state):
        self.rng[0] = state["rng"]["state"]
