// Starts `edgeinfer serve` on a free loopback port for a test and stops it afterwards.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export const edgeinferBin = process.env.EDGEINFER_BIN ?? path.resolve('build/edgeinfer');

const LISTENING = /listening on http:\/\/([^\s]+):(\d+)/;
const DEFAULT_KEY = /with API key (ek-[0-9a-f]+\.[A-Za-z0-9_-]+)/;
const INTERNAL_TOKEN = /created internal token ([A-Za-z0-9_-]+)/;

// State folders made here, removed when the test process exits.
const stateDirs = [];
process.on('exit', () => { for (const dir of stateDirs) fs.rmSync(dir, { recursive: true, force: true }); });

// A fresh state folder (tenant store, internal token) for a server.
export function makeStateDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edgeinfer-state-'));
  stateDirs.push(dir);
  return dir;
}

// A model slow enough on a CPU (about 10 tokens/s) that its requests are still running when a
// test acts on them: synthetic Qwen2.5-0.5B shapes, made in a fresh folder (a few seconds).
export function makeSlowModel() {
  const model = path.join(makeStateDir(), 'qwen');
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'qwen2.5-0.5b', '--out', model], { encoding: 'utf8' });
  if (made.status !== 0) throw new Error(`make-model failed: ${made.stderr}`);
  return model;
}

// Starts the server with extra arguments; resolves once it logs the port it listens on and,
// unless `waitReady` is false, once /readyz answers 200 (the model is loaded and the engine runs).
// Unless the arguments name a --state-dir, the server gets a fresh one (server.stateDir); on its
// first start it logs an API key for the tenant "default" (server.defaultKey). `command` runs
// another server command the same way: `gateway`, or `backend`, which without --internal-token
// logs the token it made on its first start (server.internalToken). `port` listens there rather
// than on a free port (a server restarted where its clients know it).
export async function startServer(args = [], { env = {}, timeoutMs = 60000, waitReady = true, command = 'serve', port: listenPort = 0 } = {}) {
  const stateDir = args.includes('--state-dir') ? args[args.indexOf('--state-dir') + 1] : makeStateDir();
  const stateArgs = args.includes('--state-dir') ? [] : ['--state-dir', stateDir];
  const child = spawn(edgeinferBin, [command, '--host', '127.0.0.1', '--port', String(listenPort), ...stateArgs, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const server = {
    child,
    log: '',
    exited: new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal }))),
  };
  child.stdout.on('data', (d) => { server.log += d; });
  child.stderr.on('data', (d) => { server.log += d; });

  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in ${timeoutMs} ms:\n${server.log}`)), timeoutMs);
    const check = () => {
      const m = server.log.match(LISTENING);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[2]));
      }
    };
    child.stderr.on('data', check);
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before listening:\n${server.log}`));
    });
    child.on('error', (error) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${edgeinferBin}: ${error.message}`));
    });
  });
  server.port = port;
  server.url = `http://127.0.0.1:${port}`;
  server.stateDir = stateDir;
  // The first key is made once the server serves (after its model loads), so it is read from
  // the log when asked for.
  Object.defineProperty(server, 'defaultKey', { get: () => server.log.match(DEFAULT_KEY)?.[1], enumerable: true });
  server.internalToken = server.log.match(INTERNAL_TOKEN)?.[1];
  serverKeys.set(server.url, server);
  server.stop = async (signal = 'SIGTERM') => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    return server.exited;
  };
  if (waitReady) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`server exited before it was ready:\n${server.log}`);
      }
      try {
        const res = await fetch(`${server.url}/readyz`);
        await res.arrayBuffer();
        // An engine's server logs "ready: …" after its first key: both are in the log once that
        // line is (the answer above and the log come by different pipes).
        if (res.status === 200 && (command === 'gateway' || /\bready: /.test(server.log))) break;
      } catch { /* not answering yet */ }
      if (Date.now() > deadline) {
        await server.stop('SIGKILL');
        throw new Error(`server was not ready in ${timeoutMs} ms:\n${server.log}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return server;
}

// Each server started here, by base URL: fetch() below sends its default tenant's API key.
const serverKeys = new Map();

// fetch() that sends the default tenant's API key to the OpenAI routes (/v1/…) of a server
// started here, unless the request names its own Authorization header. Tests of the API import
// it in place of the global fetch; tests of authentication itself use the global one.
export function fetch(url, init = {}) {
  const target = new URL(url);
  const key = serverKeys.get(target.origin)?.defaultKey;
  const headers = new Headers(init.headers ?? {});
  if (key && target.pathname.startsWith('/v1/') && !headers.has('authorization') && !headers.has('x-api-key')) {
    headers.set('authorization', `Bearer ${key}`);
  }
  return globalThis.fetch(url, { ...init, headers });
}

// Sends raw bytes on a fresh connection and resolves with everything the server sent back
// until it closed the connection (or `timeoutMs` passed).
export function rawExchange(port, chunks, { timeoutMs = 10000, delayMs = 0 } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let received = '';
    const timer = setTimeout(() => { socket.destroy(); resolve(received); }, timeoutMs);
    socket.on('data', (d) => { received += d; });
    socket.on('error', (e) => {
      clearTimeout(timer);
      if (received) resolve(received); else reject(e);
    });
    socket.on('close', () => { clearTimeout(timer); resolve(received); });
    socket.on('connect', async () => {
      for (const chunk of chunks) {
        socket.write(chunk);
        if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      }
    });
  });
}

// Parses "HTTP/1.1 413 Payload Too Large\r\n...headers...\r\n\r\nbody" into its parts.
export function parseResponse(text) {
  const end = text.indexOf('\r\n\r\n');
  const head = text.slice(0, end).split('\r\n');
  const status = Number(head[0].split(' ')[1]);
  const headers = {};
  for (const line of head.slice(1)) {
    const i = line.indexOf(':');
    headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  return { status, headers, body: text.slice(end + 4) };
}

// A port nobody listens on now, on the loopback interface, for a server a test starts itself.
export function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

// One call of a server's admin API that must succeed; resolves with its JSON answer.
export async function adminCall(server, token, method, route, body) {
  const res = await globalThis.fetch(`${server.url}${route}`, {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await res.json();
  if (res.status >= 300) throw new Error(`${method} ${route}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}

export function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// Resolves once `check` (async) returns true; throws, naming `what`, after `timeoutMs`.
export async function waitFor(what, check, { timeoutMs = 30000 } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}
