/**
 * Conformance scenarios of clients/SPEC.md, against real Herald processes (HERALD_BIN).
 * Each test starts its own node(s) with a temporary data dir and stops them at the end.
 */
import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import { WebSocketServer } from "ws";
import { protoCodec } from "../src/codec.js";
import { jsonCodec } from "../src/json.js";
import {
  MemorySeqStore,
  SendRejectedError,
  type DisconnectedInfo,
  type GoAwayInfo,
  type HeraldClient,
  type RetryInfo,
  type SendResult,
} from "../src/node.js";
import { client, counts, freePort, Herald, historyAll, jwt, Proxy, range, text, waitFor, within } from "./helpers.js";

const DM = "dm:alice:bob";

/** Sends `count` messages `prefix-i` from `workers` concurrent loops, each send awaited. */
function sendAll(
  sender: HeraldClient,
  conversation: string,
  prefix: string,
  count: number,
  workers: number,
  onResult: (body: string, result: SendResult) => void,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const body = `${prefix}-${next++}`;
      onResult(body, await sender.send(conversation, body));
    }
  };
  return Promise.all(range(workers).map(worker)).then(() => undefined);
}

/** Asserts the history holds each body exactly once, with the ids the sends resolved with. */
async function assertStoredOnce(reader: HeraldClient, conversation: string, results: Map<string, SendResult>) {
  const history = await historyAll(reader, conversation);
  const seen = counts(history.map(text));
  for (const [body, result] of results) {
    assert.equal(seen.get(body), 1, `${body} is stored once`);
    const stored = history.find((message) => text(message) === body)!;
    assert.equal(stored.id, result.messageId, `${body}: the send resolved with the stored id`);
    assert.equal(stored.seq, result.seq, `${body}: the send resolved with the stored seq`);
  }
  return history;
}

/**
 * Waits until `receiver` got `marker` (sent last, after everything else), then returns its
 * texts: nothing sent before the marker can still be on its way, so the list is final.
 */
async function barrier(t: TestContext, herald: Herald, receiver: { texts: () => string[] }, conversation = DM) {
  const marker = `marker-${Math.random()}`;
  const sender = client(t, herald.url, "alice", { deviceId: "marker" });
  if (conversation.startsWith("room:")) await herald.announce(conversation.slice(5), marker);
  else await within("marker send", sender.client.send(conversation, marker));
  await waitFor(`the marker in ${conversation}`, () => receiver.texts().includes(marker));
  const texts = receiver.texts();
  assert.equal(texts[texts.length - 1], marker, "nothing arrives after the marker");
  return texts.slice(0, -1);
}

test("1. retry-resend-stored-once: a resend after RETRY is one stored message", async (t) => {
  // Ten sends a second per connection (burst 5): a burst of 30 meets RETRY honestly, from the intake.
  const herald = await Herald.start(t, {
    env: { HERALD_INTAKE__SENDS_PER_CONNECTION: "10", HERALD_INTAKE__CONNECTION_BURST: "5" },
  });
  const alice = client(t, herald.url, "alice", { codec: jsonCodec });
  const retries: RetryInfo[] = [];
  alice.client.on("retry", (retry) => void retries.push(retry));
  const results = new Map<string, SendResult>();
  await within(
    "30 sends",
    Promise.all(range(30).map((i) => alice.client.send(DM, `r-${i}`).then((result) => results.set(`r-${i}`, result)))),
  );
  assert.ok(retries.length > 0, "the server answered RETRY");
  assert.ok(retries.every((retry) => retry.retryAfterMs > 0), "each RETRY said how long to wait");
  assert.equal(results.size, 30);
  const history = await assertStoredOnce(alice.client, DM, results);
  assert.equal(history.length, 30);
});

