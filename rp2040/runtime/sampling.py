"""Choosing the next token: greedy, temperature and top-k, with a seedable RNG.

The RNG is our own xorshift32, so MicroPython and CPython draw the same numbers for the same seed
(their `random` modules differ).
"""
import math
from array import array

MASK32 = 0xFFFFFFFF


class Rng:
    """xorshift32 (Marsaglia 2003). `random()` is uniform in [0, 1)."""

    def __init__(self, seed=0):
        self.state = (seed & MASK32) or 0x9E3779B9  # the state must never be 0

    def next_u32(self):
        x = self.state
        x ^= (x << 13) & MASK32
        x ^= x >> 17
        x ^= (x << 5) & MASK32
        self.state = x
        return x

    def random(self):
        return self.next_u32() / 4294967296.0

    def state_dict(self):
        return {"state": self.state}

    def load_state_dict(self, state):
        self.state = state["state"]


class Sampler:
    """Picks a token from logits. temperature <= 0 or top_k == 1 is greedy; top_k = 0 means all.

    Only top-k keeps arrays (k candidates); greedy and all-token sampling read the logits in place.
    """

    def __init__(self, vocab, temperature=0.0, top_k=0, seed=0):
        if temperature < 0:
            raise ValueError("temperature %r: must be >= 0 (0 = greedy)" % temperature)
        if top_k < 0 or top_k > vocab:
            raise ValueError("top_k %r: must be between 0 (all tokens) and the vocab size %d" % (top_k, vocab))
        self.temperature = temperature
        self.top_k = top_k
        self.rng = Rng(seed)
        self.greedy = temperature <= 0 or top_k == 1
        if not self.greedy and top_k:
            self.idx = array("H" if vocab < 65536 else "I", range(top_k))  # candidates, best first
            self.val = array("f", range(top_k))

    def __call__(self, logits):
        if self.greedy:
            return argmax(logits)
        if self.top_k:
            k = self._top_k(logits)
            return self._draw(self.val, k, self.idx)
        return self._draw(logits, len(logits), None)

    def _draw(self, val, k, idx):
        """A token from softmax(val[:k] / temperature) (ids idx[j], or j when idx is None); val is kept."""
        best = val[0]
        for j in range(1, k):
            if val[j] > best:
                best = val[j]
        total = 0.0
        for j in range(k):
            total += math.exp((val[j] - best) / self.temperature)
        r = self.rng.random() * total
        for j in range(k):
            r -= math.exp((val[j] - best) / self.temperature)
            if r < 0:
                return j if idx is None else idx[j]
        return k - 1 if idx is None else idx[k - 1]

    def _top_k(self, logits):
        """Fill idx/val with the k largest logits, sorted descending (insertion into a small array)."""
        k = len(self.idx)
        idx, val = self.idx, self.val
        filled = 0
        for t in range(len(logits)):
            v = logits[t]
            if filled == k and v <= val[k - 1]:
                continue
            j = filled if filled < k else k - 1
            while j > 0 and val[j - 1] < v:
                val[j] = val[j - 1]
                idx[j] = idx[j - 1]
                j -= 1
            val[j] = v
            idx[j] = t
            if filled < k:
                filled += 1
        return filled

    def state_dict(self):
        return {"rng": self.rng.state_dict()}

    def load_state_dict(self, state):
        self.rng.load_state_dict(state["rng"])


def argmax(logits):
    """Index of the largest value (the first one on ties, like torch.argmax)."""
    best, arg = logits[0], 0
    for t in range(1, len(logits)):
        v = logits[t]
        if v > best:
            best, arg = v, t
    return arg
