// Latent attention models through the gateway: tiny DeepSeek-V3 (Kimi K2's architecture) and
// GLM-5 (with DeepSeek Sparse Attention) checkpoints over bf16 and FP8 latent caches, streamed with
// the official `openai` SDK. The start-up log and /metrics report the latent cache's real
// capacity; an FP8 block-scaled checkpoint becomes Kimi K2's INT4 layout (experts in INT4 groups
// of 32, attention in bf16) through `quantize`, and generates as quantizing it on load does.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { edgeinferBin, startServer } from './lib/server.mjs';
import { streamChat } from './lib/chat.mjs';
import { requiredSeriesValue, scrape } from './lib/metrics.mjs';

let dir;
before(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge-mla-'));
  for (const preset of ['deepseek-v3-tiny', 'glm-5-tiny']) {
    const made = spawnSync(edgeinferBin, ['make-model', '--preset', preset, '--seed', '5', '--out',
                                          path.join(dir, preset)], { encoding: 'utf8' });
    assert.equal(made.status, 0, made.stderr);
  }
});
after(() => { if (dir) fs.rmSync(dir, { recursive: true, force: true }); });

// [preset, KV dtype, weight dtype, what the log says of the architecture, bytes of a latent row]
const cases = [
  ['deepseek-v3-tiny', 'bf16', 'auto', /deepseek_v3, latent attention \(kv_lora_rank 32 \+ rope 8\), 8 experts \(2 per token, 1 shared\)/],
  ['deepseek-v3-tiny', 'fp8', 'int4', /deepseek_v3, latent attention/],
  ['glm-5-tiny', 'fp8', 'auto', /glm_moe_dsa, latent attention \(kv_lora_rank 32 \+ rope 8, DSA top 8\), 8 experts/],
  ['glm-5-tiny', 'bf16', 'fp8', /glm_moe_dsa, latent attention/],
];

for (const [preset, kv, weights, architecture] of cases) {
  test(`${preset} over a ${kv} latent cache with ${weights === 'auto' ? 'bf16' : weights} weights streams chat; the log and /metrics give the latent cache's capacity`, async () => {
    const server = await startServer(['--model', path.join(dir, preset), '--weight-dtype', weights,
                                      '--kv-cache-dtype', kv, '--threads', '2', '--kv-cache-memory', '4MiB']);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
      // Three at once, and prompts past GLM-5's 8 indexed positions.
      const results = await Promise.all(['Hello there', 'Tell me a long story about a cat and a dog in a garden',
                                         'What is two plus two, and why is it four?']
        .map((content) => streamChat(client, preset, content)));
      for (const r of results) {
        assert.ok(r.finish === 'length' || r.finish === 'stop', `finish ${r.finish}`);
        assert.ok(r.usage.completion_tokens > 0 && r.usage.prompt_tokens > 8, JSON.stringify(r.usage));
      }
      assert.match(server.log, architecture);
      // One row of latent (32) + RoPE key (8) per token and layer, plus GLM-5's index key (16):
      // FP8 with one 4-byte scale per row, against 2 bytes per value.
      const row = preset === 'glm-5-tiny' ? [40, 16] : [40];
      const bf16Bytes = row.reduce((a, b) => a + 2 * b, 0);
      const fp8Bytes = row.reduce((a, b) => a + b + 4, 0);
      const ratio = kv === 'fp8' ? bf16Bytes / fp8Bytes : 1;
      const logged = server.log.match(/KV cache: (\w+), (\d+) blocks × 16 tokens = (\d+) tokens, ([\d.]+)× bf16/);
      assert.ok(logged, 'no KV capacity line');
      assert.equal(logged[1], kv === 'fp8' ? 'fp8_e4m3' : 'bf16');
      assert.equal(Number(logged[4]), Number(ratio.toFixed(2)));
      const layers = 3;
      const perToken = layers * (kv === 'fp8' ? fp8Bytes : bf16Bytes);
      assert.equal(Number(logged[3]), Math.floor(4 * 1024 * 1024 / (perToken * 16)) * 16);
      const metrics = await scrape(server);
      assert.equal(requiredSeriesValue(metrics, 'edgeinfer_kv_cache_capacity_tokens'), Number(logged[3]));
      const info = metrics.split('\n').find((l) => l.startsWith('edgeinfer_cache_config_info{'));
      assert.ok(info.includes(`attention="${preset === 'glm-5-tiny' ? 'mla_dsa' : 'mla'}"`), info);
      if (preset === 'glm-5-tiny') assert.match(server.log, /skipping the checkpoint's 1 multi-token-prediction layer \(model\.layers\.3\)/);
    } finally {
      await server.stop();
    }
  });
}

test("an FP8 block-scaled DeepSeek-V3 becomes Kimi K2's INT4 layout (experts in groups of 32, attention bf16) and generates as quantizing on load does", async () => {
  const fp8 = path.join(dir, 'ds-fp8');
  const int4 = path.join(dir, 'ds-int4');
  const run = (args) => spawnSync(edgeinferBin, args, { encoding: 'utf8', timeout: 120000 });
  const made = run(['make-model', '--preset', 'deepseek-v3-tiny', '--dtype', 'fp8-block', '--seed', '5', '--out', fp8]);
  assert.equal(made.status, 0, made.stderr);
  const source = JSON.parse(fs.readFileSync(path.join(fp8, 'config.json'), 'utf8'));
  assert.deepEqual(source.quantization_config.weight_block_size, [128, 128]);
  assert.ok(fs.readFileSync(path.join(fp8, 'model.safetensors')).includes('self_attn.kv_b_proj.weight_scale_inv'));

  const q = run(['quantize', '--model', fp8, '--weight-dtype', 'int4', '--int4-group-size', '32',
                 '--quantize-layers', 'experts', '--out', int4]);
  assert.equal(q.status, 0, q.stderr);
  const written = JSON.parse(fs.readFileSync(path.join(int4, 'config.json'), 'utf8'));
  assert.equal(written.quantization_config.format, 'pack-quantized');
  assert.deepEqual(Object.values(written.quantization_config.config_groups).map((g) => g.weights.group_size), [32]);
  const ignored = written.quantization_config.ignore;
  for (const module of ['model.layers.1.self_attn.q_a_proj', 'model.layers.1.self_attn.kv_b_proj',
                        'model.layers.1.self_attn.o_proj', 'model.layers.0.mlp.gate_proj',
                        'model.layers.1.mlp.shared_experts.up_proj', 'model.layers.1.mlp.gate']) {
    assert.ok(ignored.includes(module), `${module} stays bf16`);
  }
  assert.ok(!ignored.includes('model.layers.1.mlp.experts.0.gate_proj'), 'routed experts are INT4');
  assert.equal(written.kv_lora_rank, 32);
  assert.equal(written.rope_scaling.type, 'yarn');

  const generate = (args) => {
    const r = run(['generate', '--prompt', 'Hello there, tell me more', '--max-tokens', '12', '--temperature', '0', ...args]);
    assert.equal(r.status, 0, r.stderr);
    return r.stdout;
  };
  assert.equal(generate(['--model', int4]),
               generate(['--model', fp8, '--weight-dtype', 'int4', '--int4-group-size', '32', '--quantize-layers', 'experts']));

  const server = await startServer(['--model', int4, '--threads', '2', '--kv-cache-memory', '4MiB', '--kv-cache-dtype', 'fp8']);
  try {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
    const r = await streamChat(client, 'ds-int4', 'Hello');
    assert.ok(r.usage.completion_tokens > 0);
    assert.match(server.log, /weights int4/);
  } finally {
    await server.stop();
  }
});