test("2. kill-9-mid-sends: a server killed (-9) in the middle of 200 sends: each send resolves once, each message is stored once", async (t) => {
  const herald = await Herald.start(t);
  const alice = client(t, herald.url, "alice");
  const bob = client(t, herald.url, "bob");
  await Promise.all([alice.client.whenConnected(), bob.client.whenConnected()]);
  const results = new Map<string, SendResult>();
  let resolvedTwice = false;
  let killed: Promise<void> | undefined;
  let ackedAtKill = 0;
  const sending = sendAll(alice.client, DM, "k", 200, 4, (body, result) => {
    resolvedTwice ||= results.has(body);
    results.set(body, result);
    // The signal goes out with the 40th ack, not at the next poll: the kill lands mid-way.
    if (results.size === 40) {
      killed = herald.kill("SIGKILL");
      ackedAtKill = results.size;
    }
  });
  await waitFor("the kill after 40 acks", () => killed !== undefined);
  await killed;
  assert.ok(ackedAtKill < 200, `the kill came in the middle (${ackedAtKill} of 200 acked)`);
  await herald.restart();
  await within("the 200 sends after the restart", sending, 60_000);
  assert.equal(resolvedTwice, false);
  assert.equal(results.size, 200);
  const history = await assertStoredOnce(alice.client, DM, results);
  assert.equal(history.length, 200);
  // Bob's view: every message once, in seq order, across the crash (whose seqs have gaps).
  const received = await barrier(t, herald, bob);
  assert.deepEqual(received, history.map(text));
});

test("3. offline-messages-once-in-order: messages sent while a client was offline arrive once, in order, after it reconnects", async (t) => {
  const herald = await Herald.start(t);
  const proxy = await Proxy.start(t, herald.port);
  const store = new MemorySeqStore();
  const bob = client(t, proxy.url, "bob", { store });
  const alice = client(t, herald.url, "alice");
  const resumed: number[] = [];
  bob.client.on("resumed", (info) => void resumed.push(info.offlineMs));

  for (const i of range(5)) {
    await alice.client.send(DM, `before-${i}`);
    // Bob's own messages take seqs between Alice's: they must not stall his order.
    if (i % 2 === 0) await bob.client.send(DM, `own-${i}`);
  }
  await waitFor("bob got the first 5", () => bob.received.length === 5);

  proxy.cut();
  await waitFor("bob noticed the outage", () => bob.client.state !== "connected");
  for (const i of range(30)) await alice.client.send(DM, `offline-${i}`);
  proxy.resume();
  await waitFor("bob resumed", () => resumed.length === 1);

  const expected = [...range(5).map((i) => `before-${i}`), ...range(30).map((i) => `offline-${i}`)];
  assert.deepEqual(await barrier(t, herald, bob), expected);

  // A reload: a new client on the same device and store resumes, replaying nothing.
  await bob.client.close();
  for (const i of range(10)) await alice.client.send(DM, `reloaded-${i}`);
  const reloaded = client(t, herald.url, "bob", { store });
  assert.deepEqual(
    await barrier(t, herald, reloaded),
    range(10).map((i) => `reloaded-${i}`),
  );
});

test("4. room-catch-up-after-reconnect: a room announcement posted while away arrives after the reconnect", async (t) => {
  const herald = await Herald.start(t);
  const proxy = await Proxy.start(t, herald.port);
  const store = new MemorySeqStore();
  const bob = client(t, proxy.url, "bob", { store, codec: jsonCodec });
  await within("subscribe", bob.client.subscribe("room:lobby"));
  const posted = await herald.announce("lobby", "a1", "a1");
  assert.equal(posted.archived, true, "announcements are archived (history for catch-up)");
  await waitFor("a1 live", () => bob.texts().includes("a1"));

  proxy.cut();
  await waitFor("bob noticed the outage", () => bob.client.state !== "connected");
  await herald.announce("lobby", "a2", "a2");
  await herald.announce("lobby", "a3", "a3");
  proxy.resume();
  assert.deepEqual(await barrier(t, herald, bob, "room:lobby"), ["a1", "a2", "a3"]);

  // A reloaded page joins again from its stored seq: what came meanwhile, nothing older.
  await bob.client.close();
  await herald.announce("lobby", "a4", "a4");
  const reloaded = client(t, herald.url, "bob", { store, codec: jsonCodec });
  await within("subscribe again", reloaded.client.subscribe("lobby"));
  assert.deepEqual(await barrier(t, herald, reloaded, "room:lobby"), ["a4"]);
});

