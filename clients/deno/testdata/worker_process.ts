/**
 * A worker as a process of its own, for tests/test_deno_client.py (pause, SIGTERM): it works
 * queue `q` of $RESOURCE at $DATABASE_URL; each handler call prints `{"started": attemptId}`
 * and waits for a line on stdin before it returns; on SIGTERM it prints `{"stopping": reason}`.
 * At the end it prints what it saw.
 */
import { connect, Owner, Worker } from "pgfence";

const sql = connect(Deno.env.get("DATABASE_URL")!);
const owner = new Owner({
  sql,
  resource: Deno.env.get("RESOURCE")!,
  owner: "process",
  renewEvery: 0.05,
});
const stdin = Deno.stdin.readable.getReader();
const worker = new Worker({
  owner,
  queue: "q",
  shutdownGrace: Infinity, // SIGTERM: the handler in hand finishes, however long the test takes
  handler: async (_payload, { task }) => {
    console.log(JSON.stringify({ started: task.attemptId }));
    await stdin.read();
    return { by: "process" };
  },
});
worker.installShutdown();
// Said once the worker has taken the signal (its listener was added first): a test unblocks the
// handler in hand only then, so that the worker stops before it would claim again.
Deno.addSignalListener(
  "SIGTERM",
  () => console.log(JSON.stringify({ stopping: worker.stoppedBy })),
);
try {
  if (!(await owner.acquire())) throw new Error("not acquired");
  await worker.run({ untilIdle: true });
} finally {
  console.log(
    JSON.stringify({ verdicts: worker.verdicts, handled: worker.handled, lost: owner.lost }),
  );
  await sql.end();
}
