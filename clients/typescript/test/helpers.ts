/**
 * Test harness: real Herald processes (HERALD_BIN), a TCP proxy that can cut or freeze
 * connections, HS256 tokens, and a polling wait. No fixed sleep decides a verdict: tests wait
 * for conditions, with a timeout that fails loudly.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createHmac } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, connect as tcpConnect, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { jsonCodec } from "../src/json.js";
import {
  HeraldClient,
  MemorySeqStore,
  type ClientOptions,
  type HeraldMessage,
  type SeqStore,
  type WebSocketConstructor,
} from "../src/node.js";

/** The package folder (tests run from build-test/test/). */
const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The Herald binary: $HERALD_BIN, else ../../target/debug/herald. Missing: fail, never skip. */
export function heraldBin(): string {
  const bin = resolve(PACKAGE_DIR, process.env.HERALD_BIN ?? "../../target/debug/herald");
  if (!existsSync(bin)) {
    throw new Error(`no Herald binary at ${bin}: build it or set HERALD_BIN to its path`);
  }
  return bin;
}

/** A port free right now (Herald's --listen takes a fixed port). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  const address = server.address();
  await new Promise<void>((done) => server.close(() => done()));
  if (address === null || typeof address === "string") throw new Error("no port");
  return address.port;
}

/** Where cleanups go: a test's context (`t.after`), or the benchmark's own list. */
export interface Cleanup {
  after(fn: () => unknown): void;
}

/** Polls `condition` every 10 ms until it holds; fails with `what` after `timeoutMs`. */
export async function waitFor(what: string, condition: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await new Promise((done) => setTimeout(done, 10));
  }
}

/** Fails when `promise` takes longer than `timeoutMs`. */
export async function within<T>(what: string, promise: Promise<T>, timeoutMs = 30_000): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms: ${what}`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export interface HeraldOptions {
  /** `--dev` (default true). */
  readonly dev?: boolean;
  /** HERALD_* settings. */
  readonly env?: Record<string, string>;
}

/** One Herald node on a fixed port and data dir; it can be killed and started again there. */
export class Herald {
  private process: ChildProcess | undefined;
  private stderr = "";
  private constructor(
    readonly port: number,
    readonly dataDir: string,
    private readonly options: HeraldOptions,
  ) {}

  static async start(t: Cleanup, options: HeraldOptions = {}): Promise<Herald> {
    const bin = heraldBin();
    const dataDir = mkdtempSync(join(tmpdir(), "herald-client-test-"));
    const herald = new Herald(await freePort(), dataDir, options);
    t.after(async () => {
      await herald.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    });
    await herald.launch(bin);
    return herald;
  }

  get url(): string {
    return `ws://127.0.0.1:${this.port}/v1/ws`;
  }

  get http(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts the node again on the same port and data dir. */
  async restart(): Promise<void> {
    await this.launch(heraldBin());
  }

  /** Sends `signal` and waits for the process to exit. */
  async kill(signal: NodeJS.Signals): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((done) => child.once("exit", () => done()));
    child.kill(signal);
    await within(`herald to exit after ${signal}`, exited, 60_000);
    this.process = undefined;
  }

  private async launch(bin: string): Promise<void> {
    const args = ["serve", "--listen", `127.0.0.1:${this.port}`, "--data-dir", this.dataDir];
    if (this.options.dev !== false) args.push("--dev");
    // Only this test's HERALD_* settings: Herald refuses unknown HERALD_* variables.
    const env: Record<string, string> = { RUST_LOG: "warn" };
    for (const [key, value] of Object.entries(process.env)) {
      if (value !== undefined && !key.startsWith("HERALD_")) env[key] = value;
    }
    Object.assign(env, this.options.env ?? {});
    this.stderr = "";
    const child = spawn(bin, args, { env, stdio: ["ignore", "ignore", "pipe"] });
    child.stderr?.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-8_000);
    });
    this.process = child;
    const deadline = Date.now() + 30_000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`herald exited with ${child.exitCode}:\n${this.stderr}`);
      try {
        const answer = await fetch(`${this.http}/healthz`);
        if (answer.ok) return;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`herald did not come up on ${this.port}:\n${this.stderr}`);
      await new Promise((done) => setTimeout(done, 50));
    }
  }

  /** Posts an announcement to `room` (name without `room:`) with the dev API key. */
  async announce(room: string, content: string, announcementId?: string): Promise<{ seq: string; archived: boolean }> {
    const answer = await fetch(`${this.http}/v1/rooms/${room}/announcements`, {
      method: "POST",
      headers: { authorization: "Bearer dev-key", "content-type": "application/json" },
      body: JSON.stringify(announcementId ? { content, announcement_id: announcementId } : { content }),
    });
    if (answer.status !== 202 && answer.status !== 200) {
      throw new Error(`announcement refused: ${answer.status} ${await answer.text()}`);
    }
    return (await answer.json()) as { seq: string; archived: boolean };
  }
}

/**
 * A TCP proxy in front of a node: `cut()` drops every connection and refuses new ones until
 * `resume()` (a network outage with the server up); `freeze()` stops forwarding on the open
 * connections without closing them (a peer that died without a word).
 */
