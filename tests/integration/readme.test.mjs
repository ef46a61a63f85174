// The README's examples as a newcomer runs them. Each block marked `<!-- tested: NAME -->` runs
// with bash in the repository root, as written but for two things: its ports become free ones
// (a test never takes 8080: EDGE_PORT and EDGE_URL move the defaults that name it too) and
// `build/edgeinfer` becomes the binary under test. Each block runs twice, as a reader trying it again would, and
// leaves `git status` as it found it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { edgeinferBin, freePort } from './lib/server.mjs';

const root = path.resolve('.');
const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8');

// The text of the block marked `name`.
function block(name) {
  const marker = `<!-- tested: ${name} -->\n\`\`\`sh\n`;
  const start = readme.indexOf(marker);
  assert.ok(start >= 0, `README.md has no block marked ${name}`);
  const body = start + marker.length;
  return readme.slice(body, readme.indexOf('\n```', body));
}

// Runs `script` as the README has it, its ports moved as `ports` says; resolves with its exit
// code and output. Whatever it left running in its process group is stopped after it.
function run(script, ports, { timeoutMs = 240000 } = {}) {
  // In one pass, so that a new port is never read as an old one.
  const old = new RegExp(`\\b(${Object.keys(ports).join('|')})\\b`, 'g');
  const text = script.replaceAll('build/edgeinfer', edgeinferBin).replace(old, (port) => String(ports[port]));
  const child = spawn('bash', ['-c', text], {
    cwd: root, detached: true, stdio: ['ignore', 'pipe', 'pipe'],
    // The defaults that name 8080: a server's port, and the server `edgeinfer admin` calls.
    env: { ...process.env, EDGE_PORT: String(ports['8080']), EDGE_URL: `http://127.0.0.1:${ports['8080']}` },
  });
  let output = '';
  child.stdout.on('data', (d) => { output += d; });
  child.stderr.on('data', (d) => { output += d; });
  return new Promise((resolve) => {
    const timer = setTimeout(() => { try { process.kill(-child.pid, 'SIGKILL'); } catch {} }, timeoutMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      try { process.kill(-child.pid, 'SIGTERM'); } catch {}
      resolve({ code, signal, output });
    });
  });
}

function gitStatus() {
  const r = spawnSync('git', ['status', '--porcelain', '--untracked-files=all'], { cwd: root, encoding: 'utf8' });
  return r.status === 0 ? r.stdout : null;  // null: not a git checkout (nothing to compare)
}

async function freePorts(names) {
  const out = {};
  for (const name of names) out[name] = await freePort();
  return out;
}

test('the quick start: with its port taken it says so and uses no key; free, its key answers, every time', async () => {
  const before = gitStatus();
  const ports = await freePorts(['8080']);
  const blocker = net.createServer((socket) => socket.destroy());
  await new Promise((resolve) => blocker.listen(ports['8080'], '127.0.0.1', resolve));
  let taken;
  try {
    taken = await run(block('quick-start'), ports);
  } finally {
    await new Promise((resolve) => blocker.close(resolve));
  }
  assert.match(taken.output, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${ports['8080']}`), taken.output);
  assert.doesNotMatch(taken.output, /text_completion/);
  for (let i = 0; i < 2; i++) {
    const served = await run(block('quick-start'), ports);
    assert.equal(served.code, 0, served.output);
    const completion = JSON.parse(served.output.trim().split('\n').find((line) => line.startsWith('{')));
    assert.equal(completion.object, 'text_completion', served.output);
    assert.ok(completion.choices[0].text.length > 0);
  }
  assert.equal(gitStatus(), before, 'the quick start left files in the repository');
});

test('the split gateway example runs twice, a working key each time, and leaves nothing behind', async () => {
  const before = gitStatus();
  for (let i = 0; i < 2; i++) {
    const ports = await freePorts(['8080', '8081', '8082']);
    const r = await run(block('split'), ports);
    assert.equal(r.code, 0, r.output);
    assert.doesNotMatch(r.output, /invalid_api_key/, r.output);
    assert.equal((r.output.match(/"object":"text_completion"/g) ?? []).length, 2, r.output);
    assert.match(r.output, /"object":"chat\.completion"/);
    assert.match(r.output, /^edgeinfer_backend_up/m);
    assert.match(r.output, /"kv_blocks_total"/);
  }
  assert.equal(gitStatus(), before, 'the split example left files in the repository');
});

test('the Redis and PostgreSQL example runs twice: one limit across both gateways, all torn down', async () => {
  const before = gitStatus();
  for (let i = 0; i < 2; i++) {
    const ports = await freePorts(['8080', '8081', '6390', '5439']);
    const r = await run(block('redis'), ports);
    assert.equal(r.code, 0, r.output);
    // 100 requests at 60 a minute across two gateways: the whole minute's worth, then refusals
    // (a request or two more as the seconds pass while they run).
    const ok = Number(r.output.match(/^\s*(\d+) 200$/m)?.[1]);
    const refused = Number(r.output.match(/^\s*(\d+) 429$/m)?.[1]);
    assert.ok(ok >= 60 && ok <= 75 && ok + refused === 100, r.output);
    assert.match(r.output, /"requests": *\d+/);
    // Torn down: nothing answers on the example's ports.
    for (const port of [ports['6390'], ports['5439'], ports['8080']]) {
      const open = await new Promise((resolve) => {
        const socket = net.connect(port, '127.0.0.1', () => { socket.destroy(); resolve(true); });
        socket.on('error', () => resolve(false));
      });
      assert.equal(open, false, `port ${port} still answers`);
    }
  }
  assert.equal(gitStatus(), before, 'the Redis example left files in the repository');
});
