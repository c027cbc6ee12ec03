// Writes src/api/limits.ts, the limits of what the service takes as values, from the OpenAPI
// document of the service (as states.mjs writes the states): what a task id may be (TaskId: its
// pattern and most characters, simrun_core.workflow). `npm run types` runs it, so the web app
// never writes these limits itself.
//
//   node scripts/limits.mjs OPENAPI_JSON OUTPUT
import { writeFileSync } from "node:fs";

import { schemasOfCommandLine } from "./openapi_schemas.mjs";

const { source, output, schemas } = schemasOfCommandLine("limits.mjs");

const taskId = schemas.TaskId;
const problems = [];
if (typeof taskId?.pattern !== "string") problems.push("components.schemas.TaskId has no pattern");
if (!Number.isInteger(taskId?.maxLength)) problems.push("components.schemas.TaskId has no maxLength");
if (problems.length) {
  for (const problem of problems) console.error(`${source}: ${problem}`);
  process.exit(1);
}

const text = `// Generated from the OpenAPI document (${source}) by \`npm run types\` (scripts/limits.mjs):
// do not edit. The limits the service checks (simrun_core), as values.

/** What a task id may be: lower case letters, digits and -, starting with a letter (TaskId). */
export const TASK_ID_PATTERN = new RegExp(${JSON.stringify(taskId.pattern)});
/** The most characters of a task id (TaskId). */
export const TASK_ID_MAX_CHARS = ${taskId.maxLength};
`;

writeFileSync(output, text);
