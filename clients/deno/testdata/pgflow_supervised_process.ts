/**
 * A supervised pgflow worker as a process of its own, for tests/test_deno_pgflow.py (a process
 * worker across an update window): it works flow `two` for $RESOURCE at $DATABASE_URL, kept
 * across leases by `supervise()` until SIGTERM (`installShutdown`), backing off briefly after each refusal (PF003
 * while the window is open). It prints `{"acquired": generation, "code": $CODE}` for each lease
 * it gets, and each handler `{"started": step, "code": $CODE}`, then waits for a line on stdin
 * before it returns: $CODE stands for the binary's version.
 */
import { connect, Owner } from "pgfence";
import { FlowWorker } from "pgfence/pgflow";

const code = Deno.env.get("CODE")!;

/** An Owner that says so each time it gets a lease. */
class Announcing extends Owner {
  override async acquire(invocationId: string | null = null): Promise<boolean> {
    const got = await super.acquire(invocationId);
    if (got) console.log(JSON.stringify({ acquired: String(this.generation), code }));
    return got;
  }
}

const sql = connect(Deno.env.get("DATABASE_URL")!);
const owner = new Announcing({
  sql,
  resource: Deno.env.get("RESOURCE")!,
  owner: Deno.env.get("NAME")!,
  renewEvery: 0.05,
});
const stdin = Deno.stdin.readable.getReader();
const step = async (_input: unknown, { task }: { task: { stepSlug: string } }) => {
  console.log(JSON.stringify({ started: task.stepSlug, code }));
  await stdin.read();
  return { code };
};
const worker = new FlowWorker({
  owner,
  flowSlug: "two",
  handlers: { first: step, second: step },
  handlerTimeout: 600,
  idleWait: 0.05,
  backoff: { base: 0.05, cap: 0.2 },
});
worker.installShutdown(); // SIGTERM or SIGINT: it stops (drains, releases) and supervise returns
await worker.supervise();
await sql.end({ timeout: 5 });
console.log(JSON.stringify({ stopped: true, code }));
