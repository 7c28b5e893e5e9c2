// An emulated Pico whose USB serial port is a TCP socket, so mpremote can talk to it
// (`mpremote connect socket://127.0.0.1:PORT`). Used by `python -m rp2040.serve`.
//
// stdin, first line: {"firmware": path, "bootrom": path, "fs": path (image for flash offset 0xa0000),
//   "port": TCP port on 127.0.0.1 (0: any free one)}. Then one command a line: "reset" power-cycles the board
//   (flash kept, the host's connection dropped as a USB unplug drops it); "reset N" does so once the host has
//   sent N more bytes (a reset in the middle of a transfer, at a repeatable point). End of stdin stops the board.
// stdout: JSON lines: {"port": N} once listening, {"armed": N} for "reset N", {"reset": n} after the nth power cycle.
// One host at a time (a serial port opens exclusively): a second connection is closed at once.
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { Board, flashImage } from "./board.mjs";

const SLICE_MS = 50; // run this long between looks at the sockets
const REST_MS = 1; // then, when the board sleeps with nothing queued, wait this long

let job = null;
let board = null;
let host = null; // the connected socket
let resets = 0;
let resetAfter = null; // bytes the host may still send before the armed reset
let restTimer = null; // set while the board rests: input ends the rest at once

function say(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function powerOn(flash) {
  board = new Board(job.bootrom, flash);
  board.onSerial = (bytes) => host?.write(Buffer.from(bytes));
}

function reset() {
  host?.destroy();
  host = null;
  powerOn(board.flash);
  say({ reset: ++resets });
}

function run() {
  restTimer = null;
  const deadline = Date.now() + SLICE_MS;
  let resting = false;
  while (!resting && Date.now() < deadline) resting = board.run(20000, true);
  if (resting) restTimer = setTimeout(run, REST_MS);
  else setImmediate(run);
}

const server = createServer((socket) => {
  if (host) return socket.destroy();
  host = socket;
  socket.setNoDelay(true);
  socket.on("data", (data) => {
    if (resetAfter !== null && (resetAfter -= data.length) <= 0) {
      resetAfter = null;
      return reset();
    }
    board.type(data);
    if (restTimer) {
      clearTimeout(restTimer);
      run();
    }
  });
  socket.on("error", () => {});
  socket.on("close", () => {
    if (host === socket) host = null;
  });
});

const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (job === null) {
    job = JSON.parse(line);
    powerOn(flashImage(job.firmware, job.fs));
    server.listen(job.port, "127.0.0.1", () => say({ port: server.address().port }));
    run();
  } else if (/^reset( \d+)?$/.test(line.trim())) {
    const after = Number(line.trim().split(" ")[1] || 0);
    if (after > 0) {
      resetAfter = after;
      say({ armed: after });
    } else {
      reset();
    }
  }
});
lines.on("close", () => process.exit(0));
server.on("error", (e) => {
  process.stderr.write(`cannot serve on 127.0.0.1:${job.port}: ${e.message}\n`);
  process.exit(1);
});
