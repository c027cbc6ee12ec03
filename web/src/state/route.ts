// The address of the app after `#`: `#/runs/<run>` selects a run of the Executions, and keeps it
// on a reload. Each mode of the app (src/modes.ts) owns the paths of its first segment.
import { reactive } from "vue";

function decode(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part; // a malformed escape (`%zz`): taken as written, it names nothing
  }
}

/** The segments of the hash, decoded: `#/runs/a%2Fb` is `["runs", "a/b"]`. */
export function parseHash(hash: string): string[] {
  return hash
    .replace(/^#\/?/, "")
    .split("/")
    .filter((part) => part !== "")
    .map(decode);
}

export const route = reactive({ path: parseHash(window.location.hash) });

window.addEventListener("hashchange", () => {
  route.path = parseHash(window.location.hash);
});

/** Go to the path of segments (each encoded), e.g. `go("runs", id)`. */
export function go(...segments: string[]): void {
  window.location.hash = "#/" + segments.map(encodeURIComponent).join("/");
}
