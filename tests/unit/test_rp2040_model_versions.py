"""model.bin v4 (int8 matrices in 4-row interleaved blocks) against v3 (row-major) for the same weights: the
host runtime and the integer reference give the same logits from either file; other versions are refused in
one line."""
import struct
import zlib

import numpy as np
import pytest

from configs.model import MODEL_PRESETS, build_model
from rp2040.model_bin import Shape, encode_model, integer_params, model_tensors
from rp2040.reference import ReferenceModel
from rp2040.runtime import modelfile as mf
from rp2040.runtime.gpt import GPT
from tests.support.rp2040_models import wide_init


def _state_and_shape():
    model = wide_init(build_model(MODEL_PRESETS["pico-fast"]), 0)  # every matrix interleavable: 24 wide, FFN 96
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}, Shape.from_hf(model.config)


def _version3(state, shape) -> bytes:
    """The same model as version 3 wrote it: every matrix row-major, unpadded."""
    p, mats = integer_params(model_tensors(state, shape), shape)
    w = np.concatenate([m.ravel() for m in mats]).astype("i1")
    flags = (mf.FLAG_TIED if shape.tied else 0) | (mf.FLAG_PARALLEL_RESIDUAL if shape.parallel_residual else 0)
    header = struct.pack(mf.HEADER_FORMAT, mf.MAGIC, 3, 1, flags, shape.vocab, shape.hidden, shape.layers, shape.heads,
                         shape.inter, shape.context, shape.rotary_dims, p.size, w.nbytes, shape.norm_eps,
                         shape.rotary_base)
    body = header.ljust(mf.HEADER_SIZE, b"\0") + p.tobytes() + w.tobytes()
    body += b"\0" * (-len(body) % 4)
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize("stream", [False, True])
def test_version_4_and_version_3_files_give_the_same_logits(tmp_path, stream):
    state, shape = _state_and_shape()
    (tmp_path / "v4.bin").write_bytes(encode_model(state, shape, "int8"))
    (tmp_path / "v3.bin").write_bytes(_version3(state, shape))
    assert (tmp_path / "v4.bin").read_bytes()[4:6] == b"\x04\x00"
    ids = [5, 77, 300, 511, 0]
    ref4 = ReferenceModel(tmp_path / "v4.bin").logits(ids)
    np.testing.assert_array_equal(ref4, ReferenceModel(tmp_path / "v3.bin").logits(ids))
    for name in ("v4.bin", "v3.bin"):
        model = GPT(str(tmp_path / name), stream=stream)
        assert model.h.interleaved(shape.inter, shape.hidden) == (name == "v4.bin")
        for pos, t in enumerate(ids):
            assert list(model.forward(t, pos)) == ref4[pos].tolist()
        model.close()


def test_another_version_is_refused_in_one_line(tmp_path):
    state, shape = _state_and_shape()
    data = bytearray(encode_model(state, shape, "int8"))
    data[4:6] = struct.pack("<H", 5)
    (tmp_path / "v5.bin").write_bytes(bytes(data))
    with pytest.raises(mf.FormatError, match=r"^model.bin is version 5; this runtime reads versions 3 and 4 "
                                             r"\(export it again\)$"):
        GPT(str(tmp_path / "v5.bin"))
