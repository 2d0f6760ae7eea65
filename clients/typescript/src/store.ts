/**
 * Where the client keeps the last seq it handled in each conversation, so that a restarted
 * client (a reloaded page) resumes instead of replaying history: rooms are re-joined from
 * it (`since_seq`), and messages at or below it are not emitted again.
 *
 * The interface is synchronous on purpose: it is read on the receive path, and both
 * built-in stores are synchronous. A store backed by something asynchronous should load
 * its values before the client starts and write behind.
 */
export interface SeqStore {
  /** The stored seq for `key`, or undefined. */
  get(key: string): bigint | undefined;
  /** Stores `seq` for `key`; called with increasing seqs per key. */
  set(key: string, seq: bigint): void;
}

/** Keeps seqs in memory: shared between client instances of one process, lost on exit. */
export class MemorySeqStore implements SeqStore {
  private readonly seqs = new Map<string, bigint>();
  get(key: string): bigint | undefined {
    return this.seqs.get(key);
  }
  set(key: string, seq: bigint): void {
    this.seqs.set(key, seq);
  }
}

/** The part of the Web Storage API the store uses. */
export interface StorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

/** Keeps seqs in `localStorage` (browsers), under `prefix` + key, as decimal strings. */
export class LocalStorageSeqStore implements SeqStore {
  private readonly storage: StorageLike;
  constructor(
    private readonly prefix = "herald.seq.",
    storage?: StorageLike,
  ) {
    const found = storage ?? (globalThis as { localStorage?: StorageLike }).localStorage;
    if (!found) throw new Error("LocalStorageSeqStore: no localStorage here; pass a Storage");
    this.storage = found;
  }
  get(key: string): bigint | undefined {
    const value = this.storage.getItem(this.prefix + key);
    if (value === null || !/^\d+$/.test(value)) return undefined;
    return BigInt(value);
  }
  set(key: string, seq: bigint): void {
    try {
      this.storage.setItem(this.prefix + key, seq.toString());
    } catch {
      // A full or disabled storage costs a replay after a reload, nothing more.
    }
  }
}
