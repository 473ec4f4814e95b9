// ONNX Runtime's own per-node profile of one model on the CPU execution provider (all graph
// optimisations on), to set beside `kiln run --dumpProfile`: which fused nodes ORT runs and what
// each costs. Random inputs of the model's declared shapes (float32 or int64 ones).
//
// Usage: node ort_profile.mjs MODEL THREADS RUNS
// Prints per node (name, op, kernel) the mean microseconds over RUNS runs after 20 warm-ups,
// sorted by time, and the total.
import fs from "node:fs";
import ort from "onnxruntime-node";

const [model, threadsText, runsText] = process.argv.slice(2);
if (!model) {
  console.error("usage: node ort_profile.mjs MODEL THREADS RUNS");
  process.exit(2);
}
const threads = Number(threadsText ?? 1), runs = Number(runsText ?? 200);
const session = await ort.InferenceSession.create(model, {
  executionProviders: ["cpu"],
  graphOptimizationLevel: "all",
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  enableProfiling: true,
  profileFilePrefix: `/tmp/ort_profile_${process.pid}`,
});
const feeds = {};
for (const name of session.inputNames) {
  const meta = session.inputMetadata?.find?.((m) => m.name === name);
  const dims = meta?.shape?.map((d) => (typeof d === "number" ? d : 1)) ?? [1];
  const count = dims.reduce((a, b) => a * b, 1);
  feeds[name] =
    meta?.type === "int64"
      ? new ort.Tensor("int64", BigInt64Array.from({ length: count }, (_, i) => BigInt(i % 100)), dims)
      : new ort.Tensor("float32", Float32Array.from({ length: count }, () => Math.random()), dims);
}
const warmUps = 20;
for (let i = 0; i < warmUps; ++i) await session.run(feeds);
const started = Date.now();
for (let i = 0; i < runs; ++i) await session.run(feeds);
const wall = (Date.now() - started) / runs;
await session.endProfiling();
const prefix = `ort_profile_${process.pid}`;
const file = fs.readdirSync("/tmp").find((f) => f.startsWith(prefix));
if (!file) throw new Error(`ONNX Runtime wrote no profile /tmp/${prefix}*`);
const events = JSON.parse(fs.readFileSync(`/tmp/${file}`, "utf8"));
fs.rmSync(`/tmp/${file}`, { force: true });
// Each node's events in run order: the warm-ups' come first and are dropped.
const byNode = new Map();
for (const e of events) {
  if (e.cat !== "Node" || !e.name.endsWith("_kernel_time")) continue;
  const name = e.name.replace(/_kernel_time$/, "");
  const row = byNode.get(name) ?? { name, op: e.args?.op_name ?? "?", times: [] };
  row.times.push(e.dur);
  byNode.set(name, row);
}
for (const row of byNode.values()) row.us = row.times.slice(-runs).reduce((a, b) => a + b, 0);
const rows = [...byNode.values()].sort((a, b) => b.us - a.us);
let total = 0;
for (const r of rows) total += r.us / runs;
console.log(`${model}: ${threads} thread(s), ${runs} runs, wall ${wall.toFixed(3)} ms a run, kernels ${(total / 1000).toFixed(3)} ms`);
for (const r of rows) {
  console.log(`${(r.us / runs / 1000).toFixed(4).padStart(8)} ms  ${r.op.padEnd(22)} ${r.name}`);
}
