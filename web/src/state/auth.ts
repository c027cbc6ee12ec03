// The login: a token is taken once `GET /me` accepted it.
import { ApiError, request } from "../api/http";
import type { Identity } from "../api/types";
import { session } from "./session";

/** Check a token with `GET /me` and begin its session; a message for the login otherwise. */
export async function logIn(token: string): Promise<string | null> {
  const given = token.trim();
  if (!given) return "Enter a token of the tokens file of the service.";
  try {
    const response = await request("/me", {}, given);
    session.begin(given, (await response.json()) as Identity);
    return null;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      return `The service does not accept this token: ${error.detail}`;
    }
    return `The token could not be checked: ${error instanceof Error ? error.message : String(error)}`;
  }
}

/**
 * Resume the session of the stored token: the identity from `GET /me`. A token refused ends
 * the session with a message; a service not reachable keeps the token and says so.
 */
export async function resume(): Promise<string | null> {
  const token = session.token;
  if (token === null) return null;
  try {
    const response = await request("/me", {}, token);
    session.begin(token, (await response.json()) as Identity);
    return null;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      session.end(`The service no longer accepts the stored token (${error.detail}). Log in again.`);
      return null;
    }
    return error instanceof Error ? error.message : String(error);
  }
}
