// The draft of a workflow as a graph: new task ids, connections that close a cycle, the problems
// of the service by task and field, the first layout of the cards, and the workflow as sent.
import { TASK_ID_MAX_CHARS } from "../api/limits";
import type { TaskSpec, Workflow } from "../api/types";
import { columns, inputTask } from "../executions/layout";

export interface Point {
  x: number;
  y: number;
}

/** The width of a card and the gaps of the first layout, in pixels. */
export const CARD_WIDTH = 236;
export const COLUMN_GAP = 96;
export const ROW_GAP = 200;
export const ORIGIN: Point = { x: 40, y: 90 };

/** A new task of a type: the last part of its name, `-2`, `-3` for further ones (cut to fit
 * the most characters of an id). */
export function newTaskId(type: string, tasks: TaskSpec[]): string {
  const last = type.split(".").pop() ?? type;
  let base = last.toLowerCase().replace(/[^a-z0-9-]+/g, "-").replace(/^[^a-z]+/, "") || "task";
  base = base.slice(0, TASK_ID_MAX_CHARS).replace(/-+$/, "") || "task";
  const taken = new Set(tasks.map((task) => task.id));
  if (!taken.has(base)) return base;
  for (let n = 2; ; n += 1) {
    const suffix = `-${n}`;
    const id = base.slice(0, TASK_ID_MAX_CHARS - suffix.length).replace(/-+$/, "") + suffix;
    if (!taken.has(id)) return id;
  }
}

/** An input of a `command` named after the task it reads, unique among its inputs. */
export function newInputName(source: string, inputs: Record<string, string>): string {
  if (!(source in inputs)) return source;
  for (let n = 2; ; n += 1) {
    if (!(`${source}-${n}` in inputs)) return `${source}-${n}`;
  }
}

/** Whether task `reader` reads (directly or through others) the outputs of task `source`. */
export function readsFrom(tasks: TaskSpec[], reader: string, source: string): boolean {
  const byId = new Map(tasks.map((task) => [task.id, task]));
  const seen = new Set<string>();
  const stack = [reader];
  while (stack.length) {
    const id = stack.pop()!;
    if (id === source) return true;
    if (seen.has(id)) continue;
    seen.add(id);
    for (const ref of Object.values(byId.get(id)?.inputs ?? {})) stack.push(inputTask(ref));
  }
  return false;
}

/** Whether `to` reading from `from` closes a cycle: `from` reads `to` already (or is it). */
export function closesCycle(tasks: TaskSpec[], from: string, to: string): boolean {
  return from === to || readsFrom(tasks, from, to);
}

/** The first layout: the tasks in columns by the depth of their inputs. */
export function layout(tasks: TaskSpec[]): Record<string, Point> {
  const places: Record<string, Point> = {};
  columns(tasks).forEach((column, depth) => {
    column.forEach((id, row) => {
      places[id] = { x: ORIGIN.x + depth * (CARD_WIDTH + COLUMN_GAP), y: ORIGIN.y + row * ROW_GAP };
    });
  });
  return places;
}

/** Where a task added by a click goes: right of the right-most one, at its height. */
export function rightOf(places: Record<string, Point>): Point {
  const all = Object.values(places);
  if (!all.length) return { ...ORIGIN };
  const right = all.reduce((best, place) => (place.x > best.x ? place : best));
  return { x: right.x + CARD_WIDTH + COLUMN_GAP, y: right.y };
}

/** A problem of a workflow as the service words it: `task 'ID': FIELD: what is wrong`. */
export interface Problem {
  task: string | null;
  index: number | null;
  field: string | null;
  message: string;
  text: string;
}

const IN_TASK = /^task '((?:[^'\\]|\\.)*)': ([\s\S]*)$/;
const AT_INDEX = /^tasks\[(\d+)\]: ([\s\S]*)$/;
const FIELD = /^((?:settings|inputs|resources|stage|split|id|type|name|tasks|reserve)(?:[.[][^\s:]*)?): ([\s\S]*)$/;

export function parseProblem(text: string): Problem {
  let rest = text;
  let task: string | null = null;
  let index: number | null = null;
  const inTask = IN_TASK.exec(rest);
  const atIndex = inTask ? null : AT_INDEX.exec(rest);
  if (inTask) {
    task = inTask[1]!.replace(/\\(.)/g, "$1");
    rest = inTask[2]!;
  } else if (atIndex) {
    index = Number(atIndex[1]);
    rest = atIndex[2]!;
  }
  const field = FIELD.exec(rest);
  return {
    task,
    index,
    field: field ? field[1]! : null,
    message: field ? field[2]! : rest,
    text,
  };
}

/** The setting a problem's field names (`settings.args[2]` is `args`), null for another. */
export function settingOf(field: string | null): string | null {
  if (!field || !field.startsWith("settings.")) return null;
  const rest = field.slice("settings.".length);
  const match = /^[^.[]+/.exec(rest);
  return match ? match[0] : null;
}

function isEmpty(value: unknown): boolean {
  if (value === null || value === undefined) return true;
  if (Array.isArray(value)) return value.length === 0;
  if (typeof value === "object") return Object.keys(value as object).length === 0;
  return false;
}

/** The workflow as it is sent: a copy without the empty parts a file leaves out. */
export function cleaned(workflow: Workflow): Workflow {
  const tasks = workflow.tasks.map((task) => {
    const copy: TaskSpec = { id: task.id, type: task.type };
    if (!isEmpty(task.settings)) copy.settings = { ...task.settings };
    if (!isEmpty(task.inputs)) copy.inputs = { ...task.inputs };
    if (task.split) copy.split = task.split;
    const resources = Object.fromEntries(
      Object.entries(task.resources ?? {}).filter(([, value]) => value !== null && value !== undefined),
    );
    if (!isEmpty(resources)) copy.resources = resources;
    const stage = (task.stage ?? []).filter((port) => port in (task.inputs ?? {}));
    if (stage.length) copy.stage = stage;
    return copy;
  });
  const result: Workflow = { name: workflow.name, tasks };
  if (workflow.split && workflow.split !== "fastest") result.split = workflow.split;
  if (workflow.reserve) result.reserve = workflow.reserve;
  return result;
}

/** A deep copy of JSON data. */
export function copy<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}
