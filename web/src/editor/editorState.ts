// The Editor of one workflow: the draft and where it comes from (an edit session of a running
// `simrun edit`, or a run for Rerun with changes), the places of its cards, what is selected,
// its validation and estimate (400 ms after the last change), and Save, Run and Download.
//
// The draft starts from a version of the file (`base`). The session is read again every 2 s:
// another version on disk is taken (and laid out) when the draft has no changes, else the bar
// says "changed on disk" and offers Reload and Save anyway. A save names `base`, so the command
// refuses it when the file changed meanwhile.
import { reactive } from "vue";
import { ApiError, getJson, postJson, request, segment } from "../api/http";
import type {
  DiskState,
  EditResult,
  EditSession,
  RunView,
  SourceProvenance,
  TaskEstimate,
  TaskSpec,
  TaskTypeView,
  ValidationResult,
  Workflow,
} from "../api/types";
import { inputTask } from "../executions/layout";
import { go } from "../state/route";
import { isCommand, loadTypes, types } from "./catalogue";
import {
  closesCycle,
  cleaned,
  copy,
  layout,
  newInputName,
  newTaskId,
  parseProblem,
  rightOf,
  type Point,
  type Problem,
} from "./graph";

export const VALIDATE_AFTER_MS = 400;
export const SESSION_POLL_MS = 2000;

export type Origin = { kind: "session"; id: string } | { kind: "run"; id: string };
export type Selection = { kind: "task"; id: string } | { kind: "edge"; to: string; port: string } | null;

export interface Checked {
  /** Whether the draft as it is now was checked. */
  current: boolean;
  ok: boolean;
  byTask: Record<string, Problem[]>;
  general: Problem[];
  count: number;
}

export interface Message {
  text: string;
  tone: "ok" | "error";
  lines: string[];
}

function detailOf(error: unknown): string {
  return error instanceof ApiError ? error.detail : error instanceof Error ? error.message : String(error);
}

export class Editor {
  origin: Origin;
  session: EditSession | null = null;
  run: RunView | null = null;
  loadError = "";
  draft: Workflow | null = null;
  group = "";
  base: string | null = null;
  dirty = false;
  places: Record<string, Point> = {};
  /** Bumped whenever the cards are laid out anew (the canvas fits them again). */
  layoutRound = 0;
  /** A task to bring into view (a click on the palette added it). */
  focus: string | null = null;
  selection: Selection = null;
  checked: Checked = { current: false, ok: false, byTask: {}, general: [], count: 0 };
  estimates: Record<string, TaskEstimate> | null = null;
  estimateError = "";
  note = "";
  message: Message | null = null;
  busy: "" | "save" | "run" | "download" = "";
  /** A save refused because the file changed on disk: what is there now. */
  conflict: DiskState | null = null;

  private timer: number | null = null;
  private poller: number | null = null;
  private round = 0;
  private closed = false;

  constructor(origin: Origin) {
    this.origin = origin;
  }

  // loading

  async start(): Promise<void> {
    void loadTypes();
    if (this.origin.kind === "session") {
      await this.poll();
      this.poller = window.setInterval(() => void this.poll(), SESSION_POLL_MS);
    } else {
      try {
        this.run = await getJson<RunView>(`/runs/${segment(this.origin.id)}`);
        this.group = this.run.group ?? "";
        const workflow = copy(this.run.workflow);
        if (this.run.reserve && !workflow.reserve) workflow.reserve = this.run.reserve;
        this.take(workflow, null);
      } catch (error) {
        this.loadError =
          error instanceof ApiError && error.status === 404
            ? `There is no run ${this.origin.id}.`
            : `The run could not be read: ${detailOf(error)}`;
      }
    }
  }

  stop(): void {
    this.closed = true;
    if (this.poller !== null) window.clearInterval(this.poller);
    if (this.timer !== null) window.clearTimeout(this.timer);
  }

  async poll(): Promise<void> {
    if (this.origin.kind !== "session" || this.closed) return;
    let found: EditSession;
    try {
      found = await getJson<EditSession>(`/edits/${segment(this.origin.id)}`);
    } catch (error) {
      if (this.session === null) {
        this.loadError =
          error instanceof ApiError && error.status === 404
            ? `There is no edit session ${this.origin.id}: start simrun edit again for a new one.`
            : `The edit session could not be read: ${detailOf(error)}`;
      }
      return;
    }
    const first = this.session === null;
    this.session = found;
    this.loadError = "";
    if (first) {
      this.group = found.group ?? "";
      this.takeDisk(found.disk, true);
    } else if (found.disk.version !== this.base && !this.dirty && found.disk.workflow) {
      this.takeDisk(found.disk, true);
    }
  }

