// edgeinfer as a model server of the Kubernetes Gateway API Inference Extension: the endpoint
// picker in deploy/k8s/inference-pool is told which metrics to read (its flags); each must have
// the meaning the model server protocol gives it, read here from a running server under load:
//
//   protocol metric       type   meaning
//   TotalQueuedRequests   gauge  requests in the queue
//   TotalRunningRequests  gauge  requests being served
//   KVCacheUtilization    gauge  fraction of KV cache blocks in use, 0 to 1
//   cache info            gauge  labels block_size and num_gpu_blocks (the pool's blocks)
//
// and the picker, which sends no token, must be able to read them (/metrics/engine with
// --engine-metrics-open) without being shown any tenant.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fetch, makeSlowModel, sleep, startServer } from './lib/server.mjs';
import { requiredSeriesValue } from './lib/metrics.mjs';

const METRICS_TOKEN = 'metrics-token-0123456789abcdef';
const picker = fs.readFileSync(path.resolve('deploy/k8s/inference-pool/endpoint-picker.yaml'), 'utf8');

// The value of the picker's --NAME=VALUE argument.
function pickerFlag(name) {
  const m = picker.match(new RegExp(`^\\s*- --${name}=(.*)$`, 'm'));
  assert.ok(m, `--${name} is not among the endpoint picker's arguments`);
  return m[1].trim();
}

// The TYPE a text-format scrape declares for `name`.
function typeOf(text, name) {
  const m = text.match(new RegExp(`^# TYPE ${name} (\\w+)$`, 'm'));
  return m?.[1];
}

async function engineMetrics(server, headers = {}) {
  const res = await fetch(`${server.url}${pickerFlag('model-server-metrics-path')}`, { headers });
  return { status: res.status, text: await res.text() };
}

test('the metrics the endpoint picker reads have the model server protocol meanings, without a token', async () => {
  const queued = pickerFlag('total-queued-requests-metric');
  const running = pickerFlag('total-running-requests-metric');
  const usage = pickerFlag('kv-cache-usage-percentage-metric');
  const cacheInfo = pickerFlag('cache-info-metric');
  assert.equal(pickerFlag('lora-info-metric'), '', 'edgeinfer serves no LoRA adapters: the LoRA metric is off');

  const server = await startServer(['--model', makeSlowModel(), '--threads', '1', '--max-num-seqs', '1',
    '--kv-cache-memory', '64MiB', '--block-size', '16', '--max-model-len', '4096',
    '--metrics-token', METRICS_TOKEN, '--engine-metrics-open']);
  try {
    const idle = await engineMetrics(server);
    assert.equal(idle.status, 200, 'the picker sends no token');
    for (const name of [queued, running, usage, cacheInfo]) assert.equal(typeOf(idle.text, name), 'gauge', name);
    assert.equal(requiredSeriesValue(idle.text, queued), 0);
    assert.equal(requiredSeriesValue(idle.text, running), 0);
    assert.equal(requiredSeriesValue(idle.text, usage), 0);
    // The cache info: block_size as served, num_gpu_blocks the pool's blocks.
    const info = idle.text.split('\n').find((line) => line.startsWith(`${cacheInfo}{`));
    assert.match(info, /block_size="16"/);
    const blocks = requiredSeriesValue(idle.text, 'edgeinfer_kv_cache_blocks');
    assert.ok(blocks > 0);
    assert.match(info, new RegExp(`num_gpu_blocks="${blocks}"`));
    // No tenant is named there (/metrics, which names them, still wants the token).
    assert.doesNotMatch(idle.text, /tenant=/);
    assert.equal((await fetch(`${server.url}/metrics`)).status, 401);

    // Three long requests on a server that runs one at a time: one running, two queued.
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true, temperature: 0 });
    const controller = new AbortController();
    const requests = [0, 1, 2].map(() => globalThis.fetch(`${server.url}/v1/completions`, {
      method: 'POST', body, signal: controller.signal,
      headers: { authorization: `Bearer ${server.defaultKey}`, 'content-type': 'application/json' },
    }).catch(() => null));
    try {
      let busy;
      const deadline = Date.now() + 30000;
      for (;;) {
        busy = (await engineMetrics(server)).text;
        if (requiredSeriesValue(busy, running) === 1 && requiredSeriesValue(busy, queued) === 2) break;
        assert.ok(Date.now() < deadline, `never 1 running and 2 queued:\n${busy}`);
        await sleep(50);
      }
      // In use: the running request's blocks, over all blocks.
      const used = requiredSeriesValue(busy, usage);
      const free = requiredSeriesValue(busy, 'edgeinfer_kv_cache_blocks_free');
      assert.ok(used > 0 && used <= 1, `${usage} = ${used}`);
      assert.ok(Math.abs(used - (blocks - free) / blocks) < 1e-9, `${usage} = ${used}, blocks ${blocks}, free ${free}`);
    } finally {
      controller.abort();
      await Promise.all(requests);
    }
  } finally {
    await server.stop();
  }
});

test('/metrics/engine is guarded as /metrics unless --engine-metrics-open', async () => {
  const server = await startServer(['--threads', '1', '--kv-cache-memory', '16MiB', '--metrics-token', METRICS_TOKEN]);
  try {
    assert.equal((await engineMetrics(server)).status, 401);
    const allowed = await engineMetrics(server, { authorization: `Bearer ${METRICS_TOKEN}` });
    assert.equal(allowed.status, 200);
    assert.match(allowed.text, /^edgeinfer_num_requests_waiting /m);
    // The engine's families only: nothing of the gateway's.
    assert.doesNotMatch(allowed.text, /^edgeinfer_http_requests_total/m);
  } finally {
    await server.stop();
  }
});
