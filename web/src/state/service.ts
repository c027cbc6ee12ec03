// The runs and the servers of the service, live from `GET /events` while a session is open.
import { computed, shallowRef, watch } from "vue";
import { EventStream } from "../api/sse";
import type { RunItem, ServerUsage } from "../api/types";
import { session } from "./session";

export const runs = shallowRef<RunItem[] | null>(null);
export const servers = shallowRef<ServerUsage[] | null>(null);

let stream: EventStream | null = null;

function open(): void {
  stream = new EventStream("events", "/events", {
    message({ event, data }) {
      try {
        if (event === "runs") runs.value = JSON.parse(data) as RunItem[];
        else if (event === "servers") servers.value = JSON.parse(data) as ServerUsage[];
      } catch {
        // a message that is not JSON: the next one replaces it
      }
    },
  });
}

watch(
  () => session.identity !== null,
  (signedIn) => {
    stream?.close();
    stream = null;
    runs.value = null;
    servers.value = null;
    if (signedIn) open();
  },
  { immediate: true },
);

/** The cores the pods of runs request on all servers, out of all their cores. */
export const capacity = computed(() => {
  const all = servers.value ?? [];
  const cores = all.reduce((sum, server) => sum + server.cores, 0);
  const used = all.reduce(
    (sum, server) => sum + server.pods.reduce((pods, pod) => pods + pod.cores, 0),
    0,
  );
  const queued = (runs.value ?? []).filter((run) => run.state === "queued").length;
  return { cores, used, queued, known: servers.value !== null };
});
