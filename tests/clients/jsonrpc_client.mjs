// A JSON-RPC 2.0 client for `memstrata serve`, in plain Node (no packages): it drives one
// subscription from subscribe to unsubscribe and checks every line it reads on the way.
//
//   node jsonrpc_client.mjs stdio COMMAND [ARGS...]   spawn the server, talk over its stdin/stdout
//   node jsonrpc_client.mjs unix:PATH | tcp:HOST:PORT  connect to a server started with --listen
//
// Prints one JSON summary line and exits 0 when every check holds; otherwise prints the reason
// on stderr and exits 1 (2 when the bounded wait runs out).
import { spawn } from "node:child_process";
import net from "node:net";
import readline from "node:readline";

const [target, ...command] = process.argv.slice(2);
const session = `node-${process.pid}`;
const timer = setTimeout(() => fail("timed out waiting for the server", 2), 60_000);

let input, output, child;
if (target === "stdio") {
  child = spawn(command[0], command.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  input = child.stdout;
  output = child.stdin;
} else if (target.startsWith("unix:")) {
  input = output = net.createConnection({ path: target.slice(5) });
} else if (target.startsWith("tcp:")) {
  const at = target.lastIndexOf(":");
  const host = target.slice(4, at).replace(/^\[|\]$/g, "");
  input = output = net.createConnection({ host, port: Number(target.slice(at + 1)) });
} else {
  fail(`unknown target ${target}`);
}

const pending = new Map(); // id -> resolve
const notes = []; // every notification, in arrival order
const answered = []; // ids of the responses read so far
const waiters = []; // [predicate, resolve]
let nextId = 1;

function fail(message, code = 1) {
  process.stderr.write(`jsonrpc_client: ${message}\n`);
  process.exit(code);
}

function check(condition, message) {
  if (!condition) fail(message);
}

readline.createInterface({ input }).on("line", (line) => {
  const message = JSON.parse(line);
  check(!Array.isArray(message), `unexpected batch: ${line}`);
  check(message.jsonrpc === "2.0", `no "jsonrpc": "2.0" in ${line}`);
  if (message.id === undefined) {
    notes.push({ ...message, afterResponses: [...answered] });
    for (const waiter of waiters.splice(0)) {
      if (!waiter[0]()) waiters.push(waiter);
      else waiter[1]();
    }
    return;
  }
  const resolve = pending.get(message.id);
  check(resolve !== undefined, `a response nobody asked for: ${line}`);
  pending.delete(message.id);
  answered.push(message.id);
  if (message.error) fail(`${message.id}: ${message.error.code} ${message.error.message}`);
  resolve(message.result);
});

function call(method, params) {
  const id = nextId++;
  output.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
  return new Promise((resolve) => pending.set(id, resolve)).then((result) => ({ id, result }));
}

function notify(method, params) {
  output.write(JSON.stringify({ jsonrpc: "2.0", method, params }) + "\n");
}

function until(predicate) {
  return predicate() ? Promise.resolve() : new Promise((resolve) => waiters.push([predicate, resolve]));
}

const signalsOf = (sub) => notes.filter((n) => n.method === "signal" && n.params.subscription_id === sub);

// a value before subscribing: it must come first, as the current value
await call("publish", { session_id: session, key: "agent:a", value: { state: "idle" }, publisher: "node" });
const first = await call("subscribe", { session_id: session, key_or_prefix: "agent:*" });
const sub = first.result.subscription_id;
check(Number.isInteger(sub), `subscribe returned ${JSON.stringify(first.result)}`);
await until(() => signalsOf(sub).length >= 1);
check(signalsOf(sub)[0].afterResponses.includes(first.id), "a signal came before the subscribe response");

notify("publish", { session_id: session, key: "agent:a", value: 2 }); // a notification: no response
await call("publish", { session_id: session, key: "agent:b", value: [1, "two"] });
await call("publish", { session_id: session, key: "other", value: "not matched" });
await call("delete_signal", { session_id: session, key: "agent:a" });
await until(() => signalsOf(sub).length >= 4);
const seen = signalsOf(sub).map((n) => [n.params.key, n.params.value, n.params.version, n.params.deleted]);
check(
  JSON.stringify(seen) ===
    JSON.stringify([
      ["agent:a", { state: "idle" }, 1, false],
      ["agent:a", 2, 2, false],
      ["agent:b", [1, "two"], 1, false],
      ["agent:a", null, 3, true],
    ]),
  `signals out of order or wrong: ${JSON.stringify(seen)}`,
);
check(signalsOf(sub)[0].params.publisher === "node" && signalsOf(sub)[0].params.session_id === session, "fields");

// a second subscription stays; after unsubscribing the first, its signal for the next change
// comes after any the first could still have sent (same key, older subscription first)
const second = (await call("subscribe", { session_id: session, key_or_prefix: "agent:b" })).result.subscription_id;
await until(() => signalsOf(second).length >= 1);
const gone = await call("unsubscribe", { session_id: session, subscription_id: sub });
check(gone.result.removed === true, `unsubscribe: ${JSON.stringify(gone.result)}`);
const before = signalsOf(sub).length;
await call("publish", { session_id: session, key: "agent:b", value: "after" });
await until(() => signalsOf(second).length >= 2);
check(signalsOf(sub).length === before, "a signal came after unsubscribe answered");
const again = await call("unsubscribe", { session_id: session, subscription_id: sub });
check(again.result.removed === false, "unsubscribing twice removed something");
check(pending.size === 0, "unanswered requests");

console.log(JSON.stringify({ ok: true, subscription: sub, signals: seen.length, notifications: notes.length }));
clearTimeout(timer);
if (child) {
  output.end();
  child.on("exit", (code) => process.exit(code === 0 ? 0 : 1));
} else {
  input.end();
  process.exit(0);
}
