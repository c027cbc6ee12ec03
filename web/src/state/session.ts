// The token of the user and the identity the service gave it. The token is kept in the local
// storage of the browser (spec: web app, Login) and sent only as a bearer header.
import { reactive } from "vue";
import type { Identity } from "../api/types";

const KEY = "simrun.token";

function stored(): string | null {
  try {
    return window.localStorage.getItem(KEY);
  } catch {
    return null; // storage refused (a privacy mode): the token lives as long as the page
  }
}

function store(token: string | null): void {
  try {
    if (token === null) window.localStorage.removeItem(KEY);
    else window.localStorage.setItem(KEY, token);
  } catch {
    // see `stored`
  }
}

export const session = reactive({
  /** The token in use, null before a login. */
  token: stored() as string | null,
  /** Who the token names (`GET /me`), null until the service confirmed it. */
  identity: null as Identity | null,
  /** Why the login is shown again (a token the service refused), empty at first. */
  message: "",

  /** Start the session of a token the service accepted. */
  begin(token: string, identity: Identity): void {
    this.token = token;
    this.identity = identity;
    this.message = "";
    store(token);
  },

  /** End the session: the token leaves the browser and the login says why. */
  end(message = ""): void {
    this.token = null;
    this.identity = null;
    this.message = message;
    store(null);
  },

  /** The service refused the token (401): back to the login with its reason. */
  expire(detail: string): void {
    if (this.token === null) return;
    this.end(`The service no longer accepts this token (${detail}). Log in again.`);
  },
});