export class Proxy {
  private readonly pipes = new Set<{ client: Socket; upstream: Socket; frozen: boolean }>();
  private refusing = false;
  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(t: Cleanup, targetPort: number): Promise<Proxy> {
    let proxy: Proxy | undefined;
    const server = createServer((client) => proxy?.accept(client, targetPort));
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no port");
    proxy = new Proxy(server, address.port);
    const created = proxy;
    t.after(() => created.close());
    return proxy;
  }

  get url(): string {
    return `ws://127.0.0.1:${this.port}/v1/ws`;
  }

  /** Connections accepted and forwarding now. */
  get open(): number {
    return [...this.pipes].filter((pipe) => !pipe.frozen).length;
  }

  cut(): void {
    this.refusing = true;
    for (const pipe of this.pipes) {
      pipe.client.destroy();
      pipe.upstream.destroy();
    }
    this.pipes.clear();
  }

  resume(): void {
    this.refusing = false;
  }

  freeze(): void {
    for (const pipe of this.pipes) {
      pipe.frozen = true;
      pipe.client.unpipe(pipe.upstream);
      pipe.upstream.unpipe(pipe.client);
      // Read and drop whatever comes, so neither side sees back-pressure or a close.
      pipe.client.on("data", () => undefined);
      pipe.upstream.on("data", () => undefined);
    }
  }

  close(): void {
    this.cut();
    this.server.close();
  }

  private accept(client: Socket, targetPort: number): void {
    if (this.refusing) {
      client.destroy();
      return;
    }
    const upstream = tcpConnect(targetPort, "127.0.0.1");
    const pipe = { client, upstream, frozen: false };
    this.pipes.add(pipe);
    const end = () => {
      this.pipes.delete(pipe);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
    client.pipe(upstream);
    upstream.pipe(client);
  }
}

/** An HS256 JWT for `sub`, expiring `ttlSeconds` from now (node:crypto, no library). */
export function jwt(secret: string, sub: string, ttlSeconds: number): { token: string; exp: number } {
  const exp = Math.floor(Date.now() / 1000) + ttlSeconds;
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part({ sub, exp })}`;
  const signature = createHmac("sha256", secret).update(unsigned).digest("base64url");
  return { token: `${unsigned}.${signature}`, exp };
}

/** A client for `user` (dev token unless given), closed when the test ends; records messages. */
export function client(
  t: Cleanup,
  url: string,
  user: string,
  options: Partial<ClientOptions> & { store?: SeqStore } = {},
): { client: HeraldClient; received: HeraldMessage[]; texts: () => string[] } {
  const received: HeraldMessage[] = [];
  const trace = process.env.TRACE ? { WebSocket: tracing(`${user}/${options.deviceId ?? "test"}`) } : {};
  const instance = new HeraldClient({
    ...trace,
    url,
    token: `dev:${user}`,
    deviceId: "test",
    store: new MemorySeqStore(),
    // Quick reconnects keep the tests short; the backoff logic itself is unit-tested.
    reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
    onMessage: (message) => void received.push(message),
    ...options,
  });
  t.after(() => instance.close());
  instance.start();
  return { client: instance, received, texts: () => received.map(text) };
}

export function text(message: HeraldMessage): string {
  return new TextDecoder().decode(message.body);
}

/** Every message of a conversation, ascending, paging backwards with `history`. */
export async function historyAll(instance: HeraldClient, conversation: string): Promise<HeraldMessage[]> {
  const pages: HeraldMessage[][] = [];
  let before = 0n;
  for (;;) {
    const page = await within(`history of ${conversation}`, instance.history(conversation, { beforeSeq: before, limit: 500 }));
    pages.unshift(page.messages);
    const first = page.messages[0];
    if (!page.hasMore || !first) break;
    before = first.seq;
  }
  return pages.flat();
}

/** Asserts each text occurs once; returns how often each occurred. */
export function counts(texts: string[]): Map<string, number> {
  const seen = new Map<string, number>();
  for (const value of texts) seen.set(value, (seen.get(value) ?? 0) + 1);
  return seen;
}

export function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}

/** With TRACE=1: a `ws` WebSocket that prints every frame in and out (proto or JSON). */
function tracing(name: string): WebSocketConstructor {
  const show = (data: unknown) => {
    const frame = jsonCodec.decode(data);
    return JSON.stringify({ rid: frame.rid, [frame.body.case ?? "none"]: frame.body.value }, (key, value: unknown) =>
      key === "$typeName" ? undefined : typeof value === "bigint" ? value.toString() : value instanceof Uint8Array ? new TextDecoder().decode(value) : value,
    );
  };
  class Traced extends WebSocket {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols);
      this.addEventListener("message", (event) => console.error(`${name} <- ${show(event.data)}`));
      this.addEventListener("close", (event) => console.error(`${name} closed ${event.code} ${event.reason}`));
    }
    override send(data: string | Uint8Array): void {
      console.error(`${name} -> ${show(data)}`);
      super.send(data);
    }
  }
  return Traced as unknown as WebSocketConstructor;
}