  /** Take what is on disk as the draft (laid out again). */
  takeDisk(disk: DiskState, fresh: boolean): void {
    if (disk.workflow) {
      this.take(copy(disk.workflow), disk.version ?? null);
    } else if (fresh && this.draft === null) {
      // A file that is no workflow: an empty draft of its name; the bar shows its problems.
      const name = (this.session?.file ?? "workflow").replace(/\.ya?ml$/, "");
      this.take({ name, tasks: [] }, disk.version ?? null);
    }
    this.base = disk.version ?? null;
  }

  private take(workflow: Workflow, version: string | null): void {
    for (const task of workflow.tasks) {
      task.settings ??= {};
      task.inputs ??= {};
    }
    this.draft = workflow;
    this.base = version;
    this.dirty = false;
    this.conflict = null;
    this.places = layout(workflow.tasks);
    this.layoutRound += 1;
    if (this.selection?.kind === "task" && !workflow.tasks.some((t) => t.id === (this.selection as { id: string }).id)) {
      this.selection = null;
    }
    this.schedule(0);
  }

  // where the draft stands

  get connected(): boolean {
    return this.session?.connected === true;
  }

  /** The file on disk is another than the one the draft started from. */
  get changedOnDisk(): boolean {
    if (this.conflict) return true;
    return this.session !== null && this.dirty && (this.session.disk.version ?? null) !== this.base;
  }

  get canSave(): boolean {
    return this.connected && !this.busy && (this.dirty || this.changedOnDisk);
  }

  get canRun(): boolean {
    return !!this.draft && this.draft.tasks.length > 0 && this.checked.current && this.checked.ok && !this.busy;
  }

  /** The state of the draft in the bar. */
  get state(): { text: string; tone: "ok" | "warn" | "error" | "muted" } {
    const away = this.origin.kind === "run" || !this.connected;
    if (away) {
      if (this.dirty) return { text: "unsaved changes, download to keep them", tone: "warn" };
      if (this.checked.current && this.checked.count) return { text: this.errorsText, tone: "error" };
      return { text: "no changes", tone: "muted" };
    }
    if (this.changedOnDisk) return { text: "changed on disk", tone: "error" };
    if (this.checked.current && this.checked.count) {
      return { text: this.dirty ? `unsaved changes · ${this.errorsText}` : this.errorsText, tone: "error" };
    }
    if (this.dirty) return { text: "unsaved changes", tone: "warn" };
    if (!this.checked.current) return { text: "checking…", tone: "muted" };
    return { text: "valid, saved", tone: "ok" };
  }

  private get errorsText(): string {
    return this.checked.count === 1 ? "1 error" : `${this.checked.count} errors`;
  }

  get sources(): SourceProvenance[] {
    return this.session?.sources ?? this.run?.sources ?? [];
  }

  get fileName(): string {
    return this.session?.file ?? `${this.draft?.name || "workflow"}.yaml`;
  }

  typeOf(name: string): TaskTypeView | undefined {
    return types.value?.get(name);
  }

  task(id: string): TaskSpec | undefined {
    return this.draft?.tasks.find((task) => task.id === id);
  }

  /** The input ports of a task: its type's, a `command` the inputs it has. */
  inputPorts(task: TaskSpec): string[] {
    const type = this.typeOf(task.type);
    if (isCommand(task.type) || !type) return Object.keys(task.inputs ?? {});
    const extra = Object.keys(task.inputs ?? {}).filter((port) => !type.inputs.includes(port));
    return [...type.inputs, ...extra];
  }

  /** The output ports of a task: its type's, `out` for a `command` or a type not known. */
  outputPorts(task: TaskSpec): string[] {
    const type = this.typeOf(task.type);
    if (!type) return ["out"];
    return type.outputs;
  }

  // changes

  /** Change the draft; validated `VALIDATE_AFTER_MS` after the last change. */
  change(mutate: (draft: Workflow) => void): void {
    if (!this.draft) return;
    mutate(this.draft);
    this.dirty = true;
    this.message = null;
    this.note = "";
    this.schedule(VALIDATE_AFTER_MS);
  }

  addTask(type: string, at?: Point): string | null {
    if (!this.draft) return null;
    const id = newTaskId(type, this.draft.tasks);
    const place = at ?? rightOf(this.places);
    this.change((draft) => {
      draft.tasks.push({ id, type, settings: {}, inputs: {} });
    });
    this.places[id] = place;
    this.selection = { kind: "task", id };
    if (!at) this.focus = id;
    this.note = "";
    return id;
  }

  move(id: string, to: Point): void {
    this.places[id] = to;
  }

