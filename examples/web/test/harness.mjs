// Test harness for the web chat page: a real Herald (HERALD_BIN) that can be killed and
// started again on its port and data dir, a TCP proxy that can cut one page off the network,
// and headless Chromium (Debian's, never a downloaded one) driven by playwright-core. Tests
// wait for conditions, with timeouts that fail loudly; no fixed sleep decides a verdict.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, connect as tcpConnect } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

/** How long a page may take to show what a test waits for. */
export const PAGE_WAIT_MS = 30_000;

/** The Herald binary: $HERALD_BIN (run-tests.sh sets it). Missing: fail, never skip. */
function heraldBin() {
  const bin = resolve(process.env.HERALD_BIN ?? "../../target/debug/herald");
  if (!existsSync(bin)) throw new Error(`no Herald binary at ${bin}: build it or set HERALD_BIN`);
  return bin;
}

async function freePort() {
  const server = createServer();
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  const { port } = server.address();
  await new Promise((done) => server.close(done));
  return port;
}

/** One dev-mode Herald on a fixed port and data dir. */
export class Herald {
  static async start(t) {
    const herald = new Herald(await freePort(), mkdtempSync(join(tmpdir(), "herald-web-test-")));
    t.after(async () => {
      await herald.kill("SIGKILL");
      rmSync(herald.dataDir, { recursive: true, force: true });
    });
    await herald.launch();
    const page = await (await fetch(`${herald.http}/`)).text();
    if (page.includes("web-page-missing") || !page.includes('id="connect"')) {
      throw new Error(
        `${heraldBin()} serves no web chat page at /: build the page (scripts/build-web.sh) and Herald with WEB_CHAT_PAGE set to it`,
      );
    }
    return herald;
  }

  constructor(port, dataDir) {
    this.port = port;
    this.dataDir = dataDir;
    this.child = undefined;
    this.stderr = "";
  }

  get http() {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Sends `signal` and waits for the process to exit. */
  async kill(signal) {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((done) => child.once("exit", done));
    child.kill(signal);
    await within(`herald to exit after ${signal}`, exited, 60_000);
    this.child = undefined;
  }

  /** Starts (again) on the same port and data dir; resolves once it answers /healthz. */
  async launch() {
    // Only RUST_LOG of ours: Herald refuses unknown HERALD_* variables.
    const env = { RUST_LOG: "warn" };
    for (const [key, value] of Object.entries(process.env)) if (!key.startsWith("HERALD_")) env[key] = value;
    const args = ["serve", "--dev", "--listen", `127.0.0.1:${this.port}`, "--data-dir", this.dataDir];
    const child = spawn(heraldBin(), args, { env, stdio: ["ignore", "ignore", "pipe"] });
    child.stderr.on("data", (chunk) => (this.stderr = (this.stderr + chunk).slice(-8_000)));
    this.child = child;
    const deadline = Date.now() + 30_000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`herald exited with ${child.exitCode}:\n${this.stderr}`);
      try {
        if ((await fetch(`${this.http}/healthz`)).ok) return;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`herald did not come up on ${this.port}:\n${this.stderr}`);
      await new Promise((done) => setTimeout(done, 50));
    }
  }

  /** Posts an archived announcement to `room` (its name without `room:`) with the dev key. */
  async announce(room, content) {
    const answer = await fetch(`${this.http}/v1/rooms/${room}/announcements`, {
      method: "POST",
      headers: { authorization: "Bearer dev-key", "content-type": "application/json" },
      body: JSON.stringify({ content, announcement_id: content }),
    });
    if (!answer.ok) throw new Error(`announcement refused: ${answer.status} ${await answer.text()}`);
    return answer.json();
  }
}

/** A TCP proxy in front of Herald: `cut()` drops its connections and refuses new ones until `resume()`. */
export class Proxy {
  static async start(t, targetPort) {
    const proxy = new Proxy(targetPort);
    await new Promise((done) => proxy.server.listen(0, "127.0.0.1", done));
    proxy.port = proxy.server.address().port;
    t.after(() => proxy.close());
    return proxy;
  }