test("5. token-refresh-on-4001: an expired token is refreshed without losing a send", async (t) => {
  const secret = "conformance-test-secret-0123456789abcdef";
  const herald = await Herald.start(t, { dev: false, env: { HERALD_GATEWAY__JWT_SECRET: secret } });
  const proxy = await Proxy.start(t, herald.port);
  const reasons: string[] = [];
  let exp = 0;
  const alice = client(t, proxy.url, "alice", {
    token: (reason) => {
      reasons.push(reason);
      const issued = jwt(secret, "alice", 1);
      exp = issued.exp;
      return issued.token;
    },
  });
  const closes: DisconnectedInfo[] = [];
  alice.client.on("disconnected", (info) => void closes.push(info));
  await within("connected", alice.client.whenConnected());
  const first = await alice.client.send(DM, "with-the-first-token");

  proxy.cut();
  await waitFor("alice noticed the outage", () => alice.client.state !== "connected");
  // The server allows 5 s of clock leeway: wait until the token is surely expired.
  await waitFor("the token expired", () => Date.now() / 1000 > exp + 6, 15_000);
  const sending = alice.client.send(DM, "after-expiry");
  proxy.resume();
  const second = await within("the send after the refresh", sending);

  assert.ok(closes.some((close) => close.code === 4001), "the stale token was refused with 4001");
  assert.deepEqual(reasons, ["initial", "expired"], "the provider was asked again after 4001");
  await assertStoredOnce(
    alice.client,
    DM,
    new Map([
      ["with-the-first-token", first],
      ["after-expiry", second],
    ]),
  );
});

test("6. go-away-on-sigterm: go_away: a node shutting down (SIGTERM) sends go_away; the client reconnects and loses nothing", async (t) => {
  const herald = await Herald.start(t, { env: { HERALD_GATEWAY__GO_AWAY_SPREAD_MS: "1000" } });
  const alice = client(t, herald.url, "alice");
  const bob = client(t, herald.url, "bob");
  const goAways: GoAwayInfo[] = [];
  alice.client.on("goAway", (info) => void goAways.push(info));
  await Promise.all([alice.client.whenConnected(), bob.client.whenConnected()]);
  const results = new Map<string, SendResult>();
  let stopped: Promise<void> | undefined;
  const sending = sendAll(alice.client, DM, "g", 100, 4, (body, result) => {
    results.set(body, result);
    if (results.size === 30) stopped = herald.kill("SIGTERM");
  });
  await waitFor("SIGTERM after 30 acks", () => stopped !== undefined);
  await stopped;
  assert.ok(results.size < 100, `the drain came in the middle (${results.size} of 100 acked)`);
  assert.equal(goAways.length, 1, "go_away came before the close");
  assert.ok(goAways[0]!.reconnectAfterMs <= 1000, "within the configured spread");
  await herald.restart();
  await within("the 100 sends", sending, 60_000);
  const history = await assertStoredOnce(alice.client, DM, results);
  assert.equal(history.length, 100);
  assert.deepEqual(await barrier(t, herald, bob), history.map(text));
});

test("6b. go-away-reconnect-url: go_away with reconnect_url: the client moves to the named node", async (t) => {
  const herald = await Herald.start(t);
  // A draining node: answers `connect` with go_away naming the real node, then closes 1012.
  const port = await freePort();
  const draining = new WebSocketServer({ host: "127.0.0.1", port, handleProtocols: (offered) => [...offered][0] ?? false });
  t.after(() => draining.close());
  let drained = 0;
  draining.on("connection", (socket) => {
    drained += 1;
    socket.on("message", (data, isBinary) => {
      const codec = socket.protocol === jsonCodec.subprotocol ? jsonCodec : protoCodec;
      const frame = codec.decode(isBinary ? new Uint8Array(data as Buffer) : data.toString());
      if (frame.body.case !== "connect") return;
      const reason = "server shutting down; reconnect";
      socket.send(codec.encode(0, { case: "goAway", value: { reason, reconnectAfterMs: 100, reconnectUrl: herald.url } }));
      socket.close(1012, reason);
    });
  });
  const alice = client(t, `ws://127.0.0.1:${port}/v1/ws`, "alice");
  const goAways: GoAwayInfo[] = [];
  alice.client.on("goAway", (info) => void goAways.push(info));
  const result = await within("a send through the new node", alice.client.send(DM, "moved"));
  assert.equal(alice.client.session?.url, herald.url, "connected to reconnect_url");
  assert.equal(goAways[0]?.reconnectUrl, herald.url);
  assert.equal(drained, 1, "one visit to the draining node");
  await assertStoredOnce(alice.client, DM, new Map([["moved", result]]));
});

