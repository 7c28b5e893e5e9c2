// Runs Python code in the pinned MicroPython WebAssembly interpreter, for tests and the benchmark.
// stdin: {"heapsize": bytes, "files": [[devicePath, hostPath], ...], "calls": ["python code", ...]}
// stdout: {"calls": [{"stdout", "live", "alloc", "ms"}]} or {"error": "..."} (exit 1).
// Each call is one runPython. MicroPython's gc only frees memory once control is back in JS, so
// every call ends with gc.collect(): "live" is the heap in use at the start of a call (the previous
// call's garbage collected) and "alloc" the bytes allocated during it.
import { readFileSync } from "node:fs";
import { loadMicroPython } from "@micropython/micropython-webassembly-pyscript/micropython.mjs";

const job = JSON.parse(readFileSync(0, "utf8"));
let out = [];
const mp = await loadMicroPython({
  heapsize: job.heapsize || 512 * 1024,
  stdout: (line) => out.push(line),
  stderr: (line) => out.push(line),
});

for (const [dev, host] of job.files || []) {
  const parts = dev.split("/").filter(Boolean);
  for (let i = 1; i < parts.length; i++) {
    const dir = "/" + parts.slice(0, i).join("/");
    try { mp.FS.mkdir(dir); } catch (e) { /* exists */ }
  }
  mp.FS.writeFile(dev, readFileSync(host));
}

const results = [];
mp.runPython("import gc, sys\nsys.path.append('/lib')");
for (const code of job.calls) {
  out = [];
  const t0 = performance.now();
  try {
    mp.runPython("__m0 = gc.mem_alloc()\n" + code + "\n__m1 = gc.mem_alloc()\ngc.collect()");
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: String(e.message || e), stdout: out.join("\n"), call: results.length }) + "\n");
    process.exit(1);
  }
  const ms = performance.now() - t0;
  const m0 = mp.globals.get("__m0"), m1 = mp.globals.get("__m1");
  results.push({ stdout: out.join("\n"), live: m0, alloc: m1 - m0, ms });
}
process.stdout.write(JSON.stringify({ calls: results }) + "\n");
