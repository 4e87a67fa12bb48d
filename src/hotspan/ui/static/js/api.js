// The only door from the UI to the server.  Every call here is a public API: the Pyroscope
// querier over Connect (protojson, or protobuf where a binary answer is wanted), the Tempo
// trace API, hotspan's /api/traces/{id}/spans|profile and its operator settings API
// (/api/v1/settings).

export const CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const QUERIER = "/querier.v1.QuerierService";
const TOKEN_KEY = "hotspan.token";
const TENANT_KEY = "hotspan.tenant";

/** An answer the UI cannot use, with a message meant for the person reading the page. */
export class ApiError extends Error {
  constructor(status, message, hint = "") {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.hint = hint;
  }
}

/** The query token and tenant this browser sends (kept in localStorage). */
export function settings() {
  return {
    token: localStorage.getItem(TOKEN_KEY) || "",
    tenant: localStorage.getItem(TENANT_KEY) || "",
  };
}

export function saveSettings({ token, tenant }) {
  for (const [key, value] of [
    [TOKEN_KEY, token],
    [TENANT_KEY, tenant],
  ]) {
    if (value) localStorage.setItem(key, value);
    else localStorage.removeItem(key);
  }
}

function headers(extra = {}) {
  const { token, tenant } = settings();
  const out = { ...extra };
  if (token) out.Authorization = `Bearer ${token}`;
  if (tenant) out["X-Scope-OrgID"] = tenant;
  return out;
}

async function send(path, init) {
  let response;
  try {
    response = await fetch(path, { ...init, headers: headers(init.headers) });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    const sent = headers(init.headers);
    if (Object.values(sent).some((v) => [...v].some((c) => c.charCodeAt(0) > 0xff))) {
      // fetch refuses a header it cannot send as Latin-1 before anything leaves the page.
      throw new ApiError(
        0,
        "the tenant or token in Settings has characters an HTTP header cannot carry",
        "set them again in Settings (letters of ISO-8859-1 only)",
      );
    }
    throw new ApiError(
      0,
      `cannot reach the hotspan server at ${location.origin}`,
      "check that `hotspan server` is running, then reload the page",
    );
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

async function errorOf(response) {
  const text = await response.text();
  let reason = text.trim();
  try {
    const body = JSON.parse(text);
    reason = body.message || body.error || reason;
  } catch {
    // A plain-text reason (the Tempo API answers errors as text).
  }
  if (response.status === 401) {
    return new ApiError(
      401,
      `the server asks for a query token: ${reason}`,
      "open Settings (top right) and paste a token that the server accepts",
    );
  }
  if (response.status === 404 && !reason) reason = "not found";
  return new ApiError(response.status, reason || `HTTP ${response.status}`);
}

/** A Connect call to querier.v1.QuerierService/<method>, protojson in and out. */
export async function querier(method, request, { signal } = {}) {
  const response = await send(`${QUERIER}/${method}`, {
    method: "POST",
    body: JSON.stringify(request),
    headers: { "Content-Type": "application/json" },
    signal,
  });
  return response.json();
}

/** A Connect call with a protobuf body; the answer's bytes (for example a pprof profile). */
export async function querierBinary(method, bytes, { signal } = {}) {
  const response = await send(`${QUERIER}/${method}`, {
    method: "POST",
    body: bytes,
    headers: { "Content-Type": "application/proto" },
    signal,
  });
  return response.arrayBuffer();
}

function withQuery(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === null || value === undefined || value === "") continue;
    query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/** GET a JSON API (the Tempo API, /api/traces/{id}/spans, ...); `params` become the query. */
export async function getJSON(path, params = {}, { signal } = {}) {
  const response = await send(withQuery(path, params), { method: "GET", signal });
  return response.json();
}

/**
 * PUT, POST or DELETE on a JSON API (the operator settings API): `body` (when given) is sent as
 * JSON, `params` become the query; the answer's JSON.  A refusal throws an ApiError whose
 * message is the server's reason.
 */
export async function sendJSON(method, path, body = undefined, params = {}, { signal } = {}) {
  const init = { method, signal };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  const response = await send(withQuery(path, params), init);
  return response.json();
}

/** GET a binary answer (for example /api/traces/{id}/profile?format=pprof). */
export async function getBytes(path, params = {}, { signal } = {}) {
  const response = await send(withQuery(path, params), { method: "GET", signal });
  return response.arrayBuffer();
}

// --- protobuf, just enough to ask SelectMergeProfile for a pprof in binary -----------------

function varint(out, value) {
  let v = BigInt(value);
  while (v > 0x7fn) {
    out.push(Number((v & 0x7fn) | 0x80n));
    v >>= 7n;
  }
  out.push(Number(v));
}

function stringField(out, field, text) {
  const bytes = new TextEncoder().encode(text);
  varint(out, (field << 3) | 2);
  varint(out, bytes.length);
  for (const b of bytes) out.push(b);
}

function intField(out, field, value) {
  varint(out, field << 3);
  varint(out, value);
}

/** querier.v1.SelectMergeProfileRequest as protobuf bytes (fields 1-4 and 8). */
export function selectMergeProfileRequest({ profileTypeID, labelSelector, start, end, traceIds = [] }) {
  const out = [];
  stringField(out, 1, profileTypeID);
  stringField(out, 2, labelSelector);
  intField(out, 3, start);
  intField(out, 4, end);
  for (const id of traceIds) stringField(out, 8, id);
  return new Uint8Array(out);
}
