/**
 * A pgflow worker shaped like a Supabase Edge Function: a supervisor (pg_cron, or any
 * scheduler) asks `pgfence.request_start(resource)` for an invocation id and, when it gets one,
 * calls this function with it; the function acquires the lease with that invocation (the
 * startup handshake), answers at once, and works the flow until its queue is idle, then drains
 * and releases. A second call while a worker is current is refused by the handshake: there is
 * no id to send, and an id sent twice finds the lease taken (409).
 *
 *   POST /  {"invocation_id": "<uuid from pgfence.request_start>"}
 *   202 {"started": true, "generation": "7"}  |  409 {"started": false}  |  503 (paused)
 *
 * Environment: DATABASE_URL (the transaction pooler, port 6543 on Supabase), PGFENCE_RESOURCE
 * (the function's resource, default `pgflow-two`), FLOW (default `two`), HOST and PORT (default
 * 0.0.0.0:8000; Supabase's runtime chooses its own).
 */
import { connect, Owner, ResourceDisabled } from "pgfence";
import { FlowWorker } from "pgfence/pgflow";

const sql = connect(Deno.env.get("DATABASE_URL")!);
const resource = Deno.env.get("PGFENCE_RESOURCE") ?? "pgflow-two";
const flowSlug = Deno.env.get("FLOW") ?? "two";

// The flow's steps: each gets pgflow's input ({ run, <dependency>: output }) and returns JSON.
const handlers = {
  first: (input: unknown) => ({ seen: (input as { run: unknown }).run }),
  second: (input: unknown) => ({ from_first: (input as { first: unknown }).first }),
};

function answer(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

const listen = {
  hostname: Deno.env.get("HOST") ?? "0.0.0.0",
  port: Number(Deno.env.get("PORT") ?? 8000),
};
Deno.serve(listen, async (request) => {
  const { invocation_id: invocationId } = await request.json() as { invocation_id?: string };
  const owner = new Owner({ sql, resource, owner: `edge-${crypto.randomUUID()}` });
  try {
    if (!(await owner.acquire(invocationId ?? null))) return answer(409, { started: false });
  } catch (e) {
    if (e instanceof ResourceDisabled) return answer(503, { started: false, paused: true });
    throw e;
  }
  const worker = new FlowWorker({ owner, flowSlug, handlers });
  const work = worker.run({ untilIdle: true }).catch((e) => console.error("worker:", e));
  // On Supabase, EdgeRuntime.waitUntil keeps the isolate alive until the work is done.
  (globalThis as { EdgeRuntime?: { waitUntil(p: Promise<unknown>): void } }).EdgeRuntime
    ?.waitUntil(work);
  return answer(202, { started: true, generation: String(owner.generation) });
});
