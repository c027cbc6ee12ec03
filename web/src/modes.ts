// The modes of the app, switched in the top bar. A mode owns the paths whose first segment is
// one of its `prefixes` (the first mode also the empty path). The Editor joins as a second
// entry (`#/edit`, spec: web app, The Editor) with its own view and top-bar part.
import type { Component } from "vue";
import ExecutionsView from "./executions/ExecutionsView.vue";
import ExecutionsCrumbs from "./executions/ExecutionsCrumbs.vue";

export interface Mode {
  id: string;
  label: string;
  /** The first segments of the paths of the mode; the first one is where its switch goes. */
  prefixes: string[];
  /** The view below the top bar. */
  view: Component;
  /** What the top bar says of where the user is (a breadcrumb), beside the switch. */
  crumbs?: Component;
}

export const MODES: Mode[] = [
  {
    id: "executions",
    label: "Executions",
    prefixes: ["runs"],
    view: ExecutionsView,
    crumbs: ExecutionsCrumbs,
  },
];

/** The mode of a path: the one owning its first segment, the first mode for the empty path. */
export function modeOf(path: string[]): Mode | null {
  const first = path[0];
  if (first === undefined) return MODES[0] ?? null;
  return MODES.find((mode) => mode.prefixes.includes(first)) ?? null;
}
