// How numbers, times and names read in the app.

/** A server by the last two parts of its host name: `agent-0` for `k3d-simrun-test-agent-0`. */
export function serverName(name: string | null | undefined): string {
  if (!name) return "";
  const parts = name.split("-");
  return parts.length <= 2 ? name : parts.slice(-2).join("-");
}

export function clock(iso: string | null | undefined): string {
  if (!iso) return "";
  const time = new Date(iso);
  if (Number.isNaN(time.getTime())) return iso;
  return time.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

export function dateTime(iso: string | null | undefined): string {
  if (!iso) return "";
  const time = new Date(iso);
  if (Number.isNaN(time.getTime())) return iso;
  const today = new Date().toDateString() === time.toDateString();
  return today ? clock(iso) : `${time.toLocaleDateString()} ${clock(iso)}`;
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 90) return `${Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 90) return `${minutes} min ${Math.round(seconds - minutes * 60)} s`;
  const hours = Math.floor(minutes / 60);
  return `${hours} h ${minutes - hours * 60} min`;
}

export function gib(value: number | null | undefined): string {
  if (value === null || value === undefined) return "?";
  if (value < 1) return `${(value * 1024).toFixed(0)} MiB`;
  return `${value.toFixed(value < 10 ? 2 : 1)} GiB`;
}

export function cores(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

export function count(value: number): string {
  return value.toLocaleString("en-US");
}

export function bytes(value: number): string {
  if (value < 1024) return `${value} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let scaled = value / 1024;
  let unit = 0;
  while (scaled >= 1024 && unit < units.length - 1) {
    scaled /= 1024;
    unit += 1;
  }
  return `${scaled.toFixed(scaled < 10 ? 1 : 0)} ${units[unit]}`;
}

export function percent(share: number): number {
  return Math.max(0, Math.min(100, Math.round(share * 100)));
}

/** What N of `learned from N runs` counts, the source of a task's resources as the service (and
 * the CLI, `simrun_core.resources.LEARNED_FROM_RUNS`) says it. */
export const LEARNED_FROM_RUNS =
  "learned from N runs: the memory per process measured in N earlier runs of the same task type, model and cost setting";

/** The explanation of where a task's resources come from, for its title: what N counts when
 * they are learned, nothing otherwise. */
export function sourceMeaning(source: string | null | undefined): string {
  return source?.startsWith("learned from ") ? LEARNED_FROM_RUNS : "";
}

/** Who submitted a run: a person, or an agent with the person it acts for. */
export function submitter(run: { submitted_by: string; agent: string | null; owner: string }): string {
  return run.agent ? `${run.agent} (agent of ${run.owner})` : run.submitted_by;
}
