// Writes src/api/states.ts, the states of runs and tasks as values, from the OpenAPI document of
// the service (as openapi-typescript writes their types into schema.d.ts): every RunState, the
// ended ones (EndedRunState) and the final task states (FinalTaskState). `npm run types` runs
// it, so the web app never writes these sets itself.
//
//   node scripts/states.mjs OPENAPI_JSON OUTPUT
import { writeFileSync } from "node:fs";

import { schemasOfCommandLine } from "./openapi_schemas.mjs";

const { source, output, schemas } = schemasOfCommandLine("states.mjs");

/** The values of a string enum schema of the document; exits naming the schema if it has none. */
function values(name) {
  const schema = schemas[name];
  if (!schema || !Array.isArray(schema.enum) || !schema.enum.every((value) => typeof value === "string")) {
    console.error(`${source}: components.schemas.${name} is no enum of strings`);
    process.exit(1);
  }
  return schema.enum;
}

const list = (states) => states.map((state) => JSON.stringify(state)).join(", ");
const text = `// Generated from the OpenAPI document (${source}) by \`npm run types\` (scripts/states.mjs):
// do not edit. The states the service defines (simrun_core.states), as values.
import type { components } from "./schema";

type RunState = components["schemas"]["RunState"];
type TaskState = components["schemas"]["TaskState"];

/** Every state of a run, in order. */
export const RUN_STATES: readonly RunState[] = [${list(values("RunState"))}];
/** The states of a run that has ended (EndedRunState); the event that ends a run has its name. */
export const ENDED_RUN_STATES: ReadonlySet<string> = new Set<RunState>([${list(values("EndedRunState"))}]);
/** The states of a task that will not change any more (FinalTaskState). */
export const FINAL_TASK_STATES: ReadonlySet<string> = new Set<TaskState>([${list(values("FinalTaskState"))}]);
`;

writeFileSync(output, text);
