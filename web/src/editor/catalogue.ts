// The task types of the service (`GET /task-types`), loaded once per session of the app.
import { shallowRef, ref } from "vue";
import { ApiError, getJson } from "../api/http";
import type { TaskTypeView } from "../api/types";

export const types = shallowRef<Map<string, TaskTypeView> | null>(null);
export const typesError = ref("");
let loading: Promise<void> | null = null;

export function loadTypes(): Promise<void> {
  if (types.value) return Promise.resolve();
  loading ??= getJson<TaskTypeView[]>("/task-types")
    .then((found) => {
      types.value = new Map(found.map((type) => [type.name, type]));
      typesError.value = "";
    })
    .catch((error: unknown) => {
      typesError.value = `The task types could not be read: ${error instanceof ApiError ? error.detail : String(error)}`;
    })
    .finally(() => {
      loading = null;
    });
  return loading;
}

/** The group of a type in the palette: its name before the first `.`, else "General". */
export function groupOf(name: string): string {
  const dot = name.indexOf(".");
  if (dot <= 0) return "General";
  const group = name.slice(0, dot);
  return group.charAt(0).toUpperCase() + group.slice(1);
}

/** The subtitle of a type: its description, else how it runs. */
export function subtitleOf(type: TaskTypeView): string {
  return type.description || (type.splittable ? "Split over servers" : "One process");
}

/** The ports of a task of a type: `command` reads any input and writes `out`. */
export function isCommand(type: string): boolean {
  return type === "command";
}
