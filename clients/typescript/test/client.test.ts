/** Client behaviour that needs no Herald: attempts that hang, closing at any point. */
import assert from "node:assert/strict";
import { createServer, type Socket } from "node:net";
import { test } from "node:test";
import { HeraldClient, type DisconnectedInfo } from "../src/node.js";
import { waitFor } from "./helpers.js";

/** A TCP server that accepts and never answers (a hung proxy, a black-holed node). */
async function silentServer(t: { after(fn: () => unknown): void }): Promise<{ port: number; accepted: () => number }> {
  const sockets: Socket[] = [];
  const server = createServer((socket) => void sockets.push(socket));
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  t.after(() => {
    for (const socket of sockets) socket.destroy();
    server.close();
  });
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no port");
  return { port: address.port, accepted: () => sockets.length };
}

test("12. hung-attempt-times-out: an attempt that hangs before `connected` is dropped after connectTimeoutMs and retried", async (t) => {
  const silent = await silentServer(t);
  const client = new HeraldClient({
    url: `ws://127.0.0.1:${silent.port}/v1/ws`,
    token: "dev:alice",
    deviceId: "test",
    connectTimeoutMs: 200,
    reconnect: { initialDelayMs: 10, maxDelayMs: 20 },
  });
  const closes: DisconnectedInfo[] = [];
  client.on("disconnected", (info) => void closes.push(info));
  client.start();
  const sending = client.send("dm:alice:bob", "never connected");
  await waitFor("two timed-out attempts", () => closes.length >= 2 && silent.accepted() >= 3, 10_000);
  assert.equal(closes[0]!.code, 4000);
  assert.equal(closes[0]!.wasConnected, false);
  assert.equal(closes[0]!.willReconnect, true);
  // Closing while an attempt is under way neither throws nor leaves the send hanging.
  await client.close();
  await assert.rejects(sending, { name: "SendAbandonedError" });
  assert.equal(client.state, "closed");
});
