// Boots real RP2040 MicroPython firmware in the rp2040js emulator with a littlefs image in flash, and
// talks to its USB-CDC REPL by a script of (wait for text, then type bytes) steps. Used by rp2040/emulate.py.
//
// stdin: {"firmware": path (.uf2 or .bin), "bootrom": path, "fs": path (image for flash offset 0xa0000),
//         optional "raw": path of a model.bin read in place, written at flash offset "raw_offset",
//         "steps": [{"wait": regex, "send": text}, ...], "done": regex, "max_wall_s": seconds,
//         "boot_s": emulated seconds, "boot_wall_s": seconds}: the REPL must answer the first two steps
//         (the firmware booted) by both deadlines, else status "no_boot" (a firmware that never boots).
// Each step types `send` once the console output since the previous step matches `wait` (JS regex).
// stdout: the console, byte for byte. stderr, last line: {"status": "ok"|"error"|"timeout"|"no_boot",
//         "cycles", "emu_ns", "idle_ns", "wall_s", "boot_ns"}. Exit 0 only when `done` was printed after the last step.
//
// The board (rp2040js, writable flash, the clock in emulated cycles): board.mjs. MicroPython's ticks_us() reads
// the emulated clock, so times measured on the device are the same on any host under any load.
import { readFileSync } from "node:fs";
import { Board, flashImage } from "./board.mjs";

const job = JSON.parse(readFileSync(0, "utf8"));
const board = new Board(job.bootrom, flashImage(job.firmware, job.fs, job.raw, job.raw_offset));
const { clock, mcu } = board;

const t0 = Date.now();
let seen = ""; // console text since the last step was sent
let step = 0;
let finished = false;
let bootNs = null; // emulated time when the REPL answered (step 2 reached)

function finish(status) {
  if (finished) return;
  finished = true;
  const summary = { status, cycles: mcu.core.cycles, emu_ns: clock.nanos, idle_ns: board.idleNs, wall_s: (Date.now() - t0) / 1000, boot_ns: bootNs };
  process.stdout.write("", () => {
    process.stderr.write("\n" + JSON.stringify(summary) + "\n");
    process.exit(status === "ok" ? 0 : 1);
  });
}

function advance() {
  // Type the next step's bytes once its text has appeared (a step without `wait` types at once).
  while (step < job.steps.length && new RegExp(job.steps[step].wait).test(seen)) {
    board.type(Array.from(job.steps[step].send, (ch) => ch.charCodeAt(0)));
    seen = "";
    step++;
    if (step === 2 && bootNs === null) bootNs = clock.nanos;
  }
}

board.onConnected = advance;
board.onSerial = (bytes) => {
  const text = Buffer.from(bytes).toString("latin1");
  process.stdout.write(Buffer.from(bytes));
  seen += text;
  if (step < job.steps.length) return advance();
  if (new RegExp(job.done).test(seen)) return finish("ok");
  if (/Traceback[\s\S]*\n>>> $/.test(seen)) finish("error"); // an exception back at the REPL prompt
};

function run() {
  const deadline = Date.now() + 100;
  while (!finished && Date.now() < deadline) board.run(100000);
  if ((Date.now() - t0) / 1000 > job.max_wall_s) return finish("timeout");
  if (bootNs === null && (clock.nanos > job.boot_s * 1e9 || (Date.now() - t0) / 1000 > job.boot_wall_s)) return finish("no_boot");
  if (!finished) setImmediate(run);
}
run();
