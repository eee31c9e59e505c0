/**
 * A fenced worker as a Supabase Edge Function, written by `pgfence init` (this file is its
 * template: supabase/functions/pgfence-worker/index.ts; edit your copy, then it is yours).
 *
 * The startup handshake: a supervisor (pg_cron, a scheduler, or you with psql) asks
 * `pgfence.request_start(resource)` for an invocation id and, when it gets one, calls this
 * function with it. The function acquires the lease with that invocation id, so a second call
 * with the same id, or while another invocation holds the lease, is refused (409). Then it
 * claims the queue's tasks under the lease and reports each result with a fenced complete: a
 * result from an invocation that lost its lease is refused by the database, never applied. It
 * answers when the queue is idle, then releases the lease.
 *
 *   POST /  {"invocation_id": "<uuid from pgfence.request_start>"}
 *   200 {"started": true, "generation": "1", "handled": 1, "verdicts": {...}}
 *   409 {"started": false, ...}              no invocation id, or not the pending one
 *   400 {"error": "Bad Request", ...}        a body that is not JSON, an id that is not a uuid
 *   503 {"started": false, "paused": true}   the resource is disabled (an update window)
 *   500 {"error": "..."}                     e.g. the role lacks pgfence_worker (grants)
 *
 * Environment: PGFENCE_DATABASE_URL, else SUPABASE_DB_URL (which Supabase sets: the role
 * postgres, which ran the migrations and owns pgfence); another role must hold pgfence_worker,
 * e.g. a login role that is a member of service_role (the grants migration). PGFENCE_RESOURCE
 * (default `emails`), PGFENCE_QUEUE (default: the resource's name), HOST and PORT (default
 * 0.0.0.0:8000 when run with deno run).
 */
import {
  connect,
  type HandlerContext,
  InsufficientPrivilege,
  InvalidArgument,
  invocationOf,
  jsonResponse as answer,
  Owner,
  ResourceDisabled,
  Worker,
} from "pgfence";

const url = Deno.env.get("PGFENCE_DATABASE_URL") ?? Deno.env.get("SUPABASE_DB_URL");
if (!url) throw new Error("pgfence-worker: set PGFENCE_DATABASE_URL (or SUPABASE_DB_URL)");
const sql = connect(url);
const resource = Deno.env.get("PGFENCE_RESOURCE") ?? "emails";
const queue = Deno.env.get("PGFENCE_QUEUE") ?? resource;
// Edge Functions end an invocation at their wall-clock limit (150 s on the free plan): claim
// nothing that could not finish well before it.
const budgetSeconds = 100;

// One task's work: yours goes here. Use task.taskId as the idempotency key of external
// effects; what it returns is the task's result, stored only by a current lease.
function handle(payload: unknown, { task }: HandlerContext): unknown {
  return { done: payload, task: String(task.taskId) };
}

const listen = {
  hostname: Deno.env.get("HOST") ?? "0.0.0.0",
  port: Number(Deno.env.get("PORT") ?? 8000),
};
Deno.serve(listen, async (request) => {
  const invocationId = await invocationOf(request); // or the 400 / 409 that refuses it
  if (invocationId instanceof Response) return invocationId;
  const owner = new Owner({ sql, resource, owner: `edge-${crypto.randomUUID()}` });
  try {
    if (!(await owner.acquire(invocationId))) {
      return answer(409, { started: false });
    }
  } catch (e) {
    if (e instanceof ResourceDisabled) return answer(503, { started: false, paused: true });
    if (e instanceof InvalidArgument) return answer(409, { started: false }); // never issued
    if (e instanceof InsufficientPrivilege) {
      return answer(500, {
        error: `permission denied: ${(e as Error).message}; the role this function connects ` +
          "as needs pgfence_worker (the pgfence grants migration of pgfence init)",
      });
    }
    throw e;
  }
  const worker = new Worker({ owner, queue, handler: handle });
  await worker.run({ untilIdle: true, deadline: owner.clock() + budgetSeconds });
  return answer(200, {
    started: true,
    generation: String(owner.generation),
    handled: worker.handled,
    verdicts: worker.verdicts,
  });
});
