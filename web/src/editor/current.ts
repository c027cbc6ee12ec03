// The Editor the address names (`#/edit/<session>`, `#/runs/<run>/edit`), open while a session
// of the app is; `#/edit` alone is the list of the edit sessions.
import { computed, shallowRef, watch } from "vue";
import { route } from "../state/route";
import { session } from "../state/session";
import { openEditor, type Editor, type Origin } from "./editorState";

export const origin = computed<Origin | null>(() => {
  const path = route.path;
  if (path[0] === "edit" && path[1] !== undefined) return { kind: "session", id: path[1] };
  if (path[0] === "runs" && path[1] !== undefined && path[2] === "edit") return { kind: "run", id: path[1] };
  return null;
});

export const current = shallowRef<Editor | null>(null);

watch(
  () => [origin.value?.kind, origin.value?.id, session.identity !== null] as const,
  ([kind, id, signedIn]) => {
    const now = current.value;
    if (now && now.origin.kind === kind && now.origin.id === id && signedIn) return;
    now?.stop();
    current.value = origin.value && signedIn ? openEditor(origin.value) : null;
  },
  { immediate: true },
);
