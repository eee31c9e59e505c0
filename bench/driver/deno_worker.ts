/**
 * A worker process of the Deno client for scripts/bench --only workers (bench/driver/workers.py),
 * as the Python ones are `python -m bench.driver --worker`:
 *
 *   deno run ... deno_worker.ts Worker|PgmqWorker|FlowWorker URL QTY INDEX
 *
 * acquires resource bench-wINDEX at URL, prints "ready", and on a line of stdin works queue wq
 * (pgfence's, or the pgmq queue through the pgmq layer), or the pgflow flow wf (its one step,
 * `only`, through the pgflow layer), QTY tasks at a time with a no-op handler until it is empty;
 * then it drains, releases and exits. The client's defaults otherwise: a
 * claim held for the batch, its results in one statement, statements prepared where the
 * connection is direct (detected).
 */
import { connect, Owner, PgmqWorker, Worker } from "pgfence";
import { FlowWorker } from "pgfence/pgflow";

const [kind, url, qty, index] = Deno.args;
const sql = connect(url, { onnotice: () => {} });
const owner = new Owner({ sql, resource: `bench-w${index}`, ttl: 60 });
if (!(await owner.acquire())) {
  throw new Error(`bench-w${index} is held by another owner`);
}
console.log("ready");
await Deno.stdin.readable.getReader().read();
const options = { owner, qty: Number(qty) };
const worker = kind === "FlowWorker"
  ? new FlowWorker({
    ...options,
    flowSlug: "wf",
    handlers: { only: () => null },
  })
  : new (kind === "PgmqWorker" ? PgmqWorker : Worker)({
    ...options,
    queue: "wq",
    handler: () => {},
  });
await worker.run({ untilIdle: true });
await sql.end();
Deno.exit(0);
