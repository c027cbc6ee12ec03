// The modes of the app, switched in the top bar. A mode owns the paths whose first segment is
// one of its `prefixes` (the first mode also the empty path), and the paths its `owns` claims
// before that: the Editor owns `#/edit/...` and `#/runs/<run>/edit` (Rerun with changes).
import type { Component } from "vue";
import EditorCrumbs from "./editor/EditorCrumbs.vue";
import EditorView from "./editor/EditorView.vue";
import ExecutionsView from "./executions/ExecutionsView.vue";
import ExecutionsCrumbs from "./executions/ExecutionsCrumbs.vue";

export interface Mode {
  id: string;
  label: string;
  /** The first segments of the paths of the mode; the first one is where its switch goes. */
  prefixes: string[];
  /** Paths of other first segments the mode claims (checked before the prefixes). */
  owns?: (path: string[]) => boolean;
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
  {
    id: "editor",
    label: "Editor",
    prefixes: ["edit"],
    owns: (path) => path[0] === "runs" && path[1] !== undefined && path[2] === "edit",
    view: EditorView,
    crumbs: EditorCrumbs,
  },
];

/** The mode of a path: the one owning its first segment, the first mode for the empty path. */
export function modeOf(path: string[]): Mode | null {
  const claimed = MODES.find((mode) => mode.owns?.(path));
  if (claimed) return claimed;
  const first = path[0];
  if (first === undefined) return MODES[0] ?? null;
  return MODES.find((mode) => mode.prefixes.includes(first)) ?? null;
}
