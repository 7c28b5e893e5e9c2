# Runs ON THE BOARD (MicroPython), typed into the REPL by rp2040/emulate.py after `ARGS = {...}`; never
# copied to flash. Loads /model as main.py would, generates ARGS["tokens"] tokens from ARGS["prompt"]
# with the model's default sampling, and prints "@@" lines: heap free (gc.mem_free) after importing and
# after loading, then per token its id, the step and sampling time in us (time.ticks_us: emulated time
# on an emulator) and the heap free right after it; "@@ error ..." on failure; "@@ DONE" last.
import gc
import time

gc.collect()
print("@@ heap_imported", gc.mem_free())
try:
    from piconeox.generate import Generator, load, prompt_ids, sampler_for

    model, tok, config = load("/model")
except Exception as e:  # FormatError, MemoryError, OSError: reported as one line by the host
    print("@@ error", type(e).__name__, e)
else:
    gen = Generator(model, sampler_for(model, config))
    ids = prompt_ids(tok, ARGS["prompt"], model.h.context)  # noqa: F821  (typed in before this file)
    gc.collect()
    print("@@ loaded", gc.mem_free(), model.stream, model.h.int8)
    print("@@ prompt", ids)
    t0 = time.ticks_us()
    gen.prompt(ids)
    print("@@ prompt_us", time.ticks_diff(time.ticks_us(), t0))
    n = 0
    while n < ARGS["tokens"] and gen.room() > 0:  # noqa: F821
        a = time.ticks_us()
        t = gen.sampler(gen.logits)  # gen.step(), split to time sampling apart from the forward pass
        b = time.ticks_us()
        if gen.room() > 0:
            gen.logits = model.forward(t, gen.pos)
            gen.pos += 1
        c = time.ticks_us()
        print("@@ tok", t, time.ticks_diff(c, a), time.ticks_diff(b, a), gc.mem_free())
        n += 1
        if t == tok.eos:
            break
    model.close()
print("@@ DONE")
