"""What a real RP2040 would do where the emulator cannot say: an estimate, never a measurement.

rp2040js charges a read of memory-mapped (XIP) flash like an SRAM read. A real Pico reads flash through a
16 KB XIP cache; a model's weights (tens to hundreds of KB, each byte read once per token) do not fit it, so
every weight byte read from flash misses. At the SDK's default flash clock (system clock / 2) a missed 8-byte
cache line costs about 40-56 system cycles over quad SPI: ESTIMATE_CYCLES_PER_BYTE = 7 extra cycles per byte
(the figure in ../shared/pico/README.md, not measured on a board). The estimate adds that for each byte of
weights a token reads from flash: all of them for a model read in place or streamed from littlefs (whose
reads are memory copies from XIP), none for weights kept in RAM. The interpreter's own code also runs from
flash and misses the cache at times; that is left out, so the estimate is still on the optimistic side.
"""
from __future__ import annotations

from pathlib import Path

ESTIMATE_CYCLES_PER_BYTE = 7
CLOCK_HZ = 125_000_000


def flash_bytes_per_token(model_dir: Path, config: dict) -> int:
    """Bytes of weights one token reads from flash on the board (0 when they are kept in RAM)."""
    from rp2040.runtime.modelfile import HEADER_SIZE, Header, Layout

    runtime = config["runtime"]
    if not (runtime.get("xip") or runtime.get("blocks") or runtime["stream"]):
        return 0
    with open(Path(model_dir) / "model.bin", "rb") as f:
        h = Header(f.read(HEADER_SIZE))
    lay = Layout(h)
    embedding_row = h.hidden * h.itemsize * (4 if h.interleaved(h.vocab, h.hidden) else 1)
    head = 0 if h.tied else h.vocab * h.hidden * h.itemsize  # a tied head reads the whole embedding
    table = h.vocab * h.hidden * h.itemsize
    layers = h.layers * lay.w_layer * h.itemsize + (h.layers * 4 * lay.p_layer if runtime["stream"] else 0)
    return layers + (table if h.tied else embedding_row + head)


def real_board_tok_per_s(step_ms: float, flash_bytes: int) -> float:
    """Estimated tokens/s on a real RP2040 at 125 MHz: the emulated step plus the XIP misses of its flash reads."""
    extra_ms = flash_bytes * ESTIMATE_CYCLES_PER_BYTE / CLOCK_HZ * 1000
    return 1000 / (step_ms + extra_ms) if step_ms > 0 else 0.0
