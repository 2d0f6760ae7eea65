/** A small typed event emitter, the same in browsers and Node. */
export type Listener<T> = (value: T) => unknown;

export class Emitter<Events extends object> {
  private readonly listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Adds a listener; returns a function that removes it. */
  on<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(listener as Listener<never>);
    return () => this.off(event, listener);
  }

  /** Removes a listener added with `on`. */
  off<K extends keyof Events>(event: K, listener: Listener<Events[K]>): void {
    this.listeners.get(event)?.delete(listener as Listener<never>);
  }

  /**
   * Calls every listener of `event` with `value`; returns what they returned (a `message`
   * listener may return a promise the client waits for) and what they threw.
   */
  protected emit<K extends keyof Events>(event: K, value: Events[K]): { results: unknown[]; errors: unknown[] } {
    const results: unknown[] = [];
    const errors: unknown[] = [];
    for (const listener of [...(this.listeners.get(event) ?? [])]) {
      try {
        results.push((listener as Listener<Events[K]>)(value));
      } catch (error) {
        errors.push(error);
      }
    }
    return { results, errors };
  }
}
