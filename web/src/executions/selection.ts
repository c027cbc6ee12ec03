// The run selected in the Executions (`#/runs/<run>`), open while a session is.
import { computed, shallowRef, watch } from "vue";
import { route } from "../state/route";
import { session } from "../state/session";
import { RunSession } from "./runSession";

export const selectedId = computed(() =>
  // `#/runs/<run>/edit` is the Editor's (Rerun with changes): no stream of the run for it.
  route.path[0] === "runs" && route.path[1] !== undefined && route.path[2] !== "edit"
    ? route.path[1]
    : null,
);

export const selected = shallowRef<RunSession | null>(null);

watch(
  () => [selectedId.value, session.identity !== null] as const,
  ([id, signedIn]) => {
    if (selected.value && selected.value.id === id && signedIn) return;
    selected.value?.close();
    selected.value = id !== null && signedIn ? new RunSession(id) : null;
  },
  { immediate: true },
);
