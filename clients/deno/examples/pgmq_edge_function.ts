/**
 * A pgmq consumer shaped like a Supabase Edge Function (Supabase Queues are pgmq): a supervisor
 * (pg_cron, or any scheduler) asks `pgfence.request_start(resource)` for an invocation id and,
 * when it gets one, calls this function with it; the function acquires the lease with that
 * invocation (the startup handshake), answers at once, and reads the queue through the pgmq
 * layer until it is idle, then drains and releases. A stale invocation reads nothing: the
 * database refuses its reads, and a late archive of a message read again since is `stale`.
 *
 *   POST /  {"invocation_id": "<uuid from pgfence.request_start>"}
 *   202 {"started": true, "generation": "7"}
 *   409 {"started": false, ...}   no invocation id, or not the pending one: nothing acquired
 *   400 {"error": "Bad Request"}  a body that is not JSON, an id that is not a uuid
 *   503 {"started": false, "paused": true}   the resource is disabled (an update window)
 *
 * Environment: DATABASE_URL (the transaction pooler, port 6543 on Supabase), PGFENCE_RESOURCE
 * (default `jobs-worker`), QUEUE (default `jobs`), HOST and PORT (default 0.0.0.0:8000).
 */
import {
  connect,
  InvalidArgument,
  invocationOf,
  jsonResponse as answer,
  Owner,
  PgmqWorker,
  ResourceDisabled,
} from "pgfence";

const sql = connect(Deno.env.get("DATABASE_URL")!);
const resource = Deno.env.get("PGFENCE_RESOURCE") ?? "jobs-worker";
const queue = Deno.env.get("QUEUE") ?? "jobs";

const listen = {
  hostname: Deno.env.get("HOST") ?? "0.0.0.0",
  port: Number(Deno.env.get("PORT") ?? 8000),
};
Deno.serve(listen, async (request) => {
  const invocationId = await invocationOf(request); // or the 400 / 409 that refuses it
  if (invocationId instanceof Response) return invocationId;
  const owner = new Owner({ sql, resource, owner: `edge-${crypto.randomUUID()}` });
  try {
    if (!(await owner.acquire(invocationId))) return answer(409, { started: false });
  } catch (e) {
    if (e instanceof ResourceDisabled) return answer(503, { started: false, paused: true });
    if (e instanceof InvalidArgument) return answer(409, { started: false }); // never issued
    throw e;
  }
  const worker = new PgmqWorker({
    owner,
    queue,
    // Key external effects by task.taskId (the message's msg_id, the same for every read).
    handler: (message, { task }) => console.log("message", task.taskId, message),
  });
  // beforeunload (wall clock, CPU, memory): hand back what is in hand, release.
  const removeShutdown = worker.installShutdown();
  // run() passes its own promise to EdgeRuntime.waitUntil: the isolate lives until release.
  worker.run({ untilIdle: true }).catch((e) => console.error("worker:", e)).finally(
    removeShutdown,
  );
  return answer(202, { started: true, generation: String(owner.generation) });
});
