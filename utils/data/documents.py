"""Turn prepare_data.py's INPUT arguments into a stream of documents.

Inputs: text files, globs, directories (every *.txt below them, sorted), `hf:<dataset>[:<config>]`
(its train split, streamed through `datasets.load_dataset`, offline from the local HF cache when
HF_DATASETS_OFFLINE=1) and `demo` (the built-in stories).

Document rule (the --help text repeats it): a text file that contains <|endoftext|> is split on it;
any other text file is split at blank lines (lines holding only whitespace), so a paragraph is a
document. An hf row is a document. Documents are stripped of surrounding whitespace; empty ones are
dropped.

Undecodable bytes: files must be UTF-8. With errors="strict" (the default) the first bad byte stops
the run with the file name and byte offset; errors="replace" turns bad bytes into U+FFFD instead.
"""
from __future__ import annotations

import glob
import mmap
from pathlib import Path
from typing import Iterator

from utils.data.demo_corpus import generate_stories
from utils.errors import PiconeoxError
from utils.storage.base import special
from utils.data.tokenizers import EOT
from utils.textfile import not_utf8

DECODE_ERRORS = ("strict", "replace")
INPUT_HELP = "a text file, a glob, a directory of .txt files, hf:<dataset>[:<config>] or demo"


class TextFile:
    """A UTF-8 text file, read line by line so any size fits in memory."""

    def __init__(self, path: Path, errors: str = "strict"):
        self.path, self.errors = path, errors
        self.label, self.size = str(path), path.stat().st_size
        if self.size == 0:
            raise PiconeoxError(f"input {path} is empty: give a file with text in it")

    def _has_eot(self) -> bool:
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(EOT.encode()) != -1

    def _lines(self) -> Iterator[tuple[str, int]]:
        """Yield (decoded line, its size in bytes)."""
        offset = 0
        with open(self.path, "rb") as f:
            for raw in f:
                try:
                    line = raw.decode("utf-8", errors=self.errors)
                except UnicodeDecodeError as e:
                    raise PiconeoxError(
                        f"{not_utf8(self.path, offset, e)}; fix the file or pass --errors replace") from None
                if offset == 0:
                    line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not text
                offset += len(raw)
                yield line, len(raw)

    def text(self) -> str:
        """The whole file as it is (no document rule): what `--val-split tail` cuts."""
        return "".join(line for line, _ in self._lines())

    def documents(self) -> Iterator[tuple[str, int]]:
        """Yield (document, bytes of the file consumed since the previous yield)."""
        split_on_eot = self._has_eot()
        parts: list[str] = []
        consumed = 0
        for line, nbytes in self._lines():
            consumed += nbytes
            if split_on_eot:
                *ends, line = line.split(EOT)
                for end in ends:
                    parts.append(end)
                    if doc := "".join(parts).strip():
                        yield doc, consumed
                        consumed = 0
                    parts.clear()
                parts.append(line)
            elif line.strip():
                parts.append(line)
            elif doc := "".join(parts).strip():
                yield doc, consumed
                consumed, parts = 0, []
        if doc := "".join(parts).strip():
            yield doc, consumed


class HFDataset:
    """The train split of a Hugging Face dataset, streamed; one row is one document."""

    def __init__(self, name: str, config: str | None):
        self.name, self.config, self.size = name, config, None
        self.label = f"hf:{name}" + (f":{config}" if config else "")

    def documents(self) -> Iterator[tuple[str, int]]:
        """Yield (row text, its length in characters)."""
        import datasets  # slow import: only when an hf: input is used

        try:
            splits = datasets.load_dataset(self.name, self.config, streaming=True)
        except Exception as e:  # datasets raises many types (offline, not found, bad config)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PiconeoxError(f"{self.label}: cannot load it ({reason}); it must be in the local "
                                "HF cache when offline") from None
        split = splits["train"] if "train" in splits else next(iter(splits.values()))
        column = None
        for row in split:
            if column is None:
                column = "text" if "text" in row else next((k for k, v in row.items() if isinstance(v, str)), None)
                if column is None:
                    raise PiconeoxError(f"{self.label}: no text column in {sorted(row)}")
            if doc := row[column].strip():
                yield doc, len(doc)


class DemoStories:
    """The built-in children's stories (utils/data/demo_corpus.py)."""

    label, size = "demo", None

    def documents(self) -> Iterator[tuple[str, int]]:
        """Yield (story, its length in characters)."""
        for doc in generate_stories():
            yield doc, len(doc)


Source = TextFile | HFDataset | DemoStories


def regular_input(path: Path) -> bool:
    """Whether a file a glob or folder matched is one to read (a folder is not); one line for a FIFO, socket or
    device, which would block or never end the read, where skipping it would drop text silently."""
    if special(path) or path.is_symlink() and path.exists() and not (path.is_file() or path.is_dir()):
        raise PiconeoxError(f"input {path} is not a regular file (a FIFO, socket or device): give text files")
    return path.is_file()


def resolve_inputs(inputs: list[str], errors: str = "strict") -> list[Source]:
    """Map INPUT arguments to sources, refusing missing, empty or unknown ones with one line."""
    if not inputs:
        raise PiconeoxError(f"no input given: give {INPUT_HELP}")
    if errors not in DECODE_ERRORS:
        raise PiconeoxError(f"--errors {errors!r} is not one of {', '.join(DECODE_ERRORS)}")
    sources: list[Source] = []
    for spec in inputs:
        path = Path(spec)
        if special(path):
            raise PiconeoxError(f"input {spec} is not a regular file (a FIFO, socket or device): give text files")
        if spec == "demo":
            sources.append(DemoStories())
        elif spec.startswith("hf:"):
            name, _, config = spec[3:].partition(":")
            if not name:
                raise PiconeoxError(f"input {spec!r} names no dataset: write hf:<dataset>[:<config>]")
            sources.append(HFDataset(name, config or None))
        elif path.is_file():
            sources.append(TextFile(path, errors))
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*.txt") if regular_input(p))
            if not files:
                raise PiconeoxError(f"input directory {spec} holds no .txt files")
            sources.extend(TextFile(p, errors) for p in files)
        elif any(c in spec for c in "*?["):
            files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if regular_input(Path(p)))
            if not files:
                raise PiconeoxError(f"input glob {spec!r} matches no files")
            sources.extend(TextFile(p, errors) for p in files)
        else:
            raise PiconeoxError(f"input {spec!r} not found: give {INPUT_HELP}")
    return sources
