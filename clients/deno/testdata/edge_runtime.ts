/**
 * A stand-in for Supabase's Edge Runtime around one isolate, for the fault campaign
 * (tests/campaign; docs/campaign.md, "The layers"). The Edge Runtime cannot run here: imported
 * before a function's own code, this module gives the function the runtime's events as
 * Supabase documents them, and nothing else:
 *
 * - An isolate is booted for an HTTP request to its function: the campaign starts this process
 *   and sends the request once `Deno.serve`, which the runtime owns, says `listening PORT` on
 *   stdout.
 * - `EdgeRuntime.waitUntil(promise)`: the isolate lives on until the promise settles
 *   ("Background Tasks"), but never past its wall-clock limit (`waitUntil` "does not extend the
 *   hard wall clock limit").
 * - `beforeunload`, a cancelable CustomEvent whose `detail` is `{ reason }`, when the isolate is
 *   about to be shut down: `wall_clock` EDGE_BEFOREUNLOAD seconds after its boot (edge-runtime's
 *   `--dispatch-beforeunload-wall-clock-ratio`), `termination` on SIGTERM (the campaign's end).
 * - The isolate ends at its wall-clock limit, EDGE_WALL_CLOCK seconds after its boot, whatever is
 *   pending (`WallClockTime`), or as soon as it is idle (`EarlyDrop`): its request answered, none
 *   in flight, every `waitUntil` promise settled.
 *
 * Each event is logged on stderr.
 */

const name = `edge-${Deno.env.get("SB_EXECUTION_ID")}`;
const wallClock = Number(Deno.env.get("EDGE_WALL_CLOCK") ?? "400");
const beforeunloadAt = Number(Deno.env.get("EDGE_BEFOREUNLOAD") ?? wallClock);

function log(what: string): void {
  console.error(`${new Date().toISOString().slice(11, 19)} ${name}: ${what}`);
}

const pending = new Set<Promise<void>>();
(globalThis as { EdgeRuntime?: unknown }).EdgeRuntime = {
  waitUntil(promise: Promise<unknown>): void {
    const settled = promise.then(() => {}, () => {});
    pending.add(settled);
    settled.then(() => pending.delete(settled));
  },
};

let answered = 0;
let inFlight = 0;
const serve = Deno.serve;
function runtimeServe(options: Deno.ServeTcpOptions, handler: Deno.ServeHandler): Deno.HttpServer {
  return serve({ ...options, onListen: ({ port }) => console.log(`listening ${port}`) }, async (
    request,
    info,
  ) => {
    inFlight += 1;
    try {
      return await handler(request, info);
    } finally {
      inFlight -= 1;
      answered += 1;
    }
  });
}
(Deno as unknown as { serve: typeof runtimeServe }).serve = runtimeServe;

let unloading = false;
function beforeunload(reason: string): void {
  if (unloading) return;
  unloading = true;
  log(`beforeunload (${reason})`);
  globalThis.dispatchEvent(
    new CustomEvent("beforeunload", { cancelable: true, detail: { reason } }),
  );
}

function shutdown(reason: string): void {
  log(`shutdown (${reason})`);
  Deno.exit(0);
}

setTimeout(() => beforeunload("wall_clock"), beforeunloadAt * 1000);
setTimeout(() => shutdown("WallClockTime"), wallClock * 1000);
Deno.addSignalListener("SIGTERM", () => beforeunload("termination"));
// The runtime's resource check: an idle isolate is retired.
setInterval(() => {
  if ((answered > 0 || unloading) && inFlight === 0 && pending.size === 0) shutdown("EarlyDrop");
}, 100);
