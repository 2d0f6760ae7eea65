// The web chat page, as served by a real Herald in dev mode, in headless Chromium: each test
// opens tabs of their own (own localStorage), types and clicks as a person would, and checks
// what the pages show (the hooks documented in examples/README.md).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Herald, Proxy, joinRoom, launchBrowser, logIn, say, shown, waitForState, waitShown } from "./harness.mjs";

const DM = "dm:alice:bob";

/** The stored messages of `conversation` a page shows, top to bottom. */
async function conversationOn(page, conversation) {
  return (await shown(page)).filter((m) => m.conversation === conversation && m.status === "ok");
}

/** Asserts `page` shows `expected` in `conversation`, each once, in seq order, and nothing else. */
async function assertOnceInOrder(page, conversation, expected, who) {
  const messages = await conversationOn(page, conversation);
  const texts = messages.map((m) => m.text);
  assert.deepEqual([...texts].sort(), [...expected].sort(), `${who} shows each message once: ${texts.join(", ")}`);
  const seqs = messages.map((m) => BigInt(m.seq));
  for (let i = 1; i < seqs.length; i += 1) {
    assert.ok(seqs[i - 1] < seqs[i], `${who} shows ${conversation} in seq order: ${messages.map((m) => `${m.text}#${m.seq}`).join(", ")}`);
  }
  return texts;
}

test("two tabs talk: each shows the other's message with the same id and seq", async (t) => {
  const herald = await Herald.start(t);
  const browser = await launchBrowser(t);
  const alice = await logIn(browser, herald, "alice");
  const bob = await logIn(browser, herald, "bob");

  await say(alice, "bob", "hello bob, from alice's tab");
  await waitShown(bob, ["hello bob, from alice's tab"], "bob's tab shows alice's message");
  await waitShown(alice, ["hello bob, from alice's tab"], "alice's tab shows her message stored");
  const [received] = await conversationOn(bob, DM);
  const [sent] = await conversationOn(alice, DM);
  assert.equal(received.sender, "alice");
  assert.equal(received.direction, "in");
  assert.equal(sent.direction, "out");
  assert.equal(received.id, sent.id, "both tabs show the same message id");
  assert.equal(received.seq, sent.seq, "and the same seq");

  await say(bob, "alice", "hi alice — bob here ✓");
  await waitShown(alice, ["hi alice — bob here ✓"], "alice's tab shows bob's reply");
  assert.deepEqual(await assertOnceInOrder(alice, DM, ["hello bob, from alice's tab", "hi alice — bob here ✓"], "alice"), [
    "hello bob, from alice's tab",
    "hi alice — bob here ✓",
  ]);
  assert.deepEqual(alice.errors, [], "no script error on alice's page");
  assert.deepEqual(bob.errors, [], "no script error on bob's page");
});

test("the server restarted mid-conversation: both tabs show every message once, in order", async (t) => {
  const herald = await Herald.start(t);
  const browser = await launchBrowser(t);
  const alice = await logIn(browser, herald, "alice");
  const bob = await logIn(browser, herald, "bob");
  const before = ["a1", "b1", "a2", "b2"];
  for (const text of before) {
    const [from, to] = text.startsWith("a") ? [alice, "bob"] : [bob, "alice"];
    await say(from, to, text);
    // Each waits for the last: a conversation, not a race.
    await waitShown(text.startsWith("a") ? bob : alice, [text], `${text} to arrive`);
  }

  await herald.kill("SIGKILL");
  await waitForState(alice, "reconnecting", "alice's tab notices the server is gone");
  await waitForState(bob, "reconnecting", "bob's tab notices the server is gone");
  // Typed while the server is down: shown as pending, sent once it is back.
  await say(alice, "bob", "a3 (typed while the server was down)");
  await say(bob, "alice", "b3 (typed while the server was down)");
  await herald.launch();
  await waitForState(alice, "connected", "alice's tab reconnects");
  await waitForState(bob, "connected", "bob's tab reconnects");
  await say(alice, "bob", "a4");
  await say(bob, "alice", "b4");

  const all = [...before, "a3 (typed while the server was down)", "b3 (typed while the server was down)", "a4", "b4"];
  await waitShown(alice, all, "alice's tab shows the whole conversation");
  await waitShown(bob, all, "bob's tab shows the whole conversation");
  const onAlice = await assertOnceInOrder(alice, DM, all, "alice");
  const onBob = await assertOnceInOrder(bob, DM, all, "bob");
  assert.deepEqual(onAlice, onBob, "both tabs show the conversation in the same order");
  assert.equal((await shown(alice)).length, all.length, "alice's tab shows nothing else (no duplicate, no failed send)");
  assert.equal((await shown(bob)).length, all.length, "bob's tab shows nothing else");
});

test("an announcement posted while a tab was offline shows after it reconnects", async (t) => {
  const herald = await Herald.start(t);
  const proxy = await Proxy.start(t, herald.port);
  const browser = await launchBrowser(t);
  const alice = await logIn(browser, herald, "alice");
  const bob = await logIn(browser, herald, "bob", proxy.url);
  await joinRoom(alice, "room:lobby");
  await joinRoom(bob, "room:lobby");

  await herald.announce("lobby", "n1 live");
  await waitShown(bob, ["n1 live"], "bob's tab shows the live announcement");

  proxy.cut();
  await waitForState(bob, "reconnecting", "bob's tab notices it is offline");
  await herald.announce("lobby", "n2 while bob was offline");
  await herald.announce("lobby", "n3 while bob was offline");
  await waitShown(alice, ["n2 while bob was offline", "n3 while bob was offline"], "alice's tab (online) shows both");
  proxy.resume();

  await waitShown(bob, ["n2 while bob was offline", "n3 while bob was offline"], "bob's tab catches up after the reconnect");
  const expected = ["n1 live", "n2 while bob was offline", "n3 while bob was offline"];
  assert.deepEqual(await assertOnceInOrder(bob, "room:lobby", expected, "bob"), expected);
  assert.deepEqual(await assertOnceInOrder(alice, "room:lobby", expected, "alice"), expected);
});
