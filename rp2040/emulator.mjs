// Boots real RP2040 MicroPython firmware in the rp2040js emulator with a littlefs image in flash, and
// talks to its USB-CDC REPL by a script of (wait for text, then type bytes) steps. Used by rp2040/emulate.py.
//
// stdin: {"firmware": path (.uf2 or .bin), "bootrom": path, "fs": path (image for flash offset 0xa0000),
//         "steps": [{"wait": regex, "send": text}, ...], "done": regex, "max_wall_s": seconds,
//         "boot_s": emulated seconds, "boot_wall_s": seconds}: the REPL must answer the first two steps
//         (the firmware booted) by both deadlines, else status "no_boot" (a firmware that never boots).
// Each step types `send` once the console output since the previous step matches `wait` (JS regex).
// stdout: the console, byte for byte. stderr, last line: {"status": "ok"|"error"|"timeout"|"no_boot",
//         "cycles", "emu_ns", "idle_ns", "wall_s", "boot_ns"}. Exit 0 only when `done` was printed after the last step.
//
// Time: every instruction advances the clock by its Cortex-M0+ cycles at 125 MHz; while the core sleeps
// (WFI/WFE) the clock jumps to the next timer alarm. MicroPython's ticks_us() reads this clock, so times
// measured on the device are emulated time, the same on any host under any load.
import { readFileSync } from "node:fs";
import { decodeBlock } from "uf2";
import { Simulator, USBCDC, ConsoleLogger, LogLevel } from "rp2040js";

const FLASH_START = 0x10000000;
const FS_OFFSET = 0xa0000; // RPI_PICO: the filesystem is the last 1408 KiB of the 2 MiB flash
const CYCLE_NS = 1e9 / 125e6;
const CDC_FIFO = 512; // rp2040js USBCDC drops bytes beyond this many queued

const job = JSON.parse(readFileSync(0, "utf8"));
const sim = new Simulator();
const { clock, rp2040: mcu } = sim;
const rom = readFileSync(job.bootrom);
mcu.loadBootrom(new Uint32Array(rom.buffer, rom.byteOffset, rom.length / 4));
mcu.logger = new ConsoleLogger(LogLevel.Error);

const fw = readFileSync(job.firmware);
if (job.firmware.endsWith(".uf2")) {
  for (let off = 0; off + 512 <= fw.length; off += 512) {
    const { flashAddress, payload } = decodeBlock(fw.subarray(off, off + 512));
    mcu.flash.set(payload, flashAddress - FLASH_START);
  }
} else {
  mcu.flash.set(fw, 0);
}
mcu.flash.set(readFileSync(job.fs), FS_OFFSET);

const t0 = Date.now();
let idleNs = 0;
let seen = ""; // console text since the last step was sent
let step = 0;
let connected = false;
let finished = false;
let bootNs = null; // emulated time when the REPL answered (step 2 reached)
const typed = []; // bytes waiting for room in the CDC FIFO

function finish(status) {
  if (finished) return;
  finished = true;
  const summary = { status, cycles: mcu.core.cycles, emu_ns: clock.nanos, idle_ns: idleNs, wall_s: (Date.now() - t0) / 1000, boot_ns: bootNs };
  process.stdout.write("", () => {
    process.stderr.write("\n" + JSON.stringify(summary) + "\n");
    process.exit(status === "ok" ? 0 : 1);
  });
}

function advance() {
  // Type the next step's bytes once its text has appeared (a step without `wait` types at once).
  while (step < job.steps.length && new RegExp(job.steps[step].wait).test(seen)) {
    for (const ch of job.steps[step].send) typed.push(ch.charCodeAt(0));
    seen = "";
    step++;
    if (step === 2 && bootNs === null) bootNs = clock.nanos;
  }
}

const cdc = new USBCDC(mcu.usbCtrl);
cdc.onDeviceConnected = () => {
  connected = true;
  advance();
};
cdc.onSerialData = (bytes) => {
  const text = Buffer.from(bytes).toString("latin1");
  process.stdout.write(Buffer.from(bytes));
  seen += text;
  if (step < job.steps.length) return advance();
  if (new RegExp(job.done).test(seen)) return finish("ok");
  if (/Traceback[\s\S]*\n>>> $/.test(seen)) finish("error"); // an exception back at the REPL prompt
};

mcu.core.PC = FLASH_START;
function run() {
  const deadline = Date.now() + 100;
  while (!finished && Date.now() < deadline) {
    for (let i = 0; i < 100000; i++) {
      if (mcu.core.waiting) {
        const dt = clock.nanosToNextAlarm;
        clock.tick(dt > 0 ? dt : 0);
        if (dt > 0) idleNs += dt;
      } else {
        clock.tick(mcu.core.executeInstruction() * CYCLE_NS);
      }
    }
    while (connected && typed.length && cdc.txFIFO.itemCount < CDC_FIFO) cdc.sendSerialByte(typed.shift());
  }
  if ((Date.now() - t0) / 1000 > job.max_wall_s) return finish("timeout");
  if (bootNs === null && (clock.nanos > job.boot_s * 1e9 || (Date.now() - t0) / 1000 > job.boot_wall_s)) return finish("no_boot");
  if (!finished) setImmediate(run);
}
run();
