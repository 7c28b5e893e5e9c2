"""Standard evaluation of a checkpoint through EleutherAI's lm-evaluation-harness, and word-level perplexity.

    python -m utils.evaluate checkpoints/<run>/final --tasks hellaswag,lambada_openai,arc_easy,piqa
    python -m utils.evaluate checkpoints/<run>/best --tasks my_task --include-path my_tasks/
    python -m utils.evaluate checkpoints/<run>/best --eval-perplexity ../shared/data/wikitext-2/test.txt

CHECKPOINT is any folder we write (best/, final/, step-XXXXXXXX/; a run directory means its best/). The
standard tasks download their data from the Hugging Face Hub on first use (needs network, then cached);
`--include-path` adds task YAMLs of your own (tests/support/lm_eval_tasks/ holds one in HellaSwag's format).
`--eval-perplexity FILE` scores raw text as one document the way lm-eval's wikitext task does (rolling
windows of the model's context, the first token predicted after <|endoftext|>): word perplexity =
exp(-log-likelihood / whitespace-separated words), plus byte perplexity, bits per byte and token perplexity.
"""
from __future__ import annotations

import argparse
import difflib
import logging
import math
from pathlib import Path

from utils.ckpt.read import find_checkpoint
from utils.devices import resolve_device
from utils.errors import CliParser, PiconeoxError, cli, exit_process
from utils.atomic import check_output_file
from utils.textfile import read_text


# lm-eval warns on every run that it was handed a built model: we do that on purpose (our checkpoints, verified).
HANDED_MODEL_WARNINGS = ("`pretrained` model kwarg is not of type `str`", "Passed an already-initialized model")


def _not_handed_model_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(HANDED_MODEL_WARNINGS)


def quiet_lm_eval() -> None:
    """Drop lm-eval's two warnings about a built model; its other warnings stay."""
    logging.getLogger("lm_eval.models.huggingface").addFilter(_not_handed_model_warning)  # once: same filter object


def load_lm(checkpoint: str, batch_size: int | str, device: str):
    """lm-eval's Hugging Face model wrapper around one of our checkpoints (weights and tokenizer as saved)."""
    from lm_eval.models.huggingface import HFLM

    from utils.ckpt.read import open_checkpoint

    model, tokenizer = open_checkpoint(checkpoint)
    return HFLM(pretrained=model.to(device).eval(), tokenizer=tokenizer, backend="causal", batch_size=batch_size)


def task_manager(tasks: list[str], include_path: str | None):
    """lm-eval's task index; only the --include-path tasks when they are all that is asked for (the full
    index of ~15,000 tasks takes 10-30 s to build). An asked task that a file lm-eval skipped names is reported
    at once, without that build."""
    from lm_eval.tasks import TaskManager

    if include_path and not Path(include_path).is_dir():
        raise PiconeoxError(f"--include-path {include_path}: no such folder of task YAML files")
    broken = {}
    if include_path:
        local = TaskManager(include_path=include_path, include_defaults=False)
        missing = [t for t in tasks if t not in local.all_tasks]
        if not missing:
            return local
        broken = skipped_task_files(Path(include_path))
        for task in missing:
            if named := [f for f, (_, text) in broken.items() if task in text]:
                raise _skipped_error(task, include_path, broken, named[0])
    manager = TaskManager(include_path=include_path)
    for task in tasks:
        if task not in manager.all_tasks:
            if broken:
                raise _skipped_error(task, include_path, broken, next(iter(broken)))
            close = difflib.get_close_matches(task, manager.all_tasks, n=3)
            raise PiconeoxError(f"--tasks {task}: not an lm-eval task{f' (did you mean {close})' if close else ''}; "
                                "list them with `.venv/bin/lm-eval ls tasks`")
    return manager


def _skipped_error(task: str, include_path: str, broken: dict, file: str) -> PiconeoxError:
    return PiconeoxError(f"--tasks {task}: not an lm-eval task; lm-eval skipped {len(broken)} file(s) of "
                         f"--include-path {include_path}: {broken[file][0]}")


def skipped_task_files(folder: Path) -> dict[str, tuple[str, str]]:
    """{file: ('file: why', its text)} for each task YAML under `folder` that lm-eval's index skips without a
    word (it logs the reason at debug level): a YAML error, or no `task:`/`group:` key."""
    try:
        from lm_eval.tasks._index import TaskIndex
        from lm_eval.tasks._yaml_loader import load_yaml
    except ImportError:  # another lm-eval layout: only the plain "not an lm-eval task" line
        return {}
    broken = {}
    for path in TaskIndex._iter_yaml_files(folder):
        try:
            TaskIndex._kind_of(load_yaml(path, resolve_func=False, recursive=True))
        except Exception as e:  # what lm-eval's index catches
            why = "no `task:` or `group:` key" if "Unknown config shape" in str(e) else " ".join(str(e).split())[:200]
            name = str(path.relative_to(folder))
            broken[name] = (f"{name}: {why}", path.read_text(errors="replace"))
    return broken


