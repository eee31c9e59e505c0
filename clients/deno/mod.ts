/**
 * The pgfence reference client for Deno (and Supabase Edge Functions), over postgres.js: the
 * TypeScript port of the Python client (src/pgfence/client.py), with the same names where the
 * language allows.
 *
 * - `Owner` holds one lease: acquires it, renews it in the background, knows locally when it
 *   must stop trusting it, runs fenced transactions, drains and releases. Renewal can be tied
 *   to progress (`renewUntil`): past the deadline the renewer drains and stops.
 * - `Worker` claims tasks of pgfence's queue under an Owner, runs a handler under a deadline
 *   (`handlerTimeout`), reports results by attempt id, drains and releases when it leaves,
 *   also when the runtime shuts it down (SIGTERM, Edge Runtime's `beforeunload`).
 *
 * Safety never rests on this module: the database refuses a stale owner whatever the client
 * believes (I1-I5). The client's job is liveness and good manners: stop claiming as soon as
 * ownership is in doubt, so that a stale isolate does as little unfenced work as possible, and
 * survive lost connections without doing anything twice (docs/deno.md, "Faults and retries"):
 * a statement that lost its connection is sent again only where a second copy cannot change the
 * outcome, and after any lost connection the lease is trusted again only once a renewal passes.
 *
 * Every call is one statement, or one `sql.begin` transaction, with no session state: it works
 * through PgBouncer or Supavisor in transaction pooling mode. Statements are prepared only where
 * the connection reaches the server itself (`connect`'s `prepare`, detected by default).
 *
 * @module
 */
import postgres from "postgres";
import type { Options, PendingQuery as PendingQueryOf } from "postgres";

/** A postgres.js client (a pool); see `connect`. */
export type Sql = postgres.Sql;
/** The transaction of `sql.begin`: `fence` and the writes it protects must share one. */
export type TransactionSql = postgres.TransactionSql;
/**
 * postgres.js's options of a client (`connect`), but `prepare`: `"detect"` (the default) prepares
 * statements once the server has said that the connection reaches it directly (`prepares`),
 * `false` never, `true` always (a pooler that keeps prepared statements itself).
 */
export type ConnectOptions = Omit<Options<Record<string, never>>, "prepare"> & {
  prepare?: boolean | "detect";
};
/** A row of a result. */
export type Row = postgres.Row;
/** A statement built on a pool and not sent yet (postgres.js sends it when awaited). */
export type PendingQuery = PendingQueryOf<Row[]>;
/** Seconds on a monotonic clock. */
export type Clock = () => number;

/** The default clock: monotonic, unlike Date.now(), so a wall-clock jump moves no deadline. */
export const monotonic: Clock = (): number => performance.now() / 1000;

/**
 * A postgres.js client that keeps no session state a transaction pooler could lose. Prepared
 * statements (`options.prepare`) save postgres.js a round trip per statement (without them it
 * sends each statement with parameters twice: to learn their types, then to run it), but live
 * in one server session, and behind a transaction pooler the next statement may run in another,
 * where it is missing: `"detect"` (the default) prepares none until the pool is found direct
 * (`prepares`, which the Owner asks before its first acquire), `false` none, `true` every one.
 * The other `options` are postgres.js's.
 *
 * An empty or missing `url` is refused (TypeError): postgres.js would take it for
 * localhost:5432 and connect to whatever listens there, typically because `DATABASE_URL` was
 * not set.
 */
export function connect(url: string, options: ConnectOptions = {}): Sql {
  if (typeof url !== "string" || url.trim() === "") {
    const got = typeof url === "string" ? "an empty one" : `${url}`;
    throw new TypeError(
      `pgfence: connect() needs a database URL, got ${got} (is DATABASE_URL set?); ` +
        "postgres.js would connect to localhost:5432 instead",
    );
  }
  const { prepare = "detect", ...rest } = options;
  const sql = postgres(url, { ...rest, prepare: prepare === true });
  preparing.set(sql.options, prepare);
  return sql;
}

/** The pools `connect` made, by their options: whether they prepare statements, or `"detect"`
 * until `prepares` has asked (then its answer, on its way). */
const preparing = new WeakMap<object, boolean | "detect" | Promise<boolean>>();

/**
 * Whether `sql` prepares its statements. A pool `connect` made with `prepare: "detect"` asks the
 * server once where the connection ends, and prepares from then on if it reaches the server
 * directly (`direct`); a refusal (a role that may not read the socket directories) is a no,
 * a lost connection no answer: asked again next time. A pool of another making: its `prepare`.
 */
export async function prepares(sql: Sql): Promise<boolean> {
  // postgres.js reads its options object at each statement it sends: the pool's own.
  const options = sql.options as { prepare: boolean };
  const mode = preparing.get(options);
  if (mode === undefined) return options.prepare;
  if (mode !== "detect") return await mode;
  const asked = direct(sql).then(
    (yes) => {
      options.prepare = yes;
      preparing.set(options, yes);
      return yes;
    },
    (e) => {
      preparing.set(options, e instanceof postgres.PostgresError ? false : "detect");
      return false;
    },
  );
  preparing.set(options, asked);
  return await asked;
}

/**
 * Whether the pool reaches the server itself, by what the server says of the connection's end
 * (as the Python client's `pgfence.connection.direct`): the address and port the pool connects
 * to, or a socket in one of the server's socket directories with the server's port. A pooler or
 * proxy in between (PgBouncer, Supavisor, a port mapping) is reached at another address or port
 * than the server's, so anything unsure (several hosts, a name that does not resolve, a socket
 * of the caller's making, a setting the role may not read) counts as not direct.
 */
async function direct(sql: Sql): Promise<boolean> {
  const { host, port, path, socket } = sql.options as unknown as {
    host: string[];
    port: number[];
    path?: string | false;
    socket?: unknown;
  };
  if (socket !== undefined || host.length !== 1) return false;
  const [end] = await sql`select host(inet_server_addr()) as addr, inet_server_port() as port,
                                 current_setting('port')::int as server_port,
                                 case when inet_server_addr() is null
                                      then current_setting('unix_socket_directories') end as dirs`;
  if (end.server_port !== port[0]) return false;
  if (path) {
    const dir = String(path).replace(/\/[^/]*$/, "");
    return end.addr === null && String(end.dirs).split(",").some((d) => d.trim() === dir);
  }
  if (end.addr === null || end.port !== port[0]) return false;
  const server = address(end.addr as string);
  return (await addresses(host[0])).some((a) => address(a) === server && server !== null);
}

/** The addresses a host name stands for: itself if it is one, loopback's for localhost, else
 * what DNS answers (none where Deno may not ask). */
async function addresses(host: string): Promise<string[]> {
  const name = host.replace(/^\[|\]$/g, "");
  if (address(name) !== null) return [name];
  if (name === "localhost") return ["127.0.0.1", "::1"];
  const found: string[] = [];
  for (const kind of ["A", "AAAA"] as const) {
    // (A runtime without Deno.resolveDns, or without the permission: no answer.)
    found.push(...await Promise.resolve().then(() => Deno.resolveDns(name, kind)).catch(() => []));
  }
  return found;
}

/** An IPv4 or IPv6 address as eight hexadecimal groups (IPv4 as IPv4-mapped IPv6), so that two
 * spellings of one address compare equal; null for anything else. */
