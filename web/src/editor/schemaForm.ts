// The settings form of a task type from the JSON Schema of its settings struct (msgspec's): a
// field per property but those the schema marks `readOnly` (the type's plan sets them), of a
// kind the form edits (numbers, choices, switches, text, lines of text) or else JSON.

type Schema = Record<string, unknown>;

export type FieldKind = "integer" | "number" | "choice" | "switch" | "text" | "lines" | "json";

export interface Field {
  name: string;
  kind: FieldKind;
  required: boolean;
  /** Whether null is one of its values (`X | None`). */
  nullable: boolean;
  default?: unknown;
  hasDefault: boolean;
  choices: unknown[];
  description: string;
}

function resolve(schema: Schema, root: Schema): Schema {
  const ref = schema.$ref;
  if (typeof ref === "string" && ref.startsWith("#/$defs/")) {
    const defs = (root.$defs ?? {}) as Record<string, Schema>;
    return defs[ref.slice("#/$defs/".length)] ?? {};
  }
  return schema;
}

/** The schema of a property without its `null` alternative, and whether it had one. */
function unwrapNull(schema: Schema, root: Schema): { schema: Schema; nullable: boolean } {
  const options = (schema.anyOf ?? schema.oneOf) as Schema[] | undefined;
  if (Array.isArray(options)) {
    const others = options.filter((option) => option.type !== "null");
    const nullable = others.length < options.length;
    if (others.length === 1) return { schema: resolve(others[0]!, root), nullable };
    return { schema: { anyOf: others }, nullable };
  }
  return { schema: resolve(schema, root), nullable: false };
}

function kindOf(schema: Schema): { kind: FieldKind; choices: unknown[] } {
  if (Array.isArray(schema.enum)) return { kind: "choice", choices: schema.enum as unknown[] };
  switch (schema.type) {
    case "integer":
      return { kind: "integer", choices: [] };
    case "number":
      return { kind: "number", choices: [] };
    case "boolean":
      return { kind: "switch", choices: [] };
    case "string":
      return { kind: "text", choices: [] };
    case "array": {
      const items = (schema.items ?? {}) as Schema;
      return { kind: items.type === "string" && !items.enum ? "lines" : "json", choices: [] };
    }
    default:
      return { kind: "json", choices: [] };
  }
}

/** The fields of the settings form of a schema, in the order of its properties. */
export function fieldsOf(schema: Record<string, unknown> | undefined): Field[] {
  if (!schema) return [];
  const root = schema as Schema;
  const properties = (root.properties ?? {}) as Record<string, Schema>;
  const required = new Set((root.required ?? []) as string[]);
  const fields: Field[] = [];
  for (const [name, property] of Object.entries(properties)) {
    if (property.readOnly === true) continue;
    const { schema: inner, nullable } = unwrapNull(property, root);
    if (inner.readOnly === true) continue;
    const { kind, choices } = kindOf(inner);
    fields.push({
      name,
      kind,
      required: required.has(name),
      nullable,
      default: property.default,
      hasDefault: "default" in property,
      choices,
      description: String(property.description ?? inner.description ?? property.title ?? ""),
    });
  }
  return fields;
}

/** The names a schema knows (its properties, read-only ones too). */
export function knownNames(schema: Record<string, unknown> | undefined): Set<string> {
  return new Set(Object.keys(((schema ?? {}).properties ?? {}) as object));
}

const NUMBER = /^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/;

/**
 * The value a text of a number field stands for: undefined for an empty field (not written),
 * the number when it is one, else the text as typed, which the service then refuses under the
 * field (so the message says what the type expected).
 */
export function numberValue(text: string): unknown {
  const trimmed = text.trim();
  if (trimmed === "") return undefined;
  if (NUMBER.test(trimmed)) return Number(trimmed);
  return text;
}

/** What a field shows of a value. */
export function shownValue(field: Field, value: unknown): string {
  if (value === undefined) return "";
  if (field.kind === "lines" && Array.isArray(value)) return value.map(String).join("\n");
  if (field.kind === "json") return JSON.stringify(value, null, 2);
  if (value === null) return "null";
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** The placeholder of a field: its default, else that it is required. */
export function placeholderOf(field: Field): string {
  if (field.hasDefault) {
    const value = field.default;
    return `default ${value === null ? "none" : typeof value === "string" ? value : JSON.stringify(value)}`;
  }
  return field.required ? "required" : "";
}
