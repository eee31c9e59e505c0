// A peer's worker or filler for scripts/bench --only workers, run by node with the bench-only
// node_modules (bench/.peers/node; bench/peers/setup installs them):
//
//   run.mjs graphile-worker|pg-boss DSN fill N          queue N no-op jobs with the peer's API
//   run.mjs graphile-worker|pg-boss DSN work QTY INDEX  "ready", then on a line of stdin work
//                                                        until the driver stops it (SIGTERM)
//
// Each with its documented setting for a worker that takes QTY jobs at a time: graphile-worker's
// concurrency, pg-boss's batchSize (a handler gets the batch and completes it at once).
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const require = createRequire(new URL("../.peers/node/", import.meta.url));
const [peer, dsn, mode, nText] = process.argv.slice(2);
const n = Number(nText);

async function ready() {
  console.log("ready");
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
}

function stopOn(stop) {
  process.once("SIGTERM", async () => {
    await stop();
    process.exit(0);
  });
}

async function graphile() {
  const { Logger, makeWorkerUtils, run } = require("graphile-worker");
  const logger = new Logger(() => () => {}); // its per-job log lines off, as ours print none
  if (mode === "fill") {
    const utils = await makeWorkerUtils({ connectionString: dsn, logger });
    await utils.migrate();
    const jobs = Array.from({ length: n }, (_, i) => ({ identifier: "job", payload: { n: i } }));
    for (let i = 0; i < jobs.length; i += 1000) await utils.addJobs(jobs.slice(i, i + 1000));
    await utils.release();
    return;
  }
  await ready();
  const runner = await run({
    connectionString: dsn,
    concurrency: n,
    logger,
    noHandleSignals: true,
    pollInterval: 1000,
    taskList: { job: async () => {} },
  });
  stopOn(() => runner.stop());
  await runner.promise;
}

async function pgBoss() {
  const { PgBoss } = require("pg-boss");
  const boss = new PgBoss(dsn);
  boss.on("error", (e) => console.error(e));
  await boss.start();
  if (mode === "fill") {
    await boss.createQueue("bench").catch(() => {});
    const jobs = Array.from({ length: n }, (_, i) => ({ data: { n: i } }));
    for (let i = 0; i < jobs.length; i += 1000) await boss.insert("bench", jobs.slice(i, i + 1000));
    await boss.stop({ graceful: false });
    return;
  }
  await ready();
  await boss.work("bench", { batchSize: n, pollingIntervalSeconds: 0.5 }, async (jobs) => jobs.length);
  stopOn(() => boss.stop({ graceful: false }));
}

await (peer === "graphile-worker" ? graphile() : pgBoss());