function address(text: string): string | null {
  let s = text.toLowerCase();
  if (/^[\d.]+$/.test(s)) s = `::ffff:${s}`;
  const quad = /^(.*:)(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  if (quad) {
    const b = quad.slice(2).map(Number);
    if (b.some((x) => x > 255)) return null;
    s = `${quad[1]}${(b[0] << 8 | b[1]).toString(16)}:${(b[2] << 8 | b[3]).toString(16)}`;
  }
  const halves = s.split("::").map((h) => h === "" ? [] : h.split(":"));
  if (halves.length > 2) return null;
  const [head, tail] = halves;
  const zeros = 8 - head.length - (tail?.length ?? 0);
  if (tail !== undefined && zeros < 0) return null;
  const groups = tail === undefined ? head : [...head, ...Array(zeros).fill("0"), ...tail];
  if (groups.length !== 8 || !groups.every((g) => /^[0-9a-f]{1,4}$/.test(g))) return null;
  return groups.map((g) => parseInt(g, 16).toString(16)).join(":");
}

// --- errors -------------------------------------------------------------------------------

/** A lease id, attempt id or update token in a text: a capability, never shown. */
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi;

/** `text` with every uuid in it replaced by `…` (as the Python client does). */
function redact(text: string): string;
function redact(text: string | undefined): string | undefined;
function redact(text: string | undefined): string | undefined {
  return text?.replace(UUID, "…");
}

/**
 * A database error with one of the SQLSTATEs of docs/errors.md, by its subclass. Its message,
 * hint and detail are the database's with every uuid (a lease id, attempt id or update token:
 * capabilities) replaced by `…`, so that the error can be logged as it is; the original
 * postgres.js error is not kept, for the same reason.
 */
export class PgfenceError extends Error {
  /** The SQLSTATE, e.g. `PF001`. */
  readonly sqlstate: string;
  /** What to do about it, when the database said. */
  readonly hint: string | undefined;
  /** The database's DETAIL (the refused value, the holder of a lock), when it gave one. */
  readonly detail: string | undefined;

  /** The error of `sqlstate`; `message`, `hint` and `detail` are redacted. */
  constructor(sqlstate: string, message: string, hint?: string, detail?: string) {
    super(redact(message));
    this.name = new.target.name;
    this.sqlstate = sqlstate;
    this.hint = redact(hint);
    this.detail = redact(detail);
  }

  /**
   * Whether the same call may pass when tried again, after a pause (40001, 40P01, 55P03): the
   * client retries them itself (`RetryOptions.conflicts`); other errors are not guessed at.
   */
  get retryable(): boolean {
    return RETRYABLE.has(this.sqlstate);
  }
}

/** PF001: the lease is unknown, released, superseded, draining (for fence) or expired. */
export class LeaseNotCurrent extends PgfenceError {}
/** PF002: the resource is unknown. */
export class ResourceUnknown extends PgfenceError {}
/** PF003: the resource is disabled: a worker started for a paused resource exits cleanly. */
export class ResourceDisabled extends PgfenceError {}
/** PF004: the resource is already in another open update window (or a request id was reused). */
export class UpdateConflict extends PgfenceError {}
/** PF005: the update token is unknown. */
export class UpdateTokenUnknown extends PgfenceError {}
/** PF007: a write to a protected table in a transaction that did not fence its resource. */
export class UnfencedWrite extends PgfenceError {}
/** 22023: an invalid argument; the message names it. */
export class InvalidArgument extends PgfenceError {}
/** 25P01: an install or upgrade file was run outside a transaction block; nothing changed. */
export class NoTransaction extends PgfenceError {}
/** 40001: a serialization failure; the transaction rolled back and may be run again. */
export class SerializationFailure extends PgfenceError {}
/** 40P01: a deadlock; this transaction was chosen to roll back and may be run again. */
export class DeadlockDetected extends PgfenceError {}
/** 42501: the caller's role may not do this with pgmq or pgflow itself (a layer never widens
 * their grants); the message names the role and the object. */
export class InsufficientPrivilege extends PgfenceError {}
/** 54000: a superseded attempt sent more than 10 different stale results: stop reporting. */
export class TooManyStaleResults extends PgfenceError {}
/** 55000: an install or upgrade found another release, or a prerequisite missing. */
export class WrongInstalledState extends PgfenceError {}
/** 55P03: a resource row stayed locked past `lock_timeout`; DETAIL names the holder. */
export class LockNotAvailable extends PgfenceError {}

/**
 * The error class of each SQLSTATE that docs/errors.md lists (a test checks that every code
 * there is here).
 */
export const errorClasses: Readonly<Record<string, typeof PgfenceError>> = Object.freeze({
  PF001: LeaseNotCurrent,
  PF002: ResourceUnknown,
  PF003: ResourceDisabled,
  PF004: UpdateConflict,
  PF005: UpdateTokenUnknown,
  PF007: UnfencedWrite,
  "22023": InvalidArgument,
  "25P01": NoTransaction,
  "40001": SerializationFailure,
  "40P01": DeadlockDetected,
  "42501": InsufficientPrivilege,
  "54000": TooManyStaleResults,
  "55000": WrongInstalledState,
  "55P03": LockNotAvailable,
});

const RETRYABLE = new Set(["40001", "40P01", "55P03"]);
/**
 * Retried by the client itself: the transaction rolled back, nothing of it happened. 55P03: a
 * row another session held past pgfence's bounded wait (a layer's result waits for its run or
 * its message at most 5 s, and the holder's idle time is bounded too: a later try gets through).
 */
const CONFLICTS = RETRYABLE;

/**
 * The connection broke (or could not be made) before the answer came: the statement may or
 * may not have run. The client sends a statement again only where a second copy cannot change
 * the outcome (docs/deno.md); this error reaches the caller when it does not, or gives up.
 */
export class ConnectionLost extends Error {
  /** postgres.js's or the socket's error code (`CONNECTION_CLOSED`, `ECONNRESET`, ...), or the
   * SQLSTATE of a server that ended the session (`57P01`, class `08`). */
  readonly code: string | undefined;

  /** A lost connection; `code` as above. */
  constructor(message: string, code?: string) {
    super(redact(message));
    this.name = "ConnectionLost";
    this.code = code;
  }
}

/** What postgres.js (and the sockets under it) report when a connection breaks or is refused.
 * CONNECTION_ENDED and CONNECTION_DESTROYED are not among them: the pool was ended. */
const LOST_CODES = new Set([
  "CONNECTION_CLOSED",
  "CONNECT_TIMEOUT",
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "ENETUNREACH",
  "ENETDOWN",
  "ENOTCONN",
  "EAI_AGAIN",
  "ERR_SOCKET_CLOSED",
]);

/** The server ended the session: terminated (57P01, a crash 57P02), not accepting connections
 * yet (57P03), or a connection exception (class 08, also PgBouncer's own errors). */
function lostSqlstate(code: string): boolean {
  return code.startsWith("08") || code === "57P01" || code === "57P02" || code === "57P03";
}

/**
 * The typed error of a database error: a `PgfenceError` subclass for the SQLSTATEs of
 * docs/errors.md, `ConnectionLost` for a lost connection; any other error as it is. For the
 * caller's own queries too (`await sql\`...\`.catch((e) => { throw pgfenceError(e); })`).
 */
export function pgfenceError(e: unknown): unknown {
  if (e instanceof PgfenceError || e instanceof ConnectionLost) return e;
  if (e instanceof postgres.PostgresError) {
    if (lostSqlstate(e.code)) return new ConnectionLost(e.message, e.code);
    const cls = errorClasses[e.code];
    if (cls !== undefined) return new cls(e.code, e.message, e.hint, e.detail);
    return e;
  }
  const code = (e as { code?: unknown } | null)?.code;
  if (e instanceof Error && typeof code === "string" && LOST_CODES.has(code)) {
    return new ConnectionLost(e.message, code);
  }
  return e;
}

/** Ownership is lost or in doubt (a client-side verdict): stop claiming and writing at once. */
export class LeaseLost extends Error {
  /** `message` says why; `options.cause` the refusal, if any. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "LeaseLost";
  }
}

// --- retries --------------------------------------------------------------------------------

/**
 * How the client waits before sending again: capped exponential backoff with full jitter (the
 * n-th wait is uniform in [0, min(cap, base * 2^n)]), in real time.
 */
export interface RetryOptions {
  /** Seconds: the first wait's ceiling (default 0.1). */
  base?: number;
  /** Seconds: the largest ceiling (default 10). */
  cap?: number;
  /** Tries of a statement (or a `fenced` transaction) refused with 40001, 40P01 or 55P03 before
   * the error is thrown (default 5). */
  conflicts?: number;
  /** Seconds (real time) one call is sent again at most, whatever its own bound (default 60):
   * then its error is thrown. */
  giveUp?: number;
  /** The jitter's source, in [0, 1) (default Math.random). */
  random?: () => number;
}

/**
 * A statement of the client's cycle, as `Owner.query` names it to `Owner.beforeStep` (where
 * the fault tests stop the client and break its connection).
 */
export type Step =
  | "acquire"
  | "renew"
  | "claim"
  | "extend"
  | "complete"
  | "complete_many"
  | "fail"
  | "requeue"
  | "drain"
  | "release";

/** How `Owner.query` treats a lost connection; 40001, 40P01 and 55P03 are always retried. */
export interface QueryOptions {
  /**
   * Send the statement again after a lost connection, with backoff, until it is answered, the
   * owner's clock passes `until`, `signal` aborts, or `retry.giveUp` seconds have passed (then
   * ConnectionLost is thrown). Only for statements whose second copy cannot change the
   * outcome. Default false: a lost connection throws ConnectionLost at once.
   */
  resend?: boolean;
  /** On the owner's clock: resend no more after this. */
  until?: number;
  /** Aborting it stops resending. */
  signal?: AbortSignal;
}

/** Waits `seconds` of real time, or less if `signal` aborts. */
function pause(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, seconds * 1000);
    signal?.addEventListener("abort", done);
  });
}

/** Per pool (its options object), what to call when one of its connections closes. */
const closeWatchers = new WeakMap<object, Set<() => void>>();

/**
 * Calls `fn` whenever a connection of `sql` closes, broken or ended (postgres.js then opens a
 * new one for the next query, silently); returns the function that stops it. postgres.js reads
 * its `onclose` option when a connection closes, so wrapping it once per pool is enough.
 */
function watchCloses(sql: Sql, fn: () => void): () => void {
  const options = sql.options;
  let watchers = closeWatchers.get(options);
  if (watchers === undefined) {
    const all = watchers = new Set();
    closeWatchers.set(options, all);
    const previous = options.onclose;
    options.onclose = (id: number) => {
      previous?.(id);
      for (const watcher of [...all]) watcher();
    };
  }
  watchers.add(fn);
  return () => watchers.delete(fn);
}

// --- Owner --------------------------------------------------------------------------------

/** The settings of an `Owner`. */
export interface OwnerOptions {
  /** A client made by `connect` (or a postgres.js client with `prepare: false`); the Owner
   * never ends it. */
  sql: Sql;
  /** The resource to hold. */
  resource: string;
  /** The owner's name, e.g. an execution id; default `owner-` and 8 random hex digits. */
  owner?: string;
  /** The lease's time to live, in seconds (default 30). */
  ttl?: number;
  /** Seconds between renewals (default ttl / 3), in real time. */
  renewEvery?: number;
  /** The clock of the local deadlines (default `monotonic`); tests pass a fake one. */
  clock?: Clock;
  /** The backoff of retries (see `RetryOptions`). */
  retry?: RetryOptions;
}

/**
 * One owner's hold on one resource.
 *
 * `valid` turns false when a renewal is refused, when a fence is refused, or when the local
 * deadline passes: the last successful renewal's *send* time plus the ttl. Measuring from the
 * send keeps a slow success from stretching the lease: the database started the new term no
 * earlier than the request left. It also turns false when a progress deadline set with
 * `renewUntil` passes, and while the lease is in doubt: from any lost connection (a statement's,
 * or any connection of the pool closing, after which postgres.js reconnects silently) until a
 * renewal sent after it succeeds (the renewer sends one at once, then backs off). `signal`
 * aborts when the owner gives the lease up or learns it is lost, so a handler can pass it to
 * fetch() and stop its own work.
 */
