// The lines of the logs of a task as the inspector shows them: the header of each pod, errors
// and tracebacks (red), the lines of the Argo executor (hidden unless asked for), the others.

export type LineKind = "header" | "error" | "executor" | "plain";

export interface LogLine {
  text: string;
  kind: LineKind;
}

const HEADER = /^==> .+ <==$/;
/** A line the Argo executor writes: `time="..." level=info msg="..."`. */
const EXECUTOR = /^time="[^"]*" level=\w+ /;
const TRACEBACK = /^Traceback \(most recent call last\):/;
const ERROR =
  /(\b[A-Z]\w*(Error|Exception)\b|\bERROR\b|\bFATAL\b|\bCRITICAL\b|\berror:|\bpanic:|\bKilled\b|\bkilled for memory\b)/;

export function classify(text: string): LogLine[] {
  const lines: LogLine[] = [];
  let inTraceback = false;
  for (const line of text.split("\n")) {
    if (HEADER.test(line)) {
      inTraceback = false;
      lines.push({ text: line, kind: "header" });
      continue;
    }
    if (EXECUTOR.test(line)) {
      lines.push({ text: line, kind: "executor" });
      continue;
    }
    if (TRACEBACK.test(line)) {
      inTraceback = true;
      lines.push({ text: line, kind: "error" });
      continue;
    }
    if (inTraceback) {
      // The frames are indented; the first line that is not is the exception, its end.
      if (!/^\s/.test(line)) inTraceback = false;
      lines.push({ text: line, kind: "error" });
      continue;
    }
    lines.push({ text: line, kind: ERROR.test(line) ? "error" : "plain" });
  }
  while (lines.length && lines[lines.length - 1]!.text === "") lines.pop();
  return lines;
}
