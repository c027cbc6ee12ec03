// The selected run: live from `GET /runs/{run}/events?views=true` (its events, and its record,
// progress and workers as the public views have them), and as it was after any of its events
// (`GET /runs/{run}?at=SEQ`) while the history slider is held there.
import { reactive, shallowRef, triggerRef, type ShallowRef } from "vue";
import { ApiError, getJson, segment } from "../api/http";
import { EventStream } from "../api/sse";
import { ENDED_RUN_STATES } from "../api/states";
import type { ProgressView, RunEvent, RunView, WorkersByTask } from "../api/types";

const VIEWS = new Set(["run", "progress", "workers"]);
const HISTORY_CACHE = 256;

/** What the slider names of an event and what the pictures need of it. */
export interface EventMark {
  seq: number;
  time: string;
  type: string;
  task: string | null;
  worker: string | null;
  state: string | null;
  message: string | null;
}

export class RunSession {
  readonly live = reactive({
    run: null as RunView | null,
    progress: null as ProgressView | null,
    workers: {} as WorkersByTask,
    /** Why the run cannot be shown: unknown, or a log the service cannot read. */
    error: "",
  });
  /** Every event of the run so far, in seq order (one per seq from 1). */
  readonly events: ShallowRef<EventMark[]> = shallowRef([]);
  /** The times (ms) of the units done of each task (`unit-done`, `units-done`: one entry a
   * unit, done for the first time), with the seqs of their events, in seq order. */
  readonly unitsDone = new Map<string, Array<[number, number]>>();
  private readonly unitIndices = new Map<string, Set<number>>();
  readonly history = reactive({
    /** The seq the slider holds, null while live. */
    at: null as number | null,
    /** The run as it was after the event `at`, once loaded. */
    view: null as RunView | null,
    error: "",
  });
  private readonly stream: EventStream;
  private readonly cache = new Map<number, RunView>();
  private wanted: number | null = null;
  private loading = false;

  constructor(readonly id: string) {
    this.stream = new EventStream(`run ${id}`, `/runs/${segment(id)}/events?views=true`, {
      message: ({ event, data }) => this.receive(event, data),
      finished: () => this.live.run !== null && ENDED_RUN_STATES.has(this.live.run.state),
      refused: (error) => {
        this.live.error =
          error.status === 404 ? `There is no run ${JSON.stringify(id)}: ${error.detail}` : error.detail;
      },
    });
  }

  close(): void {
    this.stream.close();
  }

  /** The run shown: as it was at the slider's event, else live. */
  get shown(): RunView | null {
    if (this.history.at !== null) return this.history.view ?? this.live.run;
    return this.live.run;
  }

  /** The last seq shown: the slider's, else the last event's. */
  get shownSeq(): number {
    return this.history.at ?? this.lastSeq;
  }

  get lastSeq(): number {
    const events = this.events.value;
    return events.length ? events[events.length - 1]!.seq : (this.live.run?.seq ?? 0);
  }

  event(seq: number): EventMark | null {
    const events = this.events.value;
    const guess = events[seq - 1];
    if (guess?.seq === seq) return guess;
    return events.find((event) => event.seq === seq) ?? null;
  }

  /** Hold the slider at `seq`: the run as it was then, loaded once per seq (the latest wins). */
  async show(seq: number): Promise<void> {
    if (seq >= this.lastSeq) {
      this.goLive();
      return;
    }
    this.history.at = seq;
    this.history.error = "";
    const cached = this.cache.get(seq);
    if (cached) {
      this.history.view = cached;
      return;
    }
    this.wanted = seq;
    if (this.loading) return;
    this.loading = true;
    try {
      while (this.wanted !== null) {
        const at = this.wanted;
        this.wanted = null;
        try {
          const view = await getJson<RunView>(`/runs/${segment(this.id)}?at=${at}`);
          this.remember(at, view);
          if (this.history.at === at) this.history.view = view;
        } catch (error) {
          if (this.history.at === at) {
            this.history.error = error instanceof ApiError ? error.detail : String(error);
          }
        }
      }
    } finally {
      this.loading = false;
    }
  }

  goLive(): void {
    this.wanted = null;
    this.history.at = null;
    this.history.view = null;
    this.history.error = "";
  }

  private remember(seq: number, view: RunView): void {
    if (this.cache.size >= HISTORY_CACHE) {
      const oldest = this.cache.keys().next().value;
      if (oldest !== undefined) this.cache.delete(oldest);
    }
    this.cache.set(seq, view);
  }

  private receive(name: string, data: string): void {
    let value: unknown;
    try {
      value = JSON.parse(data);
    } catch {
      return; // not JSON (a keep-alive): nothing to show
    }
    if (name === "error") {
      const detail = (value as { detail?: string }).detail;
      this.live.error = detail ?? "the service cannot read the log of this run";
      return;
    }
    if (VIEWS.has(name)) {
      if (name === "run") this.live.run = value as RunView;
      else if (name === "progress") this.live.progress = value as ProgressView;
      else this.live.workers = value as WorkersByTask;
      return;
    }
    this.add(value as RunEvent);
  }

  private add(event: RunEvent): void {
    if (typeof event.seq !== "number") return;
    const events = this.events.value;
    if (events.length && events[events.length - 1]!.seq >= event.seq) return; // seen already
    const mark: EventMark = {
      seq: event.seq,
      time: event.time,
      type: event.type,
      task: typeof event.task === "string" ? event.task : null,
      worker: typeof event.worker === "string" ? event.worker : null,
      state: typeof event.state === "string" ? event.state : null,
      message: typeof event.message === "string" ? event.message : null,
    };
    events.push(mark);
    if (mark.task !== null && (mark.type === "unit-done" || mark.type === "units-done")) {
      // `unit-done` has one unit (logs written before), `units-done` a batch of them
      const indices = mark.type === "unit-done" ? [event.index] : unitIndices(event.indices);
      const fresh = indices.filter((index) => this.firstDone(mark.task!, index)).length;
      if (fresh) {
        let times = this.unitsDone.get(mark.task);
        if (!times) this.unitsDone.set(mark.task, (times = []));
        const when = Date.parse(mark.time);
        for (let n = 0; n < fresh; n++) times.push([mark.seq, when]);
      }
    }
    triggerRef(this.events);
  }

  /** Whether a unit's `unit-done` is its first (a unit done again after a retry counts once). */
  private firstDone(task: string, index: unknown): boolean {
    if (typeof index !== "number") return true;
    let seen = this.unitIndices.get(task);
    if (!seen) this.unitIndices.set(task, (seen = new Set()));
    if (seen.has(index)) return false;
    seen.add(index);
    return true;
  }
}

/** The indices of a `units-done` event (nothing for a malformed one). */
function unitIndices(indices: unknown): unknown[] {
  return Array.isArray(indices) ? indices : [];
}