export class Owner {
  /** The pool every statement runs on. */
  readonly sql: Sql;
  /** The resource held. */
  readonly resource: string;
  /** This owner's name. */
  readonly owner: string;
  /** The lease's time to live, in seconds; also how long a statement may go unanswered
   * before its connection counts as lost (at least a second). */
  readonly ttl: number;
  /** Seconds between renewals. */
  readonly renewEvery: number;
  /** The clock of the local deadlines. */
  readonly clock: Clock;
  /** The backoff of retries, defaults filled in. */
  readonly retry: Readonly<Required<RetryOptions>>;
  /** The current lease's id (a capability: never log it); null before `acquire`. */
  leaseId: string | null = null;
  /** The current lease's generation (its fencing token); null before `acquire`. */
  generation: bigint | null = null;
  /** The local deadline on `clock`; protected so that a test's broken variant can set it. */
  protected validUntil = 0;
  #lost: string | null = null;
  #abort = new AbortController();
  #progress: { deadline: number; why: string } | null = null;
  #renewer: Promise<void> | null = null;
  #stopped = true;
  #wake: (() => void) | null = null;
  /** When the renewer's sleep ends by itself, on `clock`; Infinity while it is not asleep. */
  #wakesAt = Infinity;
  /** Lost connections seen: a renewal restores trust only if none was lost since it was sent. */
  #losses = 0;
  #doubt = false;
  #waiters = new Set<() => void>();
  #unwatch: (() => void) | null = null;

  /** An owner of `options.resource`; nothing is sent before `acquire`. */
  constructor(options: OwnerOptions) {
    // Named prepared statements live in one server session: behind a transaction pooler the
    // next statement may run in another, and fail. postgres.js prepares by default; connect()'s
    // pools only where they were told to, or found the connection direct.
    if (options.sql.options.prepare && !preparing.has(options.sql.options)) {
      throw new TypeError(
        "pgfence: the Owner needs a client made by connect(), or a postgres.js client with " +
          "prepare: false",
      );
    }
    this.sql = options.sql;
    this.resource = options.resource;
    this.owner = options.owner ?? `owner-${crypto.randomUUID().slice(0, 8)}`;
    this.ttl = options.ttl ?? 30;
    this.renewEvery = options.renewEvery ?? this.ttl / 3;
    this.clock = options.clock ?? monotonic;
    this.retry = Object.freeze({
      base: options.retry?.base ?? 0.1,
      cap: options.retry?.cap ?? 10,
      conflicts: options.retry?.conflicts ?? 5,
      giveUp: options.retry?.giveUp ?? 60,
      random: options.retry?.random ?? Math.random,
    });
  }

  /** Why the lease is no longer trusted (refused, released, a deadline), or null. */
  get lost(): string | null {
    return this.#lost;
  }

  /** Aborts when the lease is given up or found lost; a new one with each `acquire`. */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  /** The local deadline, on `clock`: past it, this owner trusts its lease no longer. */
  get deadline(): number {
    return this.validUntil;
  }

  /** True while a lost connection keeps the lease in doubt (until a renewal passes). */
  get inDoubt(): boolean {
    return this.#doubt;
  }

  /** Whether the lease may be used: held, not lost, not in doubt, before the local deadline. */
  get valid(): boolean {
    return this.leaseId !== null && this.#lost === null && !this.#doubt &&
      this.clock() < this.validUntil;
  }

  /** The lease as logs may name it: resource and generation, never the lease id. */
  get name(): string {
    return `${this.resource} generation ${this.generation ?? "none"}`;
  }