  /** Connect an output port of a task to an input port of another (`+`: a new input of a
   * `command`, named after the task it reads); refused with a note when it closes a cycle or
   * the input is connected already. */
  connect(from: string, output: string, to: string, input: string): boolean {
    const draft = this.draft;
    const reader = this.task(to);
    if (!draft || !reader || !this.task(from)) return false;
    if (from === to) {
      this.note = `A task cannot read its own outputs: ${from}.${output} was not connected to ${to}.`;
      return false;
    }
    if (closesCycle(draft.tasks, from, to)) {
      this.note = `Refused: ${to} reading ${from}.${output} would close a cycle (${from} reads ${to} already).`;
      return false;
    }
    let port = input;
    if (input === "+") {
      port = newInputName(from, reader.inputs ?? {});
    } else if ((reader.inputs ?? {})[input] !== undefined) {
      this.note = `Refused: the input ${input} of ${to} is connected already (to ${reader.inputs![input]}); delete that connection first.`;
      return false;
    }
    this.change(() => {
      reader.inputs = { ...(reader.inputs ?? {}), [port]: `${from}.${output}` };
    });
    this.note = "";
    this.selection = { kind: "edge", to, port };
    return true;
  }

  removeInput(to: string, port: string): void {
    const reader = this.task(to);
    if (!reader || !(port in (reader.inputs ?? {}))) return;
    this.change(() => {
      const inputs = { ...(reader.inputs ?? {}) };
      delete inputs[port];
      reader.inputs = inputs;
      reader.stage = (reader.stage ?? []).filter((staged) => staged !== port);
    });
    if (this.selection?.kind === "edge" && this.selection.to === to && this.selection.port === port) {
      this.selection = null;
    }
  }

  /** Remove a task and the inputs of other tasks which read it. */
  removeTask(id: string): void {
    this.change((draft) => {
      draft.tasks = draft.tasks.filter((task) => task.id !== id);
      for (const task of draft.tasks) {
        const inputs = Object.entries(task.inputs ?? {}).filter(([, ref]) => inputTask(ref) !== id);
        if (inputs.length !== Object.keys(task.inputs ?? {}).length) {
          task.inputs = Object.fromEntries(inputs);
          task.stage = (task.stage ?? []).filter((port) => port in task.inputs!);
        }
      }
    });
    delete this.places[id];
    this.selection = null;
  }

  removeSelected(): void {
    const selection = this.selection;
    if (selection?.kind === "task") this.removeTask(selection.id);
    else if (selection?.kind === "edge") this.removeInput(selection.to, selection.port);
  }

  /** Rename a task; the inputs reading it follow. */
  rename(id: string, to: string): void {
    const task = this.task(id);
    if (!task || id === to || !to) return;
    this.change((draft) => {
      task.id = to;
      for (const other of draft.tasks) {
        for (const [port, ref] of Object.entries(other.inputs ?? {})) {
          if (inputTask(ref) === id) other.inputs![port] = `${to}${ref.slice(id.length)}`;
        }
      }
    });
    const place = this.places[id];
    if (place) {
      this.places[to] = place;
      delete this.places[id];
    }
    if (this.selection?.kind === "task" && this.selection.id === id) this.selection = { kind: "task", id: to };
  }

  setSetting(id: string, name: string, value: unknown): void {
    const task = this.task(id);
    if (!task) return;
    this.change(() => {
      const settings = { ...(task.settings ?? {}) };
      if (value === undefined) delete settings[name];
      else settings[name] = value;
      task.settings = settings;
    });
  }

  replaceSettings(id: string, settings: Record<string, unknown>): void {
    const task = this.task(id);
    if (!task) return;
    this.change(() => {
      task.settings = settings;
    });
  }

  // validation and estimate

