/**
 * A pgflow worker as a process of its own, for tests/test_deno_pgflow.py (pause, kill): it works
 * flow `two` for $RESOURCE at $DATABASE_URL; each step handler prints `{"started": attemptId,
 * "step": slug}` and waits for a line on stdin before it returns `{"by": $NAME}`. At the end it
 * prints what it saw.
 */
import { connect, Owner } from "pgfence";
import { FlowWorker } from "pgfence/pgflow";

const sql = connect(Deno.env.get("DATABASE_URL")!);
const name = Deno.env.get("NAME")!;
const owner = new Owner({
  sql,
  resource: Deno.env.get("RESOURCE")!,
  owner: name,
  renewEvery: 0.05,
});
const stdin = Deno.stdin.readable.getReader();
const step = async (
  _input: unknown,
  { task }: { task: { attemptId: string; stepSlug: string } },
) => {
  console.log(JSON.stringify({ started: task.attemptId, step: task.stepSlug }));
  await stdin.read();
  return { by: name };
};
const worker = new FlowWorker({ owner, flowSlug: "two", handlers: { first: step, second: step } });
try {
  if (!(await owner.acquire())) throw new Error("not acquired");
  console.log(JSON.stringify({ acquired: owner.leaseId }));
  await worker.run({ untilIdle: true });
} finally {
  console.log(
    JSON.stringify({ verdicts: worker.verdicts, handled: worker.handled, lost: owner.lost }),
  );
  await sql.end();
}