  /** Throws LeaseLost unless `valid`. */
  check(): void {
    if (this.valid) return;
    if (this.#lost !== null) throw new LeaseLost(this.#lost);
    if (this.leaseId === null) throw new LeaseLost(`no lease on ${this.resource}`);
    if (this.#doubt) {
      throw new LeaseLost(`lease ${this.name} in doubt after a lost connection (see trust())`);
    }
    throw new LeaseLost(`lease ${this.name} expired locally`);
  }

  /** Stops trusting the lease (the first reason is kept) and aborts `signal`. */
  markLost(why: string): void {
    if (this.#lost !== null) return;
    this.#lost = why;
    this.#abort.abort(new LeaseLost(why));
    this.#notify();
  }

  /**
   * Resolves true as soon as the lease is `valid` again (a renewal passed after a lost
   * connection), false once it is lost, released, past the local deadline (judged at each of
   * the renewer's tries: it tries again at least every `retry.cap` seconds), or `signal`
   * aborts. The renewer does the renewing; this only waits for its verdict.
   */
  trust(signal?: AbortSignal): Promise<boolean> {
    const gone = () =>
      this.#lost !== null || this.#stopped || signal?.aborted === true ||
      this.clock() >= this.validUntil;
    if (this.valid) return Promise.resolve(true);
    if (gone()) return Promise.resolve(false);
    return new Promise((resolve) => {
      const check = () => {
        const verdict = this.valid ? true : gone() ? false : null;
        if (verdict === null) return;
        this.#waiters.delete(check);
        signal?.removeEventListener("abort", check);
        resolve(verdict);
      };
      this.#waiters.add(check);
      signal?.addEventListener("abort", check);
    });
  }

  #notify(): void {
    for (const waiter of [...this.#waiters]) waiter();
  }

  /**
   * Called before each try of each statement `query` sends (a no-op): the fault tests stop the
   * client here and break its connection.
   */
  protected beforeStep(_step: Step): Promise<void> | void {}

  /**
   * One statement with the retry story: `make` builds it on the owner's pool, again for each
   * try. 40001, 40P01 and 55P03 are tried again after a backoff (up to `retry.conflicts` tries); a lost
   * connection puts the lease in doubt (`inDoubt`) and is sent again only as `options` say.
   * A statement unanswered for a whole `ttl` counts as a lost connection. Errors come back
   * typed (`pgfenceError`). For workers built on the Owner (pgmq, pgflow) as well.
   */
  async query(
    step: Step | readonly Step[],
    make: (sql: Sql) => PendingQuery | Promise<Row[]>,
    options: QueryOptions = {},
  ): Promise<Row[]> {
    let conflicts = 0;
    let losses = 0;
    const giveUp = monotonic() + this.retry.giveUp;
    for (;;) {
      for (const s of typeof step === "string" ? [step] : step) await this.beforeStep(s);
      try {
        return await this.#answer(make(this.sql));
      } catch (e) {
        const error = pgfenceError(e);
        if (error instanceof ConnectionLost) {
          this.connectionLost();
          const gaveUp = () =>
            options.signal?.aborted || monotonic() >= giveUp ||
            (options.until !== undefined && this.clock() >= options.until);
          if (!options.resend || gaveUp()) throw error;
          await pause(this.backoff(losses++), options.signal);
          if (gaveUp()) throw error;
          continue;
        }
        if (
          error instanceof PgfenceError && CONFLICTS.has(error.sqlstate) &&
          ++conflicts < this.retry.conflicts && monotonic() < giveUp
        ) {
          await pause(this.backoff(conflicts - 1));
          continue;
        }
        throw error;
      }
    }
  }

  /**
   * Seconds to wait before the retry after `failures` failed tries: full jitter, at least a
   * millisecond (postgres.js must see the broken socket close before anything is sent again).
   */
  protected backoff(failures: number): number {
    const ceiling = Math.min(this.retry.cap, this.retry.base * 2 ** failures);
    return Math.max(0.001, this.retry.random() * ceiling);
  }

  /** The statement's answer, or ConnectionLost when none came within a ttl (postgres.js can
   * leave a query unanswered forever when its connection broke as it was sent). */
  async #answer(pending: PendingQuery | Promise<Row[]>): Promise<Row[]> {
    // A ttl the database will refuse (22023) still gets its answer.
    const seconds = this.ttl > 0 && Number.isFinite(this.ttl) ? Math.max(1, this.ttl) : 30;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const watchdog = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new ConnectionLost(`no answer within ${seconds} s`, "TIMEOUT")),
        seconds * 1000,
      );
    });
    try {
      return await Promise.race([pending, watchdog]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * A connection broke or closed: the lease is in doubt until a renewal sent after this passes,
   * and the renewer sends one at once. Protected so that a test's broken variant can skip it.
   */
  protected connectionLost(): void {
    this.#losses += 1;
    if (this.leaseId === null || this.#lost !== null) return;
    this.#doubt = true;
    this.#wake?.(); // the renewer renews at once
  }

  /**
   * Takes the lease if nobody holds it and starts the renewer; false while another owns it.
   * Throws ResourceDisabled (PF003) for a paused resource (exit cleanly) and ResourceUnknown
   * (PF002). One lease per Owner at a time: `release` the last one first.
   *
   * A lost connection is retried (for at most `retry.giveUp` seconds), then ConnectionLost is
   * thrown. When the lost answer had granted a lease, the retry is told another is current
   * (false): that lease, unknown to anyone, expires unused within its ttl.
   */
  async acquire(invocationId: string | null = null): Promise<boolean> {
    if (this.#renewer !== null) {
      throw new Error("pgfence: this Owner holds a lease; release it first");
    }
    await prepares(this.sql); // whether the pool may prepare statements, asked once
    this.#losses = 0;
    this.#doubt = false;
    let sent = this.clock();
    const [row] = await this.query("acquire", (sql) => {
      sent = this.clock();
      return sql`select lease_id, generation from pgfence.acquire(${this.resource}, ${this.owner},
                   make_interval(secs => ${this.ttl}), ${invocationId}::uuid)`;
    }, { resend: true });
    if (!row || row.lease_id === null) return false;
    this.leaseId = row.lease_id as string;
    this.generation = BigInt(row.generation as string);
    this.#lost = null;
    this.#doubt = false;
    this.#abort = new AbortController();
    this.validUntil = sent + this.ttl;
    this.#progress = null;
    this.#stopped = false;
    this.#unwatch = watchCloses(this.sql, () => this.connectionLost());
    this.#renewer = this.#renewLoop();
    return true;
  }

  /** Sends one renewal and returns the state it answered (active or draining). */
  protected async sendRenew(): Promise<string> {
    const [row] = await this.query(
      "renew",
      (sql) =>
        sql`select state
              from pgfence.renew(${this.leaseId}::uuid, make_interval(secs => ${this.ttl}))`,
    );
    return row ? String(row.state) : "active";
  }

  /**
   * One renewal, one try; the new local deadline counts from when it was sent. A success ends
   * the doubt of a lost connection if no connection was lost since it was sent.
   */
  async renewOnce(): Promise<string> {
    const sent = this.clock();
    const losses = this.#losses;
    let state: string;
    try {
      state = await this.sendRenew();
    } catch (e) {
      if (e instanceof LeaseNotCurrent) {
        this.markLost(`renewal of ${this.name} refused: ${e.message}`);
      }
      throw e;
    }
    this.validUntil = Math.max(this.validUntil, sent + this.ttl);
    if (this.#losses === losses) this.#doubt = false;
    this.#notify();
    return state;
  }

  /**
   * Ties renewal to progress: the renewer renews only until `deadline` (on `clock`); null lifts
   * the limit. If the deadline passes first, the renewer stops for good, drains the lease so
   * that a successor is admitted at once, and marks it lost (`why`): whoever set the deadline
   * is not making progress, and must not keep the resource by proxy. Nothing is cancelled but
   * `signal`: the late holder runs on, its fences are refused, and the database judges what it
   * reports (I5).
   */
  renewUntil(deadline: number | null, why = "a progress deadline"): void {
    this.#progress = deadline === null ? null : { deadline, why };
    // The renewer is woken only when it would otherwise sleep past the deadline (a handler's
    // deadline is set and lifted around every handler). A lifted one needs no wake-up: woken at
    // it, the renewer finds it gone. A clock moved past the renewer's wake-up (a test's) wakes it.
    const wakesAt = this.#wakesAt;
    if (deadline !== null && (deadline < wakesAt || this.clock() >= wakesAt)) this.#wake?.();
  }

  async #renewLoop(): Promise<void> {
    // The renewal cadence is real time; a progress deadline is judged on `clock`. After a
    // failure, or a lost connection anywhere, it renews with backoff instead of the cadence.
    let next = monotonic() + this.renewEvery;
    let failures = 0;
    while (!this.#stopped) {
      const progress = this.#progress;
      const due = this.#doubt && failures === 0 ? monotonic() : next;
      let wait = due - monotonic();
      if (progress !== null) wait = Math.min(wait, progress.deadline - this.clock());
      if (wait > 0) {
        await this.#sleep(wait); // then read the state again: a wake-up changes it
        continue;
      }
      if (progress !== null && this.clock() >= progress.deadline) {
        // Checked before every renewal: none is sent for a holder past its deadline.
        await this.#abandon(progress.why);
        break;
      }
      try {
        await this.renewOnce();
        failures = 0;
        next = monotonic() + this.renewEvery;
      } catch {
        // A transient failure only costs time: the local deadline decides (those waiting for
        // trust give up once it has passed). A refusal (PF001) has marked the lease lost and
        // ends the loop.
        if (this.#lost !== null) break;
        next = monotonic() + this.backoff(failures++);
        this.#notify();
      }
    }
  }

  #sleep(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer); // a woken sleep leaves no timer behind (Deno's test sanitizer)
        this.#wake = null;
        this.#wakesAt = Infinity;
        resolve();
      };
      const timer = setTimeout(done, seconds * 1000);
      this.#wake = done;
      this.#wakesAt = this.clock() + seconds;
    });
  }

  /**
   * Past a progress deadline: stop trusting the lease, and drain it (not release: the holder
   * may still hold tasks, and monitoring should show a draining lease, not an ended one). If
   * the drain fails, the unrenewed lease expires within its ttl anyway.
   */
  async #abandon(why: string): Promise<void> {
    this.markLost(`renewal of ${this.name} stopped: ${why}`);
    try {
      await this.#end("drain");
    } catch {
      // see above: expiry covers it
    }
  }

  /** drain or release, resent after a lost connection until the local deadline (then the
   * lease expires by itself); an ended lease is no error. */
  async #end(step: "drain" | "release"): Promise<void> {
    try {
      await this.query(
        step,
        (sql) =>
          step === "drain"
            ? sql`select pgfence.drain(${this.leaseId}::uuid)`
            : sql`select pgfence.release(${this.leaseId}::uuid)`,
        { resend: true, until: this.validUntil },
      );
    } catch (e) {
      if (!(e instanceof LeaseNotCurrent)) throw e;
    }
  }

  /**
   * The guard inside the caller's own transaction (`sql.begin`), before the writes it protects;
   * returns the lease's generation, to stamp on rows. Throws LeaseLost, and stops trusting the
   * lease, when the database refuses it (PF001), and ConnectionLost (the lease in doubt) when
   * the connection broke. A pgflow or pgmq worker fences its own transactions with it.
   */
  async fence(tx: TransactionSql): Promise<bigint> {
    this.check();
    try {
      const [row] = await tx`select pgfence.fence(${this.leaseId}::uuid) as generation`;
      return BigInt(row.generation as string);
    } catch (e) {
      throw this.#refused(e);
    }
  }

  /**
   * A transaction that is the owner's only if fence() passes in it (I2): `fn` gets it and the
   * generation to stamp on rows; `fn`'s result. A transaction refused with 40001 or 40P01 rolled
   * back and is run again, `fn` included (up to `retry.conflicts` tries). A lost connection is
   * not: whether it committed is unknown, so ConnectionLost is thrown (make its writes
   * idempotent, e.g. keyed by a task id, and check).
   */
  async fenced<T>(fn: (tx: TransactionSql, generation: bigint) => Promise<T>): Promise<T> {
    for (let tries = 1;; tries++) {
      this.check();
      let result: T | undefined;
      try {
        await this.sql.begin(async (tx) => {
          result = await fn(tx, await this.fence(tx));
        });
        return result as T;
      } catch (e) {
        const error = this.#refused(e);
        if (
          error instanceof PgfenceError && CONFLICTS.has(error.sqlstate) &&
          tries < this.retry.conflicts
        ) {
          await pause(this.backoff(tries - 1));
          continue;
        }
        throw error;
      }
    }
  }

  #refused(e: unknown): unknown {
    if (e instanceof LeaseLost || e instanceof ConnectionLost) return e; // judged already
    const error = pgfenceError(e);
    if (error instanceof LeaseNotCurrent || error instanceof UnfencedWrite) {
      this.markLost(`fence of ${this.name} refused: ${error.message}`);
      return new LeaseLost(this.#lost ?? error.message, { cause: error });
    }
    if (error instanceof ConnectionLost) this.connectionLost();
    return error;
  }

  /** Stops claiming; the resource is free for a successor at once. */
  async drain(): Promise<void> {
    if (this.leaseId !== null && this.#lost === null) await this.#end("drain");
  }

  /**
   * Stops the renewer, then gives the lease up (a lease already ended is no error). A lost
   * connection is retried until the local deadline; past it, the lease expires by itself and
   * nothing is thrown.
   */
  async release(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#renewer;
    this.#renewer = null;
    try {
      if (this.leaseId !== null) await this.#end("release");
    } catch (e) {
      if (!(e instanceof ConnectionLost) || this.clock() < this.validUntil) throw e;
    } finally {
      this.#unwatch?.();
      this.#unwatch = null;
      this.markLost("released");
    }
  }
}

// --- platforms ------------------------------------------------------------------------------

/**
 * Where a worker runs: how the runtime tells it to stop, and how it is kept alive until its
 * lease is released. One adapter per place (`edgeRuntime`, `processRuntime`); `runtime()` picks
 * the one the program runs in. A worker's loop is the same in all of them.
 */
export interface Platform {
  /** The adapter's name: `edge-runtime` or `process`. */
  readonly name: string;
  /**
   * Calls `stop(reason)` when the runtime is about to end the program; returns a function that
   * removes the listeners.
   */
  onShutdown(stop: (reason: string) => void): () => void;
  /** Keeps the program alive until `work` settles (the Edge Runtime's `waitUntil`). */
  keepAlive(work: Promise<unknown>): void;
}

/** The Edge Runtime's global, where there is one (Supabase Edge Functions). */
interface EdgeRuntimeGlobal {
  waitUntil(promise: Promise<unknown>): void;
}

function edgeRuntimeGlobal(): EdgeRuntimeGlobal | undefined {
  const runtime = (globalThis as { EdgeRuntime?: Partial<EdgeRuntimeGlobal> }).EdgeRuntime;
  return typeof runtime?.waitUntil === "function" ? runtime as EdgeRuntimeGlobal : undefined;
}

/**
 * The reason of the Edge Runtime's `beforeunload`: its `detail` is `{ reason }` where the
 * runtime dispatches it (supabase/edge-runtime, `ext/runtime/js/bootstrap.js`), and the reason
 * itself in the type Supabase's functions-js declares (`CustomEvent<BeforeunloadReason>`).
 */
function unloadReason(event: Event): string {
  const detail = (event as CustomEvent<unknown>).detail;
  const reason = typeof detail === "string"
    ? detail
    : (detail as { reason?: unknown } | null | undefined)?.reason;
  return typeof reason === "string" ? reason : "unknown";
}

/**
 * Supabase's Edge Runtime: it dispatches `beforeunload` on globalThis shortly before it ends an
 * isolate (`detail.reason`: `wall_clock`, `cpu`, `memory`, `early_drop`, `termination`), and
 * `EdgeRuntime.waitUntil(promise)` keeps the isolate alive until the promise settles. Signal
 * listeners are stubbed out there for user functions: `beforeunload` is the only signal.
 */
export const edgeRuntime: Platform = Object.freeze({
  name: "edge-runtime",
  onShutdown(stop: (reason: string) => void): () => void {
    const listener = (event: Event) => stop(`beforeunload: ${unloadReason(event)}`);
    globalThis.addEventListener("beforeunload", listener);
    return () => globalThis.removeEventListener("beforeunload", listener);
  },
  keepAlive(work: Promise<unknown>): void {
    edgeRuntimeGlobal()?.waitUntil(work.catch(() => {}));
  },
});

