// ONNX Runtime's CPU execution provider on one model, as bench/cpu/vs_ort.sh's peer of kiln: the
// inputs kiln ran (`kiln run --saveInputs`), all graph optimisations on, a given number of intra-op
// threads; latency of each run after a warm-up, and the outputs compared with kiln's
// (`kiln run --saveOutputs`). Prints one JSON object, with every run's latency.
//
// Usage: node ort_run.mjs MODEL INPUTS.npz THREADS SECONDS [KILN_OUTPUTS.npz ...]
// (each outputs file compared: `outputs` for the first, `moreOutputs` for the rest, in order)
import fs from "node:fs";
import zlib from "node:zlib";
import ort from "onnxruntime-node";

// --- numpy's .npz (a zip of .npy files, stored or deflated) ------------------------------------

const kTypes = {
  "<f4": ["float32", Float32Array],
  "<f8": ["float64", Float64Array],
  "<i8": ["int64", BigInt64Array],
  "<i4": ["int32", Int32Array],
  "<i2": ["int16", Int16Array],
  "|i1": ["int8", Int8Array],
  "|u1": ["uint8", Uint8Array],
  "|b1": ["bool", Uint8Array],
  "<f2": ["float16", Uint16Array],
};

function parseNpy(bytes, where) {
  if (bytes[0] !== 0x93 || bytes.toString("latin1", 1, 6) !== "NUMPY") {
    throw new Error(`${where}: not a .npy array`);
  }
  const major = bytes[6];
  const headerLength = major === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = bytes.toString("latin1", start, start + headerLength);
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*True/.test(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (!descr || !(descr in kTypes) || shapeText === undefined || fortran) {
    throw new Error(`${where}: unsupported .npy header ${header.trim()}`);
  }
  const dims = shapeText.split(",").map((d) => d.trim()).filter((d) => d.length).map(Number);
  const [type, Array_] = kTypes[descr];
  const data = bytes.subarray(start + headerLength);
  const copy = new Uint8Array(data.length);
  copy.set(data);
  const count = dims.reduce((a, b) => a * b, 1);
  return { type, dims, data: new Array_(copy.buffer, 0, count) };
}

function readNpz(path) {
  const zip = fs.readFileSync(path);
  const eocd = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  if (eocd < 0) throw new Error(`${path}: not a zip (.npz) file`);
  const entries = zip.readUInt16LE(eocd + 10);
  let at = zip.readUInt32LE(eocd + 16);
  const arrays = new Map();
  for (let e = 0; e < entries; ++e) {
    if (zip.readUInt32LE(at) !== 0x02014b50) throw new Error(`${path}: bad central directory`);
    const method = zip.readUInt16LE(at + 10);
    const compressed = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const extraLength = zip.readUInt16LE(at + 30);
    const commentLength = zip.readUInt16LE(at + 32);
    const local = zip.readUInt32LE(at + 42);
    const name = zip.toString("utf8", at + 46, at + 46 + nameLength);
    at += 46 + nameLength + extraLength + commentLength;
    const dataStart = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
    const raw = zip.subarray(dataStart, dataStart + compressed);
    const bytes = method === 0 ? raw : method === 8 ? zlib.inflateRawSync(raw) : null;
    if (!bytes) throw new Error(`${path}: ${name} uses zip method ${method}`);
    arrays.set(name.replace(/\.npy$/, ""), parseNpy(Buffer.from(bytes), `${path}:${name}`));
  }
  return arrays;
}

// --- comparison -------------------------------------------------------------------------------

function toNumbers(array) {
  return Array.from(array.data, (v) => Number(v));
}

// Max abs difference and cosine distance (1 - cos) of two outputs of one shape.
function compare(ours, theirs) {
  const a = toNumbers(ours);
  const b = toNumbers(theirs);
  if (a.length !== b.length) return { error: `${a.length} against ${b.length} elements` };
  let maxAbs = 0;
  let dot = 0;
  let na = 0;
  let nb = 0;
  let maxRef = 0;
  for (let i = 0; i < a.length; ++i) {
    maxAbs = Math.max(maxAbs, Math.abs(a[i] - b[i]));
    maxRef = Math.max(maxRef, Math.abs(b[i]));
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const cosine = na === 0 && nb === 0 ? 0 : 1 - dot / Math.sqrt(na * nb);
  // ONNX Runtime's output the same number everywhere (a zero-initialised classifier head, as
  // torchvision's ViT has): agreeing with it proves little about the rest of the model.
  const constant = b.every((v) => v === b[0]);
  return { maxAbs, maxRef, cosineDistance: Math.max(0, cosine), constant };
}

// --- timing -----------------------------------------------------------------------------------

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.round(p * (sorted.length - 1)))];
}

async function main() {
  const [model, inputsPath, threadsText, secondsText, ...kilnOutputs] = process.argv.slice(2);
  if (!model || !inputsPath || !threadsText || !secondsText) {
    throw new Error(
      "usage: node ort_run.mjs MODEL INPUTS.npz THREADS SECONDS [KILN_OUTPUTS.npz ...]",
    );
  }
  const threads = Number(threadsText);
  const seconds = Number(secondsText);
  const session = await ort.InferenceSession.create(model, {
    executionProviders: ["cpu"],
    graphOptimizationLevel: "all",
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: "sequential",
  });
  const inputs = readNpz(inputsPath);
  const feeds = {};
  for (const name of session.inputNames) {
    const a = inputs.get(name);
    if (!a) throw new Error(`${inputsPath} has no array for input '${name}'`);
    feeds[name] = new ort.Tensor(a.type, a.data, a.dims);
  }
  // Warm-up: a tenth of the timed duration, at least three runs.
  let outputs;
  const warmUntil = performance.now() + 100 * seconds;
  for (let i = 0; i < 3 || performance.now() < warmUntil; ++i) outputs = await session.run(feeds);
  const latencies = [];
  const until = performance.now() + 1000 * seconds;
  while (latencies.length < 10 || performance.now() < until) {
    const t0 = process.hrtime.bigint();
    outputs = await session.run(feeds);
    latencies.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const sorted = [...latencies].sort((x, y) => x - y);
  const result = {
    runtime: `onnxruntime-node ${ort.env.versions?.node ?? "1.30.0"} (CPU execution provider)`,
    model,
    threads,
    runs: latencies.length,
    medianMs: percentile(sorted, 0.5),
    p10Ms: percentile(sorted, 0.1),
    p90Ms: percentile(sorted, 0.9),
    latenciesMs: latencies,
    outputs: [],
    moreOutputs: [],
  };
  kilnOutputs.forEach((file, index) => {
    const kiln = readNpz(file);
    const compared = session.outputNames.map((name) => {
      const ours = kiln.get(name);
      return ours
        ? { name, ...compare(ours, { data: outputs[name].data }) }
        : { name, error: `${file} has no output '${name}'` };
    });
    if (index === 0) {
      result.outputs = compared;
    } else {
      result.moreOutputs.push({ file, outputs: compared });
    }
  });
  process.stdout.write(JSON.stringify(result) + "\n");
}

main().catch((error) => {
  process.stderr.write(`ort_run: ${error.message}\n`);
  process.exit(1);
});
