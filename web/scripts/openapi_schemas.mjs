// The schemas of the service's OpenAPI document named on the command line of a generator of
// web values (states.mjs, limits.mjs): `node scripts/NAME.mjs OPENAPI_JSON OUTPUT`. Exits 2 with
// the usage for other arguments, 1 naming the file when it is no OpenAPI document.
import { readFileSync } from "node:fs";

export function schemasOfCommandLine(script) {
  const [source, output, ...rest] = process.argv.slice(2);
  if (!source || !output || rest.length) {
    console.error(`usage: node scripts/${script} OPENAPI_JSON OUTPUT`);
    process.exit(2);
  }
  try {
    const schemas = JSON.parse(readFileSync(source, "utf8")).components?.schemas ?? {};
    return { source, output, schemas };
  } catch (error) {
    console.error(`${source}: cannot be read as the OpenAPI document: ${error.message}`);
    process.exit(1);
  }
}
