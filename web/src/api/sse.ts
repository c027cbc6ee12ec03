// Server-sent events over fetch: EventSource cannot send the bearer header. A stream that drops
// is opened again after 1 s, doubling up to 10 s, resuming after `Last-Event-ID` (the service's
// ids are event seqs, so no event is lost or seen twice); one the service ends (after its
// `events_max_s`) is opened again at once.
import { session } from "../state/session";
import { streamDown, streamUp } from "../state/connection";
import { ApiError, apiRoot, authHeaders, refusalOf } from "./http";

export interface SseMessage {
  event: string;
  data: string;
  id: string | null;
}

/** The messages of an event stream's body, as the SSE format delimits them. */
export async function* sseMessages(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id: string | null = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = buffer.indexOf("\n")) >= 0) {
        let line = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length > 0 || id !== null) {
            yield { event: event || "message", data: data.join("\n"), id };
          }
          event = "";
          data = [];
          id = null;
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: a keep-alive
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
        else if (field === "id") id = text;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

export interface StreamHandlers {
  /** A message of the stream. */
  message(message: SseMessage): void;
  /** Whether the stream is over for good once the service ended it (a run that ended). */
  finished?(): boolean;
  /** The service refused the stream (a 404): it is not opened again. */
  refused?(error: ApiError): void;
}

const FIRST_DELAY_MS = 1000;
const MAX_DELAY_MS = 10000;

/** An event stream that stays open until `close`, across drops and restarts of the service. */
export class EventStream {
  private readonly abort = new AbortController();
  private closed = false;
  /** The id of the last message with one: sent as `Last-Event-ID` when opened again. */
  lastEventId: string | null = null;

  constructor(
    private readonly name: string,
    private readonly path: string,
    private readonly handlers: StreamHandlers,
    private readonly resume = true,
  ) {
    void this.run();
  }

  close(): void {
    this.closed = true;
    this.abort.abort();
    streamUp(this.name);
  }

  private async run(): Promise<void> {
    let delay = FIRST_DELAY_MS;
    while (!this.closed) {
      let progressed = false;
      try {
        const headers: Record<string, string> = { ...authHeaders(), Accept: "text/event-stream" };
        if (this.resume && this.lastEventId !== null) headers["Last-Event-ID"] = this.lastEventId;
        const response = await fetch(apiRoot + this.path, {
          headers,
          cache: "no-store",
          signal: this.abort.signal,
        });
        if (this.closed) return;
        if (!response.ok) {
          const refusal = await refusalOf(response);
          if (response.status === 401) {
            this.close();
            session.expire(refusal.detail);
            return;
          }
          if (response.status >= 500 || response.status === 429) throw refusal; // a restart
          this.close();
          this.handlers.refused?.(refusal);
          return;
        }
        streamUp(this.name);
        if (response.body === null) throw new ApiError(0, "the stream has no body");
        for await (const message of sseMessages(response.body)) {
          if (this.closed) return;
          progressed = true;
          delay = FIRST_DELAY_MS;
          if (message.id !== null) this.lastEventId = message.id;
          this.handlers.message(message);
        }
        if (this.closed) return;
        if (this.handlers.finished?.()) {
          this.close();
          return;
        }
        if (progressed) continue; // the service ended the stream (`events_max_s`): at once
      } catch {
        if (this.closed) return;
      }
      streamDown(this.name);
      await new Promise((resolve) => window.setTimeout(resolve, delay));
      delay = Math.min(delay * 2, MAX_DELAY_MS);
    }
  }
}