/**
 * A process (the Deno CLI under a process supervisor, Kubernetes, systemd): SIGTERM and SIGINT
 * stop the worker. While a listener is installed the signal no longer ends the program: the
 * worker's loop ends it, once its lease is released. A pending timer keeps a process alive.
 */
export const processRuntime: Platform = Object.freeze({
  name: "process",
  onShutdown(stop: (reason: string) => void): () => void {
    const removers: (() => void)[] = [];
    for (const signal of ["SIGTERM", "SIGINT"] as const) {
      const listener = () => stop(signal);
      try {
        Deno.addSignalListener(signal, listener);
        removers.push(() => Deno.removeSignalListener(signal, listener));
      } catch {
        // A runtime without signals (Windows has no SIGTERM): nothing to listen to.
      }
    }
    return () => removers.forEach((remove) => remove());
  },
  keepAlive(): void {},
});

/** The platform this program runs on: the Edge Runtime where its global is, else a process. */
export function runtime(): Platform {
  return edgeRuntimeGlobal() !== undefined ? edgeRuntime : processRuntime;
}

// --- the startup handshake over HTTP -----------------------------------------------------------

/** A JSON answer (`content-type: application/json`). */
export function jsonResponse(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body) + "\n", {
    status,
    headers: { "content-type": "application/json" },
  });
}

/** An invocation id of `pgfence.request_start`: a uuid. */
const INVOCATION_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The invocation id a start request carries (`{"invocation_id": "<uuid>"}`, the body a
 * supervisor sends with an id of `pgfence.request_start`; `pgfence_pgflow.ensure_workers`
 * sends it so), or the JSON answer that refuses the request before anything is acquired: 400
 * for a body that is not a JSON object or an id that is not a uuid, 409 for a request without
 * an id (a worker starts only through the handshake). No answer carries a stack. Whether the id
 * is the pending one, `Owner.acquire` tells (false, or 22023 for an id never issued: 409 too).
 */
export async function invocationOf(request: Request): Promise<string | Response> {
  let body: unknown;
  try {
    const text = await request.text();
    body = text.trim() === "" ? {} : JSON.parse(text);
  } catch {
    return jsonResponse(400, { error: "Bad Request", message: "the body is not JSON" });
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    return jsonResponse(400, { error: "Bad Request", message: "the body is not a JSON object" });
  }
  const id = (body as { invocation_id?: unknown }).invocation_id;
  if (id === undefined || id === null) {
    return jsonResponse(409, {
      started: false,
      message: "no invocation id: this worker starts only through the startup handshake " +
        "(pgfence.request_start)",
    });
  }
  if (typeof id !== "string" || !INVOCATION_ID.test(id)) {
    return jsonResponse(400, { error: "Bad Request", message: "invocation_id is not a uuid" });
  }
  return id;
}

// --- Worker -------------------------------------------------------------------------------

/** The database's answer to a complete or fail (I5). */
export type Verdict = "accepted" | "duplicate" | "stale";

/** What every worker's task has: the attempt it is reported with, and its visibility. */
export interface Attempt {
  /** This attempt's id (a capability: never log it). */
  attemptId: string;
  /** Until when the attempt holds the task, on the owner's clock: the local estimate,
   * counted from when the claim (or the last extend) was sent. */
  visibleUntil: number;
}

/** One claimed task: the attempt id is what its result is reported with. */
export interface Task extends Attempt {
  /** The task's id: the key for the handler's external effects (idempotency key). */
  taskId: bigint;
  /** The attempt number, from 1. */
  attempt: number;
  /** The task's payload (JSON). */
  payload: unknown;
}

/** What a handler gets beside the payload. */
export interface HandlerContext<T extends Attempt = Task> {
  /** The task, with its ids. */
  task: T;
  /** Aborts when the owner gives the lease up (a handler past its deadline, a refusal, a
   * shutdown whose grace ran out). */
  signal: AbortSignal;
  /** The handler's deadline on the owner's clock (`handlerTimeout` after it started;
   * Infinity without one). */
  deadline: number;
  /** Keeps the task for `visibility` more seconds; null when the attempt no longer holds it. */
  extend(visibility: number): Promise<Date | null>;
}

/** Returns the task's result (JSON); throws to fail it. */
export type Handler = (payload: unknown, context: HandlerContext) => unknown;

/** How a refused worker waits before it asks again: capped exponential backoff, full jitter. */
export interface RefusalBackoff {
  /** Seconds: the first wait's ceiling (default 1). */
  base?: number;
  /** Seconds: the largest ceiling (default 30). */
  cap?: number;
  /** The jitter's source, in [0, 1) (default Math.random). */
  random?: () => number;
}

/** What every worker is set with, whatever it works (`Worker`, `PgmqWorker`, `FlowWorker`). */
export interface LoopOptions {
  /** The Owner whose lease the tasks are claimed under. */
  owner: Owner;
  /** Tasks per claim (default 1). */
  qty?: number;
  /** Seconds a claimed task stays the attempt's for its handler (default 30); a `Worker`'s claim
   * holds its batch `qty` handlers' time (`Worker.hold`). */
  visibility?: number;
  /** Seconds to wait when the queue is empty (default 1). */
  idleWait?: number;
  /** Seconds a handler's result may wait for the rest of its batch's (default 1): results in
   * hand go in one statement when the batch's handlers are done, or before the next handler
   * starts once this has passed since the first of them began. */
  reportWithin?: number;
  /** Seconds (real time) the task in hand gets after a shutdown signal (`installShutdown`)
   * before it is handed back (default 5). */
  shutdownGrace?: number;
  /** The backoff after a refusal (`supervise`). */
  backoff?: RefusalBackoff;
}

/** The settings of a `Worker`. */
export interface WorkerOptions extends LoopOptions {
  /** The queue to work. */
  queue: string;
  /** The handler of every task. */
  handler: Handler;
  /** Seconds per handler call on the owner's clock (default: visibility); Infinity: none. */
  handlerTimeout?: number;
}

/** What `Worker.run` is asked to do. */
export interface RunOptions {
  /** Return after this many handler calls. */
  maxTasks?: number;
  /** Return when the queue has nothing to claim: the shape of an Edge Function invocation
   * that must not idle. */
  untilIdle?: boolean;
  /** On the owner's clock: claim nothing that could not finish by then (a task needs its
   * handler's deadline, `handlerTimeout`, or else `visibility`), e.g. the invocation's
   * wall-clock limit less a margin. */
  deadline?: number;
}

/** What `supervise` is asked to do. */
export interface SuperviseOptions {
  /** An invocation id of `pgfence.request_start` (the startup handshake): then the worker
   * acquires once, with it, and ends when that term ends. */
  invocationId?: string | null;
  /** Each term's `RunOptions` (`maxTasks` counts per term). */
  run?: RunOptions;
}

/**
 * Errors that no retry can mend: the resource does not exist (PF002), the role may not do this
 * (42501), an argument is invalid (22023), the install is not what the client needs (55000).
 * They end a supervised worker; anything else, a lost connection, an error inside the driver,
 * a refusal, only makes it wait and try again.
 */
const PERMANENT = new Set(["PF002", "42501", "22023", "55000"]);

/** Whether `e` ends a supervised worker (see `PERMANENT`). */
function permanent(e: unknown): boolean {
  return e instanceof PgfenceError && PERMANENT.has(e.sqlstate);
}

/**
 * The loop every worker runs, whatever it works: claim under the Owner's lease, check each
 * task's visibility against its handler's deadline (extend or skip), run the handler under
 * that deadline, report; drain and release when a term ends; across terms (`supervise`),
 * acquire again with refusal backoff; on a shutdown (`stop`, `installShutdown`), finish or hand
 * back the task in hand within a grace, then release. `Worker` works pgfence's queue with it,
 * `PgmqWorker` a pgmq queue, `FlowWorker` (pgflow.ts) a pgflow flow: each says only how it
 * claims, extends, reports and calls its handlers.
 *
 * Each handler call runs under a deadline (`handlerTimeout(task)` seconds on the owner's clock).
 * No handler starts unless its task's remaining visibility covers that deadline: the worker
 * extends the task first, and skips it when the extend finds the attempt superseded
 * (`skipped`). A handler still running at its deadline makes the owner stop renewing and drain
 * (`Owner.renewUntil`), and aborts `context.signal`: a hung promise cannot keep the lease alive
 * forever. The worker then starts no other handler; when the hung one returns, its result is
 * reported (accepted if nobody re-claimed the task, stale otherwise) and the term ends.
 *
 * A batch's results go in one statement where the protocol has one (`reportManyStatement`):
 * when the batch's handlers are done (with the next claim, in one statement, where the worker
 * has `claimWithResults`), or before the next handler starts once `reportWithin` has passed
 * since the first result in hand began; whatever ends the term, before the lease is given up. A failure is reported on its own, at once. `verdicts` counts the database's answers
 * to the reports.
 */
