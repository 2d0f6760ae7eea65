/**
 * `npm run bench`: send and receive throughput of the client against one local Herald node
 * (HERALD_BIN, dev mode, a temporary data dir), and the browser bundle size. Every send is
 * awaited: a send counts once the server stored it (OK).
 *
 * Two rounds: the server's and the client's default limits (one connection may send 1,000
 * sends/s, `intake.sends_per_connection`, and the client writes at most 1,800 frames/s, under
 * the server's 2,000 of `gateway.frames_per_second`), then with those limits off, which
 * measures the client and the node themselves.
 */
import { build } from "esbuild";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { jsonCodec, protoCodec, type FrameCodec, type HeraldClient } from "../src/node.js";
import { client, Herald, range, waitFor, within } from "../test/helpers.js";

const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const cleanups: (() => unknown)[] = [];
const scope = { after: (fn: () => unknown) => void cleanups.push(fn) };

const SEQUENTIAL = 1_000;

interface Round {
  readonly label: string;
  readonly inFlightTotal: number;
  readonly receiveTotal: number;
  /** Client options of the round. */
  readonly client: { maxFramesPerSecond?: number };
}

async function sendMany(sender: HeraldClient, conversation: string, total: number, inFlight: number): Promise<number> {
  let next = 0;
  const started = performance.now();
  await Promise.all(
    range(inFlight).map(async () => {
      while (next < total) await sender.send(conversation, `bench-${next++}`);
    }),
  );
  return total / ((performance.now() - started) / 1000);
}

function quantile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0;
}

async function sends(herald: Herald, codec: FrameCodec, label: string, round: Round): Promise<void> {
  const alice = client(scope, herald.url, "alice", { codec, deviceId: `bench-${label}`, ...round.client });
  let retries = 0;
  alice.client.on("retry", () => void (retries += 1));
  const drops: string[] = [];
  alice.client.on("disconnected", (info) => void drops.push(`${info.code} ${info.reason}`));
  await alice.client.whenConnected();
  const conversation = `dm:alice:bob-${label}`;
  await sendMany(alice.client, conversation, 50, 1); // warm up
  const latencies: number[] = [];
  const started = performance.now();
  for (const i of range(SEQUENTIAL)) {
    const at = performance.now();
    await alice.client.send(conversation, `seq-${i}`);
    latencies.push(performance.now() - at);
  }
  const rate = SEQUENTIAL / ((performance.now() - started) / 1000);
  latencies.sort((a, b) => a - b);
  console.log(
    `  ${label}: sequential ${rate.toFixed(0)} sends/s (p50 ${quantile(latencies, 0.5).toFixed(2)} ms, ` +
      `p99 ${quantile(latencies, 0.99).toFixed(2)} ms, ${SEQUENTIAL} sends)`,
  );
  for (const inFlight of [16, 256]) {
    retries = 0;
    const perSecond = await sendMany(alice.client, conversation, round.inFlightTotal, inFlight);
    const retried = retries > 0 ? `, ${retries} RETRY answers waited out` : "";
    console.log(`  ${label}: ${inFlight} in flight ${perSecond.toFixed(0)} sends/s (${round.inFlightTotal} sends${retried})`);
  }
  if (drops.length > 0) console.log(`  ${label}: the connection dropped ${drops.length} times: ${drops.join("; ")}`);
  await alice.client.close();
}

async function receive(herald: Herald, codec: FrameCodec, label: string, round: Round): Promise<void> {
  const total = round.receiveTotal;
  const conversation = `dm:alice:carol-${label}`;
  let count = 0;
  let first = 0;
  let last = 0;
  const carol = client(scope, herald.url, `carol-${label}`, {
    codec,
    ...round.client,
    onMessage: () => {
      if (count++ === 0) first = performance.now();
      last = performance.now();
    },
  });
  const alice = client(scope, herald.url, "alice", { codec, deviceId: `sender-${label}`, ...round.client });
  await Promise.all([carol.client.whenConnected(), alice.client.whenConnected()]);
  const started = performance.now();
  await sendMany(alice.client, conversation, total, 256);
  await waitFor("every message received", () => count >= total, 120_000);
  const perSecond = total / ((last - first) / 1000);
  console.log(
    `  ${label}: received ${perSecond.toFixed(0)} msgs/s, handled and acked in order ` +
      `(${total} messages; all in ${((last - started) / 1000).toFixed(2)} s from the first send)`,
  );
  await Promise.all([alice.client.close(), carol.client.close()]);
}

async function bundleSize(imports: string): Promise<{ min: number; gzip: number }> {
  const result = await build({
    stdin: {
      contents: `import { ${imports} } from "./src/index.ts"; console.log(${imports});`,
      resolveDir: PACKAGE_DIR,
      loader: "ts",
    },
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    write: false,
  });
  const code = result.outputFiles[0]!.contents;
  return { min: code.byteLength, gzip: gzipSync(code, { level: 9 }).byteLength };
}

async function main(): Promise<void> {
  const kib = (bytes: number) => `${(bytes / 1024).toFixed(1)} KiB`;
  console.log("browser bundle (esbuild, minified, gzip -9), as an app imports it:");
  const proto = await bundleSize("connect, LocalStorageSeqStore");
  console.log(`  protobuf: ${kib(proto.min)} min, ${kib(proto.gzip)} min+gzip (target <= 30 KiB: ${proto.gzip <= 30 * 1024 ? "met" : "MISSED"})`);
  const json = await bundleSize("connect, LocalStorageSeqStore, jsonCodec");
  console.log(`  with the JSON codec too: ${kib(json.min)} min, ${kib(json.gzip)} min+gzip`);

  const bin = process.env.HERALD_BIN ?? "../../target/debug/herald";
  const rounds: [Round, Record<string, string>, [FrameCodec, string][]][] = [
    [
      { label: "default limits", inFlightTotal: 5_000, receiveTotal: 5_000, client: {} },
      {},
      [[protoCodec, "proto"]],
    ],
    [
      { label: "limits off", inFlightTotal: 10_000, receiveTotal: 20_000, client: { maxFramesPerSecond: 0 } },
      {
        HERALD_INTAKE__SENDS_PER_CONNECTION: "0",
        HERALD_INTAKE__SENDS_PER_USER: "0",
        HERALD_GATEWAY__FRAMES_PER_SECOND: "0",
      },
      [
        [protoCodec, "proto"],
        [jsonCodec, "json"],
      ],
    ],
  ];
  for (const [round, env, codecs] of rounds) {
    const herald = await Herald.start(scope, { env });
    console.log(`one Herald node (${bin}), ${round.label}, data in ${herald.dataDir}:`);
    for (const [codec, label] of codecs) {
      await within(`${label} sends`, sends(herald, codec, label, round), 300_000);
      await within(`${label} receive`, receive(herald, codec, label, round), 300_000);
    }
    await herald.kill("SIGTERM");
  }
}

try {
  await main();
} finally {
  for (const cleanup of cleanups.reverse()) await cleanup();
}
