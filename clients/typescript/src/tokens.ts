/**
 * The token a connection presents (SPEC.md, "Tokens"): a fixed string, or a provider asked
 * for the first connection and again after the server refused the last token (4001).
 */
import type { TokenProvider } from "./types.js";

export class TokenSource {
  private token: string | undefined;
  private expired = false;
  /** 4001 closes in a row without a `connected`. */
  private refusals = 0;

  constructor(private readonly source: string | TokenProvider) {}

  /** A fixed string: a refusal cannot be mended by asking again. */
  get fixed(): boolean {
    return typeof this.source === "string";
  }

  /** The token for the next attempt, from the provider when there is none or it was refused. */
  async current(): Promise<string> {
    const source = this.source;
    if (typeof source === "string") return source;
    if (this.token === undefined || this.expired) {
      const reason = this.token === undefined ? "initial" : "expired";
      const token = await source(reason);
      if (typeof token !== "string" || token === "") throw new Error("the token provider returned no token");
      this.token = token;
      this.expired = false;
    }
    return this.token;
  }

  /** The server refused the token (4001); returns how many times in a row. */
  refused(): number {
    this.expired = true;
    this.refusals += 1;
    return this.refusals;
  }

  /** A connection was accepted. */
  accepted(): void {
    this.refusals = 0;
  }
}
