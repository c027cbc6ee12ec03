// The shapes of the API, from the OpenAPI document of the service (tests/api/openapi.json,
// generated into schema.d.ts by `npm run types`): never written a second time here.
import type { components } from "./schema";
import { ENDED_RUN_STATES, RUN_STATES } from "./states";

type Schemas = components["schemas"];

export type Identity = Schemas["Identity"];
export type RunItem = Schemas["RunItem"];
export type RunView = Schemas["RunView"];
export type RunState = Schemas["RunState"];
export type TaskState = Schemas["TaskState"];
export type TaskView = Schemas["TaskView"];
export type TaskSpec = Schemas["TaskSpec"];
export type PodView = Schemas["PodView"];
export type PlanView = Schemas["PlanView"];
export type ProgressView = Schemas["ProgressView"];
export type WorkerView = Schemas["WorkerView"];
export type ServerUsage = Schemas["ServerUsage"];
export type PodUsage = Schemas["PodUsage"];
export type OutputFile = Schemas["OutputFile"];
export type OutputListing = Schemas["OutputListing"];
export type SourceProvenance = Schemas["SourceProvenance"];
export type ErrorDetail = Schemas["ErrorDetail"];
export type Workflow = Schemas["Workflow"];
export type SplitMode = Schemas["SplitMode"];
export type ValidationResult = Schemas["ValidationResult"];
export type TaskEstimate = Schemas["TaskEstimate"];
export type TaskTypeView = Schemas["TaskTypeView"];
export type EditSession = Schemas["EditSession"];
export type EditSessionSummary = Schemas["EditSessionSummary"];
export type EditResult = Schemas["EditResult"];
export type DiskState = Schemas["DiskState"];
export type TreeState = Schemas["TreeState"];

/** The workers of every task of a run, as the message `workers` of its event stream has them. */
export type WorkersByTask = Record<string, WorkerView[]>;

/** An event of a run's log as `GET /runs/{run}/events` and `/history` send it. */
export interface RunEvent {
  seq: number;
  time: string;
  type: string;
  task?: string;
  worker?: string;
  state?: string;
  message?: string | null;
  index?: number;
  /** The units of a `units-done` event and their seconds (the same length). */
  indices?: number[];
  seconds?: number | number[];
  [field: string]: unknown;
}

export const ACTIVE_STATES: readonly RunState[] = RUN_STATES.filter((state) => !ENDED_RUN_STATES.has(state));
