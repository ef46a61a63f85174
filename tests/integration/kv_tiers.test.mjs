// The lower KV tiers over real HTTP: a server whose KV memory holds a few blocks keeps the
// blocks it evicts in host memory and on disk. A long prompt pushed out of KV memory is served
// from the host tier, then, after a restart, from disk, with the same greedy text as computed
// afresh and cached tokens reported; another tenant's identical prompt finds nothing in any tier;
// damaged, short and foreign block files are dropped at start or at read, never served.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, makeStateDir, adminCall } from './lib/server.mjs';
import { metric, requiredMetric } from './lib/metrics.mjs';

const ADMIN_TOKEN = 'tiers-admin-token-0123456789';
const stateDir = makeStateDir();
const diskDir = path.join(makeStateDir(), 'kv');
// stories260K: 1,280 bytes a token in f32, 20 KiB a block of 16: 12 blocks of KV memory, 200 host slots.
const args = ['--threads', '2', '--kv-cache-dtype', 'f32', '--kv-cache-memory', '240KiB', '--kv-host-cache-memory', '4MiB',
  '--kv-disk-cache', diskDir, '--kv-disk-cache-size', '64MiB', '--admin-token', ADMIN_TOKEN, '--state-dir', stateDir];

const LONG = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her '
  + 'friends. One day, she saw a big red ball under a tree. She wanted to play with it, but it was too high. Lily '
  + 'asked her mom to help her get the ball down from the tree. Her mom smiled and said they would find a long '
  + 'stick together.';
const OTHERS = [
  'Tom had a small dog named Max. Max liked to run and jump in the garden all day long, and Tom liked to run with him '
    + 'until the sun went down and they were both very tired and happy.',
  'The sun was hot and the sky was blue. A big bird flew over the house and sang a song to the children who were '
    + 'playing with their toys on the green grass near the old tree.',
  'Sue went to the shop with her dad to buy some bread and milk. On the way they met a kind old man who gave Sue a '
    + 'shiny red apple and told her a story about a magic fish.',
];

let server;
let keyA;
let keyB;

async function complete(key, prompt) {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 8, temperature: 0 }),
  });
  const json = await res.json();
  assert.equal(res.status, 200, JSON.stringify(json));
  return { text: json.choices[0].text, prompt: json.usage.prompt_tokens, cached: json.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

// Fills KV memory with other prompts, so that the long prompt's blocks are evicted from it.
async function pushOut(key) {
  for (const other of OTHERS) await complete(key, other);
}

before(async () => {
  server = await startServer(args);
  keyA = server.defaultKey;
  await adminCall(server, ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id: 'other' });
  keyB = (await adminCall(server, ADMIN_TOKEN, 'POST', '/admin/v1/tenants/other/keys', {})).key;
});
after(async () => { await server?.stop(); });

let reference;

test('a prompt pushed out of KV memory comes back from the host tier, with the text computed afresh', async () => {
  reference = await complete(keyA, LONG);
  assert.ok(reference.prompt > 100 && reference.prompt < 170, `the long prompt has ${reference.prompt} tokens`);
  assert.equal(reference.cached, 0);
  await pushOut(keyA);
  assert.ok(await requiredMetric(server, 'edgeinfer_kv_tier_spilled_blocks_total') > 0, 'blocks went to the host tier');

  const hostBefore = await metric(server, 'edgeinfer_kv_tier_hit_tokens_total', { tier: 'host' });
  const again = await complete(keyA, LONG);
  assert.equal(again.text, reference.text);
  assert.equal(again.cached, Math.floor((reference.prompt - 1) / 16) * 16);
  const fromHost = await metric(server, 'edgeinfer_kv_tier_hit_tokens_total', { tier: 'host' }) - hostBefore;
  assert.ok(fromHost > 0, 'some of it came from the host tier, not KV memory');
  assert.ok(await requiredMetric(server, 'edgeinfer_kv_tier_copy_back_seconds_count') > 0);
  assert.ok(await requiredMetric(server, 'edgeinfer_kv_tier_used_bytes', { tier: 'host' }) > 0);
});

test("another tenant's identical prompt finds nothing in any tier", async () => {
  const hits = await metric(server, 'edgeinfer_prefix_cache_hits_total');
  const other = await complete(keyB, LONG);
  assert.equal(other.cached, 0);
  assert.equal(other.text, reference.text);
  assert.equal(await metric(server, 'edgeinfer_prefix_cache_hits_total'), hits);
});

test('a restarted server serves the long prompt from its disk tier', async () => {
  await server.stop();
  assert.ok(fs.readdirSync(diskDir).length === 1, 'one folder for this model and KV layout');
  server = await startServer(args);
  assert.match(server.log, /KV disk tier: [1-9]\d* blocks/);
  const again = await complete(keyA, LONG);
  assert.equal(again.text, reference.text);
  assert.equal(again.cached, Math.floor((reference.prompt - 1) / 16) * 16);
  assert.ok(await metric(server, 'edgeinfer_kv_tier_hit_tokens_total', { tier: 'disk' }) > 0);
  // The other tenant still finds nothing, from disk either.
  assert.equal((await complete(keyB, LONG)).cached, 0);
});

test('damaged, short and foreign block files are dropped, and the prompt is computed afresh', async () => {
  await pushOut(keyA);
  await server.stop();
  const [folder] = fs.readdirSync(diskDir).map((f) => path.join(diskDir, f));
  const blocks = fs.readdirSync(folder).filter((f) => f.endsWith('.kvb')).map((f) => path.join(folder, f));
  assert.ok(blocks.length > 4);
  blocks.forEach((file, i) => {
    const bytes = fs.readFileSync(file);
    if (i % 3 === 0) {
      fs.truncateSync(file, bytes.length - 7);  // short: found at start
    } else if (i % 3 === 1) {
      bytes[16] ^= 0xff;  // another identity: found at start
      fs.writeFileSync(file, bytes);
    } else {
      bytes[bytes.length - 5] ^= 0x20;  // a damaged block: found when read
      fs.writeFileSync(file, bytes);
    }
  });
  server = await startServer(args);
  const rejectedAtStart = blocks.length - Math.floor(blocks.length / 3);
  assert.match(server.log, /KV disk tier: \d+ blocks/);
  const again = await complete(keyA, LONG);
  assert.equal(again.text, reference.text, 'never served a damaged block');
  assert.equal(again.cached, 0);
  const rejected = await metric(server, 'edgeinfer_kv_disk_tier_blocks_total', { event: 'rejected' });
  assert.ok(rejected >= rejectedAtStart, `${rejected} files rejected, ${rejectedAtStart} of them short or foreign`);
  const left = fs.readdirSync(folder).filter((f) => f.endsWith('.kvb')).length;
  assert.ok(left <= blocks.length - rejectedAtStart, `${left} files left of ${blocks.length}`);
});
