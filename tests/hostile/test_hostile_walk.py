"""The bounded pickle walk is linear in its bytes, checks its limits as it goes (counting what
is created, reachable or not), bounds what dicts and sets may hold against hash collisions, and reads no more
than its caps; each case runs in a forked child under a memory limit of its input plus a margin and a hang bound
(minutes for the old walk; a refusal here takes seconds)."""
import io
import pickle

import pytest

from tests.support.bounds import bound
from tests.support.hostile_pickles import (big_bytes_pickle, colliding_dict, in_child, mark_tuple_pairs,
                                           objects_left_on_the_stack, torch_zip)
from utils.errors import PiconeoxError

MARGIN = 512 << 20  # what the walk and the refusal may take beyond the input itself
HANG = bound(60)  # seconds: only a hang reaches it


def refused(data: bytes, *words, check="check_pickle"):
    """check_pickle (or check_torch_zip) of `data` in a bounded child: exit 2 and one line holding `words`."""
    def call():
        from utils.ckpt.untrusted import bounded

        try:
            getattr(bounded, check)(io.BytesIO(data) if check == "check_torch_zip" else data, "hostile")
        except PiconeoxError as e:
            print(f"error: {e}", file=__import__("sys").stderr)
            return 2
        return 0
    code, err = in_child(call, len(data) + MARGIN, HANG)
    assert code == 2 and "Traceback" not in err and all(w in err for w in words), (code, err[-2000:])


def test_mark_tuple_pairs_walk_in_one_pass():
    """1 MiB of EMPTY_TUPLEs then MARK TUPLE pairs: the old walk copied its stack at every MARK (~35 min);
    one pass is ~1 s, and 786,432 empty tuples are within the limits."""
    data = mark_tuple_pairs()

    def call():
        from utils.ckpt.untrusted.bounded import check_pickle, pickle_cost

        check_pickle(data, "pairs")
        return 0 if pickle_cost(data).objects == (1 << 19) + (1 << 18) + 1 else 3
    code, err = in_child(call, len(data) + MARGIN, HANG)
    assert code == 0, (code, err[-2000:])


def test_a_dict_of_colliding_keys_is_refused_before_it_is_built():
    """74,000 int keys hashing to 0 in a 1 MiB torch record (quadratic inside any unpickler) are refused
    by the walk; a dict of honest keys that size is not (entries squared bound what collisions could cost)."""
    data = colliding_dict(74_000)
    assert len(data) < 1 << 20
    refused(torch_zip(data), "hostile", "too many entries", check="check_torch_zip")
    from utils.ckpt.untrusted.bounded import check_pickle

    check_pickle(pickle.dumps({i: None for i in range(16_000)}, protocol=2), "honest")


def test_colliding_keys_in_the_index_are_counted_as_they_are_built(tmp_path):
    """An index may hold larger dicts (a 1.2B model on 16 ranks: ~27,000 storage records): past the
    budget of the C unpickler it is read by one that hashes every key before it goes into a dict, and refuses a
    ninth key of one hash (distinct keys share a 64-bit hash only when made to); honest keys pass."""
    from utils.ckpt.untrusted.safe_load import SafeFileSystemReader, WatchedMetadataUnpickler

    (tmp_path / ".metadata").write_bytes(colliding_dict(20_000))
    refused_in = SafeFileSystemReader(str(tmp_path))
    with pytest.raises(PiconeoxError, match="share one hash"):
        refused_in.read_metadata()
    for data in (pickle.dumps({i: (i, {i}) if p > 3 else (i,) for i in range(1000)}, protocol=p) for p in (0, 2, 4)):
        assert len(WatchedMetadataUnpickler(io.BytesIO(data), "index").load()) == 1000


def test_objects_left_on_the_stack_are_counted(monkeypatch):
    """What is created counts, reachable from the root or not (10M objects passed a 5M limit)."""
    from utils.ckpt.untrusted import bounded, pickle_walk

    for module in (bounded, pickle_walk):
        monkeypatch.setattr(module, "MAX_PICKLE_NODES", 1000, raising=False)
    monkeypatch.setattr(bounded, "_PASSED", type(bounded._PASSED)())
    with pytest.raises(PiconeoxError, match="objects"):
        bounded.check_pickle(objects_left_on_the_stack(2000), "left")
    bounded.check_pickle(objects_left_on_the_stack(998), "left")


def test_the_walk_takes_memory_for_what_it_counts_not_per_byte():
    """16 MiB of EMPTY_TUPLEs under a limit of its size + 512 MiB: the old walk held ~128 bytes a byte
    (MemoryError); this one refuses at the 5,000,001st object."""
    refused(b"\x80\x02" + b")" * (16 << 20) + b".", "hostile", "more than 5,000,000 objects")


def test_a_record_data_pkl_is_bounded():
    """A tensor record's data.pkl had no size bound (65 MiB of bytes passed the walk)."""
    refused(torch_zip(big_bytes_pickle(65 << 20)), "data.pkl claims", check="check_torch_zip")
