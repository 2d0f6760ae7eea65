/** Unit tests of the pure parts: ordering buffer, backoff, codec, stores. No server. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Backoff } from "../src/backoff.js";
import { protoCodec } from "../src/codec.js";
import { jsonCodec } from "../src/json.js";
import { SendAck_Status } from "../src/gen/herald/v1/frames_pb.js";
import { ConversationOrder, type Release } from "../src/order.js";
import { FrameBudget, SendWindow } from "../src/pacing.js";
import { LocalStorageSeqStore, MemorySeqStore, uuid } from "../src/node.js";

interface M {
  seq: bigint;
  text: string;
}
const m = (seq: number): M => ({ seq: BigInt(seq), text: `m${seq}` });
const seqs = (released: Release<M>[] | undefined) => (released ?? []).map((r) => `${r.seq}${r.message ? "" : "*"}`);

test("order: in-order messages are released at once, duplicates dropped", () => {
  const order = new ConversationOrder<M>(undefined, true);
  assert.deepEqual(seqs(order.offer(m(5))), ["5"], "the first message sets the baseline");
  assert.deepEqual(seqs(order.offer(m(6))), ["6"]);
  assert.equal(order.offer(m(6)), undefined, "a redelivery is a duplicate");
  assert.equal(order.offer(m(3)), undefined, "below the cursor is a duplicate");
  assert.equal(order.lacking, false);
});

test("order: a gap holds later messages until it is filled", () => {
  const order = new ConversationOrder<M>(10n, true);
  assert.deepEqual(seqs(order.offer(m(12))), []);
  assert.deepEqual(seqs(order.offer(m(13))), []);
  assert.equal(order.lacking, true);
  assert.deepEqual(seqs(order.offer(m(11))), ["11", "12", "13"]);
  assert.equal(order.lacking, false);
  assert.equal(order.cursor, 13n);
});

test("order: the server's complete_through_seq skips seqs that do not exist", () => {
  const order = new ConversationOrder<M>(10n, true);
  order.offer(m(20));
  order.offer(m(15));
  // A sync after 10 returned 15 only, complete through 19: 11..14 and 16..19 do not exist.
  assert.deepEqual(seqs(order.completeThrough(19n)), ["15", "19*", "20"]);
  assert.equal(order.cursor, 20n);
  assert.equal(order.lacking, false);
});

test("order: own sends fill their seq without being emitted", () => {
  const order = new ConversationOrder<M>(1n, true);
  assert.deepEqual(seqs(order.offer(m(3))), [], "2 is missing");
  assert.deepEqual(seqs(order.markOwn(2n)), ["2*", "3"]);
  assert.deepEqual(seqs(order.offer(m(4), true)), ["4*"], "an own message from a sync is skipped too");
});

test("order: own sends are ignored before a baseline, later messages set it", () => {
  const order = new ConversationOrder<M>(undefined, true);
  assert.deepEqual(order.markOwn(1n), []);
  assert.deepEqual(seqs(order.offer(m(2))), ["2"]);
});

test("order: a room waits for its baseline, keeping what arrived before it", () => {
  const order = new ConversationOrder<M>(undefined, false);
  assert.deepEqual(seqs(order.offer(m(8))), [], "no baseline yet");
  assert.equal(order.lacking, false, "no gap to fill without a baseline");
  assert.deepEqual(seqs(order.setBaseline(8n)), ["8"], "the early message is kept");
  assert.deepEqual(seqs(order.offer(m(9))), ["9"]);
});

test("order: a raised target is a gap even with nothing held; releaseAll gives up on it", () => {
  const order = new ConversationOrder<M>(4n, true);
  order.raiseTarget(9n);
  assert.equal(order.lacking, true);
  order.offer(m(7));
  assert.deepEqual(seqs(order.releaseAll()), ["7", "9*"]);
  assert.equal(order.lacking, false);
});

test("backoff: full jitter under a doubling cap, reset after a good connection", () => {
  let draw = 0.999;
  const backoff = new Backoff({ initialDelayMs: 100, maxDelayMs: 1_000 }, () => draw);
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6].map(() => backoff.next()),
    [99, 199, 399, 799, 999, 999],
  );
  draw = 0;
  assert.equal(backoff.next(), 0, "full jitter reaches 0");
  backoff.reset();
  assert.equal(backoff.cap, 100);
  const random = new Backoff({ initialDelayMs: 100, maxDelayMs: 1_000 });
  for (let i = 0; i < 200; i++) {
    const cap = random.cap;
    const delay = random.next();
    assert.ok(delay >= 0 && delay < cap, `${delay} within [0, ${cap})`);
  }
});

test("codec: a frame survives both encodings, 64-bit values included", () => {
  for (const codec of [protoCodec, jsonCodec]) {
    const wire = codec.encode(7, {
      case: "sendAck",
      value: {
        clientMsgId: "id",
        status: SendAck_Status.DUPLICATE,
        messageId: 54901761638400000n,
        seq: 2n ** 63n,
        conversation: "dm:a:b",
      },
    });
    assert.equal(typeof wire, codec === jsonCodec ? "string" : "object");
    const frame = codec.decode(typeof wire === "string" ? wire : wire.slice().buffer);
    assert.equal(frame.rid, 7);
    assert.equal(frame.body.case, "sendAck");
    if (frame.body.case !== "sendAck") return;
    assert.equal(frame.body.value.messageId, 54901761638400000n);
    assert.equal(frame.body.value.seq, 2n ** 63n);
    assert.equal(frame.body.value.status, SendAck_Status.DUPLICATE);
  }
});

test("codec: JSON as the server writes it (strings for 64-bit, snake_case accepted, unknown fields ignored)", () => {
  const frame = jsonCodec.decode(
    '{"rid":3,"deliver":{"message":{"id":"54901761638400000","conversation":"dm:alice:bob","seq":"1","sender":"alice",' +
      '"sender_device":"phone","kind":1,"body":"aGVsbG8gYm9i","sentAtMs":"1780315200000","future":true},"attempt":2}}',
  );
  assert.equal(frame.body.case, "deliver");
  if (frame.body.case !== "deliver") return;
  const message = frame.body.value.message!;
  assert.equal(message.senderDevice, "phone");
  assert.equal(new TextDecoder().decode(message.body), "hello bob");
  assert.equal(message.id, 54901761638400000n);
  assert.throws(() => jsonCodec.decode("{not json"), /undecodable frame/);
  assert.throws(() => protoCodec.decode("{}"), /protobuf subprotocol/);
});

test("stores: memory and localStorage keep seqs as bigints", () => {
  const memory = new MemorySeqStore();
  memory.set("k", 12n);
  assert.equal(memory.get("k"), 12n);
  assert.equal(memory.get("other"), undefined);
  const backing = new Map<string, string>();
  const storage = { getItem: (k: string) => backing.get(k) ?? null, setItem: (k: string, v: string) => void backing.set(k, v) };
  const local = new LocalStorageSeqStore("p.", storage);
  local.set("u/d/room:lobby", 2n ** 60n);
  assert.equal(backing.get("p.u/d/room:lobby"), (2n ** 60n).toString());
  assert.equal(new LocalStorageSeqStore("p.", storage).get("u/d/room:lobby"), 2n ** 60n, "a reloaded page reads it");
  assert.throws(() => new LocalStorageSeqStore(), /no localStorage/);
});

test("uuid: version 4 format", () => {
  assert.match(uuid(), /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
});

test("frame budget: one second of frames, then the rate; acks may overdraw it", () => {
  let now = 0;
  const budget = new FrameBudget(10, () => now);
  for (const _ of range(10)) {
    assert.equal(budget.wait(), 0);
    budget.spend();
  }
  assert.equal(budget.wait(), 100, "the 11th frame waits a tenth of a second");
  budget.spend(); // an ack that cannot wait
  assert.equal(budget.wait(), 200);
  now += 200;
  assert.equal(budget.wait(), 0);
  assert.equal(new FrameBudget(0).wait(), 0, "0: no limit");
});

test("send window: halves once per round of RETRYs, grows back slowly past the last cut", () => {
  const window = new SendWindow(8);
  window.retried(10, 20);
  assert.equal(window.size, 4);
  window.retried(15, 21);
  assert.equal(window.size, 4, "written before the cut: no second cut");
  window.retried(25, 30);
  assert.equal(window.size, 2);
  for (const _ of range(2)) window.stored();
  assert.equal(window.size, 2, "past the threshold: one per window's worth of stored sends");
  window.stored();
  assert.equal(window.size, 3);
  for (const _ of range(100)) window.stored();
  assert.equal(window.size, 8, "capped at the maximum");
  const one = new SendWindow(1);
  one.retried(0, 1);
  assert.equal(one.size, 1, "never below one");
});

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}
