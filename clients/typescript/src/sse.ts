/** One Server-Sent Events message. */
export interface SseMessage {
  /** The `event:` field, "message" when absent. */
  event: string;
  data: string;
  /** The last `id:` seen so far on the stream. */
  lastId: string;
  /** Whether this message carried an `id:` of its own. */
  hasId: boolean;
  /** Whether it carried any data line (an `id:` alone is a position). */
  hasData: boolean;
}

/**
 * SseParser reads a stream's text as it arrives and hands back each
 * complete message (https://html.spec.whatwg.org/multipage/server-sent-events.html).
 */
export class SseParser {
  private buf = "";
  private data: string[] = [];
  private event = "";
  private hasId = false;
  lastId = "";

  constructor(lastId = "") {
    this.lastId = lastId;
  }

  push(chunk: string): SseMessage[] {
    this.buf += chunk;
    const out: SseMessage[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buf);
      // A lone \r at the end may be the first half of \r\n: wait for more.
      if (!m || (m[0] === "\r" && m.index === this.buf.length - 1)) break;
      const line = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      const msg = this.line(line);
      if (msg) out.push(msg);
    }
    return out;
  }

  private line(line: string): SseMessage | undefined {
    if (line === "") {
      const hasData = this.data.length > 0;
      if (!hasData && !this.hasId && this.event === "") return undefined;
      const msg: SseMessage = {
        event: this.event || "message",
        data: this.data.join("\n"),
        lastId: this.lastId,
        hasId: this.hasId,
        hasData,
      };
      this.data = [];
      this.event = "";
      this.hasId = false;
      return msg;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        if (!value.includes("\0")) {
          this.lastId = value;
          this.hasId = true;
        }
        break;
    }
    return undefined;
  }
}
