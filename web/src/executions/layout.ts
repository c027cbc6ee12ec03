// The canvas of a run: its tasks in columns by their depth in the graph of their inputs.
import type { TaskSpec } from "../api/types";

/** The task an input reads: `<task>.<port>`, the task before the first dot. */
export function inputTask(source: string): string {
  const dot = source.indexOf(".");
  return dot < 0 ? source : source.slice(0, dot);
}

export interface Edge {
  from: string;
  to: string;
  port: string;
}

/** The edges of the inputs: from the task read to the task reading it, per input port. */
export function edges(tasks: TaskSpec[]): Edge[] {
  const ids = new Set(tasks.map((task) => task.id));
  const found: Edge[] = [];
  for (const task of tasks) {
    for (const [port, source] of Object.entries(task.inputs ?? {})) {
      const from = inputTask(source);
      if (ids.has(from)) found.push({ from, to: task.id, port });
    }
  }
  return found;
}

/**
 * The depth of every task: 0 without inputs, else one more than the deepest task it reads.
 * A cycle (which the service refuses) is cut where it closes, so every task gets a depth.
 */
export function depths(tasks: TaskSpec[]): Map<string, number> {
  const byId = new Map(tasks.map((task) => [task.id, task]));
  const depth = new Map<string, number>();
  const visiting = new Set<string>();
  const of = (id: string): number => {
    const known = depth.get(id);
    if (known !== undefined) return known;
    if (visiting.has(id)) return 0;
    visiting.add(id);
    let value = 0;
    for (const source of Object.values(byId.get(id)?.inputs ?? {})) {
      const from = inputTask(source);
      if (byId.has(from)) value = Math.max(value, of(from) + 1);
    }
    visiting.delete(id);
    depth.set(id, value);
    return value;
  };
  for (const task of tasks) of(task.id);
  return depth;
}

/** The columns of the canvas: the task ids of each depth, in workflow order. */
export function columns(tasks: TaskSpec[]): string[][] {
  const depth = depths(tasks);
  const result: string[][] = [];
  for (const task of tasks) {
    const column = depth.get(task.id) ?? 0;
    while (result.length <= column) result.push([]);
    result[column]!.push(task.id);
  }
  return result;
}
