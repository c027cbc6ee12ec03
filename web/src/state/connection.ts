// Whether every event stream is connected: the top bar shows "reconnecting" while one is not.
import { computed, reactive } from "vue";

const down = reactive(new Set<string>());

export function streamDown(name: string): void {
  down.add(name);
}

export function streamUp(name: string): void {
  down.delete(name);
}

export const reconnecting = computed(() => down.size > 0);
