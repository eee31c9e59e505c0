/**
 * A pgflow worker as a Supabase Edge Function, the way pgflow 0.14's docs write one
 * (`EdgeWorker.start(flow)` in the function's `index.ts`), fenced: one call,
 * `FlowWorker.serve(flow)`, serves the pings of `pgfence_pgflow.ensure_workers` (pg_cron, every
 * second; docs/pgflow.md, "Moving from pgflow's EdgeWorker").
 *
 *   POST /<function>  Authorization: Bearer <PGFLOW_AUTH_SECRET or SUPABASE_SERVICE_ROLE_KEY>
 *                     {"invocation_id": "<uuid from pgfence.request_start>"}
 *   202 {"status": "started", "started": true, "generation": "7", "functionName": "..."}
 *   409 {"started": false, "message": ...}   no invocation id, a replayed one, a worker running
 *   400 {"error": "Bad Request", ...}        a body that is not JSON, an id that is not a uuid
 *   401 {"error": "Unauthorized", ...}       the key is missing or wrong (not on a local stack)
 *   503 {"started": false, "paused": true}   the resource is disabled (an update window)
 *   500 {"error": ..., "message": ...}       the flow in the database differs (and the fix)
 *
 * The function's name (the request's path) is its pgfence resource: `pgfence.register` it.
 * Environment: EDGE_WORKER_DB_URL (pgflow's: the transaction pooler, port 6543 on Supabase),
 * SUPABASE_SERVICE_ROLE_KEY or PGFLOW_AUTH_SECRET (Supabase sets the first), FLOW (default
 * `two`), HOST and PORT when run with `deno run` (the Edge Runtime chooses its own).
 */
import { Flow } from "@pgflow/dsl";
import { FlowWorker } from "pgfence/pgflow";

// The flow's steps: each gets pgflow's input ({ run, <dependency>: output }) and returns JSON.
const TwoSteps = new Flow<{ n: number }>({ slug: Deno.env.get("FLOW") ?? "two" })
  .step({ slug: "first" }, (input) => ({ seen: input.run }))
  .step({ slug: "second", dependsOn: ["first"] }, (input) => ({ from_first: input.first }));

FlowWorker.serve(TwoSteps, {
  // The DSL this example pins (@pgflow/dsl 0.8.1) types a handler's input as pgflow 0.8 gave it,
  // the run's input under `run`; with @pgflow/dsl 0.14, leave `input` out (pgflow's own shape).
  input: "with-run",
});