test("7. dead-server-detected: a silent server is taken as gone; the client reconnects and the send goes through", async (t) => {
  const herald = await Herald.start(t);
  const proxy = await Proxy.start(t, herald.port);
  const alice = client(t, proxy.url, "alice", { deadAfterMs: 1_500 });
  const closes: DisconnectedInfo[] = [];
  alice.client.on("disconnected", (info) => void closes.push(info));
  await within("connected", alice.client.whenConnected());
  proxy.freeze();
  const sending = alice.client.send(DM, "through-a-dead-link");
  await waitFor("the client gave the silent connection up", () => closes.length > 0, 10_000);
  assert.equal(closes[0]!.code, 4000, "closed by the client for silence");
  const result = await within("the send on the new connection", sending);
  await assertStoredOnce(alice.client, DM, new Map([["through-a-dead-link", result]]));
});

test("8. rejected-typed-error: REJECTED rejects with a typed error carrying the reason", async (t) => {
  const herald = await Herald.start(t);
  const alice = client(t, herald.url, "alice");
  await assert.rejects(alice.client.send("dm:bob:alice", "wrong order"), (error: unknown) => {
    assert.ok(error instanceof SendRejectedError);
    assert.match(error.reason, /a < b/);
    assert.equal(error.conversation, "dm:bob:alice");
    return true;
  });
  await assert.rejects(alice.client.send("room:lobby", "not subscribed"), SendRejectedError);
});

test("9. acks-after-handler: acks reach the server: a handled message is not pushed to the device again", async (t) => {
  const herald = await Herald.start(t);
  const alice = client(t, herald.url, "alice");
  let slow = 0;
  const bob = client(t, herald.url, "bob", {
    // A slow handler: the ack may only go once it returned.
    onMessage: async (message) => {
      await new Promise((done) => setTimeout(done, 20));
      slow += 1;
      bob.received.push(message);
    },
  });
  for (const i of range(5)) await alice.client.send(DM, `once-${i}`);
  await waitFor("bob handled 5", () => slow === 5);
  await bob.client.close();
  // A fresh store: only the server's cursor of this device can keep these from coming back.
  const again = client(t, herald.url, "bob", { store: new MemorySeqStore() });
  assert.deepEqual(await barrier(t, herald, again), []);
});

test("10. duplicate-original-ids: a send reusing a stored client_msg_id resolves DUPLICATE with the original ids", async (t) => {
  const herald = await Herald.start(t);
  const alice = client(t, herald.url, "alice");
  const clientMsgId = "01972b4e-8c00-7a3e-9f1d-3c5e6a7b8c9d";
  const first = await within("first send", alice.client.send(DM, "once", { clientMsgId }));
  const again = await within("the same id again", alice.client.send(DM, "once", { clientMsgId }));
  assert.equal(first.duplicate, false);
  assert.equal(again.duplicate, true);
  assert.equal(again.messageId, first.messageId);
  assert.equal(again.seq, first.seq);
  assert.equal((await historyAll(alice.client, DM)).length, 1);
});

test("11. kicked-is-final: kicked by the same device connecting elsewhere (4009): the client stops for good", async (t) => {
  const herald = await Herald.start(t);
  const first = client(t, herald.url, "alice", { deviceId: "phone" });
  const closes: DisconnectedInfo[] = [];
  first.client.on("disconnected", (info) => void closes.push(info));
  await within("first connected", first.client.whenConnected());
  const second = client(t, herald.url, "alice", { deviceId: "phone" });
  await within("second connected", second.client.whenConnected());
  await waitFor("the first client closed", () => first.client.state === "closed");
  assert.equal(closes[0]?.code, 4009);
  assert.equal(closes[0]?.willReconnect, false, "reconnecting would kick the other one back");
  await assert.rejects(first.client.send(DM, "too late"), { name: "SendAbandonedError" });
  assert.equal(second.client.state, "connected", "the newer connection stays");
});
