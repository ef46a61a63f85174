// Quantization end to end: the FP8 KV cache's capacity as `serve` logs and exports it, and
// `edgeinfer quantize` writing a compressed-tensors folder that loads back as the same model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { edgeinferBin, startServer } from './lib/server.mjs';
import { requiredMetric } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const storiesBin = path.join(models, 'stories260K', 'stories260K.bin');

function run(args) {
  return spawnSync(edgeinferBin, args, { encoding: 'utf8', timeout: 240000 });
}

function tempDir() {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'edge-quant-'));
}

// Serves `model` with a KV dtype and budget; returns the capacity log line's figures and the
// exported capacity.
async function kvCapacity(model, kvDtype, memory) {
  const server = await startServer(['--model', model, '--kv-cache-dtype', kvDtype, '--kv-cache-memory', memory,
                                    '--threads', '1']);
  try {
    const line = server.log.match(/KV cache: (\S+), (\d+) blocks × (\d+) tokens = (\d+) tokens, ([\d.]+)× bf16 \((\d+) tokens\)/);
    assert.ok(line, server.log);
    return {
      dtype: line[1],
      loggedTokens: Number(line[4]),
      ratio: Number(line[5]),
      bf16Tokens: Number(line[6]),
      exported: await requiredMetric(server, 'edgeinfer_kv_cache_capacity_tokens'),
    };
  } finally {
    await server.stop();
  }
}

test('an FP8 KV cache holds at least 1.9x the tokens of bf16 at head_dim 128, in the log and /metrics', async () => {
  const dir = tempDir();
  try {
    const model = path.join(dir, 'tiny-hd128');
    const made = run(['make-model', '--preset', 'tiny-hd128', '--out', model]);
    assert.equal(made.status, 0, made.stderr);
    const fp8 = await kvCapacity(model, 'fp8', '8MiB');
    const bf16 = await kvCapacity(model, 'bf16', '8MiB');
    assert.equal(fp8.dtype, 'fp8_e4m3');
    assert.equal(bf16.dtype, 'bf16');
    assert.equal(fp8.exported, fp8.loggedTokens);
    assert.equal(bf16.exported, bf16.loggedTokens);
    assert.equal(fp8.bf16Tokens, bf16.exported);
    assert.ok(fp8.exported >= 1.9 * bf16.exported, `fp8 ${fp8.exported} vs bf16 ${bf16.exported} tokens`);
    assert.ok(fp8.ratio >= 1.9, `logged ratio ${fp8.ratio}`);
    assert.equal(bf16.ratio, 1);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('stories260K (head_dim 8): the log states the real FP8 ratio, scale bytes counted', async () => {
  const fp8 = await kvCapacity(storiesGguf, 'fp8', '4MiB');
  const bf16 = await kvCapacity(storiesGguf, 'bf16', '4MiB');
  // 8 one-byte codes and a 4-byte scale per head against 8 two-byte values: 16 / 12.
  assert.equal(fp8.ratio, 1.33);
  assert.equal(fp8.exported, fp8.loggedTokens);
  assert.ok(fp8.exported > bf16.exported && fp8.exported < 1.4 * bf16.exported, `${fp8.exported} vs ${bf16.exported}`);
});

function generate(model, extra = []) {
  const r = run(['generate', '--model', model, '--prompt', 'Once upon a time', '--max-tokens', '40',
                 '--temperature', '0', ...extra]);
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}

for (const [source, label] of [[storiesGguf, 'GGUF'], [storiesBin, 'llama2.c']]) {
  for (const dtype of ['int4', 'fp8']) {
    test(`quantize writes ${dtype} compressed-tensors from the ${label} model; it generates what quantizing on load does`, () => {
      const dir = tempDir();
      try {
        const out = path.join(dir, `stories-${dtype}`);
        const q = run(['quantize', '--model', source, '--weight-dtype', dtype, '--out', out]);
        assert.equal(q.status, 0, q.stderr);
        const config = JSON.parse(fs.readFileSync(path.join(out, 'config.json'), 'utf8'));
        assert.equal(config.architectures[0], 'LlamaForCausalLM');
        assert.equal(config.quantization_config.quant_method, 'compressed-tensors');
        assert.equal(config.quantization_config.format, dtype === 'int4' ? 'pack-quantized' : 'float-quantized');
        assert.ok(fs.existsSync(path.join(out, 'model.safetensors')));
        assert.ok(fs.existsSync(path.join(out, label === 'GGUF' ? 'tokenizer.gguf' : 'tokenizer.bin')));

        const expected = generate(source, ['--weight-dtype', dtype]);
        const reloaded = run(['generate', '--model', out, '--prompt', 'Once upon a time', '--max-tokens', '40',
                              '--temperature', '0']);
        assert.equal(reloaded.status, 0, reloaded.stderr);
        assert.equal(reloaded.stdout, expected);
        // Loaded as stored: the timings line names the weights it computed with.
        assert.match(reloaded.stderr, new RegExp(`weights ${dtype}`));
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });
  }
}

test('quantize refuses other weight dtypes, a missing --out and a folder that is not empty', () => {
  const dir = tempDir();
  try {
    const bad = run(['quantize', '--model', storiesGguf, '--weight-dtype', 'bf16', '--out', path.join(dir, 'x')]);
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /weight-dtype/);
    const missing = run(['quantize', '--model', storiesGguf]);
    assert.equal(missing.status, 2);
    assert.match(missing.stderr, /--out/);
    fs.writeFileSync(path.join(dir, 'keep.txt'), 'mine');
    const busy = run(['quantize', '--model', storiesGguf, '--out', dir]);
    assert.equal(busy.status, 1);
    assert.match(busy.stderr, /not empty/);
    assert.equal(fs.readFileSync(path.join(dir, 'keep.txt'), 'utf8'), 'mine');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