def run_tasks(lm, tasks: list[str], manager, limit: int | None, num_fewshot: int | None, seed: int) -> dict:
    """lm-eval's results dict ({"results": {task: {"acc,none": ...}}, ...}) for `tasks` on `lm`."""
    import lm_eval

    try:
        return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                                       num_fewshot=num_fewshot,
                                       log_samples=False, random_seed=seed, numpy_random_seed=seed,
                                       torch_random_seed=seed, fewshot_random_seed=seed)
    except (ConnectionError, OSError) as e:  # the hub is out of reach and the data is not cached
        raise PiconeoxError(f"--tasks {','.join(tasks)}: the task data could not be loaded ({str(e).splitlines()[0]}); "
                            "the standard tasks download from the Hugging Face Hub on first use") from None


def text_perplexity(lm, text: str) -> dict[str, float]:
    """Word/byte/token perplexity of `text` as one document, scored with lm-eval's rolling windows."""
    from lm_eval.api.instance import Instance

    words, nbytes, tokens = len(text.split()), len(text.encode("utf-8")), len(lm.tok_encode(text))
    if not words:
        raise PiconeoxError("--eval-perplexity: the file has no words")
    (loglik,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    return {"word_perplexity": math.exp(-loglik / words), "byte_perplexity": math.exp(-loglik / nbytes),
            "bits_per_byte": -loglik / nbytes / math.log(2), "token_perplexity": math.exp(-loglik / tokens),
            "words": words, "bytes": nbytes, "tokens": tokens, "loglikelihood": loglik}


def parse_args(argv):
    p = CliParser(
        prog="python -m utils.evaluate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoints/<run>/best, final or step-XXXXXXXX (a run directory: its best/)")
    p.add_argument("--tasks",
                   help="comma-separated lm-eval tasks, e.g. hellaswag,lambada_openai,arc_easy,piqa,winogrande")
    p.add_argument("--include-path", metavar="DIR", help="folder of extra lm-eval task YAML files")
    p.add_argument("--eval-perplexity", metavar="FILE", help="raw text file: word-level perplexity (WikiText-style)")
    p.add_argument("--limit", type=int, help="only the first N examples of each task (a quick look, not a score)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: each task's own)")
    p.add_argument("--batch-size", default="8", help="examples per forward pass, or auto (default 8)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when there is one)")
    p.add_argument("--seed", type=int, default=1234, help="seed for few-shot sampling (default 1234, lm-eval's)")
    p.add_argument("--output", metavar="FILE", help="also write the numbers as JSON")
    args = p.parse_args(argv)
    if args.tasks is None and not args.eval_perplexity:
        p.error("give --tasks, --eval-perplexity, or both")
    return args


def check_args(args) -> tuple[list[str], int | str]:
    """(task names, batch size) once every flag is known good; one line naming the flag otherwise."""
    tasks = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    if args.tasks is not None and not tasks:
        raise PiconeoxError(f"--tasks {args.tasks!r} names no task: give comma-separated names, e.g. hellaswag,piqa")
    if not (args.batch_size == "auto" or args.batch_size.isdigit() and int(args.batch_size) > 0):
        raise PiconeoxError(f"--batch-size {args.batch_size!r}: must be a positive integer or auto")
    if args.limit is not None and args.limit < 1:
        raise PiconeoxError(f"--limit {args.limit}: must be a positive integer (examples per task)")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise PiconeoxError(f"--num-fewshot {args.num_fewshot}: must be an integer >= 0")
    if args.output:
        check_output_file(args.output, "--output")
    return tasks, args.batch_size if args.batch_size == "auto" else int(args.batch_size)


@cli
def main(argv=None) -> int:
    from utils.atomic import atomic_write_json

    args = parse_args(argv)
    tasks, batch = check_args(args)
    device = resolve_device(args.device)
    text = read_text(args.eval_perplexity, "--eval-perplexity") if args.eval_perplexity else None
    find_checkpoint(args.checkpoint)  # before the task index: that takes half a minute to build
    quiet_lm_eval()
    manager = task_manager(tasks, args.include_path) if tasks else None  # unknown names fail before loading
    lm = load_lm(args.checkpoint, batch, device)
    out: dict = {"checkpoint": args.checkpoint}
    if tasks:
        from lm_eval.utils import make_table

        results = run_tasks(lm, tasks, manager, args.limit, args.num_fewshot, args.seed)
        print(make_table(results))
        out["tasks"] = results["results"]
    if text is not None:
        out["perplexity"] = text_perplexity(lm, text)
        ppl = out["perplexity"]
        print(f"{args.eval_perplexity}: word perplexity {ppl['word_perplexity']:.3f}, byte perplexity "
              f"{ppl['byte_perplexity']:.4f}, bits per byte {ppl['bits_per_byte']:.4f}, token perplexity "
              f"{ppl['token_perplexity']:.3f} ({ppl['words']:,} words, {ppl['tokens']:,} tokens)")
    if args.output:
        from utils.diskfull import one_line_when_full

        with one_line_when_full(Path(args.output).absolute().parent, f"--output {Path(args.output).name}"):
            atomic_write_json(args.output, out)
    return 0


if __name__ == "__main__":
    exit_process(main())
