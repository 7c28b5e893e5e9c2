"""Board entry point (copied to /main.py by rp2040/flash.py; the runtime is /lib/piconeox/).

Generates from /prompt.txt if it exists, else asks for prompts at the REPL, streaming the tokens
and printing tokens/s. The model is /model/{model.bin, vocab.bin, config.json}. A model the runtime
cannot use (missing, truncated, foreign, too large) is one `error:` line, then the REPL: main.py runs
at every boot, so a traceback here would repeat on each reset.
"""
from piconeox.generate import run_session

MODEL_DIR = "/model"


def read_prompt_file():
    try:
        with open("/prompt.txt") as f:
            return f.read()
    except OSError:  # no prompt file: interactive
        return None


def main():
    prompt = read_prompt_file()
    if prompt is not None:
        run_session(MODEL_DIR, prompt)
        return
    while True:
        prompt = input("prompt> ")
        if prompt:
            run_session(MODEL_DIR, prompt)


try:
    main()
except (ValueError, OSError, MemoryError, KeyError) as e:  # FormatError is a ValueError
    print("error:", e)