  private schedule(delay: number): void {
    this.checked = { ...this.checked, current: false };
    if (this.timer !== null) window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.validate(), delay);
  }

  async validate(): Promise<void> {
    if (!this.draft || this.closed) return;
    const round = ++this.round;
    const workflow = cleaned(this.draft);
    let result: ValidationResult;
    try {
      result = await postJson<ValidationResult>("/validate", { workflow });
    } catch (error) {
      if (round !== this.round) return;
      this.checked = {
        current: true,
        ok: false,
        byTask: {},
        general: [parseProblem(`the workflow could not be validated: ${detailOf(error)}`)],
        count: 1,
      };
      return;
    }
    if (round !== this.round) return;
    const byTask: Record<string, Problem[]> = {};
    const general: Problem[] = [];
    for (const text of result.errors) {
      const problem = parseProblem(text);
      const id = problem.task ?? (problem.index !== null ? workflow.tasks[problem.index]?.id : undefined);
      if (id !== undefined && workflow.tasks.some((task) => task.id === id)) (byTask[id] ??= []).push(problem);
      else general.push(problem);
    }
    this.checked = { current: true, ok: result.ok, byTask, general, count: result.errors.length };
    if (result.ok) await this.estimate(workflow, round);
    else this.estimates = null;
  }

  private async estimate(workflow: Workflow, round: number): Promise<void> {
    try {
      const found = await postJson<Record<string, TaskEstimate>>("/estimate", {
        workflow,
        sources: this.sources,
      });
      if (round !== this.round) return;
      this.estimates = found;
      this.estimateError = "";
    } catch (error) {
      if (round !== this.round) return;
      this.estimates = null;
      this.estimateError = `no estimate: ${detailOf(error)}`;
    }
  }

  // save, run, download

  private async ask(kind: "save" | "run", force = false): Promise<EditResult | null> {
    if (!this.draft || this.origin.kind !== "session") return null;
    try {
      return await postJson<EditResult>(`/edits/${segment(this.origin.id)}/requests`, {
        kind,
        workflow: cleaned(this.draft),
        base: this.base,
        force,
        group: this.group.trim() || null,
      });
    } catch (error) {
      this.message = { text: `The ${kind} did not happen: ${detailOf(error)}`, tone: "error", lines: [] };
      void this.poll();
      return null;
    }
  }

  async save(force = false): Promise<void> {
    if (!this.draft) return;
    this.busy = "save";
    this.message = null;
    try {
      const result = await this.ask("save", force);
      if (!result) return;
      if (result.outcome === "saved" && result.disk) {
        this.base = result.disk.version ?? null;
        this.dirty = false;
        this.conflict = null;
        if (this.session) this.session = { ...this.session, disk: result.disk };
        this.message = { text: `Saved ${this.session?.path ?? this.fileName}.`, tone: "ok", lines: [] };
      } else if (result.outcome === "conflict") {
        this.conflict = result.disk ?? null;
        if (this.session && result.disk) this.session = { ...this.session, disk: result.disk };
        this.message = {
          text: "Not saved: the file changed on disk since this draft started from it. Reload it, or Save anyway.",
          tone: "error",
          lines: [],
        };
      } else {
        this.message = { text: result.message || `Not saved (${result.outcome}).`, tone: "error", lines: result.errors ?? [] };
      }
    } finally {
      this.busy = "";
    }
  }

  reload(): void {
    const disk = this.conflict ?? this.session?.disk;
    if (!disk) return;
    this.conflict = null;
    this.message = null;
    this.takeDisk(disk, true);
  }

  async runWorkflow(): Promise<void> {
    if (!this.draft) return;
    this.busy = "run";
    this.message = null;
    try {
      if (this.origin.kind === "session" && this.connected) {
        const result = await this.ask("run");
        if (!result) return;
        if (result.outcome === "submitted" && result.run) {
          go("runs", result.run);
          return;
        }
        this.message = { text: result.message || `Not run (${result.outcome}).`, tone: "error", lines: result.errors ?? [] };
        return;
      }
      // No machine behind the draft: submitted from here with the last snapshots.
      const body: Record<string, unknown> = {
        workflow: cleaned(this.draft),
        sources: this.sources,
        group: this.group.trim() || null,
      };
      const run = await postJson<RunView>("/runs", body);
      go("runs", run.id);
    } catch (error) {
      const lines = error instanceof ApiError && error.status === 422 ? error.detail.split("\n") : [];
      this.message = { text: lines.length ? "The service refused the workflow:" : `Not run: ${detailOf(error)}`, tone: "error", lines };
    } finally {
      this.busy = "";
    }
  }

  /** The YAML of the draft as a save writes it, as a download. */
  async download(): Promise<void> {
    if (!this.draft) return;
    this.busy = "download";
    try {
      const response = await request("/workflow-yaml", {
        method: "POST",
        body: JSON.stringify({ workflow: cleaned(this.draft) }),
        headers: { "Content-Type": "application/json" },
      });
      const { text } = (await response.json()) as { text: string };
      const url = URL.createObjectURL(new Blob([text], { type: "application/yaml" }));
      const link = document.createElement("a");
      link.href = url;
      link.download = this.fileName;
      document.body.appendChild(link);
      link.click();
      link.remove();
      window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (error) {
      this.message = { text: `The YAML could not be made: ${detailOf(error)}`, tone: "error", lines: [] };
    } finally {
      this.busy = "";
    }
  }
}

/** A reactive Editor of an origin, started. */
export function openEditor(origin: Origin): Editor {
  const editor = reactive(new Editor(origin)) as Editor;
  void editor.start();
  return editor;
}