export abstract class WorkerLoop<T extends Attempt> {
  /** The owner of the lease. */
  readonly owner: Owner;
  /** Tasks per claim. */
  readonly qty: number;
  /** Seconds a claimed task stays the attempt's for its handler. */
  readonly visibility: number;
  /** Seconds to wait when the queue is empty. */
  readonly idleWait: number;
  /** Seconds a result may wait for the rest of its batch's. */
  readonly reportWithin: number;
  /** Seconds the task in hand gets after a shutdown signal. */
  readonly shutdownGrace: number;
  /** The backoff after a refusal. */
  readonly backoff: Readonly<Required<RefusalBackoff>>;
  /** Handler calls so far. */
  handled = 0;
  /** Claimed tasks not started because their attempt no longer held them. */
  skipped = 0;
  /** Tasks handed back at a shutdown: not finished within the grace, left to be reclaimed. */
  handedBack = 0;
  /** Refusals so far (`supervise`): acquires refused or not granted, and terms ended by one. */
  refusals = 0;
  /** Faults a supervised worker waited out: lost connections, errors inside the driver. */
  faults = 0;
  /** The last of them (its message, ids redacted), or null. */
  lastFault: string | null = null;
  /** The database's answers to the reports. */
  readonly verdicts: Record<Verdict, number> = { accepted: 0, duplicate: 0, stale: 0 };
  /** Why the worker was stopped (`stop`, `SIGTERM`, `beforeunload: wall_clock`, ...), or null. */
  stoppedBy: string | null = null;
  /** Resolves when `supervise` (started by a one-line `start`) ends. */
  done: Promise<void> = Promise.resolve();
  #stop = false;
  #stopping = new AbortController();
  #halt = new AbortController();
  #graceTimer: ReturnType<typeof setTimeout> | undefined;
  #running = false;
  #wake: (() => void) | null = null;
  /** When the last claim was sent, on the owner's clock. */
  #claimSent = 0;
  /** Results in hand, not reported yet; `started`: when the handler began. */
  #pending: { task: T; started: number; body: unknown }[] = [];

  /** A worker under `options.owner`; nothing runs before `run` or `supervise`. */
  constructor(options: LoopOptions) {
    this.owner = options.owner;
    this.qty = options.qty ?? 1;
    this.visibility = options.visibility ?? 30;
    this.idleWait = options.idleWait ?? 1;
    this.reportWithin = options.reportWithin ?? 1;
    this.shutdownGrace = options.shutdownGrace ?? 5;
    this.backoff = Object.freeze({
      base: options.backoff?.base ?? 1,
      cap: options.backoff?.cap ?? 30,
      random: options.backoff?.random ?? Math.random,
    });
  }

  /** Aborts when the worker is stopped (`stop`, a shutdown signal). */
  get stopping(): AbortSignal {
    return this.#stopping.signal;
  }

  /** Whether `stop` was called. */
  get stopped(): boolean {
    return this.#stop;
  }

  /** Seconds per handler call of `task`, on the owner's clock; Infinity: none. */
  abstract handlerTimeout(task: T): number;

  /** Seconds of visibility `task` must have left when its handler starts. */
  protected needed(task: T): number {
    const timeout = this.handlerTimeout(task);
    return Number.isFinite(timeout) ? timeout : this.granted(task);
  }

  /** Seconds of visibility a claim of `task` alone gives it (default: `visibility`): what its
   * handler needs left without a deadline. */
  protected granted(_task: T): number {
    return this.visibility;
  }

  /**
   * Drains: claim nothing more, start no other handler, finish the one in hand, release; a
   * supervised worker ends. With `grace` (seconds of real time), the task in hand is handed
   * back if it has not finished by then: not reported, left to return to the queue when its
   * visibility runs out, while the worker releases and returns. `reason` is kept in
   * `stoppedBy` (the first one).
   */
  stop(options: { grace?: number; reason?: string } = {}): void {
    this.stoppedBy ??= options.reason ?? "stop";
    this.#stop = true;
    this.#stopping.abort();
    this.#wake?.();
    const grace = options.grace ?? Infinity;
    if (this.#running && Number.isFinite(grace) && this.#graceTimer === undefined) {
      this.#graceTimer = setTimeout(() => this.#halt.abort(), Math.max(0, grace) * 1000);
    }
  }

  /**
   * The platform's shutdown signals stop the worker with `shutdownGrace` (see `stop`): the Edge
   * Runtime's `beforeunload` there, SIGTERM and SIGINT in a process (`Platform`). Returns a
   * function that removes the listeners.
   */
  installShutdown(platform: Platform = runtime()): () => void {
    return platform.onShutdown((reason) => this.stop({ grace: this.shutdownGrace, reason }));
  }

  /**
   * Keeps the worker running across leases until `stop`: acquire, `run`, and again. A refusal
   * (the lease held by another, the resource disabled (PF003) in an update window, a claim
   * refused (PF001, PF007) because the lease was superseded, drained or expired) and a fault
   * (a lost connection, the database away, an error inside the driver: counted in `faults`)
   * make it wait before it asks again, `backoff.random() * min(cap, base * 2^n)` seconds after
   * the n-th in a row (at least 10 ms); a term that handled a task resets n. With an
   * `invocationId` (the startup handshake) it acquires once, with that id, and ends with that
   * term: a new term needs a new invocation. Only an error no retry can mend ends it (PF002:
   * no such resource, 42501, 22023, 55000): it rejects with that error.
   */
  async supervise(options: SuperviseOptions = {}): Promise<void> {
    const invocationId = options.invocationId ?? null;
    let row = 0; // refusals and faults in a row
    while (!this.#stop) {
      const before = this.handled;
      let refused = false;
      try {
        refused = !(await this.owner.acquire(invocationId));
        if (!refused) {
          await this.run(options.run);
          refused = this.owner.lost !== "released"; // a claim refused, a renewal refused
        }
      } catch (e) {
        if (permanent(e)) throw e;
        if (e instanceof ResourceDisabled || e instanceof LeaseLost) refused = true;
        else this.#fault(e);
      }
      if (this.handled > before) row = 0;
      if (this.#stop || invocationId !== null) return;
      if (refused) this.refusals += 1;
      else if (this.handled > before) continue;
      await this.pause(this.refusalWait(row++));
    }
  }

  #fault(e: unknown): void {
    this.faults += 1;
    this.lastFault = redact(e instanceof Error ? `${e.name}: ${e.message}` : String(e));
  }

  /** Seconds to wait after `n` refusals in a row (full jitter, at least 10 ms). */
  refusalWait(n: number): number {
    const ceiling = Math.min(this.backoff.cap, this.backoff.base * 2 ** n);
    return Math.max(0.01, this.backoff.random() * ceiling);
  }

