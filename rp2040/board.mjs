// One emulated Raspberry Pi Pico (rp2040js): boot ROM, firmware and a littlefs image in flash, its USB-CDC
// serial, and a flash that MicroPython can write. Shared by emulator.mjs (a scripted REPL conversation) and
// serve.mjs (the serial port on a TCP socket, for mpremote).
//
// Flash writes: rp2040js ignores the commands the boot ROM's flash_range_erase / flash_range_program send
// to the flash chip, so a write would silently vanish. The board runs those two ROM functions here instead,
// on the flash array (erase sets 0xff, program ANDs as NOR flash does), and advances the clock by a typical
// W25Q16JV's time (sector erase 45 ms, page program 0.4 ms) so emulated time stays near a real board's.
//
// Time: every instruction advances the clock by its Cortex-M0+ cycles at 125 MHz; while the core sleeps
// (WFI/WFE) the clock jumps to the next timer alarm. MicroPython's ticks_us() reads this clock.
import { readFileSync } from "node:fs";
import { decodeBlock } from "uf2";
import { Simulator, USBCDC, ConsoleLogger, LogLevel } from "rp2040js";

const FLASH_START = 0x10000000;
const FS_OFFSET = 0xa0000; // RPI_PICO: the filesystem is the last 1408 KiB of the 2 MiB flash
const CYCLE_NS = 1e9 / 125e6;
const CDC_FIFO = 512; // rp2040js USBCDC drops bytes beyond this many queued
const ERASE_NS_PER_4K = 45e6;
const PROGRAM_NS_PER_256 = 0.4e6;

/** The flash contents: the firmware (.uf2 blocks, or a raw .bin from offset 0), the filesystem image and, when
 *  given, a model.bin read in place (`raw`: its path, written at flash offset `rawOffset`). */
export function flashImage(firmware, fs, raw = null, rawOffset = 0) {
  const flash = new Uint8Array(16 * 1024 * 1024).fill(0xff);
  const fw = readFileSync(firmware);
  if (firmware.endsWith(".uf2")) {
    for (let off = 0; off + 512 <= fw.length; off += 512) {
      const { flashAddress, payload } = decodeBlock(fw.subarray(off, off + 512));
      flash.set(payload, flashAddress - FLASH_START);
    }
  } else {
    flash.set(fw, 0);
  }
  flash.set(readFileSync(fs), FS_OFFSET);
  if (raw) flash.set(readFileSync(raw), rawOffset);
  return flash;
}

/** Address of the boot ROM function with this two-letter code (its function table: code16, pointer16, ...). */
function romFunction(rom, code) {
  const view = new DataView(rom.buffer, rom.byteOffset, rom.length);
  const key = code.charCodeAt(0) | (code.charCodeAt(1) << 8);
  for (let p = view.getUint16(0x14, true); view.getUint16(p, true); p += 4) {
    if (view.getUint16(p, true) === key) return view.getUint16(p + 2, true) & ~1;
  }
  throw new Error(`boot ROM has no function ${code}`);
}

export class Board {
  /** Power on with `flash` (kept by reference: writes land in it, and a power cycle reuses it). */
  constructor(bootromPath, flash) {
    const rom = readFileSync(bootromPath);
    this.sim = new Simulator();
    this.clock = this.sim.clock;
    this.mcu = this.sim.rp2040;
    this.mcu.loadBootrom(new Uint32Array(rom.buffer, rom.byteOffset, rom.length / 4));
    this.mcu.logger = new ConsoleLogger(LogLevel.Error);
    this.mcu.flash.set(flash.subarray(0, this.mcu.flash.length));
    this.flash = this.mcu.flash;
    this.erasePC = romFunction(rom, "RE");
    this.programPC = romFunction(rom, "RP");
    this.idleNs = 0;
    this.typed = []; // bytes waiting for room in the CDC FIFO
    this.connected = false;
    this.cdc = new USBCDC(this.mcu.usbCtrl);
    this.cdc.onDeviceConnected = () => {
      this.connected = true;
      this.onConnected?.();
    };
    this.cdc.onSerialData = (bytes) => this.onSerial?.(bytes);
    this.mcu.core.PC = FLASH_START;
  }

  type(bytes) {
    for (const b of bytes) this.typed.push(b);
  }

  /** True when the core sleeps with nothing to wake it soon and no input queued: the host may rest. */
  get idle() {
    return this.mcu.core.waiting && !this.typed.length && !this.cdc.txFIFO.itemCount;
  }

  /** Run up to `n` steps (an instruction, a sleep to the next alarm, or a ROM flash call), then pass queued
   *  input on. With `restful`, stop at the second sleep with nothing queued and return true: the host may
   *  rest, and an idle board costs little (its clock moves one alarm per call). */
  run(n, restful = false) {
    const { mcu, clock } = this;
    const core = mcu.core;
    let slept = false;
    let i = 0;
    for (; i < n; i++) {
      if (core.waiting) {
        if (restful && slept && this.idle) break;
        const dt = clock.nanosToNextAlarm;
        clock.tick(dt > 0 ? dt : 0);
        if (dt > 0) this.idleNs += dt;
        slept = true;
      } else if (core.PC === this.erasePC || core.PC === this.programPC) {
        this.romFlashCall(core);
      } else {
        clock.tick(core.executeInstruction() * CYCLE_NS);
      }
    }
    while (this.connected && this.typed.length && this.cdc.txFIFO.itemCount < CDC_FIFO) {
      this.cdc.sendSerialByte(this.typed.shift());
    }
    return i < n;
  }

  romFlashCall(core) {
    const [offset, second, count] = core.registers;
    if (core.PC === this.erasePC) {  // flash_range_erase(offset, count, block_size, block_cmd)
      this.flash.fill(0xff, offset, offset + second);
      this.clock.tick(Math.ceil(second / 4096) * ERASE_NS_PER_4K);
    } else {  // flash_range_program(offset, data, count)
      for (let i = 0; i < count; i++) this.flash[offset + i] &= this.mcu.readUint8(second + i);
      this.clock.tick(Math.ceil(count / 256) * PROGRAM_NS_PER_256);
    }
    core.PC = core.LR & ~1;
  }
}