  constructor(targetPort) {
    this.pipes = new Set();
    this.refusing = false;
    this.server = createServer((client) => {
      if (this.refusing) return void client.destroy();
      const upstream = tcpConnect(targetPort, "127.0.0.1");
      const pipe = { client, upstream };
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
    });
  }

  get url() {
    return `ws://127.0.0.1:${this.port}/v1/ws`;
  }

  cut() {
    this.refusing = true;
    for (const { client, upstream } of this.pipes) {
      client.destroy();
      upstream.destroy();
    }
    this.pipes.clear();
  }

  resume() {
    this.refusing = false;
  }

  close() {
    this.cut();
    this.server.close();
  }
}

/** Fails when `promise` takes longer than `timeoutMs`. */
export async function within(what, promise, timeoutMs = 30_000) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms: ${what}`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Headless Chromium from the machine (HERALD_TEST_CHROMIUM, default /usr/bin/chromium),
 * closed when the test ends. Playwright gives it a fresh temporary profile.
 */
export async function launchBrowser(t) {
  const executablePath = process.env.HERALD_TEST_CHROMIUM || "/usr/bin/chromium";
  if (!existsSync(executablePath)) {
    throw new Error(`the web page tests need Chromium at ${executablePath}: apt-get install -y chromium (or set HERALD_TEST_CHROMIUM)`);
  }
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    chromiumSandbox: false,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  t.after(() => browser.close());
  return browser;
}

/**
 * A tab of its own (its own localStorage) logged in as `user`; `ws` routes its WebSocket
 * elsewhere (a proxy). Page errors fail the test.
 */
export async function logIn(browser, herald, user, ws) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  page.errors = errors;
  await page.goto(`${herald.http}/${ws ? `?ws=${encodeURIComponent(ws)}` : ""}`);
  await page.fill("#user", user);
  await page.click("#connect");
  await waitForState(page, "connected", `${user} to be connected`);
  return page;
}

export async function waitForState(page, state, what) {
  await page.waitForFunction((wanted) => document.getElementById("status")?.dataset.state === wanted, state, {
    timeout: PAGE_WAIT_MS,
  }).catch((error) => {
    throw new Error(`${what}: #status never showed data-state=${state} (${error.message})`);
  });
}

/** Sends `text` to `peer` (a user or `room:<name>`) by typing and clicking. */
export async function say(page, peer, text) {
  await page.fill("#peer", peer);
  await page.fill("#text", text);
  await page.click("#send");
}

/** Opens `room` (subscribes) and waits until the page says it joined. */
export async function joinRoom(page, room) {
  await page.fill("#peer", room);
  await page.click("#join");
  await page.waitForFunction((name) => [...document.querySelectorAll("#log .notice")].some((n) => n.textContent.includes(`joined ${name}`)), room, {
    timeout: PAGE_WAIT_MS,
  });
}

/** The messages the page shows, top to bottom, with their data-* attributes and text. */
export function shown(page) {
  return page.evaluate(() =>
    [...document.querySelectorAll("#messages .message")].map((m) => ({
      ...m.dataset,
      text: m.querySelector(".text")?.textContent ?? "",
    })),
  );
}

/** Waits until every text of `texts` is shown as stored (data-status=ok) on `page`. */
export async function waitShown(page, texts, what) {
  await page
    .waitForFunction(
      (wanted) => {
        const ok = new Set(
          [...document.querySelectorAll("#messages .message")]
            .filter((m) => m.dataset.status === "ok")
            .map((m) => m.querySelector(".text")?.textContent),
        );
        return wanted.every((text) => ok.has(text));
      },
      texts,
      { timeout: PAGE_WAIT_MS, polling: 50 },
    )
    .catch(async (error) => {
      const seen = (await shown(page)).map((m) => `${m.text}(${m.status})`).join(", ");
      throw new Error(`${what}: not all of [${texts.join(", ")}] shown; the page shows [${seen}] (${error.message})`);
    });
}