  /** Waits `seconds` of real time, or less if `stop` is called. */
  protected pause(seconds: number): Promise<void> {
    return pause(seconds, this.#stopping.signal);
  }

  /**
   * One term; drains and releases the lease when it ends, however it ends. It ends after
   * `maxTasks` handler calls, on `stop` (or a shutdown signal), once the lease is known lost,
   * (`untilIdle`) when the queue has nothing to claim, or when nothing more could finish by
   * `deadline`. While the lease is in doubt (a lost connection) it claims nothing and waits for
   * the renewer's verdict. Under Supabase's Edge Runtime the returned promise is also passed to
   * `EdgeRuntime.waitUntil`, so that the isolate lives until the lease is released.
   */
  run(options: RunOptions = {}): Promise<void> {
    const done = this.#run(options);
    runtime().keepAlive(done);
    return done;
  }

  async #run(options: RunOptions): Promise<void> {
    const { maxTasks, untilIdle = false, deadline } = options;
    const owner = this.owner;
    const start = this.handled;
    // `task` could not finish by `deadline` any more.
    const late = (task?: T) =>
      deadline !== undefined &&
      owner.clock() + (task === undefined ? 0 : this.needed(task)) > deadline;
    this.#running = true;
    try {
      while (!this.#stop && (maxTasks === undefined || this.handled - start < maxTasks)) {
        // A batch's results ride with the next claim (`claimWithResults`), but are not held back
        // while the lease is in doubt.
        if (this.#pending.length > 0 && !owner.valid) await this.#sendResults();
        if (!(await this.#trusted()) || late()) break;
        const tasks = await this.claim();
        if (tasks === null) continue; // the claim's answer was lost: its tasks come back
        if (tasks.length === 0) {
          if (owner.lost !== null) break; // the claim was refused
          const requeued = await this.requeue();
          if (requeued === 0) {
            if (untilIdle) break;
            await this.#idle();
          }
          continue;
        }
        for (const [i, task] of tasks.entries()) {
          // After a shutdown, or a handler past its deadline, start no other: the rest of the
          // batch returns to the queue when its visibility runs out.
          if (this.#stop) break;
          // Quick handlers' results wait for their batch's; once a result's handler began
          // reportWithin ago, what is in hand goes first.
          const first = this.#pending[0];
          if (first !== undefined && owner.clock() - first.started >= this.reportWithin) {
            await this.#sendResults();
          }
          // Fresh: the claim's first task, started right after its answer, without waiting.
          const fresh = i === 0 && owner.valid;
          if (!(await this.#trusted()) || late(task)) break;
          await this.#inHand(task, fresh);
        }
        if (this.claimWithResults === undefined) await this.#sendResults();
      }
    } finally {
      this.#running = false;
      clearTimeout(this.#graceTimer);
      this.#graceTimer = undefined;
      // Results in hand are reported whatever ended the term (a lost lease too: a result is
      // judged by its attempt, I5), before the lease is given up.
      try {
        await this.#sendResults();
      } finally {
        await this.leave();
      }
    }
  }

  /** Whether the lease may be used, waiting for the renewer's verdict while it is in doubt. */
  async #trusted(): Promise<boolean> {
    return this.owner.valid || await this.owner.trust(this.#stopping.signal);
  }

  /** The task in hand: handled, unless a shutdown's grace runs out first (handed back). */
  async #inHand(task: T, fresh: boolean): Promise<void> {
    const halt = this.#halt.signal;
    let onHalt = () => {};
    const halted = new Promise<"halted">((resolve) => {
      onHalt = () => resolve("halted");
      if (halt.aborted) onHalt();
      halt.addEventListener("abort", onHalt);
    });
    const work = this.handle(task, fresh);
    try {
      if (await Promise.race([work.then(() => "done" as const), halted]) === "halted") {
        work.catch(() => {}); // it settles after the worker left; nothing waits for it
        this.handedBack += 1;
        return;
      }
    } finally {
      halt.removeEventListener("abort", onHalt);
    }
    await work;
  }

  /**
   * Release even when drain fails (the database away, a timeout): release is what stops the
   * renewer, which would otherwise keep the lease alive for a worker that has quit.
   */
  protected async leave(): Promise<void> {
    try {
      await this.owner.drain();
    } finally {
      await this.owner.release();
    }
  }

  /**
   * One claim, not resent after a lost connection (its tasks, if it took any, come back when
   * their visibility runs out, to a new attempt): null then. A refusal (PF001; PF007 where a
   * protected table refused it) marks the lease lost and returns no task.
   */
  protected async claim(): Promise<T[] | null> {
    const owner = this.owner;
    const results = this.#pending;
    this.#pending = [];
    const riding = this.claimWithResults;
    let sent = owner.clock();
    let rows: Row[];
    try {
      if (results.length === 0 || riding === undefined) {
        rows = await owner.query("claim", (sql) => {
          sent = this.#claimSent = owner.clock();
          return this.claimStatement(sql);
        });
      } else {
        // (Its steps: the claim, then the results, the statement a fault test breaks.)
        rows = await owner.query(
          ["claim", results.length === 1 ? "complete" : "complete_many"],
          (sql) => {
            sent = this.#claimSent = owner.clock();
            return riding.call(this, sql, results);
          },
        );
        for (const verdict of rows[0].verdicts as Verdict[]) this.verdicts[verdict] += 1;
        rows = rows.filter((row) => row.task_id !== null);
      }
    } catch (e) {
      if (results.length > 0) {
        // Rolled back, or its answer lost: the results go again by themselves, by their rules (a
        // lost answer's are answered duplicate); the claim goes again only if it was rolled back.
        await this.resendResults(results, e);
        if (!(e instanceof ConnectionLost)) return await this.claim();
      }
      if (e instanceof LeaseNotCurrent || e instanceof UnfencedWrite) {
        owner.markLost(`claim under ${owner.name} refused: ${e.message}`);
        return [];
      }
      if (e instanceof ConnectionLost) return null;
      throw e;
    }
    return await this.claimed(rows, sent);
  }

  /** Results whose statement with the next claim failed (`error`): sent again by themselves,
   * by `reportMany`'s rules. (A fault test's broken worker throws `error` instead.) */
  protected resendResults(results: { task: T; body: unknown }[], _error: unknown): Promise<void> {
    return this.reportMany(results);
  }

  /**
   * Where a worker has it, the statement that sends the results in hand and claims the next
   * batch: one statement, so one transaction and one commit where the results alone and then
   * the claim took two (a postgres.js transaction would cost round trips, and a connection
   * broken inside one can throw out of postgres.js). Rows of the claim's columns (null where it
   * took nothing: one row) and `verdicts`, a JSON array of the results' verdicts in order. Where
   * it is missing, a batch's results go when its handlers are done.
   */
  protected claimWithResults?(sql: Sql, results: { task: T; body: unknown }[]): PendingQuery;

  /** The claim statement, on the owner's pool. */
  protected abstract claimStatement(sql: Sql): PendingQuery;

  /** The claim's rows as tasks; `sent`: when the claim was sent, on the owner's clock. */
  protected abstract claimed(rows: Row[], sent: number): T[] | Promise<T[]>;

  /** Brings back expired tasks when the queue is empty: how many, null when its answer was
   * lost (default: none to bring back, a queue whose tasks come back by themselves). */
  protected requeue(): Promise<number | null> {
    return Promise.resolve(0);
  }

  /**
   * Before a handler starts: true if the task's remaining visibility covers the handler's
   * deadline, extending it first when it does not; false when the attempt no longer holds it
   * (the extend answered NULL: superseded, or its task requeued). A handler's time counts from
   * the claim for the first task of a claim, started right after the claim's answer (`fresh`),
   * from now for the others. A claim that holds its batch for its handlers' time (`Worker.hold`)
   * covers them all while each keeps to its deadline: only a handler that ran long (one that
   * extended itself, or had no deadline) makes a later task need an extend.
   */
  protected async stillHeld(task: T, fresh: boolean): Promise<boolean> {
    const needed = this.needed(task);
    const from = fresh ? this.#claimSent : this.owner.clock();
    if (task.visibleUntil - from >= needed) return true;
    return await this.#extend(task, needed) !== null;
  }

  async #extend(task: T, visibility: number): Promise<Date | null> {
    const sent = this.owner.clock();
    const until = await this.extend(task.attemptId, visibility);
    if (until !== null) task.visibleUntil = sent + visibility;
    return until;
  }

  /** One task (`fresh`: the first of its claim): the visibility check, the handler under its
   * deadline; its result waits for the batch's (`reportMany`), a failure is reported at once. */
  protected async handle(task: T, fresh = false): Promise<void> {
    if (!(await this.stillHeld(task, fresh))) {
      this.skipped += 1;
      return;
    }
    const owner = this.owner;
    const started = owner.clock();
    const timeout = this.handlerTimeout(task);
    // Never past the task's visibility: the handler stops (its signal aborts, the lease is
    // drained) before anyone else may start the task.
    const deadline = timeout === Infinity
      ? Infinity
      : Math.min(owner.clock() + timeout, task.visibleUntil);
    if (deadline !== Infinity) {
      owner.renewUntil(deadline, `a handler ran past its deadline (${timeout} s)`);
    }
    const context: HandlerContext<T> = {
      task,
      signal: owner.signal,
      deadline,
      extend: (visibility) => this.#extend(task, visibility),
    };
    let failed = false;
    let body: unknown;
    try {
      body = await this.call(task, context);
    } catch (e) {
      if (e instanceof LeaseLost) throw e; // the handler saw the lease go: nothing to report
      failed = true;
      body = this.failure(e);
    } finally {
      owner.renewUntil(null);
    }
    if (this.#halt.signal.aborted) return; // handed back at a shutdown: not reported
    this.handled += 1;
    if (failed) {
      await this.report("fail", task.attemptId, body);
      return;
    }
    this.#pending.push({ task, started, body });
    if (this.reportManyStatement === undefined) await this.#sendResults(); // no batch to wait for
  }

  /** The results in hand, reported (`reportMany`). */
  async #sendResults(): Promise<void> {
    const pending = this.#pending;
    this.#pending = [];
    if (pending.length > 0) await this.reportMany(pending);
  }

  /**
   * Reports the results of a batch's handlers (`task`, `body`) in one statement
   * (`reportManyStatement`), or one by one (`report`) where there is none or one result. Sent
   * again with the same attempt ids after a lost connection, until answered (or a shutdown's
   * grace runs out), as `report` is: each id's verdict (I5) is counted in `verdicts`, and a copy
   * that was applied answers `duplicate`. If no answer comes, the error is thrown and the results
   * are not sent again: their tasks come back when their visibility runs out.
   */
  protected async reportMany(results: { task: T; body: unknown }[]): Promise<void> {
    const many = this.reportManyStatement;
    if (many === undefined || results.length === 1) {
      for (const { task, body } of results) await this.report("complete", task.attemptId, body);
      return;
    }
    const rows = await this.owner.query(
      "complete_many",
      (sql) => many.call(this, sql, results),
      { resend: true, signal: this.#halt.signal },
    );
    for (const row of rows) this.verdicts[row.verdict as Verdict] += 1;
  }

  /** The statement of a batch's results (rows of `verdict`, one per result), where the
   * protocol has one. */
  protected reportManyStatement?(sql: Sql, results: { task: T; body: unknown }[]): PendingQuery;

  /** Calls the task's handler; its result is the task's. */
  protected abstract call(task: T, context: HandlerContext<T>): unknown;

  /** What a thrown error reports (default `{ error: message }`). */
  protected failure(e: unknown): unknown {
    return { error: e instanceof Error ? e.message : String(e) };
  }

  /**
   * complete or fail; the database's verdict (I5) is counted in `verdicts`. Sent again with the
   * same attempt id after a lost connection, until answered (or a shutdown's grace runs out):
   * `accepted` or `duplicate` both mean the result is recorded, once. Null: nothing was
   * reported (`PgmqWorker`: a failure, which pgmq does not record).
   */
  protected async report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict | null> {
    const [row] = await this.owner.query(
      kind,
      (sql) => this.reportStatement(sql, kind, attemptId, body),
      { resend: true, signal: this.#halt.signal },
    );
    const verdict = row.verdict as Verdict;
    this.verdicts[verdict] += 1;
    return verdict;
  }

  /** The report: one row, `verdict`. */
  protected abstract reportStatement(
    sql: Sql,
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): PendingQuery;

  /** extend, resent after a lost connection (a second extend only moves the same deadline). */
  protected async extend(attemptId: string, visibility: number): Promise<Date | null> {
    const [row] = await this.owner.query(
      "extend",
      (sql) => this.extendStatement(sql, attemptId, visibility),
      { resend: true, signal: this.#halt.signal },
    );
    return (row.visible_until as Date | null) ?? null;
  }

  /** The extend: one row, `visible_until` (null when the attempt no longer holds the task). */
  protected abstract extendStatement(sql: Sql, attemptId: string, visibility: number): PendingQuery;

  #idle(): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = null;
        resolve();
      };
      const timer = setTimeout(done, this.idleWait * 1000);
      this.#wake = done;
    });
  }
}

/** The attempt ids of results as an array literal (uuids need no quoting): no array type of
 * postgres.js's, which it learns from the server only when it fetches types. */
function attemptIds(results: { task: Attempt }[]): string {
  return `{${results.map(({ task }) => task.attemptId).join(",")}}`;
}

/** JSON for postgres.js: serialized once (a string passed for jsonb would be encoded again, as
 * a JSON string); null and undefined are SQL NULL. */
function json(sql: Sql, body: unknown) {
  return body === undefined || body === null ? null : sql.json(body as postgres.JSONValue);
}

/** The longest visibility the database grants (pgfence.check_interval): a day. */
const DAY = 86400;

/**
 * Claims and handles tasks of one pgfence queue while its Owner is valid (the loop:
 * `WorkerLoop`). Each handler call runs under `handlerTimeout` seconds on the owner's clock
 * (default: `visibility`, after which the task may be handed to someone else anyway). A claim
 * holds its batch for its handlers one after another (`hold`), so that handlers within their
 * deadlines need no extend. No handler starts unless its task's remaining visibility covers its
 * deadline: the worker extends the task first, and skips it when the extend finds the attempt
 * superseded. A batch's results go in one `pgfence.complete_many`, in the statement of the next
 * claim (`claimWithResults`).
 */
export class Worker extends WorkerLoop<Task> {
  /** The queue worked. */
  readonly queue: string;
  /** The handler of every task. */
  readonly handler: Handler;
  readonly #handlerTimeout: number;

  /** A worker of `options.queue` under `options.owner`; nothing runs before `run`. */
  constructor(options: WorkerOptions) {
    super(options);
    this.queue = options.queue;
    this.handler = options.handler;
    this.#handlerTimeout = options.handlerTimeout ?? this.visibility;
  }

  /** Seconds per handler call, on the owner's clock (the same for every task). */
  handlerTimeout(_task?: Task): number {
    return this.#handlerTimeout;
  }

  /**
   * Seconds of visibility a claim asks for: its batch's handlers one after another, each within
   * its deadline (`qty` × `handlerTimeout`, or × `visibility` without one), so that none needs
   * an extend before it starts; at most a day, the most the database grants. The price is
   * liveness: the tasks of a worker that dies come back when its batch's hold runs out.
   */
  get hold(): number {
    const timeout = this.handlerTimeout();
    return Math.min(this.qty * (Number.isFinite(timeout) ? timeout : this.visibility), DAY);
  }

  /** The claim: rows of task_id, attempt_id, attempt, payload (`PgmqWorker` reads pgmq). */
  protected claimStatement(sql: Sql): PendingQuery {
    return sql`select task_id, attempt_id, attempt, payload
                 from pgfence.claim(${this.owner.leaseId}::uuid, ${this.queue}, ${this.qty},
                                    make_interval(secs => ${this.hold}))`;
  }

  /** The claim's rows as tasks, each visible for `hold` from when the claim was sent. */
  protected claimed(rows: Row[], sent: number): Task[] {
    return rows.map((r) => ({
      taskId: BigInt(r.task_id as string),
      attemptId: r.attempt_id as string,
      attempt: r.attempt as number,
      payload: r.payload,
      visibleUntil: sent + this.hold,
    }));
  }

  /** requeue_expired, once: how many tasks came back, or null when its answer was lost. */
  protected override async requeue(): Promise<number | null> {
    try {
      const [row] = await this.owner.query(
        "requeue",
        (sql) => sql`select pgfence.requeue_expired() as requeued`,
      );
      return row.requeued as number;
    } catch (e) {
      if (e instanceof ConnectionLost) return null;
      throw e;
    }
  }

  /** The queue's handler, with the task's payload. */
  protected call(task: Task, context: HandlerContext): unknown {
    return this.handler(task.payload, context);
  }

  /** `pgfence.complete` or `pgfence.fail`: one row, `verdict`. */
  protected reportStatement(
    sql: Sql,
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): PendingQuery {
    return kind === "complete"
      ? sql`select pgfence.complete(${attemptId}::uuid, ${json(sql, body)}) as verdict`
      : sql`select pgfence.fail(${attemptId}::uuid, ${json(sql, body)}) as verdict`;
  }

  /** `pgfence.complete_many`: one row per result, `verdict`. The results go as one JSON array
   * (a handler's null or undefined as SQL NULL, as `complete` sends it). */
  protected override reportManyStatement(
    sql: Sql,
    results: { task: Task; body: unknown }[],
  ): PendingQuery {
    const bodies = results.map(({ body }) => body ?? null) as postgres.JSONValue;
    return sql`select outcome as verdict
                 from pgfence.complete_many(${attemptIds(results)}::uuid[],
                        array(select nullif(r.value, 'null')
                                from jsonb_array_elements(${sql.json(bodies)}::jsonb)
                                     with ordinality r(value, n)
                               order by r.n))`;
  }

  /** `pgfence.complete_many` of the results in hand and the next claim, in one statement (the
   * two touch different rows: their order within it does not matter). */
  protected override claimWithResults(
    sql: Sql,
    results: { task: Task; body: unknown }[],
  ): PendingQuery {
    const bodies = results.map(({ body }) => body ?? null) as postgres.JSONValue;
    // One result as `complete`: `complete_many`'s statements are planned anew on every call.
    const [{ task, body }] = results;
    const done = results.length === 1
      ? sql`select jsonb_build_array(pgfence.complete(${task.attemptId}::uuid,
                                                      ${json(sql, body)})) as verdicts`
      : sql`select jsonb_agg(d.outcome order by d.n) as verdicts
              from pgfence.complete_many(${attemptIds(results)}::uuid[],
                     array(select nullif(r.value, 'null')
                             from jsonb_array_elements(${sql.json(bodies)}::jsonb)
                                  with ordinality r(value, n)
                            order by r.n)) with ordinality d(attempt_id, outcome, n)`;
    return sql`with done as materialized (${done})
               select d.verdicts, c.task_id, c.attempt_id, c.attempt, c.payload
                 from done d
                 left join pgfence.claim(${this.owner.leaseId}::uuid, ${this.queue}, ${this.qty},
                                         make_interval(secs => ${this.hold})) c on true`;
  }

  /** `pgfence.extend`: one row, `visible_until` (null when the attempt no longer holds it). */
  protected extendStatement(sql: Sql, attemptId: string, visibility: number): PendingQuery {
    return sql`select pgfence.extend(${attemptId}::uuid, make_interval(secs => ${visibility}))
                 as visible_until`;
  }
}

/** The settings of a `PgmqWorker`: a `Worker`'s, and what a handler's return does. */
export interface PgmqWorkerOptions extends WorkerOptions {
  /** `archive` (default) or `delete` the message when its handler returns. */
  finish?: "archive" | "delete";
}

/**
 * A `Worker` of a pgmq queue, through the pgmq layer (schema `pgfence_pgmq`, docs/pgmq.md): the
 * same rules, over `pgfence_pgmq.read` / `set_vt` / `archive` (or `delete`; a batch's in one
 * `archive_many` or `delete_many`). A task is a message: `taskId` is its `msg_id` (every read of
 * it shares it), `attempt` its `read_ct`. pgmq keeps no result and no failure: a handler's return
 * value is dropped, and a message whose handler threw is left hidden until its visibility runs
 * out, then read again (counted in `failed`). pgmq has nothing to requeue: a message comes back by
 * itself.
 */
export class PgmqWorker extends Worker {
  /** What a handler's return does to its message. */
  readonly finish: "archive" | "delete";
  /** Handlers that threw: their messages are read again once their visibility runs out. */
  failed = 0;

  /** A worker of the pgmq queue `options.queue` under `options.owner`. */
  constructor(options: PgmqWorkerOptions) {
    super(options);
    this.finish = options.finish ?? "archive";
  }

  /** `pgfence_pgmq.read`: only under the current lease, checked with the read. */
  protected override claimStatement(sql: Sql): PendingQuery {
    return sql`select msg_id as task_id, attempt_id, read_ct as attempt, message as payload
                 from pgfence_pgmq.read(${this.owner.leaseId}::uuid, ${this.queue},
                                        qty => ${this.qty},
                                        vt => make_interval(secs => ${this.hold}))`;
  }

  /** Nothing to requeue: a pgmq message comes back when its visibility runs out. */
  protected override requeue(): Promise<number | null> {
    return Promise.resolve(0);
  }

  /** `pgfence_pgmq.set_vt`: null when the attempt no longer holds the message. */
  protected override extendStatement(
    sql: Sql,
    attemptId: string,
    visibility: number,
  ): PendingQuery {
    return sql`select pgfence_pgmq.set_vt(${attemptId}::uuid, make_interval(secs => ${visibility}))
                 as visible_until`;
  }

  /** A throw is counted in `failed`, not reported: the message is read again later. */
  protected override report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict | null> {
    if (kind === "fail") {
      this.failed += 1;
      return Promise.resolve(null);
    }
    return super.report(kind, attemptId, body);
  }

  /** archive (or delete, `finish`) for a handler's return: `accepted` only while the message has
   * not been read again since this attempt. */
  protected override reportStatement(
    sql: Sql,
    _kind: "complete" | "fail",
    attemptId: string,
  ): PendingQuery {
    return this.finish === "delete"
      ? sql`select pgfence_pgmq.delete(${attemptId}::uuid) as verdict`
      : sql`select pgfence_pgmq.archive(${attemptId}::uuid) as verdict`;
  }

  /** `archive_many` (or `delete_many`) of the results in hand and the next read, in one
   * statement. */
  protected override claimWithResults(
    sql: Sql,
    results: { task: Task; body: unknown }[],
  ): PendingQuery {
    const ids = attemptIds(results);
    const finished = this.finish === "delete"
      ? sql`pgfence_pgmq.delete_many(${ids}::uuid[])`
      : sql`pgfence_pgmq.archive_many(${ids}::uuid[])`;
    return sql`with done as materialized (
                 select jsonb_agg(d.outcome order by d.n) as verdicts
                   from ${finished} with ordinality d(attempt_id, outcome, n))
               select d.verdicts, c.msg_id as task_id, c.attempt_id, c.read_ct as attempt,
                      c.message as payload
                 from done d
                 left join pgfence_pgmq.read(${this.owner.leaseId}::uuid, ${this.queue},
                                             qty => ${this.qty},
                                             vt => make_interval(secs => ${this.hold})) c on true`;
  }

  /** `archive_many` (or `delete_many`): one row per message, `verdict`. */
  protected override reportManyStatement(
    sql: Sql,
    results: { task: Task; body: unknown }[],
  ): PendingQuery {
    return this.finish === "delete"
      ? sql`select outcome as verdict from pgfence_pgmq.delete_many(${attemptIds(results)}::uuid[])`
      : sql`select outcome as verdict from pgfence_pgmq.archive_many(${
        attemptIds(results)
      }::uuid[])`;
  }
}
