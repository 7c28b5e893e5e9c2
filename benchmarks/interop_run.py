"""One consumer of a checkpoint for benchmarks/interop.sh: load it, decode greedily, print one JSON row.

Each subcommand runs in the venv of its consumer, so it imports only that consumer's libraries (never utils/):
    reference CKPT OUT.json            transformers of this venv (ours: 5.x); writes the reference tokens
    hf|ct2|onnx CKPT REF.json WORK     transformers 4.x / CTranslate2 / optimum ONNX + onnxruntime
    llama CKPT REF.json GGUF BINARY    llama.cpp's llama-simple on a GGUF written by utils.to_gguf
    table ROWS.jsonl                   the markdown table of all rows
Every row: {model, consumer, loads, equal, tok_s, note}; `equal` means every prompt's greedy continuation is
the reference's, token for token (llama-simple prints text only: its text is compared).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = ["Once upon a time", "The little dog", "She said"]
NEW_TOKENS = 48


def budget(ids: list[int], context: int) -> int:
    """New tokens for a prompt: NEW_TOKENS, or what the model's context has left."""
    return max(1, min(NEW_TOKENS, context - len(ids)))


def hf_decode(ckpt: str, generate) -> tuple[list[dict], float]:
    """[{prompt, ids, new, text}] and tok/s, where `generate(ids, n)` returns the new token ids."""
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    context = AutoConfig.from_pretrained(ckpt).max_position_embeddings
    rows, new_total, seconds = [], 0, 0.0
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False)
        start = time.perf_counter()
        new = [int(t) for t in generate(ids, budget(ids, context))]
        seconds += time.perf_counter() - start
        new_total += len(new)
        rows.append({"prompt": prompt, "ids": ids, "new": new, "text": tok.decode(ids + new, skip_special_tokens=True)})
    return rows, new_total / seconds


def torch_generator(model):
    import torch

    def generate(ids, n):
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)
        return out[0, len(ids):].tolist()
    return generate


def run_transformers(ckpt: str, work: str):
    from transformers import AutoModelForCausalLM

    return hf_decode(ckpt, torch_generator(AutoModelForCausalLM.from_pretrained(ckpt).eval()))


def run_ct2(ckpt: str, work: str):
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from transformers import AutoTokenizer

    out = str(Path(work) / "ct2")
    TransformersConverter(ckpt).convert(out, force=True)
    generator, tok = ctranslate2.Generator(out, device="cpu"), AutoTokenizer.from_pretrained(ckpt)

    def generate(ids, n):
        res = generator.generate_batch([tok.convert_ids_to_tokens(ids)], max_length=n, sampling_topk=1,
                                       include_prompt_in_result=False)
        return res[0].sequences_ids[0]
    return hf_decode(ckpt, generate)


def run_onnx(ckpt: str, work: str):
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForCausalLM

    out = Path(work) / "onnx"
    main_export(ckpt, output=out, task="text-generation-with-past", no_post_process=False)
    return hf_decode(ckpt, torch_generator(ORTModelForCausalLM.from_pretrained(out, use_cache=True)))


def run_llama(ckpt: str, ref: list[dict], gguf: str, binary: str):
    rows, new_total, seconds = [], 0, 0.0
    for r in ref:
        p = subprocess.run([binary, "-m", gguf, "-n", str(len(r["new"])), r["prompt"]], capture_output=True,
                           text=True, timeout=300)
        if p.returncode:
            raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
        m = re.search(r"decoded (\d+) tokens in ([\d.]+) s", p.stderr)
        new_total, seconds = new_total + int(m.group(1)), seconds + float(m.group(2))
        rows.append({"prompt": r["prompt"], "text": p.stdout.rstrip("\n")})
    return rows, new_total / max(seconds, 1e-9)


def compare(rows: list[dict], ref: list[dict], by: str) -> tuple[bool, str]:
    for got, want in zip(rows, ref):
        if got[by] != want[by]:
            return False, f"{got['prompt']!r}: {got['text'][:60]!r} vs ours {want['text'][:60]!r}"
    return True, ""


def main(argv: list[str]) -> int:
    cmd, ckpt, *rest = argv
    if cmd == "table":
        rows = [json.loads(line) for line in Path(ckpt).read_text().splitlines() if line.strip()]
        print("| model | consumer | loads? | greedy tokens equal to ours? | tok/s | note |\n|---|---|---|---|---:|---|")
        for r in rows:
            tok_s = f"{r['tok_s']:.0f}" if r["tok_s"] else "-"
            print(f"| {r['model']} | {r['consumer']} | {'yes' if r['loads'] else 'no'} | "
                  f"{'yes' if r['equal'] else 'no'} | {tok_s} | {r['note']} |")
        return 0
    row = {"model": Path(ckpt).name, "consumer": cmd, "loads": False, "equal": False, "tok_s": None, "note": ""}
    try:
        if cmd == "reference":
            rows, row["tok_s"] = run_transformers(ckpt, "")
            Path(rest[0]).write_text(json.dumps(rows))
            row.update(loads=True, equal=True)
        else:
            ref = json.loads(Path(rest[0]).read_text())
            run = {"hf": run_transformers, "ct2": run_ct2, "onnx": run_onnx}.get(cmd)
            rows, row["tok_s"] = run(ckpt, rest[1]) if run else run_llama(ckpt, ref, rest[1], rest[2])
            row["loads"] = True
            row["equal"], row["note"] = compare(rows, ref, "text" if cmd == "llama" else "new")
        if cmd in ("reference", "hf", "onnx"):
            import transformers
            row["consumer"] += f" (transformers {transformers.__version__})"
    except Exception as e:  # a consumer that fails is a row of the table, not the end of the benchmark
        row["note"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
