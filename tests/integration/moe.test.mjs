// Mixture-of-Experts models through the gateway: tiny Qwen3-MoE and GLM-4.5 checkpoints with
// their experts as stored (bf16) or quantized on load (int4, fp8), streamed with the official
// `openai` SDK. The start-up log and /metrics describe the experts, and the routing summary in
// /metrics accounts for every token the engine computed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { edgeinferBin, startServer } from './lib/server.mjs';
import { streamChat } from './lib/chat.mjs';
import { requiredSeriesValue as value, scrape } from './lib/metrics.mjs';

const presets = [
  { name: 'tiny-qwen3-moe', arch: 'qwen3_moe', experts: 8, topK: 2, shared: 0, moeLayers: 2 },
  { name: 'tiny-glm4-moe', arch: 'glm4_moe', experts: 16, topK: 4, shared: 1, moeLayers: 2 },
];

let dir;
before(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge-moe-'));
  for (const preset of presets) {
    const made = spawnSync(edgeinferBin, ['make-model', '--preset', preset.name, '--seed', '5', '--out',
                                          path.join(dir, preset.name)], { encoding: 'utf8' });
    assert.equal(made.status, 0, made.stderr);
  }
});
after(() => { if (dir) fs.rmSync(dir, { recursive: true, force: true }); });

for (const preset of presets) {
  for (const dtype of ['auto', 'int4', 'fp8']) {
    test(`${preset.name} with ${dtype === 'auto' ? 'bf16 (as stored)' : dtype} experts streams chat; the log and /metrics describe its routing`, async () => {
      const server = await startServer(['--model', path.join(dir, preset.name), '--weight-dtype', dtype,
                                        '--threads', '2', '--kv-cache-memory', '16MiB']);
      try {
        const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
        // Three at once: their tokens share steps, so experts run for several sequences together.
        const results = await Promise.all(['Hello there', 'Tell me a story about a cat', 'What is two plus two?']
          .map((content) => streamChat(client, preset.name, content)));
        for (const r of results) {
          assert.ok(r.finish === 'length' || r.finish === 'stop', `finish ${r.finish}`);
          assert.ok(r.usage.completion_tokens > 0 && r.usage.prompt_tokens > 0);
        }

        const weights = dtype === 'auto' ? 'bf16' : dtype;
        const loaded = new RegExp(`loaded: ${preset.arch}, ${preset.experts} experts \\(${preset.topK} per token, ` +
                                  `${preset.shared} shared\\), 3 layers, .* weights ${weights} \\(.* read per token\\)`);
        assert.match(server.log, loaded);

        const text = await scrape(server);
        const info = text.split('\n').find((l) => l.startsWith('edgeinfer_cache_config_info{'));
        assert.ok(info, 'no cache_config_info');
        for (const [label, expected] of [['architecture', preset.arch], ['experts', preset.experts],
                                         ['experts_per_token', preset.topK], ['shared_experts', preset.shared],
                                         ['weight_dtype', weights]]) {
          assert.ok(info.includes(`${label}="${expected}"`), `${label} in ${info}`);
        }
        const activeBytes = Number(info.match(/active_weight_bytes_per_token="(\d+)"/)[1]);
        assert.ok(activeBytes > 0);

        // Every token computed went to top_k experts in each MoE layer, and each step's layers
        // were summarised once.
        const tokens = value(text, 'edgeinfer_iteration_tokens_sum');
        const steps = value(text, 'edgeinfer_iteration_tokens_count');
        assert.equal(value(text, 'edgeinfer_moe_routed_tokens_total'), tokens * preset.topK * preset.moeLayers);
        assert.equal(value(text, 'edgeinfer_moe_experts_touched_count'), steps * preset.moeLayers);
        assert.equal(value(text, 'edgeinfer_moe_expert_load_imbalance_count'), steps * preset.moeLayers);
        const touched = value(text, 'edgeinfer_moe_experts_touched_sum') / (steps * preset.moeLayers);
        assert.ok(touched >= preset.topK && touched <= preset.experts, `experts touched per layer and step: ${touched}`);
        // max / mean over the experts is at least 1, and at most experts / top_k for a lone token.
        const imbalance = value(text, 'edgeinfer_moe_expert_load_imbalance_sum') / (steps * preset.moeLayers);
        assert.ok(imbalance >= 1 && imbalance <= preset.experts / preset.topK, `imbalance ${imbalance}`);
      } finally {
        await server.stop();
      }
    });
  }
}

test('a dense model exports no routing and says so in cache_config_info', async () => {
  const model = path.join(dir, 'tiny');
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'tiny', '--out', model], { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  const server = await startServer(['--model', model, '--threads', '1', '--kv-cache-memory', '8MiB']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
    await streamChat(client, 'tiny', 'Hello');
    const text = await scrape(server);
    assert.match(text, /edgeinfer_cache_config_info\{[^}]*architecture="llama"[^}]*experts="0"/);
    assert.equal(value(text, 'edgeinfer_moe_routed_tokens_total'), 0);
    assert.equal(value(text, 'edgeinfer_moe_experts_touched_count'), 0);
    assert.match(server.log, /loaded: llama, 2 layers/);
  } finally {
    await server.stop();
  }
});

test('an FP8 block-scaled MoE checkpoint serves, and quantize turns it into INT4 compressed-tensors that generate as quantizing on load does', async () => {
  const fp8 = path.join(dir, 'glm-fp8');
  const int4 = path.join(dir, 'glm-int4');
  const run = (args) => spawnSync(edgeinferBin, args, { encoding: 'utf8', timeout: 120000 });
  const made = run(['make-model', '--preset', 'tiny-glm4-moe', '--dtype', 'fp8-block', '--seed', '5', '--out', fp8]);
  assert.equal(made.status, 0, made.stderr);
  const config = JSON.parse(fs.readFileSync(path.join(fp8, 'config.json'), 'utf8'));
  assert.deepEqual(config.quantization_config.weight_block_size, [128, 128]);

  const q = run(['quantize', '--model', fp8, '--weight-dtype', 'int4', '--int4-group-size', '32', '--out', int4]);
  assert.equal(q.status, 0, q.stderr);
  assert.match(q.stderr, /of tensors, from .* of weight files: [\d.]+x\)/);
  const written = JSON.parse(fs.readFileSync(path.join(int4, 'config.json'), 'utf8'));
  assert.equal(written.quantization_config.format, 'pack-quantized');
  // Groups of 32, except the dense layer's down projection: 176 inputs take groups of 16.
  const sizes = Object.values(written.quantization_config.config_groups).map((g) => g.weights.group_size).sort();
  assert.deepEqual(sizes, [16, 32]);
  assert.ok(written.quantization_config.ignore.includes('model.layers.1.mlp.gate'), 'routers stay in bf16');
  assert.equal(written.n_routed_experts, 16);

  const generate = (args) => {
    const r = run(['generate', '--prompt', 'Hello there', '--max-tokens', '12', '--temperature', '0', ...args]);
    assert.equal(r.status, 0, r.stderr);
    return r.stdout;
  };
  assert.equal(generate(['--model', int4]), generate(['--model', fp8, '--weight-dtype', 'int4', '--int4-group-size', '32']));

  const server = await startServer(['--model', fp8, '--threads', '2', '--kv-cache-memory', '16MiB']);
  try {
    assert.match(server.log, /block scales are decoded on load and kept as bf16/);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
    const r = await streamChat(client, 'glm-fp8', 'Hello');
    assert.ok(r.usage.completion_tokens > 0);
  } finally {
    await server.stop();
  }
});
