/**
 * The page's DOM: the elements by id, notes in the log, and the message list. A message
 * element is placed by its seq among the others of its conversation, so the list shows
 * each conversation in the server's order whatever order the answers came in; sends still
 * waiting for their seq stay at the bottom.
 */

export const $ = <T extends HTMLElement = HTMLElement>(id: string): T => {
  const found = document.getElementById(id);
  if (!found) throw new Error(`the page has no #${id}`);
  return found as T;
};

export const el = {
  user: $<HTMLInputElement>("user"),
  device: $<HTMLInputElement>("device"),
  connect: $<HTMLButtonElement>("connect"),
  disconnect: $<HTMLButtonElement>("disconnect"),
  status: $("status"),
  peer: $<HTMLInputElement>("peer"),
  history: $<HTMLButtonElement>("history"),
  conversation: $("conversation"),
  messages: $("messages"),
  text: $<HTMLInputElement>("text"),
  send: $<HTMLButtonElement>("send"),
  log: $("log"),
};

/** What a message element shows. */
export interface Shown {
  readonly conversation: string;
  readonly sender: string;
  readonly text: string | undefined;
  readonly seq: bigint;
  readonly id: string;
  readonly direction: "in" | "out";
  readonly status: "pending" | "ok" | "rejected" | "failed";
}

/** Adds a line to the log (kept to its last 200). */
export function note(text: string, isError = false): void {
  const li = document.createElement("li");
  li.className = isError ? "notice error" : "notice";
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  el.log.appendChild(li);
  while (el.log.children.length > 200) el.log.firstElementChild?.remove();
  el.log.scrollTop = el.log.scrollHeight;
}

function metaText(conversation: string, sender: string, seq: bigint): string {
  return `[${conversation}] ${sender}` + (seq > 0n ? ` · #${seq}` : "");
}

export function buildMessage(m: Shown): HTMLLIElement {
  const li = document.createElement("li");
  li.className = "message";
  const meta = document.createElement("div");
  meta.className = "meta";
  const text = document.createElement("div");
  text.className = "text";
  text.textContent = m.text ?? "(binary message)";
  li.append(meta, text);
  li.dataset.direction = m.direction;
  li.dataset.sender = m.sender;
  setStored(li, m.conversation, m.seq, m.id, m.status);
  return li;
}

/** Records where a message is stored (its seq and id) and its status, on the element. */
export function setStored(li: HTMLElement, conversation: string, seq: bigint, id: string, status: Shown["status"]): void {
  li.dataset.conversation = conversation;
  li.dataset.seq = seq.toString();
  li.dataset.id = id;
  li.dataset.status = status;
  const meta = li.querySelector(".meta");
  if (meta) meta.textContent = metaText(conversation, li.dataset.sender ?? "", seq);
}

/** Appends a message that has no seq yet (a send on its way): it goes last. */
export function appendPending(li: HTMLElement): void {
  el.messages.appendChild(li);
  el.messages.scrollTop = el.messages.scrollHeight;
}

/**
 * Puts `li` (a message with a seq) after the last element before it: walking back from the
 * end, past sends still pending and past later messages of its own conversation, up to the
 * first element of another conversation or an earlier one of its own.
 */
export function place(li: HTMLElement): void {
  const conversation = li.dataset.conversation;
  const seq = BigInt(li.dataset.seq ?? "0");
  let after: Element | null = el.messages.lastElementChild;
  while (after) {
    const candidate = after as HTMLElement;
    if (candidate !== li) {
      const pending = candidate.dataset.status === "pending";
      const later = candidate.dataset.conversation === conversation && seq > 0n && BigInt(candidate.dataset.seq ?? "0") > seq;
      if (!pending && !later) break;
    }
    after = after.previousElementSibling;
  }
  if (after === li) return;
  el.messages.insertBefore(li, after ? after.nextSibling : el.messages.firstChild);
  el.messages.scrollTop = el.messages.scrollHeight;
}

/** Puts older messages (history) at the top, oldest first. */
export function prependOlder(items: HTMLElement[]): void {
  const anchor = el.messages.firstChild;
  for (const li of items) {
    li.classList.add("history");
    el.messages.insertBefore(li, anchor);
  }
}
