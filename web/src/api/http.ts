// Requests to the API of the service with the bearer token of the session (never in a URL).
import { session } from "../state/session";

/** The root of the API: the app lives at `<root>/ui/`, e.g. at `/ui/` of the service. */
export const apiRoot = window.location.pathname.replace(/\/ui(\/.*)?$/, "");

/** A request the service refused (`status` its code) or could not answer (`status` 0). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly detail: string,
  ) {
    super(detail);
    this.name = "ApiError";
  }
}

/** The `detail` of a refusal, else its text, else the status line. */
export async function refusalOf(response: Response): Promise<ApiError> {
  let detail = `${response.status} ${response.statusText}`.trim();
  try {
    const text = await response.text();
    try {
      const body = JSON.parse(text) as { detail?: unknown };
      if (typeof body.detail === "string" && body.detail) detail = body.detail;
    } catch {
      if (text.trim()) detail = text.trim();
    }
  } catch {
    // the body is gone with the connection: the status says enough
  }
  return new ApiError(response.status, detail);
}

export function authHeaders(token: string | null = session.token): Record<string, string> {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/**
 * Send a request with the token of the session. A 401 ends the session (back to the login, with
 * the service's reason); every refusal throws an ApiError with the service's detail, a service
 * that cannot be reached one with status 0.
 */
export async function request(path: string, init: RequestInit = {}, token?: string): Promise<Response> {
  const headers = { ...authHeaders(token ?? session.token), ...(init.headers as Record<string, string>) };
  let response: Response;
  try {
    response = await fetch(apiRoot + path, { ...init, headers, cache: "no-store" });
  } catch (error) {
    if (error instanceof DOMException && error.name === "AbortError") throw error;
    throw new ApiError(0, "the service cannot be reached");
  }
  if (response.ok) return response;
  const refusal = await refusalOf(response);
  if (response.status === 401 && token === undefined) session.expire(refusal.detail);
  throw refusal;
}

export async function getJson<T>(path: string, init?: RequestInit): Promise<T> {
  return (await (await request(path, init)).json()) as T;
}

export async function getText(path: string, init?: RequestInit): Promise<string> {
  return (await request(path, init)).text();
}

export async function postJson<T>(path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method: "POST" };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  return (await (await request(path, init)).json()) as T;
}

/** A path segment of a run or a task id. */
export function segment(id: string): string {
  return encodeURIComponent(id);
}
